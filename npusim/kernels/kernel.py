"""What one kernel of a family declares: its GM tensors, its phases, the core kind it
runs on and its per-core program, and what the driver hands back to it once a call is
over (`Call`, `CoreTiming`) for its report fields.

A kernel is one op a family runs (npusim/kernels/family.py gathers them into a family).
It knows nothing of YAML or of the workload: its program reads the tiling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

ROW_INDEX_BYTES = 8  # a RowTable's row number (int64)
Arrays = dict[str, np.ndarray]
"""Named arrays of one rank (a RowTable may stand for an [A, H] array of shared rows)."""


@dataclass(frozen=True)
class TensorSpec:
    """A GM tensor of one kernel on one rank: its name (the file name in case and
    --tensors directories), dtype and shape as functions of (tiling, rank)."""

    name: str
    dtype: Callable[[Any], Any]
    shape: Callable[[Any, int], tuple[int, ...]]
    help: str = ""
    # the name the kernel's program reads it by, when the family exposes it under another
    # (a forked kernel shown with its API's names); "": `name`
    gm: str = ""
    # True: the family gives it as a RowTable, rows drawn from a small table; the memory
    # estimate counts its index (a row number per row), not its declared bytes
    shared_rows: bool = False
    # a shmem_malloc'd tensor: its byte offset in the symmetric heap (the window), the same
    # on every rank, as a function of the tiling (npusim.runtime.symmetric); None: plain GM
    heap: Callable[[Any], int] | None = None

    @property
    def gm_name(self) -> str:
        return self.gm or self.name

    def np_dtype(self, tiling: Any) -> np.dtype:
        return np.dtype(self.dtype(tiling))

    def nbytes(self, tiling: Any, rank: int) -> int:
        count = int(np.prod(self.shape(tiling, rank), dtype=np.int64))
        return count * self.np_dtype(tiling).itemsize

    def held_bytes(self, tiling: Any, rank: int) -> int:
        """The host bytes it takes: its bytes, or its rows' index when they are shared."""
        if self.shared_rows:
            return ROW_INDEX_BYTES * int(self.shape(tiling, rank)[0])
        return self.nbytes(tiling, rank)


@dataclass(frozen=True)
class Phase:
    """A kernel phase: its span name in the report and which cores run it (in words)."""

    name: str
    cores: str


@dataclass(frozen=True)
class CoreTiming:
    """What `Kernel.fields` reads of one launched core once the launch is over:
    its kind, its place in a MIX block and what its program noted (the contexts
    themselves stay with the driver)."""

    kind: str  # its core kind's name: "aiv", "aic"
    sub_block: int  # its sub-block in a MIX block (AIV 0 or 1; 0 elsewhere)
    notes: Any = None  # what the kernel's program left in KernelContext.notes


@dataclass(frozen=True)
class Call:
    """One finished call of a kernel, as `Kernel.fields` reads it: the tiling, every rank's
    outputs, the OpRun (phase spans, busy times, transfers), every launched core's
    CoreTiming ([rank][core]), what each core moved (transfers[rank][core]: its
    TransferStat rows) and the profiling frames the cores recorded (frames[rank][core] =
    {frame: (start_ns, end_ns)} from the op's start; None when no core recorded one)."""

    tiling: Any
    outputs: Sequence[Arrays]
    run: Any
    cores: Sequence[Sequence[CoreTiming]]
    transfers: Sequence[Sequence[Sequence[Any]]]
    frames: Sequence[Sequence[Mapping[str, Any]]] | None


def const(value: Any) -> Callable[..., Any]:
    """A TensorSpec dtype or shape that does not depend on the tiling."""
    return lambda *_args: value


class Kernel:
    """One op of a family: its tensors, phases, core kind and per-core program."""

    name: ClassVar[str]
    phases: ClassVar[tuple[Phase, ...]] = ()
    inputs: ClassVar[tuple[TensorSpec, ...]] = ()
    outputs: ClassVar[tuple[TensorSpec, ...]] = ()
    scratch: ClassVar[tuple[TensorSpec, ...]] = ()  # GM work areas, neither in nor out
    core_kind: ClassVar[str] = "aiv"
    # kinds the machine also builds that run no program of the kernel: engines its cores
    # drive (the SDMA engines, npusim.hw.sdma)
    engines: ClassVar[tuple[str, ...]] = ()
    # the option whose values calibration tables compare (cann_sample: the wire format)
    variant: ClassVar[str | None] = None
    # the family_fields key of the bandwidth (GB/s) the kernel's published tables quote,
    # which a calibration row's measured_gbps is held to; None: they quote latencies
    bandwidth: ClassVar[str | None] = None
    # True: the kernel turns its cores' profiling frames into figures (Call.frames in
    # `fields`); `npusim run --harness-csv` writes the frames of such kernels only
    profiles: ClassVar[bool] = False

    def program(self, tiling: Any) -> Callable[..., Any]:
        """A generator function program(ctx) that every core of every rank runs once."""
        raise NotImplementedError

    def launch_ns(self, hardware: Any) -> float | None:
        """The time from the op's start to its cores' first instruction (None: the
        preset's kernel.launch_ns)."""
        return None

    def cores(self, tiling: Any) -> int | None:
        """Cores of `core_kind` per rank the kernel is launched on (None: all)."""
        return getattr(tiling, "cores", None)

    def phase_order(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.phases)

    def fields(self, call: Call) -> dict[str, Any]:
        """The kernel's own figures of one finished call for the report
        (`ops[].family_fields`): {name: JSON-able value} from whatever of `call` they need
        (the outputs, the timing, the cores' notes, transfers or profiling frames); {} by
        default. The report renders them without knowing the family."""
        return {}


