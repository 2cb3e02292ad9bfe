"""benchmark(): rows, independent per-eps attacks, worst case, per-example bits, determinism, input
contract, AutoAttack and torchattacks end to end, all on the trained digits model."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from _models import digits_model
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from robustbench_nacl.attack import fgsm as fgsm_m
from robustbench_nacl.attack import runner
from robustbench_nacl.attack.rng import derive_seed
from robustbench_nacl.attack.suites import load_suite
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.benchmark import WORST_CASE, benchmark
from robustbench_nacl.results.bits import decode_bits, encode_bits
from robustbench_nacl.results.eps import eps_label


def _has_torchattacks() -> bool:
    try:
        import torchattacks  # noqa: F401
    except ImportError:
        return False
    return True


needs_torchattacks = pytest.mark.skipif(
    not _has_torchattacks(),
    reason="torchattacks not installed (pip install 'robustbench-nacl[torchattacks]')",
)

SUITE = {
    "attack": [
        {"name": "fgsm", "norm": "Linf", "eps": [0.1, 0.05, 0.2]},  # unsorted on purpose
        {
            "name": "pgd",
            "norm": "Linf",
            "eps": [0.05, 0.1, 0.2],
            "steps": 10,
            "step_size": 0.05,
            "restarts": 2,
        },
        {"name": "pgd", "norm": "L2", "eps": [0.5, 1.0], "steps": 5},
    ]
}
ROW_KEYS = {
    "attack", "attack_family", "norm", "eps", "eps_label", "params", "suite", "suite_sha256",
    "clean_acc", "robust_acc", "n_examples", "n_robust", "n_clean_correct", "n_attacked",
    "num_classes", "seed", "batch_size", "device", "wall_s", "sanity_ok", "sanity_failed",
    "clean_bits", "robust_bits",
}  # fmt: skip


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def rows(model, data) -> list[dict]:
    x, y = data
    return benchmark(model, x, y, SUITE, seed=0, batch_size=64, progress=False)


def attack_rows(rows: list[dict], name: str, norm: str = "Linf") -> list[dict]:
    return sorted((r for r in rows if r["attack"] == name and r["norm"] == norm), key=lambda r: r["eps"])


def test_rows_are_complete_flat_and_pass_every_sanity_check(rows) -> None:
    assert len(rows) == 3 + 3 + 2 + 3 + 2  # attack rows + one worst_case row per (norm, eps)
    for r in rows:
        assert set(r) >= ROW_KEYS, ROW_KEYS - set(r)
        assert r["sanity_ok"], (r["attack"], r["eps"], r["sanity_failed"])
        assert 0.0 <= r["robust_acc"] <= r["clean_acc"] <= 1.0
        assert r["robust_acc"] == r["n_robust"] / r["n_examples"]
        assert r["eps_label"] == eps_label(r["eps"])
        assert all(not isinstance(v, Tensor) for v in r.values())
    json.dumps(rows)  # rows leave the evaluation as JSON
    assert rows[0]["clean_acc"] > 0.9 and rows[0]["n_examples"] == 200
    assert [r["eps"] for r in attack_rows(rows, "fgsm")] == [0.05, 0.1, 0.2]


def bits(row: dict) -> np.ndarray:
    return decode_bits(row["robust_bits"], row["n_examples"])


def test_pgd_non_increasing_in_eps_and_below_fgsm(rows) -> None:
    pgd = attack_rows(rows, "pgd")
    assert all(a["n_robust"] >= b["n_robust"] - 2 for a, b in itertools.pairwise(pgd))  # independent runs
    assert pgd[-1]["robust_acc"] < pgd[0]["robust_acc"]
    for p, f in zip(pgd, attack_rows(rows, "fgsm"), strict=True):
        assert p["robust_acc"] <= f["robust_acc"] + 2 / p["n_examples"]


def test_worst_case_is_the_per_example_and_over_attacks_and_smaller_eps(rows) -> None:
    worst = [r for r in rows if r["attack"] == WORST_CASE]
    assert {(r["norm"], r["eps"]) for r in worst} == {(r["norm"], r["eps"]) for r in rows}
    for w in worst:
        expected = decode_bits(w["clean_bits"], w["n_examples"]).copy()
        for r in rows:
            if r["attack"] != WORST_CASE and r["norm"] == w["norm"] and r["eps"] <= w["eps"]:
                assert w["robust_acc"] <= r["robust_acc"]
                expected &= bits(r)
        assert np.array_equal(bits(w), expected) and w["n_robust"] == int(expected.sum())
    assert {w["norm"]: w["params"]["attacks"] for w in worst} == {"Linf": ["fgsm", "pgd"], "L2": ["pgd"]}


def test_every_eps_attacks_every_clean_correct_example_independently(model, data, rows) -> None:
    """No carry-over between epsilons: each PGD row is exactly one PGD run, with its own seed, on all
    clean-correct examples (an example fooled at a smaller eps is attacked again)."""
    x, y = data
    clean = decode_bits(rows[0]["clean_bits"], len(x))
    assert int(clean.sum()) == rows[0]["n_clean_correct"]
    for r in rows:
        assert r["n_attacked"] == (0 if r["attack"] == WORST_CASE else r["n_clean_correct"])
        assert not (bits(r) & ~clean).any()  # robust implies clean-correct
    idx = torch.from_numpy(np.flatnonzero(clean))
    spec = load_suite(SUITE).attacks[1]
    for r in attack_rows(rows, "pgd"):
        gen = torch.Generator().manual_seed(derive_seed(0, "pgd", "Linf", dict(spec.params), r["eps"]))
        x_adv = runner.run_attack(
            "pgd",
            model,
            x[idx],
            y[idx],
            eps=r["eps"],
            norm="Linf",
            gen=gen,
            batch_size=64,
            params=spec.params,
        )
        alone = np.zeros(len(x), dtype=bool)
        alone[idx.numpy()] = (model(x_adv).argmax(1) == y[idx]).numpy()
        assert np.array_equal(bits(r), alone), r["eps"]


class NonMonotone(nn.Module):
    """The digits model plus a large linear term on each pixel's offset from the 1/16 grid the
    digits live on: FGSM at eps < 0.015 moves pixels off the grid along that term and fools the
    model; above 0.015 off-grid inputs are snapped back onto the grid (exact for eps < 1/32), where
    the model is the digits model on the clean image. FGSM is therefore not monotone in eps."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("w", torch.randn(64, 10, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: Tensor) -> Tensor:
        snapped = torch.round(x * 16) / 16
        off = x - snapped
        engaged = off.abs().flatten(1).amax(1) > 0.015
        base = self.inner(snapped)
        return torch.where(engaged[:, None], base, base + 30.0 * off.flatten(1) @ self.w)


