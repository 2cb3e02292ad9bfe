"""The trainer's optimizers and lr schedules (training.optim, training.lars) against naive
transcriptions of the authors' code written here, resuming mid-schedule, the robust-ssl-cifar10 zoo's
recipes, and the default (Adam, constant lr) runs' configuration left exactly as it was."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from robustbench_nacl import cli, zoo
from robustbench_nacl.errors import UserError
from robustbench_nacl.io import sha256_file
from robustbench_nacl.results.rows import recipe_id
from robustbench_nacl.training import TrainConfig, check_settings, optim, train, training_config
from robustbench_nacl.training import loop as train_loop
from robustbench_nacl.training.manifest import config_sha256, run_id
from robustbench_nacl.zoo.generated import fashion_mnist_zoo, keep_pin

REPO = Path(__file__).resolve().parents[1]
# the authors step their schedulers before their optimizers (ACL, RoCL): torch warns, rightly, but
# that order is what is reproduced here
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")

# ============ LARS: one step against the authors' update, transcribed naively ============


def _toy() -> nn.Module:
    """Weights, a BatchNorm, and a zero bias (the authors' zero-norm guard)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))
    nn.init.zeros_(model[3].bias)
    return model


def _grads(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def _acl_lars_reference(
    params: list[torch.Tensor], grads: list[list[torch.Tensor]], lrs: list[float]
) -> None:
    """VITA-Group optimizer/lars.py, step by step (momentum 0.9, eta 1e-3, weight decay 1e-6)."""
    momentum, eta, wd = 0.9, 1e-3, 1e-6
    bufs: dict[int, torch.Tensor] = {}
    for lr, step_grads in zip(lrs, grads, strict=True):
        for i, (p, d_p) in enumerate(zip(params, step_grads, strict=True)):
            weight_norm, grad_norm = torch.norm(p), torch.norm(d_p)
            local_lr = eta * weight_norm / (grad_norm + wd * weight_norm)
            if weight_norm < 1e-15 or grad_norm < 1e-15:
                local_lr = torch.tensor(1.0)
            actual_lr = local_lr * lr
            buf = bufs.setdefault(i, torch.zeros_like(p))
            buf.mul_(momentum).add_(actual_lr * (d_p + wd * p))
            p.add_(-buf)


def _torchlars_reference(
    params: list[torch.Tensor], grads: list[list[torch.Tensor]], lrs: list[float]
) -> None:
    """torchlars.LARS(SGD(momentum 0.9, weight_decay 1e-6), eps 1e-8, trust_coef 1e-3): the adaptive lr
    of adaptive_lr.cc, then torch SGD with the weight decay hidden."""
    momentum, trust, eps, wd = 0.9, 1e-3, 1e-8, 1e-6
    bufs: dict[int, torch.Tensor] = {}
    for lr, step_grads in zip(lrs, grads, strict=True):
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            pn, gn = p.norm(), g.norm()
            adaptive = pn / (gn + wd * pn + eps) * trust if (pn > 0 and gn > 0) else torch.tensor(1.0)
            d = (g + wd * p) * adaptive
            bufs[i] = d.clone() if i not in bufs else bufs[i] * momentum + d
            p.add_(-lr * bufs[i])


def _solo_reference(params: list[torch.Tensor], grads: list[list[torch.Tensor]], lrs: list[float]) -> None:
    """solo-learn LARSWrapper(SGD(momentum 0.9, weight_decay 1e-5), eta 0.02, clip, exclude_bias_n_norm)."""
    momentum, eta, eps, wd = 0.9, 0.02, 1e-8, 1e-5
    bufs: dict[int, torch.Tensor] = {}
    for lr, step_grads in zip(lrs, grads, strict=True):
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            if p.ndim != 1:  # biases and BatchNorm are 1-d: neither adapted nor decayed
                p_norm, g_norm = torch.norm(p), torch.norm(g)
                if p_norm != 0 and g_norm != 0:
                    new_lr = (eta * p_norm) / (g_norm + p_norm * wd + eps)
                    new_lr = min(new_lr / lr, 1)
                    g = (g + wd * p) * new_lr
            bufs[i] = g.clone() if i not in bufs else bufs[i] * momentum + g
            p.add_(-lr * bufs[i])


LARS_CASES = {
    "lars": ({"momentum": 0.9, "eta": 1e-3}, 1e-6, _acl_lars_reference),
    "torchlars": ({"momentum": 0.9, "eta": 1e-3, "eps": 1e-8}, 1e-6, _torchlars_reference),
    "lars_solo": (
        {"momentum": 0.9, "eta": 0.02, "eps": 1e-8, "clip": True, "exclude_bias_n_norm": True},
        1e-5,
        _solo_reference,
    ),
}


@pytest.mark.parametrize("name", list(LARS_CASES))
def test_lars_steps_match_the_authors_update(name: str) -> None:
    """Three steps at changing lrs (ACL folds the lr into its buffer, the SGD-based ones do not), with
    a zero bias and BatchNorm parameters among the weights."""
    kwargs, wd, reference = LARS_CASES[name]
    model = _toy()
    expected = [p.detach().clone() for p in model.parameters()]
    opt = optim.build_optimizer(name, model.parameters(), lr=5.0, weight_decay=wd, kwargs=kwargs)
    lrs, grads = [5.0, 2.5, 0.1], []
    for step, lr in enumerate(lrs):
        _grads(model, step)
        grads.append([p.grad.clone() for p in model.parameters()])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    with torch.no_grad():
        reference(expected, grads, lrs)
    for got, want in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-7)


def test_only_solo_learn_excludes_biases_and_batchnorm() -> None:
    """ACL's LARS adapts and decays every parameter; solo-learn's, with exclude_bias_n_norm, steps a 1-d
    parameter by plain momentum SGD on its raw gradient. Told apart on the BatchNorm weight."""
    moved = {}
    for name, kwargs in (("lars", {}), ("lars_solo", {"exclude_bias_n_norm": True})):
        model = _toy()
        before = model[1].weight.detach().clone()
        opt = optim.build_optimizer(name, model.parameters(), lr=0.5, weight_decay=0.1, kwargs=kwargs)
        _grads(model, 0)
        grad = model[1].weight.grad.clone()
        opt.step()
        moved[name] = (model[1].weight.detach() - before, grad)
    delta, grad = moved["lars_solo"]
    torch.testing.assert_close(delta, -0.5 * grad)  # lr x raw gradient: no trust ratio, no decay
    assert not torch.allclose(moved["lars"][0], -0.5 * moved["lars"][1])


# ============ schedules: the authors' schedulers, stepped as their loops step them ============


def _acl_cosine_annealing(step: int, total: int, lr_max: float, lr_min: float, warmup: int) -> float:
    """ACL train_simCLR.py (its own copy: warm-up ``step / warmup``)."""
    if step < warmup:
        return lr_max * step / warmup
    return lr_min + (lr_max - lr_min) * 0.5 * (1 + math.cos((step - warmup) / (total - warmup) * math.pi))


def _dynacl_cosine_annealing(step: int, total: int, lr_max: float, lr_min: float, warmup: int) -> float:
    """DynACL utils.py (warm-up ``(step + 1) / warmup``)."""
    if step < warmup:
        return lr_max * (step + 1) / warmup
    return lr_min + (lr_max - lr_min) * 0.5 * (1 + math.cos((step - warmup) / (total - warmup) * math.pi))


def _one_param_sgd(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)


def _schedule(name: str, kwargs: dict[str, Any], lr: float, epochs: int, steps: int) -> optim.LrSchedule:
    return optim.LrSchedule(name, kwargs, lr, epochs=epochs, steps_per_epoch=steps)


def test_acl_cosine_per_iteration() -> None:
    """ACL: LambdaLR stepped at the top of every iteration, before the optimizer step."""
    epochs, steps, lr = 20, 7, 5.0
    opt = _one_param_sgd(lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda=lambda s: _acl_cosine_annealing(s, epochs * steps, 1, 1e-6 / lr, 10 * steps)
    )
    ours = _schedule("cosine", {"interval": "step", "variant": "acl"}, lr, epochs, steps)
    for k in range(epochs * steps):
        sched.step()
        assert ours.lr(k) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-15), k
    assert ours.lr(epochs * steps - 1) == pytest.approx(1e-6)  # ends exactly at min_lr


