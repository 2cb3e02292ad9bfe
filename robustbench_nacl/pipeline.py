"""Train and evaluate zoo entries, resumably: the engine behind ``demo`` and ``zoo train|eval|run``.

An entry's manifest says everything: the training recipe (``max_train`` included) and how it is
evaluated (``eval``: transfer, shift, suite, n_examples, probe_epochs, probe_max_train). Work is
skipped at two grains: a trained checkpoint is not retrained, and an entry whose result rows are all
under ``out/rows`` is neither trained nor evaluated again, so a zoo whose rows were committed resumes
on a fresh machine without its checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .errors import UserError
from .locks import advisory_lock
from .results.finetune import PROTOCOLS
from .results.label_free import LABEL_FREE
from .zoo import ZooEntry, checkpoint_dir, expected_id, is_trained

#: the order a zoo run evaluates its protocols in: the finetuning ones, then label-free (no head)
PROTOCOL_ORDER = (*PROTOCOLS, LABEL_FREE)

#: The probe's epochs when a manifest does not say (the evaluation's own default).
DEFAULT_PROBE_EPOCHS = 1000
#: where ``zoo run`` moves rows that their entries' manifests no longer ask for
SUPERSEDED_DIR = "rows.superseded"


def _init_worker() -> None:
    # Tiny models: one thread per worker process beats two contended threads per process.
    import torch

    from . import plugins, utils

    torch.set_num_threads(1)
    utils.deterministic_from_env()  # the parent's --deterministic (a spawned worker has not run it)
    # the parent's plugins (ROBUSTBENCH_NACL_PLUGINS, and the installed entry points): a spawned
    # worker has not imported them, and a forked one finds them loaded (a no-op)
    plugins.load_plugins()


def make_pool(workers: int, device: str = "cpu") -> Executor | None:
    """A process pool of ``workers`` single-threaded workers (None for one: run inline)."""
    if workers <= 1:
        return None
    import multiprocessing as mp

    method = start_method(device)
    return ProcessPoolExecutor(workers, mp_context=mp.get_context(method), initializer=_init_worker)


def start_method(device: str) -> str:
    """How the pool starts its workers for jobs on ``device``.

    spawn for CUDA: a forked child of a parent that has touched CUDA (a device query is enough)
    fails at its first CUDA call, and whether the parent has is not this function's to know. fork
    elsewhere (where available) reuses the parent's imports: spawning re-imports torch and
    scikit-learn in every worker (~10 s each on 2 loaded cores). The parent has run no torch op
    yet, so no OpenMP pool exists to be forked.
    """
    import multiprocessing as mp

    if str(device).startswith("cuda") or "fork" not in mp.get_all_start_methods():
        return "spawn"
    return "fork"


def run_jobs(
    pool: Executor | None, jobs: list[tuple[Any, ...]], fn: Callable[..., Any], desc: str, progress: bool
) -> list[Any]:
    """Run independent jobs in the worker pool (or inline without one); errors propagate."""
    bar = tqdm(total=len(jobs), desc=desc, disable=not progress, unit="job")
    results = []
    try:
        if pool is None:
            for args in jobs:
                results.append(fn(*args))
                bar.update()
        else:
            for f in as_completed([pool.submit(fn, *args) for args in jobs]):
                results.append(f.result())
                bar.update()
    finally:
        bar.close()
    return results


# ============ one entry ============


def train_entry(
    entry: ZooEntry, ckpts: str | Path, device: str = "cpu", progress: bool = False
) -> str | None:
    """Train one entry into ``ckpts/<id>`` (resuming a killed run; a trained one is left alone).
    Returns its id when this call trained it, None when it was trained already (or by another process
    while this one waited for the lock), so that nobody reports work another process did."""
    from .training import train

    d = checkpoint_dir(entry, ckpts)
    if is_trained(entry, ckpts):
        return None
    import torch.distributed as dist

    # another process training this entry into the same folder: wait for it, then use its checkpoint
    # (the ranks of one DDP job are one training: they share it, and must not wait for each other;
    # a post-processing is one process's work: the other ranks wait for it and find it done)
    ddp = dist.is_available() and dist.is_initialized() and entry.post is None
    lock = contextlib.nullcontext() if ddp else advisory_lock(ckpts, entry.id, f"the training of {entry.id}")
    with lock:
        if is_trained(entry, ckpts):
            return None
        if entry.post is not None:
            _post_process_entry(entry, ckpts, device, progress)
            return entry.id
        # the monitor (kNN, and the quick probe with monitor_probe) at initialisation and every
        # monitor_every epochs (default: after the last only); it does not change the weights or ids.
        # A DeACL entry: its teacher entry's checkpoint under ckpts (one line if it is not trained yet)
        every = int(entry.recipe.get("monitor_every") or max(int(entry.recipe["epochs"]), 1))
        monitor = {"knn_every": every, "monitor_probe": bool(entry.recipe.get("monitor_probe", False))}
        cfg = entry.train_config(ckpts=ckpts, **monitor)
        # sync_bn: in a multi-process job (launch, several GPUs) BatchNorm still sees the whole batch,
        # so an entry's recipe does not depend on how many processes train it (one: a no-op)
        train(cfg, d, device=device, resume=(d / "train_state.pt").exists(), progress=progress, sync_bn=True)
    return entry.id


def _post_process_entry(entry: ZooEntry, ckpts: str | Path, device: str, progress: bool) -> None:
    """Make a post entry: its parent entry's checkpoint under ``ckpts`` (one line if it is not
    trained), post-processed with the entry's recipe and settings (``overrides``) into ``ckpts/<id>``
    (resumable: ``post_process`` keeps its per-stage states there until the checkpoint is written)."""
    from .post import post_process
    from .zoo import post_parent_dir

    post = entry.post or {}
    post_process(
        post_parent_dir(entry, ckpts),
        str(post["recipe"]),
        checkpoint_dir(entry, ckpts),
        overrides=dict(entry.overrides),
        device=device,
        progress=progress,
        checkpoint_id=entry.id,  # rows carry the entry's id, as a trained entry's do (completeness)
    )


def eval_arguments(entry: ZooEntry, control: bool = False) -> dict[str, Any]:
    """The arguments :func:`eval_entry` gives ``evaluate`` for an entry (its manifest's ``eval``).

    The evaluation seed (attack starts, probe initialisation, the control's weights) is the entry's
    training seed, so the controls of a 3-seed zoo are three different random networks.
    """
    from .eval.probe import ProbeConfig
    from .results.finetune import AffConfig, AlfConfig

    ev = entry.eval
    lr = {"lr": float(ev["probe_lr"])} if ev.get("probe_lr") is not None else {}  # else ProbeConfig's
    return {
        "transfer": ev.get("transfer"),
        "shift": ev.get("shift"),
        "corruptions": ev.get("corruptions"),
        "severities": ev.get("severities"),
        "protocol": ev.get("protocol", "slf"),
        "suite": ev.get("suite", "paper"),
        "setting_suites": ev.get("setting_suites"),
        "finetune_settings": ev.get("finetune_settings"),
        "finetune_recipe": ev.get("finetune_recipe", "uniform"),
        "n_examples": ev.get("n_examples"),
        "seed": entry.seed,
        "probe": ProbeConfig(
            epochs=ev.get("probe_epochs") or DEFAULT_PROBE_EPOCHS,
            seed=entry.seed,
            max_train=ev.get("probe_max_train"),
            standardize=ev.get("probe_standardize", False),
            **lr,
        ),
        "alf": AlfConfig(**ev.get("alf", {})),
        "aff": AffConfig(**ev.get("aff", {})),
        "control": control,
    }


def eval_entry(
    entry: ZooEntry,
    ckpts: str | Path,
    out: str | Path,
    device: str = "cpu",
    control: bool = False,
    progress: bool = False,
) -> int | None:
    """Evaluate a trained entry (or its random-init control) as its manifest says (:func:`eval_arguments`);
    rows go to ``out/rows``, the fitted linear heads to ``out/heads``. Returns the number of rows, or
    None when every row existed already (another process computed them while this one waited)."""
    from .eval.evaluate import evaluate

    args = eval_arguments(entry, control)
    rows = evaluate(
        checkpoint_dir(entry, ckpts),
        out=out,
        device=device,
        progress=progress,
        save_heads=True,  # the fitted probes beside the rows (out/heads/): what publishing a model ships
        **args,
    )
    return len(rows) if rows.computed else None


def with_protocol(entries: list[ZooEntry], protocol: str) -> list[ZooEntry]:
    """The entries evaluated under ``protocol`` (``slf``, ``alf``, ``aff`` or a comma list), each
    finetuning protocol with its literature defaults. SLF alone leaves the entries as they are."""
    import dataclasses

    from .eval.finetune import parse_protocols

    names = parse_protocols(protocol)
    if names == ["slf"]:
        return entries
    return [dataclasses.replace(e, eval={**e.eval, "protocol": ",".join(names)}) for e in entries]


def by_protocol(entries: Iterable[ZooEntry]) -> list[ZooEntry]:
    """Each entry once per protocol its manifest asks for (``eval.protocol``, default slf), with that
    protocol alone, in the order of :data:`PROTOCOL_ORDER` (slf, alf, aff, label-free): a zoo run
    evaluates every encoder's SLF rows before any encoder's ALF rows, so a budget that runs out cuts the least
    important protocol (docs/decisions.md, 'Reference leaderboard')."""
    import dataclasses

    from .eval.finetune import parse_protocols

    asked = [(e, parse_protocols(e.eval.get("protocol", "slf"))) for e in entries]
    return [
        dataclasses.replace(e, eval={**e.eval, "protocol": p})
        for p in PROTOCOL_ORDER
        for e, names in asked
        if p in names
    ]


def control_id(entry: ZooEntry) -> str:
    """The checkpoint id the rows of an entry's random-init control carry."""
    return expected_id(entry.encoder, "random-init", entry.dataset, entry.seed)


def control_entries(entries: Iterable[ZooEntry]) -> list[ZooEntry]:
    """One entry per (encoder, options, dataset, seed, evaluation): whose random-init controls are run."""
    first: dict[str, ZooEntry] = {}
    for e in entries:
        key = json.dumps([e.encoder, e.encoder_kwargs, e.dataset, e.seed, e.eval], sort_keys=True)
        first.setdefault(key, e)
    return list(first.values())


#: ``rows_done(..., device=ANY_DEVICE)`` (``zoo --any-device``): a row of any device class counts
ANY_DEVICE = "any"


def row_key(identity: dict[str, Any]) -> str:
    """A row's id with its checkpoint's sha256 and its device class left out: what a zoo knows before
    (or without) the weights; which device class counts is :func:`rows_done`'s choice."""
    from .results.rows import DEVICE_CLASS, row_id

    return row_id({**identity, "checkpoint_sha256": None, DEVICE_CLASS: None})


def row_keys(entry: ZooEntry, control: bool = False) -> frozenset[str]:
    """The keys (:func:`row_key`) of every row a complete evaluation of ``entry`` (or of its control,
    which has the same protocol) writes, from the identity function ``evaluate`` itself uses. The
    entry's own rows also depend on its loss family and dual BatchNorm (AFF on a dual-BN encoder is
    dual-BN TRADES, a different identity); the control is a plain single-BN network."""
    from .eval.evaluate import planned_identities

    facts = {} if control else _checkpoint_facts(entry)
    return frozenset(row_key(i) for i in planned_identities(entry.dataset, **eval_arguments(entry), **facts))


def _checkpoint_facts(entry: ZooEntry) -> dict[str, Any]:
    """What the rows' identities need of the entry's checkpoint: its loss family and whether it has
    dual BatchNorm (as training.manifest decides: an adversarial objective with ``dual_bn``; a post
    entry's loss is what its checkpoint records, its parent's + "++", and it has dual BatchNorm)."""
    from .zoo.manifests import has_dual_bn

    try:
        return {"loss": entry.loss, "dual_bn": has_dual_bn(entry)}
    except UserError:  # a plugin loss not loaded here: its rows are planned as single-BN
        return {"loss": entry.loss}


def expected_rows(entry: ZooEntry) -> int:
    """How many rows a complete evaluation of ``entry`` writes: settings x ((attack, eps) + worst cases)."""
    return len(row_keys(entry))


def rows_done(
    out: str | Path, current: Mapping[str, str] | None = None, device: str = "cpu"
) -> dict[str, set[str]]:
    """The keys (:func:`row_key`) of the valid result rows under ``out/rows`` and in ``out``'s row
    pack (:data:`~.results.rows.ROW_PACK`, as ``load_rows`` reads it), per checkpoint id
    (unreadable, edited or foreign files are not counted: they are recomputed). ``current`` maps a
    checkpoint id to the sha256 of its weights where they are known (:func:`current_sha256`): a row
    of that id computed on other weights (the entry was retrained) is not counted either. Only rows
    of ``device``'s class count (a CPU's rows for a CPU run, a GPU's for that GPU's): a row of
    another class measured the same settings with other arithmetic (:data:`ANY_DEVICE`: any class)."""
    from .results.rows import DEVICE_CLASS, ROW_PACK, read_valid_row, valid_pack_rows

    current = current or {}
    done: dict[str, set[str]] = {}
    rows = [read_valid_row(path, path.stem) for path in (Path(out) / "rows").glob("*.json")]
    rows += valid_pack_rows(Path(out) / ROW_PACK)  # rows held only in a row pack count too
    counts = _class_filter(device)
    for row in rows:
        if row is None or current.get(row.checkpoint_id, row.checkpoint_sha256) != row.checkpoint_sha256:
            continue
        if not counts(row.get(DEVICE_CLASS)):
            continue
        done.setdefault(row.checkpoint_id, set()).add(row_key(row.to_json()))
    return done


def _class_filter(device: str) -> Callable[[str | None], bool]:
    """Which rows' device classes (utils.device_class; None: a CPU) count as done for a run on
    ``device``: a CPU's rows for "cpu", any for :data:`ANY_DEVICE`, that card's for a GPU here. A GPU
    this process cannot see (a Slurm login node submitting GPU jobs) cannot be named: any GPU's rows
    count then."""
    if device == ANY_DEVICE:
        return lambda _: True
    if device == "cpu":
        return lambda c: c is None
    import torch

    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        return lambda c: c is not None and c.startswith("cuda:")
    from .utils import device_class

    wanted = device_class(device)
    return lambda c: c == wanted


def current_sha256(entries: Iterable[ZooEntry], ckpts: str | Path) -> dict[str, str]:
    """Entry id -> the sha256 of its weights under ``ckpts``, for the entries trained there: what
    :func:`rows_done` checks a row's weights against."""
    return {e.id: sha for e in entries if (sha := trained_sha256(e, ckpts)) is not None}


def is_complete(entry: ZooEntry, done: dict[str, set[str]], control: bool = False) -> bool:
    """Whether every row the entry's manifest asks for (of the entry, or of its control) is in ``done``:
    rows of another protocol (n_examples, suite, probe, ...) do not count."""
    return row_keys(entry, control) <= done.get(control_id(entry) if control else entry.id, set())


def superseded_rows(
    entries: Iterable[ZooEntry], out: str | Path, controls: bool = True, ckpts: str | Path | None = None
) -> list[Path]:
    """Rows under ``out/rows`` of the entries' (and controls') checkpoint ids that no manifest asks for
    any more (the entry's evaluation changed) or, where the entry is trained under ``ckpts``, that
    were computed on another checkpoint than the one there (the entry was retrained: a row's key
    leaves the weights out, so without this its old rows would count as the new checkpoint's):
    what ``zoo run`` moves aside before rendering. An entry not trained under ``ckpts`` keeps its
    rows (committed rows stand for their checkpoints)."""
    from .results.rows import read_valid_row

    wanted: dict[str, set[str]] = {}
    current: dict[str, str] = {}
    for e in entries:
        wanted.setdefault(e.id, set()).update(row_keys(e))
        if controls:
            wanted.setdefault(control_id(e), set()).update(row_keys(e, control=True))
        if ckpts is not None and (sha := trained_sha256(e, ckpts)) is not None:
            current[e.id] = sha
    stale = []
    for path in sorted((Path(out) / "rows").glob("*.json")):
        row = read_valid_row(path, path.stem)
        if row is None or row.checkpoint_id not in wanted:
            continue
        retrained = row.checkpoint_id in current and row.checkpoint_sha256 != current[row.checkpoint_id]
        if retrained or row_key(row.to_json()) not in wanted[row.checkpoint_id]:
            stale.append(path)
    return stale


def trained_sha256(entry: ZooEntry, ckpts: str | Path) -> str | None:
    """The sha256 of the weights the entry's checkpoint under ``ckpts`` names (its manifest's
    ``weights_sha256``, what every row of it carries), or None where it is not trained there."""
    from .models.checkpoint import CheckpointError, read_manifest

    if not is_trained(entry, ckpts):
        return None
    try:
        return str(read_manifest(checkpoint_dir(entry, ckpts))["weights_sha256"])
    except CheckpointError:
        return None  # a corrupt manifest: training it again says so, not this sweep


def set_aside(paths: list[Path], out: str | Path) -> int:
    """Move rows to ``out/SUPERSEDED_DIR`` (kept, not deleted, and out of the leaderboard); how many."""
    if not paths:
        return 0
    dest = Path(out) / SUPERSEDED_DIR
    dest.mkdir(parents=True, exist_ok=True)
    for p in paths:
        p.replace(dest / p.name)
    print(
        f"{len(paths)} result rows of these entries were computed under another evaluation protocol than "
        f"their manifests now say (n_examples, suite, probe, ...) or on a checkpoint they were retrained "
        f"since: moved to {dest}",
        file=sys.stderr,
    )
    return len(paths)


# ============ a whole zoo ============


def training_waves(todo: list[ZooEntry], entries: list[ZooEntry], ckpts: str | Path) -> list[list[ZooEntry]]:
    """``todo`` in dependency order, one wave per stage: the entries that need no other entry's
    checkpoint first, with every untrained entry the others need (a DeACL teacher, the parent of a
    post entry; one whose own rows are complete still trains, for the entries that need it), then
    those that need them, and so on. An entry needed that is neither among ``entries`` nor trained
    under ``ckpts`` is a one-line error before anything trains."""
    by_id = {e.id: e for e in entries}
    wanted = {e.id: e for e in todo}
    pending = list(todo)
    while pending:  # pull in the untrained entries the wanted ones need, transitively
        dep = pending.pop().dependency()
        if dep is None or dep[1] in wanted or (Path(ckpts) / dep[1] / "manifest.json").is_file():
            continue
        verb, needed = dep
        if needed not in by_id:
            who = next(e.id for e in wanted.values() if e.dependency() == dep)
            raise UserError(
                f"zoo entry {who} {verb} entry {needed}, which is neither among the entries of this "
                f"run nor trained under {ckpts}: add it (e.g. `zoo train {needed} {who}`) or train it first"
            )
        wanted[needed] = by_id[needed]
        pending.append(by_id[needed])

    stages = {e.id: _stage(e, wanted) for e in wanted.values()}
    order = sorted(wanted.values(), key=lambda e: stages[e.id])  # stable: todo's order within a stage
    waves = [[e for e in order if stages[e.id] == n] for n in range(max(stages.values(), default=-1) + 1)]
    return [w for w in waves if w]


def _stage(entry: ZooEntry, wanted: dict[str, ZooEntry], seen: frozenset[str] = frozenset()) -> int:
    """0 for an entry that needs no entry of ``wanted``, else one more than the entry it needs."""
    dep = entry.dependency()
    if dep is None or dep[1] not in wanted:
        return 0
    if dep[1] in seen:  # e.g. a teacher that post-processes its own student: nothing can start
        raise UserError(f"zoo entry {entry.id} {dep[0]} entry {dep[1]}, which needs {entry.id} in turn")
    return 1 + _stage(wanted[dep[1]], wanted, seen | {entry.id})


@dataclass(frozen=True)
class ZooRun:
    """What :func:`run_entries` did, with its wall times in seconds."""

    trained: int
    evaluated: int
    skipped: int
    train_s: float
    eval_s: float
    superseded: int = 0  # rows no manifest asks for any more, moved to SUPERSEDED_DIR
    waited: int = 0  # trainings and evaluations another process finished while this one waited


def run_entries(
    entries: list[ZooEntry],
    ckpts: str | Path,
    out: str | Path,
    *,
    workers: int = 1,
    device: str = "cpu",
    controls: bool = True,
    progress: bool = True,
    any_device: bool = False,
) -> ZooRun:
    """Train what is not trained, then evaluate every entry (and one control per seed) into ``out/rows``.

    An entry (or control) whose rows are already complete under ``out`` is skipped altogether: rows
    of ``device``'s class count (``any_device``: rows of any class, e.g. a GPU's on a CPU run).
    """
    stale = set_aside(superseded_rows(entries, out, controls, ckpts), out)
    done = rows_done(out, device=ANY_DEVICE if any_device else device)
    todo = [e for e in by_protocol(entries) if not is_complete(e, done)]
    wanted = by_protocol(control_entries(entries)) if controls else []
    ctl = [e for e in wanted if not is_complete(e, done, control=True)]
    need = {e.id: e for e in [*todo, *ctl]}
    t0 = time.perf_counter()
    pool = make_pool(workers, device)
    try:
        untrained = [e for e in need.values() if not is_trained(e, ckpts)]
        trained: list[str | None] = []
        for n, wave in enumerate(training_waves(untrained, entries, ckpts), 1):
            jobs = [(e, str(ckpts), device) for e in wave]
            desc = f"train ({len(jobs)} of {len(entries)}, stage {n})"
            trained += run_jobs(pool, jobs, train_entry, desc, progress)
        t_train = time.perf_counter() - t0
        jobs = []
        for protocol in PROTOCOL_ORDER:  # every SLF job (entries, then controls) before any ALF job, ...
            jobs += [(e, str(ckpts), str(out), device, False) for e in todo if e.eval["protocol"] == protocol]
            jobs += [(e, str(ckpts), str(out), device, True) for e in ctl if e.eval["protocol"] == protocol]
        evaluated = run_jobs(pool, jobs, eval_entry, f"evaluate ({len(jobs)} jobs)", progress)
    finally:
        if pool is not None:
            pool.shutdown()
    skipped = len(entries) - len({e.id for e in todo})
    done_here = sum(r is not None for r in trained), sum(r is not None for r in evaluated)
    waited = len(trained) + len(evaluated) - sum(done_here)
    t_eval = time.perf_counter() - t0 - t_train
    return ZooRun(*done_here, skipped, t_train, t_eval, stale, waited)
