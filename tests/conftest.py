"""Shared test settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

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
