"""Dual-BN TRADES (AFF on dual-BN encoders) against a naive transcription of the authors' code, the
robustssl recipe's settings against RobustSSL_Benchmark's ``setup_hyperparameter``, and the
identities and tables of the two recipes (eval/finetune.py, eval/finetune_recipes.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from _models import Normalize, one_thread
from _reliability import cli, one_line_error
from torch import nn

from robustbench_nacl.attack.rng import derive_seed
from robustbench_nacl.data import ImageData, load_dataset, parse_spec
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval import finetune as ft
from robustbench_nacl.eval import finetune_recipes as fr
from robustbench_nacl.eval.evaluate import evaluate, planned_identities
from robustbench_nacl.eval.finetune_loop import augment_batch
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.models.dual_bn import convert_to_dual_bn, set_bn_route
from robustbench_nacl.report.leaderboard import render_leaderboard
from robustbench_nacl.results.finetune import AffConfig, AlfConfig, SlfConfig
from robustbench_nacl.results.rows import ResultRow, protocol_name, row_id

SUITE = {
    "name": "ft-test",
    "attack": [{"name": "pgd", "norm": "Linf", "eps": [0.1], "steps": 2, "step_size": 0.05, "restarts": 1}],
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def _train(n: int) -> ImageData:
    d = load_dataset("digits:0-4", "train")
    return dataclasses.replace(d, x=d.x[:n], y=d.y[:n])


def _dual_encoder(seed: int = 0, route: str = "adv") -> nn.Module:
    """A tiny dual-BN encoder routed to ``route`` for evaluation ('adv': as an ACL checkpoint is
    loaded; 'clean': a CLAE-style one), its two branches' statistics and affine parameters made
    different, so that every route matters, and their momenta as a loaded checkpoint has them
    (``convert_to_dual_bn``: the clean branch 0.1, the adversarial one 0.01)."""
    torch.manual_seed(seed)
    enc = nn.Sequential(
        Normalize(0.3, 0.4), nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(),
    )  # fmt: skip
    convert_to_dual_bn(enc)
    gen = torch.Generator().manual_seed(seed + 100)
    assert (enc[2].main.momentum, enc[2].aux.momentum) == (0.1, 0.01)
    for bn in (enc[2].main, enc[2].aux):
        with torch.no_grad():
            bn.running_mean.copy_(torch.randn(8, generator=gen) * 0.3)
            bn.running_var.copy_(torch.rand(8, generator=gen) + 0.5)
            bn.weight.copy_(torch.rand(8, generator=gen) + 0.5)
            bn.bias.copy_(torch.randn(8, generator=gen) * 0.2)
    set_bn_route(enc, route)
    return enc.eval()


class AuthorsNet(nn.Module):
    """The authors' dual-BN network, written out: ``forward(x, bn_name)`` picks ``bn_list`` by name
    ('normal' = index 0, 'pgd' = index 1: models/resnet_multi_bn.py ``batch_norm_multiple``)."""

    def __init__(self, enc: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.mean, self.std = enc[0].mean.clone(), enc[0].std.clone()
        self.conv = copy.deepcopy(enc[1])
        self.bn_list = nn.ModuleList([copy.deepcopy(enc[2].main), copy.deepcopy(enc[2].aux)])
        for bn in self.bn_list:  # the authors' branches are nn.BatchNorm2d(dim): momentum 0.1
            bn.momentum = 0.1
        self.fc = copy.deepcopy(head)

    def forward(self, x: torch.Tensor, bn_name: str) -> torch.Tensor:
        h = self.conv((x - self.mean) / self.std)
        h = self.bn_list[{"normal": 0, "pgd": 1}[bn_name]](h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(h), 2), 1))


def authors_attack(model, x_natural, gen, step_size, epsilon, perturb_steps):
    """RobustSSL_Benchmark Finetuning_Methods/Vanilla_Finetuning/utils.py ``trades_loss_dual``'s
    inner maximisation, line by line (the start's noise drawn from ``gen``)."""
    criterion_kl = nn.KLDivLoss(reduction="sum")
    model.eval()
    x_adv = x_natural.detach() + 0.001 * torch.randn(x_natural.shape, generator=gen)
    for _ in range(perturb_steps):
        x_adv.requires_grad_()
        with torch.enable_grad():
            model.eval()
            loss_kl = criterion_kl(
                F.log_softmax(model(x_adv, "pgd"), dim=1), F.softmax(model(x_natural, "normal"), dim=1)
            )
        grad = torch.autograd.grad(loss_kl, [x_adv])[0]
        x_adv = x_adv.detach() + step_size * torch.sign(grad.detach())
        x_adv = torch.min(torch.max(x_adv, x_natural - epsilon), x_natural + epsilon)
        x_adv = torch.clamp(x_adv, 0.0, 1.0)
    return torch.clamp(x_adv, 0.0, 1.0).detach()


def authors_outer(model, x_natural, x_adv, y, beta=6.0):
    """``trades_loss_dual``'s loss with ``natural_mode='normal'``: train mode, x via 'normal', x_adv
    via 'pgd', ``CE + 6 / B * KL(sum)``."""
    model.train()
    nat_output = model(x_natural, "normal")
    adv_output = model(x_adv, "pgd")
    kl = nn.KLDivLoss(reduction="sum")(F.log_softmax(adv_output, dim=1), F.softmax(nat_output, dim=1))
    return F.cross_entropy(nat_output, y) + beta * (1.0 / len(x_natural)) * kl


@pytest.mark.parametrize("route", ["adv", "clean"])
def test_dual_bn_trades_equals_the_authors_trades_loss_dual(route: str) -> None:
    train, seed = _train(16), 2
    cfg = AffConfig(epochs=1, batch_size=16, steps=3, eps=0.1, beta=6.0)
    enc, head0 = _dual_encoder(route=route), ft.zero_head(32, 5, 0)
    with torch.no_grad():
        head0.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(5))
    got_enc, got_head = ft.train_aff(enc, head0, train, cfg, seed=seed)

    authors = AuthorsNet(_dual_encoder(), head0)
    opt = torch.optim.SGD(authors.parameters(), lr=0.1, momentum=0.9, weight_decay=2e-4)
    gen = torch.Generator().manual_seed(derive_seed(seed, "aff", 0))
    perm = torch.randperm(16, generator=gen)
    x, y = train.x[perm].float() / 255, train.y[perm]
    before = {k: v.clone() for k, v in authors.state_dict().items()}
    x_adv = authors_attack(authors, x, gen, step_size=0.025, epsilon=0.1, perturb_steps=3)
    loss = authors_outer(authors, x, x_adv, y)
    opt.zero_grad()
    loss.backward()
    opt.step()

    # the attack: same start, same objective (KL between the two branches), same x_adv
    probe = nn.Sequential(_dual_encoder(route=route), copy.deepcopy(head0)).eval()
    with torch.no_grad(), ft.bn_route(probe, "clean"):
        p_nat = F.softmax(probe(x), dim=1)
    g2 = torch.Generator().manual_seed(derive_seed(seed, "aff", 0))
    torch.randperm(16, generator=g2)
    ours_adv = ft.trades_examples(probe, x, p_nat, eps=0.1, step_size=0.025, steps=3, gen=g2, route="adv")
    assert torch.allclose(ours_adv, x_adv, atol=1e-7)
    # the outer loss value on the authors' x_adv, routes (clean, adv), train mode
    fresh = nn.Sequential(_dual_encoder(route=route), copy.deepcopy(head0)).train()
    fresh_authors = AuthorsNet(_dual_encoder(), head0)
    want = authors_outer(fresh_authors, x, x_adv, y)
    assert torch.allclose(ft.trades_loss(fresh, x, x_adv, y, 6.0, ft.DUAL_ROUTES), want, atol=1e-6)
    # one step: every weight, and each branch's running statistics moved by its own forward only
    sd = got_enc.state_dict()
    pairs = {"main": authors.bn_list[0], "aux": authors.bn_list[1]}
    for branch, bn in pairs.items():
        for k in ("weight", "bias", "running_mean", "running_var"):
            assert torch.allclose(sd[f"2.{branch}.{k}"], getattr(bn, k), atol=1e-6), (branch, k)
        assert not torch.equal(
            sd[f"2.{branch}.running_mean"], before[f"bn_list.{0 if branch == 'main' else 1}.running_mean"]
        )
    assert torch.allclose(sd["1.weight"], authors.conv.weight, atol=1e-6)
    assert torch.allclose(got_head.weight, authors.fc.weight, atol=1e-6)
    # the exported model is the 'pgd' branch (cvt_state_dict_AFF, bnNameCnt 1), in eval mode
    authors.eval()
    with torch.no_grad():
        assert torch.allclose(got_head(got_enc(x)), authors(x, "pgd"), atol=1e-5)
        assert not torch.allclose(got_head(got_enc(x)), authors(x, "normal"), atol=1e-3)