def test_fgsm_rows_equal_independent_fgsm_per_eps_on_a_non_monotone_model(data) -> None:
    x, y = data
    model = NonMonotone(digits_model()).eval()
    eps = [0.005, 0.01, 0.02, 0.03]
    rows = benchmark(model, x, y, {"attack": [{"name": "fgsm", "eps": eps}]}, batch_size=64, progress=False)
    fgsm = attack_rows(rows, "fgsm")
    clean = decode_bits(rows[0]["clean_bits"], len(x))
    alone = []
    for r, e in zip(fgsm, eps, strict=True):
        with torch.no_grad():
            correct = (model(fgsm_m.fgsm(model, x, y, eps=e)).argmax(1) == y).numpy()
        alone.append(clean & correct)
        assert np.array_equal(bits(r), alone[-1]), e  # to the example
    # the model is what the test needs: fooled at 0.01, not at 0.02 (for many examples)
    assert (~alone[1] & alone[2]).sum() > 20 and fgsm[2]["n_robust"] == fgsm[2]["n_clean_correct"]
    assert fgsm[2]["sanity_monotone_in_eps"] is False and "monotone_in_eps" in fgsm[2]["sanity_warnings"]
    worst = [r for r in rows if r["attack"] == WORST_CASE]
    assert [w["n_robust"] for w in worst] == [
        int(np.logical_and.reduce(alone[: k + 1]).sum()) for k in range(4)
    ]