def test_dynacl_cosine_per_epoch() -> None:
    """DynACL: LambdaLR stepped after each epoch (its first epoch trains at lambda(0))."""
    epochs, steps, lr = 30, 4, 5.0
    opt = _one_param_sgd(lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda=lambda s: _dynacl_cosine_annealing(s, epochs, 1, 1e-6 / lr, 10)
    )
    ours = _schedule("cosine", {"interval": "epoch", "variant": "dynacl"}, lr, epochs, steps)
    for epoch in range(epochs):
        for step in range(steps):
            assert ours.lr(epoch * steps + step) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)
        sched.step()
    assert ours.lr(0) == pytest.approx(0.5) and ours.lr(9 * steps) == pytest.approx(5.0)


class _BoltsWarmupCosine(torch.optim.lr_scheduler.LRScheduler):
    """pl_bolts LinearWarmupCosineAnnealingLR.get_lr (its chainable form: what Lightning's per-epoch
    ``scheduler.step()`` computes)."""

    def __init__(
        self, opt: torch.optim.Optimizer, warmup: int, max_epochs: int, start: float, eta_min: float
    ):
        self.warmup, self.max_epochs, self.start, self.eta_min = warmup, max_epochs, start, eta_min
        super().__init__(opt)

    def get_lr(self) -> list[float]:
        e, w, T, groups = self.last_epoch, self.warmup, self.max_epochs, self.optimizer.param_groups
        if e == 0:
            return [self.start] * len(self.base_lrs)
        if e < w:
            return [g["lr"] + (b - self.start) / (w - 1) for b, g in zip(self.base_lrs, groups, strict=True)]
        if e == w:
            return list(self.base_lrs)
        if (e - 1 - T) % (2 * (T - w)) == 0:
            return [
                g["lr"] + (b - self.eta_min) * (1 - math.cos(math.pi / (T - w))) / 2
                for b, g in zip(self.base_lrs, groups, strict=True)
            ]
        ratio = (1 + math.cos(math.pi * (e - w) / (T - w))) / (1 + math.cos(math.pi * (e - w - 1) / (T - w)))
        return [ratio * (g["lr"] - self.eta_min) + self.eta_min for g in groups]


