"""A hostile submission cannot touch the disk, and every published file is pinned (issue 36).

``zoo verify-submission`` on a table of hostile submission folders (path traversal in the manifest,
``file://`` and other schemes, symbolic links out of the folder, special files, huge rows, a wrong
sha256 at the URL, missing parts): each exits 2 with one line, and nothing is written anywhere but
the cache (a snapshot of every other file under the test's folder is compared). A flipped byte in a
published linear head fails ``load_model``, ``eval --model`` and ``zoo verify``; a damaged card is a
``changed`` line, never a traceback. The submissions are built from the demo's published simclr
model, so no training runs here.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _reliability import cli, one_line_error

from robustbench_nacl import packaged
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.heads import head_key
from robustbench_nacl.hub import catalog, load
from robustbench_nacl.hub.download import cached_download
from robustbench_nacl.packaged import published_dir
from robustbench_nacl.results.rows import load_rows
from robustbench_nacl.zoo import verify

NAME = "convnet_small.simclr_digits-0-4_s0"
OTHER = "convnet_small.nca_digits-0-4_s0"  # its weights: a file whose sha256 is not the card's


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # stderr is what the tests read
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A local HTTP server over a folder holding the simclr weights (good) and another model's (bad)."""
    root = tmp_path_factory.mktemp("served")
    models = published_dir() / "demo" / "models"
    shutil.copyfile(models / NAME / "weights.safetensors", root / "good.safetensors")
    shutil.copyfile(models / OTHER / "weights.safetensors", root / "bad.safetensors")
    handler = functools.partial(_Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()
        httpd.server_close()


def _submission(folder: Path) -> Path:
    """A well-formed submission: the published simclr model, its in-domain rows and their head."""
    src = published_dir() / "demo" / "models" / NAME
    shutil.copytree(src, folder / "checkpoint", ignore=shutil.ignore_patterns("card.json", "log.jsonl"))
    shutil.copyfile(src / "card.json", folder / "card.json")
    rows = [r for r in load_rows(published_dir() / "demo") if r["checkpoint_id"] == NAME][:3]
    (folder / "rows").mkdir()
    for r in rows:
        (folder / "rows" / f"{r.row_id}.json").write_text(json.dumps(r.to_json()))
    (folder / "heads").mkdir()
    key = head_key(
        rows[0]["checkpoint_sha256"], "in-domain", rows[0]["dataset"], dict(rows[0]["probe_config"])
    )
    shutil.copyfile(
        published_dir() / "demo" / "heads" / f"{key}.safetensors", folder / "heads" / "h.safetensors"
    )
    return folder


def _edit(path: Path, **fields: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _no_weights(sub: Path, url: str, **manifest: object) -> None:
    (sub / "checkpoint" / "weights.safetensors").unlink()
    _edit(sub / "card.json", weights_url=url)
    if manifest:
        _edit(sub / "checkpoint" / "manifest.json", **manifest)


def _link(target: str) -> Callable[[Path, str, Path], None]:
    def make(sub: Path, url: str, outside: Path) -> None:
        path = sub / target
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        path.symlink_to(outside / "elsewhere" if path.name in ("rows", "checkpoint") else outside / "secret")

    return make


def _row_bits_removed(sub: Path, url: str, outside: Path) -> None:
    path = next((sub / "rows").glob("*.json"))
    row = json.loads(path.read_text())
    del row["clean_bits"]
    path.write_text(json.dumps(row))


# case -> (make it hostile: (submission, server URL, a folder outside it) -> None, fragments of the line)
HOSTILE: dict[str, tuple[Callable[[Path, str, Path], None], tuple[str, ...]]] = {
    "traversal in manifest weights + file:// url": (
        lambda s, u, o: _no_weights(s, "file:///etc/hostname", weights="../../../../outside/x"),
        ("field 'weights' must be a file name beside the manifest",),
    ),
    "absolute manifest weights": (
        lambda s, u, o: _no_weights(s, f"{u}/good.safetensors", weights="/etc/hostname"),
        ("field 'weights'",),
    ),
    "file:// url": (lambda s, u, o: _no_weights(s, "file:///etc/hostname"), ("weights_url", "only http")),
    "ftp:// url": (lambda s, u, o: _no_weights(s, "ftp://127.0.0.1/x"), ("weights_url", "only http")),
    "url without a host": (lambda s, u, o: _no_weights(s, "http:///x"), ("only http",)),
    "wrong sha256 at the url": (
        lambda s, u, o: _no_weights(s, f"{u}/bad.safetensors"),
        ("the model card pins", "nothing was cached"),
    ),
    "404 at the url": (lambda s, u, o: _no_weights(s, f"{u}/none"), ("cannot download", "HTTP 404")),
    "weights_sha256 not a sha": (
        lambda s, u, o: _edit(s / "card.json", weights_sha256="../../x"),
        ("weights_sha256",),
    ),
    "checkpoint/ a link out": (_link("checkpoint"), ("is a symbolic link",)),
    "rows/ a link out": (_link("rows"), ("is a symbolic link",)),
    "weights a link out": (_link("checkpoint/weights.safetensors"), ("is a symbolic link",)),
    "a row a link to /dev/zero": (
        lambda s, u, o: (s / "rows" / "x.json").symlink_to("/dev/zero"),
        ("is a symbolic link",),
    ),
    "a row a FIFO": (lambda s, u, o: os.mkfifo(s / "rows" / "x.json"), ("not a regular file",)),
    "a huge row": (
        lambda s, u, o: os.truncate((s / "rows" / "x.json").open("w").name, 17 << 20),
        ("is over 16 MB",),
    ),
    "a row pack (a gzip could unpack to any size)": (
        lambda s, u, o: (s / "rows" / "rows.jsonl.gz").write_bytes(b"\x1f\x8b"),
        ("rows/ holds the *.json row files",),
    ),
    "no rows/": (lambda s, u, o: shutil.rmtree(s / "rows"), ("has no rows/",)),
    "no heads/": (lambda s, u, o: shutil.rmtree(s / "heads"), ("has no heads/", "--save-heads")),
    "a row without clean_bits": (_row_bits_removed, ("no readable per-example outcomes",)),
    "card.json not JSON": (
        lambda s, u, o: (s / "card.json").write_text("{junk"),
        ("no readable model card",),
    ),
    "card.json a list": (
        lambda s, u, o: (s / "card.json").write_text("[]"),
        ("a model card is a JSON object",),
    ),
}


def _snapshot(root: Path, skip: Path) -> dict[str, bytes]:
    """Every file under ``root`` but those under ``skip`` (the cache), with its bytes (links: target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if skip in p.parents or p == skip:
            continue
        if p.is_symlink():
            out[str(p)] = os.readlink(p).encode()
        elif p.is_file() and not str(p).endswith("x.json"):  # never read a FIFO or a huge row
            out[str(p)] = p.read_bytes()
    return out


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_submission_exits_2_and_writes_nothing_outside_the_cache(
    case: str,
    server: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = server
    cache = tmp_path / "cache"
    monkeypatch.setenv("ROBUSTBENCH_NACL_CACHE", str(cache))
    outside = tmp_path / "outside"
    (outside / "elsewhere").mkdir(parents=True)
    (outside / "secret").write_text("not the submission's")
    sub = _submission(tmp_path / "sub")
    make, fragments = HOSTILE[case]
    make(sub, url, outside)
    before = _snapshot(tmp_path, cache)
    rc, _, err = cli(["zoo", "verify-submission", str(sub)], capsys)
    one_line_error(rc, err, *fragments, command="zoo")
    assert _snapshot(tmp_path, cache) == before  # nothing written (or changed) outside the cache
    assert not (outside / "x").exists() and not Path("/tmp/x").exists()
    assert not [p for p in cache.rglob("*") if p.is_file()]  # and nothing cached: no download matched


def test_a_wrong_download_is_not_cached_so_the_corrected_url_then_works(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, served = server
    monkeypatch.setenv("ROBUSTBENCH_NACL_CACHE", str(tmp_path / "cache"))
    sha = catalog.find_model(NAME).weights_sha256
    with pytest.raises(UserError, match="nothing was cached"):
        cached_download(f"{url}/bad.safetensors", sha, "checkpoint/weights.safetensors", "fix")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    got = cached_download(f"{url}/good.safetensors", sha, "checkpoint/weights.safetensors", "fix")
    assert got.read_bytes() == (served / "good.safetensors").read_bytes()
    got.write_bytes(b"damaged")  # a cached copy damaged since: one line that names the cached file
    with pytest.raises(UserError, match=f"the cached weights {got}"):
        cached_download(f"{url}/good.safetensors", sha, "checkpoint/weights.safetensors", "fix")


@pytest.mark.parametrize("tolerance", ["-1", "x"])
def test_a_negative_tolerance_is_a_usage_error(tolerance: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(["zoo", "verify-submission", "x", "--tolerance", tolerance], capsys)
    one_line_error(rc, err, "--tolerance", command="zoo")


# ============ published heads are pinned; a damaged card is reported ============


@pytest.fixture
def demo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the package's published demo set, standing in for it."""
    root = tmp_path / "published"
    shutil.copytree(published_dir() / "demo", root / "demo")
    for module in (packaged, catalog, verify):
        monkeypatch.setattr(module, "published_dir", lambda: root)
    return root / "demo"


def _flip(path: Path, at: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_every_published_head_is_pinned_and_matches() -> None:
    for name in catalog.published_sets():
        set_folder = published_dir() / name
        assert load.heads_problems(set_folder) == [], name
        assert len(load.head_pins(set_folder)) == len(list((set_folder / "heads").glob("*.safetensors")))


def test_a_flipped_byte_in_a_head_fails_load_model_eval_model_and_zoo_verify(
    demo_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = load.protocol_row(catalog.find_model(NAME), None)
    key = head_key(row["checkpoint_sha256"], row["setting"], row["dataset"], dict(row["probe_config"]))
    _flip(demo_copy / "heads" / f"{key}.safetensors")
    with pytest.raises(UserError, match=f"{key}.safetensors has sha256 .* but heads.json pins"):
        load.load_model(NAME, head=True)
    rc, _, err = cli(["eval", "--model", NAME, "--out", str(tmp_path / "o"), "--no-progress"], capsys)
    one_line_error(rc, err, f"{key}.safetensors has sha256", command="eval")
    assert not (tmp_path / "o").exists()
    rc, out, _ = cli(["zoo", "verify", "--zoo", "demo", "--out", str(tmp_path / "none")], capsys)
    assert rc == 1
    changed = [line for line in out.splitlines() if line.startswith("changed")]
    assert len(changed) == 1 and NAME in changed[0] and key in changed[0], out


def test_an_unpinned_head_is_refused(demo_copy: Path) -> None:
    pins = json.loads((demo_copy / "heads.json").read_text())
    row = load.protocol_row(catalog.find_model(NAME), None)
    key = head_key(row["checkpoint_sha256"], row["setting"], row["dataset"], dict(row["probe_config"]))
    del pins[key]
    (demo_copy / "heads.json").write_text(json.dumps(pins))
    with pytest.raises(UserError, match="is not pinned in"):
        load.load_model(NAME, head=True)


@pytest.mark.parametrize(("text", "why"), [("{junk", "is not readable JSON"), ("[]", "is not a JSON object")])
def test_zoo_verify_reports_a_damaged_card_as_changed(
    text: str, why: str, demo_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (demo_copy / "models" / NAME / "card.json").write_text(text)
    rc, out, err = cli(["zoo", "verify", "--zoo", "demo", "--out", str(tmp_path / "none")], capsys)
    assert rc == 1 and "Traceback" not in err, err
    line = next(line for line in out.splitlines() if NAME in line)
    assert line.startswith("changed") and why in line, line


# ============ the smaller CLI edges of issue 36 ============


def test_a_failed_leaderboard_leaves_no_empty_out_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "board"
    rc, _, err = cli(["leaderboard", "--rows", str(tmp_path / "none"), "--out", str(out)], capsys)
    one_line_error(rc, err, command="leaderboard")
    assert not out.exists()


def test_rows_naming_a_file_says_it_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.json").write_text("{}")
    rc, _, err = cli(
        ["leaderboard", "--rows", str(tmp_path / "r.json"), "--out", str(tmp_path / "b")], capsys
    )
    one_line_error(rc, err, "is a file, not a rows directory", command="leaderboard")


def test_like_zoo_of_another_dataset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    rc, _, err = cli(["eval", "--model", NAME, "--like-zoo", "fashion-mnist", "--out", str(out)], capsys)
    one_line_error(rc, err, "evaluates on fashion-mnist", "pretrained on digits:0-4", command="eval")
    assert not out.exists()


def test_models_lists_the_bn_branch_and_every_card_has_one(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(["models"], capsys)
    assert rc == 0 and "BN branch" in out.splitlines()[0]
    acl = next(line for line in out.splitlines() if ".acl_fashion-mnist" in line)
    assert "| adv " in acl, acl
    for m in catalog.published_models():
        manifest = json.loads((m.folder / "manifest.json").read_text())
        want = (manifest.get("eval_bn_route") or "clean") if manifest.get("dual_bn") else None
        assert m.card["bn_branch"] == want, m.name
