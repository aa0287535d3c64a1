"""One run: scenario -> machine + inputs -> the family's kernels on every core -> RunResult.

This is the only place that knows both the scenario (YAML world) and the kernels. It asks
the scenario's kernel family (npusim.kernels.registry) for everything op-specific: the
tiling, the inputs, the kernels an op runs, their GM tensors, window zones and programs;
it names no family and no op. The report gets plain data.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from numbers import Integral
from typing import Any

import numpy as np

from npusim.engine.arenas import use_huge_arenas
from npusim.engine.trace import Sample, Trace
from npusim.errors import KernelError, excerpt
from npusim.fork import Forked
from npusim.formats import may_need_tables, tables
from npusim.hw.cores import CoreKind, config_value
from npusim.hw.cores import kind as core_kind
from npusim.hw.machine import Machine
from npusim.hw.memory import RowTable
from npusim.kernels.family import Family
from npusim.kernels.kernel import Arrays, Call, CoreTiming, Kernel, TensorSpec
from npusim.numpy_pages import small_pages
from npusim.result import OpRun, RunResult
from npusim.runtime import userguard
from npusim.runtime.launch import LaunchResult, launch
from npusim.runtime.symmetric import heap_tensor
from npusim.scenario import Scenario
from npusim.values import is_integer


def load_inputs(scenario: Scenario) -> list[Arrays]:
    """Per-rank inputs: read from the case directory, or generated from the seed."""
    w = scenario.workload
    plain = userguard.arrays()
    if scenario.data.case_dir is not None:
        return userguard.call(w.family, "read_case", scenario.data.case_dir, w.shape, w.op,
                              check=plain)
    return userguard.call(w.family, "make_inputs", w.shape, w.options, w.op, w.routing,
                          payload=not w.timing_only, check=plain)


def _tensors_of(kernel: Kernel, ranks: int) -> Callable[[object], str | None]:
    """The check of what op_inputs gives: per rank, every input tensor of the kernel as
    numbers (an array, or a RowTable of shared rows)."""
    names = [spec.name for spec in kernel.inputs]

    def numbers(a: object) -> bool:
        return isinstance(a, RowTable) or (isinstance(a, np.ndarray)
                                           and a.dtype.kind in "biufcV")

    def check(value: object) -> str | None:
        ok = isinstance(value, (list, tuple)) and len(value) == ranks and all(
            isinstance(arrays, Mapping) and all(numbers(arrays.get(n)) for n in names)
            for arrays in value)
        return None if ok else (f"a list of {ranks} dicts (one per rank) of the arrays "
                                f"{', '.join(names) or '(none)'}")
    return check


def default_workers() -> int:
    """Processes a single run may use: 2 (two kernels at once) where 2 CPUs are free to it."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(2, cpus)


def simulate(scenario: Scenario, detailed_trace: bool = False,
             progress: Callable[[str], None] | None = None, workers: int = 1,
             keep_inputs: bool = False) -> RunResult:
    """Run the kernels of the scenario's op, one after the other.

    Each kernel runs on an idle machine of its own from t = 0 and is then placed where
    the previous kernel's machine stopped: between dispatch and combine the hardware runs
    the experts, and a kernel reads nothing of the previous one but its output tensors.

    workers >= 2 (two kernels or more, where os.fork exists, and the family declares a
    reference of a kernel's outputs and a digest of what the next reads): the kernel the
    family names (`Family.ahead`: the second by default, DeepEP normal mode's combine) is
    simulated in a forked process on the reference outputs of the kernel before it, while
    the kernels before it run here. It is kept only if the simulated kernel before it wrote
    exactly what it reads of them (the family's digest); otherwise it is simulated again
    on what was written. So the result is the same as with workers = 1, byte for byte.
    `keep_inputs` keeps every kernel's input arrays in its OpRun (for `npusim run
    --tensors`).
    """
    with userguard.session(scenario.run.wall_time_limit_s), small_pages():
        return _simulate(scenario, detailed_trace, progress, workers, keep_inputs)


def built_kinds(kernel: Kernel, cfg: Any) -> tuple[CoreKind, ...]:
    """The kinds a kernel's machine builds: its cores' and the engines it names that the
    preset has. An engine the preset lacks is left out, so one kernel may drive the SDMA
    engine or the NIC as its options say: its family refuses the options that need what
    is missing, and a post to a missing engine is a kernel error."""
    engines = (core_kind(name) for name in kernel.engines)
    return (core_kind(kernel.core_kind),
            *(k for k in engines if config_value(cfg, k.count_key) is not None))


