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


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a container
    sees the host's cores in ``os.cpu_count()``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota readable here: the affinity stands
    return max(1, cores)


# Tests run on 2-core CI machines: pin threads so timings and CPU bit-identity are stable. Under
# pytest-xdist the cores are shared out among the workers (two workers on CI: one thread each), so
# that they do not oversubscribe the machine.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_DEFAULT_THREADS = max(1, min(2, usable_cores() // _WORKERS))
torch.set_num_threads(int(os.environ.get("ROBUSTBENCH_NACL_TEST_THREADS", str(_DEFAULT_THREADS))))

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


# ============ parallel runs (pytest-xdist, `-n auto` in pyproject.toml) ============


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker per usable core, at most 8 (each worker builds the module fixtures of the modules
    it runs)."""
    return min(usable_cores(), 8)


# ============ test order: the long modules first ============


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the modules that hold a ``slow`` test first, each module kept in one piece.

    With pytest-xdist a long test scheduled last leaves the other worker idle until it ends (on a
    2-core CI machine that was a minute of one core); started first, the short tests fill in around
    it. A module's tests stay together so that its module-scoped fixtures are built once per worker.
    """
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow") and item.module}
    items.sort(key=lambda item: item.module is None or item.module.__name__ not in slow)
