"""Evaluate an encoder: probe it per setting, attack the probed classifier, write result rows.

Settings: in-domain (probe on the pretraining dataset), transfer (probe on another dataset) and
shift (probe on ArCL-modified versions). Rows are content-addressed: a setting whose rows all
exist (complete and valid) is skipped without loading data or probing, and a finished row is never
rewritten, so an interrupted evaluation resumes where it stopped and a repeated one is a no-op.
"""

from __future__ import annotations

import copy
import datetime as dt
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn
from tqdm.auto import tqdm

from ..attack.suites import Suite, load_suite
from ..data.datasets import load_dataset, parse_spec
from ..errors import UserError
from ..io import check_writable_dir, sha256_bytes
from ..models.encoders import create_encoder
from ..models.foreign import load_encoder
from ..utils import device_name, resolve_device, versions
from . import rows as results
from .benchmark import WORST_CASE, benchmark
from .probe import ProbeConfig, fit_linear_probe

SHIFT_NAMES = ("grayscale", "crop", "flip", "jitter", "grayscale+jitter")
# Parameters shown as a recipe's "key parameters" when they differ from SimCLR's defaults.
KEY_PARAMS = (
    "G1",
    "M",
    "lam",
    "combine",
    "positives",
    "alpha",
    "G2",
    "w",
    "tau_plus",
    "beta",
    "t",
    "views",
    "m_views",
    "mix_alpha",
    "noise_scale",
)


@dataclass(frozen=True)
class Setting:
    """One probe-and-attack job: which dataset the probe is trained and tested on."""

    name: str  # "in-domain" | "transfer" | "shift"
    dataset: str
    shift: str | None = None


def key_params(loss_params: dict[str, Any] | None) -> str:
    """Compact description of a recipe's loss parameters (those differing from SimCLR's)."""
    if not loss_params:
        return ""
    from ..losses import LossParams

    default = LossParams().to_dict()
    parts = [
        f"{k}={loss_params[k]}" for k in KEY_PARAMS if k in loss_params and loss_params[k] != default.get(k)
    ]
    return " ".join(parts)


def transfer_default(dataset: str) -> str | None:
    """The natural transfer target: the complementary class subset (digits:0-4 -> digits:5-9)."""
    spec = parse_spec(dataset)
    if spec.subset is None:
        return None
    from ..data.datasets import DATASETS

    n = DATASETS.info(spec.name)["num_classes"]
    rest = [c for c in range(n) if c not in spec.subset]
    return f"{spec.name}:{','.join(map(str, rest))}" if rest else None


def settings_for(
    dataset: str, transfer: str | Iterable[str] | None, shift: str | Iterable[str] | None
) -> list[Setting]:
    """The settings to run: in-domain always, plus transfer targets and shift variants."""
    out = [Setting("in-domain", dataset)]
    for t in [transfer] if isinstance(transfer, str) else list(transfer or []):
        out.append(Setting("transfer", t))
    if shift:
        names = SHIFT_NAMES if shift == "all" else ([shift] if isinstance(shift, str) else list(shift))
        for s in names:
            for part in s.split(","):
                if part not in SHIFT_NAMES:
                    raise UserError(f"unknown shift {part!r}; valid choices: all, {', '.join(SHIFT_NAMES)}")
                base = dataset.split("@", 1)[0]
                out.append(Setting("shift", f"{base}@{part}", part))
    for s in out:
        spec = parse_spec(s.dataset)  # unknown names and bad class lists fail now, not after hours of work
        if spec.subset is not None and len(spec.subset) < 2:
            raise UserError(
                f"dataset {s.dataset!r} has one class: a probe needs at least 2 (e.g. digits:0-4)"
            )
    return out


def _identity(
    setting: Setting,
    *,
    sha: str,
    attack: str,
    norm: str,
    params: dict,
    eps: float,
    seed: int,
    n_examples: int | None,
    probe: ProbeConfig,
    suite: Suite,
) -> dict[str, Any]:
    return {
        "checkpoint_sha256": sha,
        "setting": setting.name,
        "dataset": setting.dataset,
        "attack": attack,
        "norm": norm,
        "attack_params": params,
        "eps": eps,
        "seed": seed,
        "n_examples": n_examples,
        "probe_config": asdict(probe),
        "suite_sha256": suite.sha256,
    }


def expected_identities(setting: Setting, suite: Suite, **kw: Any) -> list[dict[str, Any]]:
    """Identities of every row a setting produces: one per (attack, eps), one worst case per (norm, eps)."""
    ids = [
        _identity(setting, attack=s.name, norm=s.norm, params=dict(s.params), eps=e, suite=suite, **kw)
        for s in suite.attacks
        for e in s.eps
    ]
    worst = sorted({(s.norm, e) for s in suite.attacks for e in s.eps})
    ids += [
        _identity(setting, attack=WORST_CASE, norm=n, params={}, eps=e, suite=suite, **kw) for n, e in worst
    ]
    return ids


