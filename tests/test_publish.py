"""``zoo publish``: a trained, evaluated zoo becomes a loadable published set (weights, heads, a row
pack, cards), its zoo manifests are pinned to the published weights, and ``zoo verify`` checks the
published copy where no checkpoint was trained locally (so a fresh clone verifies the reference)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from test_zoo_completeness import tiny_entry

from robustbench_nacl import cli, zoo
from robustbench_nacl.errors import UserError
from robustbench_nacl.hub import catalog, load, release
from robustbench_nacl.io import sha256_file
from robustbench_nacl.models.checkpoint import WEIGHTS
from robustbench_nacl.packaged import published_dir
from robustbench_nacl.results.rows import ROW_PACK, load_rows, write_row_pack
from robustbench_nacl.zoo import generated, verify

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def published_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty published-models folder standing in for the package's (and a zoo folder of our own)."""
    root = tmp_path / "published"
    root.mkdir()
    shutil.copyfile(published_dir() / "paper_reported.json", root / "paper_reported.json")
    for module in (release, catalog, verify):
        monkeypatch.setattr(module, "published_dir", lambda: root)
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    return root


def _run_zoo(tmp_path: Path) -> tuple[Path, Path]:
    """Train and evaluate zoo ``t`` under ``tmp_path``: its checkpoints' folder and its board."""
    ck, board = tmp_path / "ck", tmp_path / "board"
    assert (
        cli.main(["zoo", "run", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-progress"])
        == 0
    )
    return ck, board


def test_publish_packs_the_rows_pins_the_manifests_and_verify_checks_the_published_copy(
    tmp_path: Path, published_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a corruption setting too: it attacks the in-domain head, which publishing must find
    e = tiny_entry(tmp_path / "zoo", "simclr", corruptions="gaussian_noise", severities="1")
    ck, board = _run_zoo(tmp_path)
    publish_argv = ["zoo", "publish", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board)]
    assert cli.main(publish_argv) == 0
    target = published_root / "t"
    # the rows: one pack, the same rows as the board's (the entry's and its control's), row ids kept
    assert (target / ROW_PACK).is_file() and not (target / "rows").exists()
    board_rows = {r.row_id: r for r in load_rows(board)}
    assert {r["setting"] for r in board_rows.values()} == {"in-domain", "corruption"}
    packed = load_rows(target)
    assert {r.row_id for r in packed} == set(board_rows) and len(packed) == len(board_rows)
    for r in packed:
        mine, theirs = r.to_json(), board_rows[r.row_id].to_json()
        assert mine.pop("checkpoint") == (r["checkpoint_id"] if r["control"] else f"t/models/{e.id}")
        theirs.pop("checkpoint")
        assert mine == theirs
    first = (target / ROW_PACK).read_bytes()
    assert cli.main(publish_argv) == 0 and (target / ROW_PACK).read_bytes() == first  # same rows, same bytes
    # the learning curve travels with the weights: `zoo curves` draws it from the published set
    assert (target / "models" / e.id / "log.jsonl").read_text() == (ck / e.id / "log.jsonl").read_text()
    assert (
        cli.main(
            [
                "zoo",
                "curves",
                "--zoo",
                "t",
                "--out",
                str(target / "models"),
                "--leaderboard",
                str(tmp_path / "fig"),
            ]
        )
        == 0
    )
    assert (tmp_path / "fig" / "learning_curves.png").is_file()
    # the zoo manifest is pinned to the published weights
    sha = sha256_file(ck / e.id / WEIGHTS)
    assert zoo.load_zoo("t")[0].weights_sha256 == sha == sha256_file(target / "models" / e.id / WEIGHTS)
    # nothing trained here: verify checks the published copy against its manifest, card and pin
    capsys.readouterr()
    none = tmp_path / "nothing-trained"
    assert cli.main(["zoo", "verify", "--zoo", "t", "--out", str(none)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"ok                 {e.id}  published copy {target / 'models' / e.id}: {sha}")
    assert out[-1] == (
        f"verified 1 of 1 entries under {none} (1 of them from the published copy): "
        "1 ok, 0 changed, 0 missing (no checkpoint)"
    )
    # the published model loads by name, with the head its in-domain rows attacked
    clf = load.load_model(e.id, head=True)
    x = torch.rand(3, 1, 8, 8)
    assert clf(x).shape == (3, 5)
    corrupted = load.load_model(e.id, protocol="corruption", head=True)  # the in-domain head
    assert torch.equal(corrupted.head.weight, clf.head.weight)
    # one flipped bit in the published weights: verify says changed and exits 1
    w = target / "models" / e.id / WEIGHTS
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01
    w.write_bytes(bytes(data))
    assert cli.main(["zoo", "verify", "--zoo", "t", "--out", str(none)]) == 1
    assert capsys.readouterr().out.startswith(f"changed            {e.id}")


def test_label_free_rows_stay_on_the_board_and_out_of_the_pack(tmp_path: Path, published_root: Path) -> None:
    from robustbench_nacl.results.label_free import is_label_free

    e = tiny_entry(tmp_path / "zoo", "simclr", protocol="slf,label-free", n_examples=12)
    ck, board = _run_zoo(tmp_path)
    board_rows = load_rows(board)
    label_free = {r.row_id for r in board_rows if is_label_free(r)}
    assert label_free and len(board_rows) > len(label_free)  # both protocols were evaluated
    argv = ["zoo", "publish", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board)]
    assert cli.main(argv) == 0
    packed = load_rows(published_root / "t")
    assert packed and not any(is_label_free(r) for r in packed)
    assert {r.row_id for r in packed} == {r.row_id for r in board_rows} - label_free
    # publishing still asks for the label-free rows first: a board without them is not complete
    for f in (board / "rows").glob("*.json"):
        if json.loads(f.read_text())["row_id"] in label_free:
            f.unlink()
    with pytest.raises(UserError, match=rf"{e.id}: \d+ of \d+ rows under the board"):
        release.publish_zoo(zoo.load_zoo("t"), ck, board, "t")


def test_a_changed_published_card_or_pin_fails_verify(tmp_path: Path, published_root: Path) -> None:
    e = tiny_entry(tmp_path / "zoo", "simclr")
    ck, board = _run_zoo(tmp_path)
    assert cli.main(["zoo", "publish", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board)]) == 0
    pinned = zoo.load_zoo("t")[0]
    assert verify.verify_entry(pinned, tmp_path / "none")[0] == "ok"
    assert verify.verify_entry(dataclasses.replace(pinned, weights_sha256="0" * 64), tmp_path / "none")[
        0
    ] == ("unpinned-mismatch")
    card = published_root / "t" / "models" / e.id / "card.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "weights_sha256": "1" * 64}))
    status, detail = verify.verify_entry(pinned, tmp_path / "none")
    assert status == "changed" and "model card 111111111111" in detail


def test_a_republish_keeps_the_pinned_heads_of_kept_rows_and_drops_the_heads_no_row_attacks(
    tmp_path: Path, published_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a regeneration keeps some entries' checkpoints and rows, whose heads were fitted by an earlier
    # run and live only in the published set: publishing again takes them from there (checked against
    # their pins), and a head no row attacks any more leaves the set (verify refuses unpinned heads)
    e = tiny_entry(tmp_path / "zoo", "simclr")
    ck, board = _run_zoo(tmp_path)
    argv = ["zoo", "publish", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board)]
    assert cli.main(argv) == 0
    heads = published_root / "t" / "heads"
    pins = json.loads((published_root / "t" / "heads.json").read_text())
    published = {p.name: p.read_bytes() for p in heads.iterdir()}
    assert published and len(pins) == len(published)
    shutil.rmtree(board / "heads")  # the board that fitted them is gone
    (heads / ("0" * 24 + ".safetensors")).write_bytes(b"a head of a superseded checkpoint")
    assert cli.main(argv) == 0
    assert {p.name: p.read_bytes() for p in heads.iterdir()} == published
    assert json.loads((published_root / "t" / "heads.json").read_text()) == pins
    assert not (published_root / "t" / "heads.new").exists()
    assert load.heads_problems(published_root / "t") == []
    # a published copy that no longer matches its pin is not taken: one line, and nothing of the set
    # is written (the check runs before any model is copied: the card removed here stays removed)
    damaged = next(iter(sorted(heads.iterdir())))
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\x00")
    card = published_root / "t" / "models" / e.id / "card.json"
    card.unlink()
    capsys.readouterr()
    assert cli.main(argv) != 0
    assert "is missing (and the set holds no pinned copy)" in capsys.readouterr().err
    assert len(list(heads.iterdir())) == len(published) and not card.exists()


def test_regenerate_keeps_a_pin_only_while_the_entry_trains_the_same_weights(tmp_path: Path) -> None:
    e = zoo.fashion_mnist_zoo()[0]
    path = tmp_path / f"{e.id}.json"
    path.write_text(json.dumps(dataclasses.replace(e, weights_sha256="a" * 64).to_dict()))
    assert generated.keep_pin(e, path).weights_sha256 == "a" * 64
    re_evaluated = dataclasses.replace(e, eval={**e.eval, "n_examples": 100}, description="other words")
    assert generated.keep_pin(re_evaluated, path).weights_sha256 == "a" * 64  # evaluation: same weights
    retrained = dataclasses.replace(e, recipe={**e.recipe, "epochs": e.recipe["epochs"] + 1})
    assert generated.keep_pin(retrained, path).weights_sha256 is None  # a new recipe: the pin goes
    assert generated.keep_pin(e, tmp_path / "absent.json").weights_sha256 is None
    path.write_text("{not json")
    assert generated.keep_pin(e, path).weights_sha256 is None  # a damaged manifest is rewritten, unpinned


def test_the_shipped_demo_rows_are_one_pack_that_reads_as_rows() -> None:
    d = published_dir() / "demo"
    assert (d / ROW_PACK).is_file() and not (d / "rows").exists()
    rows = load_rows(d)
    assert len(rows) == 1771 and len({r.row_id for r in rows}) == 1771  # 22 entries and the control
    # the published model by its path in the package; a control by its own id (hub/portable.py)
    for r in rows:
        named = r["checkpoint_id"] if r["control"] else f"demo/models/{r['checkpoint_id']}"
        assert r["checkpoint"] == named, r.row_id


def test_a_row_pack_is_deterministic_deduplicated_and_a_damaged_one_is_one_line(tmp_path: Path) -> None:
    rows = load_rows(published_dir() / "demo")[:40]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_row_pack(a, rows)
    write_row_pack(b, list(reversed(rows)) + rows[:5])  # order and repeats do not change the bytes
    assert (a / ROW_PACK).read_bytes() == (b / ROW_PACK).read_bytes()
    # a folder of row files beside a pack: a row in both is one row
    from robustbench_nacl.results.rows import write_row

    for r in rows[:10]:
        write_row(a, r)
    assert [r.row_id for r in load_rows(a)] == [r.row_id for r in load_rows(b)]
    (a / ROW_PACK).write_bytes(gzip.compress(b"{}\n[1, 2]\n"))
    with pytest.raises(UserError, match=r"row pack .* holds a line that is not a JSON object"):
        load_rows(a)
    (a / ROW_PACK).write_bytes(b"not gzip")
    with pytest.raises(UserError) as err:
        load_rows(a)
    assert str(err.value).startswith(f"cannot read row pack {a / ROW_PACK}") and "\n" not in str(err.value)


def test_a_head_is_looked_up_among_slf_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def row(pid: str, setting: str, protocol: str | None = None) -> dict:
        ft = {"finetune": {"protocol": protocol}} if protocol else {}
        return {"protocol_id": pid, "setting": setting, "dataset": "fashion-mnist:0-4", **ft}

    rows = [row("p-alf", "in-domain", "alf"), row("p-aff", "in-domain", "aff"), row("p-slf", "in-domain")]
    monkeypatch.setattr(load, "model_rows", lambda model: rows)
    model = catalog.PublishedModel("m", "s", Path("s/models/m"), {})
    assert load.protocol_row(model, None)["protocol_id"] == "p-slf"  # not the ALF row before it
    with pytest.raises(UserError, match=r"m has no rows under protocol 'p-alf'; its protocols: p-slf \("):
        load.protocol_row(model, "p-alf")
    assert load.protocol_row(model, "SLF")["protocol_id"] == "p-slf"  # the field's name for it
    with pytest.raises(UserError, match=r"SLF linear heads only: ALF trains its own head on each run; "
                       r"evaluate it as the reference did with "
                       r"`robustbench-nacl eval --model m --like-zoo s --protocol alf`"):  # fmt: skip
        load.protocol_row(model, "alf")
    rows += [row(f"p-c{i}", "corruption") for i in range(27)]
    with pytest.raises(UserError) as err:
        load.protocol_row(model, "digits:5-9")
    assert str(err.value).endswith("its protocols: p-slf (in-domain fashion-mnist:0-4); 27 corruption "
                                   "protocols (they attack the in-domain head)")  # fmt: skip


def _post_folder(d: Path) -> Path:
    """A checkpoint folder whose manifest cites pseudo-labels, as a ++ post-processing writes it."""
    d.mkdir(parents=True)
    (d / WEIGHTS).write_bytes(b"weights")
    (d / "pseudo_labels.safetensors").write_bytes(b"labels")
    manifest = {
        "encoder": "convnet_small",
        "weights": WEIGHTS,
        "weights_sha256": sha256_file(d / WEIGHTS),
        "post": {
            "recipe": "dynacl++",
            "pseudo_labels": "pseudo_labels.safetensors",
            "pseudo_labels_sha256": sha256_file(d / "pseudo_labels.safetensors"),
        },
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_a_post_processed_checkpoint_publishes_and_verifies_its_pseudo_labels(tmp_path: Path) -> None:
    from robustbench_nacl.models.checkpoint import pinned_files, read_manifest

    src = _post_folder(tmp_path / "src")
    manifest = read_manifest(src)
    assert pinned_files(manifest) == {
        "pseudo_labels.safetensors": sha256_file(src / "pseudo_labels.safetensors")
    }
    dest = tmp_path / "dest"
    dest.mkdir()
    release.copy_pinned_files(src, dest, manifest)
    assert (dest / "pseudo_labels.safetensors").read_bytes() == b"labels"
    entry = dataclasses.replace(zoo.fashion_mnist_zoo()[0], weights_sha256=None)
    assert verify._verify_folder(entry, src) == ("ok", manifest["weights_sha256"])
    (src / "pseudo_labels.safetensors").write_bytes(b"other")  # what the manifest cites is not there
    status, detail = verify._verify_folder(entry, src)
    assert status == "changed" and "pseudo_labels.safetensors: missing or not the file" in detail
    with pytest.raises(UserError, match="not the file its manifest pins"):
        release.copy_pinned_files(src, dest, manifest)
    # a manifest may not name a file outside its folder
    bad = {**manifest, "post": {**manifest["post"], "pseudo_labels": "../labels.safetensors"}}
    with pytest.raises(UserError, match="is not a file of the checkpoint"):
        pinned_files(bad)
    assert pinned_files({"encoder": "convnet_small"}) == {}
