"""benchmark(): rows, worst case, no repeated work, determinism, input contract, AutoAttack and
torchattacks end to end, all on the trained digits model."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from _models import digits_data, digits_model, one_thread
from torch import Tensor, nn

from robustbench_nacl.attack.suites import load_suite
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.benchmark import WORST_CASE, benchmark, derive_seed, eps_label

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
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return digits_model()


@pytest.fixture(scope="module")
def data() -> tuple[Tensor, Tensor]:
    _, _, x, y = digits_data()
    return x[:200], y[:200]


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


def test_pgd_non_increasing_in_eps_and_below_fgsm(rows) -> None:
    pgd = attack_rows(rows, "pgd")
    assert all(a["robust_acc"] >= b["robust_acc"] for a, b in itertools.pairwise(pgd))
    assert pgd[-1]["robust_acc"] < pgd[0]["robust_acc"]
    for p, f in zip(pgd, attack_rows(rows, "fgsm"), strict=True):
        assert p["robust_acc"] <= f["robust_acc"] + 2 / p["n_examples"]


def test_worst_case_is_below_every_attack(rows) -> None:
    worst = [r for r in rows if r["attack"] == WORST_CASE]
    assert {(r["norm"], r["eps"]) for r in worst} == {(r["norm"], r["eps"]) for r in rows}
    for w in worst:
        for r in rows:
            if r["norm"] == w["norm"] and r["eps"] <= w["eps"]:
                assert w["robust_acc"] <= r["robust_acc"]
    assert {w["norm"]: w["params"]["attacks"] for w in worst} == {"Linf": ["fgsm", "pgd"], "L2": ["pgd"]}


def test_decided_examples_are_not_attacked_again(rows) -> None:
    for name, norm in (("fgsm", "Linf"), ("pgd", "Linf"), ("pgd", "L2")):
        sweep = attack_rows(rows, name, norm)
        assert sweep[0]["n_attacked"] == sweep[0]["n_clean_correct"]
        for prev, cur in itertools.pairwise(sweep):
            assert cur["n_attacked"] == prev["n_robust"]


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
    assert zero["robust_acc"] == zero["clean_acc"] and zero["sanity_eps0_equals_clean"]


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
