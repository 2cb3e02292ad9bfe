"""``benchmark()``: clean and robust accuracy of any [0,1]-image classifier under an attack suite.

One row per (attack spec, eps), plus one ``worst_case`` row per (norm, eps), each carrying the
sanity flags of :mod:`robustbench_nacl.sanity`. Rows are flat dicts (accuracies as fractions).

Work is never repeated: clean predictions are computed once; an attack only sees examples that are
classified correctly and not yet fooled at a smaller eps of the same sweep (a perturbation in a
smaller Linf/L2 ball is a valid perturbation in a larger one, so the example is decided).
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..attack.attacks import attack_info, model_device, run_attack
from ..attack.suites import Suite, load_suite
from ..attack.threat import eps_label
from ..errors import UserError
from ..io import canonical_json
from .sanity import (
    SANITY_N,
    TOL_EXAMPLES,
    chance_level,
    cross_row_checks,
    model_checks,
    noise_accuracy,
)

WORST_CASE = "worst_case"
# CPU: a 256-image batch is past the throughput knee for small CNNs and ResNet-18 (PERF_RELIABILITY 2.2).
DEFAULT_BATCH = {"cpu": 256, "cuda": 1024}


def derive_seed(seed: int, *parts: Any) -> int:
    """A stable 60-bit seed from ``seed`` and JSON-able ``parts`` (independent of Python's hash salt)."""
    return int(hashlib.sha256(canonical_json([seed, *parts]).encode()).hexdigest()[:15], 16)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, batch_size: int) -> Tensor:
    """Logits for ``x`` in chunks of ``batch_size``."""
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


def _check_inputs(x: Tensor, y: Tensor) -> None:
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


