"""The GPU path, checked on the CPU: the synchronised BatchNorm each backend gets, no host syncs in
the training and PGD steps (counted by a CPU proxy, results bit-identical), ``--deterministic``,
TF32-proof sanity forwards, kNN on the features' device, the attack batch halving on an
out-of-memory error, the zoo pool's start method, and ``bench/gpu_epoch.py`` run end to end."""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _models import digits_data, digits_model, one_thread, small_cnn
from _syncs import count_syncs
from torch import Tensor, nn

from robustbench_nacl import losses
from robustbench_nacl.attack import pgd as pgd_m
from robustbench_nacl.attack import runner
from robustbench_nacl.attack.memory import halving_on_oom
from robustbench_nacl.attack.norms import norm_ops
from robustbench_nacl.augment import views
from robustbench_nacl.cli import main
from robustbench_nacl.eval.benchmark import benchmark
from robustbench_nacl.eval.sanity import check_batch_independence, check_deterministic, logit_tolerance
from robustbench_nacl.losses.estimators import base_pair_similarities
from robustbench_nacl.models.dual_bn import DualBatchNorm
from robustbench_nacl.models.features import knn_predict
from robustbench_nacl.pipeline import make_pool, start_method
from robustbench_nacl.training import TrainConfig, TrainStep, build_model, distributed
from robustbench_nacl.utils import CUBLAS_WORKSPACE, DETERMINISTIC_ENV, deterministic_from_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


# ============ 1. synchronised BatchNorm per backend ============


def test_sync_bn_is_torchs_under_nccl_and_the_own_one_under_gloo() -> None:
    for backend, cls in (("nccl", nn.SyncBatchNorm), ("gloo", distributed.SyncBatchNorm)):
        model = nn.Sequential(nn.Conv2d(1, 4, 3), DualBatchNorm(4), nn.Flatten(), nn.BatchNorm1d(144))
        weight, keys = model[1].main.weight, list(model.state_dict())
        distributed.convert_sync_bn(model, backend)
        assert type(model[1].main) is cls and type(model[1].aux) is cls and type(model[3]) is cls, backend
        assert model[1].main.weight is weight  # the optimizer's parameters are the model's
        assert list(model.state_dict()) == keys  # checkpoints load into plain BatchNorm either way


# ============ 2. no host syncs; the same bits ============


def _masked_pair_similarities(z1: Tensor, z2: Tensor, t: float) -> tuple[Tensor, Tensor]:
    """The boolean-mask form the gather replaced (what the loss computed before)."""
    b = z1.shape[0]
    zz = torch.cat([z1, z2])
    sim = zz @ zz.T / t
    idx = torch.arange(2 * b)
    same = (idx[:, None] % b) == (idx[None, :] % b)
    return sim[idx, (idx + b) % (2 * b)], sim[~same].view(2 * b, 2 * b - 2)


def test_pair_similarities_gather_the_masked_elements_bit_for_bit_without_a_sync() -> None:
    g = torch.Generator().manual_seed(0)
    for b in (2, 5, 16):
        z1, z2 = (F.normalize(torch.randn(b, 8, generator=g), dim=1).requires_grad_(True) for _ in range(2))
        with count_syncs() as syncs:
            _, s_pos, s_neg = base_pair_similarities(z1, z2, 0.5)
            grads = torch.autograd.grad((s_pos.sum() + (s_neg * s_neg).sum()), (z1, z2))
        assert syncs.total == 0, syncs.counts
        r_pos, r_neg = _masked_pair_similarities(z1, z2, 0.5)
        ref = torch.autograd.grad((r_pos.sum() + (r_neg * r_neg).sum()), (z1, z2))
        assert torch.equal(s_pos, r_pos) and torch.equal(s_neg, r_neg)
        assert all(torch.equal(a, r) for a, r in zip(grads, ref, strict=True))


#: every way the objectives and view makers differ: positives, estimators, robust term, mixing
SYNC_PRESETS = ("simclr", "debiased_hardneg", "adv", "nca", "mixnca", "intnacl", "var", "arcl")
SYNC_PRESETS += ("dacl", "dacl_plus", "gaussian", "supervised")
SYNC_PRESETS += ("acl", "rocl", "dynacl")  # the inner PGD too (deacl needs a teacher checkpoint)


