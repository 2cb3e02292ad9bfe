"""Seeding, device resolution and version/provenance helpers (kept tiny on purpose)."""

from __future__ import annotations

import contextlib
import os
import platform
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from .errors import UserError


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(device: str | None) -> torch.device:
    """``None``/"auto" -> cuda if available else cpu; "cuda" without a GPU is a user error."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise UserError(f"invalid --device {device!r}; use cpu, cuda or cuda:N") from e


def device_name(device: torch.device | str) -> str:
    """A human-readable device description for provenance."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cap = torch.backends.cpu.get_cpu_capability()
    n = torch.get_num_threads()
    return f"cpu ({platform.machine()}, {cap}, {n} torch thread{'' if n == 1 else 's'})"


def device_class(device: torch.device | str) -> str | None:
    """The class of device a result row was computed on, as its identity records it: None on a CPU
    (every row before issue 46; their ids unchanged), ``"cuda:<card name>"`` on a GPU, else the
    device type. Two classes differ in float arithmetic (fused kernels, reduction order), so a row
    of one does not stand for the other's (docs/decisions.md, 'Device classes')."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def versions() -> dict[str, Any]:
    """Package versions recorded in manifests and result rows."""
    from ._version import __version__

    return {
        "robustbench_nacl": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Temporarily run torch CPU ops on ``n`` threads.

    Loops of tiny ops (the linear probe's Adam steps) run several times faster on one thread than
    on two contended ones: measured 0.6 ms vs 4.8 ms per step on a loaded 2-core machine.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def refuse_unsafe_torch_env() -> None:
    """Refuse to run when an env override would silently re-enable full unpickling in torch.load."""
    if os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "").strip() not in ("", "0"):
        raise UserError("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set, which lets checkpoints run code; unset it")


#: cuBLAS's documented setting for reproducible matmuls (its workspaces split work the same way on
#: every run); read when cuBLAS initialises, so it must be set before the first CUDA matmul
CUBLAS_WORKSPACE = ":4096:8"
#: how a process started by this one (a zoo worker, a job) learns that ``--deterministic`` was given
DETERMINISTIC_ENV = "ROBUSTBENCH_NACL_DETERMINISTIC"


def set_deterministic() -> None:
    """``--deterministic``: the CUDA settings that make repeated runs reproducible where torch can.

    ``torch.use_deterministic_algorithms(True, warn_only=True)``, ``cudnn.deterministic = True``,
    ``cudnn.benchmark = False`` and ``CUBLAS_WORKSPACE_CONFIG`` (unless already set). ``warn_only``:
    some ops every encoder here uses have no deterministic CUDA kernel (adaptive average pooling's
    backward, NLL loss); they warn instead of failing, and stay nondeterministic (docs/decisions.md,
    'Determinism on CUDA'). Inherited by the processes this one starts, through the environment.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    os.environ[DETERMINISTIC_ENV] = "1"
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def deterministic_from_env() -> None:
    """In a worker process: :func:`set_deterministic` when the parent ran with ``--deterministic``."""
    if os.environ.get(DETERMINISTIC_ENV) == "1":
        set_deterministic()


@contextlib.contextmanager
def ieee_fp32() -> Iterator[None]:
    """Run the body with TF32 off for float32 matmuls and cuDNN convolutions (restored after).

    TF32 (on by default for cuDNN convolutions on Ampere and later GPUs) rounds inputs to a 10-bit
    mantissa, about 1e-3 relative: enough to move logits past a 1e-4 comparison. Uses torch's
    ``fp32_precision`` settings (torch >= 2.9); a no-op for CPU computations.
    """
    settings = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    old = [s.fp32_precision for s in settings]
    try:
        for s in settings:
            s.fp32_precision = "ieee"
        yield
    finally:
        for s, value in zip(settings, old, strict=True):
            s.fp32_precision = value
