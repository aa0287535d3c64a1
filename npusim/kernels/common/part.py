"""A kernel run on one part of a composite tiling: a layer that chains kernels of other
sources keeps each source's own tiling as a field of its tiling (the CANN sample's, the
low-latency kernels'), and runs those kernels unchanged on that field."""

from __future__ import annotations

from typing import Any

from npusim.kernels.kernel import Kernel, TensorSpec


def part_spec(spec: TensorSpec, part: str) -> TensorSpec:
    """The spec with its dtype and shape read from `tiling.<part>`."""
    return TensorSpec(spec.name, lambda t: spec.dtype(getattr(t, part)),
                      lambda t, r: spec.shape(getattr(t, part), r), spec.help, gm=spec.gm)


class PartKernel(Kernel):
    """`inner` with its tensors, program and cores on `tiling.<part>`."""

    def __init__(self, inner: Kernel, part: str) -> None:
        self.inner = inner
        self.part = part
        self.name = inner.name
        self.phases = inner.phases
        self.inputs = tuple(part_spec(s, part) for s in inner.inputs)
        self.outputs = tuple(part_spec(s, part) for s in inner.outputs)
        self.scratch = tuple(part_spec(s, part) for s in inner.scratch)
        self.core_kind = inner.core_kind

    def program(self, tiling: Any) -> Any:
        return self.inner.program(getattr(tiling, self.part))

    def cores(self, tiling: Any) -> int | None:
        return self.inner.cores(getattr(tiling, self.part))

    def launch_ns(self, hardware: Any) -> float | None:
        return self.inner.launch_ns(hardware)
