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
    failed = {c for r in rows if not r["control"] for c in r["sanity_failed"].split(",") if c}
    # the quick demo's probe (100 epochs at lr 3e-4 on raw features) stops short of what kNN gets
    # from some encoders' features: flagged as probe_underfit, not hidden; no attack check may fail
    assert rows and failed <= {"probe_underfit"}
    # a random-init control may legitimately sit at chance on a shifted set (2-epoch probe budget):
    # then it may also fail "clean above chance", and it is flagged, not hidden
    failed |= {c for r in rows for c in r["sanity_failed"].split(",") if c}
    assert failed <= {"clean_above_chance", "probe_underfit"}
    assert str(board / "index.html") in res.stdout  # it says where everything is
