"""Attacks and attack suites: threat-model invariants, parity with torchattacks, the AutoAttack
adapter contract, suite validation (one-line UserErrors only, fuzzed)."""

from __future__ import annotations

import copy
import math
import sys
import warnings

import pytest
import torch
from _models import accuracy, digits_model, gen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from robustbench_nacl.attack import autoattack_adapter as aa_m
from robustbench_nacl.attack import fgsm as fgsm_m
from robustbench_nacl.attack import pgd as pgd_m
from robustbench_nacl.attack import runner
from robustbench_nacl.attack import torchattacks_adapter as ta_m
from robustbench_nacl.attack.autoattack_adapter import autoattack_plan
from robustbench_nacl.attack.base import ATTACKS
from robustbench_nacl.attack.norms import project
from robustbench_nacl.attack.runner import resolve_attack, run_attack
from robustbench_nacl.attack.suites import (
    AttackSpec,
    Suite,
    load_suite,
    parse_suite_dict,
    parse_suite_text,
    suite_names,
)
from robustbench_nacl.attack.threat import check_perturbation
from robustbench_nacl.errors import SanityError, UserError


def _torchattacks():
    try:
        import torchattacks
    except ImportError:
        return None
    return torchattacks


# Only the tests that call torchattacks need it (it is an optional extra); the rest always run.
torchattacks = _torchattacks()
needs_torchattacks = pytest.mark.skipif(
    torchattacks is None, reason="torchattacks not installed (pip install 'robustbench-nacl[torchattacks]')"
)

FAST = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


pytestmark = pytest.mark.usefixtures("single_thread")


DIGITS_N = 256  # the test batch of the `data` fixture (conftest.py)