def _eps0_check(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    suite: Suite,
    clean_pred: Tensor,
    *,
    device: torch.device,
    seed: int,
    bs: int,
    num_classes: int,
) -> bool:
    """Run the suite's first cheap attack at eps = 0: predictions must equal the clean ones exactly."""
    spec = next((s for s in suite.attacks if attack_info(s.name).get("eps0_check", True)), None)
    name, norm, params = (spec.name, spec.norm, dict(spec.params)) if spec else ("fgsm", "Linf", {})
    if attack_info(name).get("needs_num_classes"):
        params["num_classes"] = num_classes
    gen = _generator(device, derive_seed(seed, "eps0", name))
    x_adv = run_attack(name, model, x, y, eps=0.0, norm=norm, gen=gen, batch_size=bs, params=params)
    return bool((predict(model, x_adv, bs).argmax(1) == clean_pred).all())


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
) -> list[dict[str, Any]]:
    """Evaluate ``model`` (images in [0,1] -> logits) under ``suite``; returns result rows.

    Each row has ``attack``, ``attack_family``, ``norm``, ``eps``, ``eps_label``, ``params``,
    ``suite``, ``suite_sha256``, ``clean_acc``, ``robust_acc``, ``n_examples``, ``n_robust``,
    ``n_clean_correct``, ``n_attacked``, ``num_classes``, ``seed``, ``batch_size``, ``device``,
    ``wall_s`` and the ``sanity_*`` flags (``sanity_ok`` summarises them). ``worst_case`` rows
    count an example as robust only if every attack in the suite at that norm and any eps <= this
    eps failed on it. Deterministic given ``seed`` (and ``batch_size`` and the device).
    """
    suite = load_suite(suite)
    _check_inputs(x, y)
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
    device = model_device(model, x.device)
    model.eval()
    x, y = x.detach().to(device), y.detach().to(device).long()
    bs = batch_size or DEFAULT_BATCH.get(device.type, 256)
    n = len(x)

    # ============ clean predictions, once ============
    t0 = time.perf_counter()
    logits = predict(model, x, bs)
    if logits.dim() != 2:
        raise UserError(f"the model must return logits shaped (N, classes), got {tuple(logits.shape)}")
    width = int(logits.shape[1])
    if num_classes is not None and num_classes != width:
        raise UserError(f"num_classes={num_classes} but the model outputs {width} logits")
    if int(y.min()) < 0 or int(y.max()) >= width:
        raise UserError(f"labels must be in [0, {width - 1}] for a model with {width} logits")
    clean_pred = logits.argmax(1)
    clean_correct = clean_pred == y
    n_clean = int(clean_correct.sum())
    clean_acc = n_clean / n
    chance = chance_level(y, width)

    # ============ per-model sanity checks (on at most sanity_n examples) ============
    flags = model_checks(
        model, x, y, gen=_generator(device, derive_seed(seed, "sanity")), chance=chance, n=sanity_n
    )
    flags["sanity_clean_above_chance"] = clean_acc > chance + TOL_EXAMPLES / n
    m = max(1, sanity_n)
    flags["sanity_eps0_equals_clean"] = _eps0_check(
        model, x[:m], y[:m], suite, clean_pred[:m], device=device, seed=seed, bs=bs, num_classes=width
    )

    common = {
        "suite": suite.name,
        "suite_sha256": suite.sha256,
        "clean_acc": clean_acc,
        "n_examples": n,
        "n_clean_correct": n_clean,
        "num_classes": width,
        "seed": seed,
        "batch_size": bs,
        "device": str(device),
    }
    rows: list[dict[str, Any]] = []
    robust_masks: dict[tuple[str, float], list[tuple[str, Tensor]]] = defaultdict(list)
    noise_cache: dict[tuple[str, float], float] = {}
    setup_s = time.perf_counter() - t0

    # ============ attack sweeps ============
    bar = tqdm(
        total=sum(len(s.eps) for s in suite.attacks), disable=not progress, desc="benchmark", unit="eps"
    )
    try:
        for spec in suite.attacks:
            info = attack_info(spec.name)
            params = dict(spec.params)
            run_params = {**params, **({"num_classes": width} if info.get("needs_num_classes") else {})}
            fooled = torch.zeros(n, dtype=torch.bool, device=device)
            for eps in sorted(spec.eps):
                bar.set_postfix_str(f"{spec.name} {spec.norm} {eps_label(eps)}")
                t = time.perf_counter()
                todo = (clean_correct & ~fooled).nonzero().squeeze(1)
                gen = _generator(device, derive_seed(seed, spec.name, spec.norm, params, eps))
                if todo.numel():
                    x_adv = run_attack(
                        spec.name,
                        model,
                        x[todo],
                        y[todo],
                        eps=eps,
                        norm=spec.norm,
                        gen=gen,
                        batch_size=bs,
                        params=run_params,
                    )
                    fooled[todo[predict(model, x_adv, bs).argmax(1) != y[todo]]] = True
                robust = clean_correct & ~fooled
                key = (spec.norm, eps)
                if key not in noise_cache:
                    noise_gen = _generator(device, derive_seed(seed, "noise", spec.norm, eps))
                    noise_cache[key] = noise_accuracy(
                        model, x, y, eps, noise_gen, norm=spec.norm, batch_size=bs
                    )
                describe = info.get("describe")
                rows.append(
                    {
                        "attack": spec.name,
                        "attack_family": info.get("family", "other"),
                        "norm": spec.norm,
                        "eps": eps,
                        "eps_label": eps_label(eps),
                        "params": {**params, **(describe(params, width) if describe else {})},
                        **common,
                        "robust_acc": int(robust.sum()) / n,
                        "n_robust": int(robust.sum()),
                        "n_attacked": int(todo.numel()),
                        "wall_s": time.perf_counter() - t,
                        **flags,
                        "sanity_noise_acc": noise_cache[key],
                    }
                )
                robust_masks[key].append((spec.name, robust))
                bar.update()
    finally:
        bar.close()

    # ============ per-example worst case across the suite ============
    for norm in sorted({k[0] for k in robust_masks}):
        cum = torch.ones(n, dtype=torch.bool, device=device)
        names = list(dict.fromkeys(s.name for s in suite.attacks if s.norm == norm))
        for eps in sorted(e for (nm, e) in robust_masks if nm == norm):
            for _, mask in robust_masks[(norm, eps)]:
                cum &= mask  # smaller balls lie inside larger ones: their successes count here too
            wall = sum(r["wall_s"] for r in rows if r["norm"] == norm and r["eps"] == eps)
            rows.append(
                {
                    "attack": WORST_CASE,
                    "attack_family": WORST_CASE,
                    "norm": norm,
                    "eps": eps,
                    "eps_label": eps_label(eps),
                    "params": {"attacks": names},
                    **common,
                    "robust_acc": int(cum.sum()) / n,
                    "n_robust": int(cum.sum()),
                    "n_attacked": 0,
                    "wall_s": wall,
                    **flags,
                    "sanity_noise_acc": noise_cache[(norm, eps)],
                }
            )
    for r in rows:
        r["setup_wall_s"] = setup_s
    cross_row_checks(rows)
    return rows
