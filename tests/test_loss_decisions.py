"""Switchable formula decisions: each paper's printed form, written out here, against the code's switch.

Every reference below is independent code (per-anchor loops over small float64 tensors) that
transcribes the formula as the paper prints it; see docs/decisions.md, 'Robust term', 'VAR', 'ArCL'
and 'DACL positives'. The defaults keep the code's reading; each test also checks that the two
readings differ, so a switch that does nothing fails.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from robustbench_nacl.augment.views import VIEW_MAKERS
from robustbench_nacl.losses import (
    OBJECTIVES,
    adversarial_view,
    arcl_rows,
    needs,
    resolve,
    robust_rows,
    var_rows,
    w_hat,
)

T, TAU, BETA = 0.5, 0.01, 1.0  # NaCl's g2 setting


def unit(*shape: int, seed: int = 0, grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)
    return z.requires_grad_(grad)


def ng(
    x: torch.Tensor, negs: list[torch.Tensor], v: torch.Tensor, t: float, tau: float, beta: float
) -> torch.Tensor:
    """N * g2(x, {u_i}, {v}) with the clamp N e^{-1/t} (NaCl Table S1; beta = tau = 0 gives N * g0)."""
    n = len(negs)
    kappa = torch.stack([torch.exp(x @ u / t) for u in negs])
    first = (kappa ** (beta + 1)).sum() / (kappa**beta).sum()
    g = torch.clamp((first - tau * torch.exp(x @ v / t)) / (1 - tau), min=math.exp(-1 / t))
    return n * g


def K(pos: torch.Tensor, neg_mass: torch.Tensor) -> torch.Tensor:
    """NaCl-ICLR's K(A, B) = -log(A / (A + B))."""
    return -torch.log(pos / (pos + neg_mass))


def grads(loss: torch.Tensor, *zs: torch.Tensor) -> list[torch.Tensor]:
    """d loss / d z for each z (zeros where the loss does not depend on z)."""
    gs = torch.autograd.grad(loss, zs, allow_unused=True)
    return [torch.zeros_like(z) if g is None else g for g, z in zip(gs, zs, strict=True)]


# ============ ArCL: Algorithm 1 as printed ============


def arcl_algorithm1_reference(views: list[torch.Tensor], tau: float) -> torch.Tensor:
    """ArCL (Zhao et al., ICLR 2023) Algorithm 1, lines 7-12, transcribed.

    s_i+ = min_{j,k in [m]} cos(z_ij, z_ik); s_ij- = cos(z_i1, z_j1), s_{i,j+N}- = cos(z_i1, z_j2);
    L = -1/N sum_i log( exp(s_i+/tau) / sum_{j=1, j != i}^{2N} exp(s_ij-/tau) ).
    """
    n, m = views[0].shape[0], len(views)

    def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b / (a.norm() * b.norm())

    total = torch.zeros((), dtype=torch.float64)
    for i in range(n):
        s_plus = torch.stack([cos(views[j][i], views[k][i]) for j in range(m) for k in range(m)]).min()
        s_neg = [cos(views[0][i], views[0][j]) for j in range(n)] + [
            cos(views[0][i], views[1][j]) for j in range(n)
        ]
        den = sum(torch.exp(s_neg[j] / tau) for j in range(2 * n) if j != i)
        total = total - torch.log(torch.exp(s_plus / tau) / den)
    return total / n