class Counting(nn.Module):
    """Counts forward calls and the examples they see."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[int] = []

    def forward(self, x: Tensor) -> Tensor:
        self.calls.append(len(x))
        return self.inner(x)


# (name, norm, params) for every native attack and one torchattacks attack.
CASES = [
    pytest.param("fgsm", "Linf", {}, id="fgsm-Linf"),
    pytest.param("fgsm_l2", "L2", {}, id="fgsm_l2-L2"),
    pytest.param("pgd", "Linf", {"steps": 3, "step_size": 0.02, "restarts": 2}, id="pgd-Linf"),
    pytest.param("pgd", "L2", {"steps": 3, "restarts": 2}, id="pgd-L2"),
    pytest.param(
        "torchattacks.PGD", "Linf", {"steps": 3}, id="torchattacks.PGD-Linf", marks=needs_torchattacks
    ),
]


def test_registry_lists_native_attacks() -> None:
    assert {"fgsm", "fgsm_l2", "pgd", "autoattack"} <= set(runner.attack_names())
    for name in ATTACKS:
        info = ATTACKS.info(name)
        assert info["norms"] and info["family"] in ("single_step", "iterative")


# ============ threat model ============


@pytest.mark.parametrize(("name", "norm", "params"), CASES)
def test_eps_zero_returns_x_unchanged(model, data, name, norm, params) -> None:
    x, y = data
    x_adv = run_attack(name, model, x, y, eps=0.0, norm=norm, gen=gen(), batch_size=100, params=params)
    assert torch.equal(x_adv, x)


@pytest.mark.parametrize(("name", "norm", "params"), CASES)
@pytest.mark.parametrize("eps", [0.05, 0.3])
def test_attack_stays_in_ball_and_box_and_not_above_clean(model, data, name, norm, params, eps) -> None:
    x, y = data
    eps = eps * 5 if norm == "L2" else eps  # comparable strength on 64-pixel images
    x_adv = run_attack(name, model, x, y, eps=eps, norm=norm, gen=gen(), batch_size=100, params=params)
    check_perturbation(x, x_adv, eps, norm)  # raises on any violation
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype
    assert accuracy(model, x_adv, y) <= accuracy(model, x, y)


@FAST
@given(
    b=st.integers(1, 4),
    c=st.integers(1, 3),
    h=st.integers(1, 6),
    norm=st.sampled_from(["Linf", "L2"]),
    eps=st.floats(0.0, 3.0, allow_nan=False),
    scale=st.floats(0.0, 5.0, allow_nan=False),
    seed=st.integers(0, 2**16),
)
def test_projection_property(b, c, h, norm, eps, scale, seed) -> None:
    g = gen(seed)
    eps = min(eps, 1.0) if norm == "Linf" else eps
    x = torch.rand(b, c, h, h, generator=g)
    x_adv = x + scale * torch.randn(b, c, h, h, generator=g)
    p = project(x, x_adv, eps, norm)
    check_perturbation(x, p, eps, norm)
    assert torch.allclose(project(x, p, eps, norm), p, atol=1e-6)  # idempotent
    inside = project(x, x + 0.5 * (p - x), eps, norm)  # a point inside the ball and box is kept
    assert torch.allclose(inside, x + 0.5 * (p - x), atol=1e-6)


@settings(max_examples=15, deadline=None, database=None)
@given(
    b=st.integers(1, 6),
    norm=st.sampled_from(["Linf", "L2"]),
    eps=st.floats(0.0, 1.0, allow_nan=False),
    restarts=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_pgd_in_ball_property(b, norm, eps, restarts, seed) -> None:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
    x = torch.rand(b, 3, 2, 2, generator=gen(seed))
    y = torch.randint(0, 3, (b,), generator=gen(seed + 1))
    x_adv = pgd_m.pgd(net, x, y, eps=eps, gen=gen(seed), norm=norm, steps=3, restarts=restarts)
    check_perturbation(x, x_adv, eps, norm)


def test_check_perturbation_is_called_on_every_batch(data, monkeypatch) -> None:
    x, y = data
    seen = []

    def bad_on_last_batch(model, x, y, *, eps, gen, norm, **_):
        seen.append(len(x))
        return (x + (2 * eps if len(seen) == 4 else 0)).clamp(0, 1)

    monkeypatch.setattr(runner, "resolve_attack", lambda name: bad_on_last_batch)
    monkeypatch.setattr(runner, "attack_info", lambda name: {"norms": ("Linf",)})
    with pytest.raises(SanityError, match="ball"):
        run_attack("bad", nn.Identity(), x, y, eps=0.01, norm="Linf", gen=gen(), batch_size=64)
    assert seen == [64, 64, 64, 64]


# ============ FGSM ============


@pytest.mark.parametrize("eps", [0.002, 0.05, 0.2])
@needs_torchattacks
def test_fgsm_matches_torchattacks(model, data, eps) -> None:
    x, y = data
    ours = fgsm_m.fgsm(model, x, y, eps=eps, gen=gen())
    theirs = torchattacks.FGSM(model, eps=eps)(x, y)
    assert (ours - theirs).abs().max() <= 1e-6
    with torch.no_grad():
        assert torch.equal(model(ours).argmax(1), model(theirs).argmax(1))


@pytest.mark.parametrize(("norm", "single"), [("Linf", fgsm_m.fgsm), ("L2", fgsm_m.fgsm_l2)])
def test_fgsm_sweep_is_fgsm_at_every_eps(model, data, norm, single) -> None:
    x, y = data
    at = fgsm_m.fgsm_sweep(model, x, y, norm=norm)
    for eps in (0.0, 0.002, 0.05, 0.3, 1.0):
        assert torch.equal(at(eps), single(model, x, y, eps=eps)), eps


def test_robust_under_attack_is_run_attack_at_each_eps(model, data) -> None:
    """Each eps is its own attack with its own generator, consumed chunk by chunk as run_attack does."""
    x, y = data
    eps, params = [0.05, 0.1], {"steps": 3, "restarts": 2}
    correct, seconds = runner.robust_under_attack(
        "pgd", model, x, y, eps, norm="Linf", gens=[gen(1), gen(2)], batch_size=100, params=params
    )
    for k, (e, seed) in enumerate(zip(eps, (1, 2), strict=True)):
        x_adv = run_attack(
            "pgd", model, x, y, eps=e, norm="Linf", gen=gen(seed), batch_size=100, params=params
        )
        with torch.no_grad():
            assert torch.equal(correct[k], model(x_adv).argmax(1) == y)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    with pytest.raises(ValueError, match="one generator per eps"):
        runner.robust_under_attack("pgd", model, x, y, eps, norm="Linf", gens=[gen()], batch_size=100)
    with pytest.raises(UserError, match="does not support norm"):
        runner.robust_under_attack("fgsm", model, x, y, [0.1], norm="L2", gens=[None], batch_size=100)


def test_fgsm_l2_step_has_norm_eps_before_clamp(model, data) -> None:
    x, y = data
    x = x * 0.5 + 0.25  # keep away from the box so the clamp is inactive
    x_adv = fgsm_m.fgsm_l2(model, x, y, eps=0.5, gen=gen())
    norms = (x_adv - x).flatten(1).norm(dim=1)
    assert torch.allclose(norms, torch.full_like(norms, 0.5), atol=1e-5)


# ============ PGD ============


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.2])
@needs_torchattacks
def test_native_pgd_with_restarts_at_least_as_strong_as_torchattacks(model, data, eps) -> None:
    # The paper's step size 0.01 and 10 steps; ours adds a restart and Wong's best-iterate early stop.
    x, y = data
    ours = pgd_m.pgd(model, x, y, eps=eps, gen=gen(0), steps=10, step_size=0.01, restarts=2)
    torch.manual_seed(0)
    theirs = torchattacks.PGD(model, eps=eps, alpha=0.01, steps=10, random_start=True)(x, y)
    assert accuracy(model, ours, y) <= accuracy(model, theirs, y)


def test_pgd_skips_misclassified_examples(model, data) -> None:
    x, y = data
    counting = Counting(model)
    with torch.no_grad():
        wrong = (model(x).argmax(1) + 1) % 10
    x_adv = pgd_m.pgd(counting, x, wrong, eps=0.1, gen=gen(), steps=5, restarts=2)
    assert torch.equal(x_adv, x)
    assert counting.calls == [len(x)]  # the clean check only: no attack work

    mixed = y.clone()
    mixed[::2] = wrong[::2]
    x_adv = pgd_m.pgd(model, x, mixed, eps=0.1, gen=gen(), steps=5)
    assert torch.equal(x_adv[::2], x[::2])


def test_pgd_early_stop_costs_no_extra_forward(model, data) -> None:
    x, y = data
    counting = Counting(model)
    pgd_m.pgd(counting, x, y, eps=1e-4, gen=gen(), steps=7, restarts=1)
    # clean check + one forward per step (its logits decide who is still correct) + final evaluation
    assert len(counting.calls) == 1 + 7 + 1


def test_pgd_early_stop_shrinks_the_work(model, data) -> None:
    x, y = data
    counting = Counting(model)
    pgd_m.pgd(counting, x, y, eps=0.3, gen=gen(), steps=10, step_size=0.05)
    step_calls = counting.calls[1:-1]
    assert step_calls[-1] < step_calls[0]  # fooled examples leave the batch


def test_pgd_more_restarts_never_weaker(model, data) -> None:
    # Restart 1 draws the same random start in both runs; later restarts can only add fooled examples.
    x, y = data
    for eps in (0.1,):
        one = pgd_m.pgd(model, x, y, eps=eps, gen=gen(3), steps=5, step_size=eps / 3, restarts=1)
        three = pgd_m.pgd(model, x, y, eps=eps, gen=gen(3), steps=5, step_size=eps / 3, restarts=3)
        with torch.no_grad():
            fooled_one = model(one).argmax(1) != y
            fooled_three = model(three).argmax(1) != y
        assert bool((fooled_three | ~fooled_one).all())  # fooled once -> stays fooled


def test_pgd_is_deterministic_given_the_generator(model, data) -> None:
    x, y = data
    a = pgd_m.pgd(model, x, y, eps=0.1, gen=gen(5), steps=3)
    b = pgd_m.pgd(model, x, y, eps=0.1, gen=gen(5), steps=3)
    c = pgd_m.pgd(model, x, y, eps=0.1, gen=gen(6), steps=3)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_attacks_leave_no_grad_and_ignore_callers_no_grad(data) -> None:
    x, y = data
    trainable = copy.deepcopy(digits_model()).requires_grad_(True)  # parameters that require grad
    state = torch.get_rng_state()
    with torch.no_grad():
        x_adv = pgd_m.pgd(trainable, x, y, eps=0.1, gen=gen(), steps=2)
        x_fgsm = fgsm_m.fgsm(trainable, x, y, eps=0.1, gen=gen())
    assert not torch.equal(x_adv, x) and not torch.equal(x_fgsm, x)
    assert all(p.grad is None for p in trainable.parameters())
    assert torch.equal(torch.get_rng_state(), state)  # native attacks draw from their generator only


def test_unknown_attack_and_norm_are_user_errors(model, data) -> None:
    x, y = data
    with pytest.raises(UserError, match="valid choices: fgsm"):
        resolve_attack("fgsn")
    with pytest.raises(UserError, match="does not support norm"):
        run_attack("fgsm", model, x, y, eps=0.1, norm="L2", gen=gen(), batch_size=64)


# ============ AutoAttack adapter ============


def test_autoattack_plan_caps_targets_and_drops_dlr_for_few_classes() -> None:
    assert autoattack_plan("standard", None, 10) == (["apgd-ce", "apgd-t", "fab-t", "square"], 9, "")
    assert autoattack_plan("custom", ["apgd-ce", "apgd-t"], 5)[:2] == (["apgd-ce", "apgd-t"], 4)
    kept, n_targets, note = autoattack_plan("standard", None, 2)
    assert kept == ["apgd-ce", "fab-t", "square"] and n_targets == 1 and "apgd-t" in note
    assert autoattack_plan("plus", None, 3)[0] == ["apgd-ce", "apgd-dlr", "fab", "square", "fab-t"]


def test_autoattack_adapter_passes_seed_attacks_and_targets(model, data, monkeypatch) -> None:
    import pyautoattack

    seen = {}

    def spy(self, x, y, *, batch_size=250, state_path=None):
        seen.update(
            attacks=list(self.attacks_to_run),
            seed=self.seed,
            targets=self.apgd_targeted.n_target_classes,
            fab_targets=self.fab.n_target_classes,
            batch_size=batch_size,
        )
        return x.clone(), y.clone()

    monkeypatch.setattr(pyautoattack.AutoAttack, "run_standard_evaluation", spy)
    x, y = data
    out = aa_m.autoattack(
        model, x[:8], y[:8], eps=0.03, gen=gen(1), version="custom", attacks=["apgd-ce", "apgd-t"]
    )
    assert isinstance(out, Tensor) and out.shape == x[:8].shape
    first = dict(seen)
    assert first["attacks"] == ["apgd-ce", "apgd-t"] and first["targets"] == 9 and first["batch_size"] == 8
    assert isinstance(first["seed"], int)
    aa_m.autoattack(model, x[:8], y[:8], eps=0.03, gen=gen(1), version="standard")
    assert seen["seed"] == first["seed"] and seen["attacks"] == ["apgd-ce", "apgd-t", "fab-t", "square"]


def test_autoattack_real_run_is_seeded_and_in_ball(model, data) -> None:
    x, y = data
    x, y = x[:12], y[:12]
    kw = {"eps": 0.13, "version": "custom", "attacks": ["apgd-ce", "apgd-t"]}
    a = aa_m.autoattack(model, x, y, gen=gen(2), **kw)
    b = aa_m.autoattack(model, x, y, gen=gen(2), **kw)
    assert isinstance(a, Tensor) and torch.equal(a, b)
    check_perturbation(x, a, 0.13, "Linf")
    assert accuracy(model, a, y) < accuracy(model, x, y)


def test_autoattack_two_classes_runs_without_dlr(model, data) -> None:
    class TwoClass(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Tensor) -> Tensor:
            return self.inner(x)[:, :2]

    x, y = data
    keep = y < 2
    x2, y2, two = x[keep][:8], y[keep][:8], TwoClass(model)
    with pytest.warns(UserWarning, match="dropped apgd-t"):
        x_adv = aa_m.autoattack(two, x2, y2, eps=0.3, gen=gen(), version="standard")
    check_perturbation(x2, x_adv, 0.3, "Linf")
    assert accuracy(two, x_adv, y2) < accuracy(two, x2, y2)


def test_autoattack_custom_needs_attacks(model, data) -> None:
    x, y = data
    with pytest.raises(UserError, match="custom"):
        aa_m.autoattack(model, x[:2], y[:2], eps=0.1, gen=gen(), version="custom")


# ============ torchattacks by name ============


@needs_torchattacks
def test_torchattacks_is_seeded_and_restores_global_rng(model, data) -> None:
    x, y = data
    state = torch.get_rng_state()
    fn = resolve_attack("torchattacks.PGD")
    a = fn(model, x, y, eps=0.1, gen=gen(4), steps=3)
    b = fn(model, x, y, eps=0.1, gen=gen(4), steps=3)
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), state)


@needs_torchattacks
def test_torchattacks_minimum_norm_attack_is_projected(model, data) -> None:
    x, y = data
    x_adv = resolve_attack("torchattacks.CW")(model, x[:32], y[:32], eps=0.2, gen=gen(), norm="L2", steps=5)
    check_perturbation(x[:32], x_adv, 0.2, "L2")


@needs_torchattacks
def test_torchattacks_errors() -> None:
    with pytest.raises(UserError, match="torchattacks provides"):
        resolve_attack("torchattacks.NoSuchAttack")
    with pytest.raises(UserError, match="does not take"):
        resolve_attack("torchattacks.PGD")(
            nn.Identity(), torch.zeros(1, 1, 2, 2), torch.zeros(1).long(), eps=0.1, bogus=1
        )


def test_torchattacks_missing_is_a_one_line_user_error(monkeypatch) -> None:
    monkeypatch.setattr(ta_m, "_TORCHATTACKS_CACHE", {})
    monkeypatch.setitem(sys.modules, "torchattacks", None)  # simulate "not installed"
    with pytest.raises(UserError, match=r"pip install 'robustbench-nacl\[torchattacks\]'"):
        resolve_attack("torchattacks.PGD")


# ============ suites ============


def test_shipped_suites_load() -> None:
    assert {"paper", "quick", "autoattack", "l2"} <= set(suite_names())
    for name in ("paper", "quick", "autoattack", "l2"):
        s = load_suite(name)
        assert isinstance(s, Suite) and s.attacks and len(s.sha256) == 64
    paper = load_suite("paper")
    assert paper.attacks[0] == AttackSpec("fgsm", "Linf", (0.002, 0.004, 0.008, 0.016, 0.032), {})
    pgd = paper.attacks[1]
    assert (pgd.name, pgd.eps) == ("pgd", (0.002,))
    assert {k: pgd.params[k] for k in ("steps", "step_size", "restarts")} == {
        "steps": 10,
        "step_size": 0.01,
        "restarts": 2,
    }
    aa = load_suite("autoattack").attacks[0]
    assert aa.name == "autoattack" and aa.eps == (8 / 255,) and aa.params["version"] == "standard"
    l2 = load_suite("l2").attacks[0]
    assert (l2.norm, l2.eps, l2.params["steps"]) == ("L2", (0.1, 0.25, 0.5), 20)


def test_suite_by_path_dict_and_env_dir(tmp_path, monkeypatch) -> None:
    text = '[[attack]]\nname = "fgsm"\neps = [0.1, "8/255"]\n'
    (tmp_path / "mine.toml").write_text(text)
    by_path = load_suite(tmp_path / "mine.toml")
    assert by_path.name == "mine" and by_path.attacks[0].eps == (0.1, 8 / 255)
    assert by_path.attacks[0].norm == "Linf"  # the attack's default norm
    by_dict = load_suite({"attack": [{"name": "fgsm", "eps": [0.1, 8 / 255]}]})
    assert by_dict.sha256 == by_path.sha256  # the hash is of the content, not of its formatting
    assert load_suite({"attack": [{"name": "fgsm", "eps": [0.2]}]}).sha256 != by_path.sha256
    monkeypatch.setenv("ROBUSTBENCH_NACL_ATTACKS", str(tmp_path))
    assert "mine" in suite_names() and load_suite("mine").sha256 == by_path.sha256
    with pytest.raises(UserError, match=r"available: .*paper"):
        load_suite("nope")
    with pytest.raises(UserError, match="cannot read"):
        load_suite(tmp_path / "missing.toml")


def test_malformed_toml_names_file_and_line(tmp_path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text('[[attack]]\nname = "fgsm"\neps = [0.1,\nsteps = \n')
    with pytest.raises(UserError) as e:
        load_suite(p)
    msg = str(e.value)
    assert "bad.toml" in msg and "line" in msg and "\n" not in msg


BAD_SUITES = {
    "no attack table": ({"name": "x"}, "no \\[\\[attack\\]\\]"),
    "empty attack list": ({"attack": []}, "non-empty"),
    "unknown attack": ({"attack": [{"name": "fgsn", "eps": [0.1]}]}, "valid choices"),
    "unknown norm": ({"attack": [{"name": "pgd", "norm": "L7", "eps": [0.1]}]}, "unknown norm"),
    "unsupported norm": ({"attack": [{"name": "fgsm", "norm": "L2", "eps": [0.1]}]}, "does not support"),
    "eps < 0": ({"attack": [{"name": "fgsm", "eps": [-0.1]}]}, "out of range"),
    "eps > 1 linf": ({"attack": [{"name": "fgsm", "eps": [1.5]}]}, "out of range"),
    "eps < 0 l2": ({"attack": [{"name": "pgd", "norm": "L2", "eps": [-1.0]}]}, "out of range"),
    "eps nan": ({"attack": [{"name": "fgsm", "eps": [math.nan]}]}, "finite"),
    "eps string": ({"attack": [{"name": "fgsm", "eps": ["abc"]}]}, "k/255"),
    "empty eps": ({"attack": [{"name": "fgsm", "eps": []}]}, "empty"),
    "missing eps": ({"attack": [{"name": "fgsm"}]}, "required"),
    "duplicate eps": ({"attack": [{"name": "fgsm", "eps": [0.1, 0.1]}]}, "duplicate"),
    "steps < 1": ({"attack": [{"name": "pgd", "eps": [0.1], "steps": 0}]}, "steps must be an integer >= 1"),
    "restarts < 1": ({"attack": [{"name": "pgd", "eps": [0.1], "restarts": 0}]}, "restarts must"),
    "steps bool": ({"attack": [{"name": "pgd", "eps": [0.1], "steps": True}]}, "steps must"),
    "step_size <= 0": ({"attack": [{"name": "pgd", "eps": [0.1], "step_size": 0}]}, "step_size must"),
    "unknown key": ({"attack": [{"name": "pgd", "eps": [0.1], "iters": 3}]}, "unknown key"),
    "fgsm extra key": ({"attack": [{"name": "fgsm", "eps": [0.1], "steps": 3}]}, "unknown key"),
    "aa custom no list": ({"attack": [{"name": "autoattack", "eps": [0.1], "version": "custom"}]}, "custom"),
    "aa bad component": (
        {"attack": [{"name": "autoattack", "eps": [0.1], "version": "custom", "attacks": ["pgd"]}]},
        "attacks must",
    ),
    "aa bad version": ({"attack": [{"name": "autoattack", "eps": [0.1], "version": "fast"}]}, "version must"),
    "top-level key": ({"attack": [{"name": "fgsm", "eps": [0.1]}], "attacks": 1}, "unknown top-level"),
    "entry not a table": ({"attack": [3]}, "must be a table"),
}
BAD_SUITE_CASES = [pytest.param(bad, match, id=name) for name, (bad, match) in BAD_SUITES.items()] + [
    pytest.param(
        {"attack": [{"name": "torchattacks.PGD", "eps": [0.1], "iters": 3}]},
        "unknown key",
        id="torchattacks bad key",
        marks=needs_torchattacks,
    )
]


@pytest.mark.parametrize(("bad", "match"), BAD_SUITE_CASES)
def test_invalid_suites_give_one_line_user_errors(bad, match) -> None:
    with pytest.raises(UserError, match=match) as e:
        parse_suite_dict(bad, source="t.toml")
    assert "\n" not in str(e.value) and str(e.value).startswith("t.toml")


def test_l2_eps_above_one_is_fine() -> None:
    assert parse_suite_dict({"attack": [{"name": "pgd", "norm": "L2", "eps": [2.5]}]}).attacks[0].eps == (
        2.5,
    )


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 30), st.floats(allow_nan=True), st.text(max_size=8)
)
JSONISH = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)
ENTRY = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["fgsm", "pgd", "autoattack", "fgsm_l2", "torchattacks.PGD", "nope", 3]),
        "norm": st.sampled_from(["Linf", "L2", "L1", None]),
        "eps": st.one_of(
            st.lists(st.one_of(st.floats(-1, 2), st.text(max_size=6), st.just("8/255")), max_size=3), SCALARS
        ),
    },
    optional={
        "steps": JSONISH,
        "restarts": st.integers(-1, 3),
        "step_size": JSONISH,
        "version": st.sampled_from(["standard", "custom", "plus", "x"]),
        "attacks": JSONISH,
        "extra": JSONISH,
    },
)


@settings(max_examples=150, deadline=None, database=None)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))
def test_fuzz_suite_text_only_user_errors(text) -> None:
    try:
        parse_suite_text(text)
    except UserError as e:
        assert "\n" not in str(e)


@settings(max_examples=120, deadline=None, database=None)
@given(st.one_of(JSONISH, st.fixed_dictionaries({"attack": st.lists(ENTRY, max_size=3)})))
def test_fuzz_suite_structures_only_user_errors(data) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = parse_suite_dict(data) if isinstance(data, dict) else load_suite(data)
        assert s.attacks and len(s.sha256) == 64
    except UserError as e:
        assert "\n" not in str(e)
