"""What a kernel family declares, and the template methods the driver calls on it.

A family (one package under npusim/kernels/<family>/, or a user's .py file) is one
`Family` subclass instance. It states, as data:

- `ops`: its kernels (`Kernel`, npusim/kernels/kernel.py), each with the GM tensors it
  reads and writes (`TensorSpec`: name, dtype and shape as functions of the tiling and
  the rank), its phases in program order (`Phase`), the core kind it runs on and its
  per-core program;
- `runs`: the values of `workload.op` and the kernels each runs, in order (a fused op
  such as mega_moe is one kernel; dispatch_combine is two);
- `options`: its workload options (`Option`: type, range or choices, default, help),
  from which the scenario loader validates `workload.<name>` and docs/scenario.md
  tables are generated;

and implements a few template methods (Vidur's abstract hooks, SimPy's `_do_put`):
`tiling` from (shape, options, hardware) (shape: the MoE shape, None for a family that
reads none), `window` (the window layout object, with
`regions()`), `misfit` and `tiling_misfit` (the fit checks before and after the tiling is
built: one line on a workload or hardware key),
`make_inputs` (seeded inputs), `op_inputs` (what a kernel reads of the run's inputs and
the previous kernel's outputs) and, optionally, case-directory reading/writing, a
reference of a kernel's outputs and a digest of what the next kernel reads of them (the
driver then simulates the next kernel in a second process; see npusim/sim.py). The
optional ones are declared (`references`, `chains`, `case_format`, a kernel's
`profiles`), not detected: the registry checks each declaration against the class.

Families know nothing of YAML: option values arrive validated, problems go back as a
`Misfit` (dotted key + message) that the scenario loader turns into an InputError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from npusim.kernels.kernel import Arrays, Kernel
from npusim.runtime import userguard
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape


@dataclass(frozen=True)
class Option:
    """One workload option of a family: `workload.<name>` in a scenario.

    kind is "choice" (one of `choices`), "bool", "int" or "float" (within [lo, hi]; (lo, hi]
    with lo_open), "ints" (a YAML list of integers each within [lo, hi]; a tuple once
    validated) or "str" (a non-empty string). The scenario's generic workload keys are
    declared the same way (npusim.scenario.workload.GENERIC): `required` ones have no
    default, and `allowed` words what docs/scenario.md lists when the bounds are not
    fixed (the family's shape limits). `exact` marks a number that names a configuration
    (npusim/fidelity/fit.py matches it like a word)."""

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    required: bool = False
    allowed: str = ""
    # a number that names a configuration, not a size (hixl's servers, a sample's step):
    # a measured row at one value vouches for no other, so a fidelity ledger matches it
    # exactly instead of taking the rows' range
    exact: bool = False


@dataclass(frozen=True)
class Misfit:
    """Why a workload does not fit a family's layout or cores: `key` is a dotted scenario
    key ("workload.bs") or a hardware key ("hardware.chip.aiv_cores", reported on the
    override when the scenario overrides it, else on `hardware`)."""

    key: str
    message: str


@dataclass(frozen=True)
class Variant:
    """One way a family runs its work (`npusim advise` ranks them): its name, the workload
    options that select it, and the preset keys that set it apart from the family's other
    variants (what a comparison of them rests on: advise lists their provenance)."""

    name: str  # "" for a family's only way
    options: Mapping[str, Any] = field(default_factory=dict)
    rests_on: tuple[str, ...] = ()  # dotted preset keys, e.g. "host.page_walk_ns"


@dataclass(frozen=True)
class Touched:
    """The host memory a run's data will touch, by term in bytes (npusim/footprint.py adds
    the interpreter's base and the cores): `pairs` the MoE window slots and rows of every
    token-expert pair and the routes of every rank pair, `ranks` every rank's token rows,
    `tensors` GM tensors by their declared shapes. `sized_by` names the workload keys
    that size them (a refusal names them); `binding` False: the estimate does not gate
    the run (a timing-only MoE run maps far more than it writes, docs/memory.md)."""

    pairs: int = 0
    ranks: int = 0
    tensors: int = 0
    sized_by: str = ""
    binding: bool = True

    @property
    def total(self) -> int:
        return self.pairs + self.ranks + self.tensors


class Family:
    """A kernel family: subclass, fill in the declarations, implement the hooks."""

    name: ClassVar[str]
    help: ClassVar[str] = ""
    ops: ClassVar[tuple[Kernel, ...]] = ()
    runs: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    options: ClassVar[tuple[Option, ...]] = ()
    case_format: ClassVar[str] = ""  # a case-directory format it reads ("" if none)
    # True: the family's kernels read the MoE shape (bs, h, k, ep_world_size,
    # experts_per_rank): an ExchangeFamily (npusim/kernels/exchange.py). False: its
    # scenarios leave those keys out, its own options are its shape and every hook below
    # receives shape None
    uses_moe_shape: ClassVar[bool] = False
    # What `npusim advise` may run: the variants the family offers (a MoE exchange family:
    # as a MoE layer's dispatch / combine; any other: for its own scenarios' shapes)
    variants: ClassVar[tuple[Variant, ...]] = ()
    # What the family gives beyond the required hooks, declared so the driver reads data
    # (the registry refuses a declaration the class does not implement, and the reverse):
    # references: reference_outputs, a numpy reference of a kernel's outputs;
    # chains: next_reads, a digest of what the next kernel reads of them. With both, the
    # driver may simulate the next kernel ahead on the reference (npusim/sim.py).
    # A non-empty case_format promises case_misfit, read_case and write_case.
    references: ClassVar[bool] = False
    chains: ClassVar[bool] = False
    # sized_by_routing: size_by_routing, the tiling's sizes that its host takes from the
    # routing (a count the kernels exchange and the host allocates by)
    sized_by_routing: ClassVar[bool] = False
    # A family whose modes launch kernels of their own: each mode's family by name (the
    # registry checks each; `mode` picks one from the options, the workload runs it)
    modes: ClassVar[Mapping[str, Family]] = {}

    # ---- lookups
    def kernel(self, name: str) -> Kernel:
        for k in self.ops:
            if k.name == name:
                return k
        raise KeyError(name)

    def runs_of(self, options: Mapping[str, Any] | None = None
                ) -> Mapping[str, tuple[str, ...]]:
        """The runs under these options: `runs`, or those of the mode they pick (a mode
        with kernels of its own)."""
        if options is not None and self.modes:
            return self.mode(options).runs
        return self.runs

    def mode(self, options: Mapping[str, Any]) -> Family:
        """The family that runs under these options (a scenario's workload holds it):
        itself, or, for a family of `modes`, the mode they pick (options may be a
        workload as written, defaults left out)."""
        return self

    def kernels_of(self, op: str, options: Mapping[str, Any] | None = None
                   ) -> tuple[Kernel, ...]:
        """The kernels `workload.op: <op>` runs under `options`, in order (runs_of, a hook
        a user's family may override, under the guard and its answer checked)."""
        known = {k.name for k in self.ops}

        def check(runs: Any) -> str | None:
            names = runs.get(op) if isinstance(runs, Mapping) else None
            ok = (isinstance(names, (tuple, list)) and names
                  and all(isinstance(n, str) and n in known for n in names))
            return None if ok else (f"a dict whose {op!r} names kernels of "
                                    f"{', '.join(sorted(known))}")

        return tuple(self.kernel(n) for n in userguard.call(self, "runs_of", options,
                                                            check=check)[op])

    def option_defaults(self) -> dict[str, Any]:
        return {o.name: o.default for o in self.options}

    # ---- template methods
    def tiling(self, shape: MoeShape | None, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Any:
        """The host-side tiling of a call from the shape, the options and the preset."""
        raise NotImplementedError

    def size_by_routing(self, tiling: Any, shape: MoeShape | None, options: Mapping[str, Any],
                        routing: Routing) -> Any:
        """The tiling with the sizes its host takes from the routing rather than from the
        shape's worst case (DeepEP's SHMEM path allocates its symmetric tensors for the most
        rows a rank receives, a count notify returns). The scenario calls it once, on its
        own routing, before any fit check reads the tiling."""
        raise NotImplementedError

    def window(self, tiling: Any) -> Any:
        """The window layout object: at least `regions()` -> {name: (start, end)}, the
        zones the window sanitiser holds every access to."""
        raise NotImplementedError

    def window_bytes(self, tiling: Any, hardware: Any) -> int:
        """The window each rank maps for the call: the preset's `window.bytes`, unless the
        family's host maps a size of its own (DeepEP's SHMEM path: an 8 GiB heap per PE)."""
        return int(hardware.window.bytes)

    def misfit(self, shape: MoeShape | None, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        """The fit checks that need no tiling (None: it fits): they run first, so `tiling`
        may take for granted what they refuse."""
        return None

    def tiling_misfit(self, tiling: Any, shape: MoeShape | None, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        """The fit checks that read the tiling (its window, UB and core needs), once
        `misfit` passed. The scenario loader builds the tiling once, asks this and carries
        that tiling into the run (Scenario.tiling); None: it fits."""
        return None

    def make_inputs(self, shape: MoeShape | None, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        """Seeded per-rank inputs of the run (`routing`: the scenario's routing)."""
        raise NotImplementedError

    def op_inputs(self, kernel: str, tiling: Any, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        """Per rank, the arrays `kernel`'s input tensors are made from: the run's inputs
        and, for a kernel after the first, the previous kernel's outputs."""
        return inputs

    def reference_outputs(self, kernel: str, tiling: Any, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        """What a correct `kernel` writes (numpy), or None when the family gives none."""
        return None

    def ahead(self, kernels: Sequence[str]) -> int:
        """Which of an op's kernels (its index, at least 1) the driver may simulate ahead on
        the reference outputs of the one before it (references, chains): the kernel that
        starts the longest tail, so the second process takes the most work; the second by
        default."""
        return 1

    def run_fields(self, tiling: Any, runs: Sequence[Any]) -> list[dict[str, Any]]:
        """Figures of a call that need the other calls of the run (a published time that
        spans two kernels), one dict per OpRun in run order, merged into its
        family_fields; none by default."""
        return [{} for _ in runs]

    def next_reads(self, kernel: str, tiling: Any, inputs: list[Arrays],
                   outputs: list[Arrays]) -> bytes:
        """A digest of everything the kernel after `kernel` reads of its outputs."""
        raise NotImplementedError

    def touched(self, tiling: Any, shape: MoeShape | None, options: Mapping[str, Any], op: str,
                timing_only: bool, workers: int) -> Touched:
        """What the run's data touches in host memory, estimated before anything is
        allocated (npusim/footprint.py checks it against --memory): its kernels' declared
        GM tensors on every rank, sized by its own options. Override where the declarations
        overstate what is written (rows shared between ranks, a cache of which a step
        touches a part); an ExchangeFamily counts per token-expert pair instead."""
        return declared_touched(self, tiling, options, op, timing_only)

    # ---- case directories (families with a case_format)
    def case_misfit(self, case_dir: Path, shape: MoeShape | None, options: Mapping[str, Any],
                    op: str, timing_only: bool) -> str | None:
        """Cheap checks of a case directory before the run (one line, or None)."""
        return f"the {self.name} kernel family reads no case directories"

    def read_case(self, case_dir: Path, shape: MoeShape | None, op: str) -> list[Arrays]:
        raise NotImplementedError

    def write_case(self, case_dir: Path, kernel: str, outputs: Sequence[Arrays]) -> None:
        raise NotImplementedError


def declared_touched(fam: Family, tiling: Any, options: Mapping[str, Any], op: str,
                     timing_only: bool) -> Touched:
    """The op's kernels' GM tensors on every rank as declared: every kernel's outputs
    (read back as views and kept for the report), and while the largest kernel runs, its
    scratch and its inputs twice (the family's arrays and the machine's copy). A
    timing-only run writes no payload and is not held to it (measured: docs/memory.md)."""
    world = tiling.world
    outputs = running = 0
    for kernel in fam.kernels_of(op, options):
        outputs += sum(spec.held_bytes(tiling, r) for spec in kernel.outputs
                       for r in range(world))
        running = max(running, sum(spec.held_bytes(tiling, r) * factor
                                   for specs, factor in ((kernel.inputs, 2), (kernel.scratch, 1))
                                   for spec in specs for r in range(world)))
    keys = [f"workload.{o.name}" for o in fam.options if o.kind in ("int", "ints")]
    sized_by = " or ".join([", ".join(keys[:-1]), keys[-1]] if len(keys) > 1 else keys)
    return Touched(tensors=outputs + running, sized_by=sized_by or "workload options",
                   binding=not timing_only)
