"""The job runner: for each setting of one protocol, reuse the rows already on disk or probe (or
finetune), attack and write them, under the advisory lock of those rows."""

from __future__ import annotations

import copy
import datetime as dt
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .. import accel
from ..attack.rng import derive_seed
from ..attack.suites import Suite
from ..data import ImageData, load_dataset
from ..data.corruptions import corrupt
from ..data.released import read_released, released_labels
from ..errors import UserError
from ..io import check_writable_dir, sha256_bytes
from ..locks import advisory_lock, remove_temporaries
from ..results import rows as results
from ..results.finetune import AffConfig, FinetuneConfig
from ..results.rows import ResultRow
from ..utils import device_name, versions
from .benchmark import WORST_CASE, benchmark
from .finetune import fit_protocol, run_key
from .heads import HEADS_DIR, head_key, load_head, save_head
from .probe import ProbedClassifier, ProbeResult, fit_linear_probe
from .sanity import add_flags, check_alf_fit, check_finetune_chance, check_probe_fit
from .settings import IdentityFields, Setting, corruption_fields, device_fields, expected_identities

__all__ = ["Job", "rewrite_vanished", "run_protocol"]


@dataclass
class Job:
    """Everything the rows of one evaluation under one protocol share."""

    encoder: nn.Module
    suites: dict[str, Suite]  # setting kind -> the suite its rows run (settings.load_suites)
    base: dict[str, Any]  # checkpoint and recipe fields of every row
    ident: IdentityFields  # identity fields shared by every row
    out: Path
    batch_size: int | None
    device: torch.device
    progress: bool
    # dataset -> (classifier, probe result, fields): corruption settings reuse it
    probes: dict[str, Any] = field(default_factory=dict)
    heads: Path | None = None  # a folder of fitted heads to reuse (published models ship theirs)
    save_heads: bool = False  # write each fitted head to out/heads/
    finetune: FinetuneConfig | None = None  # ALF/AFF; None: SLF
    compile: str = "auto"  # accel.COMPILE_CHOICES: how the probe, finetuning and attacks run
    _idents: dict[str, IdentityFields] = field(default_factory=dict, init=False, repr=False)

    def suite_of(self, setting: Setting) -> tuple[Suite, IdentityFields]:
        """The suite a setting runs and its rows' identity fields (made once per setting kind)."""
        suite = self.suites[setting.name]
        if setting.name not in self._idents:
            self._idents[setting.name] = self.ident.for_suite(suite)
        return suite, self._idents[setting.name]


def run_protocol(
    job: Job, settings: list[Setting], *, force: bool, data_root: str | None
) -> tuple[list[ResultRow], int]:
    """The rows of every setting under one protocol, and how many of them were computed."""
    plan = [(s, *_existing(job, s, force)) for s in settings]
    work = [s for s, ids, done in plan if len(done) < len(ids)]
    data = {s: _load(s, data_root) for s in work}  # a missing dataset fails before any row is written
    for s in work:  # and so does a released corruption set that is not this test set
        _check_released(s, data[s][1].y[: job.ident.n_examples])
    if work:
        check_writable_dir(job.out / results.ROWS_DIR)  # fail before probing and attacking
    rows: list[ResultRow] = []
    computed = 0
    desc = f"eval {job.base['checkpoint_id']}" + (f" {job.finetune.protocol}" if job.finetune else "")
    for setting, ids, done in tqdm(plan, desc=desc, disable=not job.progress or len(plan) < 2):
        if len(done) == len(ids):
            rows += [done[r] for r in ids]  # already computed: nothing to do
            continue
        done_rows, n = _compute_locked(job, setting, data[setting], force)
        rows += done_rows
        computed += n
    return rows, computed


