"""Published reference models: load by name, reproduce the committed rows, cards, downloads, submissions.

The published set is the demo zoo (digits classes 0-4, one seed per family) trained and evaluated
with the shipped manifests; its weights, heads, rows and cards live in the package
(robustbench_nacl/files/published/demo).
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import torch
from _models import one_thread
from _reliability import TINY

from robustbench_nacl import load_model, published_models, zoo
from robustbench_nacl.cli import main
from robustbench_nacl.data import load_dataset
from robustbench_nacl.errors import UserError
from robustbench_nacl.hub import catalog
from robustbench_nacl.hub.cards import card_schema
from robustbench_nacl.hub.catalog import coverage, find_model, model_rows
from robustbench_nacl.packaged import published_dir
from robustbench_nacl.results.bits import decode_bits
from robustbench_nacl.results.rows import load_rows
from robustbench_nacl.training import train
from robustbench_nacl.utils import device_name

SET = "demo"
N = 200  # the committed rows' first N examples are re-attacked (digits 0-4 has 180 test images)
NAME = "convnet_small.simclr_digits-0-4_s0"


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


# ============ every published entry reproduces its committed rows ============


def _key(r) -> tuple:
    return (r["attack"], r["norm"], r["eps"], json.dumps(r["attack_params"], sort_keys=True))


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple]]:
    """``eval --model NAME`` in-domain on the first N test examples, for every demo-zoo entry."""
    out = tmp_path_factory.mktemp("reproduce")
    flips: dict[str, list[tuple]] = {}
    with one_thread():  # the committed rows were measured with one torch thread
        for m in published_models():
            if m.set != SET:
                continue
            args = ["eval", "--model", m.name, "--suite", "paper", "--n-examples", str(N), "--out", str(out)]
            assert main([*args, "--no-progress"]) == 0
            mine = {_key(r): r for r in load_rows(out) if r["checkpoint_sha256"] == m.weights_sha256}
            theirs = [r for r in model_rows(m) if r["setting"] == "in-domain"]
            assert theirs and len(mine) == len(theirs), m.name
            same_machine = all(
                r["device"] == device_name("cpu") and r["versions"]["torch"] == torch.__version__
                for r in theirs
            )
            for r in theirs:
                n = min(N, r["n_examples_evaluated"])
                got = mine[_key(r)]
                assert got["n_examples_evaluated"] == n
                for kind in ("clean", "robust"):
                    a = decode_bits(got[f"{kind}_bits"], n)
                    b = decode_bits(r[f"{kind}_bits"], r["n_examples_evaluated"])[:n]
                    flips.setdefault(m.name, []).append(
                        (kind, r["attack"], r["eps"], int((a != b).sum()), n, same_machine)
                    )
    return flips


def test_every_demo_entry_reproduces_its_committed_rows_through_eval_model(
    reproduced: dict[str, list[tuple]],
) -> None:
    assert set(reproduced) == set(coverage(SET)["models"])  # every published entry was re-evaluated
    total = sum(f for rows in reproduced.values() for kind, _, _, f, _, _ in rows if kind == "robust")
    rows = sum(1 for v in reproduced.values() for kind, *_ in v if kind == "robust")
    print(f"{len(reproduced)} published models, {rows} rows re-attacked: {total} attacked outcomes flipped")
    for name, checks in reproduced.items():
        for kind, attack, eps, flipped, n, same_machine in checks:
            where = f"{name} {attack} eps {eps}: {flipped} of {n} {kind} outcomes flipped"
            if kind == "clean" or same_machine:
                assert flipped == 0, where  # the published head: the same classifier, bit for bit
            else:  # another CPU's rounding may flip a borderline example
                assert flipped <= max(1, n // 200), where


def test_load_model_returns_the_encoder_and_the_probed_classifier_of_a_protocol() -> None:
    model = find_model(NAME)
    encoder = load_model(NAME, dataset="digits")
    classifier = load_model(NAME, dataset="digits:0-4", protocol="in-domain", head=True)
    test = load_dataset("digits:0-4", "test")
    x = test.x.float().div(255)
    with torch.no_grad():
        features, logits = encoder(x), classifier(x)
    assert features.shape == (len(x), features.shape[1]) and logits.shape == (len(x), 5)
    row = next(r for r in model_rows(model) if r["setting"] == "in-domain")
    clean = decode_bits(row["clean_bits"], row["n_examples_evaluated"])
    assert torch.equal(torch.as_tensor(clean), logits.argmax(1) == test.y)  # the head the rows attacked
    transfer = load_model(NAME, protocol="digits:5-9", head=True)
    assert transfer.head.out_features == 5 and not torch.equal(transfer.head.weight, classifier.head.weight)
    with pytest.raises(UserError, match=r"no published model '\S+_s9'.*did you mean"):
        load_model("convnet_small.simclr_digits-0-4_s9")


def test_models_json_lists_every_published_entry_and_every_card_validates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _cli(["models", "--json"], capsys)
    listed = {c["name"]: c for c in json.loads(out)}  # every set's (the reference's too, once published)
    assert code == 0 and {n for n, c in listed.items() if c["set"] == SET} == set(coverage(SET)["models"])
    assert set(coverage(SET)["presets"]) <= {e.loss for e in zoo.load_zoo(SET)}
    schema = card_schema()
    checker = jsonschema.validators.validator_for(schema)
    checker.check_schema(schema)  # once, as jsonschema.validate would for every card
    validator = checker(schema)
    cards = sorted(published_dir().glob("*/models/*/card.json"))
    assert len(cards) == len(listed)
    ids = {s: {e.id for e in zoo.load_zoo(s)} for s in {p.parents[2].name for p in cards}}
    for path in cards:
        card = json.loads(path.read_text())
        validator.validate(card)
        s = path.parents[2].name
        assert listed[card["name"]]["set"] == s and card["name"] in ids[s]
        if s == SET:  # the demo zoo: SLF on digits' 180 test images, no ALF
            assert card["headline"]["SLF"]["n_examples"] == 180 and card["headline"]["ALF"] is None
    code, out, _ = _cli(["models", "--dataset", "digits"], capsys)
    assert code == 0 and NAME in out
    code, _, err = _cli(["models", "--dataset", "cifar10"], capsys)
    _one_line_error(code, err, "no published model pretrained on cifar10", "digits:0-4")
    bad = dict(json.loads(cards[0].read_text()), clean_acc=95.6)  # RobustBench's fields are strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_models_adds_a_column_for_alf_and_aff_where_a_card_has_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = find_model(NAME)
    code, out, _ = _cli(["models", "--dataset", "digits"], capsys)
    assert code == 0 and "robust (ALF)" not in out.splitlines()[0]  # no demo card has ALF
    alf = {**demo.card["headline"]["SLF"], "clean_acc": 0.692, "robust_acc": 0.534}
    card = {**demo.card, "headline": {**demo.card["headline"], "ALF": alf}}
    monkeypatch.setattr(
        catalog, "published_models", lambda d=None: [dataclasses.replace(demo, card=card), demo]
    )
    code, out, _ = _cli(["models"], capsys)
    header, _, with_alf, without = out.splitlines()[:4]
    assert code == 0 and header.split("|")[-2].strip() == "robust (ALF)" and "robust (AFF)" not in header
    assert with_alf.split("|")[-2].strip() == "53.4% (clean 69.2%)" and without.split("|")[-2].strip() == "-"


def test_leaderboard_rows_accepts_a_published_set_or_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(["leaderboard", "--rows", NAME, "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert "simclr" in (tmp_path / "b" / "LEADERBOARD.md").read_text()
    code, _, err = _cli(["leaderboard", "--rows", "no-such-thing", "--out", str(tmp_path / "c")], capsys)
    _one_line_error(code, err, "--rows no-such-thing", "published set")


# ============ weights from a folder or a URL; damaged and missing files ============


@pytest.fixture
def weights_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server on 127.0.0.1 serving a copy of the published models folder."""
    root = tmp_path / "served"
    shutil.copytree(published_dir() / SET / "models", root)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # no request log on the test's output
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def test_weights_download_once_into_the_cache_and_a_damaged_download_is_refused(
    weights_server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, served = weights_server
    monkeypatch.setenv("ROBUSTBENCH_NACL_CACHE", str(tmp_path / "cache"))
    want = load_model(NAME).state_dict()
    got = load_model(NAME, weights_from=url).state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    cached = list((tmp_path / "cache").rglob("weights.safetensors"))
    assert len(cached) >= 1
    (served / NAME / "weights.safetensors").unlink()  # a second load reads the cache, not the server
    load_model(NAME, weights_from=url)
    other = "convnet_small.debiased_digits-0-4_s0"
    data = bytearray((served / other / "weights.safetensors").read_bytes())
    data[-1] ^= 1
    (served / other / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"the server holds a damaged file or another model's"):
        load_model(other, weights_from=url)
    assert len(list((tmp_path / "cache").rglob("weights.safetensors"))) == len(cached)  # not cached
    cached[0].write_bytes(cached[0].read_bytes()[:-1] + b"x")  # damaged in the cache since
    with pytest.raises(
        UserError, match=r"damaged since they were downloaded\): delete .* to download them again"
    ):
        load_model(NAME, weights_from=url)
    with pytest.raises(UserError, match=r"cannot download .*404"):
        load_model("convnet_small.hardneg_digits-0-4_s0", weights_from=url + "/nothing-here")


def test_a_damaged_or_missing_weights_file_is_one_line_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "w"
    shutil.copytree(published_dir() / SET / "models" / NAME, folder / NAME)
    data = bytearray((folder / NAME / "weights.safetensors").read_bytes())
    data[100] ^= 0xFF
    (folder / NAME / "weights.safetensors").write_bytes(bytes(data))
    args = ["eval", "--model", NAME, "--weights-from", str(folder), "--out", str(tmp_path / "o")]
    code, _, err = _cli(args, capsys)
    _one_line_error(code, err, "sha256", "model card pins", "replace")
    code, _, err = _cli([*args[:4], str(tmp_path / "empty"), *args[5:]], capsys)
    _one_line_error(code, err, "holds neither", "weights.safetensors")
    assert not (tmp_path / "o").exists()  # nothing written


# ============ a user's checkpoint gets a card; benchmark writes one ============


@pytest.fixture(scope="module")
def user_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "mine"
    with one_thread():
        train(TINY, out, progress=False)
    return out


def test_a_user_checkpoint_evaluated_with_card_gets_a_card_that_validates(
    user_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["eval", str(user_checkpoint), "--suite", "quick", "--n-examples", "40", "--probe-epochs", "20"]
    with one_thread():
        code, _, err = _cli([*args, "--out", str(tmp_path), "--card", "--no-progress"], capsys)
    assert code == 0, err
    card = json.loads(next((tmp_path / "cards").glob("*.json")).read_text())
    jsonschema.validate(card, card_schema())
    rows = load_rows(tmp_path)
    assert card["weights_sha256"] == rows[0]["checkpoint_sha256"] and card["loss"]["family"] == "simclr"
    assert card["headline"]["SLF"]["n_examples"] == 40 and card["autoattack_acc"] is None


def test_benchmark_writes_a_card_like_robustbench(tmp_path: Path) -> None:
    from _models import digits_data, digits_model

    from robustbench_nacl import benchmark

    _, _, x, y = digits_data()
    with one_thread():
        rows = benchmark(digits_model(), x[:40], y[:40], "quick", progress=False, card=tmp_path / "m.json")
    card = json.loads((tmp_path / "m.json").read_text())
    jsonschema.validate(card, card_schema())
    worst = max((r for r in rows if r["attack"] == "worst_case"), key=lambda r: r["eps"])
    assert card["name"] == "m" and card["headline"]["SLF"]["robust_acc"] == worst["robust_acc"]
    assert card["clean_acc"] == f"{100 * worst['clean_acc']:.2f}"


# ============ a submission: accepted when genuine, rejected naming the row when tampered ============


def _submission(checkpoint: Path, folder: Path) -> Path:
    args = ["eval", str(checkpoint), "--suite", "quick", "--n-examples", "40", "--probe-epochs", "20"]
    assert main([*args, "--out", str(folder), "--card", "--save-heads", "--no-progress"]) == 0
    shutil.move(str(next((folder / "cards").glob("*.json"))), folder / "card.json")
    shutil.copytree(checkpoint, folder / "checkpoint", ignore=shutil.ignore_patterns("*.pt", "*.log"))
    return folder


def test_verify_submission_accepts_a_genuine_one_and_rejects_a_tampered_row(
    user_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with one_thread():
        folder = _submission(user_checkpoint, tmp_path / "sub")
        code, out, err = _cli(["zoo", "verify-submission", str(folder)], capsys)
        assert code == 0 and "accepted" in out, out + err
        # flip one attacked outcome of one row, and make its numbers agree with the flipped bits
        path = max((folder / "rows").glob("*.json"), key=lambda p: json.loads(p.read_text())["robust_acc"])
        row = json.loads(path.read_text())
        n = row["n_examples_evaluated"]
        bits = decode_bits(row["robust_bits"], n)
        i = int(bits.nonzero()[0][0])
        bits[i] = False
        from robustbench_nacl.results.bits import encode_bits

        row.update(robust_bits=encode_bits(bits), n_robust=int(bits.sum()), robust_acc=float(bits.mean()))
        path.write_text(json.dumps(row))
        code, out, err = _cli(["zoo", "verify-submission", str(folder)], capsys)
    assert code == 1, out + err
    assert f"row {row['row_id']}" in err and f"1 of {n} robust outcomes differ" in err and f"({i})" in err


# ============ new presets are "not in the reference yet", not failures ============


def test_a_plugin_preset_is_not_in_the_reference_yet_instead_of_failing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from robustbench_nacl.hub.load import not_covered
    from robustbench_nacl.losses import PRESETS, register_preset

    name = "test_only_preset_for_coverage"
    register_preset(name, description="a preset a plugin registers", G1="g1", tau_plus=0.02)
    try:
        assert name in not_covered(SET)
        assert name not in zoo.package_presets()  # the shipped zoos' generators are unchanged
        assert [e.to_dict() for e in zoo.load_zoo("demo")] == sorted(
            (e.to_dict() for e in zoo.demo_zoo()), key=lambda d: d["id"]
        )
        code, out, _ = _cli(["models"], capsys)
        assert code == 0 and "not in the published reference yet: " in out and name in out
    finally:
        PRESETS._items.pop(name, None)  # type: ignore[attr-defined]
        PRESETS._info.pop(name, None)  # type: ignore[attr-defined]


def test_zoo_regenerate_rewrites_the_generated_manifests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "zoo"
    (root / "demo").mkdir(parents=True)
    (root / "demo" / "convnet_small.gone_digits-0-4_s0.json").write_text("{}")
    assert zoo.regenerate("demo", root) == {"demo": (len(zoo.demo_zoo()), 1)}
    for e in zoo.load_zoo("demo"):
        assert (root / "demo" / f"{e.id}.json").read_text() == (
            zoo.zoo_root() / "demo" / f"{e.id}.json"
        ).read_text()
    code, _, err = _cli(["zoo", "regenerate", "--zoo", "nope"], capsys)
    _one_line_error(code, err, "unknown generated zoo 'nope'")


def test_a_damaged_head_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    from robustbench_nacl.eval.heads import head_path, load_head

    source = next((published_dir() / SET / "heads").glob("*.safetensors"))
    key = source.stem
    head, result = load_head(source.parent, key)  # type: ignore[misc]
    assert head.weight.shape[0] == 5 and 0 < result.test_acc <= 1
    damaged = head_path(tmp_path, key)
    damaged.write_bytes(source.read_bytes()[:40])
    with pytest.raises(UserError, match=r"is damaged .*; delete it to refit the probe"):
        load_head(tmp_path, key)
    assert load_head(tmp_path, "0" * 24) is None  # no head: the probe is fitted


def test_a_card_headlines_autoattacks_epsilon_when_the_suite_goes_beyond_it() -> None:
    from robustbench_nacl.hub.cards import headline_row

    def row(attack: str, eps: float, acc: float) -> dict:
        return {"attack": attack, "norm": "Linf", "eps": eps, "robust_acc": acc}

    sweep = [row("fgsm", 0.1, 0.05), row("worst_case", 0.1, 0.04), row("worst_case", 0.032, 0.3)]
    assert headline_row(sweep) == sweep[1]  # no AutoAttack: the suite's largest eps
    with_aa = [*sweep, row("autoattack", 0.032, 0.31)]
    assert headline_row(with_aa) == sweep[2]  # AutoAttack's eps, its worst case
    assert headline_row([row("autoattack", 0.032, 0.31)])["attack"] == "autoattack"


def test_a_card_headlines_slf_and_fills_alf_and_aff_from_their_own_rows() -> None:
    from robustbench_nacl.hub.cards import card_of_rows

    def row(protocol: str | None, setting: str, attack: str, eps: float, clean: float, acc: float) -> dict:
        return {
            "checkpoint_id": "m", "checkpoint_sha256": "a" * 64, "encoder": "convnet_small",
            "recipe": {}, "recipe_id": "r", "pretrain_dataset": "fashion-mnist:0-4", "loss": "simclr",
            "loss_params": {}, "dataset": "fashion-mnist:0-4", "suite": "s", "n_examples": 500,
            "setting": setting, "protocol_id": f"{protocol}-{setting}", "attack": attack, "norm": "Linf",
            "eps": eps, "clean_acc": clean, "robust_acc": acc,
            **({"finetune": {"protocol": protocol}} if protocol else {}),
        }  # fmt: skip

    rows = [  # ALF and AFF rows first: the card must not take the first in-domain row's protocol
        row("alf", "in-domain", "worst_case", 0.032, 0.60, 0.45),
        row("alf", "in-domain", "autoattack", 0.032, 0.60, 0.46),
        row("aff", "in-domain", "worst_case", 0.032, 0.80, 0.70),
        row(None, "transfer", "worst_case", 0.032, 0.70, 0.10),
        row(None, "in-domain", "worst_case", 0.1, 0.85, 0.01),
        row(None, "in-domain", "worst_case", 0.032, 0.85, 0.20),
        row(None, "in-domain", "autoattack", 0.032, 0.85, 0.21),
    ]
    card = card_of_rows(rows, authors="t")
    assert (card["clean_acc"], card["autoattack_acc"], card["eps"]) == ("85.00", "21.00", "8.16/255")
    assert card["protocol_id"] == "None-in-domain"
    slf, alf, aff = (card["headline"][k] for k in ("SLF", "ALF", "AFF"))
    assert (slf["robust_acc"], slf["metric"], slf["eps"]) == (0.20, "worst_case", 0.032)
    assert (alf["clean_acc"], alf["robust_acc"], alf["protocol_id"]) == (0.60, 0.45, "alf-in-domain")
    assert (aff["clean_acc"], aff["robust_acc"]) == (0.80, 0.70)
    assert card_of_rows(rows[3:], authors="t")["headline"]["ALF"] is None  # not measured: null
