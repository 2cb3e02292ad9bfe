"""Which AutoAttack component decided each example.

AutoAttack's standard version runs its components in order (APGD-CE, APGD-T, FAB-T, Square), each
on the examples the previous ones left correctly classified. :func:`trace_components` wraps each
component object of one ``pyautoattack.AutoAttack`` (its public ``perturb``, per instance) so that
the examples a component fools are recorded; :func:`recording` collects those records per eps for
the caller (``benchmark``), which turns them into row fields (:func:`component_fields`): the
survivors after each component and, per component, the examples it decided, its wall time and the
model forwards it made; and the seed and examples of each AutoAttack call, so that a row can be
replayed with pyautoattack alone (:mod:`.autoattack_replay`). A gradient-free Square
that still fools examples after the gradient attacks is one of AutoAttack's own warning signs
(``checks.check_square_sr``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

#: code of an example no component fooled (it survived AutoAttack)
SURVIVED = -1
#: code of an example AutoAttack found misclassified before attacking (none, for a deterministic
#: model: benchmark passes clean-correct examples only)
MISCLASSIFIED = -3

#: the components a screening run (version "screen") runs on every example; the others run on a sample
SCREEN_GRADIENT = ("apgd-ce", "apgd-t")
#: what a screening row says, by whether its sample found examples the gradient components missed
SCREEN_ADVICE = {
    False: "the sample found nothing APGD missed",
    True: "run AutoAttack standard: the sample found examples APGD missed",
}

# eps -> one Trace per attacked chunk (its ``decided``: the index in ``names`` of the component that
# fooled each example, SURVIVED if none did); and the component names in the order they ran
_RECORD: ContextVar[dict[float, dict[str, Any]] | None] = ContextVar("autoattack_record", default=None)


def _component(aa: Any, attr: str) -> str:
    """The name of the component that ``aa.<attr>.perturb`` runs now (run_standard_evaluation sets
    ``apgd.loss`` and ``fab.targeted`` just before it calls them)."""
    if attr == "apgd":
        return "apgd-ce" if aa.apgd.loss == "ce" else "apgd-dlr"
    if attr == "fab":
        return "fab-t" if aa.fab.targeted else "fab"
    return {"apgd_targeted": "apgd-t", "square": "square"}[attr]


def _clock(device: torch.device) -> float:
    """``time.perf_counter()`` once ``device`` has finished its queued work (CUDA is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class Trace:
    """What one AutoAttack call on one chunk did: per example, the component that fooled it
    (``decided``); per component, its wall time and the model forwards it made (calls, and examples
    summed over calls); the seed it ran with; for a screening run, which survivors were sampled."""

    decided: Tensor
    seed: int
    wall_s: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)
    sampled: Tensor | None = None


def new_trace(model: nn.Module, x: Tensor, y: Tensor, seed: int) -> Trace:
    """A trace of ``len(x)`` examples: those ``model`` already misclassifies are MISCLASSIFIED."""
    decided = torch.full((len(x),), SURVIVED, dtype=torch.int8, device=x.device)
    with torch.no_grad():  # AutoAttack attacks only what it classifies correctly itself
        decided[model(x).argmax(1) != y] = MISCLASSIFIED
    return Trace(decided, seed)


def trace_components(
    aa: Any, model: nn.Module, x: Tensor, y: Tensor, trace: Trace, *, order: list[str], index: Tensor
) -> RemovableHandle:
    """Wrap ``aa``'s components so that ``trace`` records what each does on ``x[index]`` (``x``: what
    the trace covers; ``aa`` runs on ``x[index]`` in one batch, as :func:`..autoattack_adapter.autoattack`
    calls it, so a component receives exactly the examples of ``index`` still correct, in order).
    ``order``: the component names as the trace numbers them. The forwards are counted by a hook on
    ``model`` while a component runs (AutoAttack's own forward of each component's result is not);
    the caller removes it (the returned handle) once AutoAttack has run.
    """
    device = x.device
    active: list[str] = []

    def count(_m: nn.Module, args: tuple[Any, ...]) -> None:
        if active:
            trace.calls[active[0]] = trace.calls.get(active[0], 0) + 1
            trace.examples[active[0]] = trace.examples.get(active[0], 0) + len(args[0])

    def wrap(attr: str) -> None:
        obj = getattr(aa, attr)
        original = obj.perturb

        def perturb(xs: Tensor, ys: Tensor, *args: Any, **kw: Any) -> Tensor:
            name = _component(aa, attr)
            active.append(name)
            t = _clock(device)
            try:
                adv = original(xs, ys, *args, **kw)
            finally:
                trace.wall_s[name] = trace.wall_s.get(name, 0.0) + _clock(device) - t
                active.clear()
            alive = index[trace.decided[index] == SURVIVED]
            if len(alive) != len(xs):  # not the single-batch call assumed: record nothing
                return adv
            with torch.no_grad():
                fooled = model(adv).argmax(1) != ys.to(adv.device)
            trace.decided[alive[fooled.to(alive.device)]] = order.index(name)
            return adv

        obj.perturb = perturb  # an instance attribute: the class and other instances are untouched

    for attr in ("apgd", "apgd_targeted", "fab", "square"):
        wrap(attr)
    return model.register_forward_pre_hook(count)