def rewrite_vanished(out: Path, rows: list[ResultRow]) -> None:
    """Write again the rows whose files vanished during the run (the output directory may have been
    deleted meanwhile), so that what is returned is what is on disk."""
    vanished = [r for r in rows if not results.row_path(out, r.row_id).is_file()]
    for r in vanished:
        results.write_row(out, r)
    if vanished:
        print(
            f"{len(vanished)} result rows had vanished from {out} during the run; wrote them again",
            file=sys.stderr,
        )


def _existing(job: Job, setting: Setting, force: bool) -> tuple[list[str], dict[str, ResultRow]]:
    """The row ids a setting produces, and those of them already on disk, complete and valid."""
    ids = [results.row_id(i) for i in expected_identities(setting, *job.suite_of(setting))]
    if force:
        return ids, {}
    done = {r: results.read_valid_row(results.row_path(job.out, r), r) for r in ids}
    return ids, {r: row for r, row in done.items() if row is not None}


def _load(setting: Setting, data_root: str | None) -> tuple[ImageData, ImageData]:
    """Both splits of a setting's dataset (DatasetNotFound, a one-line UserError, if it cannot be had)."""
    train = load_dataset(setting.spec, "train", root=data_root)
    return train, load_dataset(setting.spec, "test", root=data_root)


def _compute_locked(
    job: Job, setting: Setting, data: tuple[ImageData, ImageData], force: bool
) -> tuple[list[ResultRow], int]:
    """(rows, how many were computed) of one setting, under the advisory lock of its rows: a second
    process evaluating the same checkpoint and protocol into ``out`` waits, then reuses what the first
    one wrote (and computes only what is still missing)."""
    ids, _ = _existing(job, setting, force)
    key = sha256_bytes(" ".join(sorted(ids)).encode())[:24]
    with advisory_lock(job.out, key, f"{job.base['checkpoint_id']} {setting.name} {setting.dataset}"):
        ids, done = _existing(job, setting, force)  # what another process finished meanwhile counts
        remove_temporaries(job.out / results.ROWS_DIR, [f"{r}.json" for r in ids])  # of a killed writer
        if len(done) == len(ids):
            return [done[r] for r in ids], 0
        return _run_setting(job, setting, data, ids, keep=done), len(ids) - len(done)


def _run_setting(
    job: Job,
    setting: Setting,
    data: tuple[ImageData, ImageData],
    ids: list[str],
    keep: dict[str, ResultRow],
) -> list[ResultRow]:
    """Probe, attack and write the rows of one setting (rows in ``keep`` are returned, not rewritten)."""
    train, test = data
    t0 = time.perf_counter()
    n = job.ident.n_examples
    x_test, y_test = test.x[:n], test.y[:n]  # the first n test examples: fixed and documented
    if setting.corruption:
        x_test = _corrupted(job, setting, x_test, y_test)
    with accel.compiling(job.compile):  # the probe's step and the finetuning epochs read it
        classifier, probe_result, finetuned = _fit(job, setting, train, test)
    probe_s = time.perf_counter() - t0
    suite, _ = job.suite_of(setting)
    # the attacks call a compiled wrapper; the classifier itself (cached, copied) stays as it is
    attacked = accel.compile_module(classifier, accel.compile_plan(job.compile, job.device, "attack"))
    measured = benchmark(
        attacked,
        x_test.float().div(255),
        y_test,
        suite,
        seed=job.ident.seed,
        batch_size=job.batch_size,
        num_classes=train.num_classes,
        progress=job.progress,
    )
    add_flags(measured, _fit_flags(job, probe_result, finetuned, test))
    shared = {
        "probe_test_acc": probe_result.test_acc,
        "probe_best_test_acc": probe_result.best_test_acc,  # selected on test: for comparison only
        "probe_best_epoch": probe_result.best_epoch,
        "probe_train_acc": probe_result.train_acc,
        "knn_acc": probe_result.knn_acc,
        "n_train": probe_result.n_train,
        "num_classes": train.num_classes,
        "versions": versions(),
        "device": device_name(job.device),
        **accel.recorded(job.compile, job.device),  # "compile", only when not eager
        "probe_wall_s": round(probe_s, 3),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **finetuned,  # ALF/AFF: the protocol's settings (and AFF's weights sha256); SLF: nothing
    }
    written = []
    for r in measured:
        row = _make_row(job, setting, r, shared)
        if row.row_id not in ids:  # the identity computed up front must be the one written
            raise RuntimeError(f"row {row.row_id} of {r['attack']} eps {r['eps']} is not an expected row")
        if row.row_id in keep:  # finished before (an interrupted run): never rewritten
            written.append(keep[row.row_id])
            continue
        results.write_row(job.out, row)
        written.append(row)
    return written