def test_dual_bn_off_routes_everything_through_the_evaluated_branch_as_before() -> None:
    train, seed = _train(16), 0
    cfg = AffConfig(epochs=1, batch_size=16, steps=2, eps=0.1, dual_bn="off")
    head0 = ft.zero_head(32, 5, 0)
    enc, _ = ft.train_aff(_dual_encoder(), head0, train, cfg, seed=seed)
    initial = _dual_encoder().state_dict()
    sd = enc.state_dict()
    assert torch.equal(sd["2.main.running_mean"], initial["2.main.running_mean"])  # clean branch unused
    assert not torch.equal(sd["2.aux.running_mean"], initial["2.aux.running_mean"])
    with pytest.raises(UserError, match="aff dual-bn on: the encoder has no dual BatchNorm"):
        ft.train_aff(nn.Sequential(nn.Flatten(), nn.Linear(64, 4)), head0, train, AffConfig(dual_bn="on"))


def test_bn_momentum_encoder_keeps_the_loaded_branches_momenta_as_before() -> None:
    # the switch back to every dual-BN AFF row before bn_momentum: the adversarial branch's running
    # statistics move at 0.01, not the authors' 0.1; the default moves them at 0.1
    train, seed = _train(16), 0
    small = dict(epochs=1, batch_size=16, steps=1, eps=0.1)
    head0 = ft.zero_head(32, 5, 0)
    initial = _dual_encoder().state_dict()["2.aux.running_mean"]
    moved = {}
    for setting in ("authors", "encoder"):
        enc, _ = ft.train_aff(
            _dual_encoder(), head0, train, AffConfig(bn_momentum=setting, **small), seed=seed
        )
        moved[setting] = (enc.state_dict()["2.aux.running_mean"] - initial).abs().max().item()
        assert (enc[2].main.momentum, enc[2].aux.momentum) == {"authors": (0.1, 0.1), "encoder": (0.1, 0.01)}[
            setting
        ]
    assert moved["authors"] == pytest.approx(10 * moved["encoder"], rel=1e-4)  # one batch: m * (mean - old)
    with pytest.raises(UserError, match="aff bn-momentum 'slow': choose one of authors, encoder"):
        AffConfig(bn_momentum="slow").check()


