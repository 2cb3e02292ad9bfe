"""Untrusted checkpoints and bad input, through the CLI: one line on stderr, exit code 2, nothing
executed and nothing written. The suite and zoo parsers (and our checkpoint manifest) are fuzzed:
only ``UserError`` may escape them.

The API-level checkpoint tests live in ``test_foreign.py`` (layouts, strictness, refusal of pickled
code, env override); the train-flag errors of ``test_evaluate.py`` (unknown loss, encoder and
dataset, M=0, lam=2, batch size 1, an out-of-range class subset) are not repeated here.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _models import one_thread
from _reliability import TINY, cli, eval_args, one_line_error, train_args
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from robustbench_nacl import zoo
from robustbench_nacl.attack.suites import parse_suite_text
from robustbench_nacl.errors import UserError
from robustbench_nacl.io import sha256_bytes
from robustbench_nacl.models.checkpoint import MANIFEST, WEIGHTS
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.models.foreign import load_encoder
from robustbench_nacl.training import train

REPO = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


# ============ checkpoint builders ============


class Payload:
    """A pickled object whose ``__reduce__`` runs a shell command: it must never run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def _torch_bytes(obj, **kw) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def resnet_state() -> dict[str, torch.Tensor]:
    """A full-size resnet18_cifar backbone (``--arch resnet18_cifar`` builds the default width)."""
    torch.manual_seed(0)
    return dict(create_encoder("resnet18_cifar").backbone.state_dict())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory written by ``train``."""
    return train(TINY, tmp_path_factory.mktemp("run") / "run", progress=False)


def _with(state: dict, key: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    out = dict(state)
    out[key] = fn(out[key].clone())
    return out


def _poison(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(t: torch.Tensor) -> torch.Tensor:
        t.view(-1)[3] = value
        return t

    return fn


def _foreign(kind: str, state: dict, tmp: Path) -> tuple[Path, list[str]]:
    """Write one foreign file; returns (path, extra CLI flags)."""
    conv = "layer2.0.conv1.weight"
    files: dict[str, tuple[str, Callable[[], bytes]]] = {
        "control-safetensors": ("ok.safetensors", lambda: st_save(state)),
        "control-pth": ("ok.pth", lambda: _torch_bytes(state)),
        "truncated-safetensors": ("t.safetensors", lambda: st_save(state)[:3_000_000]),
        "truncated-pth": ("t.pth", lambda: _torch_bytes(state)[:3_000_000]),
        "empty-file": ("e.pt", lambda: b""),
        "not-a-checkpoint": ("x.pth", lambda: b"definitely not a checkpoint"),
        "wrong-architecture": ("ok.safetensors", lambda: st_save(state)),
        "missing-key": (
            "m.safetensors",
            lambda: st_save({k: v for k, v in state.items() if "layer4.1.bn2" not in k}),
        ),
        "extra-key": (
            "u.safetensors",
            lambda: st_save({**state, "layer5.0.conv1.weight": torch.zeros(3, 3)}),
        ),
        "nan": ("n.safetensors", lambda: st_save(_with(state, conv, _poison(float("nan"))))),
        "inf": ("i.pth", lambda: _torch_bytes(_with(state, conv, _poison(float("inf"))))),
        "neg-inf": ("ni.safetensors", lambda: st_save(_with(state, conv, _poison(float("-inf"))))),
        "pickle-payload": ("evil.pth", lambda: _torch_bytes({**state, "evil": Payload(tmp / "PWNED")})),
        "pickle-payload-nested": (
            "evil.ckpt",
            lambda: _torch_bytes({"epoch": 3, "state_dict": {**state, "x": Payload(tmp / "PWNED")}}),
        ),
        "pickle-payload-legacy-format": (
            "evil.pt",
            lambda: _torch_bytes({"w": Payload(tmp / "PWNED")}, _use_new_zipfile_serialization=False),
        ),
        "raw-pickle-payload": ("evil.pkl", lambda: pickle.dumps({"conv1.weight": Payload(tmp / "PWNED")})),
    }
    name, make = files[kind]
    path = tmp / name
    path.write_bytes(make())
    return path, ["--arch", "resnet50_cifar" if kind == "wrong-architecture" else "resnet18_cifar"]


FOREIGN = {
    # kind: fragments of the one error line
    "control-safetensors": ("pass --dataset",),  # it loaded: the next missing piece is reported
    "control-pth": ("pass --dataset",),
    "truncated-safetensors": ("not a valid safetensors file",),
    "truncated-pth": ("not a readable torch checkpoint",),
    "empty-file": ("is an empty file, not a checkpoint",),
    "not-a-checkpoint": ("is a text file (it begins 'definitely not a checkpoint'), not a checkpoint",),
    "wrong-architecture": ("does not fit the architecture", "--arch resnet50_cifar"),
    "missing-key": ("missing: layer4.1.bn2",),
    "extra-key": ("unexpected: layer5.0.conv1.weight",),
    "nan": ("NaN or Inf",),
    "inf": ("NaN or Inf",),
    "neg-inf": ("NaN or Inf",),
    "pickle-payload": ("refused", "system"),
    "pickle-payload-nested": ("refused", "system"),
    "pickle-payload-legacy-format": ("refused",),
    "raw-pickle-payload": ("refused",),
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_foreign_checkpoint_through_the_cli(
    kind: str, resnet_state: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, flags = _foreign(kind, resnet_state, tmp_path)
    out = tmp_path / "lb"
    rc, _, err = cli([*eval_args(path, out), *flags], capsys)
    assert not (tmp_path / "PWNED").exists()  # nothing was executed
    line = one_line_error(rc, err, *FOREIGN[kind], command="eval")
    assert kind.startswith("control") or str(path) in line
    assert not out.exists()  # nothing was written


def _forge(run: Path, tmp: Path, kind: str) -> tuple[Path, list[str]]:
    """A copy of ``run`` broken in one way; the manifest's sha256 is re-forged to match where the
    point is what lies beyond the hash check."""
    d = tmp / "forged"
    shutil.copytree(run, d)
    manifest = json.loads((d / MANIFEST).read_text())
    weights = d / WEIGHTS
    state = dict(st_load(weights.read_bytes()))
    conv = next(k for k, v in state.items() if k.startswith("encoder.backbone") and v.dim() == 4)
    data: bytes | None = None
    flags: list[str] = []
    if kind == "control":
        flags = ["--shift", "nope"]  # loads fine; fails on the next flag
    elif kind == "sha256-mismatch":
        raw = bytearray(weights.read_bytes())
        raw[-1] ^= 1  # one bit of one weight
        weights.write_bytes(bytes(raw))
    elif kind == "truncated":
        data = weights.read_bytes()[:1000]
    elif kind in ("nan", "inf"):
        data = st_save(_with(state, conv, _poison(float(kind))))
    elif kind == "missing-key":
        data = st_save({k: v for k, v in state.items() if k != conv})
    elif kind == "extra-key":
        data = st_save({**state, "encoder.extra.weight": torch.zeros(2)})
    elif kind == "wrong-architecture":
        manifest["encoder_kwargs"] = {"width": 16}
    elif kind == "arch-flag":
        flags = ["--arch", "resnet18_cifar"]
    elif kind == "weights-are-a-pickle":
        data = _torch_bytes({"w": Payload(tmp / "PWNED")})
    elif kind == "weights-outside-the-directory":
        manifest["weights"] = "../run/weights.safetensors"
    elif kind == "manifest-not-json":
        (d / MANIFEST).write_text('{"encoder": "convnet_small", ')
        return d, flags
    elif kind == "manifest-forged-types":
        manifest["normalization"] = [0.5]
    elif kind == "manifest-huge-integer":
        (d / MANIFEST).write_text('{"encoder": ' + "9" * 5000 + "}")
        return d, flags
    if data is not None:
        weights.write_bytes(data)
        manifest["weights_sha256"] = sha256_bytes(data)
    (d / MANIFEST).write_text(json.dumps(manifest))
    return d, flags


OURS = {
    "control": ("unknown shift 'nope'",),
    "sha256-mismatch": ("sha256", "does not match its manifest"),
    "truncated": ("not a valid safetensors file",),
    "nan": ("NaN or Inf",),
    "inf": ("NaN or Inf",),
    "missing-key": ("missing",),
    "extra-key": ("unexpected: extra.weight",),
    "wrong-architecture": ("wrong shape",),
    "arch-flag": ("not --arch resnet18_cifar",),
    "weights-are-a-pickle": ("not a valid safetensors file",),
    "weights-outside-the-directory": ("must be a file name",),
    "manifest-not-json": ("not valid JSON",),
    "manifest-forged-types": ("'normalization' must be",),
    "manifest-huge-integer": ("not valid JSON",),
}


@pytest.mark.parametrize("kind", list(OURS))
def test_own_checkpoint_through_the_cli(
    kind: str, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, flags = _forge(run_dir, tmp_path, kind)
    out = tmp_path / "lb"
    rc, _, err = cli([*eval_args(path, out), *flags], capsys)
    one_line_error(rc, err, *OURS[kind], command="eval")
    assert not (tmp_path / "PWNED").exists() and not out.exists()


@pytest.mark.slow
def test_pickled_code_never_runs_through_the_real_entry_point(
    resnet_state: dict, run_dir: Path, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The same refusals from a fresh interpreter, also with the env override that would let
    ``torch.load`` unpickle code set (refused before anything is read)."""
    marker = tmp_path / "PWNED"
    small = {k: v for k, v in list(resnet_state.items())[:4]}
    (tmp_path / "evil.pth").write_bytes(_torch_bytes({**small, "evil": Payload(marker)}))
    (tmp_path / "legacy.pt").write_bytes(
        _torch_bytes({"w": Payload(marker)}, _use_new_zipfile_serialization=False)
    )
    # a plain pickle (protocol 4): torch warns about the protocol, which must not add stderr lines
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"conv1.weight": Payload(marker)}, protocol=4))
    forged, _ = _forge(run_dir, tmp_path, "weights-are-a-pickle")
    unsafe_env = {**cli_env, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    runs = [
        (["--arch", "resnet18_cifar"], tmp_path / "evil.pth", cli_env, "beyond tensors"),
        (["--arch", "resnet18_cifar"], tmp_path / "evil.pth", unsafe_env, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"),
        (["--arch", "resnet18_cifar"], tmp_path / "legacy.pt", cli_env, "refused"),
        (["--arch", "resnet18_cifar"], tmp_path / "evil.pkl", cli_env, "refused"),
        ([], forged, cli_env, "not a valid safetensors file"),
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "robustbench_nacl", *eval_args(path, tmp_path / "lb"), *flags],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flags, path, env, _ in runs
    ]
    results = [(proc.communicate(timeout=300)[1], proc.returncode) for proc in procs]
    assert not marker.exists()  # nothing was executed
    for (err, rc), (_, _, _, fragment) in zip(results, runs, strict=True):
        one_line_error(rc, err, fragment, command="eval")
    assert not (tmp_path / "lb").exists()


# ============ bad flags and config files ============


def _suite(tmp: Path, text: str) -> str:
    path = tmp / "suite.toml"
    path.write_text(text)
    return str(path)


EVAL_BAD = {
    # case: (flags, fragments)
    "unknown suite": (
        ["--suite", "nope"],
        (
            "unknown attack suite 'nope'",
            "available: autoattack, autoattack-screen, fashion-mnist, fashion-mnist-aa,",
        ),
    ),
    "unknown attack": (
        ["--suite", '[[attack]]\nname = "fgsn"\neps = [0.1]\n'],
        ("unknown attack 'fgsn'", "valid choices: fgsm, fgsm_l2, pgd, autoattack"),
    ),
    "eps < 0": (
        ["--suite", '[[attack]]\nname = "fgsm"\neps = [-0.01]\n'],
        ("eps -0.01 out of range", "[0, 1]"),
    ),
    "eps > 1": (["--suite", '[[attack]]\nname = "pgd"\neps = [1.5]\n'], ("eps 1.5 out of range", "[0, 1]")),
    "eps > 1 as k/255": (["--suite", '[[attack]]\nname = "fgsm"\neps = ["300/255"]\n'], ("out of range",)),
    "unknown attack key": (
        ["--suite", '[[attack]]\nname = "pgd"\neps = [0.1]\niters = 3\n'],
        ("unknown key(s) iters", "allowed: name, norm, eps, subset, steps"),
    ),
    "setting suite without =": (["--setting-suite", "corruption"], ("write KIND=SUITE",)),
    "unknown setting kind": (
        ["--setting-suite", "shifts=quick"],
        ("setting suite for 'shifts'", "choose from"),
    ),
    "malformed toml": (
        ["--suite", '[[attack]]\nname = "pgd"\neps = [0.1,\nsteps = \n'],
        ("malformed TOML", "line 4"),
    ),
    "unknown dataset": (["--dataset", "imagenet"], ("unknown dataset 'imagenet'", "valid datasets: digits")),
    "unknown transfer": (["--transfer", "nope"], ("unknown dataset 'nope'", "valid datasets: digits")),
    "empty class list": (["--dataset", "digits:"], ("invalid class subset", "digits classes are 0-9")),
    "empty class range": (["--transfer", "digits:3-1"], ("empty range", "digits classes are 0-9")),
    "out-of-range classes": (["--transfer", "digits:20-30"], ("class 30 is out of range",)),
    "one class": (["--transfer", "digits:7"], ("at least 2",)),
    "unknown shift": (["--shift", "nope"], ("unknown shift 'nope'", "valid choices: all, grayscale, crop")),
    "n-examples 0": (["--n-examples", "0"], ("--n-examples 0: must be >= 1",)),
    "probe-epochs 0": (["--probe-epochs", "0"], ("probe epochs 0: must be",)),
    "probe-lr < 0": (["--probe-lr", "-1"], ("probe lr -1.0: must be",)),
    "probe-knn-k 0": (["--probe-knn-k", "0"], ("probe knn_k 0: must be",)),
    "probe-lr not a number": (["--probe-lr", "fast"], ("--probe-lr: invalid float value: 'fast'",)),
    "attack batch size 0": (["--batch-size", "0"], ("--batch-size 0: must be >= 1",)),
    "unknown normalization": (["--normalize", "nope"], ("valid choices: cifar10, half, imagenet, none",)),
    "unknown format": (["--format", "nope"], ("valid choices: auto, ours",)),
    "unknown device": (["--device", "tpu"], ("invalid --device 'tpu'", "cpu, cuda")),
    # issue 36: values the help calls invalid, and flags that would be ignored
    "alf eps > 1": (["--protocol", "alf", "--alf-eps", "2"], ("alf eps 2.0: must be <= 1",)),
    "aff eps > 1": (["--protocol", "aff", "--aff-eps", "5"], ("aff eps 5.0: must be <= 1",)),
    "aff momentum >= 1": (
        ["--protocol", "aff", "--aff-momentum", "7"],
        ("aff momentum 7.0: must be in [0, 1)",),
    ),
    "alf epochs < 1 without alf": (["--alf-epochs", "-3"], ("alf epochs -3: must be an integer >= 1",)),
    "alf flag without alf": (["--alf-epochs", "3"], ("--alf-* flags set ALF settings", "--protocol alf")),
    "descending severities": (["--severities", "5-1"], ("severities '5-1': a range goes up, e.g. 1-5",)),
    "missing data root": (["--data-root", "/no/such"], ("--data-root /no/such: no such folder",)),
}


@pytest.mark.parametrize("case", list(EVAL_BAD))
def test_bad_eval_input_is_one_line_exit_2(
    case: str, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, fragments = EVAL_BAD[case]
    flags = [_suite(tmp_path, f) if "[[attack]]" in f else f for f in flags]
    out = tmp_path / "lb"
    rc, _, err = cli([*eval_args(run_dir, out), *flags], capsys)
    one_line_error(rc, err, *fragments, command="eval")
    assert not out.exists()


TRAIN_BAD = {
    "lambda < 0": (["--loss", "mixnca", "--set", "lam=-0.1"], ("lam must lie in [0, 1]",)),
    "M < 1": (["--loss", "nca", "--set", "M=-1"], ("M must be >= 1",)),
    "M not an integer": (["--set", "M=2.5"], ("--set M='2.5': expected an integer",)),
    "unknown loss parameter": (
        ["--set", "lamda=0.5"],
        ("unknown loss parameter 'lamda'", "valid parameters: objective"),
    ),
    "unknown estimator": (["--set", "G1=g9"], ("G1='g9'", "valid choices: g0")),
    "adversarial eps > 1": (["--loss", "adv", "--set", "adv_eps=1.5"], ("adv_eps=1.5; must lie in [0, 1]",)),
    "adversarial eps < 0": (["--loss", "adv", "--set", "adv_eps=-0.01"], ("must lie in [0, 1]",)),
    "batch size 0": (["--batch-size", "0"], ("at least 2 images",)),
    "epochs 0": (["--epochs", "0"], ("--epochs 0: must be >= 1",)),
    "lr 0": (["--lr", "0"], ("--lr 0.0: must be a finite number > 0",)),
    "lr nan": (["--lr", "nan"], ("argument --lr: 'nan' is not a finite number",)),
    "weight decay < 0": (["--weight-decay", "-1"], ("--weight-decay -1.0: must be",)),
    "encoder width 0": (["--encoder-arg", "width=0"], ("width must be a positive integer",)),
    "unknown encoder option": (
        ["--encoder-arg", "depth=3"],
        ("does not take option(s) depth", "it takes: width"),
    ),
    "empty class range": (["--dataset", "digits:3-1"], ("empty range '3-1'",)),
    "unknown shift": (["--dataset", "digits@nope"], ("valid shifts: grayscale",)),
    "max-train 1": (["--max-train", "1"], ("--max-train 1: must be >= 2",)),
    "unknown precision": (["--precision", "fp8"], ("invalid choice: 'fp8'", "'fp32', 'bf16'")),
}


@pytest.mark.parametrize("case", list(TRAIN_BAD))
def test_bad_train_input_is_one_line_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, fragments = TRAIN_BAD[case]
    out = tmp_path / "run"
    args = train_args(out)
    for i in range(0, len(flags), 2):  # a flag given twice: argparse keeps the last
        if flags[i] in args and flags[i] not in ("--set", "--encoder-arg"):
            args[args.index(flags[i]) + 1] = flags[i + 1]
        else:
            args += flags[i : i + 2]
    if "--encoder-arg" in flags:  # replace width=8
        args.remove("width=8")
        args.remove("--encoder-arg")
    rc, _, err = cli(args, capsys)
    one_line_error(rc, err, *fragments, command="train")
    assert not out.exists()


def _zoo_dir(tmp: Path, text: str) -> Path:
    root = tmp / "zoo"
    (root / "t").mkdir(parents=True)
    (root / "t" / "entry.json").write_text(text)
    return root


VALID_ENTRY = zoo.demo_zoo()[0].to_dict()
ZOO_BAD = {
    "not json": ("{not json", ("not valid JSON",)),
    "deeply nested json": ("[" * 100_000 + "]" * 100_000, ("not valid JSON",)),
    "huge integer": ('{"seed": ' + "1" * 5000 + "}", ("not valid JSON",)),
    "not an object": ("[1, 2]", ("must be a JSON object",)),
    "path in id": (json.dumps({**VALID_ENTRY, "id": "../../escape"}), ("file-name-safe",)),
    "path in zoo": (json.dumps({**VALID_ENTRY, "zoo": ".."}), ("file-name-safe",)),
    "override of the wrong type": (
        json.dumps({**VALID_ENTRY, "overrides": {"t": None}}),
        ("expected a number",),
    ),
    "override as a list": (json.dumps({**VALID_ENTRY, "overrides": {"M": [3]}}), ("overrides.M must be",)),
    "unknown loss": (json.dumps({**VALID_ENTRY, "loss": "nope"}), ("valid choices: simclr",)),
}


@pytest.mark.parametrize("case", list(ZOO_BAD))
def test_malformed_zoo_manifest_is_one_line_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, fragments = ZOO_BAD[case]
    monkeypatch.setenv(zoo.ZOO_ENV, str(_zoo_dir(tmp_path, text)))
    for action in ("list", "train"):
        rc, _, err = cli(["zoo", action, "--zoo", "t", "--out", str(tmp_path / "ckpts")], capsys)
        one_line_error(rc, err, "entry.json", *fragments, command="zoo")
    assert not (tmp_path / "ckpts").exists()


def test_zoo_choices_and_a_forged_checkpoint_manifest(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, _, err = cli(["zoo", "list", "--zoo", "nope"], capsys)
    one_line_error(rc, err, "unknown zoo 'nope'", "valid choices: demo, fashion-mnist, paper", command="zoo")
    rc, _, err = cli(["zoo", "show", "convnet_small.simclr_digits-0-4_s9"], capsys)
    one_line_error(rc, err, "did you mean convnet_small.simclr_digits-0-4_s0", command="zoo")
    # `zoo verify` over a checkpoint whose manifest was tampered with: reported, no traceback
    entry = dataclasses.replace(zoo.ZooEntry(**VALID_ENTRY), id="e", zoo="t")
    monkeypatch.setenv(zoo.ZOO_ENV, str(tmp_path / "zoo"))
    zoo.write_entry(entry, tmp_path / "zoo")
    shutil.copytree(run_dir, tmp_path / "ckpts" / "e")
    (tmp_path / "ckpts" / "e" / MANIFEST).write_text('{"encoder": [')
    rc, out, err = cli(["zoo", "verify", "--zoo", "t", "--out", str(tmp_path / "ckpts")], capsys)
    assert rc == 1 and out.startswith("changed") and "not valid JSON" in out and "Traceback" not in err


# ============ fuzzing the parsers ============

_TOML_SCALARS = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=8).map(json.dumps),
    st.sampled_from(
        ["inf", "-inf", "nan", "1e400", "-0.0", "true", "false", "0x1f", "1_000", "1979-05-27", "07:32:00",
         "1979-05-27T07:32:00Z", '"8/255"', '"300/255"', '"-1/255"', '"1e3/255"', '""', '"Linf"', '"L2"']
    ),
)  # fmt: skip
_TOML_VALUES = st.recursive(
    _TOML_SCALARS,
    lambda kids: (
        st.lists(kids, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
        | st.dictionaries(st.sampled_from(["a", "name", "eps"]), kids, max_size=3).map(
            lambda d: "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}"
        )
    ),
    max_leaves=8,
)
_KEYS = ["norm", "eps", "steps", "step_size", "restarts", "version", "attacks", "random_start", "c", "x"]
_NAMES = [
    "fgsm",
    "pgd",
    "fgsm_l2",
    "autoattack",
    "torchattacks.PGD",
    "torchattacks.CW",
    "torchattacks.X",
    "nope",
]


@st.composite
def _suite_text(draw) -> str:
    """Syntactically valid TOML of the suite's shape with arbitrary values (reaches the validator)."""
    lines = [
        f"{k} = {draw(_TOML_VALUES)}" for k in draw(st.lists(st.sampled_from(["name", "description", "x"])))
    ]
    for _ in range(draw(st.integers(0, 3))):
        lines += ["[[attack]]", f"name = {json.dumps(draw(st.sampled_from(_NAMES)))}"]
        lines += [f"{k} = {draw(_TOML_VALUES)}" for k in draw(st.lists(st.sampled_from(_KEYS), unique=True))]
    return "\n".join(lines) + "\n"


_SHIPPED = [p.read_text() for p in sorted((REPO / "attacks").glob("*.toml"))]


@st.composite
def _mutated_shipped_suite(draw) -> str:
    text = draw(st.sampled_from(_SHIPPED))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        text = (
            text[:i]
            + draw(st.sampled_from(["", "[", "]", '"', "=", "\n", ".", "-", "9", "e", "/", "{"]))
            + text[i + 1 :]
        )
    return text


@FUZZ
@given(st.one_of(_suite_text(), _mutated_shipped_suite()))
@example('[[attack]]\nname = "fgsm"\nnorm = []\n')  # found by this test: an unhashable norm escaped
@example('[[attack]]\nname = "fg\\nsm"\neps = [0.1]\n')  # found: a newline in a name broke the one line
def test_fuzz_suite_toml_only_user_errors(text: str) -> None:
    """Complements test_attacks.py's fuzzing (random text, dict structures) with valid TOML."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            suite = parse_suite_text(text, source="fuzz.toml")
        assert suite.attacks and len(suite.sha256) == 64
    except UserError as e:
        assert "\n" not in str(e) and str(e).startswith("fuzz.toml")


_JSON = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-5, 10**20), st.floats(), st.text(max_size=10),
        st.sampled_from(["convnet_small", "simclr", "digits:0-4", "..", "a/b", "g2", "weights.safetensors"]),
    ),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=10,
)  # fmt: skip


@st.composite
def _mutated(draw, base: dict, paths: list[str]) -> dict:
    """``base`` with 1-3 fields (``a`` or ``a.b``) replaced by arbitrary JSON, or removed."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        head, _, leaf = draw(st.sampled_from(paths)).partition(".")
        if not leaf and draw(st.integers(0, 4)) == 0:
            data.pop(head, None)
        elif not leaf:
            data[head] = draw(_JSON)
        elif isinstance(data.get(head), dict):
            data[head][leaf] = draw(_JSON)
    return data


_ENTRY_PATHS = [
    *VALID_ENTRY,
    "recipe.epochs", "recipe.batch_size", "recipe.lr", "overrides.M", "overrides.lam", "overrides.t",
    "overrides.G1", "overrides.w", "overrides.nope", "eval.suite", "eval.n_examples", "eval.x",
    "encoder_kwargs.width", "bogus",
]  # fmt: skip


@FUZZ
@given(st.one_of(_JSON, _mutated(VALID_ENTRY, _ENTRY_PATHS)))
@example({**VALID_ENTRY, "overrides": {"M": "a\nb"}})  # found by this test: a newline broke the one line
@example({**VALID_ENTRY, "overrides": {"t": None}})  # found: reached the range checks as None (TypeError)
def test_fuzz_zoo_entry_only_user_errors(data) -> None:
    try:
        entry = zoo.parse_entry(data, "fuzz.json")
        assert entry.id == data["id"]
    except UserError as e:
        assert "\n" not in str(e) and "fuzz.json" in str(e)


@FUZZ
@given(text=st.one_of(st.text(max_size=300), st.builds(json.dumps, _mutated(VALID_ENTRY, _ENTRY_PATHS))))
def test_fuzz_zoo_manifest_files_only_user_errors(text: str, tmp_path_factory) -> None:
    root = tmp_path_factory.getbasetemp() / "fuzz-zoo"
    (root / "t").mkdir(parents=True, exist_ok=True)
    (root / "t" / "entry.json").write_text(text)
    try:
        assert len(zoo.load_zoo("t", root)) == 1
    except UserError as e:
        assert "\n" not in str(e)


_MANIFEST_PATHS = [
    "encoder", "encoder_kwargs", "in_channels", "input_size", "dual_bn", "normalization", "weights",
    "weights_sha256", "id", "dataset", "encoder_kwargs.width", "normalization.mean", "normalization.std",
]  # fmt: skip


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_forged_checkpoint_manifest_only_user_errors(data, run_dir: Path, tmp_path_factory) -> None:
    """Our own manifest is untrusted input too: a forged one must not crash the loader."""
    d = tmp_path_factory.getbasetemp() / "fuzz-manifest"
    if not d.exists():
        shutil.copytree(run_dir, d)
    manifest = json.loads((run_dir / MANIFEST).read_text())
    (d / MANIFEST).write_text(json.dumps(data.draw(_mutated(manifest, _MANIFEST_PATHS))))
    try:
        encoder, _ = load_encoder(d)
        assert not encoder.training
    except UserError as e:
        assert "\n" not in str(e)


def test_line_breaks_in_forged_fields_stay_on_one_line(run_dir: Path, tmp_path: Path) -> None:
    """The case CI's fuzzing found: an option name with a line break is echoed in the error message."""
    d = tmp_path / "forged"
    shutil.copytree(run_dir, d)
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["encoder_kwargs"] = {"\n": None, "a\r\nb": 1}
    (d / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="does not take option") as e:
        load_encoder(d)
    assert "\n" not in str(e.value) and "\r" not in str(e.value)
