"""The device: what it is (the report's environment), waiting for it, emptying it, timing steps on it."""

from __future__ import annotations

import gc
import platform
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

from trainers import numerics


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_steps(
    step: Callable[[], torch.Tensor], n: int, device: torch.device
) -> tuple[list[float], torch.Tensor]:
    """n steps, each synchronised and timed: (seconds per step, losses [n, K])."""
    times, losses = [], []
    for _ in range(n):
        sync(device)
        t = time.perf_counter()
        losses.append(step())
        sync(device)
        times.append(time.perf_counter() - t)
    return times, torch.stack(losses).detach()


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": numerics.cpu_model(),
        "numerics": numerics.current(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            card=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            sms=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            tf32_cudnn=torch.backends.cudnn.allow_tf32,
        )
        env["driver"] = nvidia_smi("driver_version")
        env["nvidia_smi"] = nvidia_smi("name,clocks.sm,clocks.max.sm,power.limit")
    return env


def nvidia_smi(fields: str) -> str:
    """One read-only query of the card (its settings are left alone), or why it could not be read."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({type(exc).__name__})"
    return proc.stdout.strip() if proc.returncode == 0 else f"unknown ({proc.stderr.strip()[:100]})"
