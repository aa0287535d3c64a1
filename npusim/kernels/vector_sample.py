"""What the single-device vector samples (cann_gelu, rms_norm_quant) share as families:
one rank, no window, a plain task launch (kernel.task_launch_ns, no SHMEM set-up); the
host-memory families (hixl, kv_offload, shmem_host) take the window part too."""

from __future__ import annotations

from typing import Any

from npusim.kernels.family import Family, Misfit
from npusim.kernels.kernel import Kernel


class NoWindow:
    """These kernels touch no symmetric window: no zone, so any access is an error."""

    def regions(self) -> dict[str, tuple[int, int]]:
        return {}


class Unwindowed(Family):
    """A family whose kernels touch no symmetric window: its window hook's one answer."""

    def window(self, tiling: Any) -> NoWindow:
        return NoWindow()


class TaskKernel(Kernel):
    """A kernel launched as a plain task."""

    def launch_ns(self, hardware: Any) -> float | None:
        return hardware.kernel.task_launch_ns


def regbase_misfit(hardware: Any, program: str) -> Misfit | None:
    """A program written as VFs runs only on a RegBase vector unit: on another preset it
    is a configuration mismatch, refused when the scenario is validated."""
    model = hardware.vector.model
    if model == "regbase":
        return None
    return Misfit("hardware.vector.model", f"{hardware.name}'s vector unit is {model} "
                  f"(vector.model); {program} runs vector functions, which need regbase; "
                  "allowed: a preset with vector.model: regbase")