# RobustSSL_Benchmark Finetuning_Methods/Vanilla_Finetuning/utils.py, setup_hyperparameter, read at
# commit 19dc714f: (method, benchmark dataset, mode) -> (lr, batch size, lr milestones, epochs) under
# run_vanilla_tune.sh's --mode ALL; the epochs are vanilla_finetuning.py's --epochs 25 unless the
# branch, or an earlier mode's on the shared args, sets them (ACL AFF: 100; DynACL-AIR: SLF's 5).
BENCHMARK = [
    ("ACL", "cifar10", "slf", 0.01, 512, "10,20", 25),
    ("ACL", "cifar100", "alf", 0.05, 512, "10,20", 25),
    ("ACL", "stl10@96", "slf", 0.1, 512, "10,20", 25),
    ("ACL", "cifar10", "aff", 0.1, 128, "40,60", 100),
    ("DynACL", "cifar10", "slf", 0.01, 512, "10,20", 25),
    ("DynACL", "cifar10", "aff", 0.1, 128, "15,20", 25),
    ("DynACL", "stl10@96", "aff", 0.1, 128, "10,20", 25),
    ("DeACL", "cifar10", "slf", 0.01, 512, "15,20", 25),
    ("DeACL", "cifar10", "alf", 0.01, 512, "15,20", 25),
    ("DeACL", "cifar10", "aff", 0.1, 128, "15,20", 25),
    ("AdvCL", "cifar100", "aff", 0.1, 128, "15,20", 25),
    ("other", "cifar10", "slf", 0.1, 128, "15,20", 25),  # the final else: every mode, every method
    ("ACL_IR", "cifar10", "slf", 0.005, 512, "10,20", 25),
    ("ACL_IR", "stl10@96", "alf", 0.01, 512, "10,20", 25),
    ("ACL_IR", "cifar10", "aff", 0.1, 128, "40,60", 100),
    ("DynACL-AIR", "cifar10", "slf", 0.01, 512, "10,20", 5),  # args.epochs = 5, as written
    ("DynACL-AIR", "cifar100", "slf", 0.1, 512, "10,20", 25),
    ("DynACL-AIR", "stl10@96", "alf", 0.1, 128, "10,20", 25),
    ("DynACL-AIR", "cifar10", "alf", 0.01, 512, "10,20", 5),  # SLF's args.epochs = 5, carried over
    ("DynACL-AIR", "cifar10", "aff", 0.1, 128, "15,20", 5),  # and again
    ("DynACL-AIR++", "cifar100", "slf", 0.09, 512, "10,20", 25),
    ("DynACL-AIR++", "cifar10", "alf", 0.01, 512, "10,20", 4),  # args.epochs = 4, as written
    ("DynACL-AIR++", "cifar10", "aff", 0.1, 128, "15,20", 4),  # ALF's 4 (args.epoch = 19 is never read)
]


