"""Losses: golden values, naive per-anchor loops of each formula, Table-1 identities, numerics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from robustbench_nacl.errors import UserError
from robustbench_nacl.losses import (
    arcl_rows,
    list_presets,
    log_neg_mass,
    mixnca_rows,
    nca_rows,
    pair_loss,
    pair_loss_rows,
    resolve,
    robust_rows,
    var_rows,
    w_hat,
)

# Values from the public DCL/HCL reference code; provenance in data/golden/README.md.
GOLDEN = Path(__file__).parent / "data" / "golden" / "reference_pair_losses_b8.json"
ESTIMATOR_OF = {"simclr": "g0", "debiased": "g1", "hardneg": "g2", "debiased_hardneg": "g2"}
REQUIRED_PRESETS = [
    "simclr",
    "debiased",
    "hardneg",
    "debiased_hardneg",
    "adv",
    "nca",
    "mixnca",
    "nca_mixnca",
    "var",
    "intcl",
    "intnacl",
    "arcl",
    "dacl",
    "dacl_plus",
    "gaussian",
    "supervised",
]


def _golden_cases() -> list[dict]:
    if not GOLDEN.exists():  # shipped with the tests: a missing file is a broken checkout, not a skip
        pytest.fail(f"golden file missing: {GOLDEN}")
    return json.loads(GOLDEN.read_text())


def unit(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)


# ============ golden values from the public implementations ============


@pytest.mark.parametrize(
    "case", _golden_cases(), ids=lambda c: f"{c['loss']}-t{c['temperature']}-tp{c['tau_plus']}-b{c['beta']}"
)
def test_pair_loss_matches_golden(case: dict) -> None:
    z1 = torch.tensor(case["z1"], dtype=torch.float64, requires_grad=True)
    z2 = torch.tensor(case["z2"], dtype=torch.float64, requires_grad=True)
    value = pair_loss(
        z1,
        z2,
        estimator=ESTIMATOR_OF[case["loss"]],
        temperature=case["temperature"],
        tau_plus=case["tau_plus"],
        beta=case["beta"],
    )
    value.backward()
    assert value.dtype == torch.float64
    assert value.item() == pytest.approx(case["value"], rel=1e-6)
    assert z1.grad.norm().item() == pytest.approx(case["grad_z1_norm"], rel=1e-6)
    assert z2.grad.norm().item() == pytest.approx(case["grad_z2_norm"], rel=1e-6)


# ============ naive per-anchor references (direct transcriptions of the formulas) ============


def naive_ng(
    sims_neg: list[float], sims_v: list[float], est: str, t: float, tau: float, beta: float
) -> float:
    """N * G for one anchor, in linear space, as docs/decisions.md ('Negative estimators') writes g0/g1/g2."""
    n = len(sims_neg)
    kappa = [math.exp(s) for s in sims_neg]
    pos_mean = sum(math.exp(s) for s in sims_v) / len(sims_v)
    if est == "g0":
        return sum(kappa)
    if est == "g1":
        first = sum(kappa) / n
    else:
        first = sum(k ** (beta + 1) for k in kappa) / sum(k**beta for k in kappa)
    g = max((first - tau * pos_mean) / (1 - tau), math.exp(-1 / t))
    return n * g


def naive_anchor_sets(z0: torch.Tensor, z1: torch.Tensor):
    """Per anchor (2B of them): anchor vector, base positive, list of negatives, image index."""
    b = z0.shape[0]
    zz = torch.cat([z0, z1])
    out = []
    for i in range(2 * b):
        img = i % b
        pos = zz[(i + b) % (2 * b)]
        negs = [zz[j] for j in range(2 * b) if j % b != img]
        out.append((zz[i], pos, negs, img))
    return out


def s(a: torch.Tensor, b: torch.Tensor, t: float) -> float:
    return float(a @ b) / t


SETTINGS = [
    ("g0", 0.5, 0.0, 0.0),
    ("g1", 0.5, 0.1, 0.0),
    ("g2", 0.5, 0.01, 1.0),
    ("g2", 0.2, 0.1, 0.5),
    ("g2", 0.5, 0.0, 2.0),
    ("g1", 0.1, 0.3, 0.0),  # strong debiasing: exercises the clamp
]


@pytest.mark.parametrize(("est", "t", "tau", "beta"), SETTINGS)
def test_pair_loss_rows_against_loop(est: str, t: float, tau: float, beta: float) -> None:
    z0, z1 = unit(6, 5, seed=1), unit(6, 5, seed=2)
    got = pair_loss_rows(z0, z1, estimator=est, temperature=t, tau_plus=tau, beta=beta)
    for i, (a, p, negs, _) in enumerate(naive_anchor_sets(z0, z1)):
        sp = s(a, p, t)
        ng = naive_ng([s(a, u, t) for u in negs], [sp], est, t, tau, beta)
        ref = -math.log(math.exp(sp) / (math.exp(sp) + ng))
        assert got[i].item() == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize(("est", "t", "tau", "beta"), SETTINGS)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_nca_against_loop(est: str, t: float, tau: float, beta: float, m: int) -> None:
    z0, z1 = unit(5, 4, seed=3), unit(5, 4, seed=4)
    extras = [unit(5, 4, seed=10 + k) for k in range(m - 1)]
    got = nca_rows(z0, z1, extras, estimator=est, temperature=t, tau_plus=tau, beta=beta)
    for i, (a, p, negs, img) in enumerate(naive_anchor_sets(z0, z1)):
        sims_pos = [s(a, p, t)] + [s(a, e[img], t) for e in extras]
        ng = naive_ng([s(a, u, t) for u in negs], sims_pos, est, t, tau, beta)
        num = sum(math.exp(v) for v in sims_pos)
        assert got[i].item() == pytest.approx(-math.log(num / (num + ng)), rel=1e-10)


@pytest.mark.parametrize(("est", "t", "tau", "beta"), SETTINGS)
@pytest.mark.parametrize("lam", [0.5, 0.9])
def test_mixnca_against_loop(est: str, t: float, tau: float, beta: float, lam: float) -> None:
    b, m = 5, 4
    z0, z1 = unit(b, 4, seed=5), unit(b, 4, seed=6)
    mixed = [unit(2 * b, 4, seed=20 + j) for j in range(m - 1)]
    got = mixnca_rows(z0, z1, mixed, lam=lam, estimator=est, temperature=t, tau_plus=tau, beta=beta)
    for i, (a, p, negs, _) in enumerate(naive_anchor_sets(z0, z1)):
        sp = s(a, p, t)
        ng = naive_ng([s(a, u, t) for u in negs], [sp], est, t, tau, beta)
        ref = -math.log(math.exp(sp) / (math.exp(sp) + ng))
        for zm in mixed:
            omega = math.exp(s(a, zm[i], t)) / (math.exp(s(a, zm[i], t)) + ng)
            ref += (-lam * math.log(omega) - (1 - lam) * math.log(1 - omega)) / (m - 1)
        assert got[i].item() == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize(("est", "t", "tau", "beta"), SETTINGS[:3])
def test_var_against_loop(est: str, t: float, tau: float, beta: float) -> None:
    z0 = unit(4, 6, seed=7)
    positives = [unit(4, 6, seed=30 + j) for j in range(3)]
    got = var_rows(z0, positives, estimator=est, temperature=t, tau_plus=tau, beta=beta)
    ref = torch.zeros(8, dtype=torch.float64)
    for zj in positives:
        for i, (a, p, negs, _) in enumerate(naive_anchor_sets(z0, zj)):
            sp = s(a, p, t)
            ng = naive_ng([s(a, u, t) for u in negs], [sp], est, t, tau, beta)
            ref[i] += -math.log(math.exp(sp) / (math.exp(sp) + ng)) / len(positives)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=0)


def test_arcl_selects_worst_pair_and_matches_loop() -> None:
    b, m, t = 6, 4, 0.5
    views = [unit(b, 5, seed=40 + j) for j in range(m)]
    got = arcl_rows(views, estimator="g0", temperature=t)
    sel_a, sel_b = [], []
    for i in range(b):
        pairs = [(float(views[j][i] @ views[k][i]), j, k) for j in range(m) for k in range(j + 1, m)]
        _, j, k = min(pairs)
        sel_a.append(views[j][i])
        sel_b.append(views[k][i])
    za, zb = torch.stack(sel_a), torch.stack(sel_b)
    for i, (a, p, negs, _) in enumerate(naive_anchor_sets(za, zb)):
        sp = s(a, p, t)
        ng = sum(math.exp(s(a, u, t)) for u in negs)
        assert got[i].item() == pytest.approx(-math.log(math.exp(sp) / (math.exp(sp) + ng)), rel=1e-10)


def test_arcl_gradient_only_through_selected_pair() -> None:
    b, m = 6, 4
    views = [unit(b, 5, seed=50 + j).requires_grad_(True) for j in range(m)]
    arcl_rows(views, estimator="g0", temperature=0.5).mean().backward()
    touched = torch.stack([v.grad.abs().sum(dim=1) > 0 for v in views])  # (m, B)
    assert (touched.sum(dim=0) == 2).all()  # exactly two views of each image get gradient


@pytest.mark.parametrize("weighted", [False, True])
def test_robust_against_loop(weighted: bool) -> None:
    b, t, tau, beta = 5, 0.5, 0.01, 1.0
    z0, z1, zadv = unit(b, 4, seed=60), unit(b, 4, seed=61), unit(b, 4, seed=62)
    w = w_hat(z0, z1, estimator="g2", temperature=t, tau_plus=tau, beta=beta) if weighted else None
    got = robust_rows(z0, zadv, w, estimator="g2", temperature=t, tau_plus=tau, beta=beta)
    clean = naive_anchor_sets(z0, z1)
    for i, (a, p, negs, img) in enumerate(naive_anchor_sets(z0, zadv)):
        sp = s(a, p, t)
        ng = naive_ng([s(a, u, t) for u in negs], [sp], "g2", t, tau, beta)
        ref = -math.log(math.exp(sp) / (math.exp(sp) + ng))
        if weighted:  # w_hat(x): the clean loss of image img's view-0 anchor
            ca, cp, cnegs, _ = clean[img]
            csp = s(ca, cp, t)
            cng = naive_ng([s(ca, u, t) for u in cnegs], [csp], "g2", t, tau, beta)
            ref *= -math.log(math.exp(csp) / (math.exp(csp) + cng))
        assert got[i].item() == pytest.approx(ref, rel=1e-10)
    if weighted:
        assert not w.requires_grad  # a weight, not a loss path (docs/decisions.md, 'Robust term')


# ============ identities of the paper's Table 1 ============


def test_g2_with_beta0_is_g1_and_g1_with_tau0_is_g0() -> None:
    z0, z1 = unit(7, 5, seed=70), unit(7, 5, seed=71)
    g1 = pair_loss(z0, z1, estimator="g1", temperature=0.5, tau_plus=0.05)
    g2 = pair_loss(z0, z1, estimator="g2", temperature=0.5, tau_plus=0.05, beta=0.0)
    torch.testing.assert_close(g2, g1, rtol=1e-12, atol=0)
    g0 = pair_loss(z0, z1, estimator="g0", temperature=0.5)
    g1_0 = pair_loss(z0, z1, estimator="g1", temperature=0.5, tau_plus=0.0)
    torch.testing.assert_close(g1_0, g0, rtol=1e-12, atol=0)


def test_mixnca_with_m1_and_nca_with_m1_are_the_base_loss() -> None:
    z0, z1 = unit(7, 5, seed=72), unit(7, 5, seed=73)
    for est, tau, beta in [("g0", 0.0, 0.0), ("g2", 0.01, 1.0)]:
        base = pair_loss_rows(z0, z1, estimator=est, temperature=0.5, tau_plus=tau, beta=beta)
        mix = mixnca_rows(z0, z1, [], lam=0.5, estimator=est, temperature=0.5, tau_plus=tau, beta=beta)
        nca = nca_rows(z0, z1, [], estimator=est, temperature=0.5, tau_plus=tau, beta=beta)
        torch.testing.assert_close(mix, base, rtol=1e-12, atol=0)
        torch.testing.assert_close(nca, base, rtol=1e-12, atol=0)


def test_preset_identities() -> None:
    """IntNaCl(M=1, alpha=0, g0) is SimCLR's parameter set; IntNaCl(M=1) is IntCl's (modulo lam)."""
    simclr = resolve("simclr")
    reduced = resolve("intnacl", {"M": 1, "alpha": 0, "G1": "g0", "tau_plus": 0, "beta": 0})
    # With M = 1 a MIXNCA has no mixed positives, so lam is inert: both need the same two views.
    from robustbench_nacl.losses import needs

    assert needs(reduced) == needs(simclr)
    assert not needs(reduced).adversarial
    intcl = resolve("intcl")
    int1 = resolve("intnacl", {"M": 1})
    assert needs(int1) == needs(intcl)
    for field in ("G1", "G2", "alpha", "w", "tau_plus", "beta", "t"):
        assert getattr(int1, field) == getattr(intcl, field)


# ============ numerics ============


@pytest.mark.parametrize("est", ["g0", "g1", "g2"])
def test_finite_in_fp32_at_t01_b512(est: str) -> None:
    g = torch.Generator().manual_seed(0)
    z0 = F.normalize(torch.randn(512, 128, generator=g), dim=1).requires_grad_(True)
    z1 = F.normalize(torch.randn(512, 128, generator=g), dim=1).requires_grad_(True)
    loss = pair_loss(z0, z1, estimator=est, temperature=0.1, tau_plus=0.1, beta=6.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z0.grad).all() and torch.isfinite(z1.grad).all()
    # collapsed embeddings (every similarity = 1/t = 10): e^{(beta+1) s} would overflow without the shift
    zc = torch.ones(512, 128) / math.sqrt(128)
    collapsed = pair_loss(zc, zc.clone(), estimator=est, temperature=0.1, tau_plus=0.1, beta=6.0)
    assert torch.isfinite(collapsed)
    # and it agrees with the float64 computation
    ref = pair_loss(z0.double(), z1.double(), estimator=est, temperature=0.1, tau_plus=0.1, beta=6.0)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-4)


def test_clamp_is_active_and_blocks_negative_gradient() -> None:
    # Debiasing with a huge prior makes the estimate negative: the clamp N e^{-1/t} must hold it.
    z = unit(4, 3, seed=80)
    s_neg = (z @ z.T / 0.5)[:, :3].clone().requires_grad_(True)
    s_v = torch.full((4, 1), 2.0, dtype=torch.float64)
    out = log_neg_mass(s_neg, s_v, "g1", temperature=0.5, tau_plus=0.9)
    torch.testing.assert_close(out, torch.full((4,), math.log(3) - 2.0, dtype=torch.float64))
    out.sum().backward()
    assert (s_neg.grad == 0).all()


# ============ presets ============


def test_every_required_preset_is_registered() -> None:
    assert set(REQUIRED_PRESETS) <= set(list_presets())


def test_overrides_are_typed_and_validated() -> None:
    p = resolve("mixnca", ["M=3", "lam=0.9", "G1=g0"])
    assert (p.M, p.lam, p.G1) == (3, 0.9, "g0")
    assert resolve("mixnca", {"lam": "none"}).lam is None
    for bad, fragment in [
        ({"M": "0"}, "M must be >= 1"),
        ({"lam": "1.5"}, "lam must lie in [0, 1]"),
        ({"G1": "g9"}, "valid choices: g0, g1, g2"),
        ({"nope": "1"}, "unknown loss parameter"),
        ({"M": "two"}, "expected an integer"),
        ({"M": 2.5}, "expected an integer"),  # library callers pass values, not strings
        ({"M": True}, "expected an integer"),
        ({"t": "warm"}, "expected a number"),
        ({"G1": 2}, "expected a name"),
        ({"tau_plus": "1"}, "tau_plus must lie in [0, 1)"),
    ]:
        with pytest.raises(UserError, match=None) as e:
            resolve("mixnca", bad)
        assert fragment in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"valid choices: .*simclr"):
        resolve("no_such_loss")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            {"head": "linear"},
            "head='linear'; valid choices for the contrastive objective: "
            "clae, simclr, acl_mlp3_dualbn, rocl_2048_128, none",
        ),
        ({"head": "mlp9"}, "unknown projection head 'mlp9'"),
        ({"views": "jitter9"}, "unknown view maker 'jitter9'"),
        ({"G2": "g3"}, "G2='g3'; valid choices: g0, g1, g2"),
        ({"adv_estimator": "fgsm"}, "adv_estimator='fgsm'; valid choices: g0, g1, g2"),
        ({"positives": "mean"}, "unknown positive aggregator 'mean'"),
        ({"objective": "triplet"}, "unknown objective 'triplet'"),
        ({"w": "w_bar"}, "w='w_bar'; valid choices: 1, w_hat"),
        ({"robust_anchors": "adv"}, "robust_anchors='adv'; valid choices: both, one_sided"),
        ({"var_anchors": "all"}, "var_anchors='all'; valid choices: both, one_sided"),
        ({"arcl_form": "moco"}, "arcl_form='moco'; valid choices: ntxent, algorithm1"),
        ({"mix_rho_mode": "swap"}, "mix_rho_mode='swap'; valid choices: from_partner, keep"),
    ],
)
def test_unknown_names_fail_at_resolve_with_the_valid_names(overrides: dict, fragment: str) -> None:
    with pytest.raises(UserError) as e:
        resolve("simclr", overrides)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_heads_are_checked_against_the_objective() -> None:
    # the supervised objective passes the class count to the head: the identity head cannot take it
    heads = "clae, simclr, acl_mlp3_dualbn, rocl_2048_128, linear"
    with pytest.raises(UserError, match=f"valid choices for the supervised objective: {heads}"):
        resolve("supervised", {"head": "none"})
    assert resolve("supervised", {"head": "clae"}).head == "clae"
    assert resolve("simclr", {"head": "none"}).head == "none"


def test_a_bad_head_fails_before_any_data_is_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from robustbench_nacl.data import DATASETS
    from robustbench_nacl.training import TrainConfig, train

    def no_loading(*args, **kwargs):
        raise AssertionError("the data was loaded before the loss parameters were checked")

    monkeypatch.setitem(DATASETS._items, "digits", no_loading)
    cfg = TrainConfig(loss="simclr", overrides={"head": "linear"}, epochs=1, data_root=str(tmp_path / "d"))
    with pytest.raises(UserError, match="head='linear'"):
        train(cfg, tmp_path / "run", progress=False)


def test_validation_asks_the_aggregator_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from robustbench_nacl.losses import AGGREGATORS

    monkeypatch.setattr(AGGREGATORS, "_items", dict(AGGREGATORS._items))
    monkeypatch.setattr(AGGREGATORS, "_info", dict(AGGREGATORS._info))
    AGGREGATORS.add(
        "first_positive",
        lambda model, views, z, p, gen, fuse: pair_loss_rows(z[0], z[1], estimator="g0", temperature=p.t),
    )
    assert resolve("simclr", {"positives": "first_positive"}).positives == "first_positive"


def test_adding_an_objective_is_one_registered_function(monkeypatch: pytest.MonkeyPatch) -> None:
    from robustbench_nacl.losses import OBJECTIVES, Needs, encode, needs
    from robustbench_nacl.losses.objectives import objective

    monkeypatch.setattr(OBJECTIVES, "_items", dict(OBJECTIVES._items))
    monkeypatch.setattr(OBJECTIVES, "_info", dict(OBJECTIVES._info))

    @objective(
        "alignment", needs=lambda p: Needs(n_views=3, adversarial=False, labels=False), description="x"
    )
    def alignment(model, views, y, p, gen, fuse=False):
        z = encode(model, views, fuse)
        return -(z[0] * z[1]).sum(dim=1).mean(), {}

    p = resolve("simclr", {"objective": "alignment"})
    assert needs(p) == Needs(n_views=3, adversarial=False, labels=False)
    views = [unit(4, 5, seed=90 + j) for j in range(3)]
    loss, _ = OBJECTIVES.get("alignment").loss(torch.nn.Identity(), views, None, p, torch.Generator())
    assert loss.item() == pytest.approx(-(views[0] * views[1]).sum(dim=1).mean().item(), rel=1e-12)


def test_losses_modules_import_one_way() -> None:
    """params -> estimators -> terms -> objectives -> adversarial -> presets (earlier ones only)."""
    import ast

    import robustbench_nacl.losses as pkg

    order = ["params", "estimators", "terms", "objectives", "adversarial", "presets"]
    root = Path(pkg.__file__).parent
    modules = sorted(p.stem for p in root.glob("*.py") if p.stem != "__init__")
    assert modules == sorted(set(order) - {"adversarial"})
    # the adversarial subpackage: its modules import the earlier losses modules (``..name``) and, inside
    # it, the engine or another method (``.name``); the engine imports no method
    methods = sorted(p.stem for p in (root / "adversarial").glob("*.py") if p.stem != "__init__")
    files = [(n, root / f"{n}.py", 1) for n in order if n != "adversarial"]
    files += [("adversarial", root / "adversarial" / f"{m}.py", 2) for m in methods]
    for name, path, level in files:
        rank = order.index(name)
        for node in ast.walk(ast.parse(path.read_text())):  # lazy imports inside functions count too
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            target = (node.module or "").split(".")[0]
            if node.level == level:
                assert order.index(target) < rank, f"{path.name} imports {target}"
            elif node.level == 1:  # a sibling inside the subpackage
                assert path.stem != "engine" and target in methods, f"{path.name} imports {target}"


# ============ precision ============


class _Tape(torch.nn.Module):
    """Records the model's outputs; in replay mode returns them again (as float32) in the same order."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.outputs: list[torch.Tensor] = []
        self.replay: list[torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.replay is None:
            out = self.inner(x)
            self.outputs.append(out.detach())
            return out
        # 0 * x keeps a path to the input, so the FGSM step of the adversarial view still differentiates
        return self.replay.pop(0).float() + 0.0 * x.flatten(1).sum(dim=1, keepdim=True)


BF16_CASES = [
    ("simclr", {}),
    ("debiased_hardneg", {}),
    ("nca", {"M": 3}),
    ("mixnca", {"M": 3}),
    ("var", {"M": 3}),
    ("arcl", {}),
    ("arcl", {"arcl_form": "algorithm1"}),
    ("intnacl", {"M": 3, "dual_bn": False}),
]


@pytest.mark.parametrize(("preset", "overrides"), BF16_CASES, ids=lambda c: str(c))
def test_loss_under_bf16_autocast_is_the_float32_loss_of_the_same_embeddings(
    preset: str, overrides: dict
) -> None:
    from robustbench_nacl.losses import OBJECTIVES, needs

    p = resolve(preset, overrides)
    g = torch.Generator().manual_seed(0)
    b, d = 128, 48
    views = [torch.randn(b, d, generator=g) for _ in range(needs(p).n_views)]
    torch.manual_seed(0)
    model = _Tape(torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)))
    loss_fn = OBJECTIVES.get(p.objective).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = loss_fn(model, views, None, p, torch.Generator().manual_seed(1))
    assert model.outputs[0].dtype == torch.bfloat16  # the encoder forward did run in bf16
    assert got.dtype == torch.float32
    model.replay = list(model.outputs)
    ref, _ = loss_fn(model, views, None, p, torch.Generator().manual_seed(1))
    assert not model.replay  # the replay used every recorded output, in order
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)


