"""What the single-device vector samples (cann_gelu, rms_norm_quant) share as families:
one rank, no window, a plain task launch (kernel.task_launch_ns, no SHMEM set-up)."""

from __future__ import annotations

from typing import Any

from npusim.kernels.family import Kernel


class NoWindow:
    """These kernels touch no symmetric window: no zone, so any access is an error."""

    def regions(self) -> dict[str, tuple[int, int]]:
        return {}


class TaskKernel(Kernel):
    """A kernel launched as a plain task."""

    def launch_ns(self, hardware: Any) -> float | None:
        return hardware.kernel.task_launch_ns