@pytest.mark.parametrize(("method", "dataset", "mode", "lr", "batch", "cuts", "epochs"), BENCHMARK)
def test_robustssl_settings_are_setup_hyperparameters(method, dataset, mode, lr, batch, cuts, epochs) -> None:
    spec = {"cifar10": "cifar10", "cifar100": "cifar100", "stl10@96": "stl10"}[dataset]
    target = fr.RecipeTarget(method, parse_spec(spec), True, AlfConfig(), AffConfig())
    cfg = fr.FINETUNE_RECIPES["robustssl"].resolve(mode, target)
    assert (cfg.lr, cfg.batch_size, cfg.milestones, cfg.epochs) == (lr, batch, cuts, epochs)
    # vanilla_finetuning.py's argparse defaults, get_model's zeroed fc, get_loader's crop + flip
    assert (cfg.momentum, cfg.weight_decay, cfg.gamma, cfg.head_init, cfg.augment) == (
        0.9,
        2e-4,
        0.1,
        "zeros",
        "crop-flip",
    )
    if mode != "slf":
        assert (cfg.eps, cfg.step_size, cfg.steps) == (8 / 255, 2 / 255, 10)
    if mode == "alf":  # the benchmark's reading: its epochs on raw features, not the fitted head
        assert cfg.fit == "off" and "fit" not in cfg.identity()
    if mode == "aff":
        assert cfg.beta == 6.0 and cfg.dual_bn == "on"  # trades_loss_dual's LAMBDA2 = 6; --dualBN 1
    assert dict(cfg.recipe) == {"name": "robustssl", "method": method, "dataset": dataset}


