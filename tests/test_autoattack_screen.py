"""AutoAttack rows an outsider can replay, their per-component cost, and the screening protocol.

A row records the seed each pyautoattack call received and the chunks it ran on; replaying it with
pyautoattack called directly (no code of this package's attack path) gives the row's bits. The
screening protocol (version ``screen``) runs FAB-T and Square on a sample of APGD's survivors and
fires its flag on a model built so that only Square finds adversarial examples.
"""

from __future__ import annotations

import pytest
import torch
from _models import digits_data
from torch import Tensor, nn

from robustbench_nacl.attack.autoattack import SCREEN_ADVICE
from robustbench_nacl.attack.autoattack_replay import replay_row
from robustbench_nacl.attack.autoattack_screen import SCREEN_MIN, screen_sample, screen_sample_size
from robustbench_nacl.eval.benchmark import benchmark
from robustbench_nacl.results.bits import decode_bits

pytestmark = pytest.mark.usefixtures("single_thread")

COMPONENTS = ("apgd_ce", "apgd_t", "fab_t", "square")
# the masked model: 64 pixels just below a rounding threshold; class 1 wins once FLIPS of them are
# pushed over it, far more than APGD's random start moves (about a quarter of them) and its zero
# gradient never moves it further; Square's search gets there
FLIPS, MASK_EPS = 44, 0.1


class MaskedGradient(nn.Module):
    """Input rounded to thirds (an all-zero input gradient); logit 1 counts pixels rounded up."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()), requires_grad=False)  # a device for pyautoattack

    def forward(self, x: Tensor) -> Tensor:
        s = (torch.round(x * 3) / 3).flatten(1).sum(1) * self.scale
        base = 64 / 3 + FLIPS / 3 - 0.1  # clean: every pixel rounds to 1/3, so class 0 wins
        other = torch.tensor([-1.0, -2.0, -3.0], device=x.device).expand(len(x), 3)
        return torch.cat([torch.full_like(s, base)[:, None], s[:, None], other], 1)


def _masked_data(n: int = 6) -> tuple[Tensor, Tensor]:
    x = 0.43 + 0.04 * torch.rand((n, 1, 8, 8), generator=torch.Generator().manual_seed(0))
    return x, torch.zeros(n, dtype=torch.long)


def _aa_row(rows: list[dict]) -> dict:
    return next(r for r in rows if r["attack"] == "autoattack")


def _suite(version: str, eps: float) -> dict:
    return {"attack": [{"name": "autoattack", "eps": [eps], "version": version}]}


@pytest.fixture(scope="module")
def masked() -> tuple[nn.Module, Tensor, Tensor, dict]:
    model, (x, y) = MaskedGradient().eval(), _masked_data()
    row = _aa_row(benchmark(model, x, y, _suite("screen", MASK_EPS), progress=False, batch_size=4))
    return model, x, y, row


def test_the_screen_flag_fires_when_only_square_finds_adversarial_examples(masked) -> None:
    _, x, _, row = masked
    n = len(x)
    # APGD and FAB-T (gradients) find nothing; Square (no gradients) finds some
    assert [row[f"aa_n_robust_after_{c}"] for c in ("apgd_ce", "apgd_t", "fab_t")] == [n, n, n]
    assert row["aa_n_robust_after_square"] < row["aa_n_robust_after_fab_t"]  # Square finds some
    assert row["aa_screen_found"] == n - row["n_robust"] > 0
    assert row["aa_screen_sample_size"] == row["aa_screen_survivors"] == n  # fewer than SCREEN_MIN
    assert row["sanity_screen_found_nothing"] is False and "screen_found_nothing" in row["sanity_failed"]
    assert row["aa_screen_advice"] == SCREEN_ADVICE[True]
    assert row["aa_chunk_sizes"] == [4, 2] and len(set(row["aa_seeds"])) == 2  # batch_size=4: 2 calls


def test_a_screening_row_replays_with_pyautoattack_from_its_recorded_seeds(masked) -> None:
    model, x, y, row = masked
    got = replay_row(model, x, y, row)
    assert got["recorded"] and got["matches"], got["n_differ"]


def test_the_sample_is_seeded_sorted_and_sized_as_documented() -> None:
    assert [screen_sample_size(s) for s in (0, 7, SCREEN_MIN, 499, 1000)] == [0, 7, SCREEN_MIN, 50, 100]
    alive = torch.arange(0, 600, 3)
    a, b = screen_sample(alive, 7), screen_sample(alive, 7)
    assert torch.equal(a, b) and len(a) == SCREEN_MIN and bool((a[1:] > a[:-1]).all())
    assert set(a.tolist()) <= set(alive.tolist()) and not torch.equal(a, screen_sample(alive, 8))


def test_a_sound_model_screens_clean_under_its_own_suite_hash(model) -> None:
    """On a sound model the sample finds nothing; a screening suite never hashes like standard's."""
    from robustbench_nacl.attack.suites import load_suite

    _, _, x, y = digits_data()
    screen = _aa_row(benchmark(model, x[:16], y[:16], _suite("screen", 8 / 255), progress=False))
    assert screen["sanity_screen_found_nothing"] is True and screen["aa_screen_found"] == 0
    assert screen["aa_screen_advice"] == SCREEN_ADVICE[False]
    assert screen["suite_sha256"] != load_suite(_suite("standard", 8 / 255)).sha256


def test_standard_rows_carry_cost_per_component_and_replay_bit_for_bit(model) -> None:
    _, _, x, y = digits_data()
    x, y = x[:24], y[:24]
    row = _aa_row(benchmark(model, x, y, _suite("standard", 0.3), progress=False, batch_size=8))
    before = row["n_clean_correct"]
    for c in COMPONENTS:  # a component runs, and makes forwards, when examples are left for it
        assert row[f"aa_wall_s_{c}"] >= 0
        assert (row[f"aa_forward_calls_{c}"] > 0) == (row[f"aa_forward_examples_{c}"] > 0) == (before > 0)
        before = row[f"aa_n_robust_after_{c}"]
    assert row["aa_forward_calls_apgd_ce"] >= 100  # 100 iterations, one forward each at least
    assert sum(row["aa_chunk_sizes"]) == row["n_clean_correct"] and max(row["aa_chunk_sizes"]) <= 8
    got = replay_row(model, x, y, row)
    assert got["matches"] and got["recorded"] and got["seeds"] == row["aa_seeds"]
    flipped = dict(row, robust_bits=_flip_first(row["robust_bits"], len(x)))
    assert not replay_row(model, x, y, flipped)["matches"]  # the comparison can fail


def _flip_first(bits: str, n: int) -> str:
    from robustbench_nacl.results.bits import encode_bits

    mask = decode_bits(bits, n).copy()
    mask[0] = not mask[0]
    return encode_bits(mask)
