"""Every sanity flag can fire, and fires through the real path: ``robustbench_nacl.evaluate`` on a
checkpoint directory written by ``train``, probed and attacked end to end.

One tiny convnet_small checkpoint is trained; each broken variant is a copy of it whose manifest
names an encoder registered by this file: the same weights under a different ``forward`` (noise,
batch statistics, an ``eval()`` that does not reach a submodule, input quantisation, a collapsed
output, a quantising defence that engages above a noise threshold). A weak attack configuration
on the sound checkpoint covers the cross-row flags, and a linear probe stopped early (the paper's
lr for 100 epochs) covers ``probe_underfit``; under ALF, the collapsed encoder covers
``finetune_above_chance`` and a one-step ALF head ``alf_underfit``. The sound checkpoint under the
same suites (and a fitted ALF head) is the control: it raises no flag, so each firing flag is
caused by what its variant breaks.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from _models import one_thread
from _reliability import TINY
from torch import Tensor, nn

from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.eval.sanity import ALF_UNDERFIT_GAP, FLAGS
from robustbench_nacl.models.encoders import ENCODERS, Encoder
from robustbench_nacl.results.finetune import AlfConfig
from robustbench_nacl.training import train

QUICK = {"n_examples": 180, "progress": False}
# the probe of every case (fitted: lr 1e-2), and the paper's lr 3e-4 stopped after 100 epochs, which
# leaves the tiny checkpoint's probe about 15 points below kNN in train accuracy; standardising the
# features (same epochs and lr) fits it to within about 3 points
PROBES = {
    "fitted": ProbeConfig(epochs=30, lr=1e-2),
    "short": ProbeConfig(epochs=100, lr=3e-4),
    "short_standardized": ProbeConfig(epochs=100, lr=3e-4, standardize=True),
}

# Digits pixels take 17 levels round(k * 255 / 16) / 255, about 1/16 apart: snapping an image back
# onto them undoes any perturbation below ~0.029. The snapping defence engages above SNAP_AT.
SNAP_AT, EPS_BELOW, EPS_ABOVE = 0.02, 0.018, 0.027
# AutoAttack's Square check: a budget at which the quantising encoder's masked gradients leave APGD
# examples that Square (no gradients) then fools
AA_EPS = 0.1
SUITES: dict[str, dict[str, Any]] = {
    "sweep": {
        "attack": [
            {"name": "fgsm", "eps": [EPS_BELOW, EPS_ABOVE]},
            {"name": "pgd", "eps": [EPS_BELOW, EPS_ABOVE], "steps": 10, "step_size": 0.005},
        ]
    },
    # a PGD that barely moves (one step of 0.001, no random start) at a large eps ...
    "weak": {
        "attack": [
            {"name": "fgsm", "eps": [0.3]},
            {"name": "pgd", "eps": [0.3], "steps": 1, "step_size": 0.001, "random_start": False},
        ]
    },
    # AutoAttack with its first gradient attack and Square (AutoAttack's own Square check)
    "aa": {
        "attack": [
            {"name": "autoattack", "eps": [AA_EPS], "version": "custom", "attacks": ["apgd-ce", "square"]}
        ]
    },
    # AutoAttack screening: FAB-T and Square on a sample of the APGD survivors (all of them here)
    "screen": {"attack": [{"name": "autoattack", "eps": [AA_EPS], "version": "screen"}]},
    # ... and its control: a PGD that can use the ball
    "strong": {
        "attack": [
            {"name": "fgsm", "eps": [0.3]},
            {"name": "pgd", "eps": [0.3], "steps": 10, "step_size": 0.05},
        ]
    },
}


def _snap(x: Tensor) -> Tensor:
    return torch.round(torch.round(x * 16) * 255 / 16) / 255


class Noisy(Encoder):
    """Randomized: Gaussian noise on the features at every call."""

    def forward(self, x: Tensor) -> Tensor:
        h = super().forward(x)
        return h + 0.5 * torch.randn_like(h)


class BatchCentred(Encoder):
    """Batch statistics in eval mode: features centred on the mean of the batch they arrive in."""

    def forward(self, x: Tensor) -> Tensor:
        h = super().forward(x)
        return h - h.mean(0, keepdim=True)


class IgnoresEval(Encoder):
    """A ``train()`` override that forgets a child: ``eval()`` leaves the dropout active."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.drop = nn.Dropout(0.2)

    def train(self, mode: bool = True) -> IgnoresEval:
        self.training = mode
        self.backbone.train(mode)
        return self

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(super().forward(x))