def _setup_hyperparameter(args: SimpleNamespace, mode: str) -> SimpleNamespace:
    """RobustSSL_Benchmark Vanilla_Finetuning/utils.py@19dc714f ``setup_hyperparameter``, transcribed
    branch by branch (``bnNameCnt`` left out: ``get_model`` sets it afterwards)."""
    d, r = args.dataset, args.resize

    def linear(c10, c100, s96, s32):  # the per-dataset (batch, lr) lines of a linear branch
        for cond, vals in ((d == "cifar10", c10), (d == "cifar100", c100), (d == "stl10" and r == 96, s96),
                           (d == "stl10" and r == 32, s32)):  # fmt: skip
            if cond and vals is not None:
                args.batch_size, args.lr = vals[0], vals[1]
                if len(vals) > 2:
                    args.epochs = vals[2]

    if args.pretraining == "ACL":
        if mode in ("SLF", "ALF"):
            linear((512, 0.01), (512, 0.05), (512, 0.1), (128, 0.01))
            args.decreasing_lr = "10,20"
        elif mode == "AFF":
            args.lr, args.batch_size, args.epochs, args.decreasing_lr = 0.1, 128, 100, "40,60"
    elif args.pretraining in ("DynACL", "DynACL++", "DynACL_RCS"):
        if mode in ("SLF", "ALF"):
            linear((512, 0.01), (512, 0.05), (512, 0.1), (128, 0.01))
            args.decreasing_lr = "10,20"
        elif mode == "AFF":
            args.decreasing_lr = "10,20" if d == "stl10" and r == 96 else "15,20"
            args.batch_size, args.lr = 128, 0.1
    elif args.pretraining in ("AdvCL", "A-InfoNCE", "DeACL"):
        if mode in ("SLF", "ALF"):
            args.decreasing_lr, args.batch_size, args.lr = "15,20", 512, 0.01
        elif mode == "AFF":
            args.batch_size, args.decreasing_lr, args.lr = 128, "15,20", 0.1
    elif args.pretraining == "ACL_IR":
        if mode == "SLF":
            linear((512, 0.005), (512, 0.1), (512, 0.01), (128, 0.01))
            args.decreasing_lr = "10,20"
        elif mode == "ALF":
            linear((512, 0.01), (512, 0.1), (512, 0.01), (128, 0.01))
            args.decreasing_lr = "10,20"
        elif mode == "AFF":
            args.lr, args.batch_size, args.epochs, args.decreasing_lr = 0.1, 128, 100, "40,60"
    elif args.pretraining == "DynACL-AIR":
        if mode == "SLF":
            linear((512, 0.01, 5), (512, 0.1), (512, 0.1), (128, 0.01))
            args.decreasing_lr = "10,20"
        elif mode == "ALF":
            linear((512, 0.01), (512, 0.1), (128, 0.1), (128, 0.01))
            args.decreasing_lr = "10,20"
        elif mode == "AFF":
            args.batch_size, args.decreasing_lr, args.lr = 128, "15,20", 0.1
    elif args.pretraining == "DynACL-AIR++":
        if mode == "SLF":
            linear((512, 0.01), (512, 0.09), (512, 0.1), None)
            args.decreasing_lr = "10,20"
        elif mode == "ALF":
            linear((512, 0.01, 4), (512, 0.1), (128, 0.1), None)
            args.decreasing_lr = "10,20"
        elif mode == "AFF":
            args.batch_size, args.decreasing_lr, args.lr = 128, "15,20", 0.1
            if d == "cifar10":
                args.epoch = 19  # sic: nothing reads args.epoch
    else:
        args.batch_size, args.decreasing_lr, args.lr = 128, "15,20", 0.1
    return args


_DATASETS = {"cifar10": ("cifar10", 32), "cifar100": ("cifar100", 32), "stl10@96": ("stl10", 96)}