def _simulate(scenario: Scenario, detailed_trace: bool,
              progress: Callable[[str], None] | None, workers: int,
              keep_inputs: bool) -> RunResult:
    wall0 = time.perf_counter()
    _free_last_machine()  # an earlier run's, before a fork could inherit it
    use_huge_arenas()  # the objects the run builds in huge pages, where that is built
    fam = scenario.workload.family
    t = scenario.tiling  # built once, by the scenario
    inputs = load_inputs(scenario)
    limit_ns = scenario.run.sim_time_limit_us * 1000.0
    kernels = fam.kernels_of(scenario.workload.op, scenario.workload.options)
    window = userguard.call(fam, "window_bytes", t, scenario.hardware, check=userguard.whole(1))

    def leg(kernel: Kernel, previous: list[Arrays] | None) -> Leg:
        m = Machine(scenario.hardware, t.world, Trace(detailed=detailed_trace),
                    built_kinds(kernel, scenario.hardware), window)
        _LAST_MACHINE[0] = weakref.ref(m)
        op_in = userguard.call(fam, "op_inputs", kernel.name, t, inputs, previous,
                               check=_tensors_of(kernel, len(m.ranks)))
        return Leg.of(m, run_op(m, fam, kernel, t, op_in, limit_ns, keep_inputs,
                                scenario.run.wall_time_limit_s))

    ahead: Forked | None = None
    expected, how_ahead, at = b"", "", 0
    if workers >= 2 and len(kernels) >= 2 and Forked.available():
        if may_need_tables(scenario.workload.dtype, scenario.workload.options):
            tables()  # built once here rather than once in each process
        ahead, expected, how_ahead, at = _speculate(fam, kernels, t, inputs, leg)
    legs: list[Leg] = []
    previous: list[Arrays] | None = None
    try:
        for i, kernel in enumerate(kernels):
            if progress:
                progress(kernel.name if ahead is None or i >= at else
                         f"{kernel.name}; {kernels[at].name} simulated ahead in a second process")
            got = None
            if i == at and ahead is not None:
                # the digest of what this process wrote, while the fork may still be running
                before = kernels[at - 1].name
                wrote = userguard.call(fam, "next_reads", before, t, inputs, previous,
                                       check=userguard.digest)
                found, ahead = ahead.result(), None
                if found is None:
                    how_ahead = f"redone: the forked {kernel.name} did not finish"
                elif expected != wrote:
                    how_ahead = (f"redone: the simulated {before} wrote other outputs "
                                 f"than {fam.name}'s numpy reference {before}")
                else:
                    got, how_ahead = found, "kept"
            if got is None:
                _free_last_machine()
                got = leg(kernel, previous)
            legs.append(got)
            previous = got.run.outputs
    finally:
        if ahead is not None:
            ahead.cancel()
    runs, samples, clock = [], [], 0.0
    for one in legs:
        runs.append(shifted(one.run, clock))
        samples += [replace(s, t_ns=s.t_ns + clock) for s in one.samples] if clock else one.samples
        # the next kernel on the streams starts once this one has ended: its cores' clocks
        # may run ahead of the machine's last event (the pipes draining their last writes)
        clock += max(one.clock_ns, one.run.end_ns)
    extra = userguard.call(fam, "run_fields", t, runs, check=userguard.field_dicts(len(runs)))
    for run, fields in zip(runs, extra, strict=True):
        run.family_fields.update(fields)
    if scenario.data.case_dir is not None:
        for run in runs:
            userguard.call(fam, "write_case", scenario.data.case_dir, run.op, run.outputs)
    return RunResult(scenario.to_dict(), scenario.hardware.to_dict(), runs,
                     sum(one.events for one in legs), time.perf_counter() - wall0,
                     samples=samples, combine_ahead=how_ahead)


# A leg's machine is freed by reference counting when its op is over (run_op breaks its
# cycles). One that an op left in a cycle run_op does not break (an op that failed, a kind
# of object with a cycle of its own) is freed by a full collection, a pause of tens of ms,
# just before another leg runs in this process, so the peak holds one machine.
_LAST_MACHINE: list[weakref.ref[Machine] | None] = [None]


def _free_last_machine() -> None:
    last = _LAST_MACHINE[0]
    if last is not None and last() is not None:
        gc.collect()
    _LAST_MACHINE[0] = None