def test_solo_learn_warmup_cosine_per_epoch() -> None:
    epochs, steps, lr = 100, 3, 0.5
    opt = _one_param_sgd(lr)
    sched = _BoltsWarmupCosine(opt, 10, epochs, 0.003, 0.0)
    ours = _schedule("warmup_cosine", {}, lr, epochs, steps)
    for epoch in range(epochs):
        assert ours.lr(epoch * steps + 2) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
        sched.step()
    assert ours.lr(0) == pytest.approx(0.003) and ours.lr(9 * steps) == pytest.approx(lr)


class _GradualWarmup(torch.optim.lr_scheduler.LRScheduler):
    """RoCL src/warmup_scheduler/scheduler.py (multiplier > 1, an after_scheduler, no plateau)."""

    def __init__(self, opt: torch.optim.Optimizer, multiplier: float, total_epoch: int, after: Any):
        self.multiplier, self.total_epoch, self.after, self.finished = multiplier, total_epoch, after, False
        super().__init__(opt)

    def get_lr(self) -> list[float]:
        if self.last_epoch > self.total_epoch:
            if not self.finished:
                self.after.base_lrs = [b * self.multiplier for b in self.base_lrs]
                self.finished = True
            return self.after.get_lr()
        return [
            b * ((self.multiplier - 1.0) * self.last_epoch / self.total_epoch + 1.0) for b in self.base_lrs
        ]

    def step(self, epoch: Any = None) -> None:
        if self.finished:
            self.after.step()
        else:
            super().step()


