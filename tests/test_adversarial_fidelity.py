"""Fidelity of the adversarial presets to their authors' code: one training step of each preset, as
the trainer runs it, against a naive transcription of the authors' step written here (loss value,
the gradient of every parameter, every BatchNorm buffer afterwards); DynACL's EMA network after a
few steps and the weights it exports; DeACL's student equal to its teacher at step 0.

The transcriptions follow, line by line, ACL ``train_simCLR.py`` (``PGD_contrastive``, ``nt_xent``
of ``utils.py``, views interleaved), DynACL ``train_DynACL.py`` and ``models/resnet_multi_bn.py``
(``swap=True``, ``_momentum_update_encoder_k``), RoCL ``src/rocl_train.py``, ``src/attack_lib.py``
and ``src/loss.py`` (``pairwise_similarity`` with its detached columns and 1e-8 terms), DeACL
``solo/methods/mocov2_distillation_AT.py`` and ``base_for_adversarial_training.py``. The only thing
taken from the engine is the stream of random starts (drawn here in the engine's order), so that
both sides attack from the same point.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustbench_nacl.losses import resolve
from robustbench_nacl.losses.adversarial import StepContext
from robustbench_nacl.losses.objectives import OBJECTIVES
from robustbench_nacl.models.dual_bn import DualBatchNorm
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.models.heads import ContrastiveModel
from robustbench_nacl.training.step import exported

B = 8


def images(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(B, 1, 8, 8, generator=g, dtype=torch.float64) for _ in range(2)]


def preset_model(name: str, overrides: dict | None = None, seed: int = 0) -> tuple[ContrastiveModel, object]:
    """The preset's model as ``train`` builds it (head, BatchNorm, ``prepare``), in float64."""
    p = resolve(name, overrides or {})
    torch.manual_seed(seed)
    enc = create_encoder("convnet_small", in_channels=1, mean=(0.5,), std=(0.5,), dual_bn=p.dual_bn, width=8)
    model = ContrastiveModel(enc, p.head).double()
    prepare = OBJECTIVES.get(p.objective).prepare
    if prepare is not None:
        prepare(model, p)
    return model.double(), p


