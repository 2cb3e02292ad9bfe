"""AutoAttack runs through pinned pyautoattack, public API only, with the reference parameters.

The reference is Croce and Hein's code (github.com/fra31/auto-attack, autoattack/autoattack.py at
a39220048b3c: ``AutoAttack.__init__`` and ``set_version('standard')``), transcribed below; every
AutoAttack row records the implementation, its version and the settings each component ran with.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import pytest
import torch
from _models import digits_data
from torch import Tensor, nn

from robustbench_nacl.attack import autoattack_adapter as aa_m
from robustbench_nacl.attack import rng
from robustbench_nacl.attack.autoattack_adapter import AA_PINNED, autoattack_components
from robustbench_nacl.attack.base import ATTACKS
from robustbench_nacl.attack.threat import check_perturbation

ROOT = Path(__file__).resolve().parents[1]
EPS = 8 / 255

#: Croce & Hein's AutoAttack 'standard' for Linf/L2: the order of the attacks and the settings of
#: the object that runs each (constructor values, then set_version('standard'), then what
#: run_standard_evaluation sets just before the attack: apgd.loss, fab.targeted, fab.n_restarts).
REFERENCE_STANDARD = {
    "apgd-ce": (
        "apgd",
        {"loss": "ce", "n_iter": 100, "n_restarts": 1, "eot_iter": 1, "thr_decr": 0.75},
    ),
    "apgd-t": (
        "apgd_targeted",
        {
            "loss": "dlr-targeted",
            "n_iter": 100,
            "n_restarts": 1,
            "n_target_classes": 9,
            "eot_iter": 1,
            "thr_decr": 0.75,
        },
    ),
    "fab-t": (
        "fab",
        {
            "targeted": True,
            "n_iter": 100,
            "n_restarts": 1,
            "n_target_classes": 9,
            "alpha_max": 0.1,
            "eta": 1.05,
            "beta": 0.9,
        },
    ),
    "square": (
        "square",
        {"n_queries": 5000, "p_init": 0.8, "n_restarts": 1, "loss": "margin", "rescale_schedule": False},
    ),
}
ORDER = ["apgd-ce", "apgd-t", "fab-t", "square"]


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def clean(model: nn.Module) -> tuple[Tensor, Tensor]:
    """A few test digits the model classifies correctly (AutoAttack attacks only those)."""
    _, _, x, y = digits_data()
    with torch.no_grad():
        ok = model(x).argmax(1) == y
    return x[ok][:4], y[ok][:4]


def _record_components(monkeypatch: pytest.MonkeyPatch, run_original: bool) -> list[tuple[str, dict]]:
    """Patch each component's ``perturb`` to record its settings when AutoAttack calls it."""
    import pyautoattack.autoattack as aa_module

    calls: list[tuple[str, dict]] = []
    for cls_name, attr in (
        ("APGDAttack", "apgd"),
        ("APGDAttack_targeted", "apgd_targeted"),
        ("FABAttack_PT", "fab"),
        ("SquareAttack", "square"),
    ):
        cls = getattr(aa_module, cls_name)
        original = cls.perturb

        def perturb(self, x, y, *args, _attr=attr, _original=original, **kw):
            calls.append((_attr, {**vars(self)}))
            return _original(self, x, y, *args, **kw) if run_original else x.clone()

        monkeypatch.setattr(cls, "perturb", perturb)
    return calls


def test_standard_runs_the_four_attacks_with_the_reference_parameters(model, clean, monkeypatch) -> None:
    calls = _record_components(monkeypatch, run_original=False)  # nothing fooled: all four run
    x, y = clean
    gen = torch.Generator().manual_seed(3)
    expected_seed = rng.seed_from(torch.Generator().manual_seed(3))
    x_adv = aa_m.autoattack(model, x, y, eps=EPS, gen=gen, norm="Linf", version="standard", num_classes=10)
    assert torch.equal(x_adv, x)
    assert [attr for attr, _ in calls] == [REFERENCE_STANDARD[a][0] for a in ORDER]
    for name, (_, seen) in zip(ORDER, calls, strict=True):
        want = REFERENCE_STANDARD[name][1]
        assert {k: seen[k] for k in want} == want, name
        assert seen["eps"] == EPS and seen["norm"] == "Linf" and seen["seed"] == expected_seed, name


def test_a_real_standard_run_calls_every_component_and_stays_in_the_ball(model, clean, monkeypatch) -> None:
    calls = _record_components(monkeypatch, run_original=True)
    x, y = clean
    eps = 1e-3  # too small to fool anything: every component runs on every example
    x_adv = aa_m.autoattack(model, x, y, eps=eps, gen=torch.Generator().manual_seed(0), version="standard")
    assert [attr for attr, _ in calls] == [REFERENCE_STANDARD[a][0] for a in ORDER]
    check_perturbation(x, x_adv, eps, "Linf")


def test_rows_record_the_settings_that_ran_and_the_implementation(model, clean, monkeypatch) -> None:
    import pyautoattack

    described = ATTACKS.info("autoattack")["describe"]({"version": "standard"}, 10)
    assert described["implementation"] == "pyautoattack"
    assert described["implementation_version"] == importlib.metadata.version("pyautoattack")
    assert described["attacks_run"] == ORDER and described["n_target_classes"] == 9
    ran = {}

    def spy(self, x, y, *, batch_size=250, state_path=None):
        ran.update(autoattack_components(self))
        return x.clone(), y.clone()

    monkeypatch.setattr(pyautoattack.AutoAttack, "run_standard_evaluation", spy)
    x, y = clean
    aa_m.autoattack(model, x, y, eps=EPS, gen=torch.Generator().manual_seed(0), version="standard")
    assert ran == described["components"]
    for name in ORDER:  # and what is recorded is the reference
        want = {("rho" if k == "thr_decr" else k): v for k, v in REFERENCE_STANDARD[name][1].items()}
        assert {k: described["components"][name][k] for k in want} == want, name


def test_fewer_classes_cap_the_targets_in_what_runs_and_what_is_recorded(model, clean, monkeypatch) -> None:
    calls = _record_components(monkeypatch, run_original=False)
    x, y = clean
    aa_m.autoattack(
        model, x, y, eps=EPS, gen=torch.Generator().manual_seed(0), version="standard", num_classes=5
    )
    assert {attr: seen["n_target_classes"] for attr, seen in calls if "n_target_classes" in seen} == {
        "apgd_targeted": 4,
        "fab": 4,
    }
    described = ATTACKS.info("autoattack")["describe"]({"version": "standard"}, 5)
    assert described["components"]["apgd-t"]["n_target_classes"] == 4


def test_only_public_pyautoattack_api_is_used() -> None:
    """No private member of a pyautoattack object (such as ``_set_version``) is touched."""
    tree = ast.parse((ROOT / "robustbench_nacl" / "attack" / "autoattack_adapter.py").read_text())
    private = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and ast.unparse(node.value).split(".")[0] in ("aa", "AutoAttack", "pyautoattack")
    ]
    assert private == []


def test_pyautoattack_is_pinned_and_the_pin_is_installed() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    pins = re.findall(r'"pyautoattack([^";]*)', pyproject)
    assert pins == [f"=={AA_PINNED}"], pins
    assert importlib.metadata.version("pyautoattack") == AA_PINNED
