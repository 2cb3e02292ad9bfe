"""Evaluation integrity, end to end: broken models raise the flags meant for them in the rows
``benchmark``/``evaluate`` write, attacks stay in the threat model and run on the full image ->
logits pipeline (never on cached features), and a row carries what it takes to reproduce it.

Proven elsewhere and not repeated here:
- every sanity flag fires through ``evaluate`` on a broken encoder or a weak attack, and a sound
  checkpoint raises none: test_sanity_flags.py
- input quantisation -> zero-gradient and unbounded flags:
  test_sanity.py::test_gradient_masked_model_is_flagged
- a constant classifier fails "unbounded eps reaches 0" and "clean above chance":
  test_sanity.py::test_constant_classifier_fails_chance_and_unbounded
- the per-model check functions on BN-in-train-mode, randomized and softmax models: test_sanity.py
- AutoAttack benchmark rows identical on repeat with a fixed seed:
  test_benchmark.py::test_autoattack_rows_identical_on_repeat
- eps 0 reproduces clean, PGD <= FGSM, FGSM rows equal independent per-eps FGSM: test_benchmark.py;
  check_perturbation on every batch of run_attack:
  test_attacks.py::test_check_perturbation_is_called_on_every_batch
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _models import digits_data, digits_model, one_thread, small_cnn
from _reliability import TINY
from torch import Tensor, nn

from robustbench_nacl.attack import base as attacks
from robustbench_nacl.attack.rng import derive_seed
from robustbench_nacl.attack.suites import load_suite
from robustbench_nacl.errors import SanityError, UserError
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig, ProbedClassifier
from robustbench_nacl.eval.sanity import noise_accuracy
from robustbench_nacl.io import sha256_file
from robustbench_nacl.models.foreign import load_encoder
from robustbench_nacl.results.bits import decode_bits
from robustbench_nacl.training import train

BENCH = sys.modules[
    "robustbench_nacl.eval.benchmark"
]  # the module: the package rebinds the name to the function
SUITE = {
    "attack": [
        {"name": "fgsm", "norm": "Linf", "eps": [0.05, 0.3, 0.5]},
        {"name": "pgd", "norm": "Linf", "eps": [0.05, 0.3, 0.5], "steps": 5, "step_size": 0.1},
    ]
}
QUICK = {"n_examples": 40, "probe": ProbeConfig(epochs=30, lr=1e-2), "progress": False}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def data() -> tuple[Tensor, Tensor]:
    _, _, x, y = digits_data()
    return x[:200], y[:200]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(TINY, tmp_path_factory.mktemp("ckpt") / "run", progress=False)


class Wrap(nn.Module):
    def __init__(self, inner: nn.Module, fn) -> None:
        super().__init__()
        self.inner, self.fn = inner, fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(self.inner, x)


class StuckInTrainMode(nn.Module):
    """A model whose ``eval()`` does not reach its BatchNorm (a custom ``train`` that forgets children)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net.train()

    def train(self, mode: bool = True) -> StuckInTrainMode:
        self.training = mode
        return self

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def _run(model: nn.Module, data) -> list[dict[str, Any]]:
    x, y = data
    return BENCH.benchmark(model, x, y, SUITE, seed=0, progress=False)


def _failed(rows: list[dict[str, Any]]) -> set[str]:
    return {f for r in rows for f in r["sanity_failed"].split(",") if f}


def test_sound_model_raises_no_flag_and_stays_below_sign_noise(data) -> None:
    """The control for the fixtures below, and: robust accuracy never exceeds the accuracy under
    random sign noise of the same eps, which is what each row records as ``sanity_noise_acc``:
    the fraction of examples correct both clean and under the noise, like robust accuracy."""
    x, y = data
    model = digits_model()
    rows = _run(model, data)
    assert all(r["sanity_ok"] for r in rows), _failed(rows)
    clean = torch.from_numpy(decode_bits(rows[0]["clean_bits"], len(x)))
    for r in rows:
        assert r["robust_acc"] <= r["sanity_noise_acc"] and r["sanity_attack_beats_noise"]
        gen = torch.Generator().manual_seed(derive_seed(0, "noise", r["norm"], r["eps"]))
        noise = noise_accuracy(model, x[clean], y[clean], r["eps"], gen)  # sign noise, same eps
        assert r["sanity_noise_acc"] == noise * int(clean.sum()) / len(x)