def test_fgsm_sweep_costs_one_backward_and_one_forward_per_eps(model, data) -> None:
    """The sweep takes the input gradient once: 1 forward+backward and 1 forward per eps per batch."""
    x, y = data
    calls = []

    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, t: Tensor) -> Tensor:
            calls.append(torch.is_grad_enabled() and t.requires_grad)
            return self.inner(t)

    gens = [None] * 5
    correct, seconds = runner.robust_under_attack(
        "fgsm", Counting(), x, y, [0.01, 0.02, 0.05, 0.1, 0.2], norm="Linf", gens=gens, batch_size=len(x)
    )
    assert calls == [True] + [False] * 5 and correct.shape == (5, len(x)) and len(seconds) == 5


@settings(max_examples=60, deadline=None, database=None)
@given(st.lists(st.booleans(), max_size=70))
def test_bits_round_trip(values: list[bool]) -> None:
    text = encode_bits(values)
    assert decode_bits(text, len(values)).tolist() == values
    assert encode_bits(torch.tensor(values, dtype=torch.bool)) == text == encode_bits(np.array(values))


def test_bits_layout_and_malformed_input() -> None:
    # example i is bit i of the little-endian packed bytes: examples 0 and 9 set -> bytes 0x01 0x02
    assert encode_bits([True] + [False] * 8 + [True]) == "AQI="
    assert len(encode_bits(np.ones(10_000, dtype=bool))) == 1668
    for bad, n, match in (("AQI=", 20, "need 3"), ("A!I=", 10, "not base64"), ("AQI=", 9, "padding")):
        with pytest.raises(UserError, match=match):
            decode_bits(bad, n)


def test_rows_are_deterministic_given_the_seed(model, data, rows) -> None:
    x, y = data
    again = benchmark(model, x, y, SUITE, seed=0, batch_size=64, progress=False)
    strip = [{k: v for k, v in r.items() if "wall_s" not in k} for r in rows]
    assert strip == [{k: v for k, v in r.items() if "wall_s" not in k} for r in again]
    assert derive_seed(0, "pgd", 0.1) == derive_seed(0, "pgd", 0.1) != derive_seed(1, "pgd", 0.1)


def test_eps_zero_row_equals_clean(model, data) -> None:
    x, y = data
    rows = benchmark(
        model, x, y, {"attack": [{"name": "pgd", "eps": [0.0, 0.1], "steps": 2}]}, progress=False
    )
    zero = next(r for r in rows if r["attack"] == "pgd" and r["eps"] == 0.0)
    assert zero["robust_acc"] == zero["clean_acc"] and zero["robust_bits"] == zero["clean_bits"]


def test_shipped_quick_suite_by_name(model, data) -> None:
    x, y = data
    rows = benchmark(model, x, y, "quick", progress=False)
    assert {r["attack"] for r in rows} == {"fgsm", "pgd", WORST_CASE}
    assert all(r["sanity_ok"] and r["suite"] == "quick" for r in rows)
    assert rows[0]["suite_sha256"] == load_suite("quick").sha256
    assert rows[0]["eps_label"] == "0.51/255"


def test_model_is_put_in_eval_mode(data) -> None:
    x, y = data
    net = digits_model()
    net.train()
    try:
        rows = benchmark(net, x[:32], y[:32], "quick", progress=False)
        assert not net.training and rows[0]["sanity_eval_mode"]
    finally:
        net.eval()


def test_input_contract_errors(model, data) -> None:
    x, y = data
    with pytest.raises(UserError, match=r"\[0,1\].*normalisation belongs inside the model"):
        benchmark(model, (x - 0.5) / 0.25, y, "quick", progress=False)
    with pytest.raises(UserError, match="1-D integer"):
        benchmark(model, x, y.float(), "quick", progress=False)
    with pytest.raises(UserError, match="num_classes=5"):
        benchmark(model, x, y, "quick", num_classes=5, progress=False)
    with pytest.raises(UserError, match="unknown attack suite"):
        benchmark(model, x, y, "no-such-suite", progress=False)


