"""Shared test settings and fixtures."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _models import digits_data, digits_model, one_thread
from torch import Tensor, nn

# Tests run on 2-core CI machines: pin threads so timings and CPU bit-identity are stable.
torch.set_num_threads(int(os.environ.get("ROBUSTBENCH_NACL_TEST_THREADS", "2")))

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for CLI subprocesses: an empty data root, no progress noise, this checkout first."""
    env = dict(os.environ)
    env["ROBUSTBENCH_NACL_DATA"] = str(tmp_path / "data")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300):
    """Run ``python -m robustbench_nacl ARGS`` and return the CompletedProcess."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "robustbench_nacl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ============ the digits classifier and its test batch (attack, sanity and benchmark tests) ============


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """One intra-op thread for a whole module (``pytestmark = pytest.mark.usefixtures("single_thread")``)."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model() -> nn.Module:
    """The small digits classifier of ``_models.digits_model`` (trained once per session)."""
    return digits_model()


@pytest.fixture(scope="module")
def data(request: pytest.FixtureRequest) -> tuple[Tensor, Tensor]:
    """The first test digits and their labels: ``DIGITS_N`` of them (a module constant), else 200."""
    _, _, x, y = digits_data()
    n = getattr(request.module, "DIGITS_N", 200)
    return x[:n], y[:n]