def test_input_quantising_model_is_weaker_than_noise_and_flagged(data) -> None:
    rows = _run(Wrap(digits_model(), lambda m, x: m(torch.round(x * 3) / 3)).eval(), data)
    big = [r for r in rows if r["eps"] >= 0.3]
    assert all(r["robust_acc"] > r["sanity_noise_acc"] for r in big)  # the attacks failed, noise did not
    assert not any(r["sanity_attack_beats_noise"] or r["sanity_ok"] for r in big)
    assert {"attack_beats_noise", "nonzero_gradients", "unbounded_reaches_zero"} <= _failed(rows)


def test_softmax_output_is_refused(data) -> None:
    """Attacks on probabilities overstate robustness: no row is produced, a one-line UserError is."""
    with pytest.raises(UserError, match="returns probabilities") as e:
        _run(Wrap(digits_model(), lambda m, x: m(x).softmax(-1)).eval(), data)
    assert "\n" not in str(e.value)


def test_batchnorm_left_in_train_mode_fails_batch_independence(data) -> None:
    torch.manual_seed(0)
    rows = _run(StuckInTrainMode(small_cnn(bn=True)), data)
    assert all(not r["sanity_batch_independent"] and not r["sanity_eval_mode"] for r in rows)
    assert not any(r["sanity_ok"] for r in rows)


def test_randomized_model_is_flagged(data) -> None:
    gen = torch.Generator().manual_seed(0)
    noisy = Wrap(digits_model(), lambda m, x: m(x) + 0.5 * torch.randn(len(x), 10, generator=gen)).eval()
    rows = _run(noisy, data)
    assert all(not r["sanity_deterministic"] and not r["sanity_ok"] for r in rows)


def _rogue(kind: str):
    def attack(model, x, y, *, eps, gen, norm, **_):
        if kind == "ball":  # 1.5 eps away, clamped to the image box
            return (x + 1.5 * eps * torch.sign(torch.randn(x.shape, generator=gen))).clamp(0, 1)
        return x + eps  # inside the ball, but above 1 where x is white

    return attack