def _speculate(fam: Family, kernels: tuple[Kernel, ...], t: object, inputs: list[Arrays],
               leg: Callable[[Kernel, list[Arrays] | None], Leg]
               ) -> tuple[Forked | None, bytes, str, int]:
    """The kernel the family names (`ahead`: the one starting the longest tail) forked on
    the reference outputs of the kernel before it, if the family declares both the
    reference and the digest of what the next kernel reads (references, chains): the fork,
    the reference's digest, why not (or "") and the kernel's index. The main process
    simulates the kernels before it meanwhile.

    The fork makes its own reference; this process makes it too, after the fork, hashes
    it while the fork simulates (the fork's leg is the longer one) and lets it go. A
    reference held across the fork would count twice against the machine's memory, which
    a fork is refused for: a timing-only combine's zero rows at EP 128 are a terabyte of
    address space. (None, b"", why, 0) when the family declares none, gives no reference
    for this kernel, its reference or digest fails, or no process can be started: the
    kernels then run in order."""
    if not (fam.references and fam.chains):
        return None, b"", "", 0
    names = tuple(k.name for k in kernels)

    def index(value: object) -> str | None:
        ok = is_integer(value) and 1 <= value < len(names)  # type: ignore[operator]
        return None if ok else f"an index of {', '.join(names)} from 1"

    at = int(userguard.call(fam, "ahead", names, check=index))
    first, second = kernels[at - 1], kernels[at]

    def reference() -> list[Arrays] | None:
        return userguard.call(fam, "reference_outputs", first.name, t, inputs,
                              check=userguard.arrays(none_ok=True))

    def work() -> Leg | None:
        assumed = reference()
        return None if assumed is None else leg(second, assumed)

    try:
        ahead = Forked(work)
    except OSError as exc:  # one process it is
        return None, b"", f"redone: no second process ({exc.strerror or exc})", 0
    try:
        assumed = reference()
        expected = None if assumed is None else userguard.call(
            fam, "next_reads", first.name, t, inputs, assumed, check=userguard.digest)
    except Exception as exc:  # noqa: BLE001 - in order, where the error surfaces as usual
        ahead.cancel()
        return (None, b"", f"redone: {fam.name}'s reference of {first.name} or its digest "
                f"failed ({exc})", 0)
    except BaseException:
        ahead.cancel()
        raise
    if expected is None:
        ahead.cancel()
        return None, b"", "", 0
    return ahead, expected, "", at


@dataclass
class Leg:
    """One op simulated on an idle machine from t = 0."""

    run: OpRun
    clock_ns: float  # the machine's clock when the op's last event had run
    events: int
    samples: list[Sample]

    @classmethod
    def of(cls, machine: Machine, run: OpRun) -> Leg:
        return cls(run, machine.env.now, machine.env.events_processed, machine.trace.samples)


def shifted(run: OpRun, offset: float) -> OpRun:
    """The op placed `offset` ns later in the run."""
    if not offset:
        return run
    return replace(
        run, start_ns=run.start_ns + offset, end_ns=run.end_ns + offset,
        spans=[replace(s, start_ns=s.start_ns + offset, end_ns=s.end_ns + offset,
                       delivered_ns=None if s.delivered_ns is None
                       else s.delivered_ns + offset) for s in run.spans],
        core_end_ns=[[e + offset for e in row] for row in run.core_end_ns])


def _op_run(machine: Machine, kernel: Kernel, res: LaunchResult,
            outputs: list[Arrays]) -> OpRun:
    """The op's figures, as the machine's ranks, links and launched cores report them: the
    machine ran this op alone, so every counter is the op's."""
    ranks = [rank.stats() for rank in machine.ranks]
    cores = [[ctx.stats() for ctx in row] for row in res.contexts]
    host = getattr(machine, "host", None)
    return OpRun(
        op=kernel.name, phase_order=kernel.phase_order(), core_kind=kernel.core_kind,
        engines=tuple(k.name for k in machine.kinds[1:]),
        start_ns=res.start_ns, end_ns=res.end_ns, ranks=machine.world,
        cores_per_rank=len(machine.ranks[0].cores_of[kernel.core_kind]),
        spans=machine.trace.spans, outputs=outputs,
        bytes_sent=[r.bytes_sent for r in ranks],
        bytes_received=[r.bytes_received for r in ranks],
        l2_held=[r.l2_held for r in ranks],
        links=machine.link_stats(),
        core_bytes_put=[[c.bytes_put for c in row] for row in cores],
        core_end_ns=[list(row) for row in res.core_end_ns],
        core_transfers=[[c.transfers for c in row] for row in cores],
        core_busy_ns=[[c.busy_ns for c in row] for row in cores],
        core_counters=[[c.counters for c in row] for row in cores],
        core_labels=[c.label for c in cores[0]]
        if core_kind(kernel.core_kind).parts and cores else [],
        translation_misses=[host.misses(r) if host else 0 for r in range(machine.world)],
    )


