"""The ++ post-processing (robustbench_nacl/post/): the pseudo-label assignment on digits against a
direct computation, the BatchNorm branches each part uses, the frozen linear probe, the TRADES start
of each recipe, the exported checkpoint (load, eval, recipe), resume after a kill, the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _models import one_thread
from _reliability import cli, one_line_error
from torch import nn

from robustbench_nacl.data import load_dataset
from robustbench_nacl.eval import finetune as ft
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.recipe import recipe_of
from robustbench_nacl.eval.source import CheckpointInfo
from robustbench_nacl.models.dual_bn import DualBatchNorm, bn_route, set_bn_route
from robustbench_nacl.models.foreign import load_encoder
from robustbench_nacl.post import assign_pseudo_labels, backbone_features, lpaft, post_process, resolve_recipe
from robustbench_nacl.training import TrainConfig, train

#: a budget that runs in about a second: 2 LP and 2 AFT epochs of one batch, 2 attack steps
TINY = {"lp_epochs": 2, "aft_epochs": 2, "batch_size": 128, "steps": 2}
SUITE = {
    "name": "post-test",
    "attack": [{"name": "pgd", "norm": "Linf", "eps": [0.1], "steps": 2, "step_size": 0.05, "restarts": 1}],
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def _train(loss: str, out: Path, **overrides: object) -> Path:
    cfg = TrainConfig(
        loss=loss,
        dataset="digits",
        encoder="convnet_small",
        encoder_kwargs={"width": 8},
        epochs=1,
        batch_size=64,
        max_train=256,
        knn_every=0,
        overrides=dict(overrides),
    )
    return train(cfg, out, device="cpu", progress=False)


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DynACL checkpoint (dual BatchNorm, the adversarial branch's statistics its own)."""
    with one_thread():
        return _train("dynacl", tmp_path_factory.mktemp("parent") / "dynacl", attack_steps=2)


@pytest.fixture(scope="module")
def child(parent: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with one_thread():
        out = tmp_path_factory.mktemp("child") / "dynacl++"
        return post_process(parent, "dynacl++", out, overrides=TINY, device="cpu", progress=False)


def _digits(n: int = 256) -> torch.Tensor:
    return load_dataset("digits", "train").x[:n]


# ============ pseudo-labels ============


def _naive_kmeans(x: torch.Tensor, init: torch.Tensor, tol: float) -> tuple[torch.Tensor, int]:
    """kmeans_pytorch 0.3's loop, written out point by point: nearest centre (first on ties), centres
    to their means, stop when (sum of centre moves)^2 < tol; the last assignment is returned."""
    centers = x[init].clone()
    iterations = 0
    while True:
        labels = torch.stack([((centers - p) ** 2).sum(1).argmin() for p in x])
        new = torch.stack([x[labels == k].mean(0) for k in range(len(centers))])
        shift = sum(float(torch.sqrt(((new[k] - centers[k]) ** 2).sum())) for k in range(len(centers)))
        centers, iterations = new, iterations + 1
        if shift**2 < tol:
            return labels, iterations


def test_pseudo_labels_on_digits_are_kmeans_of_the_clean_branch_features(parent: Path) -> None:
    encoder, _ = load_encoder(parent)
    x = _digits()
    seed = 1234
    res = assign_pseudo_labels(encoder, x, 10, tol=1e-4, seed=seed)
    # the initial centres: 10 distinct points drawn from the seeded generator
    assert torch.equal(
        res.init_indices, torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:10]
    )
    # the features, directly: backbone of the normalised images, clean branch, eval mode
    enc = encoder.eval()
    with torch.no_grad(), bn_route(enc, "clean"):
        feats = enc.backbone((x.float() / 255 - enc.mean) / enc.std)
    labels, iterations = _naive_kmeans(feats, res.init_indices, 1e-4)
    assert iterations == res.iterations > 1
    assert torch.equal(res.labels, labels)
    assert len(set(res.labels.tolist())) == 10


def test_the_features_come_from_the_clean_branch_and_differ_from_the_adversarial_one(parent: Path) -> None:
    encoder, _ = load_encoder(parent)  # evaluated through 'adv': the route must be switched and restored
    x = _digits(64)
    with torch.no_grad(), bn_route(encoder, "clean"):
        clean = encoder.eval()(x.float() / 255)
    with torch.no_grad(), bn_route(encoder, "adv"):
        adv = encoder.eval()(x.float() / 255)
    assert not torch.allclose(clean, adv, atol=1e-3)  # the two branches tell apart
    assert torch.equal(backbone_features(encoder, x), clean)
    assert all(m.route == "adv" for m in encoder.modules() if isinstance(m, DualBatchNorm))
    for name in ("dynacl++", "air++", "air++-2023-10"):
        assert resolve_recipe(name).feature_route == "clean"


