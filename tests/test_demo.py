"""The quick demo runs end to end: every loss family, in-domain and transfer, plots and page."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import run_cli

from robustbench_nacl.zoo import zoo_presets


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path: Path, cli_env: dict[str, str]) -> None:
    res = run_cli(["demo", "--quick", "--out", str(tmp_path)], cli_env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    board = tmp_path / "quick" / "leaderboard"
    for name in (
        "LEADERBOARD.md",
        "results.csv",
        "leaderboard.json",
        "standard_vs_robust.png",
        "robust_vs_eps.png",
        "index.html",
    ):
        assert (board / name).stat().st_size > 0, name
    with open(board / "results.csv") as f:
        table = list(csv.DictReader(f))
    for setting in ("in-domain", "transfer"):
        families = {r["loss"] for r in table if r["setting"] == setting}
        assert set(zoo_presets()) | {"random-init"} <= families, setting
    md = (board / "LEADERBOARD.md").read_text()
    assert "FGSM@0.002" in md and "PGD@0.002" in md and "random-init (control)" in md
    rows = [json.loads(p.read_text()) for p in (tmp_path / "quick" / "rows").glob("*.json")]
    assert rows and all(r["sanity_ok"] for r in rows if not r["control"])
    # a random-init control may legitimately sit at chance on a shifted set (2-epoch probe budget):
    # then the only check it may fail is "clean above chance", and it is flagged, not hidden
    assert {r.get("sanity_failed") for r in rows if not r["sanity_ok"]} <= {"clean_above_chance"}
    assert str(board / "index.html") in res.stdout  # it says where everything is