class _Cosine1x(torch.optim.lr_scheduler.LRScheduler):
    """torch 1.1-1.3's CosineAnnealingLR.get_lr (RoCL asks for torch 1.1+; the later chainable form
    gives the same values there, torch 2's differs at its step 0 when chained after the warm-up)."""

    def __init__(self, opt: torch.optim.Optimizer, t_max: int):
        self.t_max = t_max
        super().__init__(opt)

    def get_lr(self) -> list[float]:
        return [b * (1 + math.cos(math.pi * self.last_epoch / self.t_max)) / 2 for b in self.base_lrs]


def test_rocl_gradual_warmup_then_cosine_per_epoch() -> None:
    """RoCL: ``scheduler_warmup.step()`` at the start of every epoch, CosineAnnealingLR after it."""
    epochs, steps, lr = 1000, 2, 0.1
    opt = _one_param_sgd(lr)
    sched = _GradualWarmup(opt, 15, 10, _Cosine1x(opt, epochs))
    ours = _schedule("gradual_warmup_cosine", {}, lr, epochs, steps)
    for epoch in range(epochs):
        sched.step()
        assert ours.lr(epoch * steps) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12), epoch
    assert ours.lr(0) == pytest.approx(0.24) and ours.lr(10 * steps) == pytest.approx(1.5)


def test_the_schedule_sets_the_lr_before_each_step() -> None:
    opt = _one_param_sgd(5.0)
    sched = optim.build_schedule("cosine", {}, opt, base_lr=5.0, epochs=20, steps_per_epoch=3)
    seen = []
    opt.register_step_post_hook(lambda o, a, k: seen.append(o.param_groups[0]["lr"]))
    for _ in range(4):
        opt.step()
    assert sched is not None and sched.steps == 4
    assert seen == [sched.lr(k) for k in range(4)]
    assert optim.build_schedule("constant", {}, opt, base_lr=5.0, epochs=20, steps_per_epoch=3) is None


# ============ resume mid-schedule ============

RESUME = {
    "dataset": "digits:0-1",
    "encoder": "convnet_small",
    "encoder_kwargs": {"width": 4},
    "batch_size": 32,
    "max_train": 96,
    "knn_every": 0,
    "epochs": 3,
}


class _Killed(Exception):
    pass


def test_lars_cosine_run_resumed_mid_schedule_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after epoch 1 of 3 (inside the warm-up-then-cosine schedule): the resumed run restores the
    LARS buffers and the schedule's step count and ends with the uninterrupted run's weights."""
    cfg = TrainConfig(
        loss="simclr",
        optimizer="lars",
        lr=1.0,
        weight_decay=1e-6,
        schedule="cosine",
        schedule_kwargs={"warmup_epochs": 1},
        **RESUME,
    )
    ref = json.loads((train(cfg, tmp_path / "ref", progress=False) / "manifest.json").read_text())
    real_epoch = train_loop._train_epoch

    def killed(run: Any, step: Any, epoch: int, progress: bool) -> dict[str, Any]:
        if epoch == 2:
            raise _Killed
        return real_epoch(run, step, epoch, progress)

    out = tmp_path / "killed"
    with monkeypatch.context() as m:
        m.setattr(train_loop, "_train_epoch", killed)
        with pytest.raises(_Killed):
            train(cfg, out, progress=False)
    state = torch.load(out / "train_state.pt", weights_only=True)
    assert state["epoch"] == 2 and state["schedule"]["steps"] == 2 * 3
    torch.manual_seed(12345)
    train(cfg, out, resume=True, progress=False)
    assert sha256_file(out / "weights.safetensors") == ref["weights_sha256"]
    assert ref["recipe"]["schedule"] == "cosine" and ref["training_config"]["optimizer"] == "lars"


# ============ the robust-ssl-cifar10 zoo ============

ROBUST_ZOO = "robust-ssl-cifar10"


def test_robust_ssl_zoo_lists_and_is_what_regenerate_writes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["zoo", "list", "--zoo", ROBUST_ZOO]) == 0
    listed = capsys.readouterr().out
    assert all(
        f"resnet18_cifar.{loss}_cifar10_s0" in listed for loss in ("acl", "rocl", "dynacl", "deacl", "simclr")
    )
    committed = {e.id: e.to_dict() for e in zoo.load_zoo(ROBUST_ZOO)}
    generated = {e.id: e.to_dict() for e in zoo.GENERATED_ZOOS[ROBUST_ZOO]()}
    assert committed == generated
    by_loss = {e.loss: e for e in zoo.load_zoo(ROBUST_ZOO)}
    acl, dynacl = by_loss["acl"].recipe, by_loss["dynacl"].recipe
    assert (acl["optimizer"], acl["lr"], acl["batch_size"], acl["epochs"]) == ("lars", 5.0, 512, 1000)
    assert acl["schedule_kwargs"]["warmup_epochs"] == 10 and acl["schedule_kwargs"]["interval"] == "step"
    assert dynacl["schedule_kwargs"]["interval"] == "epoch"
    assert by_loss["deacl"].teacher == by_loss["simclr"].id


@pytest.fixture(scope="module")
def robust_ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoints folder holding a tiny trained stand-in for the zoo's SimCLR teacher entry."""
    ckpts = tmp_path_factory.mktemp("ckpts")
    teacher = next(e for e in zoo.load_zoo(ROBUST_ZOO) if e.loss == "simclr")
    train(TrainConfig(loss="simclr", **{**RESUME, "epochs": 1}), ckpts / teacher.id, progress=False)
    return ckpts