def _fit_flags(
    job: Job, probe_result: ProbeResult, finetuned: dict[str, Any], test: ImageData
) -> dict[str, bool | None]:
    """The flags on how well the attacked classifier's head was fitted (None where one does not
    apply): ``probe_underfit`` on the cached-feature probe (SLF; ALF/AFF heads are trained on
    adversarial examples, below clean kNN by design), ``finetune_above_chance`` on every finetuned
    head, ``alf_underfit`` on ALF heads (against ``slf_train_acc``, fit_protocol's reference)."""
    if job.finetune is None:
        return {
            "sanity_probe_underfit": check_probe_fit(probe_result.train_acc, probe_result.knn_acc),
            "sanity_finetune_above_chance": None,
            "sanity_alf_underfit": None,
        }
    reference, acc = finetuned.get("slf_train_acc"), probe_result  # the reference: ALF only
    return {
        "sanity_probe_underfit": None,
        "sanity_finetune_above_chance": check_finetune_chance(acc.test_acc, test.y, test.num_classes),
        "sanity_alf_underfit": None if reference is None else check_alf_fit(acc.train_acc, reference),
    }


def _check_released(setting: Setting, y_test: torch.Tensor) -> None:
    """A released corruption set must list this test set in its order: its labels of the first n
    images must be the test set's first n labels (a one-line UserError otherwise)."""
    if setting.corruption_dir is None:
        return
    severity = int(setting.severity or 1)
    y = released_labels(setting.corruption_dir, str(setting.corruption), severity, n=len(y_test))
    if len(y) != len(y_test) or not torch.equal(y, y_test):
        raise UserError(
            f"{setting.corruption_dir}: the labels of {setting.corruption} severity {severity} are not the "
            f"first {len(y_test)} test labels of {setting.dataset}; is it {setting.corruption_source}?"
        )


def _corrupted(job: Job, setting: Setting, x_test: torch.Tensor, y_test: torch.Tensor) -> torch.Tensor:
    """The test images of a corruption setting: read from its released set, else computed here."""
    severity = int(setting.severity or 1)
    if setting.corruption_dir is None:
        seed = derive_seed(job.ident.seed, "corruption", setting.corruption, setting.severity)
        return corrupt(x_test, str(setting.corruption), severity, seed)
    _check_released(setting, y_test)  # the files may have changed since the run started
    return read_released(setting.corruption_dir, str(setting.corruption), severity, n=len(y_test))[0]