def run_op(machine: Machine, fam: Family, kernel: Kernel, t: object,
           op_inputs: list[Arrays], limit_ns: float, keep_inputs: bool = False,
           wall_limit_s: float | None = None) -> OpRun:
    """One kernel on every rank of an idle machine: its input tensors from `op_inputs`,
    its outputs and scratch zeroed, the window zones from the family's layout; its OpRun
    with every rank's outputs read back as declared."""
    for r, (rank, arrays) in enumerate(zip(machine.ranks, op_inputs, strict=True)):
        for spec in kernel.inputs:
            a = arrays[spec.name]
            _place(rank, spec, t, a if isinstance(a, RowTable)
                   else np.ascontiguousarray(a, dtype=_layout(kernel, spec, t, r)[0]))
        for spec in (*kernel.outputs, *kernel.scratch):
            dtype, shape = _layout(kernel, spec, t, r)
            _place(rank, spec, t, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
    layout = userguard.call(fam, "window", t, check=userguard.window)
    zones = userguard.call(layout, "regions", check=userguard.regions)  # accesses stay in
    for rank in machine.ranks:
        rank.window.set_zones(zones)
    program = userguard.call(kernel, "program", t, check=userguard.callable_value)
    cores = userguard.call(kernel, "cores", t, check=userguard.whole(1, none_ok=True))
    start = userguard.call(kernel, "launch_ns", machine.cfg, check=userguard.number_or_none)
    res = launch(machine, program, time_limit_ns=limit_ns, cores=cores,
                 kind=kernel.core_kind, launch_ns=start, wall_limit_s=wall_limit_s,
                 free_local=True)
    outputs = [{spec.name: rank.tensors[spec.gm_name].as_array(*_layout(kernel, spec, t, r))
                for spec in kernel.outputs} for r, rank in enumerate(machine.ranks)]
    run = _op_run(machine, kernel, res, outputs)
    timing = [[CoreTiming(ctx.core.kind.name, ctx.sub_block_idx, ctx.notes) for ctx in row]
              for row in res.contexts]
    frames = [[ctx.frames_from(res.start_ns) for ctx in row] for row in res.contexts]
    call = Call(t, outputs, run, timing, run.core_transfers,
                frames if any(f for row in frames for f in row) else None)
    run.family_fields = dict(userguard.call(kernel, "fields", call, check=userguard.field_dict))
    if keep_inputs:  # shared rows made dense: the tensor as the kernel read it
        run.inputs = [{spec.name: _dense(arrays[spec.name], *_layout(kernel, spec, t, r))
                       for spec in kernel.inputs} for r, arrays in enumerate(op_inputs)]
    for row in res.contexts:  # all read: reference counting frees them and the machine
        for ctx in row:
            ctx.release()
    machine.release()
    return run


def _place(rank: Any, spec: TensorSpec, t: object, data: Any) -> None:
    """A kernel's tensor on a rank: plain GM, or at its symmetric heap offset in the
    window (a shmem_malloc'd tensor)."""
    if spec.heap is None:
        rank.tensor(spec.gm_name, data)
        return
    if isinstance(data, RowTable):
        data = data.dense(f"heap tensor {spec.name!r}")
    heap_tensor(rank, spec.gm_name, spec.heap(t), data)


def _layout(kernel: Kernel, spec: TensorSpec, t: object, r: int
            ) -> tuple[np.dtype, tuple[int, ...]]:
    """A tensor's dtype and shape on rank r: the kernel's functions (user code, under the
    guard), their answer checked."""
    what = f"{userguard.source_of(kernel)}: {type(kernel).__name__} tensor {spec.name!r}"
    dtype, shape = userguard.guarded(what, lambda: (spec.np_dtype(t), spec.shape(t, r)))
    ok = isinstance(shape, tuple) and all(
        isinstance(n, Integral) and not isinstance(n, bool) and 0 <= n < 2**48 for n in shape)
    if not ok:
        raise KernelError(f"{what}: its shape is {excerpt(shape)}; allowed: a tuple of "
                          "whole numbers >= 0")
    return dtype, shape


def _dense(a: np.ndarray | RowTable, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(a, RowTable):
        return a.dense("a kept input").view(dtype).reshape(shape)
    return np.ascontiguousarray(a, dtype=dtype).reshape(shape)
