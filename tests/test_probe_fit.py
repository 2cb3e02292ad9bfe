"""A fitted probe, checked (issue 21): ``ProbeConfig.standardize`` (features standardised for the fit,
folded into the head so the attacked classifier is unchanged in function), its opt-in from zoo
manifests and the CLI, the identity of default-probe rows left byte-identical, and where the
``probe_underfit`` flag applies (it is made to fire through ``evaluate`` in test_sanity_flags.py)."""

from __future__ import annotations

import argparse
import json
import math
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _models import Normalize, one_thread
from torch import Tensor, nn

from robustbench_nacl import cli as cli_module
from robustbench_nacl.data import load_dataset, parse_spec
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig, fit_linear_probe, fold_standardization
from robustbench_nacl.eval.sanity import PROBE_UNDERFIT_GAP, add_flags, check_alf_fit, check_probe_fit
from robustbench_nacl.eval.settings import IdentityFields, Setting
from robustbench_nacl.models.features import feature_scaler
from robustbench_nacl.results.finetune import AlfConfig
from robustbench_nacl.results.rows import load_rows, protocol_id, protocol_name, row_id
from robustbench_nacl.zoo import load_zoo
from robustbench_nacl.zoo.manifests import parse_entry

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = [  # the reference's rows (one file each) and the published demo set's (one row pack)
    ROOT / "leaderboard",
    ROOT / "robustbench_nacl" / "files" / "published" / "demo",
]
SUITE = {"name": "fit-test", "attack": [{"name": "fgsm", "eps": [0.05]}]}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


class Scaled(nn.Module):
    """A small conv encoder whose feature dimensions come out at scales from 1e-3 to 10 (and one
    dead unit): a raw-feature probe at the paper's lr moves the small ones too slowly."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            Normalize(0.3, 0.4),
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        scale = torch.logspace(-3, 1, 32)[torch.randperm(32, generator=torch.Generator().manual_seed(1))]
        scale[0] = 0.0  # a dead unit: constant on every split, left unscaled by the standardisation
        self.register_buffer("scale", scale)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * self.scale


def test_the_folded_head_on_raw_features_gives_the_standardised_logits() -> None:
    g = torch.Generator().manual_seed(0)
    # post-ReLU features at scales from 1e-3 to 10, one of them constant (its std is 0, its scale 1)
    f = torch.randn(300, 16, generator=g).relu() * torch.logspace(-3, 1, 16)
    f[:, 3] = 2.5
    head = nn.Linear(16, 4)
    mean, scale = feature_scaler(f[:200])  # the training split's statistics, applied to every split
    assert scale[3] == 1.0 and torch.all(scale[torch.arange(16) != 3] < 20)
    with torch.no_grad():
        want = head((f - mean) / scale)
        fold_standardization(head, mean, scale)
        got = head(f)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_standardised_probe_fits_badly_scaled_features_and_attacks_the_raw_encoder() -> None:
    train, test = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    _, raw = fit_linear_probe(Scaled(), train, test, ProbeConfig(epochs=100))
    std_clf, std = fit_linear_probe(Scaled(), train, test, ProbeConfig(epochs=100, standardize=True))
    assert std.knn_acc == raw.knn_acc  # kNN on the raw features: the option changes the probe only
    assert raw.knn_acc - raw.train_acc > PROBE_UNDERFIT_GAP >= std.knn_acc - std.train_acc
    assert std.config["standardize"] is True and "standardize" not in raw.config
    # the attacked model is encoder -> folded head on raw features: its accuracy end to end is the
    # reported one, and its last epoch's test accuracy inside the fit (on standardised features) too
    with torch.no_grad():
        e2e = float((std_clf(test.x.float() / 255).argmax(1) == test.y).float().mean())
    assert abs(e2e - std.test_acc) <= 1 / len(test)
    _, one = fit_linear_probe(Scaled(), train, test, ProbeConfig(epochs=1, standardize=True))
    assert one.best_test_acc == one.test_acc  # one epoch: the fit's (standardised) number is the folded one's


def test_standardize_must_be_a_bool() -> None:
    with pytest.raises(UserError, match="probe standardize 1: must be true or false"):
        ProbeConfig(standardize=1).check()  # type: ignore[arg-type]


def test_default_probe_config_is_what_rows_recorded_before_and_standardize_is_another_protocol() -> None:
    base = ProbeConfig(seed=2, max_train=4096, epochs=100).as_dict()
    assert list(base) == ["epochs", "lr", "batch_size", "weight_decay", "seed", "max_train", "knn_k", "knn_t"]
    on = ProbeConfig(seed=2, max_train=4096, epochs=100, standardize=True).as_dict()
    assert on == {**base, "standardize": True}
    row = json.loads(next((ROOT / "leaderboard" / "rows").glob("*.json")).read_text())
    assert protocol_id({**row, "probe_config": on}) != row["protocol_id"] == protocol_id(row)


def _identity_of(row: dict) -> dict:
    """A committed row's identity computed again by this code: its probe_config through ProbeConfig."""
    setting = Setting(
        row["setting"],
        parse_spec(row["dataset"]),
        row.get("shift"),
        row.get("corruption"),
        row.get("severity"),
    )
    probe = ProbeConfig(**row["probe_config"])
    fields = IdentityFields(
        row["checkpoint_sha256"],
        row["seed"],
        row["n_examples"],
        probe,
        row["attack_versions"],
        row.get("finetune"),
    )
    suite = types.SimpleNamespace(sha256=row["suite_sha256"])
    ident = fields.row(
        setting, suite, attack=row["attack"], norm=row["norm"], params=row["attack_params"], eps=row["eps"]
    )
    return {**row, **ident}


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_committed_rows_keep_their_row_and_protocol_ids(folder: Path) -> None:
    rows = [r.to_json() for r in load_rows(folder)]
    assert len(rows) > 4
    for row in rows:
        again = _identity_of(row)
        assert again["probe_config"] == row["probe_config"], row["row_id"]
        assert (row_id(again), protocol_id(again)) == (row["row_id"], row["protocol_id"])


