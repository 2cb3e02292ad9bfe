"""Plugins: loading (file, module, entry point, environment), registration of losses, encoders,
attacks and datasets, one-line errors, and the example plugin against its paper's formula."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import robustbench_nacl
from robustbench_nacl import losses, plugins
from robustbench_nacl.attack.base import ATTACKS
from robustbench_nacl.attack.runner import run_attack
from robustbench_nacl.data import DATASETS, load_dataset
from robustbench_nacl.errors import UserError
from robustbench_nacl.io import sha256_bytes
from robustbench_nacl.losses import AGGREGATORS, OBJECTIVES, PRESETS
from robustbench_nacl.models.encoders import ENCODERS, Encoder
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.models.heads import ContrastiveModel
from robustbench_nacl.training import TrainConfig, config_sha256, train, training_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "decoupled_contrastive.py"
REGISTRIES = (PRESETS, OBJECTIVES, AGGREGATORS, ENCODERS, ATTACKS, DATASETS)

PLUGIN = '''
import torch
from torch import nn
from robustbench_nacl import register_encoder, register_pair_loss
from robustbench_nacl.losses import pair_loss


@register_pair_loss("toy_ntxent", t=0.5, scale=1.0, square=False)
def toy_ntxent(z1, z2, t, scale, square):
    """NT-Xent times a scale (optionally squared): a loss whose parameters are easy to check."""
    z1, z2 = nn.functional.normalize(z1, dim=1), nn.functional.normalize(z2, dim=1)
    loss = scale * pair_loss(z1, z2, estimator="g0", temperature=t)
    return loss**2 if square else loss


@register_encoder("toy_cnn")
def toy_cnn(in_channels, width=8):
    """One convolution, BatchNorm, ReLU and a global average pool."""
    net = nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )
    net.out_dim = width
    return net
'''


@pytest.fixture(autouse=True)
def clean_registries(monkeypatch):
    """Every test starts from, and leaves behind, the built-in registries and no loaded plugin."""
    saved = [(r, dict(r._items), dict(r._info)) for r in REGISTRIES]
    loaded = dict(plugins._LOADED)
    modules = set(sys.modules)
    # setenv first: delenv alone records nothing when the variable is absent, and load_plugins'
    # export would then outlive the test (and reach every later CLI subprocess)
    monkeypatch.setenv(plugins.ENV_VAR, "")
    monkeypatch.delenv(plugins.ENV_VAR)
    yield
    for r, items, info in saved:
        r._items.clear(), r._items.update(items)
        r._info.clear(), r._info.update(info)
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)
    for name in set(sys.modules) - modules:
        if name.startswith(plugins.FILE_MODULE_PREFIX) or name.startswith("rbn_test_"):
            del sys.modules[name]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def one_line_error(spec: str) -> str:
    with pytest.raises(UserError) as err:
        plugins.load_plugin(spec)
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# ============ a plugin file: loss + encoder, then train ============


def test_a_plugin_file_registers_a_loss_and_an_encoder_that_train(tmp_path: Path) -> None:
    path = write(tmp_path / "my_plugin.py", PLUGIN)
    plugin = plugins.load_plugin(str(path))
    assert "toy_ntxent" in PRESETS and "toy_cnn" in ENCODERS
    assert PRESETS.get("toy_ntxent").module == plugin.module
    cfg = TrainConfig(
        loss="toy_ntxent",
        overrides={"scale": "2", "t": "0.3"},
        encoder="toy_cnn",
        encoder_kwargs={"width": 4},
        dataset="digits:0-4",
        epochs=1,
        batch_size=64,
        max_train=128,
        knn_every=0,
    )
    out = train(cfg, tmp_path / "run", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["loss_params"]["extra"] == {"scale": 2.0, "square": False}
    assert manifest["loss_params"]["t"] == 0.3 and manifest["loss_params"]["objective"] == "toy_ntxent"
    assert manifest["encoder"] == "toy_cnn" and manifest["knn_acc"] is not None
    # the checkpoint reloads through the plugin encoder
    encoder, _ = robustbench_nacl.load_encoder(out)
    assert isinstance(encoder, Encoder) and encoder.feature_dim == 4
    assert encoder(torch.rand(3, 1, 8, 8)).shape == (3, 4)


def test_loading_the_same_file_twice_is_a_no_op(tmp_path: Path) -> None:
    path = write(tmp_path / "my_plugin.py", PLUGIN)
    first = plugins.load_plugin(str(path))
    again = plugins.load_plugin(str(tmp_path / "." / "my_plugin.py"))
    assert again is first
    sha = sha256_bytes(path.read_bytes())
    assert plugins.loaded_plugins() == [{"module": first.module, "version": None, "sha256": sha}]
    assert first.module == f"{plugins.FILE_MODULE_PREFIX}my_plugin_{sha[:16]}"
    assert plugins.plugin_of(PRESETS.get("toy_ntxent").module) is first


def test_an_edited_file_is_another_plugin_whose_names_then_exist(tmp_path: Path) -> None:
    path = write(tmp_path / "my_plugin.py", PLUGIN)
    plugins.load_plugin(str(path))
    path.write_text(PLUGIN + "\n# edited\n")
    msg = one_line_error(str(path))
    assert str(path) in msg and "'toy_ntxent' is already registered" in msg


# ============ one-line errors ============


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (
            """
            from robustbench_nacl import register_pair_loss

            @register_pair_loss("simclr", t=0.5)
            def simclr(z1, z2, t):
                return (z1 - z2).pow(2).mean()
            """,
            "simclr",
        ),
        (
            """
            from torch import nn
            from robustbench_nacl import register_encoder

            @register_encoder("convnet_small")
            def convnet_small(in_channels):
                return nn.Flatten()
            """,
            "convnet_small",
        ),
        (
            """
            from robustbench_nacl.attack.base import ATTACKS

            @ATTACKS.register("pgd", norms=("Linf",), params={}, family="iterative")
            def pgd(model, x, y, *, eps, gen=None, norm="Linf"):
                return x
            """,
            "pgd",
        ),
    ],
)
def test_registering_a_name_that_exists_is_a_one_line_user_error(
    tmp_path: Path, code: str, name: str
) -> None:
    before = {r.kind: list(r) for r in REGISTRIES}
    msg = one_line_error(str(write(tmp_path / "dup.py", code)))
    assert repr(name) in msg and "dup.py" in msg
    assert {r.kind: list(r) for r in REGISTRIES} == before  # nothing was half-registered


def test_a_failing_import_is_a_one_line_user_error(tmp_path: Path) -> None:
    boom = write(tmp_path / "boom.py", "raise RuntimeError('boom\\nsecond line')\n")
    msg = one_line_error(str(boom))
    assert "boom.py" in msg and "failed to import" in msg and "RuntimeError: boom second line" in msg
    assert not [m for m in sys.modules if m.startswith(plugins.FILE_MODULE_PREFIX + "boom")]

    msg = one_line_error(str(write(tmp_path / "syntax.py", "def f(:\n")))
    assert "SyntaxError" in msg

    msg = one_line_error(str(write(tmp_path / "needs_dep.py", "import rbn_test_no_such_dependency\n")))
    assert "failed to import" in msg and "rbn_test_no_such_dependency" in msg

    msg = one_line_error(str(write(tmp_path / "exits.py", "import sys\nsys.exit(3)\n")))
    assert "SystemExit" in msg


def test_a_missing_or_malformed_plugin_is_a_one_line_user_error(tmp_path: Path) -> None:
    assert "not found" in one_line_error("rbn_test_no_such_plugin")
    assert "not found" in one_line_error("rbn_test_no_such_plugin.sub")
    assert "no such file" in one_line_error(str(tmp_path / "absent.py"))
    assert "directory" in one_line_error(str(tmp_path) + "/")
    assert "ending in .py" in one_line_error(str(write(tmp_path / "plugin.txt", "x = 1\n")))
    assert "neither a module name" in one_line_error("not a module!")
    assert "needs a module name" in one_line_error("  ")


# ============ modules, entry points and the environment ============


def test_a_module_plugin_by_name_records_its_package_sources(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "rbn_test_pkg"
    pkg.mkdir()
    write(pkg / "__init__.py", "from . import losses\n")
    write(pkg / "losses.py", PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = plugins.load_plugin("rbn_test_pkg")
    assert plugin.module == "rbn_test_pkg" and plugin.version is None
    assert plugins.plugin_of(PRESETS.get("toy_ntxent").module) is plugin  # a submodule registered it
    # the package's hash covers every file: editing the submodule changes it
    sha = plugin.sha256
    plugins._LOADED.clear()
    (pkg / "losses.py").write_text(PLUGIN + "\n# edited\n")
    assert plugins._source_sha256(sys.modules["rbn_test_pkg"]) != sha


def _install_fake_distribution(site: Path, entry_points: str) -> None:
    """A package and its .dist-info on a sys.path entry: what `pip install` leaves behind."""
    pkg = site / "rbn_test_ep"
    pkg.mkdir(parents=True)
    write(pkg / "__init__.py", "CALLS = []\n\ndef register():\n    CALLS.append(1)\n" + PLUGIN)
    info = site / "rbn_test_ep-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rbn-test-ep\nVersion: 1.2.3\n")
    (info / "top_level.txt").write_text("rbn_test_ep\n")
    (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{entry_points}\n")


def test_entry_point_plugins_load_once_with_their_version(tmp_path: Path, monkeypatch) -> None:
    _install_fake_distribution(tmp_path, "toy = rbn_test_ep:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    (loaded,) = plugins.load_entry_point_plugins()
    assert loaded.module == "rbn_test_ep" and loaded.version == "1.2.3" and loaded.entry_point
    assert sys.modules["rbn_test_ep"].CALLS == [1]  # the named function was called
    assert "toy_ntxent" in PRESETS
    plugins.load_entry_point_plugins()
    assert sys.modules["rbn_test_ep"].CALLS == [1]  # and not again
    assert plugins.loaded_plugins()[0]["version"] == "1.2.3"


def test_a_broken_entry_point_is_a_one_line_user_error(tmp_path: Path, monkeypatch) -> None:
    _install_fake_distribution(tmp_path, "toy = rbn_test_ep:no_such_function")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="entry point toy") as err:
        plugins.load_entry_point_plugins()
    assert "\n" not in str(err.value)


def test_subprocesses_load_the_plugins_the_environment_names(tmp_path: Path) -> None:
    path = write(tmp_path / "my_plugin.py", PLUGIN)
    plugins.load_plugins([str(path)], entry_points=False)
    assert os.environ[plugins.ENV_VAR] == str(path.resolve())
    code = (
        "import json; from robustbench_nacl import plugins; from robustbench_nacl.losses import PRESETS;"
        "plugins.load_plugins(entry_points=False);"
        "print(json.dumps([plugins.loaded_plugins(), 'toy_ntxent' in PRESETS]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    assert json.loads(proc.stdout) == [plugins.loaded_plugins(), True]


# ============ pair-loss parameters ============


def _spy_loss(calls: list[dict]):
    @robustbench_nacl.register_pair_loss("spy", t=0.5, k=3, flag=True, mode="a", scale=1.0, views="gaussian")
    def spy(z1, z2, t, k, flag, mode, scale):
        """Records what it receives."""
        calls.append({"t": t, "k": k, "flag": flag, "mode": mode, "dtype": z1.dtype, "shape": z1.shape})
        return (z1 @ z2.T).mean()  # a matmul: it would run in bf16 under autocast

    return spy


def test_set_overrides_reach_the_loss_typed(tmp_path: Path) -> None:
    calls: list[dict] = []
    _spy_loss(calls)
    p = losses.resolve("spy", ["t=0.25", "k=7", "flag=false", "mode=b", "scale=2", "noise_scale=0.1"])
    assert p.t == 0.25 and p.noise_scale == 0.1
    assert p.extra_params() == {"k": 7, "flag": False, "mode": "b", "scale": 2.0}
    assert p.views == "gaussian" and losses.needs(p).n_views == 2
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    views = [torch.rand(5, 1, 2, 2), torch.rand(5, 1, 2, 2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = OBJECTIVES.get("spy").loss(model, views, None, p, torch.Generator())
    assert calls == [{"t": 0.25, "k": 7, "flag": False, "mode": "b", "dtype": torch.float32, "shape": (5, 3)}]
    assert loss.dtype == torch.float32  # the loss ran with autocast off
    # library values are type-checked, not converted
    assert losses.resolve("spy", {"k": 4}).extra_params()["k"] == 4


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["k=0.5"], "expected an integer"),
        (["flag=maybe"], "expected true or false"),
        (["kk=1"], "has no parameter 'kk' \\(did you mean 'k'\\?\\)"),
        (["M=3"], "has no parameter 'M'"),  # a built-in field the pair loss does not use
        (["extra=1"], "has no parameter 'extra'"),
        (["t=0"], "temperature must be > 0"),
        (["views=nope"], "unknown view maker"),
        ({"k": "nan"}, "expected an integer"),
        (["scale=nan"], "expected a finite number"),
        ({"scale": "x"}, "expected a number"),
        ({"scale": True}, "expected a number"),
    ],
)
def test_bad_overrides_are_one_line_user_errors(overrides, match) -> None:
    _spy_loss([])
    with pytest.raises(UserError, match=match) as err:
        losses.resolve("spy", overrides)
    assert "\n" not in str(err.value)


def test_plugin_parameters_enter_the_run_identity() -> None:
    _spy_loss([])
    base = TrainConfig(loss="spy", encoder="convnet_small", dataset="digits:0-4")
    ids = {
        config_sha256(training_config(dataclasses.replace(base, overrides=o)))
        for o in ({}, {"k": 4}, {"mode": "b"}, {"k": 3})
    }
    assert len(ids) == 3  # k=3 is the default: the same run as no override


def test_builtin_presets_record_no_extra() -> None:
    for name in losses.list_presets():
        d = PRESETS.get(name).params.to_dict()
        assert PRESETS.get(name).module is None and PRESETS.get(name).keys is None
        if OBJECTIVES.get(d["objective"]).contextual:  # the adversarial family keeps its own parameters there
            assert "attack_eps" in d["extra"]
        else:
            assert "extra" not in d
    assert losses.LossParams(extra={"b": 1, "a": 2}).extra == (("a", 2), ("b", 1))
    assert losses.LossParams(extra={"a": 2}) == losses.LossParams(extra=(("a", 2),))
    hash(losses.LossParams(extra={"a": 2}))  # still usable as a dict key


def test_pair_loss_registration_errors_are_one_line() -> None:
    def fn(z1, z2, t):
        return z1.sum()

    cases = [
        (dict(name="bad name", t=0.5), "letters, digits"),
        (dict(name="x1", t=[0.5]), "must be a number, string or boolean"),
        (dict(name="x2", t=None), "must be a number, string or boolean"),
        (dict(name="x3", t=0.5, q=1), r"fn\(z1, z2, t, q\) fails"),
        (dict(name="x4", t=0.5, head="linear"), "needs class labels"),
        (dict(name="x5", t=0.5, views="nope"), "unknown view maker"),
        (dict(name="x6", t=-1.0), "temperature must be > 0"),
        (dict(name="contrastive", t=0.5), "objective 'contrastive' is already registered"),
    ]
    for kwargs, match in cases:
        name = kwargs.pop("name")
        with pytest.raises(UserError, match=match) as err:
            robustbench_nacl.register_pair_loss(name, **kwargs)(fn)
        assert "\n" not in str(err.value)
        assert name not in PRESETS or name == "contrastive"


def test_a_pair_loss_returning_a_non_scalar_is_a_user_error() -> None:
    @robustbench_nacl.register_pair_loss("rows")
    def rows(z1, z2):
        return (z1 - z2).pow(2).sum(1)

    p = losses.resolve("rows")
    model = torch.nn.Flatten()
    with pytest.raises(
        UserError, match=r"returned a tensor of shape \(4,\); a pair loss must return a scalar"
    ):
        OBJECTIVES.get("rows").loss(model, [torch.rand(4, 3), torch.rand(4, 3)], None, p, torch.Generator())


def test_register_preset_for_an_objective_of_its_own() -> None:
    @losses.objective(
        "rbn_three_views",
        needs=lambda p: losses.Needs(n_views=3, adversarial=False, labels=False),
        description="test: three-view alignment",
    )
    def three_views(model, views, y, p, gen, fuse=False):
        z = losses.encode(model, views, fuse)
        return p.extra_params()["gamma"] * sum((z[0] - zj).pow(2).sum(1).mean() for zj in z[1:]), {}

    robustbench_nacl.register_preset(
        "three_views", objective="rbn_three_views", description="test", extra={"gamma": 1.0}, t=0.2
    )
    p = losses.resolve("three_views", ["gamma=2", "head=simclr"])
    assert p.extra_params() == {"gamma": 2.0} and p.head == "simclr" and p.t == 0.2
    assert losses.needs(p).n_views == 3 and PRESETS.get("three_views").module == __name__
    with pytest.raises(UserError, match="objective 'rbn_three_views' is already registered"):
        losses.objective("rbn_three_views", needs=lambda p: None, description="again")(three_views)
    with pytest.raises(UserError, match="'three_views' is already registered"):
        robustbench_nacl.register_preset("three_views", objective="rbn_three_views", description="again")
    with pytest.raises(UserError, match="unknown objective"):
        robustbench_nacl.register_preset("four_views", objective="nope", description="x")


# ============ encoders ============


def test_plugin_encoder_options_and_checks(tmp_path: Path) -> None:
    plugins.load_plugin(str(write(tmp_path / "my_plugin.py", PLUGIN)))
    enc = create_encoder("toy_cnn", in_channels=3, input_shape=(3, 16, 16), width=6, dual_bn=True)
    assert enc.feature_dim == 6 and enc(torch.rand(2, 3, 16, 16)).shape == (2, 6)
    with pytest.raises(UserError, match="does not take option"):
        create_encoder("toy_cnn", depth=3)

    @robustbench_nacl.register_encoder("no_out_dim")
    def no_out_dim(in_channels):
        return torch.nn.Flatten()

    with pytest.raises(UserError, match=r"must return an nn\.Module with out_dim"):
        create_encoder("no_out_dim", in_channels=1)

    @robustbench_nacl.register_encoder("wrong_out_dim")
    def wrong_out_dim(in_channels, input_shape=None):
        net = torch.nn.Flatten()
        net.out_dim = 5  # but it returns C * H * W features
        return net

    with pytest.raises(UserError, match=r"returns features of shape \(2, 64\).*expected \(2, 5\)"):
        create_encoder("wrong_out_dim", in_channels=1, input_shape=(1, 8, 8))
    with pytest.raises(UserError, match="letters, digits"):
        robustbench_nacl.register_encoder("timm:mine")(no_out_dim)
    with pytest.raises(UserError, match="must take the number of channels first"):
        robustbench_nacl.register_encoder("no_channels")(lambda: torch.nn.Flatten())

    @robustbench_nacl.register_encoder("star_args")
    def star_args(in_channels, *layers, width=3, **options):
        net = torch.nn.Sequential(torch.nn.Conv2d(in_channels, width, 1), torch.nn.Flatten(1))
        net.out_dim = width * 4
        return net

    assert create_encoder("star_args", in_channels=2, input_shape=(2, 2, 2), width=5).feature_dim == 20


# ============ attacks and datasets, as examples/README.md shows them ============


def test_the_readme_attack_and_dataset_examples_work(tmp_path: Path) -> None:
    readme = (ROOT / "examples" / "README.md").read_text()
    block = readme.split("## Attacks and datasets", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    plugins.load_plugin(str(write(tmp_path / "readme_example.py", block)))
    data = load_dataset("stripes", "test")
    assert data.x.shape == (100, 1, 16, 16) and data.num_classes == 2
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 2))
    x = data.x[:8].float() / 255
    adv = run_attack(
        "random_corner", model, x, data.y[:8], eps=0.1, norm="Linf", gen=torch.Generator(), batch_size=4
    )
    assert adv.shape == x.shape and (adv - x).abs().max() <= 0.1 + 1e-6


def test_the_readme_loss_examples_work(tmp_path: Path) -> None:
    readme = (ROOT / "examples" / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python")[1:]]
    code = "\n".join(b for b in blocks if "register_pair_loss(" in b or "register_encoder(" in b)
    code += "\n" + next(b for b in blocks if "register_preset(" in b)
    plugins.load_plugin(str(write(tmp_path / "readme_losses.py", code)))
    model = ContrastiveModel(create_encoder("tiny_cnn", in_channels=1), "clae")
    views = [torch.rand(6, 1, 8, 8) for _ in range(3)]
    for name in ("align_uniform", "three_views"):
        loss, _ = OBJECTIVES.get(losses.resolve(name).objective).loss(
            model, views, None, losses.resolve(name), torch.Generator()
        )
        assert loss.dim() == 0 and torch.isfinite(loss)


# ============ the example plugin: decoupled contrastive loss (Yeh et al., ECCV 2022) ============


def dcl_by_the_formula(z1: torch.Tensor, z2: torch.Tensor, t: float, sigma: float | None) -> torch.Tensor:
    """Per anchor: -w_i s(z_i, z_i+)/t + log sum_{k != i, i+} exp(s(z_i, z_k)/t); mean over 2B anchors."""
    z = torch.cat([z1, z2])
    b = z1.shape[0]
    cos = [[float(F.cosine_similarity(z[i], z[k], dim=0)) for k in range(2 * b)] for i in range(2 * b)]
    pair = [cos[i][i + b] for i in range(b)]
    if sigma is None:
        w = [1.0] * b
    else:  # DCLW: w = 2 - exp(s_i / sigma) / mean_j exp(s_j / sigma)
        e = [torch.tensor(s / sigma, dtype=torch.float64).exp() for s in pair]
        w = [float(2 - ei / (sum(e) / b)) for ei in e]
    total = torch.tensor(0.0, dtype=torch.float64)
    for i in range(2 * b):
        pos = (i + b) % (2 * b)
        neg = [torch.tensor(cos[i][k] / t, dtype=torch.float64) for k in range(2 * b) if k not in (i, pos)]
        total = total - w[i % b] * cos[i][pos] / t + torch.logsumexp(torch.stack(neg), 0)
    return total / (2 * b)


@pytest.mark.parametrize(("t", "sigma"), [(0.1, None), (0.5, None), (0.2, 0.5), (0.1, 2.0)])
def test_example_dcl_matches_the_papers_formula(t: float, sigma: float | None) -> None:
    plugin = plugins.load_plugin(str(EXAMPLE))
    fn = sys.modules[plugin.module].decoupled_contrastive
    gen = torch.Generator().manual_seed(0)
    z1 = torch.randn(7, 5, dtype=torch.float64, generator=gen) * 3  # not normalised: fn normalises
    z2 = torch.randn(7, 5, dtype=torch.float64, generator=gen)
    got = fn(z1, z2, t=t, vmf=sigma is not None, sigma=sigma or 0.5)
    torch.testing.assert_close(got, dcl_by_the_formula(z1, z2, t, sigma), rtol=1e-6, atol=1e-9)


def test_example_dcl_through_the_objective_and_set() -> None:
    plugins.load_plugin(str(EXAMPLE))
    p = losses.resolve("dcl_decoupled", ["t=0.3", "vmf=true", "sigma=1"])
    assert p.t == 0.3 and p.extra_params() == {"vmf": True, "sigma": 1.0}
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 6)).double()
    views = [torch.rand(5, 1, 2, 2, dtype=torch.float64) for _ in range(2)]
    loss, _ = OBJECTIVES.get("dcl_decoupled").loss(model, views, None, p, torch.Generator())
    with torch.no_grad():
        ref = dcl_by_the_formula(model(views[0]), model(views[1]), 0.3, 1.0)
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-6, atol=1e-9)
    assert PRESETS.get("dcl_decoupled").paper.startswith("Yeh et al., ECCV 2022")


# ============ plugin identity: manifests, training configurations, rows ============


def test_registering_an_attack_twice_is_a_user_error_saying_so() -> None:
    # Registry.register raised a bare ValueError ("registered twice"): a traceback, not one line
    with pytest.raises(UserError, match="attack 'pgd' is already registered; choose another name"):
        ATTACKS.register("pgd", norms=("Linf",), params={}, family="iterative")(lambda *a, **k: None)
    with pytest.raises(UserError, match="dataset 'digits' is already registered"):
        DATASETS.add("digits", lambda root, split, download: None)


def test_the_plugins_providing_loss_and_encoder_enter_the_training_configuration(tmp_path: Path) -> None:
    plugin = plugins.load_plugin(str(write(tmp_path / "my_plugin.py", PLUGIN)))
    record = plugin.record()
    assert record["sha256"] == sha256_bytes((tmp_path / "my_plugin.py").read_bytes())
    base = TrainConfig(loss="simclr", encoder="convnet_small", dataset="digits:0-4")
    # built-in loss and encoder: no "plugins" key, so the hashes of runs without plugins are unchanged
    assert "plugins" not in training_config(base)
    for cfg in (
        dataclasses.replace(base, loss="toy_ntxent"),
        dataclasses.replace(base, encoder="toy_cnn"),
        dataclasses.replace(base, loss="toy_ntxent", encoder="toy_cnn"),
    ):
        assert training_config(cfg)["plugins"] == [record]
    # the same configuration with another version of the plugin is another recipe
    other = dataclasses.replace(plugin, sha256="0" * 64)
    plugins._LOADED[plugin.module] = other
    cfg = dataclasses.replace(base, loss="toy_ntxent")
    changed = training_config(cfg)
    plugins._LOADED[plugin.module] = plugin
    assert changed["plugins"] == [other.record()]
    assert config_sha256(changed) != config_sha256(training_config(cfg))


def test_a_preset_registered_outside_a_plugin_adds_no_plugin_record() -> None:
    _spy_loss([])  # registered by this test module, which is not a loaded plugin
    cfg = TrainConfig(loss="spy", encoder="convnet_small", dataset="digits:0-4")
    assert "plugins" not in training_config(cfg)


def test_manifest_and_rows_record_the_plugins(tmp_path: Path) -> None:
    from robustbench_nacl.eval.evaluate import evaluate
    from robustbench_nacl.eval.probe import ProbeConfig

    plugin = plugins.load_plugin(str(write(tmp_path / "my_plugin.py", PLUGIN)))
    cfg = TrainConfig(
        loss="toy_ntxent",
        encoder="toy_cnn",
        encoder_kwargs={"width": 4},
        dataset="digits:0-4",
        epochs=1,
        batch_size=64,
        max_train=128,
        knn_every=0,
    )
    out = train(cfg, tmp_path / "run", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["plugins"] == [plugin.record()]
    assert manifest["training_config"]["plugins"] == [plugin.record()]
    rows = evaluate(
        out, suite="quick", n_examples=20, probe=ProbeConfig(epochs=5), out=tmp_path / "ev", progress=False
    )
    for r in rows:
        assert r["plugins"] == [plugin.record()]
        assert r["recipe"]["config"]["plugins"] == [plugin.record()]
        assert r["key_params"] == "scale=1.0 square=False"  # the plugin's own parameters (t is SimCLR's)


def test_an_attack_from_a_plugin_is_part_of_the_protocol(tmp_path: Path) -> None:
    from robustbench_nacl.attack.suites import load_suite
    from robustbench_nacl.eval.settings import attack_versions

    readme = (ROOT / "examples" / "README.md").read_text()
    block = readme.split("## Attacks and datasets", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    plugin = plugins.load_plugin(str(write(tmp_path / "readme_example.py", block)))
    corner = {"name": "random_corner", "norm": "Linf", "eps": [0.1]}
    suite = load_suite({"name": "corner", "attack": [corner]})
    assert attack_versions(suite)[plugin.module] == f"file sha256:{plugin.sha256}"
    assert list(attack_versions(load_suite("quick"))) == ["robustbench_nacl"]  # built-in attacks only


# ============ a lazy plugin encoder (nn.LazyLinear: it does not know its input size) ============

LAZY_PLUGIN = """
from torch import nn
from robustbench_nacl import register_encoder


