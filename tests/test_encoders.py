"""Encoders, heads and dual BatchNorm: shapes, gradients, normalisation, eval semantics, checkpoints."""

from __future__ import annotations

import inspect

import pytest
import torch
import torchvision
from torch import nn

from robustbench_nacl.errors import UserError
from robustbench_nacl.models.dual_bn import DualBatchNorm, bn_route, has_dual_bn, set_bn_route, strip_dual_bn
from robustbench_nacl.models.encoders import ENCODERS, Encoder, encoder_names
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.models.heads import HEADS, ContrastiveModel, create_head

# Input shapes per encoder (C, H, W); anything registered later falls back on its declared input kind.
SHAPES = {
    "resnet18_cifar": [(3, 32, 32)],
    "resnet50_cifar": [(3, 32, 32)],
    "resnet18_imagenet": [(3, 64, 64)],
    "resnet50_imagenet": [(3, 64, 64)],
    "convnet_small": [(1, 8, 8), (1, 28, 28), (3, 32, 32)],
    "mlp": [(1, 8, 8)],
}
DEFAULT_SHAPE = {"images": (3, 32, 32), "flat": (1, 8, 8)}
# Small but non-trivial sizes so the whole file runs in seconds on a CPU.
SMALL = {"width": 4}
SMALL_MLP = {"hidden": 32, "depth": 2}


def small_kwargs(name: str) -> dict:
    return dict(SMALL_MLP) if name == "mlp" else dict(SMALL)


def cases() -> list:
    out = []
    for name in encoder_names():
        shapes = SHAPES.get(name, [DEFAULT_SHAPE[ENCODERS.info(name)["input"]]])
        out += [pytest.param(name, s, id=f"{name}-{'x'.join(map(str, s))}") for s in shapes]
    return out


def build(name: str, shape: tuple[int, int, int], **kw) -> Encoder:
    kw = {**small_kwargs(name), **kw}
    return create_encoder(name, in_channels=shape[0], input_shape=shape, **kw)


def images(shape: tuple[int, int, int], n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(seed))


def bn_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def snapshot(modules: list[nn.Module]) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]


def same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return all(all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True))