@pytest.mark.parametrize("method", list(fr.ROBUSTSSL))
def test_robustssl_runs_every_mode_as_the_benchmarks_mode_all_does(method: str) -> None:
    """vanilla_finetuning.py --mode ALL: setup_hyperparameter for SLF, then ALF, then AFF on one args
    (argparse's defaults: lr 0.1, batch 128, 25 epochs, milestones 15,20); each mode runs with what
    the args hold after its own call."""
    for dataset, (name, resize) in _DATASETS.items():
        args = SimpleNamespace(
            pretraining=method,
            dataset=name,
            resize=resize,
            lr=0.1,
            batch_size=128,
            epochs=25,
            decreasing_lr="15,20",
        )
        for mode in ("SLF", "ALF", "AFF"):
            args = _setup_hyperparameter(args, mode)
            spec = {"cifar10": "cifar10", "cifar100": "cifar100", "stl10@96": "stl10"}[dataset]
            target = fr.RecipeTarget(method, parse_spec(spec), True, AlfConfig(), AffConfig())
            cfg = fr.FINETUNE_RECIPES["robustssl"].resolve(mode.lower(), target)
            want = (args.lr, args.batch_size, args.decreasing_lr, args.epochs)
            assert (cfg.lr, cfg.batch_size, cfg.milestones, cfg.epochs) == want, (method, dataset, mode)


def test_robustssl_method_follows_the_checkpoints_family() -> None:
    def method(loss, dataset="digits:0-4"):
        t = fr.RecipeTarget(loss, parse_spec(dataset), False, AlfConfig(), AffConfig())
        return dict(fr.FINETUNE_RECIPES["robustssl"].resolve("aff", t).recipe)

    assert method("acl") == {"name": "robustssl", "method": "ACL", "dataset": "cifar10"}
    assert method("dynacl")["method"] == "DynACL" and method("deacl")["method"] == "DeACL"
    assert method("rocl")["method"] == method("simclr")["method"] == "other"
    assert [method(f)["method"] for f in ("acl_air", "dynacl_air", "dynacl++", "dynacl_air++")] == [
        "ACL_IR",
        "DynACL-AIR",
        "DynACL++",
        "DynACL-AIR++",
    ]
    assert method("acl", "cifar100")["dataset"] == "cifar100"
    assert fr.parse_recipe("robustssl:dynacl++")[1] == "dynacl++"
    with pytest.raises(UserError, match="finetune recipe 'nope': choose one of uniform, robustssl"):
        fr.parse_recipe("nope")
    with pytest.raises(UserError, match="unknown method 'XYZ'"):
        fr.parse_recipe("robustssl:XYZ")


def test_crop_flip_is_random_crop_with_zero_padding_then_a_flip() -> None:
    x = torch.rand(6, 1, 8, 8)
    got = augment_batch(x, "crop-flip", torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)  # the same draws: offsets y, offsets x, flips
    dy, dx = torch.randint(0, 3, (6,), generator=gen), torch.randint(0, 3, (6,), generator=gen)
    flip = torch.rand(6, generator=gen) < 0.5
    for i in range(6):
        padded = F.pad(x[i], (1, 1, 1, 1))  # padding 1 on 8-pixel images (4 from 32 pixels up)
        crop = padded[:, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8]
        assert torch.equal(got[i], crop.flip(-1) if flip[i] else crop)
    assert torch.equal(augment_batch(x, "none", gen), x)


def test_slf_by_sgd_on_re_encoded_augmented_images() -> None:
    train, seed = _train(40), 1
    cfg = SlfConfig(epochs=2, batch_size=16, milestones="1", lr=0.05)
    enc = _dual_encoder()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    got = ft.train_slf_head(enc, train, cfg, seed=seed)
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())
    head = ft.zero_head(32, 5, 0)
    opt = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9, weight_decay=2e-4)
    for epoch in range(2):
        for g in opt.param_groups:
            g["lr"] = 0.05 * (0.1 if epoch >= 1 else 1.0)
        gen = torch.Generator().manual_seed(derive_seed(seed, "slf", epoch))
        perm = torch.randperm(40, generator=gen)
        for i in range(0, 40, 16):
            x = augment_batch(train.x[perm[i : i + 16]].float() / 255, "crop-flip", gen)
            opt.zero_grad()
            F.cross_entropy(head(enc(x).detach()), train.y[perm[i : i + 16]]).backward()
            opt.step()
    assert torch.allclose(got.weight, head.weight, atol=1e-6) and got.weight.abs().sum() > 0


