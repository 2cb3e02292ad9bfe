"""Sanity checks are live: each broken model fixture trips the check meant to catch it, and the
trained digits model trips none."""

from __future__ import annotations

import pytest
import torch
from _models import accuracy, gen, small_cnn
from torch import Tensor, nn

from robustbench_nacl.errors import SanityError, UserError
from robustbench_nacl.eval.benchmark import benchmark
from robustbench_nacl.eval.sanity import (
    chance_level,
    check_batch_independence,
    check_deterministic,
    check_eval_mode,
    check_logits_not_probs,
    check_perturbation,
    check_zero_gradients,
    cross_row_checks,
    looks_like_probabilities,
    noise_accuracy,
    unbounded_accuracy,
)

SUITE = {
    "attack": [
        {"name": "fgsm", "norm": "Linf", "eps": [0.05, 0.3]},
        {"name": "pgd", "norm": "Linf", "eps": [0.05, 0.3], "steps": 5, "step_size": 0.1},
    ]
}


pytestmark = pytest.mark.usefixtures("single_thread")


class Wrap(nn.Module):
    def __init__(self, inner: nn.Module, fn) -> None:
        super().__init__()
        self.inner, self.fn = inner, fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(self.inner, x)


def masked(m: nn.Module) -> nn.Module:
    """Input quantised to 4 levels through a plain torch.round: zero gradient everywhere."""
    return Wrap(m, lambda inner, x: inner(torch.round(x * 3) / 3)).eval()


def softmaxed(m: nn.Module) -> nn.Module:
    return Wrap(m, lambda inner, x: inner(x).softmax(-1)).eval()


def randomized(m: nn.Module) -> nn.Module:
    return Wrap(m, lambda inner, x: inner(x) + 0.5 * torch.randn(len(x), 10)).eval()


