"""The kernel API refuses, at the call, a size, count, offset or index that is negative,
fractional or not a number, and a time or amount of work that is NaN, infinite or
negative: exit 3, one line naming rank, core, step, the call, the value and what is
allowed, and the kernel's file and line; nothing written. Before, `ctx.alloc("x", -32)`
ran on with later buffers aliasing earlier ones, `ctx.scalar(nan)` ended in a traceback
or a deadlock blamed on another core, and a float offset failed when the bytes landed.

A launch must fit the rank's cores: a user kernel whose `cores()` asks for none, or for
more than the preset has, is refused at load (exit 2, one line naming the preset key
and the least count that works), and a launch on such counts is a KernelError."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import KernelError
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch
from tests.cli.test_kernel_faults import FAULTY, TOY, faulty_scenario

ROOT = Path(__file__).resolve().parents[2]
# the default preset's AIV cores per rank, read from its file
AIV_CORES = yaml.safe_load((ROOT / "configs" / "ascend950.yaml").read_text())["chip"][
    "aiv_cores"]["value"]
# what the call's line has at hand: a UB buffer, the rank's own window, the API's names
AT_HAND = ("import numpy as np; from npusim.runtime.conditions import AtLeast; "
           "from npusim.runtime.transfer import Strided; nan = float('nan'); "
           "buf = ctx.alloc('b', 256); own = ctx.window(); ")


def _write(tmp: Path, call: str = "pass", cores: str = "None") -> tuple[Path, str]:
    """The scenario of the toy dispatch of test_kernel_faults making `call` on rank 1,
    core 2, its kernel launching `cores`; and the '(file, line N)' of that call."""
    return faulty_scenario(tmp, FAULTY.format(toy=str(TOY), body=AT_HAND + call)
                           + f"\nFaultyDispatch.cores = lambda self, t: {cores}\n")


def _run(tmp: Path, capsys: pytest.CaptureFixture[str], sc: Path) -> tuple[int, str]:
    code = main(["run", str(sc), "--out", str(tmp / "o"), "--quiet", "--workers", "1"])
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1, cap
    assert not (tmp / "o").exists()
    return code, cap.err


WHOLE = "allowed: a whole number >= 0"
FINITE = "allowed: a finite number >= 0"


@pytest.mark.parametrize("call, says", [
    ('ctx.alloc("x", -32)', f"ctx.alloc: nbytes -32; {WHOLE}"),
    ('ctx.alloc("x", 3.5)', f"ctx.alloc: nbytes 3.5; {WHOLE}"),
    ("ctx.scalar(nan)", f"ctx.scalar: ops .nan; {FINITE}"),
    ("ctx.scalar(-1)", f"ctx.scalar: ops -1; {FINITE}"),
    ("ctx.scalar(float('inf'))", f"ctx.scalar: ops .inf; {FINITE}"),
    ("ctx.loop(nan)", f"ctx.loop: iterations .nan; {FINITE}"),
    ('ctx.vector("add", -100, "float16")', f"ctx.vector('add'): elements -100; {WHOLE}"),
    ('ctx.vector("add", 64, "float16", passes=nan)', f"ctx.vector('add'): passes .nan; {FINITE}"),
    ('ctx.fixed("vector", "f", -5.0)', f"vector 'f': duration_ns -5.0; {FINITE}"),
    ('ctx.vector_function("vf", [3, -1])',
     f"ctx.vector_function('vf'): instructions -1; {WHOLE}"),
    ("ctx.ub_read(buf, np.int32, -4)", f"ctx.ub_read: count -4; {WHOLE}"),
    ("ctx.ub_write(buf, 0, np.zeros(4, np.int32), ops=nan)", f"ctx.ub_write: ops .nan; {FINITE}"),
    ("ctx.copy_in(buf, own, 0, -32)", f"copy_in: nbytes -32; {WHOLE}"),
    ("ctx.copy_in(buf, own, 0.5, 32)", f"copy_in: offset 0.5; {WHOLE}"),
    ("ctx.copy_in(buf, own, 0, 32, dst_offset=-32)",
     f"copy_in: the local buffer offset -32; {WHOLE}"),
    ("ctx.copy_in(buf, own, 0, 64, strided=Strided(2, 32, -64))",
     "copy_in: strided.src_gap -64; allowed: a whole number >= -length (-32)"),
    ("ctx.put(1.0, 0, buf, 32)", f"ctx.window: rank 1.0; {WHOLE}"),
    ("ctx.put(0, 0, buf, -32)", f"put: nbytes -32; {WHOLE}"),
    ("ctx.gm_read_scalar(own, 1.5, np.int32)", f"scalar GM load: offset 1.5; {WHOLE}"),
    ("yield from ctx.spin_until(own, 0, AtLeast(np.int32, 0), delay_cycles=-1)",
     f"spin: delay_cycles -1; {FINITE}"),
    ("from npusim.runtime import membase; ctx.membase('m', [membase.dup(buf, buf, -8)])",
     f"ctx.membase('m') dup: count -8; {WHOLE}"),
    ("yield from ctx.shmem.mte_put_nbi(0, 0, own, 0, 64, buf, 0)",
     "mte_put_nbi: ub_size 0; allowed: at least one element (1 B)"),
])
def test_a_bad_argument_is_refused_at_the_call(tmp_path, capsys, call, says):
    sc, where = _write(tmp_path, call)
    code, err = _run(tmp_path, capsys, sc)
    assert code == 3
    assert err == f"npusim: kernel error: rank 1, core 2, step 'send': {says} {where}\n"


def test_a_zero_byte_allocation_is_a_buffer_no_access_fits(tmp_path, capsys):
    sc, where = _write(tmp_path, 'ctx.copy_in(ctx.alloc("none", 0), own, 0, 32)')
    code, err = _run(tmp_path, capsys, sc)
    assert code == 3 and "overruns UB buffer 'none' (0 B)" in err


@pytest.mark.parametrize("cores, need", [("0", 1), (str(AIV_CORES + 1), AIV_CORES + 1)])
def test_a_launch_beyond_the_ranks_cores_is_refused_at_load(tmp_path, capsys, cores, need):
    sc, _ = _write(tmp_path, cores=cores)
    code, err = _run(tmp_path, capsys, sc)
    assert code == 2
    assert err.startswith(f"npusim: error: {sc}: ")
    if need > AIV_CORES:
        assert (f"hardware: {AIV_CORES}: faulty_toy's dispatch needs {need} AIV cores "
                f"({need} AIV cores); allowed: at least {need}\n") in err
    else:
        assert err.endswith("workload.kernel: faulty_toy's dispatch launches 0 AIV cores; "
                            "allowed: at least 1\n")


@pytest.mark.parametrize("cores", ["'4'", "2.0", "True"])
def test_a_core_count_that_is_not_a_whole_number_is_refused_at_load(tmp_path, capsys, cores):
    sc, _ = _write(tmp_path, cores=cores)
    code, err = _run(tmp_path, capsys, sc)
    shown = {"'4'": "'4'", "2.0": "2.0", "True": "true"}[cores]
    assert code == 2
    assert err == (f"npusim: error: {sc}: workload.kernel: faulty_toy's dispatch: "
                   f"cores(tiling) returned {shown}; allowed: a whole number >= 1, or None "
                   "(every core)\n")


@pytest.mark.parametrize("cores", [0, 5])
def test_a_launch_on_no_core_or_more_than_the_rank_has_is_a_kernel_error(hw, cores):
    m = Machine(hw, world=2)
    have = len(m.ranks[0].cores)
    with pytest.raises(KernelError) as info:
        launch(m, lambda ctx: iter(()), cores=cores if cores == 0 else have + cores)
    assert str(info.value) == (f"a launch on {cores if cores == 0 else have + cores} aiv "
                               f"cores per rank; allowed: 1 to {have}, the aiv cores a rank "
                               "has")
