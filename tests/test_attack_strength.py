"""Attacks that are strong enough, not merely valid: a PGD whose step ascends the wrong way, skips the
projection or the [0, 1] clip must fail here (tests/test_attacks.py checks validity: ball, box, seeds).

Two committed checkpoints (tests/data/attack_strength/README.md says how they were made) pin the
numbers, so a drift in the attacks or the probe fails a test:
- ``small_cnn_digits.safetensors``: tests/_models.py's small_cnn trained on digits (clean 255/256 on
  the fixed examples below), attacked directly;
- ``encoder/``: a convnet_small (width 4) trained by ``robustbench-nacl train``, probed and attacked
  by ``evaluate``.

Tolerances are counts of examples: another CPU (other SIMD kernels, another BLAS) rounds differently,
and an example at the decision boundary can flip, more often under a 10-step attack than on clean
inputs; they were not needed on the machine the pins were measured on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _models import digits_data, small_cnn
from safetensors.torch import load_file
from torch import Tensor, nn

import robustbench_nacl as rbn
from robustbench_nacl.attack import fgsm as fgsm_m
from robustbench_nacl.attack import pgd as pgd_m

DATA = Path(__file__).parent / "data" / "attack_strength"
#: robust accuracy of the committed classifier at this eps is between 20 and 80 %: an attack that does
#: nothing and one that breaks everything are both visible
EPS = 0.1
#: 10 steps of 0.025 go 2.5 eps away: without the projection the perturbation leaves the ball
PGD = {"steps": 10, "step_size": 0.025, "restarts": 1}
#: measured on the committed checkpoints (see the module docstring for the tolerances)
ROBUST_PINNED = 147  # of 256: native PGD (PGD, EPS, no random start) on the classifier
CLEAN_ENCODER, FGSM_ENCODER, PGD_ENCODER = 92, 61, 61  # of 180: probe, FGSM and PGD at 0.02 on the encoder
#: how many of the 256 examples two implementations of one attack may disagree on, each way
DISAGREE = 2


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def model() -> nn.Module:
    net = small_cnn()
    net.load_state_dict(load_file(DATA / "small_cnn_digits.safetensors"))
    return net.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def data() -> tuple[Tensor, Tensor]:
    _, _, x, y = digits_data()  # a fixed, seeded split
    return x[:256], y[:256]


def correct(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    with torch.no_grad():
        return model(x).argmax(1) == y


def test_the_committed_classifier_is_pinned(model, data) -> None:
    x, y = data
    assert abs(int(correct(model, x, y).sum()) - 255) <= 1
    adv = pgd_m.pgd(model, x, y, eps=EPS, random_start=False, early_stop=False, **PGD)
    assert abs(int(correct(model, adv, y).sum()) - ROBUST_PINNED) <= 3


def test_pgd_is_strictly_stronger_than_random_sign_noise_and_not_weaker_than_fgsm(model, data) -> None:
    x, y = data
    n = len(y)
    clean = int(correct(model, x, y).sum())
    signs = torch.randint(0, 2, x.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    noise = int(correct(model, (x + EPS * signs).clamp(0, 1), y).sum())
    fgsm = int(correct(model, fgsm_m.fgsm(model, x, y, eps=EPS), y).sum())
    for start in (True, False):  # the suites' random start, and none
        adv = pgd_m.pgd(model, x, y, eps=EPS, gen=torch.Generator().manual_seed(0), random_start=start, **PGD)
        pgd = int(correct(model, adv, y).sum())
        assert 0.2 * n <= pgd <= 0.8 * n, pgd  # the regime where strength shows
        assert pgd < noise - 10 and pgd <= fgsm and pgd < clean, (start, pgd, fgsm, noise, clean)


@pytest.mark.parametrize("direction", ["ours_only", "theirs_only"])
def test_native_pgd_equals_torchattacks_from_the_same_start(model, data, direction) -> None:
    """Both from the clean input (the same start), without early stop or restarts: the same algorithm,
    so the same examples are fooled, up to DISAGREE either way."""
    torchattacks = pytest.importorskip(
        "torchattacks", reason="torchattacks not installed (pip install 'robustbench-nacl[torchattacks]')"
    )
    x, y = data
    ours = pgd_m.pgd(model, x, y, eps=EPS, random_start=False, early_stop=False, **PGD)
    theirs = torchattacks.PGD(model, eps=EPS, alpha=PGD["step_size"], steps=PGD["steps"], random_start=False)(
        x, y
    )
    ok_ours, ok_theirs = correct(model, ours, y), correct(model, theirs, y)
    assert 0.2 * len(y) <= int(ok_theirs.sum()) <= 0.8 * len(y)
    only = ~ok_ours & ok_theirs if direction == "ours_only" else ok_ours & ~ok_theirs
    assert int(only.sum()) <= DISAGREE, (int(ok_ours.sum()), int(ok_theirs.sum()))


def test_the_committed_encoder_probed_and_attacked_is_pinned(tmp_path: Path) -> None:
    """``evaluate`` end to end (probe, FGSM, PGD) on a committed checkpoint: a drift in the probe or
    the attacks moves these counts."""
    suite = {
        "name": "strength",
        "attack": [
            {"name": "fgsm", "norm": "Linf", "eps": [0.02]},
            {"name": "pgd", "norm": "Linf", "eps": [0.02], **PGD},
        ],
    }
    rows = rbn.evaluate(
        DATA / "encoder",
        suite=suite,
        probe=rbn.ProbeConfig(epochs=300),
        out=tmp_path,
        progress=False,
    )
    got = {r["attack"]: r for r in rows}
    n = got["pgd"]["n_examples_evaluated"]
    count = {a: round(r["robust_acc"] * n) for a, r in got.items()}
    assert n == 180 and abs(round(got["pgd"]["clean_acc"] * n) - CLEAN_ENCODER) <= 3
    assert abs(count["fgsm"] - FGSM_ENCODER) <= 4 and abs(count["pgd"] - PGD_ENCODER) <= 4
    assert count["pgd"] <= count["fgsm"]