class Constant(nn.Module):
    """A collapsed model: the same logits whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("logits", torch.linspace(0, 1, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.logits.expand(len(x), -1)


# ============ the trained model passes ============


def test_trained_model_passes_every_model_check(model, data) -> None:
    x, y = data
    assert accuracy(model, x, y) > 0.9
    assert check_logits_not_probs(model, x)
    assert check_deterministic(model, x)
    assert check_batch_independence(model, x)
    assert check_eval_mode(model)
    assert check_zero_gradients(model, x, y) == 0.0
    assert unbounded_accuracy(model, x, y, gen()) <= 0.05
    assert noise_accuracy(model, x, y, 0.0, gen()) == pytest.approx(accuracy(model, x, y))


# ============ each broken model is flagged ============


def test_gradient_masked_model_is_flagged(model, data) -> None:
    x, y = data
    rows = benchmark(masked(model), x, y, SUITE, progress=False)
    r = rows[0]
    assert r["clean_acc"] > 0.8  # quantisation alone keeps the model accurate
    assert r["sanity_zero_grad_frac"] == 1.0 and not r["sanity_nonzero_gradients"]
    assert r["sanity_unbounded_acc"] > 0.5 and not r["sanity_unbounded_reaches_zero"]
    assert not any(row["sanity_ok"] for row in rows)
    assert {"nonzero_gradients", "unbounded_reaches_zero"} <= set(r["sanity_failed"].split(","))


def test_softmax_output_is_refused_not_flagged(model, data) -> None:
    """Attacks on probabilities overstate robustness: benchmark produces no number at all."""
    x, y = data
    assert not check_logits_not_probs(softmaxed(model), x) and check_logits_not_probs(model, x)
    with pytest.raises(UserError, match=r"returns probabilities.*drop the final softmax"):
        benchmark(softmaxed(model), x, y, SUITE, progress=False)
    assert looks_like_probabilities(torch.tensor([[0.25, 0.75], [1.0, 0.0]]))
    assert not looks_like_probabilities(torch.tensor([[0.25, 0.5], [1.0, 0.0]]))  # a row sums to 0.75
    assert not looks_like_probabilities(torch.tensor([[-0.5, 1.5]]))  # sums to 1, leaves [0,1]


def test_constant_classifier_fails_chance_and_unbounded(data) -> None:
    x, y = data
    rows = benchmark(Constant(), x, y, SUITE, progress=False)
    r = rows[0]
    assert not r["sanity_clean_above_chance"] and not r["sanity_unbounded_reaches_zero"]
    assert not r["sanity_ok"]


def test_batchnorm_in_train_mode_fails_batch_independence(data) -> None:
    x, _ = data
    torch.manual_seed(0)
    net = small_cnn(bn=True).train()
    assert not check_batch_independence(net, x)
    assert not check_eval_mode(net)
    net.eval()
    assert check_batch_independence(net, x) and check_eval_mode(net)


def test_randomized_model_is_flagged(model, data) -> None:
    x, _ = data
    assert not check_deterministic(randomized(model), x)


# ============ threat-model errors ============


def test_check_perturbation_raises_outside_the_ball_or_box() -> None:
    x = torch.full((2, 1, 4, 4), 0.5)
    check_perturbation(x, x + 0.1, 0.1, "Linf")  # exactly on the boundary is fine
    with pytest.raises(SanityError, match="Linf ball"):
        check_perturbation(x, x + 0.1 + 1e-4, 0.1, "Linf")
    d = torch.zeros_like(x)
    d[0, 0, 0, 0] = 0.3
    check_perturbation(x, x + d, 0.3, "L2")
    with pytest.raises(SanityError, match="L2 ball"):
        check_perturbation(x, x + d, 0.29, "L2")
    with pytest.raises(SanityError, match=r"\[0,1\]"):
        check_perturbation(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2) + 0.05, 0.1, "Linf")
    with pytest.raises(SanityError, match="shape"):
        check_perturbation(x, x[:1], 0.1, "Linf")
    with pytest.raises(SanityError, match="non-finite"):
        check_perturbation(x, x * float("nan"), 0.1, "Linf")


# ============ cross-row checks ============


def row(attack: str, family: str, eps: float, n_robust: int, **kw) -> dict:
    base = {
        "attack": attack,
        "attack_family": family,
        "norm": "Linf",
        "eps": eps,
        "params": {},
        "clean_acc": 0.9,
        "n_examples": 100,
        "n_robust": n_robust,
        "robust_acc": n_robust / 100,
        "sanity_noise_acc": 0.9,
    }
    return {**base, **kw}


def test_robust_above_clean_is_an_error() -> None:
    with pytest.raises(SanityError, match="robust accuracy"):
        cross_row_checks([row("pgd", "iterative", 0.1, 95)])


def test_cross_row_flags() -> None:
    rows = [
        row("fgsm", "single_step", 0.1, 50),
        row("fgsm", "single_step", 0.2, 55),  # FGSM non-monotone: warning only
        row("pgd", "iterative", 0.1, 60),  # weaker than FGSM by more than 2 examples
        row("pgd", "iterative", 0.2, 63),  # non-monotone PGD by more than 2 examples: a failure
        row("pgd", "iterative", 0.3, 10, sanity_noise_acc=0.05),  # weaker than noise
    ]
    cross_row_checks(rows)
    f1, f2, p1, p2, p3 = rows
    assert f1["sanity_ok"] and f2["sanity_ok"] and f2["sanity_warnings"] == "monotone_in_eps"
    assert f1["sanity_monotone_in_eps"] is None  # the smallest eps: nothing to compare with
    assert not p1["sanity_le_single_step"] and not p1["sanity_ok"]
    assert p2["sanity_monotone_in_eps"] is False and "monotone_in_eps" in p2["sanity_failed"]
    assert p3["sanity_le_single_step"] is None and not p3["sanity_attack_beats_noise"]
    assert p3["sanity_monotone_in_eps"] is True  # compared with the fewest robust at any smaller eps


def test_monotone_in_eps_tolerance_and_where_it_applies() -> None:
    """Each eps is attacked independently, so two random starts may differ by an example or two:
    up to TOL_EXAMPLES more robust examples at a larger eps pass. The smallest eps of a spec and
    the worst-case rows (non-increasing by construction) have nothing to check: None."""
    rows = [
        row("pgd", "iterative", 0.1, 50),
        row("pgd", "iterative", 0.2, 52),  # +2: within the slack
        row("pgd", "iterative", 0.3, 53),  # +3 over the fewest (50): fires
        row("pgd", "iterative", 0.5, 5, params={"steps": 1}),  # another spec, one eps
        row("worst_case", "worst_case", 0.1, 40),
        row("worst_case", "worst_case", 0.2, 40),
    ]
    cross_row_checks(rows)
    assert [r["sanity_monotone_in_eps"] for r in rows] == [None, True, False, None, None, None]


def test_chance_level_is_the_best_constant_classifier() -> None:
    assert chance_level(torch.tensor([0, 1, 2, 3]), 4) == 0.25
    assert chance_level(torch.tensor([1, 1, 1, 0]), 10) == 0.75