def ours_step(model: nn.Module, p, xs, seed: int, values: dict | None = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    ctx = StepContext(gen=torch.Generator().manual_seed(seed), values=values or {"adv_weight": 1.0})
    model.train()
    loss, _ = OBJECTIVES.get(p.objective).loss(model, xs, None, p, torch.Generator(), False, ctx=ctx)
    loss.backward()
    return loss.detach()


def starts(xs: list[torch.Tensor], eps: float, seed: int) -> list[torch.Tensor]:
    """The engine's random starts U(-eps, eps), one tensor per attacked batch, in its order."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(x.shape, generator=g, dtype=x.dtype) * 2 - 1) * eps for x in xs]


def set_bn(model: nn.Module, name: str) -> None:
    """The authors' ``bn_name`` argument: 'normal' or 'pgd' for every dual BatchNorm."""
    for m in model.modules():
        if isinstance(m, DualBatchNorm):
            m.route = {"normal": "clean", "pgd": "adv"}[name]


def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``inputs.view(d[0] * 2, ...)`` of a [B, 2, ...] batch: rows 2i and 2i+1 are image i's views."""
    return torch.stack([a, b], dim=1).reshape(2 * a.shape[0], *a.shape[1:])


def acl_nt_xent(x: torch.Tensor, t: float = 0.5) -> torch.Tensor:
    """ACL/DynACL ``utils.py`` ``nt_xent`` on interleaved features."""
    n = x.norm(p=2, dim=1, keepdim=True)
    x = (x @ x.t()) / (n * n.t()).clamp(min=1e-8)
    x = torch.exp(x / t)
    idx = torch.arange(x.size()[0])
    idx[::2] += 1
    idx[1::2] -= 1
    x = x[idx]
    x = x.diag() / (x.sum(0) - torch.exp(torch.tensor(1 / t, dtype=x.dtype)))
    return -torch.log(x).mean()


def pgd_contrastive(features, inputs, delta, eps=8 / 255, alpha=2 / 255, iters=5) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """ACL/DynACL ``PGD_contrastive``: ``features`` is the eval-mode 'pgd' forward of the method."""
    delta = delta.clone()
    for _ in range(iters):
        delta.requires_grad_(True)
        loss = acl_nt_xent(features(inputs + delta))
        (g,) = torch.autograd.grad(loss, delta)
        delta = (delta.detach() + alpha * g.sign()).clamp(-eps, eps)
        delta = (inputs + delta).clamp(0, 1) - inputs
    return (inputs + delta).detach()


def assert_same_state(ours: nn.Module, ref: nn.Module, skip: str = "\0") -> None:
    """Every gradient and every buffer (BatchNorm statistics) equal; ``skip`` a key prefix."""
    for (name, q), (_, r) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        if name.startswith(skip):
            continue
        assert (q.grad is None) == (r.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(q.grad, r.grad, rtol=1e-6, atol=1e-9, msg=name)
    for (name, q), (_, r) in zip(ours.named_buffers(), ref.named_buffers(), strict=True):
        if not name.startswith(skip):
            torch.testing.assert_close(q, r, rtol=1e-9, atol=1e-12, msg=name)


# ============ ACL ============


def acl_authors_step(model: nn.Module, v1: torch.Tensor, v2: torch.Tensor, start: list) -> torch.Tensor:  # type: ignore[type-arg]
    """``train_simCLR.py --ACL_DS``: PGD on the interleaved pair (eval, 'pgd'), then one 2B forward per
    branch in train mode and ``(nt_xent(features) + nt_xent(features_adv)) / 2``."""
    inputs = interleave(v1, v2)

    def eval_pgd(x: torch.Tensor) -> torch.Tensor:
        set_bn(model, "pgd")
        return model.eval()(x)

    inputs_adv = pgd_contrastive(eval_pgd, inputs, interleave(*start))
    set_bn(model, "pgd")
    features_adv = model.train()(inputs_adv)
    set_bn(model, "normal")
    features = model.train()(inputs)
    loss = (acl_nt_xent(features) + acl_nt_xent(features_adv)) / 2
    loss.backward()
    return loss.detach()


def authors_proj_head(in_dim: int) -> list[tuple[type, tuple[int, ...]]]:
    """``proj_head(ch)`` of ``models/resnet_multi_bn.py``: (layer kind, weight shape) in order."""
    return [
        (nn.Linear, (in_dim, in_dim)),
        (nn.BatchNorm1d, (in_dim,)),
        (nn.ReLU, ()),
        (nn.Linear, (in_dim, in_dim)),
        (nn.BatchNorm1d, (in_dim,)),
        (nn.ReLU, ()),
        (nn.Linear, (in_dim, in_dim)),
        (nn.BatchNorm1d, (in_dim,)),
    ]


def layers(head: nn.Module) -> list[tuple[type, tuple[int, ...]]]:
    out = []
    for m in head:
        bn = m.main if isinstance(m, DualBatchNorm) else m
        kind = type(bn)
        out.append((kind, tuple(bn.weight.shape) if getattr(bn, "weight", None) is not None else ()))
    return out


@pytest.mark.parametrize("name", ["acl", "dynacl"])
def test_acl_and_dynacl_heads_are_the_authors_proj_head(name: str) -> None:
    model, _ = preset_model(name)
    dim = model.encoder.feature_dim
    assert layers(model.head) == authors_proj_head(dim)
    biases = [m.bias is not None for m in model.head if isinstance(m, nn.Linear)]
    assert biases == [True, False, False]  # fc1 with bias, fc2 and fc3 without
    assert all(isinstance(m, DualBatchNorm) for m in model.head if not isinstance(m, nn.Linear | nn.ReLU))


def test_one_acl_step_is_the_authors() -> None:
    model, p = preset_model("acl")
    ref = copy.deepcopy(model)
    v1, v2 = images(1)
    loss = ours_step(model, p, [v1, v2], seed=7)
    want = acl_authors_step(ref, v1, v2, starts([v1, v2], 8 / 255, seed=7))
    torch.testing.assert_close(loss, want, rtol=1e-9, atol=0)
    assert_same_state(model, ref)  # the joint 2B forward per branch: the BatchNorm statistics too


# ============ DynACL ============


def dynacl_authors_steps(q: nn.Module, batches, seeds, w: float, m: float = 0.99, lr: float = 0.1):  # type: ignore[no-untyped-def]
    """``resnet18_momentum`` + ``train_DynACL.py``: ``encoder_k`` a copy of ``encoder_q`` with no
    gradient (``_init_encoder_k``); each step PGD through the swap (view 1 -> q, view 2 -> k, eval,
    'pgd'), the two train-mode swap forwards, the EMA update, then backward and the optimizer step."""
    k = copy.deepcopy(q)
    for param in k.parameters():
        param.requires_grad_(False)
    opt = torch.optim.SGD(q.parameters(), lr=lr)
    losses = []
    for (v1, v2), seed in zip(batches, seeds, strict=True):

        def swap(x: torch.Tensor, bn: str, mode: str) -> torch.Tensor:
            for net in (q, k):
                set_bn(net, bn)
                net.train(mode == "train")
            even, odd = q(x[0::2]), k(x[1::2])
            out = torch.zeros(x.shape[0], even.shape[1], dtype=even.dtype)
            out[::2], out[1::2] = even, odd
            return out

        inputs = interleave(v1, v2)
        inputs_adv = pgd_contrastive(
            lambda x: swap(x, "pgd", "eval"), inputs, interleave(*starts([v1, v2], 8 / 255, seed))
        )
        features_adv = swap(inputs_adv, "pgd", "train")
        features = swap(inputs, "normal", "train")
        with torch.no_grad():
            for pk, pq in zip(k.parameters(), q.parameters(), strict=True):
                pk.data = pk.data * m + pq.data * (1.0 - m)
        loss = (acl_nt_xent(features) * (2 - w) + acl_nt_xent(features_adv) * w) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return k, losses


def test_dynacl_steps_are_the_authors_and_the_ema_network_is_exported() -> None:
    model, p = preset_model("dynacl")
    q = copy.deepcopy(model)
    del q.momentum  # the authors' online network; their EMA copy is made by the transcription
    opt = torch.optim.SGD([x for x in model.parameters() if x.requires_grad], lr=0.1)
    batches, seeds, w = [images(s) for s in (1, 2, 3)], [7, 8, 9], 4 / 3
    ours = []
    for xs, seed in zip(batches, seeds, strict=True):
        opt.zero_grad()
        ours.append(ours_step(model, p, xs, seed, {"adv_weight": w}))
        opt.step()
    k, want = dynacl_authors_steps(q, batches, seeds, w)
    torch.testing.assert_close(torch.stack(ours), torch.stack(want), rtol=1e-8, atol=0)
    # the online network, the EMA network (parameters and its own BatchNorm statistics) and the export
    for (name, a), b in zip(model.named_parameters(), [*q.parameters(), *k.parameters()], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12, msg=name)
    assert exported(model, p) is model.momentum
    for (name, a), b in zip(exported(model, p).state_dict().items(), k.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12, msg=name)
    assert not all(
        torch.equal(a, b) for a, b in zip(model.encoder.parameters(), k.encoder.parameters(), strict=True)
    )


def test_dynacl_momentum_zero_is_the_symmetric_reading() -> None:
    model, p = preset_model("dynacl", {"momentum": 0.0})
    assert not hasattr(model, "momentum") and exported(model, p) is model
    ref, pa = preset_model("acl")
    v = images(4)
    torch.testing.assert_close(ours_step(model, p, v, 3), ours_step(ref, pa, v, 3), rtol=1e-12, atol=0)


# ============ RoCL ============


def rocl_pairwise_similarity(outputs: torch.Tensor, temperature: float = 0.5) -> torch.Tensor:
    """RoCL ``src/loss.py`` ``pairwise_similarity`` (one process): the columns detached."""
    b = outputs.shape[0]
    outputs_norm = outputs / (outputs.norm(dim=1).view(b, 1) + 1e-8)
    return (1.0 / temperature) * torch.mm(outputs_norm, outputs_norm.transpose(0, 1).detach())


def rocl_nt_xent(sim: torch.Tensor, adv_type: str) -> torch.Tensor:
    """RoCL ``src/loss.py`` ``NT_xent``: 'None' (two views) or 'Rep' (three)."""
    n2 = len(sim)
    n = n2 // (3 if adv_type == "Rep" else 2)
    e = torch.exp(sim) * (1 - torch.eye(n2, n2, dtype=sim.dtype))
    nll = -torch.log(e / (torch.sum(e, dim=1).view(n2, 1) + 1e-8) + 1e-8)
    if adv_type == "None":
        return (1.0 / n2) * torch.sum(torch.diag(nll[0:n, n:]) + torch.diag(nll[n:, 0:n]))
    blocks = [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)]
    return (1.0 / n2) * sum(
        torch.sum(torch.diag(nll[i * n : (i + 1) * n, j * n : (j + 1) * n])) for i, j in blocks
    )


def rocl_authors_step(model: nn.Module, v1, v2, u, eps=0.0314, alpha=0.007, k=7, lamda=256.0):  # type: ignore[no-untyped-def]
    """``RepresentationAdv.get_loss`` (start clipped to [0, 1], eval mode, NT-Xent of cat(x, target),
    clamp then project), its train-mode regulariser forward, then the 3B forward of ``rocl_train.py``."""
    x = torch.clamp(v1 + u, 0, 1)
    model.eval()
    for _ in range(k):
        x.requires_grad_(True)
        loss = rocl_nt_xent(rocl_pairwise_similarity(model(torch.cat((x, v2)))), "None")
        (g,) = torch.autograd.grad(loss, x)
        x = x.detach() + alpha * torch.sign(g)
        x = torch.clamp(x, 0, 1)
        x = torch.min(torch.max(x, v1 - eps), v1 + eps)
    model.train()
    adv_loss = (1.0 / lamda) * rocl_nt_xent(rocl_pairwise_similarity(model(torch.cat((x, v2)))), "None")
    outputs = model(torch.cat((v1, v2, x)))
    loss = rocl_nt_xent(rocl_pairwise_similarity(outputs), "Rep") + adv_loss
    loss.backward()
    return loss.detach()


def test_rocl_head_views_and_one_step_are_the_authors() -> None:
    model, p = preset_model("rocl")
    assert [type(m) for m in model.head] == [nn.Linear, nn.ReLU, nn.Linear]
    assert model.head[0].out_features == 2048 and model.head[2].out_features == 128
    e = p.extra_params()
    assert (e["strength"], e["scale_min"]) == (0.5, 0.08)  # ColorJitter(0.4, 0.4, 0.4, 0.1), RRC (0.08, 1)
    ref = copy.deepcopy(model)
    v1, v2 = images(5)
    loss = ours_step(model, p, [v1, v2], seed=11)
    want = rocl_authors_step(ref, v1, v2, starts([v1], 0.0314, seed=11)[0])
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=0)  # their 1e-8 terms
    for (name, a), b in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-9, msg=name)
    for (name, a), b in zip(model.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)