def test_the_run_labels_with_the_recorded_seed_and_the_recipe_cluster_count(
    parent: Path, child: Path
) -> None:
    from safetensors.torch import load_file

    m = json.loads((child / "manifest.json").read_text())
    encoder, _ = load_encoder(parent)
    x = _digits(256)  # the parent trained on its first 256 images: so does the post-processing
    want = assign_pseudo_labels(encoder, x, 10, tol=1e-4, seed=m["post"]["kmeans_seed"], route="clean")
    got = load_file(child / m["post"]["pseudo_labels"])["labels"]
    assert torch.equal(got, want.labels)
    assert m["post"]["cluster_sizes"] == torch.bincount(want.labels, minlength=10).tolist()
    oct23 = resolve_recipe("air++-2023-10")  # AIR's October-2023 assign(): one cluster per class
    assert oct23.clusters is None and oct23.kmeans_tol == 1e-5


# ============ LP and AFT ============


def _head(encoder: nn.Module, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(int(encoder.feature_dim), 10)


def test_linear_probing_leaves_the_encoder_as_it_was(parent: Path) -> None:
    encoder, _ = load_encoder(parent)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    head = lpaft.zero_head(encoder.feature_dim, 10, torch.device("cpu"))
    recipe = resolve_recipe("dynacl++", TINY)
    x, y = _digits(), torch.arange(256) % 10
    stage = lpaft.lp_stage(recipe, head, None)
    encoder.train()  # the step must put it in eval mode itself (BatchNorm statistics frozen)
    lpaft.run_stage(stage, x, y, lpaft.lp_step(encoder, head), recipe=recipe, seed=0)
    after = encoder.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "LP changed the encoder"
    assert head.weight.abs().sum() > 0  # the head did train


def _routes_seen(model: nn.Module) -> list[tuple[str, bool]]:
    """Record (route, training) of every forward through the model's first dual BatchNorm."""
    seen: list[tuple[str, bool]] = []
    bn = next(m for m in model.modules() if isinstance(m, DualBatchNorm))
    bn.register_forward_pre_hook(lambda m, _: seen.append((m.route, m.training)))
    return seen


@pytest.mark.parametrize("name", ["dynacl++", "air++", "air++-2023-10"])
def test_the_aft_step_routes_each_forward_as_the_authors(parent: Path, name: str) -> None:
    encoder, _ = load_encoder(parent)
    set_bn_route(encoder, "adv")
    model = nn.Sequential(encoder, _head(encoder))
    recipe = resolve_recipe(name, {"steps": 3})
    seen = _routes_seen(model)
    lpaft.aft_step(model, recipe)(
        _digits(16).float() / 255, torch.arange(16) % 10, torch.Generator().manual_seed(0)
    )
    # DynACL trades_loss and AIR's April-2023 trades_loss_dual(natural_mode='pgd'): all through the
    # adversarial ('pgd') BN; AIR's October-2023 one: the attack's clean target through 'normal'
    target = "clean" if name == "air++-2023-10" else "adv"
    assert seen == [(target, False), *[("adv", False)] * 3, ("adv", True), ("adv", True)]


def test_the_authors_single_bn_trades_starts_at_x_and_air_starts_at_x_plus_noise(parent: Path) -> None:
    encoder, _ = load_encoder(parent)
    model = nn.Sequential(encoder, _head(encoder)).eval()
    x = _digits(32).float() / 255
    with torch.no_grad():
        p_nat = F.softmax(model(x), dim=1)
    dyn = resolve_recipe("dynacl++", {"steps": 1})
    gen = torch.Generator().manual_seed(0)
    # AIR's October 2023 (trades_start='randn'): TRADES' start x + 0.001 N(0,1), eval/finetune.py's
    # trades_examples
    air = resolve_recipe("air++-2023-10", {"steps": 2})
    want = ft.trades_examples(
        model, x, p_nat, eps=air.eps, step_size=air.step_size, steps=2, gen=torch.Generator().manual_seed(5)
    )
    assert torch.equal(lpaft.trades_attack(model, x, p_nat, air, torch.Generator().manual_seed(5)), want)
    # at x the KL is zero and its gradient only float32 rounding (docs/decisions.md): nothing of the
    # size a real gradient has; yet its sign is a full step, so the authors' x_adv does move
    x0 = x.clone().requires_grad_(True)
    kl = F.kl_div(F.log_softmax(model(x0), dim=1), p_nat, reduction="sum")
    (g,) = torch.autograd.grad(kl, x0)
    assert abs(float(kl.detach())) < 1e-4 and float(g.abs().max()) < 1e-6
    moved = lpaft.trades_attack(model, x, p_nat, dyn, gen)
    assert not torch.equal(moved, x)  # not the "x_adv stays x" of exact arithmetic
    assert torch.equal(
        moved,
        torch.clamp(x + dyn.step_size * g.sign(), (x - dyn.eps).clamp(min=0), (x + dyn.eps).clamp(max=1)),
    )


# ============ fidelity: AIR's LPAFT_AFF.py (April 2023) and LP-AFF.py (October 2023) ============


class _AuthorsNet(nn.Module):
    """The authors' dual-BN network interface, ``model(x, bn_name)`` with ``'normal'`` (our clean
    branch) and ``'pgd'`` (our adversarial one), over our encoder and head."""

    def __init__(self, encoder: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.encoder, self.fc = encoder, head

    def forward(self, x: torch.Tensor, bn_name: str) -> torch.Tensor:
        with bn_route(self, {"normal": "clean", "pgd": "adv"}[bn_name]):
            return self.fc(self.encoder(x))


def _authors_trades_loss_dual(
    model: nn.Module, x_natural: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
    reading: str, noise: torch.Tensor, step_size: float = 2 / 255, epsilon: float = 8 / 255,
    perturb_steps: int = 10, beta: float = 6.0,
) -> torch.Tensor:  # fmt: skip
    """``trades_loss_dual`` as AIR's files call it from LPAFT_AFF.py's / LP-AFF.py's ``train()``:
    April 2023 (utils.py@b28c1d67:389-425, ``natural_mode='pgd'``): start at x, attack target
    ``model(x_natural, natural_mode)``; October 2023 (finetuning_utils.py@2c9ad3d:533-572): start at
    ``x + 0.001 * torch.randn`` (``noise`` here, drawn by the caller), target ``model(x_natural,
    'normal')``. Both: ``nn.KLDivLoss(size_average=False)`` (a sum), outer loss through
    ``natural_mode`` and ``'pgd'``."""
    natural_mode = "pgd"
    batch_size = len(x_natural)
    criterion_kl = nn.KLDivLoss(reduction="sum")
    model.eval()
    if reading == "2023-04":
        x_adv = x_natural.detach()
        target_mode = natural_mode
    else:
        x_adv = x_natural.detach() + 0.001 * noise.detach()
        target_mode = "normal"
    for _ in range(perturb_steps):
        x_adv.requires_grad_()
        with torch.enable_grad():
            model.eval()
            loss_kl = criterion_kl(
                F.log_softmax(model(x_adv, "pgd"), dim=1), F.softmax(model(x_natural, target_mode), dim=1)
            )
        grad = torch.autograd.grad(loss_kl, [x_adv])[0]
        x_adv = x_adv.detach() + step_size * torch.sign(grad.detach())
        x_adv = torch.min(torch.max(x_adv, x_natural - epsilon), x_natural + epsilon)
        x_adv = torch.clamp(x_adv, 0.0, 1.0)
    x_adv = torch.clamp(x_adv, 0.0, 1.0).detach()
    optimizer.zero_grad()
    model.train()
    logits = model(x_natural, natural_mode)
    loss = F.cross_entropy(logits, y)
    logits_adv = model(x_adv, "pgd")
    loss_robust = (1.0 / batch_size) * criterion_kl(
        F.log_softmax(logits_adv, dim=1), F.softmax(logits, dim=1)
    )
    return loss + beta * loss_robust


def _aft_pair(parent: Path) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    """Two identical (encoder, head) models at the authors' BatchNorm momentum, a batch, its labels."""
    from robustbench_nacl.models.dual_bn import set_bn_momentum

    models = []
    for _ in range(2):
        encoder, _ = load_encoder(parent)
        set_bn_momentum(encoder, 0.1, main=0.1)
        set_bn_route(encoder, "adv")
        head = _head(encoder, seed=3)
        with torch.no_grad():  # a head that predicts something (the authors' starts at zeros, then LP)
            head.weight.mul_(5.0)
        models.append(nn.Sequential(encoder, head))
    x = _digits(48).float() / 255
    return models[0], models[1], x, torch.arange(48) % 10


def _authors_step(
    model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, reading: str, noise: torch.Tensor
) -> float:
    net = _AuthorsNet(model[0], model[1])
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = _authors_trades_loss_dual(net, x, y, opt, reading, noise)
    loss.backward()
    return float(loss.detach())


def _ours_step(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, recipe: str, **sets: str) -> float:
    loss = lpaft.aft_loss(model, x, y, resolve_recipe(recipe, sets or None), torch.Generator().manual_seed(9))
    loss.backward()
    return float(loss.detach())


def _same_step(a: nn.Module, b: nn.Module, loss_a: float, loss_b: float) -> bool:
    """Loss to 1e-9, every gradient (None for both where a parameter gets none: the clean branch's
    BatchNorm affine) and every BatchNorm statistic after the step equal."""
    pairs = list(zip(a.parameters(), b.parameters(), strict=True))
    assert any(p.grad is not None for p, _ in pairs)
    grads = all(
        (p.grad is None and q.grad is None)
        or (p.grad is not None and q.grad is not None and torch.allclose(p.grad, q.grad, rtol=0, atol=1e-9))
        for p, q in pairs
    )
    buffers = all(torch.equal(u, v) for u, v in zip(a.buffers(), b.buffers(), strict=True))
    return abs(loss_a - loss_b) <= 1e-9 and grads and buffers


def test_air_plus_plus_is_the_april_2023_aft_step_and_not_the_clean_target_one(parent: Path) -> None:
    ours, theirs, x, y = _aft_pair(parent)
    a = _ours_step(ours, x, y, "air++")
    b = _authors_step(theirs, x, y, "2023-04", torch.zeros_like(x))
    assert _same_step(ours, theirs, a, b)
    # the exported branch: the authors evaluate route 1 of ['normal', 'pgd'] (--bnNameCnt 1)
    assert resolve_recipe("air++").export_route == "adv"
    # the test tells the two readings apart: the clean-branch attack target alone breaks it
    ours, theirs, x, y = _aft_pair(parent)
    a = _ours_step(ours, x, y, "air++", attack_target_route="clean")
    b = _authors_step(theirs, x, y, "2023-04", torch.zeros_like(x))
    assert not _same_step(ours, theirs, a, b)


def test_the_october_2023_reading_is_its_own_switch(parent: Path) -> None:
    noise = torch.randn(48, 1, 8, 8, generator=torch.Generator().manual_seed(9))  # trades_examples' draw
    ours, theirs, x, y = _aft_pair(parent)
    a = _ours_step(ours, x, y, "air++-2023-10")
    b = _authors_step(theirs, x, y, "2023-10", noise)
    assert _same_step(ours, theirs, a, b)
    oct23, apr23 = resolve_recipe("air++-2023-10"), resolve_recipe("air++")
    assert (oct23.attack_target_route, oct23.trades_start, oct23.clusters, oct23.kmeans_tol) == (
        "clean", "randn", None, 1e-5,
    )  # fmt: skip
    assert (apr23.attack_target_route, apr23.trades_start, apr23.clusters, apr23.kmeans_tol) == (
        "adv",
        "x",
        10,
        1e-4,
    )
    assert "cannot run" in oct23.source


# ============ the checkpoint ============


def test_the_output_loads_evaluates_and_is_another_recipe(parent: Path, child: Path, tmp_path: Path) -> None:
    m = json.loads((child / "manifest.json").read_text())
    p = json.loads((parent / "manifest.json").read_text())
    assert m["parent"]["id"] == p["id"] and m["parent"]["weights_sha256"] == p["weights_sha256"]
    assert str(parent) not in json.dumps(m)  # provenance by id and sha256, no path of this machine
    assert m["loss"] == "dynacl++" and m["eval_bn_route"] == "adv" and m["dual_bn"] is True
    assert m["training_config"]["post"]["name"] == "dynacl++"
    enc, info = load_encoder(child)
    assert all(b.route == "adv" for b in enc.modules() if isinstance(b, DualBatchNorm))
    penc, pinfo = load_encoder(parent)
    mine = recipe_of(CheckpointInfo.from_info(info), encoder=enc, control=False)
    theirs = recipe_of(CheckpointInfo.from_info(pinfo), encoder=penc, control=False)
    assert mine != theirs and mine["config"]["post"]["trades_start"] == "x"
    assert m["recipe_sha256"] != p["recipe_sha256"]
    result = evaluate(
        child, dataset="digits", suite=SUITE, n_examples=20, out=tmp_path, progress=False, device="cpu"
    )
    rows = list(result)
    assert rows and all(r["checkpoint_id"] == m["id"] and r["recipe"] == mine for r in rows)


def test_a_killed_run_resumes_to_the_same_weights(
    parent: Path, child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save = lpaft.save_state

    def killed(path: Path | None, modules: dict, opt: torch.optim.Optimizer, epoch: int) -> None:
        save(path, modules, opt, epoch)
        if path is not None and path.name == "aft.pt" and epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(lpaft, "save_state", killed)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        post_process(parent, "dynacl++", out, overrides=TINY, device="cpu", progress=False)
    assert not (out / "manifest.json").exists() and (out / "post-state" / "aft.pt").is_file()
    before = json.loads((out / "post-state" / "clock.json").read_text())
    monkeypatch.setattr(lpaft, "save_state", save)
    post_process(parent, "dynacl++", out, overrides=TINY, device="cpu", progress=False)
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (child, out))
    assert a["weights_sha256"] == b["weights_sha256"] and a["id"] == b["id"]

    # the branch agreement after LP and after each AFT epoch, the killed epoch's kept across the resume
    assert a["post"]["aft_monitor"] == b["post"]["aft_monitor"]
    assert [r["epoch"] for r in b["post"]["aft_monitor"]] == [0, 1, 2]
    assert all(0 <= r["agreement"] <= 1 and -1 <= r["feature_cosine"] <= 1 for r in b["post"]["aft_monitor"])
    # the resumed run says so, and each stage's time adds up both processes' epochs: LP's is the killed
    # run's alone (it was done), AFT's its epoch 1 and the resumed run's epoch 2
    assert "resumed_at" not in a["post"] and b["post"]["resumed_at"] == {"lp": TINY["lp_epochs"], "aft": 1}
    assert b["post"]["wall_s"]["lp"] == pytest.approx(sum(before["lp"].values()), abs=1e-3)
    assert set(before["aft"]) == {"1"} and b["post"]["wall_s"]["aft"] > before["aft"]["1"] > 0
    assert not (out / "post-state").exists()


# ============ the command ============


def test_the_command_runs_and_refuses_bad_input_in_one_line(
    parent: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    out = tmp_path / "air"
    rc, stdout, err = cli(
        [
            "post",
            str(parent),
            "--recipe",
            "air++",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--no-progress",
            *sets,
        ],
        capsys,
    )
    assert rc == 0, err
    assert "air++ of" in stdout and json.loads((out / "manifest.json").read_text())["loss"] == "dynacl++"
    rc, stdout, _ = cli(
        ["post", str(parent), "--recipe", "air++", "--out", str(out), "--device", "cpu", *sets], capsys
    )
    assert rc == 0 and "nothing to do" in stdout
    rc, _, err = cli(["post", str(parent), "--out", str(out), "--device", "cpu", *sets], capsys)
    one_line_error(rc, err, "holds another checkpoint", command="post")  # never overwritten
    simclr = _train("simclr", tmp_path / "simclr")
    rc, _, err = cli(["post", str(simclr), "--out", str(tmp_path / "x")], capsys)
    one_line_error(rc, err, "no dual BatchNorm", command="post")
    rc, _, err = cli(["post", str(tmp_path / "nothing"), "--out", str(tmp_path / "y")], capsys)
    one_line_error(rc, err, "no such checkpoint directory", command="post")
    (tmp_path / "empty").mkdir()  # a folder that is not a checkpoint
    rc, _, err = cli(["post", str(tmp_path / "empty"), "--out", str(tmp_path / "y")], capsys)
    one_line_error(rc, err, "written by `train`", command="post")
    foreign = tmp_path / "foreign.pt"
    torch.save({"conv1.weight": torch.zeros(8, 1, 3, 3)}, foreign)
    rc, _, err = cli(["post", str(foreign), "--out", str(tmp_path / "y")], capsys)
    one_line_error(rc, err, "not a foreign weights file", command="post")
    rc, stdout, err = cli(
        ["post", str(parent / "weights.safetensors"), "--recipe", "air++", "--out", str(out), *sets], capsys
    )
    assert rc == 0 and "nothing to do" in stdout, err  # the weights file of a train directory will do
    rc, _, err = cli(["post", str(parent), "--recipe", "dynacl+", "--out", str(tmp_path / "z")], capsys)
    one_line_error(rc, err, "did you mean 'dynacl++'", command="post")
    rc, _, err = cli(
        ["post", str(parent), "--set", "trades_start=zero", "--out", str(tmp_path / "z")], capsys
    )
    one_line_error(rc, err, "trades_start", command="post")
    for bad in ("aft_lr=1e300", "lp_lr=nan", "beta=-1"):  # values checked before the parent is read
        rc, _, err = cli(["post", str(parent), "--set", bad, "--out", str(tmp_path / "v")], capsys)
        one_line_error(rc, err, bad.split("=")[0], command="post")
    assert not (tmp_path / "v").exists()