@pytest.mark.parametrize("loss", ["acl", "rocl", "dynacl", "deacl", "simclr"])
def test_robust_ssl_recipe_dry_run(
    loss: str, robust_ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry's preset, optimizer and schedule for one step per epoch on digits-shaped data (the
    encoder, data, epochs and warm-up cut to tiny); the lr each step used is the schedule's."""
    entry = next(e for e in zoo.load_zoo(ROBUST_ZOO) if e.loss == loss)
    cfg = entry.train_config(ckpts=robust_ckpts)
    warmup = {**cfg.schedule_kwargs, "warmup_epochs": 1}
    small = {k: v for k, v in RESUME.items() if k not in ("epochs", "batch_size", "max_train")}
    tiny = dataclasses.replace(
        cfg, **small, epochs=2, batch_size=16, max_train=16, id=None, schedule_kwargs=warmup
    )
    tiny = (
        dataclasses.replace(tiny, overrides={**tiny.overrides, "attack_steps": 1})
        if loss != "simclr"
        else tiny
    )
    used: list[float] = []
    real = optim.LrSchedule._before_step

    def spy(self: optim.LrSchedule, opt: Any, args: Any, kwargs: Any) -> None:
        real(self, opt, args, kwargs)
        used.append(opt.param_groups[0]["lr"])
        assert type(opt).__name__ == {"lars": "Lars", "torchlars": "TorchLars", "lars_solo": "SoloLars"}.get(
            cfg.optimizer, "SGD"
        )

    monkeypatch.setattr(optim.LrSchedule, "_before_step", spy)
    manifest = json.loads((train(tiny, tmp_path / loss, progress=False) / "manifest.json").read_text())
    pos = [optim.LrPosition(e, 0, 2, 1) for e in (0, 1)]
    assert used == [optim.lr_at(cfg.schedule, warmup, cfg.lr, p) for p in pos]
    recorded = manifest["training_config"]
    assert recorded["optimizer"] == entry.recipe["optimizer"]
    assert recorded["optimizer_kwargs"] == entry.recipe["optimizer_kwargs"]
    assert recorded["schedule"] == entry.recipe["schedule"]


# ============ defaults: every existing run's configuration, hash and id unchanged ============

# computed before the optimizer and schedule fields existed
DEFAULT_CONFIG_SHA256 = "902abaa504483e840c737df2fd7533b030ae2a522df9c2ebad4363b6d8b14c3e"


