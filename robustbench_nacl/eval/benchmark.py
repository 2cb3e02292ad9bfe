"""``benchmark()``: clean and robust accuracy of any [0,1]-image classifier under an attack suite.

One row per (attack spec, eps), plus one ``worst_case`` row per (norm, eps), each carrying the
sanity flags of :mod:`robustbench_nacl.eval.sanity` and the per-example outcomes as packed bit
strings (``clean_bits``, ``robust_bits``: see :func:`..results.bits.encode_bits`). Rows are flat dicts
(accuracies as fractions).

Protocol (see docs/decisions.md, 'Attack protocol'):

- clean predictions are computed once, and only clean-correct examples are attacked (a
  misclassified example is not robust whatever the attack does);
- every attack row is its own measurement: each clean-correct example is attacked at each eps
  independently, as Wong et al.'s code does (FGSM is not monotone in eps, so carrying an example
  fooled at a smaller eps over to larger ones would change the FGSM numbers);
- an FGSM sweep takes the input gradient once for all its epsilons (the perturbation at every eps
  is ``eps`` times one direction), which gives exactly the per-eps result at a fraction of the cost;
- ``worst_case`` rows count an example as robust only if it survived every attack of the suite at
  that norm at every eps <= this one (a perturbation in a smaller ball lies in the larger one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..attack import autoattack as aa_trace
from ..attack.grad import model_device
from ..attack.memory import attack_batch, halving_on_oom
from ..attack.rng import derive_seed
from ..attack.runner import attack_info, robust_under_attack
from ..attack.suites import SUBSET, AttackSpec, Suite, attack_params, load_suite
from ..errors import UserError
from ..hub.cards import build_card, write_card
from ..results.bits import encode_bits
from ..results.eps import eps_label
from .sanity import (
    SANITY_N,
    TOL_EXAMPLES,
    chance_level,
    cross_row_checks,
    looks_like_probabilities,
    model_checks,
    noise_accuracy,
)

WORST_CASE = "worst_case"
# CPU: a 256-image batch is past the throughput knee for small CNNs and ResNet-18 (measured; see
# docs/decisions.md, 'Attack batch size'). CUDA: sized from the free memory (attack.memory.attack_batch).
DEFAULT_BATCH = {"cpu": 256}


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, batch_size: int) -> Tensor:
    """Logits for ``x`` in chunks of ``batch_size``."""
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


# ============ inputs and clean pass ============


def _check_inputs(x: Tensor, y: Tensor, batch_size: int | None) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 2:
        raise UserError(
            "x must be a floating-point tensor of images shaped (N, C, H, W) with values in [0,1]"
        )
    if not isinstance(y, Tensor) or y.dim() != 1 or y.dtype.is_floating_point or len(y) != len(x):
        raise UserError(f"y must be a 1-D integer label tensor with one label per image ({len(x)})")
    if len(x) == 0:
        raise UserError("x is empty; give at least one example")
    if not bool(torch.isfinite(x).all()):
        raise UserError("x contains NaN or Inf values")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0:
        raise UserError(
            f"x has values in [{lo:.3g}, {hi:.3g}] but attacks take images in [0,1]; "
            "normalisation belongs inside the model (as a buffer), not in the data"
        )
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")


def _clean_correct(
    model: nn.Module, x: Tensor, y: Tensor, bs: int, num_classes: int | None
) -> tuple[Tensor, int]:
    """Which examples the model classifies correctly, and the logits width (input errors raised)."""
    logits = predict(model, x, bs)
    if logits.dim() != 2:
        raise UserError(f"the model must return logits shaped (N, classes), got {tuple(logits.shape)}")
    width = int(logits.shape[1])
    if num_classes is not None and num_classes != width:
        raise UserError(f"num_classes={num_classes} but the model outputs {width} logits")
    if int(y.min()) < 0 or int(y.max()) >= width:
        raise UserError(f"labels must be in [0, {width - 1}] for a model with {width} logits")
    if width > 1 and looks_like_probabilities(logits):
        raise UserError(
            "the model returns probabilities (every output row in [0,1], summing to 1); attacks need "
            "logits: drop the final softmax"
        )
    return logits.argmax(1) == y, width


# ============ the sweep ============


@dataclass
class _Run:
    """What every part of one benchmark call shares."""

    model: nn.Module
    x: Tensor
    y: Tensor
    clean: Tensor  # bool (N,): classified correctly without attack
    device: torch.device
    seed: int
    bs: int
    width: int
    progress: Any
    common: dict[str, Any] = field(default_factory=dict)
    noise: dict[tuple[str, float], float] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.x)

    def noise_acc(self, norm: str, eps: float, n: int | None = None) -> float:
        """Fraction of the first ``n`` examples (all: None) correct both clean and under random noise
        of size eps (cached)."""
        n = self.n if n is None else n
        if (norm, eps, n) not in self.noise:
            gen = _generator(self.device, derive_seed(self.seed, "noise", norm, eps))
            idx = self.clean[:n].nonzero().squeeze(1)
            acc = noise_accuracy(
                self.model, self.x[idx], self.y[idx], eps, gen, norm=norm, batch_size=self.bs
            )
            self.noise[(norm, eps, n)] = acc * len(idx) / n
        return self.noise[(norm, eps, n)]

    def row(self, *, subset: int | None = None, **fields: Any) -> dict[str, Any]:
        """A result row: ``fields`` (with a ``robust`` mask) plus the common fields and the noise
        baseline. ``subset``: the row measured the first ``subset`` examples only, and every count and
        accuracy in it is over those (the bits of the others are 0)."""
        robust: Tensor = fields.pop("robust")
        n_robust = int(robust.sum())
        head = {k: fields.pop(k) for k in ("attack", "attack_family", "norm", "eps")}
        n = self.n if subset is None else subset
        own = {}
        if subset is not None:  # a row of the first n examples: its bits are n long, like its counts
            n_clean = int(self.clean[:n].sum())
            own = {"n_examples": n, "n_clean_correct": n_clean, "clean_acc": n_clean / n}
            own["clean_bits"] = encode_bits(self.clean[:n])
            robust = robust[:n]
        return {
            **head,
            "eps_label": eps_label(head["eps"]),
            **fields,
            **self.common,
            **own,
            "robust_acc": n_robust / n,
            "n_robust": n_robust,
            "robust_bits": encode_bits(robust),
            "sanity_noise_acc": self.noise_acc(head["norm"], head["eps"], None if subset is None else n),
        }


def _spec_rows(run: _Run, spec: AttackSpec) -> tuple[list[dict[str, Any]], list[Tensor]]:
    """Rows of one attack spec, in increasing eps, and the robust mask of each."""
    info = attack_info(spec.name)
    params = dict(spec.params)
    own = attack_params(params)  # what the attack takes (without the benchmark's subset)
    run_params = {**own, **({"num_classes": run.width} if info.get("needs_num_classes") else {})}
    eps = sorted(spec.eps)
    gens = [_generator(run.device, derive_seed(run.seed, spec.name, spec.norm, params, e)) for e in eps]
    todo = run.clean.nonzero().squeeze(1)
    subset = min(params[SUBSET], run.n) if SUBSET in params else None
    if subset is not None:  # a fixed subset: the first examples, so every encoder faces the same ones
        todo = todo[todo < subset]
    run.progress.set_postfix_str(f"{spec.name} {spec.norm}")

    def attempt(bs: int) -> tuple[tuple[Tensor, list[float]], dict]:
        # a fresh AutoAttack record per try: a try that ran out of memory leaves none behind
        with aa_trace.recording() as comps:  # AutoAttack: which component decided each example
            out = robust_under_attack(
                spec.name, run.model, run.x[todo], run.y[todo], eps,
                norm=spec.norm, gens=gens, batch_size=bs, params=run_params,
            )  # fmt: skip
        return out, comps

    ((correct, seconds), components), batch = halving_on_oom(attempt, run.bs, gens)
    # only when memory forced a smaller batch: rows of a run that fitted stay as they were
    smaller = {"attack_batch_size": batch} if batch != run.bs else {}
    describe = info.get("describe")
    shown = {**params, **(describe(own, run.width) if describe else {})}
    rows, masks = [], []
    for k, e in enumerate(eps):
        robust = torch.zeros(run.n, dtype=torch.bool, device=run.device)
        robust[todo] = correct[k]
        rows.append(
            run.row(
                attack=spec.name,
                attack_family=info.get("family", "other"),
                norm=spec.norm,
                eps=e,
                params=shown,
                robust=robust,
                subset=subset,
                n_attacked=int(todo.numel()),
                wall_s=seconds[k],
                **smaller,
                **(
                    aa_trace.component_fields(components[e], todo, subset or run.n, encode_bits)
                    if e in components
                    else {}
                ),
            )
        )
        # the worst case: an example outside the subset was not attacked here, so this spec
        # leaves it as the other attacks decide; inside it, a success counts like any other
        masks.append(
            robust if subset is None else robust | (torch.arange(run.n, device=run.device) >= subset)
        )
        run.progress.update()
    return rows, masks


def _worst_case_rows(
    run: _Run, suite: Suite, attack_rows: list[dict[str, Any]], masks: list[Tensor]
) -> list[dict[str, Any]]:
    """Per (norm, eps): robust only if no attack at that norm fooled the example at any eps <= this one."""
    out = []
    for norm in sorted({r["norm"] for r in attack_rows}):
        names = list(dict.fromkeys(s.name for s in suite.attacks if s.norm == norm))
        at_norm = [(r, m) for r, m in zip(attack_rows, masks, strict=True) if r["norm"] == norm]
        cum = run.clean.clone()
        for eps in sorted({r["eps"] for r, _ in at_norm}):
            for r, m in at_norm:
                if r["eps"] == eps:
                    cum &= m  # smaller balls lie inside larger ones: their successes count here too
            wall = sum(r["wall_s"] for r, _ in at_norm if r["eps"] == eps)
            out.append(
                run.row(
                    attack=WORST_CASE,
                    attack_family=WORST_CASE,
                    norm=norm,
                    eps=eps,
                    params={"attacks": names},
                    robust=cum.clone(),
                    n_attacked=0,
                    wall_s=wall,
                )
            )
    return out


# ============ the entry point ============


def _model_flags(run: _Run, sanity_n: int) -> dict[str, Any]:
    chance = chance_level(run.y, run.width)
    gen = _generator(run.device, derive_seed(run.seed, "sanity"))
    flags = model_checks(run.model, run.x, run.y, gen=gen, chance=chance, n=sanity_n)
    n_clean = int(run.clean.sum())
    flags["sanity_clean_above_chance"] = n_clean / run.n > chance + TOL_EXAMPLES / run.n
    return flags


def benchmark(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    suite: str | Path | dict[str, Any] | Suite,
    *,
    seed: int = 0,
    batch_size: int | None = None,
    num_classes: int | None = None,
    progress: bool = True,
    sanity_n: int = SANITY_N,
    card: str | Path | None = None,
    card_info: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate ``model`` (images in [0,1] -> logits) under ``suite``; returns result rows.

    Each row has ``attack``, ``attack_family``, ``norm``, ``eps``, ``eps_label``, ``params``,
    ``suite``, ``suite_sha256``, ``clean_acc``, ``robust_acc``, ``n_examples``, ``n_robust``,
    ``n_clean_correct``, ``n_attacked``, ``num_classes``, ``seed``, ``batch_size``, ``device``,
    ``wall_s``, ``setup_wall_s``, ``clean_bits``, ``robust_bits`` and the ``sanity_*`` flags
    (``sanity_ok`` summarises them). Attack rows attack every clean-correct example at every eps
    independently; ``worst_case`` rows count an example as robust only if every attack in the suite
    at that norm and any eps <= this eps failed on it. Deterministic given ``seed`` (and
    ``batch_size`` and the device). A model returning probabilities is a ``UserError``.
    ``card``: also write the model card of these rows there, as RobustBench's benchmark records its
    model_info (``card_info``: name, architecture, dataset, authors, venue, link, ...; see
    :func:`..hub.cards.build_card`).
    """
    suite = load_suite(suite)
    _check_inputs(x, y, batch_size)
    device = model_device(model, x.device)
    model.eval()
    x, y = x.detach().to(device), y.detach().to(device).long()
    bs = batch_size or DEFAULT_BATCH.get(device.type, 256)
    t0 = time.perf_counter()
    clean, width = _clean_correct(model, x, y, bs, num_classes)  # the labels checked first
    bs = batch_size or attack_batch(model, x, y, bs)  # CUDA: from its free memory; else bs
    total = sum(len(s.eps) for s in suite.attacks)
    bar = tqdm(total=total, disable=not progress, desc="benchmark", unit="eps")
    run = _Run(model, x, y, clean, device, seed, bs, width, bar)
    n_clean = int(clean.sum())
    run.common = {
        "suite": suite.name,
        "suite_sha256": suite.sha256,
        "clean_acc": n_clean / run.n,
        "n_examples": run.n,
        "n_clean_correct": n_clean,
        "clean_bits": encode_bits(clean),
        "num_classes": width,
        "seed": seed,
        "batch_size": bs,
        "device": str(device),
        **_model_flags(run, sanity_n),
    }
    setup_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    masks: list[Tensor] = []
    try:
        for spec in suite.attacks:
            spec_rows, spec_masks = _spec_rows(run, spec)
            rows += spec_rows
            masks += spec_masks
    finally:
        bar.close()
    rows += _worst_case_rows(run, suite, rows, masks)
    for r in rows:
        r["setup_wall_s"] = setup_s
    cross_row_checks(rows)
    if card is not None:
        info = {
            "name": Path(card).stem,
            "architecture": type(model).__name__,
            "dataset": "",
            **(card_info or {}),
        }
        write_card(card, build_card(rows, **info))
    return rows