def _tiny_eval(tmp_path, enc, recipe: str, **extra):
    kw = dict(dataset="digits:0-4", suite=SUITE, n_examples=10, probe=ProbeConfig(epochs=2, max_train=24))
    kw |= {"protocol": "slf,aff", "aff": AffConfig(max_train=16), **extra}
    return evaluate(enc, out=tmp_path, progress=False, finetune_recipe=recipe, **kw), kw


def test_recipes_never_share_a_protocol_and_get_their_own_tables(tmp_path) -> None:
    uniform, _ = _tiny_eval(
        tmp_path / "rows",
        _dual_encoder(),
        "uniform",
        aff=AffConfig(epochs=1, batch_size=16, steps=1, max_train=16),
    )
    bench, kw2 = _tiny_eval(tmp_path / "rows", _dual_encoder(), "robustssl:DynACL")
    assert {r["protocol_id"] for r in uniform}.isdisjoint({r["protocol_id"] for r in bench})
    assert "finetune" not in next(r for r in uniform if protocol_name(r) == "slf")  # the probe, as before
    aff = next(r for r in uniform if protocol_name(r) == "aff")
    assert aff["finetune"]["dual_bn"] == "on" and "recipe" not in aff["finetune"]
    slf = next(r for r in bench if protocol_name(r) == "slf")["finetune"]
    assert slf["recipe"] == {"name": "robustssl", "method": "DynACL", "dataset": "cifar10"}
    assert (slf["lr"], slf["batch_size"], slf["milestones"], slf["augment"]) == (
        0.01,
        512,
        "10,20",
        "crop-flip",
    )
    # planned without the checkpoint = written (the encoder's dual BN named)
    planned = planned_identities(finetune_recipe="robustssl:DynACL", dual_bn=True, **kw2)
    sha = bench[0]["checkpoint_sha256"]
    assert sorted(row_id({**i, "checkpoint_sha256": sha}) for i in planned) == sorted(r.row_id for r in bench)
    page = render_leaderboard([*uniform, *bench], tmp_path / "board")["LEADERBOARD.md"].read_text()
    side = page.split("## Finetuning protocols side by side", 1)[1]
    assert (
        "### in-domain · digits:0-4\n" in side
        and "### in-domain · digits:0-4 · finetune recipe robustssl" in side
    )
    assert "— protocol SLF (recipe robustssl/DynACL/cifar10, augment crop-flip" in page  # its own ranking


def test_default_identities_keep_their_ids_and_dual_bn_rows_change() -> None:
    assert AffConfig().identity() == AffConfig(dual_bn="off").identity()  # the old computation's
    assert set(AffConfig().identity()) == {
        "protocol", "epochs", "lr", "momentum", "weight_decay", "milestones", "gamma", "batch_size",
        "eps", "step_size", "steps", "beta",
    }  # fmt: skip
    # ALF's default fit is another computation than every ALF row before it: it is in the identity;
    # fit off (what they computed) is not, so that their ids stay
    assert set(AlfConfig().identity()) == set(AffConfig().identity()) - {"beta"} | {"fit"}
    assert set(AlfConfig(fit="off").identity()) == set(AffConfig().identity()) - {"beta"}
    kw = dict(suite=SUITE, n_examples=10, protocol="aff")
    single = planned_identities("digits:0-4", **kw)
    dual = planned_identities("digits:0-4", dual_bn=True, **kw)
    off = planned_identities("digits:0-4", dual_bn=True, aff=AffConfig(dual_bn="off"), **kw)
    assert single == off and all(d["finetune"]["dual_bn"] == "on" for d in dual) and dual != single
    # dual-BN TRADES at the authors' BatchNorm momentum is another computation than the dual-BN rows
    # before it (the adversarial branch at 0.01): another id, and bn_momentum encoder gives the old one
    assert all(d["finetune"]["bn_momentum"] == "authors" for d in dual)
    before = planned_identities("digits:0-4", dual_bn=True, aff=AffConfig(bn_momentum="encoder"), **kw)
    assert all("bn_momentum" not in d["finetune"] for d in before + single)
    assert [{**d["finetune"], "bn_momentum": "authors"} for d in before] == [d["finetune"] for d in dual]
    assert planned_identities("digits:0-4", aff=AffConfig(bn_momentum="encoder"), **kw) == single


