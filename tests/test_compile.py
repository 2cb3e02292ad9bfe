"""``--compile off|auto|on`` (robustbench_nacl/accel.py): what it chooses per device, and that the
compiled path computes what the eager one does.

The compiled-vs-eager checks run ``torch.compile`` with the ``aot_eager`` backend: dynamo's capture
and AOTAutograd's forward/backward graphs, executed by eager kernels. Inductor's code generation is
not exercised here (its C++ build of one tiny model took 46-82 s on the 2-core machine); the GPU
check (bench/gpu_check.py) compares inductor's results with eager ones on CUDA. The CUDA-only
options (fused optimizers, CUDA graphs) are checked as the options chosen for a CUDA device, never
run.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from _models import digits_data, digits_model, one_thread, small_cnn
from _syncs import count_syncs
from torch import Tensor, nn

from robustbench_nacl import accel, losses
from robustbench_nacl.attack import memory, runner
from robustbench_nacl.attack import pgd as pgd_m
from robustbench_nacl.attack.norms import norm_ops
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval import probe as probe_m
from robustbench_nacl.eval.finetune_loop import Run, run_epochs
from robustbench_nacl.results.finetune import AlfConfig
from robustbench_nacl.training import TrainConfig, TrainStep, build_model, check_settings
from robustbench_nacl.training.manifest import RunOutcome, build_manifest, run_id

AOT = accel.CompilePlan(enabled=True, backend="aot_eager")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # no graph compiled by another test is reused (or counted) here
    yield
    torch._dynamo.reset()


# ============ the switch, per device ============


def test_auto_compiles_on_cuda_only_and_on_forces_it() -> None:
    for setting, device, site, want in [
        ("off", "cuda", "train", accel.CompilePlan()),
        ("auto", "cpu", "train", accel.CompilePlan()),
        ("auto", "cuda:1", "train", accel.CompilePlan(True, "inductor", None, fused_optimizer=True)),
        ("on", "cpu", "attack", accel.CompilePlan(True, "inductor", None, fused_optimizer=False)),
        # CUDA graphs only where every call has one shape, and only on CUDA
        ("auto", "cuda", "probe", accel.CompilePlan(True, "inductor", "reduce-overhead", True)),
        ("on", "cpu", "probe", accel.CompilePlan(True, "inductor", None, False)),
        ("auto", "cuda", "finetune", accel.CompilePlan(True, "inductor", None, True)),
    ]:
        assert accel.compile_plan(setting, device, site) == want, (setting, device, site)
    labels = {accel.compile_plan("auto", "cuda", s).label() for s in ("train", "probe")}
    assert labels == {"inductor", "inductor+cudagraphs"}
    assert accel.recorded("auto", "cpu") == {} and accel.recorded("off", "cuda") == {}
    assert accel.recorded("auto", "cuda") == {"compile": "inductor"}
    with pytest.raises(UserError, match=r"--compile setting 'fast'.*valid choices: off, auto, on"):
        accel.compile_plan("fast", "cpu", "train")
    with pytest.raises(UserError, match="compile site"):
        accel.compile_plan("on", "cpu", "views")


def test_the_switch_is_no_part_of_a_runs_identity() -> None:
    cfgs = [TrainConfig(compile=c) for c in accel.COMPILE_CHOICES]
    assert all(c.to_dict() == cfgs[0].to_dict() and "compile" not in c.to_dict() for c in cfgs)
    assert len({run_id(c) for c in cfgs}) == 1
    with pytest.raises(UserError, match="--compile setting 'yes'"):
        check_settings(TrainConfig(compile="yes"))
    cfg = TrainConfig()
    params = losses.resolve(cfg.loss, {})
    common = dict(in_channels=1, input_size=(8, 8), num_classes=10, weights_sha256="0" * 64, device="x")
    common.update(wall_s=1.0, knn_acc=None, knn_acc_init=None)
    eager = build_manifest(cfg, params, RunOutcome(**common))
    compiled = build_manifest(cfg, params, RunOutcome(**common, compile="inductor"))
    assert "compile" not in eager and compiled.pop("compile") == "inductor"  # beside the device
    assert compiled == eager


def test_fused_optimizers_on_cuda_plans_only_and_they_step_alike() -> None:
    cuda = accel.compile_plan("auto", "cuda", "train")
    for make in (
        lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    ):
        a, b = nn.Linear(4, 3), nn.Linear(4, 3)
        b.load_state_dict(a.state_dict())
        plain = make(a.parameters())
        assert accel.fused(plain, accel.compile_plan("auto", "cpu", "train")) is plain
        fused = accel.fused(make(b.parameters()), cuda)
        assert fused.defaults["fused"] is True and type(fused) is type(plain)
        assert fused.param_groups[0]["params"][0] is b.weight
        assert {k: v for k, v in fused.defaults.items() if k not in ("fused", "foreach")} == {
            k: v for k, v in plain.defaults.items() if k not in ("fused", "foreach")
        }
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
        for model, opt in ((a, plain), (b, fused)):  # torch's fused kernels also run on the CPU
            for _ in range(3):
                opt.zero_grad()
                model(x).square().sum().backward()
                opt.step()
        torch.testing.assert_close(b.weight, a.weight, rtol=1e-5, atol=1e-6)
    lars = torch.optim.Optimizer  # the project's LARS optimizers are not torch's: never fused
    assert not accel.fuses(lars)


# ============ compiled and eager agree ============


def _train_step(preset: str, plan: accel.CompilePlan | None) -> tuple[list[float], dict[str, Tensor]]:
    cfg = TrainConfig(loss=preset, encoder_kwargs={"width": 4}, batch_size=16, compile="off")
    params = losses.resolve(preset, {})
    torch.manual_seed(0)
    model = build_model(cfg, params, channels=1, size=(8, 8), num_classes=5)
    step = TrainStep(cfg, params, model, torch.optim.Adam(model.parameters(), lr=1e-2), compile=plan)
    x = torch.randint(0, 256, (16, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(16) % 5
    g = torch.Generator().manual_seed(1)
    values = [float(step(x, y, g)[0]) for _ in range(2)]
    return values, {k: v.detach().clone() for k, v in model.state_dict().items()}


# acl: a contrastive loss, dual BatchNorm and the inner PGD through the compiled model, in one step
@pytest.mark.parametrize("preset", ["acl"])
def test_a_compiled_training_step_gives_the_eager_losses_and_weights(preset: str) -> None:
    eager_losses, eager_state = _train_step(preset, None)  # compile="off": eager
    losses_, state = _train_step(preset, AOT)
    torch.testing.assert_close(losses_, eager_losses, rtol=1e-5, atol=1e-6)
    for k, v in eager_state.items():
        torch.testing.assert_close(state[k], v, rtol=1e-4, atol=1e-5, msg=k)


def test_a_compiled_training_step_changes_the_model_it_was_given_in_no_way() -> None:
    cfg = TrainConfig(encoder_kwargs={"width": 4}, batch_size=16)
    params = losses.resolve(cfg.loss, {})
    model = build_model(cfg, params, channels=1, size=(8, 8), num_classes=5)
    keys = list(model.state_dict())
    step = TrainStep(cfg, params, model, torch.optim.Adam(model.parameters()), compile=AOT)
    assert step.model is model and step.net is not model and list(model.state_dict()) == keys
    assert TrainStep(cfg, params, model, torch.optim.Adam(model.parameters())).net is model  # auto on CPU


def test_compiled_pgd_fools_the_same_examples_at_a_fixed_seed(monkeypatch) -> None:
    """The accelerator's form (whole-batch masked steps: one shape, what compiles well), on the CPU."""
    model = digits_model()
    _, _, x, y = digits_data()
    x, y = x[:64], y[:64]
    monkeypatch.setattr(pgd_m, "sync_free", lambda device: True)

    def attack(m: nn.Module) -> Tensor:
        return pgd_m.pgd(m, x, y, eps=0.1, gen=torch.Generator().manual_seed(0), steps=5, step_size=0.03)

    eager = attack(model)
    compiled_model = accel.compile_module(model, AOT)
    adv = attack(compiled_model)
    with torch.no_grad():
        fooled_eager, fooled = model(eager).argmax(1) != y, model(adv).argmax(1) != y
    assert fooled_eager.any() and not fooled_eager.all()  # a check that can fail either way
    assert torch.equal(fooled, fooled_eager)  # example by example
    torch.testing.assert_close(adv, eager, rtol=0, atol=1e-6)
    with count_syncs() as syncs:  # the sync-free steps stay sync-free through the compiled model
        delta = torch.zeros_like(x)
        pgd_m._pgd_steps_masked(compiled_model, x, y, delta, 0.1, norm_ops("Linf"), 5, 0.03, True)
    assert syncs.total == 0, syncs.counts


