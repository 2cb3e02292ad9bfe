"""Evaluation integrity: cheap checks that make a robustness number trustworthy (or flag it).

Three kinds of result:

- **Errors** (``SanityError``): things that must never happen in a correct harness, e.g. a
  perturbation outside the eps-ball or [0,1] (:func:`check_perturbation`, run on every batch every
  attack returns) or robust accuracy above clean accuracy.
- **Input errors** (``UserError``, raised by ``benchmark``): a model that returns probabilities
  instead of logits (AutoAttack's ``check_range_output``): attacks on softmax outputs get vanishing
  gradients and overstate robustness, so no number is produced at all.
- **Flags** (:data:`FLAGS`): properties of the evaluated model or of the result rows that make a
  number suspect (AutoAttack's ``checks.py``, Athalye et al. 2018, Carlini et al. 2019):
  randomness, batch dependence, submodules that ignore ``eval()``, zero input gradients, accuracy
  that an unbounded attack cannot drive to zero, clean accuracy at chance, robust accuracy rising
  with eps, iterative attacks weaker than single-step ones, attacks weaker than random noise,
  AutoAttack's Square fooling examples its gradient attacks missed, a linear probe that fits its
  own training features far worse than kNN classifies test examples with them (``probe_underfit``),
  a finetuned head at chance (``finetune_above_chance``) and an ALF head that fits its training
  images far worse than the SLF probe on the same features (``alf_underfit``): these three decided
  by the runner from the probe's or the finetuning's report and added with :func:`add_flags`.

Every flag can fire through ``evaluate`` (tests/test_sanity_flags.py makes each one fire). Flags go
into every result row as ``sanity_<name>``: ``True`` when the check passes, ``False`` when it
fires, ``None`` where it does not apply. Numbers behind them ride along (``sanity_zero_grad_frac``,
``sanity_unbounded_acc``, ``sanity_chance``, ``sanity_noise_acc``). ``sanity_ok`` summarises a row;
``sanity_failed`` and ``sanity_warnings`` name the checks that fired (comma-separated; warnings do
not affect ``sanity_ok``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..attack.autoattack import square_new_finds
from ..attack.pgd import pgd
from ..attack.threat import check_perturbation
from ..errors import SanityError, UserError
from ..results.rows import PROBE_UNDERFIT_GAP
from ..utils import ieee_fp32

#: Every flag a row can carry, with what it means when it fires (``sanity_<name>`` is False).
FLAGS: dict[str, str] = {
    "deterministic": "repeated forwards of one batch disagree: a randomized model (attack with EoT)",
    "batch_independent": "an example's logits depend on the rest of its batch (batch statistics)",
    "eval_mode": "a submodule is still in training mode after model.eval() (eval() not propagated)",
    "nonzero_gradients": "some examples have an all-zero input gradient (masked gradients)",
    "unbounded_reaches_zero": "PGD at eps = 1 leaves > 5 % accuracy: the attack or the gradients fail",
    "clean_above_chance": "clean accuracy is not above the best constant classifier (collapsed model)",
    "monotone_in_eps": "robust accuracy rises with eps within one attack (a warning for FGSM)",
    "le_single_step": "an iterative attack is weaker than a single-step one at the same norm and eps",
    "attack_beats_noise": "the attack is weaker than random noise of the same size",
    "square_adds_nothing": "AutoAttack's Square (no gradients) fooled examples the gradient attacks missed",
    "screen_found_nothing": "AutoAttack screening: FAB-T or Square fooled sampled examples APGD missed",
    "probe_underfit": "the linear probe's train accuracy is > 10 points below kNN on the same features (SLF)",
    "finetune_above_chance": "a finetuned head's clean test accuracy is not above chance (it learnt nothing)",
    "alf_underfit": "the ALF head's clean train accuracy is > 10 points below the SLF probe's (same data)",
}
SANITY_N = 128
# Cross-row comparisons allow this many examples of slack (random starts differ between attacks).
TOL_EXAMPLES = 2
# Above this accuracy an attack at eps = 1 (every image reachable) counts as failing.
UNBOUNDED_MAX_ACC = 0.05
# AutoAttack's check_square_sr threshold: Square may lower robust accuracy by this fraction.
SQUARE_ALPHA = 0.002
# alf_underfit fires when the ALF head's clean train accuracy is more than this below the SLF probe's
# on the same training features (docs/decisions.md, 'Fitted ALF heads'): a fitted ALF head on the
# digits check loses at most a few points to adversarial training; the board's unfitted heads 10-30
ALF_UNDERFIT_GAP = 0.10


def _head(x: Tensor, n: int) -> Tensor:
    return x[: max(1, n)]


@torch.no_grad()
def _forward(model: nn.Module, x: Tensor, batch_size: int = 256) -> Tensor:
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


# ============ per-model checks ============


def looks_like_probabilities(out: Tensor, *, atol: float = 1e-5) -> bool:
    """True if every output row lies in [0,1] and sums to 1 (AutoAttack's ``check_range_output``)."""
    out = out.detach().float()
    if out.numel() == 0:
        return False
    in_range = bool(out.min() > -atol) and bool(out.max() < 1 + atol)
    return in_range and bool(((out.sum(-1) - 1).abs() < atol).all())


@torch.no_grad()
def check_logits_not_probs(model: nn.Module, x: Tensor, *, n: int = SANITY_N, atol: float = 1e-5) -> bool:
    """False if the model returns probabilities on ``x[:n]`` (see :func:`looks_like_probabilities`).

    Attacks on softmax outputs get vanishing gradients and overstate robustness; ``benchmark``
    refuses such a model with a ``UserError``.
    """
    return not looks_like_probabilities(model(_head(x, n)), atol=atol)


def logit_tolerance(dtype: torch.dtype, floor: float = 1e-4) -> float:
    """Relative tolerance for comparing logits of ``dtype`` computed two ways: ``floor`` (1e-4) for
    float32 and float64, 8 units of the dtype's rounding for lower precisions (float16: 7.8e-3,
    bfloat16: 6.3e-2), where one kernel's different summation order alone moves logits by more than
    1e-4 (docs/decisions.md, 'Sanity checks on GPUs')."""
    return max(floor, 8 * torch.finfo(dtype).eps)


@torch.no_grad()
def check_deterministic(
    model: nn.Module, x: Tensor, *, n: int = SANITY_N, repeats: int = 5, tol: float | None = None
) -> bool:
    """False if ``repeats`` forwards of the same batch disagree (a randomized model).

    Same criterion as AutoAttack's ``check_randomized``: predictions differ, or the L2-normalised
    logits differ by more than ``tol`` (default: :func:`logit_tolerance` of the logits' dtype). The
    forwards run with TF32 off (:func:`~robustbench_nacl.utils.ieee_fp32`).
    """
    xs = _head(x, n)
    with ieee_fp32():
        raw = [model(xs) for _ in range(repeats)]
    tol = logit_tolerance(raw[0].dtype) if tol is None else tol
    outs = [o.float() for o in raw]
    outs = [o / (o.norm(dim=-1, keepdim=True) + 1e-10) for o in outs]
    same_pred = all(bool((o.argmax(1) == outs[0].argmax(1)).all()) for o in outs)
    max_diff = max(float((o - outs[0]).norm(dim=-1).max()) for o in outs)
    return same_pred and max_diff <= tol


@torch.no_grad()
def check_batch_independence(
    model: nn.Module, x: Tensor, *, n: int = SANITY_N, k: int | None = None, tol: float | None = None
) -> bool:
    """False if ``model(x[:k])`` differs from ``model(x)[:k]``.

    Catches BatchNorm left in train mode, which ``check_deterministic`` misses (train-mode BN is
    deterministic for a fixed batch). The tolerance is relative to the logit scale because
    convolution kernels may block differently for different batch sizes; by default it is
    :func:`logit_tolerance` of the logits' dtype, and both forwards run with TF32 off, so that a
    GPU's reduced-precision float32 kernels cannot fire the flag on a sound model.
    """
    xs = _head(x, n)
    if len(xs) < 2:
        return True
    k = k or max(1, len(xs) // 2)
    with ieee_fp32():
        full, part = model(xs)[:k], model(xs[:k])
    tol = logit_tolerance(full.dtype) if tol is None else tol
    full, part = full.float(), part.float()
    return float((full - part).abs().max()) <= tol * (1.0 + float(full.abs().max()))


def check_eval_mode(model: nn.Module) -> bool:
    """True if every submodule is in eval mode (BatchNorm running statistics, dropout off).

    ``benchmark`` calls ``model.eval()`` first, so this fires only for a model whose ``eval()``
    does not reach every submodule (e.g. a ``train()`` override that forgets its children).
    """
    return not any(m.training for m in model.modules())


def check_zero_gradients(model: nn.Module, x: Tensor, y: Tensor, *, n: int = SANITY_N) -> float:
    """Fraction of examples whose input gradient is exactly zero.

    Uses the logit margin (largest other logit minus true logit) rather than cross-entropy, so a
    confidently classified example does not count just because its softmax saturated: what is
    measured is whether the network itself passes gradients (quantisation, non-differentiable
    ops and saturated probability outputs do not).
    """
    xs = _head(x, n).detach().requires_grad_(True)
    ys = _head(y, n)
    with torch.enable_grad():
        out = model(xs).float()
        true = out.gather(1, ys[:, None]).squeeze(1)
        other = out.scatter(1, ys[:, None], -math.inf).amax(1) if out.shape[1] > 1 else torch.zeros_like(true)
        margin = (other - true).sum()
        if not margin.requires_grad:
            return 1.0
        (g,) = torch.autograd.grad(margin, xs, allow_unused=True)
    if g is None:
        return 1.0
    return float((g.flatten(1).abs().sum(1) == 0).float().mean())


def _sign_noise(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
    dev = gen.device if gen is not None else x.device
    return eps * (torch.randint(0, 2, x.shape, generator=gen, device=dev).to(x.device, x.dtype) * 2 - 1)


def _sphere_noise(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
    dev = gen.device if gen is not None else x.device
    d = torch.randn(x.shape, generator=gen, device=dev, dtype=x.dtype).to(x.device)
    return eps * d / d.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (x.dim() - 1)))


# The noise counterpart of each threat model: a random Linf-ball corner, a random point on the L2 sphere.
_NOISE: dict[str, Callable[[Tensor, float, torch.Generator | None], Tensor]] = {
    "Linf": _sign_noise,
    "L2": _sphere_noise,
}


@torch.no_grad()
def noise_accuracy(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    gen: torch.Generator | None,
    *,
    norm: str = "Linf",
    batch_size: int = 256,
) -> float:
    """Accuracy under random noise of size ``eps`` (random signs for Linf, a random direction for L2).

    An attack that does worse than this is failing (usually masked gradients). ``benchmark`` passes
    the clean-correct examples only, so that the noise baseline counts what robust accuracy counts.
    """
    if norm not in _NOISE:
        raise UserError(f"unknown norm {norm!r}; valid norms: {', '.join(_NOISE)}")
    if len(x) == 0:
        return 0.0
    correct = 0
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        xn = (xb + _NOISE[norm](xb, eps, gen)).clamp(0.0, 1.0)
        correct += int((model(xn).argmax(1) == yb).sum())
    return correct / len(x)


def unbounded_accuracy(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    gen: torch.Generator | None,
    *,
    n: int = SANITY_N,
    steps: int = 20,
    step_size: float = 0.1,
) -> float:
    """Accuracy under Linf PGD at eps = 1 (any image is reachable); should be near 0.

    Starts from the clean image (no random start): at eps = 1 a random start alone destroys the
    image and would hide a model whose gradients are useless.
    """
    xs, ys = _head(x, n), _head(y, n)
    x_adv = pgd(
        model, xs, ys, eps=1.0, gen=gen, norm="Linf", steps=steps, step_size=step_size, random_start=False
    )
    check_perturbation(xs, x_adv, 1.0, "Linf", what="unbounded PGD")
    return float((_forward(model, x_adv).argmax(1) == ys).float().mean())


def chance_level(y: Tensor, num_classes: int) -> float:
    """Accuracy of the best constant classifier: max(1/num_classes, majority-label frequency)."""
    if len(y) == 0:
        return 1.0 / max(1, num_classes)
    return max(1.0 / max(1, num_classes), float(torch.bincount(y).max()) / len(y))


def model_checks(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    gen: torch.Generator | None,
    chance: float,
    n: int = SANITY_N,
) -> dict[str, Any]:
    """The per-model flags (on at most ``n`` examples) that go into every row.

    ``clean_above_chance`` is decided by ``benchmark`` on every example, not here.
    """
    unbounded = unbounded_accuracy(model, x, y, gen, n=n)
    zero_frac = check_zero_gradients(model, x, y, n=n)
    return {
        "sanity_deterministic": check_deterministic(model, x, n=n),
        "sanity_batch_independent": check_batch_independence(model, x, n=n),
        "sanity_eval_mode": check_eval_mode(model),
        "sanity_zero_grad_frac": zero_frac,
        "sanity_nonzero_gradients": zero_frac == 0.0,
        "sanity_unbounded_acc": unbounded,
        "sanity_unbounded_reaches_zero": unbounded <= UNBOUNDED_MAX_ACC,
        "sanity_chance": chance,
    }


# ============ cross-row checks (after a sweep) ============

WORST_CASE_FAMILY = "worst_case"


def _spec_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["attack"], row["norm"], json.dumps(row.get("params", {}), sort_keys=True, default=str)


def _check_robust_le_clean(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r["robust_acc"] > r["clean_acc"] + 1e-12:
            raise SanityError(
                f"{r['attack']} at {r['norm']} eps {r['eps']}: robust accuracy {r['robust_acc']:.4f} "
                f"> clean accuracy {r['clean_acc']:.4f}"
            )


def _monotone_flags(rows: list[dict[str, Any]], tol_examples: int) -> set[int]:
    """Set ``sanity_monotone_in_eps``; returns the rows where a firing flag is only a warning.

    Within one attack spec, an eps row fires when it has more than ``tol_examples`` robust examples
    more than some smaller eps (every eps is attacked independently, so random starts alone can
    differ by an example or two). None where it does not apply: the smallest eps of a spec, and the
    ``worst_case`` rows (non-increasing by construction: see ``benchmark``).
    """
    warn_only: set[int] = set()
    by_spec: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_spec[_spec_key(r)].append(i)
    for idx in by_spec.values():
        idx.sort(key=lambda i: rows[i]["eps"])
        applies = len(idx) > 1 and rows[idx[0]].get("attack_family") != WORST_CASE_FAMILY
        best = math.inf  # fewest robust examples at any smaller eps
        for i in idx:
            ok = rows[i]["n_robust"] <= best + tol_examples
            rows[i]["sanity_monotone_in_eps"] = ok if applies and best < math.inf else None
            best = min(best, rows[i]["n_robust"])
            if rows[i].get("attack_family") == "single_step":
                warn_only.add(i)  # FGSM may legitimately be non-monotone in eps
    return warn_only


def _summarise(row: dict[str, Any], warn_only: bool) -> None:
    failed, warned = [], []
    for k, v in row.items():
        if k.startswith("sanity_") and k != "sanity_ok" and v is False:
            (warned if warn_only and k == "sanity_monotone_in_eps" else failed).append(
                k.removeprefix("sanity_")
            )
    row["sanity_ok"] = not failed
    row["sanity_failed"] = ",".join(failed)
    row["sanity_warnings"] = ",".join(warned)


def cross_row_checks(rows: list[dict[str, Any]], *, tol_examples: int = TOL_EXAMPLES) -> None:
    """Add per-row flags in place and finalise ``sanity_ok``/``sanity_failed``/``sanity_warnings``.

    Rows need ``attack``, ``attack_family``, ``norm``, ``eps``, ``params``, ``clean_acc``,
    ``robust_acc``, ``n_robust``, ``n_examples`` and may carry ``sanity_noise_acc``. Raises
    ``SanityError`` if any robust accuracy exceeds clean accuracy.

    - ``sanity_monotone_in_eps``: robust accuracy non-increasing in eps within one attack spec,
      with ``tol_examples`` slack (single-step attacks only warn: FGSM may be non-monotone);
    - ``sanity_le_single_step``: iterative attacks <= single-step ones at equal norm and eps
      (``tol_examples`` slack; None where no single-step row exists);
    - ``sanity_attack_beats_noise``: robust accuracy <= noise accuracy at the same eps (+ slack).
    """
    _check_robust_le_clean(rows)
    warn_only = _monotone_flags(rows, tol_examples)
    single: dict[tuple[str, float], int] = {}
    for r in rows:
        if r.get("attack_family") == "single_step":
            key = (r["norm"], r["eps"])
            single[key] = max(single.get(key, -1), r["n_robust"])
    for r in rows:
        ref = single.get((r["norm"], r["eps"])) if r.get("attack_family") == "iterative" else None
        r["sanity_le_single_step"] = None if ref is None else r["n_robust"] <= ref + tol_examples
        noise = r.get("sanity_noise_acc")
        n = max(1, r["n_examples"])
        r["sanity_attack_beats_noise"] = (
            None if noise is None else r["robust_acc"] <= noise + tol_examples / n
        )
        r["sanity_square_adds_nothing"] = square_adds_nothing(r, tol_examples)
        # a screening row's sample: no slack, one find means the full run may rank differently
        found = r.get("aa_screen_found")
        r["sanity_screen_found_nothing"] = None if found is None else found == 0
    for i, r in enumerate(rows):
        _summarise(r, i in warn_only)


def square_adds_nothing(row: dict[str, Any], tol_examples: int = TOL_EXAMPLES) -> bool | None:
    """False if AutoAttack's Square fooled more than the slack of examples that the gradient
    attacks run before it had left correct (AutoAttack's ``check_square_sr``: a gradient-free attack
    beating APGD means the gradients mislead). The slack is ``tol_examples`` or AutoAttack's own
    0.2 % of the examples, whichever is larger. None on rows without a Square component."""
    found = square_new_finds(row)
    if found is None:
        return None
    return found <= max(tol_examples, math.ceil(SQUARE_ALPHA * max(1, row["n_examples"])))


# ============ flags decided outside benchmark ============


def check_probe_fit(train_acc: float, knn_acc: float, *, gap: float = PROBE_UNDERFIT_GAP) -> bool | None:
    """``probe_underfit``: False (fires) if the linear probe's accuracy on the features it was fitted
    on is more than ``gap`` below the weighted-kNN accuracy on the same encoder's features (test
    split, the training split as its bank). A linear head that fits its own training set worse than
    kNN classifies unseen examples has not reached what the features allow, and every number
    measured through it (clean and robust) is the probe's, not the encoder's. None if either
    accuracy is missing or NaN (no training examples)."""
    if any(not isinstance(v, int | float) or math.isnan(v) for v in (train_acc, knn_acc)):
        return None
    return knn_acc - train_acc <= gap + 1e-9  # 1e-9: a gap of exactly ``gap`` passes


def check_finetune_chance(
    test_acc: float, y: Tensor, num_classes: int, *, tol_examples: int = TOL_EXAMPLES
) -> bool | None:
    """``finetune_above_chance``: False (fires) if a finetuned head's clean accuracy on the test
    examples ``y`` is not above :func:`chance_level` by more than ``tol_examples`` examples (the
    slack of ``clean_above_chance``): the head learnt nothing (the random-init control under
    unfitted ALF, 20.2 % on five classes in every seed). None without test examples or accuracy."""
    if not len(y) or not isinstance(test_acc, int | float) or math.isnan(test_acc):
        return None
    return test_acc > chance_level(y, num_classes) + tol_examples / len(y)


def check_alf_fit(
    alf_train_acc: float, slf_train_acc: float | None, *, gap: float = ALF_UNDERFIT_GAP
) -> bool | None:
    """``alf_underfit``: False (fires) if the ALF head's clean accuracy on its own training images is
    more than ``gap`` below the SLF probe's (the run's probe settings, fitted on the same clean
    training features). Adversarial training costs a head some clean accuracy, but a head that fits
    its training images far worse than a clean linear head on the same features has not been
    trained to convergence, and its clean and robust numbers are the schedule's, not the encoder's.
    None if either accuracy is missing or NaN."""
    if any(not isinstance(v, int | float) or math.isnan(v) for v in (alf_train_acc, slf_train_acc)):
        return None
    return slf_train_acc - alf_train_acc <= gap + 1e-9  # type: ignore[operator]  # exactly ``gap`` passes


def add_flags(rows: list[dict[str, Any]], flags: dict[str, bool | None]) -> None:
    """Add flags decided outside :func:`benchmark` (``sanity_<name>`` keys, e.g. the probe's fit) to
    every row of one classifier and summarise each row again (``sanity_ok``, ``sanity_failed``)."""
    unknown = [k for k in flags if k.removeprefix("sanity_") not in FLAGS]
    if unknown:
        raise ValueError(f"not sanity flags: {unknown}")
    for r in rows:
        r.update(flags)
        _summarise(r, r.get("attack_family") == "single_step")