@pytest.mark.parametrize(
    ("preset", "overrides"), [("simclr", {}), ("var", {"M": 2}), ("intcl", {"dual_bn": False})]
)
def test_float64_models_keep_float64_losses(preset: str, overrides: dict) -> None:
    from robustbench_nacl.losses import OBJECTIVES, needs

    p = resolve(preset, overrides)
    g = torch.Generator().manual_seed(3)
    views = [torch.randn(16, 12, generator=g, dtype=torch.float64) for _ in range(needs(p).n_views)]
    torch.manual_seed(0)
    model = _Tape(torch.nn.Linear(12, 8).double())
    got, _ = OBJECTIVES.get(p.objective).loss(model, views, None, p, torch.Generator())
    assert got.dtype == torch.float64
    kw = {"estimator": p.G1, "temperature": p.t, "tau_plus": p.tau_plus, "beta": p.beta}
    z = [F.normalize(o, dim=1) for o in model.outputs]
    if preset == "var":
        ref = (pair_loss(z[0], z[1], **kw) + pair_loss(z[0], z[2], **kw)) / 2
    else:
        ref = pair_loss(z[0], z[1], **kw)
    if p.alpha > 0:
        kw2 = {"estimator": p.G2, "temperature": p.t, "tau_plus": p.tau_plus, "beta": p.beta}
        weights = w_hat(z[0], z[1], **kw2)
        ref = ref + p.alpha * robust_rows(z[0], F.normalize(model.outputs[-1], dim=1), weights, **kw2).mean()
    assert got.item() == pytest.approx(ref.item(), rel=1e-12)