# ============ DeACL ============


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A stage-1 checkpoint written by ``train`` (SimCLR, 1 epoch on digits), as DeACL's teacher."""
    from robustbench_nacl.training import TrainConfig, train

    out = tmp_path_factory.mktemp("teacher") / "simclr"
    cfg = TrainConfig(loss="simclr", dataset="digits", encoder_kwargs={"width": 8}, epochs=1, batch_size=64)
    return train(cfg, out, progress=False)


def deacl_authors_step(student: nn.Module, teacher: nn.Module, x, u, eps=8 / 255, alpha=2 / 255, k=5):  # type: ignore[no-untyped-def]
    """``training_step`` of ``mocov2_distillation_AT.py`` with ``generate_training_AE``."""
    away_target = teacher.eval()(x)
    x_cl = x.clone().detach() + u
    student.eval()
    for _ in range(k):
        x_cl.requires_grad_(True)
        loss = -F.cosine_similarity(student(x_cl), away_target, dim=1).sum() * 256
        (g,) = torch.autograd.grad(loss, x_cl)
        x_cl = x_cl.detach() + alpha * torch.sign(g.detach())
        x_cl = torch.min(torch.max(x_cl, x - eps), x + eps)
        x_cl = torch.clamp(x_cl, 0, 1)
    student.train()
    logits_all = student(torch.cat([x, x_cl]))
    clean, adv = logits_all.chunk(2)
    loss = -F.cosine_similarity(clean, away_target).mean() - 2 * F.cosine_similarity(adv, clean).mean()
    loss.backward()
    return loss.detach()