def test_the_benchmarks_recipe_keeps_the_callers_dual_bn_switches() -> None:
    # how AFF reads a dual-BN encoder is the caller's, as the budget is; every other setting the recipe's
    spec = parse_spec("digits:0-4")

    def aff(given: AffConfig) -> AffConfig:
        return fr.FINETUNE_RECIPES["robustssl"].resolve(
            "aff", fr.RecipeTarget("acl", spec, True, AlfConfig(), given)
        )

    assert (aff(AffConfig()).dual_bn, aff(AffConfig()).bn_momentum) == ("on", "authors")
    assert aff(AffConfig(bn_momentum="encoder")).bn_momentum == "encoder"
    assert aff(AffConfig(dual_bn="off", bn_momentum="encoder")).dual_bn == "off"
    assert aff(AffConfig(max_train=64)).max_train == 64 and aff(AffConfig()).epochs == 100  # ACL's AFF
    fr.check_recipe("robustssl", None, AffConfig(bn_momentum="encoder", dual_bn="off", max_train=64))
    with pytest.raises(UserError, match="drop --aff-lr"):
        fr.check_recipe("robustssl", None, AffConfig(lr=0.5, bn_momentum="encoder"))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--finetune-recipe", "nope"], "finetune recipe 'nope'"),
        (["--finetune-recipe", "robustssl", "--protocol", "alf", "--alf-epochs", "3"], "drop --alf-epochs"),
        (["--protocol", "aff", "--aff-dual-bn", "maybe"], "aff dual-bn 'maybe'"),
        (["--protocol", "alf", "--alf-augment", "rotate"], "alf augment 'rotate'"),
    ],
)
def test_cli_recipe_errors_are_one_line_exit_2(args, fragment, capsys, tmp_path) -> None:
    rc, _, err = cli(["eval", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), *args], capsys)
    one_line_error(rc, err, fragment, command="eval")


def test_cli_evaluates_an_acl_checkpoint_with_the_benchmarks_recipe(tmp_path, capsys) -> None:
    run, out = tmp_path / "acl", tmp_path / "board"
    train = ["train", "--loss", "acl", "--dataset", "digits:0-4", "--epochs", "1", "--max-train", "64"]
    rc, _, err = cli(
        [*train, "--batch-size", "32", "--encoder-arg", "width=4", "--out", str(run), "--no-progress"], capsys
    )
    assert rc == 0, err
    ev = [
        "eval",
        str(run),
        "--suite",
        "quick",
        "--n-examples",
        "10",
        "--probe-max-train",
        "24",
        "--out",
        str(out),
    ]
    extra = [
        "--protocol",
        "slf,aff",
        "--aff-max-train",
        "16",
        "--finetune-recipe",
        "robustssl",
        "--no-progress",
    ]
    rc, _, err = cli([*ev, *extra], capsys)
    assert rc == 0, err
    rows = [ResultRow.from_json(json.loads(p.read_text())) for p in (out / "rows").glob("*.json")]
    by = {protocol_name(r): r["finetune"] for r in rows}
    assert by["slf"]["recipe"] == {"name": "robustssl", "method": "ACL", "dataset": "cifar10"}
    assert (by["aff"]["epochs"], by["aff"]["milestones"], by["aff"]["dual_bn"]) == (100, "40,60", "on")
