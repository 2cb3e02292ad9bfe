"""Adversarial contrastive pretraining (ACL, DynACL, RoCL): the losses against naive per-anchor loops and
the authors' code (golden values), the inner PGD against torchattacks and the loss it maximises, the
DynACL schedule against its authors' formula, and the parameter checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from robustbench_nacl.errors import UserError
from robustbench_nacl.losses import resolve
from robustbench_nacl.losses.adversarial import (
    InnerAttack,
    StepContext,
    acl_loss,
    deacl_loss,
    dynacl_schedule,
    nt_xent,
    pgd_maximise,
    rocl_loss,
)
from robustbench_nacl.losses.objectives import OBJECTIVES, encode
from robustbench_nacl.models.dual_bn import bn_route
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.models.heads import ContrastiveModel

# Values from the authors' public code, transcribed; provenance in data/golden/README.md.
GOLDEN = Path(__file__).parent / "data" / "golden" / "adversarial_losses_b8.json"
T = 0.5


def unit(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)


# ============ naive per-anchor references (float64 loops over anchors) ============


def naive_nt_xent(z1: torch.Tensor, z2: torch.Tensor, t: float) -> float:
    """Mean over the 2B anchors of -log(e^{s(a, a+)} / sum_{k != a} e^{s(a, k)})."""
    zs = torch.cat([z1, z2]).tolist()
    n, b = len(zs), z1.shape[0]
    total = 0.0
    for a in range(n):
        s = [sum(x * y for x, y in zip(zs[a], zs[k], strict=True)) / t for k in range(n)]
        den = sum(math.exp(s[k]) for k in range(n) if k != a)
        total += -s[(a + b) % n] + math.log(den)
    return total / n


def naive_rocl(z1: torch.Tensor, z2: torch.Tensor, za: torch.Tensor, t: float, lamda: float) -> float:
    """RoCL: each of the 3B anchors sums -log(e^{s+}/sum_{k != a} e^{s_k}) over its two positives;
    mean over anchors, plus NT-Xent(adv, view 2) / lamda."""
    zs = torch.cat([z1, z2, za]).tolist()
    n, b = len(zs), z1.shape[0]
    total = 0.0
    for a in range(n):
        s = [sum(x * y for x, y in zip(zs[a], zs[k], strict=True)) / t for k in range(n)]
        log_den = math.log(sum(math.exp(s[k]) for k in range(n) if k != a))
        for p in ((a + b) % n, (a + 2 * b) % n):
            total += log_den - s[p]
    return total / n + naive_nt_xent(za, z2, t) / lamda


def four(seed: int) -> list[torch.Tensor]:
    return [unit(6, 5, seed=seed + k) for k in range(4)]


@pytest.mark.parametrize("mode", ["ds", "a2a", "a2s"])
@pytest.mark.parametrize("w", [1.0, 4 / 3])
def test_acl_and_dynacl_loss_equal_the_naive_per_anchor_reference(mode: str, w: float) -> None:
    z1, z2, a1, a2 = four(0)
    got = acl_loss([z1, z2], [a1, a2], T, mode, w).item()
    clean, adv = naive_nt_xent(z1, z2, T), naive_nt_xent(a1, a2, T)
    want = {
        "ds": ((2 - w) * clean + w * adv) / 2,
        "a2a": adv,
        "a2s": naive_nt_xent(z1, a2, T),
    }[mode]
    assert got == pytest.approx(want, rel=1e-10, abs=1e-10)
    assert nt_xent(z1, z2, T).item() == pytest.approx(clean, rel=1e-10)


def test_rocl_loss_equals_the_naive_per_anchor_reference() -> None:
    z1, z2, za, _ = four(10)
    got = rocl_loss([z1, z2, za], T, 256.0).item()
    assert got == pytest.approx(naive_rocl(z1, z2, za, T, 256.0), rel=1e-10, abs=1e-10)
    # the adversarial view is a positive: moving it onto view 1 lowers the loss
    assert rocl_loss([z1, z2, z1.clone()], T, 256.0).item() < got


def naive_deacl(s: torch.Tensor, sa: torch.Tensor, t: torch.Tensor, k: float) -> float:
    """Per image: -cos(s_i, t_i) - k cos(sa_i, s_i), averaged over the batch."""
    total = 0.0
    for i in range(s.shape[0]):
        c1 = float(s[i] @ t[i] / (s[i].norm() * t[i].norm()))
        c2 = float(sa[i] @ s[i] / (sa[i].norm() * s[i].norm()))
        total += -c1 - k * c2
    return total / s.shape[0]


def test_deacl_loss_equals_the_naive_per_image_reference() -> None:
    g = torch.Generator().manual_seed(5)
    s, sa, t = (torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(3))
    assert deacl_loss(s, sa, t, 2.0).item() == pytest.approx(naive_deacl(s, sa, t, 2.0), rel=1e-10)


def _golden() -> list[dict]:
    """Every case with its input embeddings filled in."""
    if not GOLDEN.exists():  # shipped with the tests: a missing file is a broken checkout, not a skip
        pytest.fail(f"golden file missing: {GOLDEN}")
    data = json.loads(GOLDEN.read_text())
    return [{**data["inputs"][c["input"]], **c} for c in data["cases"]]


def test_losses_match_the_authors_code_golden_values() -> None:
    cases = _golden()
    assert {c["loss"] for c in cases} == {"acl", "dynacl", "rocl", "deacl"}
    for c in cases:
        raw = [torch.tensor(c[k], dtype=torch.float64) for k in ("z1", "z2", "z1_adv", "z2_adv")]
        z1, z2, a1, a2 = (F.normalize(r, dim=1) for r in raw)
        if c["loss"] == "deacl":  # cosines of the raw features: student clean, teacher, student adversarial
            got, rel = deacl_loss(raw[0], raw[2], raw[1], c["trades_k"]).item(), 1e-10
        elif c["loss"] == "rocl":
            got = rocl_loss([z1, z2, a1], c["t"], c["rocl_lamda"]).item()
            rel = 1e-6  # RoCL's code adds 1e-8 inside its logs
        else:
            mode = c.get("acl_mode", "ds")
            got = acl_loss([z1, z2], [a1, a2], c["t"], mode, c.get("adv_weight", 1.0)).item()
            rel = 1e-10
        assert got == pytest.approx(c["value"], rel=rel), c["loss"]


# ============ the inner attack ============


def _images(b: int = 16, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(b, 1, 8, 8, generator=g, dtype=torch.float64) for _ in range(2)]


@pytest.mark.parametrize("dual_bn", [True, False])
def test_inner_pgd_strictly_increases_the_contrastive_loss_and_stays_in_the_ball(dual_bn: bool) -> None:
    model = _model(dual_bn)
    xs = _images()
    atk = InnerAttack(eps=8 / 255, steps=5, step_size=2 / 255)
    route = "adv" if dual_bn else "clean"

    def loss_fn(xa: list[torch.Tensor]) -> torch.Tensor:
        with bn_route(model, route):
            return nt_xent(*encode(model, xa), T)

    params_before = [p.detach().clone() for p in model.parameters()]
    buffers_before = [b.clone() for b in model.buffers()]
    gen = torch.Generator().manual_seed(0)
    adv = pgd_maximise(model, xs, loss_fn, atk, gen=gen)
    assert model.training  # the attack's eval mode is undone
    model.eval()
    with torch.no_grad():
        before, after = loss_fn(xs).item(), loss_fn(adv).item()
    assert after > before + 1e-3, (before, after)
    for x, xa in zip(xs, adv, strict=True):
        assert (xa - x).abs().max().item() <= 8 / 255 + 1e-12
        assert xa.min().item() >= 0.0 and xa.max().item() <= 1.0
    # eval-mode BatchNorm and input gradients only: parameters, grads and running statistics untouched
    assert all(torch.equal(a, b) for a, b in zip(params_before, model.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buffers_before, model.buffers(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_inner_pgd_equals_torchattacks_pgd_on_a_classifier_loss() -> None:
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is the independent PGD")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)
    )
    net = net.eval()
    x = torch.rand(32, 1, 8, 8)
    y = torch.randint(0, 5, (32,))
    ref = torchattacks.PGD(net, eps=8 / 255, alpha=2 / 255, steps=5, random_start=False)(x, y)
    atk = InnerAttack(eps=8 / 255, steps=5, step_size=2 / 255, random_start=False)
    (ours,) = pgd_maximise(net, [x], lambda xa: F.cross_entropy(net(xa[0]), y), atk)
    assert (ours - ref).abs().max().item() < 1e-6


def test_a2s_attacks_only_the_second_view_and_the_random_start_uses_the_attack_generator() -> None:
    model = _model(False)
    xs = _images(8, seed=1)
    atk = InnerAttack(eps=0.1, steps=1, step_size=0.05)

    def loss_fn(xa: list[torch.Tensor]) -> torch.Tensor:
        return nt_xent(*encode(model, xa), T)

    a = pgd_maximise(model, xs, loss_fn, atk, gen=torch.Generator().manual_seed(3), attacked=[False, True])
    assert torch.equal(a[0], xs[0]) and not torch.equal(a[1], xs[1])
    b = pgd_maximise(model, xs, loss_fn, atk, gen=torch.Generator().manual_seed(3), attacked=[False, True])
    c = pgd_maximise(model, xs, loss_fn, atk, gen=torch.Generator().manual_seed(4), attacked=[False, True])
    assert torch.equal(a[1], b[1]) and not torch.equal(a[1], c[1])


def _model(dual_bn: bool, seed: int = 0, head: str = "clae") -> ContrastiveModel:
    torch.manual_seed(seed)
    enc = create_encoder("convnet_small", in_channels=1, mean=(0.5,), std=(0.5,), dual_bn=dual_bn, width=8)
    return ContrastiveModel(enc, head).double()


def _preset_model(p, seed: int = 0) -> ContrastiveModel:  # type: ignore[no-untyped-def]
    """The preset's model as the trainer builds it: its head, BatchNorm and ``prepare`` hook."""
    model = _model(p.dual_bn, seed=seed, head=p.head)
    prepare = OBJECTIVES.get(p.objective).prepare
    if prepare is not None:
        prepare(model, p)
    return model