@pytest.mark.parametrize(
    ("kind", "match"), [("ball", "left the Linf ball"), ("box", r"left the \[0,1\] image box")]
)
def test_an_attack_leaving_the_threat_model_is_an_error_not_a_number(
    kind: str, match: str, data, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(attacks.ATTACKS._items, "rogue", _rogue(kind))
    monkeypatch.setitem(
        attacks.ATTACKS._info, "rogue", {"norms": ("Linf",), "params": {}, "family": "iterative"}
    )
    x, y = data
    with pytest.raises(SanityError, match=match):
        BENCH.benchmark(digits_model(), x, y, {"attack": [{"name": "rogue", "eps": [0.05]}]}, progress=False)


def test_attacks_see_pixels_through_the_whole_pipeline_never_cached_features(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spy on every attack call of an evaluation: the model is the probed classifier (normalisation
    -> encoder -> linear head) of the checkpoint's encoder, and the attack's gradients flow from
    [0,1] images of the dataset's shape through the encoder, not from the cached features."""
    calls: list[dict[str, Any]] = []
    real = BENCH.robust_under_attack
    encoder, _ = load_encoder(ckpt)
    reference = encoder.state_dict()

    def spy(name, model, x, y, eps, **kw):
        assert isinstance(model, ProbedClassifier) and not model.training
        assert all(torch.equal(v, reference[k]) for k, v in model.encoder.state_dict().items())
        seen = []
        hooks = [
            model.encoder.register_forward_pre_hook(lambda m, a: seen.append(("encoder", a[0]))),
            model.head.register_forward_pre_hook(lambda m, a: seen.append(("head", a[0]))),
        ]
        try:
            out = real(name, model, x, y, eps, **kw)
        finally:
            for h in hooks:
                h.remove()
        enc = [t for who, t in seen if who == "encoder"]
        calls.append(
            {
                "name": name,
                "x": tuple(x.shape),
                "range": (float(x.min()), float(x.max())),
                "encoder_inputs": {tuple(t.shape[1:]) for t in enc},
                "grad_through_encoder": any(t.requires_grad for t in enc),
                "head_inputs": {tuple(t.shape[1:]) for who, t in seen if who == "head"},
                "n_heads": sum(who == "head" for who, _ in seen),
                "n_encoders": len(enc),
            }
        )
        return out

    monkeypatch.setattr(BENCH, "robust_under_attack", spy)
    rows = evaluate(ckpt, suite="quick", out=tmp_path, **QUICK)
    assert rows and calls
    feature_dim = encoder(torch.rand(1, 1, 8, 8)).shape[1]
    for c in calls:
        assert len(c["x"]) == 4 and c["x"][1:] == (1, 8, 8), c  # images, not (N, feature_dim) features
        assert c["range"][0] >= 0.0 and c["range"][1] <= 1.0  # pixels, not normalised tensors
        assert c["encoder_inputs"] == {(1, 8, 8)} and c["head_inputs"] == {(feature_dim,)}
        assert c["n_heads"] == c["n_encoders"] > 0  # every head call went through the encoder first
        assert c["grad_through_encoder"], c  # the attack differentiates through the encoder
    assert {c["name"] for c in calls} >= {"fgsm", "pgd"}


VOLATILE = {"created_at", "wall_s", "setup_wall_s", "probe_wall_s"}


def _reproduce(row: dict[str, Any], out: Path) -> dict[str, Any]:
    """Recompute a row from nothing but its own fields."""
    where = {"transfer": row["dataset"]} if row["setting"] == "transfer" else {"dataset": row["dataset"]}
    rows = evaluate(
        row["checkpoint"],
        suite=row["suite"],
        seed=row["seed"],
        n_examples=row["n_examples"],
        probe=ProbeConfig(**row["probe_config"]),
        out=out,
        progress=False,
        **where,
    )
    return next(r for r in rows if r["row_id"] == row["row_id"])


def test_a_row_alone_reproduces_itself(ckpt: Path, tmp_path: Path) -> None:
    """Everything needed to recompute a row is in it: checkpoint (path and sha256), suite (name and
    sha256), setting, dataset, n examples, seed, probe config; plus versions and device."""
    probe = ProbeConfig(epochs=30, lr=1e-2, seed=5)
    rows = evaluate(
        ckpt, transfer="digits:5-9", suite="quick", out=tmp_path / "a", n_examples=40, seed=3, probe=probe,
        progress=False,
    )  # fmt: skip
    for row in rows:
        assert row["checkpoint_sha256"] == sha256_file(Path(row["checkpoint"]) / "weights.safetensors")
        assert row["suite_sha256"] == load_suite(row["suite"]).sha256
        assert set(row["versions"]) >= {"robustbench_nacl", "torch", "python"}
        assert row["device"].startswith("cpu") and row["n_examples"] == row["n_examples_evaluated"] == 40
        assert row["seed"] == 3 and row["probe_config"]["seed"] == 5
    for setting in ("in-domain", "transfer"):
        row = next(r for r in rows if r["setting"] == setting and r["attack"] == "pgd")
        again = _reproduce(row, tmp_path / setting)
        assert {k: v for k, v in again.items() if k not in VOLATILE} == {
            k: v for k, v in row.items() if k not in VOLATILE
        }


def test_random_init_control_rows_name_the_architecture_dataset_and_seed(ckpt: Path, tmp_path: Path) -> None:
    rows = evaluate(ckpt, suite="quick", out=tmp_path, control=True, seed=2, **QUICK)
    assert {r["checkpoint_id"] for r in rows} == {"convnet_small.random-init_digits-0-4_s2"}
    assert all(r["control"] and r["loss"] == "random-init" and r["seed"] == 2 for r in rows)


@pytest.mark.slow
def test_autoattack_rows_written_by_evaluate_are_identical_on_repeat(ckpt: Path, tmp_path: Path) -> None:
    suite = {
        "attack": [{"name": "autoattack", "eps": ["8/255"], "version": "custom", "attacks": ["apgd-ce"]}]
    }
    a = evaluate(ckpt, suite=suite, out=tmp_path / "a", seed=11, **QUICK)
    b = evaluate(ckpt, suite=suite, out=tmp_path / "b", seed=11, **QUICK)
    # AutoAttack's per-component wall times are timings too; its forwards, seeds and chunks are not
    strip = lambda rows: [  # noqa: E731
        {k: v for k, v in r.items() if k not in VOLATILE and not k.startswith("aa_wall_s_")} for r in rows
    ]
    assert strip(a) == strip(b) and a[0]["attack"] == "autoattack"
    assert a[0]["attack_config"]["attacks_run"] == ["apgd-ce"]