def test_default_configuration_hash_and_id_unchanged() -> None:
    cfg = TrainConfig()
    assert config_sha256(training_config(cfg)) == DEFAULT_CONFIG_SHA256
    assert run_id(cfg) == "convnet_small.simclr_digits_s0_902abaa5"
    assert not {"optimizer", "optimizer_kwargs", "schedule", "schedule_kwargs"} & set(cfg.to_dict())
    adam = TrainConfig(optimizer="adam", schedule="constant", optimizer_kwargs={}, schedule_kwargs={})
    assert adam.to_dict() == cfg.to_dict()


def test_committed_reference_manifests_and_rows_are_what_the_code_makes() -> None:
    """The fashion-mnist zoo's committed manifests are what ``zoo regenerate`` writes, and the training
    configuration recorded in its committed leaderboard rows (SimCLR, every seed) is what an entry's
    TrainConfig gives now: the ids and recipe ids of the reference stay valid."""
    folder = REPO / "robustbench_nacl" / "files" / "zoo" / "fashion-mnist"
    for entry in fashion_mnist_zoo():
        path = folder / f"{entry.id}.json"
        assert json.loads(path.read_text()) == keep_pin(entry, path).to_dict(), entry.id
    simclr = {e.id: e for e in zoo.load_zoo("fashion-mnist") if e.loss == "simclr"}
    checked = set()
    for row_path in sorted((REPO / "leaderboard" / "rows").glob("*.json")):
        row = json.loads(row_path.read_text())
        entry = simclr.get(row.get("checkpoint_id"))
        if entry is None or entry.id in checked:
            continue
        config = {k: v for k, v in training_config(entry.train_config()).items() if k != "seed"}
        assert json.loads(json.dumps(config)) == row["recipe"]["config"]
        assert recipe_id(row["recipe"]) == row["recipe_id"]
        checked.add(entry.id)
        if checked == set(simclr):
            break
    assert checked == set(simclr)


def test_settings_resolved_into_the_recipe() -> None:
    """A setting given at its default and one left out are one recipe; another value is another."""
    plain = TrainConfig(optimizer="lars", schedule="cosine", epochs=20)
    same = dataclasses.replace(
        plain, optimizer_kwargs={"momentum": 0.9}, schedule_kwargs={"warmup_epochs": 10}
    )
    other = dataclasses.replace(plain, optimizer_kwargs={"eta": 0.02})
    assert config_sha256(training_config(plain)) == config_sha256(training_config(same))
    assert config_sha256(training_config(plain)) != config_sha256(training_config(other))
    assert training_config(plain)["schedule_kwargs"]["min_lr"] == 1e-6


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"optimizer": "lamb"}, "valid choices: adam, sgd, lars, torchlars, lars_solo"),
        (
            {"optimizer": "lars", "optimizer_kwargs": {"trust": 1}},
            "setting .trust.; valid choices: momentum, eta",
        ),
        ({"optimizer": "sgd", "optimizer_kwargs": {"nesterov": 1}}, "must be true or false"),
        ({"optimizer": "adam", "optimizer_kwargs": {"momentum": 0.9}}, "takes no settings"),
        ({"schedule": "cosine", "schedule_kwargs": {"interval": "batch"}}, "valid choices: step, epoch"),
        ({"schedule": "cosine", "schedule_kwargs": {"warmup_epochs": 10}}, "must be < --epochs 10"),
        ({"schedule": "onecycle"}, "valid choices: constant, cosine"),
    ],
)
def test_bad_settings_are_one_line_errors(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(UserError, match=says.replace("(", r"\(")):
        check_settings(dataclasses.replace(TrainConfig(), **changes))


def test_cli_flags_reach_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["train", "--loss", "simclr", "--out", str(tmp_path / "x"), "--no-progress"]
    assert cli.main([*args, "--optimizer", "lamb"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown optimizer 'lamb'" in err[0] and "lars" in err[0]
    assert cli.main([*args, "--schedule", "cosine", "--warmup-epochs", "12", "--epochs", "12"]) == 2
    assert "warmup_epochs 12 must be < --epochs 12" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())
