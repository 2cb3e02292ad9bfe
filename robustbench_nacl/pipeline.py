"""Train and evaluate zoo entries, resumably: the engine behind ``demo`` and ``zoo train|eval|run``.

An entry's manifest says everything: the training recipe (``max_train`` included) and how it is
evaluated (``eval``: transfer, shift, suite, n_examples, probe_epochs, probe_max_train). Work is
skipped at two grains: a trained checkpoint is not retrained, and an entry whose result rows are all
under ``out/rows`` is neither trained nor evaluated again, so a zoo whose rows were committed resumes
on a fresh machine without its checkpoints.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .zoo import ZooEntry, checkpoint_dir, expected_id, is_trained

#: The probe's epochs when a manifest does not say (the evaluation's own default).
DEFAULT_PROBE_EPOCHS = 1000


def _init_worker() -> None:
    # Tiny models: one thread per worker process beats two contended threads per process.
    import torch

    from . import plugins

    torch.set_num_threads(1)
    # the parent's plugins (ROBUSTBENCH_NACL_PLUGINS, and the installed entry points): a spawned
    # worker has not imported them, and a forked one finds them loaded (a no-op)
    plugins.load_plugins()


def make_pool(workers: int) -> Executor | None:
    """A process pool of ``workers`` single-threaded workers (None for one: run inline)."""
    if workers <= 1:
        return None
    import multiprocessing as mp

    # fork (where available) reuses the parent's imports: spawning re-imports torch and
    # scikit-learn in every worker (~10 s each on 2 loaded cores). The parent has run no torch
    # op yet, so no OpenMP pool exists to be forked.
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=mp.get_context(method), initializer=_init_worker)


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


def train_entry(entry: ZooEntry, ckpts: str | Path, device: str = "cpu", progress: bool = False) -> str:
    """Train one entry into ``ckpts/<id>`` (resuming a killed run; a trained one is left alone)."""
    from .training import train

    d = checkpoint_dir(entry, ckpts)
    if not is_trained(entry, ckpts):
        # the kNN monitor at initialisation and after the last epoch only: it does not change the weights
        cfg = entry.train_config(knn_every=max(int(entry.recipe["epochs"]), 1))
        # sync_bn: in a multi-process job (launch, several GPUs) BatchNorm still sees the whole batch,
        # so an entry's recipe does not depend on how many processes train it (one: a no-op)
        train(cfg, d, device=device, resume=(d / "train_state.pt").exists(), progress=progress, sync_bn=True)
    return entry.id


def eval_entry(
    entry: ZooEntry,
    ckpts: str | Path,
    out: str | Path,
    device: str = "cpu",
    control: bool = False,
    progress: bool = False,
) -> int:
    """Evaluate a trained entry (or its random-init control) as its manifest says; rows go to ``out/rows``.

    The evaluation seed (attack starts, probe initialisation, the control's weights) is the entry's
    training seed, so the controls of a 3-seed zoo are three different random networks.
    """
    from .eval.evaluate import evaluate
    from .eval.probe import ProbeConfig

    ev = entry.eval
    rows = evaluate(
        checkpoint_dir(entry, ckpts),
        transfer=ev.get("transfer"),
        shift=ev.get("shift"),
        suite=ev.get("suite", "paper"),
        out=out,
        n_examples=ev.get("n_examples"),
        seed=entry.seed,
        probe=ProbeConfig(
            epochs=ev.get("probe_epochs") or DEFAULT_PROBE_EPOCHS,
            seed=entry.seed,
            max_train=ev.get("probe_max_train"),
        ),
        device=device,
        control=control,
        progress=progress,
        protocol=ev.get("protocol", "slf"),
    )
    return len(rows)


def with_protocol(entries: list[ZooEntry], protocol: str) -> list[ZooEntry]:
    """The entries evaluated under ``protocol`` (``slf``, ``alf``, ``aff`` or a comma list), each
    finetuning protocol with its literature defaults. SLF alone leaves the entries as they are."""
    import dataclasses

    from .eval.finetune import parse_protocols

    names = parse_protocols(protocol)
    if names == ["slf"]:
        return entries
    return [dataclasses.replace(e, eval={**e.eval, "protocol": ",".join(names)}) for e in entries]


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


def expected_rows(entry: ZooEntry) -> int:
    """The rows a complete evaluation of ``entry`` writes: settings x ((attack, eps) + worst cases)."""
    from .attack.suites import load_suite
    from .eval.evaluate import settings_for
    from .eval.finetune import parse_protocols

    ev = entry.eval
    suite = load_suite(ev.get("suite", "paper"))
    worst_cases = {(s.norm, e) for s in suite.attacks for e in s.eps}
    per_setting = sum(len(s.eps) for s in suite.attacks) + len(worst_cases)
    protocols = len(parse_protocols(ev.get("protocol", "slf")))
    return len(settings_for(entry.dataset, ev.get("transfer"), ev.get("shift"))) * per_setting * protocols


def rows_done(out: str | Path) -> dict[str, int]:
    """Result rows under ``out/rows`` per checkpoint id (unreadable files are not counted)."""
    counts: dict[str, int] = {}
    for path in (Path(out) / "rows").glob("*.json"):
        try:
            cid = json.loads(path.read_text()).get("checkpoint_id")
        except (OSError, ValueError):
            continue
        if isinstance(cid, str):
            counts[cid] = counts.get(cid, 0) + 1
    return counts


# ============ a whole zoo ============


@dataclass(frozen=True)
class ZooRun:
    """What :func:`run_entries` did, with its wall times in seconds."""

    trained: int
    evaluated: int
    skipped: int
    train_s: float
    eval_s: float


def run_entries(
    entries: list[ZooEntry],
    ckpts: str | Path,
    out: str | Path,
    *,
    workers: int = 1,
    device: str = "cpu",
    controls: bool = True,
    progress: bool = True,
) -> ZooRun:
    """Train what is not trained, then evaluate every entry (and one control per seed) into ``out/rows``.

    An entry (or control) whose rows are already complete under ``out`` is skipped altogether.
    """
    done = rows_done(out)
    todo = [e for e in entries if done.get(e.id, 0) < expected_rows(e)]
    ctl = [e for e in control_entries(entries) if controls and done.get(control_id(e), 0) < expected_rows(e)]
    need = {e.id: e for e in [*todo, *ctl]}
    t0 = time.perf_counter()
    pool = make_pool(workers)
    try:
        train_jobs = [(e, str(ckpts), device) for e in need.values() if not is_trained(e, ckpts)]
        run_jobs(pool, train_jobs, train_entry, f"train ({len(train_jobs)} of {len(entries)})", progress)
        t_train = time.perf_counter() - t0
        jobs = [(e, str(ckpts), str(out), device, False) for e in todo]
        jobs += [(e, str(ckpts), str(out), device, True) for e in ctl]
        run_jobs(pool, jobs, eval_entry, f"evaluate ({len(jobs)} jobs)", progress)
    finally:
        if pool is not None:
            pool.shutdown()
    skipped = len(entries) - len(todo)
    return ZooRun(len(train_jobs), len(jobs), skipped, t_train, time.perf_counter() - t0 - t_train)
