"""The package works installed from a wheel, outside the source tree (no top-level zoo/ or attacks/).

The wheel is built from this checkout without build isolation (offline: setuptools comes with the
test extra), installed into a fresh virtual environment whose only other packages are this test
environment's (torch is not downloaded again: a .pth file lists the test environment's
site-packages folders, so the checkout's editable install is not activated there), and its
console script runs the README's commands from an empty folder outside the clone.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from robustbench_nacl.zoo import zoo_presets

ROOT = Path(__file__).resolve().parents[1]
DEMO_NAME = "convnet_small.simclr_digits-0-4_s0"


def _site_dirs() -> list[str]:
    """This environment's site-packages folders (those a base.pth added included), not the checkout."""
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    dirs |= {p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))}
    return sorted(d for d in dirs if Path(d).is_dir() and Path(d).resolve() != ROOT)


def _not_sources(folder: str, names: list[str]) -> set[str]:
    """What a build does not need: caches, outputs, environments, the reference leaderboard."""
    skip = {"__pycache__", ".pytest_cache", ".ruff_cache", ".import_linter_cache", ".hypothesis"}
    if Path(folder).resolve() == ROOT:
        skip |= {".git", ".venv", "build", "dist", "robustbench_out", "leaderboard", "runs", "bench"}
    return {n for n in names if n in skip or n.endswith(".egg-info")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Build the wheel, make a fresh venv, install the wheel into it; returns paths and timings."""
    tmp = tmp_path_factory.mktemp("wheel")
    t0 = time.perf_counter()
    # from a copy of the checkout: setuptools builds in the source tree, and a build/ left there by
    # an earlier build would put files since deleted into this wheel
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_not_sources)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("robustbench_nacl-*.whl"))
    t_build = time.perf_counter() - t0
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "zz_test_env.pth").write_text("\n".join(_site_dirs()) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, timeout=300)
    work = tmp / "empty"  # outside the clone, and empty: nothing to find beside it
    work.mkdir()
    return {
        "wheel": wheel,
        "venv": venv,
        "work": work,
        "build_s": time.perf_counter() - t0,
        "t_build": t_build,
    }


def _run(installed: dict[str, object], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    venv, work = Path(str(installed["venv"])), Path(str(installed["work"]))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ROBUSTBENCH_NACL_ZOO")}
    env.update(OMP_NUM_THREADS="1", ROBUSTBENCH_NACL_DATA=str(work / "data"), NO_COLOR="1")
    env.pop("ROBUSTBENCH_NACL_ATTACKS", None)
    exe = venv / ("Scripts/robustbench-nacl.exe" if os.name == "nt" else "bin/robustbench-nacl")
    res = subprocess.run(
        [str(exe), *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, (
        f"robustbench-nacl {' '.join(args)}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    )
    return res


def test_the_wheel_ships_the_data_files_and_imports_from_its_install(installed: dict[str, object]) -> None:
    names = zipfile.ZipFile(str(installed["wheel"])).namelist()
    for needed in (
        "robustbench_nacl/files/attacks/paper.toml",
        "robustbench_nacl/files/zoo/paper/resnet18_cifar.simclr_cifar100_s0.json",
        "robustbench_nacl/files/schemas/model-card.schema.json",
        f"robustbench_nacl/files/published/demo/models/{DEMO_NAME}/weights.safetensors",
        "robustbench_nacl/files/published/demo/coverage.json",
        "robustbench_nacl/files/reported/robustssl.json",
    ):
        assert needed in names, f"{needed} is not in the wheel"
    venv = Path(str(installed["venv"]))
    code = "import robustbench_nacl as r, json; print(json.dumps([r.__file__, r.__version__]))"
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", code], cwd=str(installed["work"]), capture_output=True, text=True
    )
    where, version = json.loads(out.stdout)
    assert Path(where).resolve().is_relative_to(venv.resolve()), where  # the wheel's copy, not the checkout
    source = (ROOT / "robustbench_nacl" / "_version.py").read_text()
    assert f'__version__ = "{version}"' in source  # the one place the version comes from
    assert installed["wheel"].name.startswith(f"robustbench_nacl-{version}-")  # type: ignore[attr-defined]


def _check_quick_demo(out: Path, given: str, stdout: str) -> None:
    """The quick demo ran end to end: every loss family, in-domain and transfer, plots and page."""
    board = out / "leaderboard"
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
    rows = [json.loads(p.read_text()) for p in (out / "rows").glob("*.json")]
    assert rows and all(r["sanity_ok"] for r in rows if not r["control"])
    # a random-init control may legitimately sit at chance on a shifted set (2-epoch probe budget):
    # then the only check it may fail is "clean above chance", and it is flagged, not hidden
    assert {r.get("sanity_failed") for r in rows if not r["sanity_ok"]} <= {"clean_above_chance"}
    assert f"web page:    {given}/leaderboard/index.html" in stdout  # it says where everything is


@pytest.mark.slow  # the quick demo, from the installed wheel: the package's one end-to-end demo test
def test_the_readme_commands_run_from_an_empty_folder_outside_the_clone(installed: dict[str, object]) -> None:
    t0 = time.perf_counter()
    losses = _run(installed, "losses")
    assert "intnacl" in losses.stdout and "simclr" in losses.stdout
    paper = _run(installed, "zoo", "list", "--zoo", "paper")
    # every manifest of the checkout's paper zoo, listed by the installed wheel
    assert paper.stdout.count("resnet18_cifar.") == len(list((ROOT / "zoo" / "paper").glob("*.json")))
    _run(
        installed,
        "eval",
        "--model",
        DEMO_NAME,
        "--suite",
        "paper",
        "--n-examples",
        "30",
        "--out",
        "ev",
        "--card",
    )
    card = json.loads((Path(str(installed["work"])) / "ev" / "cards" / f"{DEMO_NAME}.json").read_text())
    shipped = Path(str(installed["venv"])).rglob(f"published/demo/models/{DEMO_NAME}/card.json")
    assert card["weights_sha256"] == json.loads(next(shipped).read_text())["weights_sha256"]
    t_cmds = time.perf_counter() - t0
    demo = _run(installed, "demo", "--quick", "--out", "demo", timeout=600)
    _check_quick_demo(Path(str(installed["work"])) / "demo" / "quick", "demo/quick", demo.stdout)
    print(
        f"wheel build+venv+install {installed['build_s']:.1f} s (build {installed['t_build']:.1f} s); "
        f"losses, zoo list, eval {t_cmds:.1f} s; "
        f"demo --quick {time.perf_counter() - t0 - t_cmds:.1f} s"
    )


def test_python_m_build_makes_an_sdist_and_a_wheel_that_twine_check_passes(tmp_path: Path) -> None:
    """The release path the README names: `python -m build` (here without isolation: offline) and
    `twine check --strict` on both files (metadata, long description rendering)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_not_sources)
    out = tmp_path / "dist"
    build = [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out)]
    subprocess.run([*build, str(src)], check=True, capture_output=True, timeout=300)
    files = sorted(p.name for p in out.iterdir())
    assert [n.endswith(".tar.gz") for n in files].count(True) == 1, files
    assert [n.endswith(".whl") for n in files].count(True) == 1, files
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(out.iterdir()))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2, check.stdout
    sdist = next(out.glob("*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    # the packaged data travels in the sdist too (a wheel built from it must have it)
    assert any(n.endswith("files/attacks/paper.toml") for n in names)
    assert any("files/zoo/demo/" in n for n in names)
