"""Which AutoAttack component decided each example.

AutoAttack's standard version runs its components in order (APGD-CE, APGD-T, FAB-T, Square), each
on the examples the previous ones left correctly classified. :func:`trace_components` wraps each
component object of one ``pyautoattack.AutoAttack`` (its public ``perturb``, per instance) so that
the examples a component fools are recorded; :func:`recording` collects those records per eps for
the caller (``benchmark``), which turns them into row fields (:func:`component_fields`): the
survivors after each component and, per component, the examples it decided. A gradient-free Square
that still fools examples after the gradient attacks is one of AutoAttack's own warning signs
(``checks.check_square_sr``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

#: code of an example no component fooled (it survived AutoAttack)
SURVIVED = -1
#: code of an example AutoAttack found misclassified before attacking (none, for a deterministic
#: model: benchmark passes clean-correct examples only)
MISCLASSIFIED = -3

# eps -> one int8 tensor per attacked chunk: the index (in ``names``) of the component that fooled
# each example, SURVIVED if none did; and the component names in the order they ran
_RECORD: ContextVar[dict[float, dict[str, Any]] | None] = ContextVar("autoattack_record", default=None)


def _component(aa: Any, attr: str) -> str:
    """The name of the component that ``aa.<attr>.perturb`` runs now (run_standard_evaluation sets
    ``apgd.loss`` and ``fab.targeted`` just before it calls them)."""
    if attr == "apgd":
        return "apgd-ce" if aa.apgd.loss == "ce" else "apgd-dlr"
    if attr == "fab":
        return "fab-t" if aa.fab.targeted else "fab"
    return {"apgd_targeted": "apgd-t", "square": "square"}[attr]


def trace_components(aa: Any, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Wrap ``aa``'s components; returns the (filled as AutoAttack runs) per-example decider codes.

    Assumes one AutoAttack batch covering all of ``x`` (how :func:`..attacks.autoattack` calls it):
    a component then receives exactly the examples still correct, in index order.
    """
    decided = torch.full((len(x),), SURVIVED, dtype=torch.int8, device=x.device)
    with torch.no_grad():  # AutoAttack attacks only what it classifies correctly itself
        decided[model(x).argmax(1) != y] = MISCLASSIFIED
    order: list[str] = list(aa.attacks_to_run)

    def wrap(attr: str) -> None:
        obj = getattr(aa, attr)
        original = obj.perturb

        def perturb(xs: Tensor, ys: Tensor, *args: Any, **kw: Any) -> Tensor:
            adv = original(xs, ys, *args, **kw)
            alive = (decided == SURVIVED).nonzero().flatten()
            if len(alive) != len(xs):  # not the single-batch call assumed: record nothing
                return adv
            with torch.no_grad():
                fooled = model(adv).argmax(1) != ys.to(adv.device)
            decided[alive[fooled.to(alive.device)]] = order.index(_component(aa, attr))
            return adv

        obj.perturb = perturb  # an instance attribute: the class and other instances are untouched

    for attr in ("apgd", "apgd_targeted", "fab", "square"):
        wrap(attr)
    return decided


def record(eps: float, names: list[str], decided: Tensor) -> None:
    """Hand one chunk's decider codes to the active :func:`recording`, if any."""
    rec = _RECORD.get()
    if rec is not None:
        entry = rec.setdefault(float(eps), {"names": names, "chunks": []})
        entry["chunks"].append(decided.detach().cpu())


@contextlib.contextmanager
def recording() -> Iterator[dict[float, dict[str, Any]]]:
    """Collect the decider codes of every AutoAttack run inside the block, per eps, chunks in order."""
    token = _RECORD.set({})
    try:
        yield _RECORD.get()  # type: ignore[misc]
    finally:
        _RECORD.reset(token)


def component_fields(entry: dict[str, Any], attacked: Tensor, n: int, encode: Any) -> dict[str, Any]:
    """Flat row fields from one eps's record: ``attacked`` indexes the examples AutoAttack ran on (of
    ``n``); ``encode`` packs a boolean mask as text (``results.bits.encode_bits``).

    ``aa_components``: the components in the order they ran; per component ``c`` (dashes as
    underscores): ``aa_n_robust_after_c`` and ``aa_robust_acc_after_c`` (examples still correct after
    it, of all ``n``) and ``aa_decided_bits_c`` (the examples it fooled). Survivors never increase,
    and the last count equals the row's ``n_robust``.
    """
    names: list[str] = entry["names"]
    codes = torch.cat(entry["chunks"]).to(attacked.device)
    per_example = torch.full((n,), -2, dtype=torch.int8, device=attacked.device)  # -2: not attacked
    per_example[attacked] = codes
    alive = int((codes != MISCLASSIFIED).sum())
    out: dict[str, Any] = {"aa_components": ",".join(names)}
    for k, name in enumerate(names):
        key = name.replace("-", "_")
        hit = per_example == k
        alive -= int(hit.sum())
        out[f"aa_n_robust_after_{key}"] = alive
        out[f"aa_robust_acc_after_{key}"] = alive / n
        out[f"aa_decided_bits_{key}"] = encode(np.asarray(hit.cpu()))
    return out


def square_new_finds(fields: dict[str, Any]) -> int | None:
    """Examples Square fooled after the gradient attacks before it had run (None without Square)."""
    names = str(fields.get("aa_components", "")).split(",")
    if "square" not in names or names.index("square") == 0:
        return None
    before = names[names.index("square") - 1].replace("-", "_")
    return int(fields[f"aa_n_robust_after_{before}"]) - int(fields["aa_n_robust_after_square"])