def test_deacl_student_starts_as_the_teacher_and_steps_as_the_authors(teacher_dir) -> None:  # type: ignore[no-untyped-def]
    from robustbench_nacl.losses.adversarial import load_teacher

    model, p = preset_model("deacl", {"teacher": str(teacher_dir)})
    teacher = load_teacher(p)["teacher"].double()
    for (name, a), b in zip(model.encoder.state_dict().items(), teacher.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    scratch, _ = preset_model("deacl", {"teacher": str(teacher_dir), "student_init": "scratch"})
    first = next(iter(teacher.parameters()))
    assert not torch.equal(next(iter(scratch.encoder.parameters())), first)
    ref = copy.deepcopy(model)
    x = images(6)[0]
    ctx_teacher = {"teacher": teacher}
    ctx = StepContext(gen=torch.Generator().manual_seed(3), resources=ctx_teacher)
    model.train()
    loss, _ = OBJECTIVES.get(p.objective).loss(model, [x], None, p, torch.Generator(), False, ctx=ctx)
    loss.backward()
    want = deacl_authors_step(ref, teacher, x, starts([x], 8 / 255, seed=3)[0])
    torch.testing.assert_close(loss.detach(), want, rtol=1e-9, atol=0)
    assert_same_state(model, ref)


# ============ AIR ============


def authors_air_loss(zi, zj, z_orig, zi_adv, zj_adv, weight, t=0.5, lambda1=0.5, lambda2=0.5):  # type: ignore[no-untyped-def]
    """``AIR_Loss.forward`` of ``AIR.py``, transcribed (their ``F.kl_div`` calls included)."""
    bs = zi.shape[0]
    mask = torch.ones((bs, bs), dtype=bool).fill_diagonal_(0)
    zi, zj, zo, za, zb = (F.normalize(z, p=2, dim=-1) for z in (zi, zj, z_orig, zi_adv, zj_adv))

    def contrastive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ii, ij, ji, jj = a @ a.t() / t, a @ b.t() / t, b @ a.t() / t, b @ b.t() / t
        pos = torch.cat((ij[~mask], ji[~mask])).unsqueeze(1)
        neg_i = torch.cat((ii[mask].reshape(bs, -1), ij[mask].reshape(bs, -1)), dim=1)
        neg_j = torch.cat((ji[mask].reshape(bs, -1), jj[mask].reshape(bs, -1)), dim=1)
        logits = torch.cat((pos, torch.cat((neg_i, neg_j), dim=0)), dim=1)
        return F.cross_entropy(logits, torch.zeros(2 * bs, dtype=torch.long))

    nat, adv = contrastive(zi, zj), contrastive(za, zb)
    probs_io_zi = F.softmax((zi @ zo.t() / t)[~mask], -1)
    probs_jo_zj = F.log_softmax((zj @ zo.t() / t)[~mask], -1)
    sir = F.kl_div(probs_io_zi, probs_jo_zj, log_target=True, reduction="sum")
    consis_i = F.softmax((za @ zi.t() / t)[~mask], -1)
    consis_j = F.softmax((zb @ zj.t() / t)[~mask], -1)
    probs_i = torch.mul(F.softmax((za @ zo.t() / t)[~mask], -1), consis_i)
    probs_j = torch.mul(F.softmax((zb @ zo.t() / t)[~mask], -1), consis_j)
    air = F.kl_div(probs_i, torch.log(probs_j), log_target=True, reduction="sum")
    return nat * (1 - weight) + adv * (1 + weight) + lambda1 * sir + lambda2 * air


def air_authors_step(model: nn.Module, v1, v2, orig, start, weight: float) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """``pretraining.py --ACL_DS``: ACL's PGD, then the adversarial, clean and original forwards."""
    inputs = interleave(v1, v2)

    def eval_pgd(x: torch.Tensor) -> torch.Tensor:
        set_bn(model, "pgd")
        return model.eval()(x)

    inputs_adv = pgd_contrastive(eval_pgd, inputs, interleave(*start))
    set_bn(model, "pgd")
    features_adv = model.train()(inputs_adv)
    set_bn(model, "normal")
    features = model.train()(inputs)
    z_orig = model.train()(orig)
    loss = authors_air_loss(
        features[0::2], features[1::2], z_orig, features_adv[0::2], features_adv[1::2], weight
    )
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize(("name", "weight"), [("acl_air", 0.0), ("dynacl_air", 0.6)])
def test_one_air_step_is_the_authors(name: str, weight: float) -> None:
    model, p = preset_model(name)
    ref = copy.deepcopy(model)
    v1, v2 = images(8)
    orig = images(9)[0]
    loss = ours_step(model, p, [v1, v2, orig], seed=5, values={"air_weight": weight})
    want = air_authors_step(ref, v1, v2, orig, starts([v1, v2], 8 / 255, seed=5), weight)
    torch.testing.assert_close(loss, want, rtol=1e-9, atol=0)
    assert_same_state(model, ref)


def test_the_air_view_maker_hands_over_the_original_images() -> None:
    from robustbench_nacl.augment.views import VIEW_MAKERS

    x = (images(3)[0] * 255).to(torch.uint8)
    views = VIEW_MAKERS.get("acl_original")(x, 3, torch.Generator().manual_seed(0), aug_strength=1.0)
    assert len(views) == 3 and torch.equal(views[2], x.float() / 255)
    assert not torch.equal(views[0], views[2])