class Quantising(Encoder):
    """Input rounded to 4 levels: accurate, with an all-zero input gradient everywhere."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(torch.round(x * 3) / 3)


class Collapsed(Encoder):
    """The same features whatever the input."""

    def forward(self, x: Tensor) -> Tensor:
        return self.mean.new_ones(len(x), self.feature_dim)


class Snapping(Encoder):
    """A quantising defence that engages only when some pixel is more than SNAP_AT off the pixel
    levels: below that the encoder is attackable; above it the image is snapped back to the clean
    one (zero gradient). Attacks therefore succeed at EPS_BELOW and fail at EPS_ABOVE."""

    def forward(self, x: Tensor) -> Tensor:
        s = _snap(x)
        engaged = (x - s).abs().flatten(1).amax(1) > SNAP_AT
        return torch.where(engaged[:, None], super().forward(s), super().forward(x))


BROKEN = {
    cls.__name__.lower(): cls for cls in (Noisy, BatchCentred, IgnoresEval, Quantising, Collapsed, Snapping)
}

# flag -> (encoder variant, suite, the rows it must fail in: "all" or "attack@eps")
CASES: dict[str, tuple[str, str, str]] = {
    "deterministic": ("noisy", "sweep", "all"),
    "batch_independent": ("batchcentred", "sweep", "all"),
    "eval_mode": ("ignoreseval", "sweep", "all"),
    "nonzero_gradients": ("quantising", "sweep", "all"),
    "unbounded_reaches_zero": ("quantising", "sweep", "all"),
    "clean_above_chance": ("collapsed", "sweep", "all"),
    "monotone_in_eps": ("snapping", "sweep", f"pgd@{EPS_ABOVE}"),
    "le_single_step": ("convnet_small", "weak", "pgd@0.3"),
    "attack_beats_noise": ("convnet_small", "weak", "pgd@0.3"),
    "square_adds_nothing": ("quantising", "aa", f"autoattack@{AA_EPS}"),
    "screen_found_nothing": ("quantising", "screen", f"autoattack@{AA_EPS}"),
    "probe_underfit": ("convnet_small", "strong", "all"),
    "finetune_above_chance": ("collapsed", "strong", "all"),
    "alf_underfit": ("convnet_small", "strong", "all"),
}
# the cases evaluated with another probe than "fitted"
CASE_PROBE = {"probe_underfit": "short"}
# ALF on 256 training images, a one-epoch recipe at batch 256 (two-step PGD): fitted, it keeps the
# recipe's 196 SGD steps (one batch an epoch) on standardised features; as configured ("off"), it is
# one SGD step, which leaves the head's clean train accuracy far below the SLF probe's
ALFS = {
    "fitted": AlfConfig(epochs=1, batch_size=256, steps=2, max_train=256),
    "short": AlfConfig(epochs=1, batch_size=256, steps=2, max_train=256, fit="off"),
}
# the cases evaluated under ALF (their rows: the ALF rows alone), and with which ALF
CASE_ALF = {"finetune_above_chance": "fitted", "alf_underfit": "short"}
# flags that apply to AutoAttack rows only, and to finetuned (ALF) rows only
AA_ONLY = {"square_adds_nothing", "screen_found_nothing"}
FINETUNED_ONLY = {"finetune_above_chance", "alf_underfit"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", autouse=True)
def _broken_encoders():
    """Register the broken encoders for this module only (same weights as convnet_small)."""
    base = ENCODERS.get("convnet_small")

    def factory(cls: type[Encoder]):
        def make(*, in_channels=3, mean=(0.5,), std=(0.5,), input_shape=None, width=32) -> Encoder:
            net = base(in_channels=in_channels, mean=mean, std=std, input_shape=input_shape, width=width)
            return cls(
                net.backbone,
                net.feature_dim,
                in_channels=in_channels,
                mean=mean,
                std=std,
                input_shape=input_shape,
            )

        return make

    with pytest.MonkeyPatch.context() as mp:
        for name, cls in BROKEN.items():
            mp.setitem(ENCODERS._items, name, factory(cls))
            mp.setitem(ENCODERS._info, name, {"description": f"test: {cls.__doc__}", "input": "images"})
        yield


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(TINY, tmp_path_factory.mktemp("ckpt") / "run", progress=False)


@pytest.fixture(scope="module")
def evaluated(ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    """``(encoder, suite, probe, alf) -> rows`` of ``evaluate``, each computed once for the module
    (``alf``: an ``ALFS`` name, the rows of protocol ALF; None: SLF)."""
    cache: dict[tuple[str, str, str, str | None], list[dict[str, Any]]] = {}
    root = tmp_path_factory.mktemp("variants")

    def rows(encoder: str, suite: str, probe: str = "fitted", alf: str | None = None) -> list[dict[str, Any]]:
        if (encoder, suite, probe, alf) not in cache:
            path = ckpt
            if encoder != TINY.encoder:
                path = root / encoder
                if not path.exists():
                    shutil.copytree(ckpt, path)
                    manifest = json.loads((path / "manifest.json").read_text())
                    manifest["encoder"] = encoder
                    (path / "manifest.json").write_text(json.dumps(manifest))
            out = root / f"rows-{encoder}-{suite}-{probe}-{alf}"
            protocol = {} if alf is None else {"protocol": "alf", "alf": ALFS[alf]}
            rows = evaluate(path, suite=SUITES[suite], out=out, probe=PROBES[probe], **protocol, **QUICK)
            cache[(encoder, suite, probe, alf)] = list(rows)
        return cache[(encoder, suite, probe, alf)]

    return rows


def test_every_flag_has_a_case_that_makes_it_fire() -> None:
    assert set(CASES) == set(FLAGS)


@pytest.mark.parametrize("suite", ["sweep", "strong", "aa"])
def test_the_sound_checkpoint_raises_no_flag(evaluated, suite: str) -> None:
    rows = evaluated(TINY.encoder, suite)
    assert rows and all(r["sanity_ok"] and not r["sanity_warnings"] for r in rows), [
        (r["attack"], r["eps"], r["sanity_failed"], r["sanity_warnings"]) for r in rows
    ]
    applied = {flag for flag in FLAGS if any(r[f"sanity_{flag}"] is True for r in rows)}
    not_here = {"strong": {"monotone_in_eps"} | AA_ONLY, "sweep": AA_ONLY}
    # one eps, no single-step attack; not a screening run
    not_here["aa"] = {"monotone_in_eps", "le_single_step", "screen_found_nothing"}
    assert applied == set(FLAGS) - not_here[suite] - FINETUNED_ONLY  # SLF: the cached-feature probe
    assert all(r[f"sanity_{flag}"] is None for r in rows for flag in FINETUNED_ONLY)


def test_the_sound_checkpoint_under_a_fitted_alf_head_raises_no_flag(evaluated) -> None:
    """The control of the ALF cases: the same checkpoint and suite, ALF fitted, passes every check,
    the two on its head included; the unfitted head fires ``alf_underfit`` on its train accuracy."""
    rows = evaluated(TINY.encoder, "strong", alf="fitted")
    assert rows and all(r["sanity_ok"] for r in rows), [(r["attack"], r["sanity_failed"]) for r in rows]
    assert all(r["sanity_finetune_above_chance"] is True and r["sanity_alf_underfit"] is True for r in rows)
    assert all(r["sanity_probe_underfit"] is None and r["finetune"]["fit"] == "fitted" for r in rows)
    assert all(r["slf_train_acc"] - r["probe_train_acc"] <= ALF_UNDERFIT_GAP for r in rows)
    short = evaluated(TINY.encoder, "strong", alf="short")
    assert all(r["slf_train_acc"] - r["probe_train_acc"] > ALF_UNDERFIT_GAP for r in short)
    assert short[0]["slf_train_acc"] == rows[0]["slf_train_acc"]  # one reference: the same probe, images
    assert (short[0]["finetune_epochs"], rows[0]["finetune_epochs"]) == (1, 196)


def test_square_finds_what_the_gradient_attacks_missed(evaluated) -> None:
    """The firing case is the one AutoAttack warns about: per-component survivors show Square
    lowering accuracy after APGD-CE on the quantising encoder, and not on the sound one."""
    fired = next(r for r in evaluated("quantising", "aa") if r["attack"] == "autoattack")
    sound = next(r for r in evaluated(TINY.encoder, "aa") if r["attack"] == "autoattack")
    assert fired["aa_n_robust_after_square"] < fired["aa_n_robust_after_apgd_ce"] - 2
    assert sound["aa_n_robust_after_square"] >= sound["aa_n_robust_after_apgd_ce"] - 2


@pytest.mark.parametrize("flag", sorted(CASES))
def test_flag_fires_through_evaluate(evaluated, flag: str) -> None:
    encoder, suite, where = CASES[flag]
    rows = evaluated(encoder, suite, CASE_PROBE.get(flag, "fitted"), CASE_ALF.get(flag))
    hit = [r for r in rows if where in ("all", f"{r['attack']}@{r['eps']}")]
    assert hit and all(r[f"sanity_{flag}"] is False for r in hit), [
        (r["attack"], r["eps"], r[f"sanity_{flag}"]) for r in rows
    ]
    assert all(flag in r["sanity_failed"].split(",") and not r["sanity_ok"] for r in hit)


def test_snapping_defence_makes_fgsm_non_monotone_as_a_warning(evaluated) -> None:
    """FGSM rising with eps is legitimate for some models: it fires as a warning, not a failure."""
    rows = evaluated("snapping", "sweep")
    fgsm = sorted((r for r in rows if r["attack"] == "fgsm"), key=lambda r: r["eps"])
    assert fgsm[1]["n_robust"] > fgsm[0]["n_robust"] + 2  # the defence engaged at the larger eps
    assert fgsm[1]["sanity_monotone_in_eps"] is False
    assert "monotone_in_eps" in fgsm[1]["sanity_warnings"].split(",")
    assert "monotone_in_eps" not in fgsm[1]["sanity_failed"].split(",")


def test_model_flags_are_distinct(evaluated) -> None:
    """Batch statistics are deterministic for a fixed batch, and only an ``eval()`` that misses a
    submodule trips ``eval_mode``: the model-level flags are separate signals, not one."""
    failed = {
        enc: {f for r in evaluated(enc, "sweep") for f in r["sanity_failed"].split(",")}
        for enc in ("noisy", "batchcentred", "ignoreseval")
    }
    assert "deterministic" not in failed["batchcentred"]
    assert {enc for enc, flags in failed.items() if "eval_mode" in flags} == {"ignoreseval"}


@pytest.mark.parametrize("encoder", ["quantising", TINY.encoder])
def test_autoattack_rows_record_which_component_decided_each_example(evaluated, encoder: str) -> None:
    """Survivors never increase from one component to the next, the last count is the row's robust
    count, and the examples each component decided are disjoint and make up the difference."""
    from robustbench_nacl.results.bits import decode_bits

    row = next(r for r in evaluated(encoder, "aa") if r["attack"] == "autoattack")
    names = row["aa_components"].split(",")
    assert names == ["apgd-ce", "square"]
    n = row["n_examples_evaluated"]
    counts = [row["n_clean_correct"]] + [row[f"aa_n_robust_after_{c.replace('-', '_')}"] for c in names]
    assert counts == sorted(counts, reverse=True) and counts[-1] == row["n_robust"]
    assert row["aa_robust_acc_after_square"] == row["robust_acc"]
    decided = [decode_bits(row[f"aa_decided_bits_{c.replace('-', '_')}"], n) for c in names]
    assert [int(d.sum()) for d in decided] == [a - b for a, b in itertools.pairwise(counts)]
    clean, robust = decode_bits(row["clean_bits"], n), decode_bits(row["robust_bits"], n)
    assert not (decided[0] & decided[1]).any()
    assert ((decided[0] | decided[1]) == (clean & ~robust)).all()


def test_an_underfit_probe_is_the_only_thing_flagged_and_standardising_fits_it(evaluated) -> None:
    """The same checkpoint, suite, epochs and lr: the raw-feature probe stops about 15 points below
    kNN in train accuracy and fires ``probe_underfit`` alone; with standardised features it fits to
    within the threshold and nothing fires. The numbers compared are the rows' own fields."""
    from robustbench_nacl.eval.sanity import PROBE_UNDERFIT_GAP

    short, fitted = (
        evaluated(TINY.encoder, "strong", "short"),
        evaluated(TINY.encoder, "strong", "short_standardized"),
    )
    assert all(r["sanity_failed"] == "probe_underfit" for r in short)
    assert all(r["knn_acc"] - r["probe_train_acc"] > PROBE_UNDERFIT_GAP for r in short)
    assert all(r["sanity_ok"] and r["sanity_probe_underfit"] is True for r in fitted)
    assert all(r["knn_acc"] - r["probe_train_acc"] <= PROBE_UNDERFIT_GAP for r in fitted)
    assert short[0]["knn_acc"] == fitted[0]["knn_acc"]  # kNN on the raw features either way
    assert fitted[0]["probe_config"]["standardize"] is True and "standardize" not in short[0]["probe_config"]
    assert short[0]["protocol_id"] != fitted[0]["protocol_id"]