def _step_context(teacher: torch.nn.Module) -> StepContext:
    """The trainer's context for one step at epoch 0 of 10; ``teacher``: DeACL's stage-1 encoder."""
    return StepContext(
        epoch=0,
        epochs=10,
        gen=torch.Generator().manual_seed(0),
        values={"adv_weight": 1.0},
        resources={"teacher": teacher},
    )


@pytest.mark.parametrize("preset", ["acl", "rocl", "dynacl", "deacl"])
def test_objective_runs_and_updates_only_through_backward(preset: str) -> None:
    p = resolve(preset)
    model = _preset_model(p).float()
    xs = [x.float() for x in _images(8)]
    obj = OBJECTIVES.get(p.objective)
    assert obj.contextual
    ctx = _step_context(_model(False, seed=1).encoder.float().eval())
    loss, _ = obj.loss(model, xs, None, p, torch.Generator(), False, ctx=ctx)
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())
    assert all(q.grad is None for q in model.parameters())
    loss.backward()
    assert any(q.grad is not None and q.grad.abs().sum() > 0 for q in model.parameters())


@pytest.mark.parametrize("preset", ["acl", "rocl", "dynacl", "deacl"])
def test_each_presets_inner_attack_strictly_increases_the_loss_it_maximises(
    preset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack loss each preset builds (ACL/DynACL NT-Xent of the attacked pair, RoCL's NT-Xent
    against view 2, DeACL's -cos to the teacher), evaluated before and after the preset's own PGD."""
    import importlib

    method = importlib.import_module(f"robustbench_nacl.losses.adversarial.{preset}")
    seen: list[tuple] = []
    engine = method.pgd_maximise

    def recording(model, xs, loss_fn, attack, **kw):  # type: ignore[no-untyped-def]
        out = engine(model, xs, loss_fn, attack, **kw)
        seen.append((model, xs, loss_fn, attack, out))
        return out

    monkeypatch.setattr(method, "pgd_maximise", recording)
    p = resolve(preset)
    model = _preset_model(p)
    xs = _images(16)
    ctx = _step_context(_model(False, seed=1).encoder.eval())
    OBJECTIVES.get(p.objective).loss(model, xs, None, p, torch.Generator(), False, ctx=ctx)
    assert len(seen) == 1
    model, clean, loss_fn, attack, adv = seen[0]
    assert attack.steps == p.extra_params()["attack_steps"] and attack.eps == p.extra_params()["attack_eps"]
    model.eval()
    with torch.no_grad():  # each method's loss_fn routes its own BatchNorm
        before, after = loss_fn(clean).item(), loss_fn(adv).item()
    assert after > before + 1e-4, (preset, before, after)
    for x, xa in zip(clean, adv, strict=True):
        assert (xa - x).abs().max().item() <= attack.eps + 1e-12


# ============ DynACL's schedule and the parameter checks ============


def _authors_schedule(epoch: int, epochs: int, k: int, swap: float) -> tuple[float, float]:
    """train_DynACL.py: the strength set at the last reload (epoch % K == 1), and weight_adv (1-based)."""
    last_reload = max(e for e in range(1, epoch + 1) if e % k == 1 or k == 1)
    strength = 1 - (last_reload - 1) / epochs
    weight = min(1.0 + (epoch // k) * (k / epochs) * swap, 2)
    return strength, weight


@pytest.mark.parametrize(("epochs", "frac"), [(1000, 0.05), (100, 0.05), (10, 0.2)])
def test_dynacl_schedule_is_the_authors(epochs: int, frac: float) -> None:
    p = resolve("dynacl", {"reload_frac": frac})
    k = max(1, round(frac * epochs))
    for epoch in range(epochs):
        got = dynacl_schedule(p, epoch, epochs)
        s, w = _authors_schedule(epoch + 1, epochs, k, 2 / 3)
        assert got["aug_strength"] == pytest.approx(s, abs=1e-12)
        assert got["adv_weight"] == pytest.approx(w, abs=1e-12)
    assert dynacl_schedule(p, 0, epochs)["aug_strength"] == 1.0


@pytest.mark.parametrize(
    ("preset", "override", "match"),
    [
        ("acl", {"attack_eps": 2.0}, "attack_eps"),
        ("acl", {"attack_steps": 0}, "attack_steps"),
        ("acl", {"acl_mode": "a2b"}, "acl_mode"),
        ("acl", {"eval_bn": "aux"}, "eval_bn"),
        ("rocl", {"rocl_lamda": 0}, "rocl_lamda"),
        ("dynacl", {"reload_frac": 0}, "reload_frac"),
        ("dynacl", {"acl_mode": "a2a"}, "set momentum=0"),
        ("dynacl", {"momentum": 1.5}, "momentum"),
        ("rocl", {"dual_bn": True}, "one BatchNorm"),
        ("rocl", {"rocl_gradient": "half"}, "rocl_gradient"),
        ("deacl", {"student_init": "copy"}, "student_init"),
        ("acl_air", {"air_form": "js"}, "air_form"),
        ("dynacl_air", {"air_lambda2": -1}, "air_lambda2"),
        ("acl", {"attack_epsilon": 0.1}, "has no parameter"),
    ],
)
def test_bad_attack_parameters_are_one_line_errors(preset: str, override: dict, match: str) -> None:
    with pytest.raises(UserError, match=match):
        resolve(preset, override)


def test_presets_record_every_inner_attack_parameter() -> None:
    for name in ("acl", "rocl", "dynacl", "deacl"):
        extra = resolve(name).to_dict()["extra"]
        for key in (
            "attack_eps",
            "attack_steps",
            "attack_step_size",
            "attack_random_start",
            "attack_bn_eval",
        ):
            assert key in extra, (name, key)
    assert resolve("acl").to_dict()["extra"]["attack_eps"] == pytest.approx(8 / 255)
    assert resolve("rocl").to_dict()["extra"]["attack_steps"] == 7


# ============ the methods' views ============


def test_pad_crop_equals_torchvision_random_crop_per_sample() -> None:
    from torchvision.transforms import functional as TF

    from robustbench_nacl.augment.views import pad_crop

    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    got = pad_crop(x, torch.Generator().manual_seed(1), 1)
    g = torch.Generator().manual_seed(1)  # the same draws: tops, then lefts
    top, left = torch.randint(0, 3, (6,), generator=g), torch.randint(0, 3, (6,), generator=g)
    for i in range(6):
        want = TF.crop(TF.pad(x[i], [1]), int(top[i]), int(left[i]), 8, 8)
        assert torch.equal(got[i], want)
    assert not torch.equal(got, x)


def test_acl_views_at_strength_zero_are_flips_only_and_strength_one_is_the_acl_policy() -> None:
    from robustbench_nacl.augment.views import VIEW_MAKERS

    x = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    (v,) = VIEW_MAKERS.get("acl")(x, 1, torch.Generator().manual_seed(2), aug_strength=0.0)
    assert all(torch.equal(v[i], x[i]) or torch.equal(v[i], x[i].flip(-1)) for i in range(8))
    (w,) = VIEW_MAKERS.get("acl")(x, 1, torch.Generator().manual_seed(2), aug_strength=1.0)
    assert not all(torch.equal(w[i], x[i]) or torch.equal(w[i], x[i].flip(-1)) for i in range(8))
    with pytest.raises(UserError, match="aug_strength"):
        VIEW_MAKERS.get("acl")(x, 1, torch.Generator(), aug_strength=1.5)


def test_the_trainer_hands_dynacl_its_epoch_strength_and_weight() -> None:
    from robustbench_nacl.training import TrainConfig, TrainStep

    cfg = TrainConfig(loss="dynacl", overrides={"reload_frac": 0.2}, epochs=10, batch_size=8)
    p = resolve("dynacl", {"reload_frac": 0.2})
    model = _model(True).float()
    step = TrainStep(cfg, p, model, torch.optim.Adam(model.parameters()))
    for epoch in (0, 4, 9):
        step.set_epoch(epoch)
        want = dynacl_schedule(p, epoch, 10)
        assert step.view_kwargs["aug_strength"] == want["aug_strength"]
        assert step.ctx is not None and step.ctx.values == want and step.ctx.epoch == epoch
    a = step.ctx.gen.initial_seed()
    step.set_epoch(9)
    assert step.ctx.gen.initial_seed() == a  # the attack's stream depends on (seed, epoch) only