def _fit(
    job: Job, setting: Setting, train: ImageData, test: ImageData
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The attacked classifier of a setting under the job's protocol, its clean metrics, row fields.

    Fitted once per dataset in this evaluation: a corruption setting attacks the in-domain classifier
    on corrupted test images (every fit is deterministic, so this changes no number, only the time).
    """
    shared = setting.name in ("in-domain", "corruption")  # only these share a classifier: hold no other
    if shared and setting.dataset in job.probes:
        return job.probes[setting.dataset]
    if job.finetune is None:
        fitted = (*_probe(job, setting, train, test), {})
    else:
        encoder = copy.deepcopy(job.encoder)
        before = {k: v.clone() for k, v in encoder.state_dict().items()}
        probe = job.ident.probe
        key = run_key(
            job.finetune.identity(),
            sha=job.ident.checkpoint_sha256,
            dataset=setting.dataset,
            probe=probe.as_dict(),
        )
        # the encoder copy runs compiled during the fit (ALF's PGD and features go through it; AFF
        # finetunes its own copy, compiled by the epoch loop), and is eager again afterwards
        plan = accel.compile_plan(job.compile, job.device, "finetune")
        with accel.compiled_in_place([encoder], plan):
            fitted = fit_protocol(
                job.finetune, encoder, train, test, probe, out=job.out, key=key, progress=job.progress
            )
        if not isinstance(job.finetune, AffConfig):  # ALF trains the head only: the encoder stays as it was
            _check_unchanged(before, fitted[0].encoder)
    if shared:
        job.probes[setting.dataset] = fitted
    return fitted


def _check_unchanged(before: dict[str, torch.Tensor], encoder: nn.Module) -> None:
    """Probing must never change the encoder (BatchNorm statistics included)."""
    after = encoder.state_dict()
    if any(not torch.equal(before[k], after[k]) for k in before):
        raise RuntimeError("the encoder changed during probing (BatchNorm statistics?)")


def _probe(job: Job, setting: Setting, train: ImageData, test: ImageData) -> tuple[nn.Module, Any]:
    """The linear probe of a setting (SLF): a stored head when ``job.heads`` has one, else fitted (on a
    copy of the encoder, so the caller's module is untouched too)."""
    key = head_key(job.ident.checkpoint_sha256, setting.name, setting.dataset, job.ident.probe.as_dict())
    stored = load_head(job.heads, key) if job.heads else None
    if stored is not None:
        head, probe_result = stored
        return ProbedClassifier(copy.deepcopy(job.encoder), head.to(job.device)), probe_result
    before = {k: v.clone() for k, v in job.encoder.state_dict().items()}
    classifier, probe_result = fit_linear_probe(copy.deepcopy(job.encoder), train, test, job.ident.probe)
    _check_unchanged(before, classifier.encoder)
    if job.save_heads:
        save_head(job.out / HEADS_DIR, key, classifier.head, probe_result)
    return classifier, probe_result


def _make_row(job: Job, setting: Setting, r: dict[str, Any], shared: dict[str, Any]) -> ResultRow:
    """One benchmark row plus the checkpoint, setting, probe and protocol fields, with its ids."""
    suite, ident = job.suite_of(setting)
    params = {} if r["attack"] == WORST_CASE else _spec_params(suite, r)
    row = {
        **job.base,
        "setting": setting.name,
        "dataset": setting.dataset,
        "shift": setting.shift,
        **corruption_fields(setting),
        "split": "test",
        **{k: v for k, v in r.items() if k != "params"},  # robust_bits/clean_bits come along when present
        "attack_params": params,
        "attack_config": r.get("params", {}),
        "seed": job.ident.seed,
        "suite_sha256": suite.sha256,
        "n_examples": job.ident.n_examples,  # requested; None = every test example
        "n_examples_evaluated": r["n_examples"],
        "n_examples_requested": job.ident.n_examples,
        "probe_config": job.ident.probe.as_dict(),
        "attack_versions": ident.attack_versions,
        **device_fields(ident.device_class),  # absent on a CPU
        **shared,
    }
    return ResultRow.from_json(results.stamp_ids(row))


def _spec_params(suite: Suite, row: dict[str, Any]) -> dict[str, Any]:
    # the spec whose raw parameters the row's (possibly expanded) parameters contain
    for s in suite.attacks:
        same = s.name == row["attack"] and s.norm == row["norm"] and row["eps"] in s.eps
        if same and all(row.get("params", {}).get(k) == v for k, v in s.params.items()):
            return dict(s.params)
    raise RuntimeError(f"benchmark returned a row for an attack not in the suite: {row['attack']}")