def test_a_training_step_makes_no_host_sync(tmp_path: Path) -> None:
    x = torch.randint(0, 256, (16, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(16) % 5
    for preset in SYNC_PRESETS:
        cfg = TrainConfig(loss=preset, encoder_kwargs={"width": 4}, batch_size=16)
        params = losses.resolve(preset, {})
        model = build_model(cfg, params, channels=1, size=(8, 8), num_classes=5)
        opt = torch.optim.Adam(model.parameters())
        step = TrainStep(cfg, params, model, opt)
        g = torch.Generator().manual_seed(1)
        with count_syncs() as syncs:
            real_step = opt.step

            def adam_step(*a: Any, _real: Any = real_step, **k: Any) -> Any:
                # torch's Adam keeps its step count on the CPU and reads it there: not a device sync
                with syncs.paused():
                    return _real(*a, **k)

            opt.step = adam_step  # type: ignore[method-assign]
            loss, stats = step(x, y, g)
        assert syncs.total == 0, (preset, syncs.counts)
        assert isinstance(loss, Tensor) and all(isinstance(v, Tensor) for v in stats.values())


def test_dacl_views_check_non_negativity_once_per_call_and_never_for_uint8() -> None:
    x8 = torch.randint(0, 256, (8, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for name in ("dacl_plus", "dacl_geometric"):
        maker = views.VIEW_MAKERS.get(name)
        with count_syncs() as syncs:
            maker(x8, 3, torch.Generator().manual_seed(0))
        assert syncs.total == 0, (name, syncs.counts)
        with count_syncs() as syncs:
            maker(x8.float() / 255, 3, torch.Generator().manual_seed(0))
        assert syncs.counts == {"__bool__": 1}, (name, syncs.counts)  # once, not once per view
        with pytest.raises(ValueError, match="non-negative"):
            maker(x8.float() / 255 - 0.5, 3, torch.Generator().manual_seed(0))


def test_pgd_without_syncs_steps_the_same_perturbations(monkeypatch: pytest.MonkeyPatch) -> None:
    model = digits_model()
    _, _, x, y = digits_data()
    x, y = x[:96], y[:96]

    def attack(eps: float) -> Tensor:
        return pgd_m.pgd(model, x, y, eps=eps, gen=torch.Generator().manual_seed(0), steps=10, step_size=0.05)

    compact = {eps: attack(eps) for eps in (0.05, 0.3)}  # the CPU's form: the batch shrinks
    monkeypatch.setattr(pgd_m, "sync_free", lambda device: True)  # the accelerator's form, on the CPU
    for eps, ref in compact.items():
        assert torch.equal(attack(eps), ref), eps
    delta = torch.zeros_like(x)
    ops = norm_ops("Linf")
    with count_syncs() as syncs:
        pgd_m._pgd_steps_masked(model, x, y, delta, 0.3, ops, 10, 0.05, True)
    assert syncs.total == 0, syncs.counts
    with count_syncs() as syncs:  # the proxy sees what the masked form removed: >= 2 per step
        pgd_m._pgd_steps_compact(model, x, y, delta.clone(), 0.3, ops, 10, 0.05, True)
    assert syncs.total >= 2 * 2, syncs.counts


# ============ 3. --deterministic ============


@pytest.fixture
def _restore_determinism():
    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    env = {k: os.environ.pop(k, None) for k in ("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_ENV)}
    yield
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2], flags[3]
    for k, v in env.items():  # set_deterministic wrote them: nothing leaks into later tests
        os.environ.pop(k, None)
        if v is not None:
            os.environ[k] = v


def _deterministic_flags() -> tuple[Any, ...]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


@pytest.mark.usefixtures("_restore_determinism")
def test_deterministic_flag_sets_torch_cudnn_and_cublas(tmp_path: Path, capsys) -> None:
    assert _deterministic_flags()[0] is False
    # a run refused before any work still went through main(): the flags are set first
    assert (
        main(["train", "--deterministic", "--loss", "simclr", "--lr", "-1", "--out", str(tmp_path / "r")])
        == 2
    )
    assert "--lr -1.0" in capsys.readouterr().err
    assert _deterministic_flags() == (True, True, True, False, CUBLAS_WORKSPACE)
    assert os.environ[DETERMINISTIC_ENV] == "1"  # what zoo workers and jobs read


@pytest.mark.usefixtures("_restore_determinism")
def test_a_worker_takes_determinism_from_its_parents_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    deterministic_from_env()
    assert _deterministic_flags()[0] is False  # not asked for: nothing changes
    monkeypatch.setenv(DETERMINISTIC_ENV, "1")
    deterministic_from_env()
    assert _deterministic_flags() == (True, True, True, False, CUBLAS_WORKSPACE)


# ============ 4. sanity forwards: TF32 off, tolerance by dtype ============


class _HalfLogits(nn.Module):
    """A float16 model whose logits for a smaller batch come out ``ulps`` float16 roundings apart,
    as a kernel chosen by batch size may do (the proxy for reduced-precision GPU kernels)."""

    def __init__(self, ulps: float, net: nn.Module | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = small_cnn().eval() if net is None else net
        self.full, self.ulps, self.precision = 0, ulps, set()

    def forward(self, x: Tensor) -> Tensor:
        self.precision.add(
            (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
        )
        out = self.net(x)
        self.full = max(self.full, len(x))
        if len(x) < self.full:
            out = out * (1 + self.ulps * torch.finfo(torch.float16).eps)
        return out.half()


def test_sanity_forwards_run_without_tf32_and_allow_the_logits_dtype_rounding() -> None:
    _, _, x, _ = digits_data()
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    sound = _HalfLogits(ulps=3)
    assert check_batch_independence(sound, x) and check_deterministic(sound, x)
    assert sound.precision == {("ieee", "ieee")}  # TF32 off inside the forwards ...
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    assert not check_batch_independence(_HalfLogits(ulps=3), x, tol=1e-4)  # the fixed 1e-4 would fire
    assert logit_tolerance(torch.float32) == 1e-4 and logit_tolerance(torch.float16) > 3 * 9.8e-4
    # batch statistics (a trained net's BatchNorm left in train mode): still caught in float16
    broken = _HalfLogits(ulps=0, net=copy.deepcopy(digits_model(bn=True))).train()
    assert not check_batch_independence(broken, x)


# ============ 5. kNN on the features' device ============


def test_knn_runs_on_the_querys_device() -> None:
    g = torch.Generator().manual_seed(0)
    bank, query = torch.randn(50, 8, generator=g), torch.randn(10, 8, generator=g)
    bank_y = torch.randint(0, 3, (50,), generator=g)
    cpu = knn_predict(bank, bank_y, query, num_classes=3, k=5)
    assert cpu.device.type == "cpu" and cpu.shape == (10,)
    # the meta device stands in for a GPU: every tensor the vote builds must follow the query there
    meta = knn_predict(bank, bank_y, query.to("meta"), num_classes=3, k=5)
    assert meta.device.type == "meta" and meta.shape == (10,)


# ============ 7. memory and process safety ============


class _OutOfMemoryAbove(nn.Module):
    """The digits model, raising torch's out-of-memory error for a gradient pass over > ``limit`` rows."""

    def __init__(self, model: nn.Module, limit: int) -> None:
        super().__init__()
        self.model, self.limit, self.failures = model, limit, 0

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and len(x) > self.limit:
            self.failures += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self.model(x)


VOLATILE = ("wall_s", "setup_wall_s", "batch_size", "attack_batch_size")


def test_an_attack_out_of_memory_halves_its_batch_with_the_same_results() -> None:
    _, _, x, y = digits_data()
    x, y = x[:60], y[:60]
    suite = {
        "attack": [{"name": "fgsm", "eps": [0.1]}, {"name": "pgd", "eps": [0.1], "steps": 3, "restarts": 2}]
    }
    tight = _OutOfMemoryAbove(digits_model(), limit=16)
    rows = benchmark(tight, x, y, suite, batch_size=64, progress=False, sanity_n=16)
    ref = benchmark(digits_model(), x, y, suite, batch_size=16, progress=False, sanity_n=16)
    assert tight.failures >= 2  # each attack failed at 64 and 32, then ran at 16
    attacked = [r for r in rows if r["attack"] != "worst_case"]
    assert attacked and all(r["attack_batch_size"] == 16 and r["batch_size"] == 64 for r in attacked)
    assert "attack_batch_size" not in ref[0]  # a run that fits keeps its rows as they were
    strip = [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]
    assert strip == [{k: v for k, v in r.items() if k not in VOLATILE} for r in ref]


def test_halving_restores_the_generators_before_each_retry() -> None:
    gen = torch.Generator().manual_seed(3)

    def draw(batch: int) -> Tensor:
        out = torch.rand(batch, generator=gen)
        if batch > 4:
            raise torch.OutOfMemoryError("simulated")
        return out

    out, batch = halving_on_oom(draw, 16, [gen])
    assert batch == 4 and torch.equal(out, torch.rand(4, generator=torch.Generator().manual_seed(3)))
    with pytest.raises(torch.OutOfMemoryError):
        halving_on_oom(lambda b: draw(64), 2, [gen])


def test_the_zoo_pool_spawns_its_workers_for_cuda() -> None:
    assert start_method("cuda") == start_method("cuda:1") == "spawn"
    assert start_method("cpu") == "fork"  # Linux: fork reuses the parent's imports
    pool = make_pool(2, "cuda")
    try:
        assert pool._mp_context.get_start_method() == "spawn"  # type: ignore[union-attr]
    finally:
        pool.shutdown()  # type: ignore[union-attr]


def test_attack_wall_time_waits_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    runner._clock(torch.device("cpu"))
    assert synced == []
    runner._clock(torch.device("cuda", 0))
    assert synced == [torch.device("cuda", 0)]


# ============ 6. the benchmark times train() ============


def test_gpu_epoch_bench_times_train_end_to_end_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    sys.modules.pop("gpu_epoch", None)
    import gpu_epoch

    monkeypatch.setattr(gpu_epoch, "CONFIGS", [("simclr", "fp32"), ("simclr", "bf16"), ("adv", "fp32")])
    fig = gpu_epoch.run(argparse.Namespace(quick=True))
    assert fig["met"] is None and fig["device"].startswith("cpu")  # never read as a GPU figure
    assert [(r["loss"], r["precision"]) for r in fig["rows"]] == gpu_epoch.CONFIGS
    for r in fig["rows"]:
        assert len(r["epoch_s"]) == 2 and r["knn_monitor_calls_per_100_epochs"] == 21
        assert r["train_s_per_100_epochs"] > 100 * r["epoch_s"][-1] > 0
        assert r["train_step_only_s_per_100_epochs"] > 0
    assert fig["value"] == fig["rows"][1]["train_s_per_100_epochs"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.set_sync_debug_mode)")
def test_cuda_training_and_pgd_steps_make_no_host_sync() -> None:
    x = torch.randint(0, 256, (32, 1, 8, 8), dtype=torch.uint8, device="cuda")
    y = torch.arange(32, device="cuda") % 5
    for preset in ("simclr", "intnacl", "dacl_plus"):
        cfg = TrainConfig(loss=preset, encoder_kwargs={"width": 4}, batch_size=32)
        params = losses.resolve(preset, {})
        model = build_model(cfg, params, channels=1, size=(8, 8), num_classes=5).cuda()
        step = TrainStep(cfg, params, model, torch.optim.Adam(model.parameters()))
        g = torch.Generator(device="cuda").manual_seed(0)
        step(x, y, g)  # first step: optimizer state and caches are created
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step(x, y, g)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    model = copy.deepcopy(digits_model()).cuda()  # the cached CPU model stays where it is
    _, _, xs, ys = digits_data()
    xs, ys = xs[:64].cuda(), ys[:64].cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pgd_m._pgd_steps_masked(model, xs, ys, torch.zeros_like(xs), 0.1, norm_ops("Linf"), 5, 0.02, True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