def test_the_board_shows_how_far_autoattack_went_below_its_apgd_attacks(evaluated, tmp_path: Path) -> None:
    """A gradient-masking encoder: Square finds what APGD cannot, and the leaderboard's in-domain
    table says by how much (the row's own component counts, not a re-computation)."""
    from robustbench_nacl.report.leaderboard import render_leaderboard
    from robustbench_nacl.report.metrics import aa_gap

    rows = evaluated("quantising", "aa")
    row = next(r for r in rows if r["attack"] == "autoattack")
    gap = aa_gap(row)
    assert gap == row["aa_robust_acc_after_apgd_ce"] - row["robust_acc"] and gap > 0
    assert aa_gap({**row, "aa_components": "apgd-ce,apgd-t"}) is None  # APGD alone: nothing on top
    assert all(aa_gap(r) is None for r in rows if r["attack"] != "autoattack")
    page = render_leaderboard(list(rows), tmp_path)["LEADERBOARD.md"].read_text()
    table = page.split("## In-domain", 1)[1]
    header, _, cells = (x for x in table.splitlines() if x.startswith("|"))  # one entry: one line
    col = [c.strip() for c in header.strip("|").split("|")].index(f"AutoAttack below APGD@{AA_EPS:g}")
    assert [c.strip() for c in cells.strip("|").split("|")][col].startswith(f"{100 * gap:.1f}")
