"""The report layer runs without torch: in a Python where ``import torch`` raises, the renderer and
``compare`` import, render the committed test rows byte for byte as the golden files hold them, and
never load torch (a reader can render a board on a laptop without torch installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from robustbench_nacl.report.compare import main_compare

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "leaderboard"
ROWS = DATA / "rows"
# the command the golden files were rendered with (they name it)
COMMAND = "robustbench-nacl leaderboard --rows tests/data/leaderboard/rows --out leaderboard"

# Installed as sitecustomize: every later import of torch (or of a torch submodule) raises ImportError.
NO_TORCH = """
import sys


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is not installed here (this test blocks {name!r})")
        return None


sys.meta_path.insert(0, NoTorch())
"""

SCRIPT = """
import json
import sys

import robustbench_nacl.report
from robustbench_nacl.report.compare import main_compare
from robustbench_nacl.report.leaderboard import main_leaderboard

rows, out, command = sys.argv[1:4]
try:
    import torch  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("torch is importable: the blocker did not work")
files = main_leaderboard(rows, out, command=command)
text = main_compare(rows, "simclr")
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps({"files": sorted(files), "compare": text, "torch_modules": loaded}))
"""


def _without_torch(tmp_path: Path, *args: str, script: bool = True) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT (or, with ``script=False``, ``python -m robustbench_nacl ARGS``) where torch is blocked."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_TORCH)
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    head = ["-c", textwrap.dedent(SCRIPT)] if script else ["-m", "robustbench_nacl"]
    cmd = [sys.executable, *head, *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_leaderboard_and_compare_render_without_torch(tmp_path: Path) -> None:
    out = tmp_path / "board"
    done = _without_torch(tmp_path, str(ROWS), str(out), COMMAND)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["torch_modules"] == []
    assert {"LEADERBOARD.md", "results.csv", "leaderboard.json", "index.html"} <= set(result["files"])
    for name in ("LEADERBOARD.md", "results.csv"):
        assert (out / name).read_bytes() == (DATA / "golden" / name).read_bytes(), name
    assert result["compare"] == main_compare(str(ROWS), "simclr")  # what the same call prints with torch


def test_the_leaderboard_and_compare_commands_run_without_torch(tmp_path: Path) -> None:
    """The console commands too: the CLI builds only the named command's flags (train's would load
    the loss presets, and torch with them)."""
    out = tmp_path / "board"
    done = _without_torch(tmp_path, "leaderboard", "--rows", str(ROWS), "--out", str(out), script=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "results.csv").read_bytes() == (DATA / "golden" / "results.csv").read_bytes()
    done = _without_torch(tmp_path, "compare", "--rows", str(ROWS), "--baseline", "simclr", script=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == main_compare(str(ROWS), "simclr").strip()
    # and a command that needs torch says so through the blocker: the test would catch a fake pass
    done = _without_torch(tmp_path, "losses", script=False)
    assert done.returncode != 0 and "torch" in done.stderr