def random_init_like(encoder: nn.Module, info: dict[str, Any], seed: int) -> nn.Module:
    """An untrained encoder of the same architecture and normalisation (the random-init control)."""
    torch.manual_seed(seed)
    fresh = create_encoder(
        info["encoder"],
        in_channels=int(encoder.mean.shape[1]),
        mean=encoder.mean.flatten().tolist(),
        std=encoder.std.flatten().tolist(),
        input_shape=getattr(encoder, "input_shape", None),
        **info.get("encoder_kwargs", {}),
    )
    return fresh.to(next(encoder.parameters()).device).eval()


def evaluate(
    checkpoint: str | Path,
    *,
    dataset: str | None = None,
    transfer: str | Iterable[str] | None = None,
    shift: str | Iterable[str] | None = None,
    suite: str | Path | dict[str, Any] | Suite = "paper",
    out: str | Path = "leaderboard",
    n_examples: int | None = None,
    seed: int = 0,
    device: str | None = None,
    probe: ProbeConfig | None = None,
    arch: str | None = None,
    fmt: str = "auto",
    normalize: str | None = None,
    control: bool = False,
    force: bool = False,
    batch_size: int | None = None,
    data_root: str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Probe and attack an encoder checkpoint in every requested setting; returns the result rows.

    ``checkpoint`` is a directory written by ``train``, its manifest.json, or a foreign weights file
    (with ``arch``). ``control=True`` evaluates an untrained encoder of the same architecture instead
    (the random-initialisation control). Rows are written under ``out/rows/``.
    """
    dev = resolve_device(device)
    suite = load_suite(suite)
    if n_examples is not None and n_examples < 1:
        raise UserError(f"--n-examples {n_examples}: must be >= 1")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size {batch_size}: must be >= 1")
    _check_probe(probe)
    encoder, info = load_encoder(checkpoint, arch=arch, fmt=fmt, normalize=normalize)
    encoder = encoder.to(dev).eval()
    dataset = dataset or info.get("dataset")
    if not dataset:
        raise UserError("pass --dataset: a foreign checkpoint does not say what it was trained on")
    probe = probe or ProbeConfig(seed=seed)
    sha = info["sha256"]
    ckpt_id = info.get("checkpoint_id") or f"{info['encoder']}.foreign-{Path(checkpoint).stem}"
    loss, loss_params = info.get("loss", "foreign"), info.get("loss_params")
    if control:
        encoder = random_init_like(encoder, info, seed)
        sha = sha256_bytes(st_save({k: v.contiguous().cpu() for k, v in encoder.state_dict().items()}))
        # <encoder>.random-init_<dataset>_s<seed>, named like a zoo id (the loss part used to be cut
        # at the first "_", which broke names such as convnet_small or dacl_plus)
        ds = str(info.get("dataset") or dataset).replace(":", "-").replace("@", "+").replace(",", "_")
        ckpt_id = f"{info['encoder']}.random-init_{ds}_s{seed}"
        loss, loss_params = "random-init", None
    # NHWC convolutions: the same weights, 1.6-1.9x faster inference of convnet_small on CPU (and the
    # tensor-core layout on GPUs); NCHW inputs are accepted and the outputs follow the weights' format
    encoder = encoder.to(memory_format=torch.channels_last)
    provenance = {
        "checkpoint": str(checkpoint),
        "checkpoint_id": ckpt_id,
        "checkpoint_sha256": sha,
        "encoder": info["encoder"],
        "loss": loss,
        "loss_params": loss_params,
        "key_params": key_params(loss_params),
        "control": control,
        "pretrain_dataset": info.get("dataset"),
        "train_seed": info.get("seed"),
        "train_epochs": info.get("epochs"),
        "checkpoint_format": info.get("format", "ours"),
    }
    all_rows: list[dict[str, Any]] = []
    todo = settings_for(dataset, transfer, shift)
    writable = False
    for setting in tqdm(todo, desc=f"eval {ckpt_id}", disable=not progress or len(todo) < 2):
        kw = {"sha": sha, "seed": seed, "n_examples": n_examples, "probe": probe}
        ids = [results.row_id(i) for i in expected_identities(setting, suite, **kw)]
        # complete, valid rows are kept as they are (a truncated or foreign file is recomputed)
        done = {} if force else {r: results.read_valid_row(results.row_path(out, r), r) for r in ids}
        done = {r: row for r, row in done.items() if row is not None}
        if len(done) == len(ids):
            all_rows += [done[r] for r in ids]  # already computed: nothing to do
            continue
        if not writable:  # fail before probing and attacking, not at the first write
            check_writable_dir(Path(out) / results.ROWS_DIR)
            writable = True
        all_rows += _run_setting(
            encoder,
            setting,
            suite,
            provenance,
            kw,
            out=out,
            batch_size=batch_size,
            data_root=data_root,
            device=dev,
            progress=progress,
            keep=done,
        )
    # The output directory may have been deleted while we ran: write the vanished rows again, so
    # that what is returned is what is on disk.
    vanished = [r for r in all_rows if not results.row_path(out, r["row_id"]).is_file()]
    for r in vanished:
        results.write_row(out, r)
    if vanished:
        print(
            f"{len(vanished)} result rows had vanished from {out} during the run; wrote them again",
            file=sys.stderr,
        )
    return all_rows


def _check_probe(probe: ProbeConfig | None) -> None:
    if probe is None:
        return
    if probe.epochs < 1:
        raise UserError(f"--probe-epochs {probe.epochs}: must be >= 1")
    if not probe.lr > 0:
        raise UserError(f"probe lr {probe.lr}: must be > 0")
    if probe.batch_size < 1:
        raise UserError(f"probe batch size {probe.batch_size}: must be >= 1")
    if probe.max_train is not None and probe.max_train < 1:
        raise UserError(f"probe max_train {probe.max_train}: must be >= 1")


def _run_setting(
    encoder: nn.Module,
    setting: Setting,
    suite: Suite,
    provenance: dict[str, Any],
    kw: dict[str, Any],
    *,
    out: str | Path,
    batch_size: int | None,
    data_root: str | None,
    device: torch.device,
    progress: bool,
    keep: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    keep = keep or {}
    t0 = time.perf_counter()
    train = load_dataset(setting.dataset, "train", root=data_root)
    test = load_dataset(setting.dataset, "test", root=data_root)
    n = kw["n_examples"]
    x_test, y_test = test.x[:n], test.y[:n]  # the first n test examples: fixed and documented
    # Probing must never change the encoder: work on a copy so the caller's module is untouched too.
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    classifier, probe_result = fit_linear_probe(copy.deepcopy(encoder), train, test, kw["probe"])
    after = classifier.encoder.state_dict()
    if any(not torch.equal(before[k], after[k]) for k in before):
        raise RuntimeError("the encoder changed during probing (BatchNorm statistics?)")
    probe_s = time.perf_counter() - t0
    rows = benchmark(
        classifier,
        x_test.float().div(255),
        y_test,
        suite,
        seed=kw["seed"],
        batch_size=batch_size,
        num_classes=train.num_classes,
        progress=progress,
    )
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    written = []
    for r in rows:
        params = {} if r["attack"] == WORST_CASE else _spec_params(suite, r)
        identity = _identity(
            setting, attack=r["attack"], norm=r["norm"], params=params, eps=r["eps"], suite=suite, **kw
        )
        row = {
            "row_id": results.row_id(identity),
            **provenance,
            "setting": setting.name,
            "dataset": setting.dataset,
            "shift": setting.shift,
            "split": "test",
            **{k: v for k, v in r.items() if k != "params"},
            "attack_params": params,
            "attack_config": r.get("params", {}),
            "n_examples_requested": n,
            "probe_config": identity["probe_config"],
            "probe_test_acc": probe_result.test_acc,
            "probe_best_test_acc": probe_result.best_test_acc,  # selected on test: for comparison only
            "probe_best_epoch": probe_result.best_epoch,
            "probe_train_acc": probe_result.train_acc,
            "knn_acc": probe_result.knn_acc,
            "n_train": probe_result.n_train,
            "num_classes": train.num_classes,
            "versions": versions(),
            "device": device_name(device),
            "probe_wall_s": round(probe_s, 3),
            "created_at": now,
        }
        row["n_examples"] = identity["n_examples"]
        row["n_examples_evaluated"] = r["n_examples"]
        if row["row_id"] in keep:  # finished before (an interrupted run): never rewritten
            written.append(keep[row["row_id"]])
            continue
        results.write_row(out, row)
        written.append(row)
    return written


def _spec_params(suite: Suite, row: dict[str, Any]) -> dict[str, Any]:
    # the spec whose raw parameters the row's (possibly expanded) parameters contain
    for s in suite.attacks:
        same = s.name == row["attack"] and s.norm == row["norm"] and row["eps"] in s.eps
        if same and all(row.get("params", {}).get(k) == v for k, v in s.params.items()):
            return dict(s.params)
    raise RuntimeError(f"benchmark returned a row for an attack not in the suite: {row['attack']}")
