"""Plugins through the real command line: train, eval, leaderboard, losses and encoders with a plugin
file; the README's decoupled-contrastive-beside-SimCLR sequence; one-line errors, exit code 2."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from robustbench_nacl.io import sha256_bytes
from robustbench_nacl.plugins import ENV_VAR, FILE_MODULE_PREFIX

PLUGIN = '''
from torch import nn
from robustbench_nacl import register_encoder, register_pair_loss
from robustbench_nacl.losses import pair_loss


@register_pair_loss("cli_pair", t=0.5, scale=1.0)
def cli_pair(z1, z2, t, scale):
    """NT-Xent times a scale."""
    z1, z2 = nn.functional.normalize(z1, dim=1), nn.functional.normalize(z2, dim=1)
    return scale * pair_loss(z1, z2, estimator="g0", temperature=t)


@register_encoder("cli_cnn")
def cli_cnn(in_channels, width=8):
    """One convolution, BatchNorm, ReLU and a global average pool."""
    net = nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )
    net.out_dim = width
    return net
'''


@pytest.fixture
def cli_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The CLI environment without plugins of this process: each test names its own."""
    return {k: v for k, v in cli_env.items() if k != ENV_VAR}


TRAIN_SMALL = ["--dataset", "digits:0-4", "--epochs", "1", "--max-train", "256", "--batch-size", "64"]
EVAL_SMALL = ["--suite", "quick", "--n-examples", "60", "--probe-epochs", "100", "--probe-lr", "0.01"]


def ok(proc) -> str:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def one_line_exit_2(proc) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_plugin_loss_and_encoder_through_train_eval_and_leaderboard(tmp_path: Path, cli_env) -> None:
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(PLUGIN)
    sha = sha256_bytes(plugin.read_bytes())
    record = {"module": f"{FILE_MODULE_PREFIX}my_plugin_{sha[:16]}", "version": None, "sha256": sha}
    run, results = tmp_path / "run", tmp_path / "results"
    with_plugin = ["--plugin", str(plugin)]
    train = ["train", *with_plugin, "--loss", "cli_pair", "--encoder", "cli_cnn", "--set", "scale=2"]
    ok(
        run_cli(
            [*train, *TRAIN_SMALL, "--encoder-arg", "width=8", "--out", str(run), "--no-progress"], cli_env
        )
    )
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["plugins"] == [record] and manifest["training_config"]["plugins"] == [record]
    assert manifest["loss_params"]["extra"] == {"scale": 2.0}
    # the encoder is the plugin's: without it the checkpoint cannot be rebuilt, and says so in one line
    msg = one_line_exit_2(run_cli(["eval", str(run), *EVAL_SMALL, "--out", str(results)], cli_env))
    assert "unknown encoder 'cli_cnn'" in msg
    ok(
        run_cli(
            ["eval", str(run), *with_plugin, *EVAL_SMALL, "--out", str(results), "--no-progress"], cli_env
        )
    )
    ok(run_cli(["leaderboard", "--rows", str(results), "--out", str(results)], cli_env))
    board = (results / "LEADERBOARD.md").read_text()
    assert "| cli_pair " in board and "scale=2.0" in board  # the family and its own parameter
    rows = [json.loads(p.read_text()) for p in (results / "rows").glob("*.json")]
    assert rows and all(r["plugins"] == [record] and r["loss"] == "cli_pair" for r in rows)
    assert all(r["recipe"]["config"]["plugins"] == [record] for r in rows)


def test_a_plugin_re_registering_simclr_is_one_line_exit_2(tmp_path: Path, cli_env) -> None:
    dup = tmp_path / "dup.py"
    dup.write_text(
        textwrap.dedent(
            """
            from robustbench_nacl import register_pair_loss

            @register_pair_loss("simclr", t=0.5)
            def simclr(z1, z2, t):
                return (z1 - z2).pow(2).mean()
            """
        )
    )
    for args in (
        ["train", "--plugin", str(dup), "--loss", "simclr", "--out", str(tmp_path / "r")],
        ["losses"],
    ):
        if args == ["losses"]:
            args = ["--plugin", str(dup), "losses"]  # before the command name too
        msg = one_line_exit_2(run_cli(args, cli_env))
        assert "dup.py" in msg and "'simclr' is already registered" in msg
    assert not (tmp_path / "r").exists()
    boom = tmp_path / "boom.py"
    boom.write_text("raise RuntimeError('boom')\n")
    msg = one_line_exit_2(run_cli(["encoders", "--plugin", str(boom)], cli_env))
    assert msg.startswith("robustbench-nacl encoders: error: plugin") and "RuntimeError: boom" in msg