def changed_everywhere(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    keys = ("running_mean", "running_var", "num_batches_tracked")
    return all(all(not torch.equal(x[k], y[k]) for k in keys) for x, y in zip(a, b, strict=True))


# ============ every registered encoder ============


@pytest.mark.parametrize(("name", "shape"), cases())
def test_forward_shape_finite_and_every_parameter_gets_a_gradient(name, shape):
    torch.manual_seed(0)
    enc = build(name, shape).train()
    x = images(shape).requires_grad_(True)
    h = enc(x)
    assert h.shape == (4, enc.feature_dim)
    assert torch.isfinite(h).all()
    (h * torch.randn_like(h)).sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname
    # attacks need a non-zero, finite gradient w.r.t. the [0,1] input
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


@pytest.mark.parametrize(("name", "shape"), cases())
def test_normalisation_buffers_are_persistent_and_applied(name, shape):
    c = shape[0]
    mean, std = [0.1, 0.2, 0.3][:c], [0.25, 0.5, 0.75][:c]
    enc = build(name, shape, mean=mean, std=std).eval()
    assert enc.mean.shape == enc.std.shape == (1, c, 1, 1)
    assert enc.mean.flatten().tolist() == pytest.approx(mean)
    assert enc.std.flatten().tolist() == pytest.approx(std)
    state = enc.state_dict()
    assert "mean" in state and "std" in state

    # the same weights with identity normalisation, fed pre-normalised pixels, give identical features
    raw = build(name, shape, mean=(0.0,), std=(1.0,)).eval()
    raw.backbone.load_state_dict(enc.backbone.state_dict())
    x = images(shape)
    with torch.no_grad():
        h = enc(x)
        assert torch.equal(h, raw((x - enc.mean) / enc.std))
        assert not torch.allclose(h, raw(x))  # the normalisation actually matters

    # a checkpoint carries its normalisation: loading it overrides the default buffers
    fresh = build(name, shape).eval()
    assert fresh.mean.flatten().tolist() == [0.5] * c
    fresh.load_state_dict(state, strict=True)
    with torch.no_grad():
        assert torch.equal(fresh(x), h)


@pytest.mark.parametrize(("name", "shape"), cases())
def test_eval_is_deterministic_and_batch_independent(name, shape):
    enc = build(name, shape)
    x = images(shape, n=8)
    enc.train()
    with torch.no_grad():
        enc(x)  # move the running statistics away from their initial values
    enc.eval()
    with torch.no_grad():
        h = enc(x)
        assert torch.equal(enc(x), h)
        # eval BN uses running statistics, so a sample's features do not depend on its batch-mates.
        # Bitwise equality holds for sub-batches of >= 4 here; batch size 1 (and, for Linear, some
        # small sizes) can take a different CPU kernel (GEMV / another oneDNN algorithm), which changes
        # the last bits, hence the tolerance there.
        assert torch.equal(enc(x[:4]), h[:4])
        assert torch.equal(enc(x[4:]), h[4:])
        torch.testing.assert_close(enc(x[:1]), h[:1], rtol=1e-5, atol=1e-5)
        # ... unlike train mode, where batch statistics are used
        enc.train()
        assert not torch.allclose(enc(x[:4]), h[:4], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("name", "shape"), cases())
def test_channels_last(name, shape):
    enc = build(name, shape, dual_bn=True).eval()
    x = images(shape)
    with torch.no_grad():
        ref = enc(x)
        enc = enc.to(memory_format=torch.channels_last)
        out = enc(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", encoder_names())
def test_width_option_scales_the_features(name):
    shape = SHAPES.get(name, [DEFAULT_SHAPE[ENCODERS.info(name)["input"]]])[0]
    if name == "mlp":
        a, b = build(name, shape, hidden=16), build(name, shape, hidden=32)
    else:
        a, b = build(name, shape, width=4), build(name, shape, width=8)
    assert b.feature_dim == 2 * a.feature_dim
    with torch.no_grad():
        assert b.eval()(images(shape, n=2)).shape == (2, b.feature_dim)


@pytest.mark.parametrize("name", encoder_names())
def test_registry_info_matches_the_default_build(name):
    info = ENCODERS.info(name)
    assert info["description"]
    assert info["input"] in ("images", "flat")
    shape = SHAPES.get(name, [DEFAULT_SHAPE[info["input"]]])[0]
    # build at 1/8 of the default size (full-width ResNet-50s are slow to initialise on a CPU)
    params = inspect.signature(ENCODERS.get(name)).parameters
    size_kw = "hidden" if "hidden" in params else "width"
    default = params[size_kw].default
    enc = create_encoder(name, in_channels=shape[0], input_shape=shape, **{size_kw: default // 8})
    assert enc.feature_dim * 8 == info["feature_dim"]


def test_default_widths():
    assert create_encoder("resnet18_cifar", width=16).feature_dim == 128
    assert create_encoder("resnet50_cifar", width=16).feature_dim == 512
    assert create_encoder("convnet_small", in_channels=1, width=8).feature_dim == 32
    enc = create_encoder("convnet_small", in_channels=1)
    assert [m.out_channels for m in enc.modules() if isinstance(m, nn.Conv2d)] == [32, 64, 128]


def test_torchvision_init_without_zero_init_residual():
    enc = create_encoder("resnet18_imagenet")
    for bn in bn_layers(enc):
        assert torch.equal(bn.weight, torch.ones_like(bn.weight))
        assert torch.equal(bn.bias, torch.zeros_like(bn.bias))
    w = enc.backbone.layer3[1].conv1.weight  # kaiming normal, fan_out = 256 * 3 * 3
    assert w.std().item() == pytest.approx((2 / (256 * 9)) ** 0.5, rel=0.05)


# ============ torchvision state-dict compatibility ============


@pytest.mark.parametrize(
    ("name", "tv_name"),
    [
        ("resnet18_cifar", "resnet18"),
        ("resnet18_imagenet", "resnet18"),
        ("resnet50_cifar", "resnet50"),
        ("resnet50_imagenet", "resnet50"),
    ],
)
def test_torchvision_state_dict_loads_strictly_and_gives_identical_features(name, tv_name):
    torch.manual_seed(0)
    tv = getattr(torchvision.models, tv_name)()
    if name.endswith("_cifar"):
        tv.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        tv.maxpool = nn.Identity()
    tv.fc = nn.Identity()
    tv_state = {k: v for k, v in tv.state_dict().items() if not k.startswith("fc.")}

    enc = create_encoder(name, mean=(0.0,), std=(1.0,))
    assert enc.feature_dim == (512 if tv_name == "resnet18" else 2048)
    assert list(enc.backbone.state_dict()) == list(tv_state)  # same names, same order
    enc.backbone.load_state_dict(tv_state, strict=True)

    # run a few train-mode batches through both so the BN running statistics are non-trivial too
    size = 8 if name.endswith("_cifar") else 32  # small inputs: equality is what is tested, not speed
    x = images((3, size, size), n=2)
    tv.train(), enc.train()
    with torch.no_grad():
        assert torch.equal(enc(x), tv(x))
    tv.eval(), enc.eval()
    with torch.no_grad():
        assert torch.equal(enc(x), tv(x))
    for k, v in tv.state_dict().items():
        assert torch.equal(enc.backbone.state_dict()[k], v), k


# ============ dual BatchNorm ============


@pytest.mark.parametrize("name", encoder_names())
def test_dual_bn_replaces_every_batchnorm(name):
    shape = SHAPES.get(name, [DEFAULT_SHAPE[ENCODERS.info(name)["input"]]])[0]
    plain, dual = build(name, shape), build(name, shape, dual_bn=True)
    n_bn = len(bn_layers(plain))
    duals = [m for m in dual.modules() if isinstance(m, DualBatchNorm)]
    assert n_bn > 0 and len(duals) == n_bn and has_dual_bn(dual) and not has_dual_bn(plain)
    for d in duals:
        assert type(d.main) is type(d.aux)
        assert isinstance(d.main, nn.BatchNorm1d | nn.BatchNorm2d)
        assert d.main.momentum == 0.1 and d.aux.momentum == 0.01
        assert d.route == "clean"
    keys = set(dual.state_dict())
    for path, m in plain.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            for leaf in m.state_dict():
                assert {f"{path}.main.{leaf}", f"{path}.aux.{leaf}"} <= keys
                assert f"{path}.{leaf}" not in keys
    if name.startswith("resnet"):
        assert "backbone.bn1.main.weight" in keys
        assert "backbone.layer2.0.downsample.1.aux.running_mean" in keys


@pytest.mark.parametrize(("name", "shape"), [("resnet18_cifar", (3, 32, 32)), ("mlp", (1, 8, 8))])
def test_routes_update_only_their_own_running_statistics(name, shape):
    enc = build(name, shape, dual_bn=True).train()
    duals = [m for m in enc.modules() if isinstance(m, DualBatchNorm)]
    mains, auxs = [d.main for d in duals], [d.aux for d in duals]
    x = images(shape)

    m0, a0 = snapshot(mains), snapshot(auxs)
    with bn_route(enc, "adv"), torch.no_grad():
        assert all(d.route == "adv" for d in duals)
        enc(x)
    assert all(d.route == "clean" for d in duals)
    m1, a1 = snapshot(mains), snapshot(auxs)
    assert same(m0, m1)
    assert changed_everywhere(a0, a1)

    with bn_route(enc, "clean"), torch.no_grad():
        enc(x)
    m2, a2 = snapshot(mains), snapshot(auxs)
    assert same(a1, a2)
    assert changed_everywhere(m1, m2)

    # the default route (no context) is the clean one
    with torch.no_grad():
        enc(x)
    assert same(a2, snapshot(auxs))

    # gradients through the adversarial route reach the aux affine parameters only
    enc.zero_grad(set_to_none=True)
    with bn_route(enc, "adv"):
        enc(x).square().sum().backward()
    assert all(a.weight.grad is not None for a in auxs)
    assert all(m.weight.grad is None for m in mains)


def test_bn_route_restores_on_exception_and_rejects_unknown_routes():
    model = ContrastiveModel(create_encoder("convnet_small", in_channels=1, width=4, dual_bn=True), "simclr")
    duals = [m for m in model.modules() if isinstance(m, DualBatchNorm)]
    assert len(duals) == 4  # 3 in the encoder, 1 in the head (dual because the encoder is)
    duals[1].route = "adv"  # mixed routes must come back exactly
    before = [d.route for d in duals]
    with pytest.raises(RuntimeError, match="boom"), bn_route(model, "adv"):
        assert all(d.route == "adv" for d in duals)
        raise RuntimeError("boom")
    assert [d.route for d in duals] == before
    with pytest.raises(UserError, match="clean, adv"), bn_route(model, "adversarial"):
        pass
    assert [d.route for d in duals] == before
    set_bn_route(model, "adv")
    assert all(d.route == "adv" for d in duals)
    set_bn_route(model, "clean")
    with bn_route(nn.Linear(2, 2), "adv") as m:  # no dual BN: a no-op
        assert isinstance(m, nn.Linear)


@pytest.mark.parametrize("name", encoder_names())
def test_strip_dual_bn_exports_the_clean_branch(name):
    shape = SHAPES.get(name, [DEFAULT_SHAPE[ENCODERS.info(name)["input"]]])[0]
    dual = build(name, shape, dual_bn=True, mean=(0.3,), std=(0.2,)).train()
    x = images(shape, n=8)
    with torch.no_grad():
        for route, reps in (("clean", 2), ("adv", 3)):  # make the branches' statistics differ
            with bn_route(dual, route):
                for i in range(reps):
                    dual(x * (0.5 + 0.2 * i))
    for d in dual.modules():
        if isinstance(d, DualBatchNorm):
            with torch.no_grad():
                d.aux.weight.mul_(1.5)  # and their affine parameters

    state = strip_dual_bn(dual.state_dict())
    assert not any(".main." in k or ".aux." in k for k in state)
    plain = build(name, shape)
    assert list(state) == list(plain.state_dict())
    plain.load_state_dict(state, strict=True)
    assert torch.equal(plain.mean, dual.mean)

    dual.eval(), plain.eval()
    with torch.no_grad():
        h_plain = plain(x)
        assert torch.equal(dual(x), h_plain)  # evaluation uses the clean branch by default
        with bn_route(dual, "clean"):
            assert torch.equal(dual(x), h_plain)
        with bn_route(dual, "adv"):
            assert not torch.allclose(dual(x), h_plain)
    # a plain state dict passes through unchanged
    assert list(strip_dual_bn(plain.state_dict())) == list(plain.state_dict())


# ============ heads and the contrastive model ============


def test_heads():
    h = torch.randn(4, 32)
    clae = create_head("clae", 32)
    assert clae(h).shape == (4, 64) and clae.out_dim == 64
    assert [type(m) for m in clae] == [nn.Linear, nn.ReLU, nn.Linear]
    assert clae[0].out_features == 512 and clae[0].bias is not None

    simclr = create_head("simclr", 32)
    assert simclr(h).shape == (4, 128) and simclr.out_dim == 128
    assert [type(m) for m in simclr] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert simclr[0].bias is None and simclr[3].bias is not None

    none = create_head("none", 32)
    assert torch.equal(none(h), h) and none.out_dim == 32

    small = create_head("clae", 32, hidden=16, out_dim=8)
    assert small(h).shape == (4, 8) and small[0].out_features == 16

    dual = create_head("simclr", 32, dual_bn=True)
    assert isinstance(dual[1], DualBatchNorm) and isinstance(dual[1].main, nn.BatchNorm1d)
    assert dual.train()(h).shape == (4, 128)

    assert set(HEADS.names()) >= {"clae", "simclr", "none"}
    with pytest.raises(UserError, match="clae, simclr, acl_mlp3_dualbn, rocl_2048_128, none"):
        create_head("nope", 32)


def test_contrastive_model():
    enc = create_encoder("resnet18_cifar", width=8)
    model = ContrastiveModel(enc)  # CLAE head by default
    x = images((3, 32, 32))
    z = model(x)
    assert z.shape == (4, 64) and model.out_dim == 64 and model.feature_dim == 64
    assert model.encoder is enc
    assert model.features(x).shape == (4, enc.feature_dim)
    assert not torch.allclose(z.norm(dim=1), torch.ones(4))  # not normalised here; the loss does it

    model = ContrastiveModel(create_encoder("mlp", in_channels=1, input_shape=(1, 8, 8), hidden=16), "simclr")
    assert model(images((1, 8, 8))).shape == (4, 128)
    assert not has_dual_bn(model.head)

    head = nn.Linear(16, 3)
    model = ContrastiveModel(create_encoder("mlp", in_channels=1, input_shape=(1, 8, 8), hidden=16), head)
    assert model.head is head and model(images((1, 8, 8))).shape == (4, 3)


# ============ errors ============


def test_unknown_encoder_lists_the_valid_names():
    with pytest.raises(UserError) as err:
        create_encoder("resnet19")
    msg = str(err.value)
    assert "\n" not in msg and "resnet19" in msg
    for name in encoder_names():
        assert name in msg


def test_bad_arguments_are_user_errors():
    with pytest.raises(UserError, match="input_shape"):
        create_encoder("mlp", in_channels=1)
    with pytest.raises(UserError, match="width"):
        create_encoder("mlp", in_channels=1, input_shape=(1, 8, 8), width=8)
    with pytest.raises(UserError, match="hidden"):
        create_encoder("resnet18_cifar", hidden=8)
    with pytest.raises(UserError, match="channels"):
        create_encoder("convnet_small", in_channels=3, mean=(0.1, 0.2))
    with pytest.raises(UserError, match="positive"):
        create_encoder("convnet_small", in_channels=1, std=(0.0,))
    with pytest.raises(UserError, match="in_channels"):
        create_encoder("convnet_small", in_channels=3, input_shape=(1, 8, 8))
    with pytest.raises(UserError, match="width"):
        create_encoder("convnet_small", width=0)


def test_imagenet_stem_on_small_images_warns():
    with pytest.warns(UserWarning, match="cifar"):
        create_encoder("resnet18_imagenet", width=4, input_shape=(3, 32, 32))
