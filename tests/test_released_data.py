"""CIFAR-10-C / CIFAR-100-C from their released files, and STL-10 at 32 pixels (data/released.py).

The released layout (Hendrycks & Dietterich, Zenodo 2535967): one ``<corruption>.npy`` per
corruption, uint8 (5 * N, 32, 32, 3) with severities 1..5 in blocks of N test images in the test
set's order, and ``labels.npy`` (5 * N,). The fixtures here are that layout with N = 12.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import write_cifar10, write_stl10
from PIL import Image

from robustbench_nacl.data import load_dataset
from robustbench_nacl.data.released import parse_released, read_released, released_folder
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.settings import expected_identities, identity_fields, settings_for

N = 12


def write_cifar10c(root: Path, y_test: np.ndarray, blocks: dict[str, list[np.ndarray]]) -> Path:
    """``root/CIFAR-10-C``: labels.npy and one .npy per corruption (a list of 5 (N, 32, 32, 3) blocks)."""
    d = root / "CIFAR-10-C"
    d.mkdir(parents=True)
    np.save(d / "labels.npy", np.tile(y_test.astype(np.uint8), 5))
    for name, severities in blocks.items():
        np.save(d / f"{name}.npy", np.concatenate(severities).astype(np.uint8))
    return d


def _blocks(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8) for _ in range(5)]


def _one_line(fn, *contains: str) -> str:
    with pytest.raises(UserError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg and all(c in msg for c in contains), msg
    return msg


def test_read_released_takes_the_severity_block_in_the_test_order(tmp_path: Path) -> None:
    y = np.arange(N) % 10
    blocks = _blocks(0)
    d = write_cifar10c(tmp_path, y, {"fog": blocks})
    assert released_folder(tmp_path, "cifar10") == d and released_folder(d, "cifar10") == d
    for severity in (1, 3, 5):
        x, labels = read_released(d, "fog", severity)
        assert x.dtype == torch.uint8 and x.shape == (N, 3, 32, 32)
        assert torch.equal(x, torch.from_numpy(blocks[severity - 1]).permute(0, 3, 1, 2))
        assert labels.tolist() == y.tolist()
    x, labels = read_released(d, "fog", 2, n=5)  # the first n test examples, as everywhere
    assert x.shape[0] == 5 and torch.equal(x, torch.from_numpy(blocks[1][:5]).permute(0, 3, 1, 2))


def test_missing_short_and_unsafe_files_are_one_line_errors(tmp_path: Path) -> None:
    y = np.arange(N) % 10
    d = write_cifar10c(tmp_path, y, {"fog": _blocks(0), "snow": _blocks(1)[:4]})  # snow: 4 severities
    _one_line(lambda: read_released(d, "frost", 1), "frost.npy not found")
    _one_line(lambda: read_released(d, "snow", 1), "snow.npy holds 48 images", "short")
    raw = (d / "fog.npy").read_bytes()
    (d / "fog.npy").write_bytes(raw[: len(raw) // 2])  # a download cut short
    _one_line(lambda: read_released(d, "fog", 1), "fog.npy is not a readable .npy")
    np.save(d / "fog.npy", np.array([{"x": 1}] * 5 * N, dtype=object), allow_pickle=True)
    _one_line(lambda: read_released(d, "fog", 1), "fog.npy is not a readable .npy")  # never unpickled
    _one_line(lambda: released_folder(tmp_path / "nowhere", "cifar10"), "no labels.npy", "CIFAR-10-C")
    _one_line(lambda: released_folder(tmp_path, "stl10"), "stl10 has no released corruption set")
    _one_line(lambda: parse_released("fogg", d), "unknown released corruption 'fogg'")
    _one_line(lambda: parse_released("all", d), "lacks", "shot_noise.npy")


def test_released_settings_are_their_own_rows_and_protocol(tmp_path: Path) -> None:
    d = write_cifar10c(tmp_path, np.arange(N) % 10, {"fog": _blocks(0), "zoom_blur": _blocks(1)})
    released = settings_for("cifar10", None, None, "fog,zoom_blur", "2,5", corruptions_from=str(tmp_path))
    computed = settings_for("cifar10", None, None, "contrast", "2")
    corr = [s for s in released if s.name == "corruption"]
    assert [(s.corruption, s.severity) for s in corr] == [
        ("fog", 2),
        ("fog", 5),
        ("zoom_blur", 2),
        ("zoom_blur", 5),
    ]
    assert {s.corruption_source for s in corr} == {"CIFAR-10-C"} and corr[0].corruption_dir == str(d)
    from robustbench_nacl.attack.suites import load_suite

    suite = load_suite("quick")
    fields = identity_fields(suite, sha="a" * 64, seed=0, n_examples=N, probe=None)
    ident = expected_identities(corr[0], suite, fields)[0]
    assert ident["corruption_source"] == "CIFAR-10-C"
    assert "corruption_source" not in expected_identities(computed[1], suite, fields)[0]
    _one_line(lambda: settings_for("cifar10:0-4", None, None, "fog", None, str(tmp_path)), "whole test sets")
    _one_line(
        lambda: settings_for("cifar10", None, None, None, None, str(tmp_path)), "--corruptions-from needs"
    )


def test_evaluate_reads_the_released_images(tmp_path: Path) -> None:
    """Severity 2 of 'fog' holds the clean test images themselves: its clean accuracy is the
    in-domain one; 'zoom_blur' holds blank images: every row of it names CIFAR-10-C."""
    from _models import one_thread

    from robustbench_nacl.eval.evaluate import evaluate
    from robustbench_nacl.eval.probe import ProbeConfig

    arrays = write_cifar10(tmp_path / "data", n_train=40, n_test=N)
    clean = arrays["x_test"].transpose(0, 2, 3, 1)
    fog = _blocks(0)
    fog[1] = clean
    write_cifar10c(tmp_path, arrays["y_test"], {"fog": fog, "zoom_blur": [np.zeros_like(clean)] * 5})
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.ReLU(), torch.nn.Flatten())
    with one_thread():
        rows = evaluate(
            module, dataset="cifar10", name="tiny", out=tmp_path / "out", data_root=str(tmp_path / "data"),
            corruptions="fog,zoom_blur", severities="2", corruptions_from=str(tmp_path), suite="quick",
            n_examples=N, probe=ProbeConfig(epochs=5, lr=1e-2), progress=False,
        )  # fmt: skip
    corrupted = [r for r in rows if r["setting"] == "corruption"]
    assert corrupted and all(r["corruption_source"] == "CIFAR-10-C" for r in corrupted)
    in_domain = next(r["clean_acc"] for r in rows if r["setting"] == "in-domain")
    assert {r["clean_acc"] for r in corrupted if r["corruption"] == "fog"} == {in_domain}


def test_a_released_set_of_another_test_order_is_refused(tmp_path: Path) -> None:
    from robustbench_nacl.eval.evaluate import evaluate

    arrays = write_cifar10(tmp_path / "data", n_train=40, n_test=N)
    write_cifar10c(tmp_path, (arrays["y_test"] + 1) % 10, {"fog": _blocks(0)})
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 8, stride=8), torch.nn.Flatten())
    kw = {"corruptions": "fog", "severities": "1", "corruptions_from": str(tmp_path), "suite": "quick"}
    data = {"dataset": "cifar10", "data_root": str(tmp_path / "data"), "out": tmp_path / "out"}
    _one_line(
        lambda: evaluate(module, name="tiny", progress=False, **data, **kw),
        "are not the first 12 test labels of cifar10",
    )
    assert not (tmp_path / "out" / "rows").exists() or not any((tmp_path / "out" / "rows").iterdir())


def test_stl10_at_32_pixels_is_the_benchmarks_resize_and_the_transfer_from_cifar(tmp_path: Path) -> None:
    arrays = write_stl10(tmp_path, n_train=4, n_test=3)
    small = load_dataset("stl10-32", "test", root=tmp_path, download=False)
    big = load_dataset("stl10", "test", root=tmp_path, download=False)
    assert small.x.shape == (3, 3, 32, 32) and torch.equal(small.y, big.y)
    img = Image.fromarray(big.x[0].permute(1, 2, 0).numpy()).resize((32, 32), Image.BILINEAR)
    assert torch.equal(small.x[0], torch.from_numpy(np.array(img)).permute(2, 0, 1))
    assert arrays is not None
    transfer = [s.dataset for s in settings_for("cifar10", "stl10", None) if s.name == "transfer"]
    assert transfer == ["stl10-32"]  # as the benchmark: Resize(32) of STL-10 for a CIFAR encoder
    assert [s.dataset for s in settings_for("stl10", "cifar10", None)][1] == "cifar10"
    assert [s.dataset for s in settings_for("cifar100", ["stl10", "stl10-32"], None)][1:] == ["stl10-32"]


def test_cli_eval_of_a_released_checkpoint_on_released_corruptions(tmp_path: Path, capsys) -> None:
    """The README's workflow in small: a benchmark checkpoint (the ACL layout), --pretraining ACL,
    CIFAR-10 with CIFAR-10-C read from its files, then the board with --reported robustssl."""
    from _models import one_thread
    from test_robustssl_layouts import acl_file

    from robustbench_nacl.cli import main

    arrays = write_cifar10(tmp_path / "data", n_train=30, n_test=N)
    write_cifar10c(tmp_path, arrays["y_test"], {"fog": _blocks(0)})
    torch.save({"state_dict": acl_file(64)}, tmp_path / "ACL_DS.pt")
    out = tmp_path / "board"
    args = ["eval", str(tmp_path / "ACL_DS.pt"), "--arch", "resnet18_cifar", "--pretraining", "ACL"]
    args += ["--dataset", "cifar10", "--corruptions", "fog", "--severities", "3"]
    args += ["--corruptions-from", str(tmp_path / "CIFAR-10-C"), "--suite", "quick", "--probe-epochs", "5"]
    args += ["--data-root", str(tmp_path / "data"), "--out", str(out), "--no-progress"]
    with one_thread():
        assert main(args) == 0, capsys.readouterr().err
    rows = [r for r in map(json.loads, map(Path.read_text, (out / "rows").glob("*.json")))]
    assert {r["checkpoint_format"] for r in rows} == {"robustssl:ACL"}
    assert {r.get("corruption_source") for r in rows if r["setting"] == "corruption"} == {"CIFAR-10-C"}
    assert main(["leaderboard", "--rows", str(out), "--out", str(out), "--reported", "robustssl"]) == 0
    md = (out / "LEADERBOARD.md").read_text()
    assert "### cifar10 → cifar10 · SLF" in md and "| reported | DynACL-AIR++ |" in md
    assert "not placed, no AutoAttack Linf 8/255 rows" in md  # the quick suite has none