def test_arcl_algorithm1_is_the_printed_loss_and_its_gradient() -> None:
    # raw projections z = g(f(x)): the algorithm normalises them inside its cosines
    raw = [
        torch.randn(6, 5, generator=torch.Generator().manual_seed(10 + j), dtype=torch.float64)
        for j in range(4)
    ]
    raw = [r.requires_grad_(True) for r in raw]
    views = [F.normalize(r, dim=1) for r in raw]
    got = arcl_rows(views, estimator="g0", temperature=0.5, form="algorithm1").mean()
    ref = arcl_algorithm1_reference(raw, 0.5)
    assert got.item() == pytest.approx(ref.item(), rel=1e-12)
    for a, b in zip(grads(got, *raw), grads(ref, *raw), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the default (symmetric NT-Xent on the worst pair, positive in the denominator) is another loss
    default = arcl_rows(views, estimator="g0", temperature=0.5).mean()
    assert abs(default.item() - ref.item()) > 1e-3


def test_arcl_objective_uses_the_switch() -> None:
    p = resolve("arcl", {"arcl_form": "algorithm1", "m_views": 3})
    views = [unit(5, 4, seed=20 + j) for j in range(needs(p).n_views)]
    loss, _ = OBJECTIVES.get("contrastive").loss(torch.nn.Identity(), views, None, p, torch.Generator())
    assert loss.item() == pytest.approx(arcl_algorithm1_reference(views, p.t).item(), rel=1e-12)


# ============ Robust term: one-sided anchors, w_hat with or without gradient ============


def robust_reference(
    z0: torch.Tensor, z1: torch.Tensor, zadv: torch.Tensor, weighted: bool, detach_w: bool
) -> torch.Tensor:
    """NaCl (ICML 2022) eq. for L_Robust(g2, w) = E_x[ w(x) K(e^{s(x, x_adv)}, N g2(x, .)) ].

    x is the clean view; its negatives are the other images' clean and adversarial views
    (N = 2B - 2); w_hat(x) = K(e^{s(x, x+)}, N g2(x, .)) with the other images' two clean views.
    """
    b = z0.shape[0]
    total = torch.zeros((), dtype=torch.float64)
    for i in range(b):
        x = z0[i]
        negs = [z0[j] for j in range(b) if j != i] + [zadv[j] for j in range(b) if j != i]
        term = K(torch.exp(x @ zadv[i] / T), ng(x, negs, zadv[i], T, TAU, BETA))
        if weighted:
            clean = [z0[j] for j in range(b) if j != i] + [z1[j] for j in range(b) if j != i]
            w = K(torch.exp(x @ z1[i] / T), ng(x, clean, z1[i], T, TAU, BETA))
            term = term * (w.detach() if detach_w else w)
        total = total + term
    return total / b


@pytest.mark.parametrize("weighted", [False, True])
def test_one_sided_robust_term_is_the_printed_expectation(weighted: bool) -> None:
    z0, z1, zadv = (unit(5, 4, seed=s, grad=True) for s in (30, 31, 32))
    kw = {"estimator": "g2", "temperature": T, "tau_plus": TAU, "beta": BETA}
    w = w_hat(z0, z1, **kw) if weighted else None
    got = robust_rows(z0, zadv, w, **kw, anchors="one_sided").mean()
    ref = robust_reference(z0, z1, zadv, weighted, detach_w=True)
    assert got.item() == pytest.approx(ref.item(), rel=1e-12)
    for a, b in zip(grads(got, z0, zadv), grads(ref, z0, zadv), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    both = robust_rows(z0, zadv, w, **kw).mean()  # default: the adversarial views anchor too
    assert abs(both.item() - ref.item()) > 1e-4


@pytest.mark.parametrize("anchors", ["both", "one_sided"])
def test_w_hat_with_gradient_is_the_formula_read_literally(anchors: str) -> None:
    z0, z1, zadv = (unit(5, 4, seed=s, grad=True) for s in (40, 41, 42))
    kw = {"estimator": "g2", "temperature": T, "tau_plus": TAU, "beta": BETA}
    attached = robust_rows(z0, zadv, w_hat(z0, z1, **kw, detach=False), **kw, anchors=anchors).mean()
    detached = robust_rows(z0, zadv, w_hat(z0, z1, **kw), **kw, anchors=anchors).mean()
    assert attached.item() == pytest.approx(detached.item(), rel=1e-14)  # same value ...
    g_att, g_det = grads(attached, z0, z1), grads(detached, z0, z1)
    assert g_det[1].abs().max() == 0  # ... detached: no gradient reaches the positive view through w
    assert g_att[1].abs().max() > 1e-3  # attached: it does
    if anchors == "one_sided":  # the printed expectation, w with its gradient
        ref = robust_reference(z0, z1, zadv, weighted=True, detach_w=False)
        for a, b in zip(g_att, grads(ref, z0, z1), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("anchors", "w_grad"), [("one_sided", False), ("both", True)])
def test_robust_switches_reach_the_objective(anchors: str, w_grad: bool) -> None:
    p = resolve("intcl", {"robust_anchors": anchors, "w_hat_grad": w_grad, "dual_bn": False})
    views = [unit(6, 5, seed=50 + j) for j in range(2)]
    model = torch.nn.Identity()
    _, stats = OBJECTIVES.get("contrastive").loss(model, views, None, p, torch.Generator())
    zadv = F.normalize(adversarial_view(model, views[0], p), dim=1)
    z0, z1 = views
    if anchors == "one_sided":
        ref = robust_reference(z0, z1, zadv, weighted=True, detach_w=True).item()
    else:
        kw = {"estimator": "g2", "temperature": T, "tau_plus": TAU, "beta": BETA}
        ref = robust_rows(z0, zadv, w_hat(z0, z1, **kw), **kw).mean().item()
    assert float(stats["robust_loss"]) == pytest.approx(ref, rel=1e-12)


# ============ VAR: one-sided anchors ============


def var_reference(z0: torch.Tensor, positives: list[torch.Tensor]) -> torch.Tensor:
    """NaCl-ICLR L_VAR(g2, M) = E_x[ 1/M sum_j K(e^{s(x, x_j+)}, N g2(x, {x_ij-})) ], x = view 0.

    Trial j's negatives are the other images' views 0 and j (N = 2B - 2).
    """
    b = z0.shape[0]
    total = torch.zeros((), dtype=torch.float64)
    for i in range(b):
        for zj in positives:
            negs = [z0[k] for k in range(b) if k != i] + [zj[k] for k in range(b) if k != i]
            total = total + K(torch.exp(z0[i] @ zj[i] / T), ng(z0[i], negs, zj[i], T, TAU, BETA)) / len(
                positives
            )
    return total / b


def test_one_sided_var_is_the_printed_expectation() -> None:
    z0 = unit(5, 4, seed=60, grad=True)
    positives = [unit(5, 4, seed=61 + j, grad=True) for j in range(3)]
    kw = {"estimator": "g2", "temperature": T, "tau_plus": TAU, "beta": BETA}
    got = var_rows(z0, positives, **kw, anchors="one_sided").mean()
    ref = var_reference(z0, positives)
    assert got.item() == pytest.approx(ref.item(), rel=1e-12)
    for a, b in zip(grads(got, z0, *positives), grads(ref, z0, *positives), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert abs(var_rows(z0, positives, **kw).mean().item() - ref.item()) > 1e-4


def test_var_objective_uses_the_switch() -> None:
    p = resolve("var", {"M": 3, "var_anchors": "one_sided"})
    views = [unit(5, 4, seed=70 + j) for j in range(needs(p).n_views)]
    loss, _ = OBJECTIVES.get("contrastive").loss(torch.nn.Identity(), views, None, p, torch.Generator())
    assert loss.item() == pytest.approx(var_reference(views[0], views[1:]).item(), rel=1e-12)


# ============ DACL+: binary-mixup rho ============


@pytest.mark.parametrize(("mode", "kept"), [("keep", 0.8), ("from_partner", 0.2)])
def test_dacl_plus_binary_mixup_follows_mix_rho_mode(mode: str, kept: float) -> None:
    """DACL eq. (6): x+ = x * m + x~ * (1 - m), m ~ Bernoulli(rho) ("keep": the printed form)."""
    p = resolve("dacl_plus", {"mix_rho": 0.8, "mix_rho_mode": mode})
    g = torch.Generator().manual_seed(80)
    x = torch.randint(0, 256, (96, 1, 8, 8), generator=g, dtype=torch.uint8)
    xf = x.float().flatten(1) / 255
    (view, _) = VIEW_MAKERS.get(p.views)(x, 2, torch.Generator().manual_seed(81), **p.to_dict())
    out = view.flatten(1)
    fractions = []
    for i in range(x.shape[0]):
        m = out[i] == xf[i]
        # a binary-mixup positive: every other value is one partner's (x~ != x); linear and geometric
        # mixes keep (almost) no value exactly
        partners = [j for j in range(x.shape[0]) if j != i and bool((out[i][~m] == xf[j][~m]).all())]
        if partners and m.float().mean() > 0.05:
            fractions.append(m.float().mean().item())
    assert 15 <= len(fractions) <= 50  # about a third of 96 samples draw binary mixup
    assert sum(fractions) / len(fractions) == pytest.approx(kept, abs=0.03)