def test_autoattack_rows_identical_on_repeat(model, data) -> None:
    x, y = data
    suite = {
        "attack": [
            {
                "name": "autoattack",
                "norm": "Linf",
                "eps": [0.13],
                "version": "custom",
                "attacks": ["apgd-ce", "apgd-t"],
            }
        ]
    }
    a = benchmark(model, x[:12], y[:12], suite, seed=3, progress=False)
    b = benchmark(model, x[:12], y[:12], suite, seed=3, progress=False)
    strip = lambda rs: [{k: v for k, v in r.items() if "wall_s" not in k} for r in rs]  # noqa: E731
    assert strip(a) == strip(b)
    aa = a[0]
    assert aa["params"]["attacks_run"] == ["apgd-ce", "apgd-t"] and aa["params"]["n_target_classes"] == 9
    assert aa["robust_acc"] < aa["clean_acc"] and aa["sanity_ok"], aa["sanity_failed"]


@needs_torchattacks
def test_torchattacks_by_name_through_benchmark(model, data) -> None:
    x, y = data
    suite = {
        "attack": [
            {"name": "torchattacks.PGDL2", "norm": "L2", "eps": [0.5, 1.0], "steps": 5},
            {"name": "torchattacks.CW", "norm": "L2", "eps": [1.0], "steps": 5, "c": 10.0, "lr": 0.1},
        ]
    }
    rows = benchmark(model, x[:100], y[:100], suite, progress=False)
    pgd = attack_rows(rows, "torchattacks.PGDL2", "L2")
    assert pgd[1]["robust_acc"] < pgd[0]["robust_acc"] < pgd[0]["clean_acc"]
    assert pgd[0]["params"]["steps"] == 5 and math.isclose(pgd[0]["params"]["alpha"], 0.2)
    cw = attack_rows(rows, "torchattacks.CW", "L2")[0]
    assert cw["robust_acc"] <= cw["clean_acc"]
    assert all(r["sanity_ok"] for r in rows), [r["sanity_failed"] for r in rows]


def test_a_subset_attack_measures_the_first_examples_and_counts_in_the_worst_case(model, data) -> None:
    x, y = data
    pgd = {"name": "pgd", "norm": "Linf", "eps": [0.1], "steps": 5, "step_size": 0.05}
    full = {"attack": [{"name": "fgsm", "norm": "Linf", "eps": [0.1]}, pgd]}
    part = {"attack": [{"name": "fgsm", "norm": "Linf", "eps": [0.1]}, {**pgd, "subset": 100}]}
    b = benchmark(model, x, y, part, seed=0, batch_size=64, progress=False)
    first = benchmark(model, x[:100], y[:100], part, seed=0, batch_size=64, progress=False)
    n = len(x)
    pgd_b, pgd_first = (next(r for r in rows if r["attack"] == "pgd") for rows in (b, first))
    assert pgd_b["params"]["subset"] == 100
    assert load_suite(part).sha256 != load_suite(full).sha256  # the subset is part of the protocol
    # the row is the attack on the first 100 examples alone: its bits, counts and accuracies are theirs
    assert pgd_b["robust_bits"] == pgd_first["robust_bits"] and pgd_b["clean_bits"] == pgd_first["clean_bits"]
    bits_first, clean = decode_bits(pgd_first["robust_bits"], 100), decode_bits(pgd_first["clean_bits"], 100)
    assert pgd_b["n_examples"] == 100 and pgd_b["clean_acc"] == clean.mean() == pgd_first["clean_acc"]
    assert pgd_b["robust_acc"] == pgd_first["robust_acc"] == bits_first.sum() / 100 and pgd_b["sanity_ok"]
    assert pgd_b["n_attacked"] == clean.sum() and bits_first.any()
    # the worst case: the subset's successes count, the other examples are left to the other attacks
    fgsm = decode_bits(next(r for r in b if r["attack"] == "fgsm")["robust_bits"], n)
    worst = decode_bits(next(r for r in b if r["attack"] == WORST_CASE)["robust_bits"], n)
    assert (worst[:100] == (fgsm[:100] & bits_first)).all() and (worst[100:] == fgsm[100:]).all()
    assert (worst[:100] != fgsm[:100]).any()  # PGD broke examples FGSM did not: the case is exercised
    for bad in (0, True, 2.5):
        with pytest.raises(UserError, match="subset must be a whole number >= 1"):
            load_suite({"attack": [{**pgd, "subset": bad}]})