@register_encoder("lazy_mlp")
def lazy_mlp(in_channels, width=8):
    \"\"\"Flatten, then lazy linear layers: the input size is learnt at the first forward.\"\"\"
    net = nn.Sequential(nn.Flatten(), nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(width))
    net.out_dim = width
    return net
"""


class LazyModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_lazy_plugin_encoder_trains_evaluates_and_evaluates_in_memory(tmp_path: Path) -> None:
    plugins.load_plugin(str(write(tmp_path / "lazy_plugin.py", LAZY_PLUGIN)))
    cfg = TrainConfig(
        loss="simclr",
        encoder="lazy_mlp",
        dataset="digits:0-4",
        epochs=1,
        batch_size=64,
        max_train=128,
        knn_every=0,
    )
    first = train(cfg, tmp_path / "run", progress=False)  # was: "Attempted to use an uninitialized parameter"
    again = train(cfg, tmp_path / "again", progress=False)
    sha = [json.loads((d / "manifest.json").read_text())["weights_sha256"] for d in (first, again)]
    assert sha[0] == sha[1]  # the dry forward draws the same weights from the seed every time
    kw = {
        "suite": "quick",
        "n_examples": 10,
        "progress": False,
        "probe": robustbench_nacl.ProbeConfig(epochs=2, max_train=100),
    }
    rows = robustbench_nacl.evaluate(first, out=tmp_path / "board", **kw)
    control = robustbench_nacl.evaluate(first, out=tmp_path / "board", control=True, **kw)
    module = LazyModule()
    in_memory = robustbench_nacl.evaluate(module, dataset="digits:0-4", out=tmp_path / "board", **kw)
    assert len(rows) == len(control) == len(in_memory) > 0
    assert module.net[1].weight.shape == (
        6,
        64,
    )  # materialised in place: the rows' sha256 is of these weights