def test_losses_and_encoders_list_plugin_names_with_their_source(tmp_path: Path, cli_env) -> None:
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(PLUGIN)
    sha = sha256_bytes(plugin.read_bytes())
    out = ok(run_cli(["losses", "--plugin", str(plugin)], cli_env))
    line = next(x for x in out.splitlines() if x.startswith("| cli_pair "))
    assert f"plugin {FILE_MODULE_PREFIX}my_plugin_{sha[:16]} sha256 {sha[:12]}" in line
    entry = json.loads(ok(run_cli(["losses", "cli_pair", "--plugin", str(plugin), "--json"], cli_env)))[0]
    assert entry["plugin"]["sha256"] == sha and entry["module"] == entry["plugin"]["module"]
    # the environment variable is how subprocesses get the plugins: the same as --plugin
    env = {**cli_env, ENV_VAR: str(plugin)}
    out = ok(run_cli(["encoders"], env))
    assert "| cli_cnn " in out and "plugin robustbench_nacl_plugin_my_plugin_" in out
    assert "timm:NAME" in out
    assert "cli_pair" in ok(run_cli(["train", "--help", "--plugin", str(plugin)], cli_env))


# The README's "a plugin loss beside SimCLR" commands, run exactly as printed there (from a folder
# holding examples/decoupled_contrastive.py). The lead keeps README.md's block equal to this list.
_SMALL_TRAIN = "--dataset digits:0-4 --epochs 1 --max-train 256 --batch-size 64 --encoder-arg width=8"
_SMALL_EVAL = "--suite quick --n-examples 60 --probe-epochs 100 --probe-lr 0.01"
README_SEQUENCE = [
    "robustbench-nacl train --plugin examples/decoupled_contrastive.py --loss dcl_decoupled "
    f"{_SMALL_TRAIN} --out robustbench_out/dcl/dcl",
    f"robustbench-nacl train --loss simclr {_SMALL_TRAIN} --out robustbench_out/dcl/simclr",
    f"robustbench-nacl eval robustbench_out/dcl/dcl {_SMALL_EVAL} --out robustbench_out/dcl/results",
    f"robustbench-nacl eval robustbench_out/dcl/simclr {_SMALL_EVAL} --out robustbench_out/dcl/results",
    "robustbench-nacl leaderboard --rows robustbench_out/dcl/results --out robustbench_out/dcl/results",
]


def test_the_readme_sequence_ranks_the_example_plugin_beside_simclr(tmp_path: Path, cli_env) -> None:
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "decoupled_contrastive.py", tmp_path / "examples")
    for command in README_SEQUENCE:
        argv = shlex.split(command)
        assert argv[0] == "robustbench-nacl"
        cmd = [sys.executable, "-m", "robustbench_nacl", *argv[1:]]
        ok(subprocess.run(cmd, env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=300))
    results = tmp_path / "robustbench_out" / "dcl" / "results"
    board = (results / "LEADERBOARD.md").read_text()
    table = board.split("## In-domain", 1)[1].split("\n\n", 2)[1]
    families = {line.split("|")[2].strip() for line in table.splitlines()[2:]}
    assert families == {"dcl_decoupled", "simclr"}
    assert "Δ vs simclr" in table  # ranked and compared in one table, under one protocol
    compare = ["compare", "--rows", str(results), "--baseline", "simclr", "--json"]
    result = json.loads(ok(run_cli(compare, cli_env)))
    assert result["baseline"] == "simclr"
    assert {c["candidate"].split()[0] for c in result["comparisons"]} == {"dcl_decoupled"}


def test_the_readme_shows_the_tested_sequence() -> None:
    readme = " ".join((ROOT / "README.md").read_text().replace("\\\n", " ").split())
    for command in README_SEQUENCE:
        assert command in readme, f"README.md lacks: {command}"