def record(eps: float, names: list[str], trace: Trace) -> None:
    """Hand one chunk's trace to the active :func:`recording`, if any."""
    rec = _RECORD.get()
    if rec is not None:
        entry = rec.setdefault(float(eps), {"names": names, "chunks": []})
        entry["chunks"].append(trace)


@contextlib.contextmanager
def recording() -> Iterator[dict[float, dict[str, Any]]]:
    """Collect the traces of every AutoAttack run inside the block, per eps, chunks in order."""
    token = _RECORD.set({})
    try:
        yield _RECORD.get()  # type: ignore[misc]
    finally:
        _RECORD.reset(token)


def _per_component(chunks: list[Trace], names: list[str]) -> dict[str, Any]:
    """Per component ``c``: wall seconds and forwards (calls, examples) summed over the chunks."""
    out: dict[str, Any] = {}
    for name in names:
        key = name.replace("-", "_")
        out[f"aa_wall_s_{key}"] = round(sum(t.wall_s.get(name, 0.0) for t in chunks), 4)
        out[f"aa_forward_calls_{key}"] = sum(t.calls.get(name, 0) for t in chunks)
        out[f"aa_forward_examples_{key}"] = sum(t.examples.get(name, 0) for t in chunks)
    return out


def component_fields(entry: dict[str, Any], attacked: Tensor, n: int, encode: Any) -> dict[str, Any]:
    """Flat row fields from one eps's record: ``attacked`` indexes the examples AutoAttack ran on (of
    ``n``); ``encode`` packs a boolean mask as text (``results.bits.encode_bits``).

    ``aa_components``: the components in the order they ran; per component ``c`` (dashes as
    underscores): ``aa_n_robust_after_c`` and ``aa_robust_acc_after_c`` (examples still correct after
    it, of all ``n``), ``aa_decided_bits_c`` (the examples it fooled), ``aa_wall_s_c``,
    ``aa_forward_calls_c`` and ``aa_forward_examples_c`` (its cost). Survivors never increase, and
    the last count equals the row's ``n_robust``. ``aa_seeds`` and ``aa_chunk_sizes``: the seed each
    AutoAttack call received and how many of the attacked examples (in index order) it ran on, which
    is all a replay with pyautoattack needs (:mod:`.autoattack_replay`). A screening row adds
    ``aa_screen_*`` (:func:`screen_fields`).
    """
    names: list[str] = entry["names"]
    chunks: list[Trace] = entry["chunks"]
    codes = torch.cat([t.decided for t in chunks]).to(attacked.device)
    per_example = torch.full((n,), -2, dtype=torch.int8, device=attacked.device)  # -2: not attacked
    per_example[attacked] = codes
    alive = int((codes != MISCLASSIFIED).sum())
    out: dict[str, Any] = {
        "aa_components": ",".join(names),
        "aa_seeds": [t.seed for t in chunks],
        "aa_chunk_sizes": [len(t.decided) for t in chunks],
    }
    for k, name in enumerate(names):
        key = name.replace("-", "_")
        hit = per_example == k
        alive -= int(hit.sum())
        out[f"aa_n_robust_after_{key}"] = alive
        out[f"aa_robust_acc_after_{key}"] = alive / n
        out[f"aa_decided_bits_{key}"] = encode(np.asarray(hit.cpu()))
    out |= _per_component(chunks, names)
    if any(t.sampled is not None for t in chunks):
        out |= screen_fields(chunks, names, attacked, n, encode)
    return out


def screen_fields(
    chunks: list[Trace], names: list[str], attacked: Tensor, n: int, encode: Any
) -> dict[str, Any]:
    """The fields of a screening row (:mod:`.autoattack_screen`): ``aa_screen_survivors`` (examples
    the gradient components left correct), ``aa_screen_sample_size`` and ``aa_screen_sample_bits``
    (the sampled ones, of all ``n``), ``aa_screen_found`` (sampled examples the components after
    them fooled) and ``aa_screen_advice``, which says to run AutoAttack standard when that is > 0."""
    sampled = torch.zeros(n, dtype=torch.bool, device=attacked.device)
    late = [k for k, name in enumerate(names) if name not in SCREEN_GRADIENT]
    survivors = found = 0
    for t, idx in zip(chunks, torch.split(attacked, [len(t.decided) for t in chunks]), strict=True):
        if t.sampled is None:
            continue
        sampled[idx[t.sampled.to(idx.device)]] = True
        hit = sum(int((t.decided == k).sum()) for k in late)  # only sampled examples met those
        found += hit
        survivors += int((t.decided == SURVIVED).sum()) + hit
    return {
        "aa_screen_survivors": survivors,
        "aa_screen_sample_size": int(sampled.sum()),
        "aa_screen_sample_bits": encode(np.asarray(sampled.cpu())),
        "aa_screen_found": found,
        "aa_screen_advice": SCREEN_ADVICE[found > 0],
    }


def square_new_finds(fields: dict[str, Any]) -> int | None:
    """Examples Square fooled after the gradient attacks before it had run (None without Square)."""
    names = str(fields.get("aa_components", "")).split(",")
    if "square" not in names or names.index("square") == 0:
        return None
    before = names[names.index("square") - 1].replace("-", "_")
    return int(fields[f"aa_n_robust_after_{before}"]) - int(fields["aa_n_robust_after_square"])