def test_the_compiled_probe_fits_the_eager_head_without_a_sync_per_epoch() -> None:
    g = torch.Generator().manual_seed(0)
    f_train, f_test = torch.randn(40, 6, generator=g), torch.randn(20, 6, generator=g)
    y_train, y_test = torch.arange(40) % 3, torch.arange(20) % 3
    cfg = probe_m.ProbeConfig(epochs=6, batch_size=16, lr=0.05, weight_decay=1e-3)
    fit = probe_m.fit_head_on_features
    eager_head, eager_best, eager_epoch = fit(f_train, y_train, f_test, y_test, 3, cfg)
    with accel.compiling("on", backend="aot_eager"), count_syncs() as syncs:
        head, best, epoch = fit(f_train, y_train, f_test, y_test, 3, cfg)
    torch.testing.assert_close(head.weight, eager_head.weight, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(head.bias, eager_head.bias, rtol=1e-4, atol=1e-6)
    assert (best, epoch) == (eager_best, eager_epoch)
    # the accuracies read once, not once per epoch
    assert syncs.counts["tolist"] == 1 and "__float__" not in syncs.counts, syncs.counts


def test_compiled_finetuning_epochs_train_the_eager_weights_and_leave_eager_modules() -> None:
    x = torch.randint(0, 256, (24, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(24) % 10
    cfg = AlfConfig(epochs=2, batch_size=16, lr=0.05)

    def finetune() -> nn.Module:
        torch.manual_seed(0)
        model = small_cnn(bn=True)

        def step(xb: Tensor, yb: Tensor, gen: torch.Generator) -> None:
            model.train()
            nn.functional.cross_entropy(model(xb), yb).backward()

        run_epochs(Run(cfg, {"model": model}, list(model.parameters()), x, y, 0, None, False), step)
        return model

    eager = finetune()
    with accel.compiling("on", backend="aot_eager"):
        compiled = finetune()
    assert compiled._compiled_call_impl is None  # eager again once the epochs are over
    for (k, v), w in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(w, v, rtol=1e-4, atol=1e-5, msg=k)
    plan = accel.CompilePlan(enabled=True, backend="aot_eager")
    with accel.compiled_in_place([eager], plan):
        copied = copy.deepcopy(eager)  # a copy made meanwhile is eager and runs its own weights
        assert eager._compiled_call_impl is not None and copied._compiled_call_impl is None


# ============ evaluation sized for the device ============


def test_attack_batch_from_free_memory() -> None:
    gib = 1 << 30
    assert memory.batch_for_memory(100 * gib, 1 << 20, 10_000) == 10_000  # everything fits: one batch
    assert memory.batch_for_memory(gib, 1 << 20, 10_000) == 512  # 0.5 GiB / 1 MiB, a power of two
    assert memory.batch_for_memory(gib, 3 << 20, 10_000) == 128  # 170 -> 128
    assert memory.batch_for_memory(1, 1 << 20, 10) == 1


def test_attack_batch_on_the_cpu_is_the_default_and_asks_cuda_nothing(monkeypatch) -> None:
    def no_cuda(*a: Any, **k: Any) -> Any:
        raise AssertionError("a CPU evaluation asked CUDA for its memory")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_cuda)
    x, y = torch.rand(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)
    assert memory.attack_batch(small_cnn(), x, y, 256) == 256


def test_the_threat_check_of_an_accelerators_attack_loop_is_read_once(monkeypatch) -> None:
    """robust_under_attack on an accelerator: no host sync per batch for the threat-model check (one
    read-out per eps after the loop), and none per PGD step (PGD's per-call subset selection stays)."""
    model = digits_model()
    _, _, x, y = digits_data()
    x, y = x[:90], y[:90]
    eps = [0.05, 0.1]

    def count(sync_free: bool, name: str = "pgd", steps: int = 2) -> tuple[int, Tensor]:
        monkeypatch.setattr(pgd_m, "sync_free", lambda device: sync_free)
        gens = [torch.Generator().manual_seed(k) for k in range(len(eps))]
        params = {"steps": steps, "step_size": 0.03} if name == "pgd" else {}
        with count_syncs() as counter:
            correct, _ = runner.robust_under_attack(
                name, model, x, y, eps, norm="Linf", gens=gens, batch_size=30, params=params
            )
        return counter.total, correct

    # an attack that reads nothing back itself: what is left is the loop's own reads
    resolve, info = runner.resolve_attack, runner.attack_info
    monkeypatch.setattr(runner, "resolve_attack", lambda name: _half_eps if name == "half" else resolve(name))
    half_info = {"norms": ("Linf",)}
    monkeypatch.setattr(runner, "attack_info", lambda name: half_info if name == "half" else info(name))
    assert count(False, "half")[0] == 4 * 3 * 2  # the CPU's check: 4 reads per (batch, eps), 3 x 2
    assert count(True, "half")[0] == len(eps)  # deferred: one read-out per eps, whatever the batches
    deferred, correct = count(True)
    assert torch.equal(correct, count(False)[1])  # the same outcomes as the CPU's form
    assert count(True, steps=8)[0] == deferred  # nothing per PGD step


def _half_eps(model: nn.Module, x: Tensor, y: Tensor, *, eps: float, gen: Any, norm: str) -> Tensor:
    return (x + eps / 2).clamp(0, 1)


def test_the_deferred_threat_check_fails_as_the_per_batch_one_does() -> None:
    from robustbench_nacl.attack.threat import check_stats, perturbation_stats
    from robustbench_nacl.errors import SanityError

    x = torch.full((2, 1, 2, 2), 0.5)
    ok = perturbation_stats(x, x + 0.01, "Linf")
    far = perturbation_stats(x, x + 0.2, "Linf")
    check_stats(torch.stack([ok, ok]), 0.1, "Linf")
    with pytest.raises(SanityError, match=r"left the Linf ball: perturbation 0\.2 > eps 0\.1"):
        check_stats(torch.stack([ok, far]), 0.1, "Linf")
    with pytest.raises(SanityError, match="non-finite"):
        check_stats(perturbation_stats(x, x * float("nan"), "Linf"), 0.1, "Linf")


# ============ the prepared GPU check ============


def test_the_gpu_check_refuses_a_cpu_machine_in_one_line_and_its_smoke_run_runs(monkeypatch, capsys) -> None:
    import json
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    monkeypatch.syspath_prepend(str(bench))
    sys.modules.pop("gpu_check", None)
    import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(accel, "DEFAULT_BACKEND", accel.DEFAULT_BACKEND)  # --cpu-smoke sets it: undone
    assert gpu_check.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no CUDA device" in err
    assert gpu_check.main(["--cpu-smoke", "--only", "views"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    fig = json.loads(lines[0])
    assert fig["figure"] == "views_ms" and fig["value"] > 0 and fig["met"] is None  # never a GPU figure