def test_zoo_manifests_opt_in_and_default_entries_keep_their_probe() -> None:
    from robustbench_nacl.pipeline import eval_arguments

    entry = load_zoo("paper")[0]  # the reference (fashion-mnist) zoo opts in since its regeneration
    default = eval_arguments(entry)["probe"]
    assert default.standardize is False and "standardize" not in default.as_dict()
    data = {**entry.to_dict(), "eval": {**entry.eval, "probe_standardize": True}}
    opted = parse_entry(json.loads(json.dumps(data)), "test.json")
    assert eval_arguments(opted)["probe"] == ProbeConfig(**{**vars(default), "standardize": True})
    with pytest.raises(UserError, match=r"eval\.probe_standardize has the wrong type"):
        parse_entry({**data, "eval": {**entry.eval, "probe_standardize": "yes"}}, "test.json")


def test_the_cli_flag_sets_it() -> None:
    parser = cli_module.build_parser()
    args = parser.parse_args(["eval", "ckpt", "--probe-standardize"])
    assert ProbeConfig(**cli_module.config_values(ProbeConfig, args, prefix="probe-")).standardize is True
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flag = next(a for a in sub.choices["eval"]._actions if "--probe-standardize" in a.option_strings)
    assert flag.default is False and "folded into the head" in flag.help  # the field's comment


def test_the_flag_applies_to_slf_rows_only() -> None:
    """ALF trains its head on adversarial examples: its clean train accuracy sits below clean kNN by
    design, so ``probe_underfit`` is None there; SLF rows carry it (True or False), with the numbers.
    The checks of a finetuned head (``alf_underfit``, ``finetune_above_chance``) are the other way
    round: on ALF rows, with the SLF reference they compare against, and None on SLF rows."""
    torch.manual_seed(0)
    enc = nn.Sequential(
        Normalize(0.3, 0.4), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()
    )
    kw = dict(dataset="digits:0-4", suite=SUITE, n_examples=12, probe=ProbeConfig(epochs=3, max_train=60))
    rows = evaluate(
        enc, protocol="slf,alf", alf=AlfConfig(epochs=1, batch_size=4000, steps=1), progress=False, **kw
    )
    by = {p: [r for r in rows if protocol_name(r) == p] for p in ("slf", "alf")}
    assert by["slf"] and by["alf"]
    assert all(r["sanity_probe_underfit"] is None for r in by["alf"])
    for r in by["alf"]:
        assert r["sanity_alf_underfit"] is check_alf_fit(r["probe_train_acc"], r["slf_train_acc"])
        assert r["sanity_alf_underfit"] in (True, False) and r["sanity_finetune_above_chance"] in (
            True,
            False,
        )
    assert all(r.get("sanity_alf_underfit") is None for r in by["slf"])
    assert all(r.get("sanity_finetune_above_chance") is None for r in by["slf"])
    assert all("slf_train_acc" not in r for r in by["slf"])
    for r in by["slf"]:
        assert r["sanity_probe_underfit"] is check_probe_fit(r["probe_train_acc"], r["knn_acc"])
        assert r["sanity_probe_underfit"] in (True, False)


def test_check_probe_fit_threshold_and_summary() -> None:
    assert check_probe_fit(0.60, 0.70) is True  # exactly 10 points below: passes
    assert check_probe_fit(0.599, 0.70) is False
    assert check_probe_fit(math.nan, 0.70) is None
    fgsm = {"attack_family": "single_step", "sanity_ok": True, "sanity_monotone_in_eps": False}
    pgd = {"attack_family": "iterative", "sanity_ok": True, "sanity_deterministic": True}
    add_flags([fgsm, pgd], {"sanity_probe_underfit": False})
    assert (fgsm["sanity_failed"], fgsm["sanity_warnings"]) == ("probe_underfit", "monotone_in_eps")
    assert (pgd["sanity_ok"], pgd["sanity_failed"]) == (False, "probe_underfit")
    with pytest.raises(ValueError, match="not sanity flags"):
        add_flags([pgd], {"sanity_nonsense": True})
