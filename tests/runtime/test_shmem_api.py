"""The SHMEM device API (npusim.runtime.shmem) on round hardware: every expected time is
hand arithmetic from the preset figures (conftest.round_hw: 1 GHz, zero issue cost, 10 GB/s
ports, MTE2 latency 100 ns, put latency 200 + link 50 ns, local write latency 100 ns),
with the data cache at miss 100 ns, dcci 50 ns and dcci of the whole cache 300 ns."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import KernelError
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch
from npusim.runtime.shmem import CORE_SYNC_POOL, LOG_MAX_AIV_PER_NPU, chunks, dissemination_rounds
from tests.conftest import round_hw

MISS, DCCI, DCCI_ALL = 100.0, 50.0, 300.0
PUT_LAT = 200.0 + 50.0  # mte.put_latency_ns + fabric.link_latency_ns
LOCAL_LAT = 100.0  # mte.ub_to_gm_latency_ns


def _hw(**extra):
    return round_hw(dcache__miss_ns=MISS, dcache__dcci_ns=DCCI,
                    dcache__dcci_entire_ns=DCCI_ALL, **extra)


def _only(cores, ranks, body):
    def program(ctx):
        if ctx.core_id in cores and ctx.rank_id in ranks:
            yield from body(ctx)
    return program


def test_chunks_are_ub_size_blocks_of_whole_elements_then_the_rest():
    assert chunks(2500, 1024) == [(0, 1024), (1024, 1024), (2048, 452)]
    assert chunks(190 * 1024 * 2 + 6, 190 * 1024, 4) == [(0, 194560), (194560, 194560),
                                                          (389120, 6)]
    assert chunks(14336, 190 * 1024, 2) == [(0, 14336)]  # H 7168 fp16: one chunk


def test_mte_put_nbi_is_serial_chunks_mte2_then_mte3():
    m = Machine(_hw(), world=2)
    src = np.arange(2500, dtype=np.uint32).astype(np.uint8)
    m.ranks[0].tensor("x", src)
    seen = {}

    def body(ctx):
        buf = ctx.alloc("tmp", 1024)
        last = yield from ctx.shmem.mte_put_nbi(1, 4096, ctx.tensor("x"), 0, 2500, buf, 1024)
        seen["issued"] = ctx.t
        yield from ctx.wait(last)
        seen["done"] = ctx.t

    launch(m, _only({0}, {0}, body))
    # per chunk n: MTE2 100 + n/10, then the put 250 + n/10, one after the other; the
    # call returns after issuing the last put (its MTE3 is left to the quiet)
    copies = sum(100 + n / 10 for n in (1024, 1024, 452))
    puts = sum(PUT_LAT + n / 10 for n in (1024, 1024, 452))
    assert seen["issued"] == pytest.approx(copies + puts - (PUT_LAT + 45.2))
    assert seen["done"] == pytest.approx(copies + puts)  # 3 * 350 + 2 * 250 = 1550
    assert seen["done"] == pytest.approx(1550.0)
    assert np.array_equal(m.ranks[1].window.read(4096, 2500), src)


def test_signal_op_lands_after_dcci_and_a_line_transfer_and_the_poll_sees_it():
    m = Machine(_hw(), world=2)
    seen = {}

    def body(ctx):
        if ctx.rank_id == 0:
            ctx.shmem.signal_op(1, 256, 7)
            seen["sender"] = ctx.t
            yield from ctx.shmem.quiet()
            seen["quiet"] = ctx.t
        else:
            seen["value"] = yield from ctx.shmem.signal_wait_until(256, "eq", 7)
            seen["woke"] = ctx.t

    launch(m, _only({0}, {0, 1}, body))
    assert seen["sender"] == pytest.approx(DCCI)  # the store (0) and the dcci
    landed = DCCI + PUT_LAT + 64 / 10  # then one 64 B line over the put path: 306.4
    # dcci_entire's cost, and it returns once the write-back landed
    assert seen["quiet"] == pytest.approx(max(DCCI + DCCI_ALL, landed))
    # each poll: dcci 50 + a line fill 100 (compare and loop 0): reads land at 150, 300,
    # 450; the first after 306.4 is the one at 450
    period = DCCI + MISS
    assert landed > 2 * period
    assert seen["woke"] == pytest.approx(3 * period)
    assert seen["value"] == 7
    assert m.ranks[1].window.read(256, 4).view(np.int32)[0] == 7


def test_quiet_waits_for_the_puts_then_costs_the_cache_clean():
    m = Machine(_hw(), world=2)
    seen = {}

    def body(ctx):
        buf = ctx.alloc("s", 1000)
        ctx.ub_write(buf, 0, np.ones(1000, np.uint8), ops=0)
        ctx.shmem.put_ub(1, 0, buf, 1000)
        yield from ctx.shmem.quiet()
        seen["t"] = ctx.t

    launch(m, _only({0}, {0}, body))
    assert seen["t"] == pytest.approx(PUT_LAT + 1000 / 10 + DCCI_ALL)  # 650


def test_scalar_loads_miss_once_per_line_until_a_dcci():
    m = Machine(_hw(scalar__cycles_per_op=1.0), world=1)  # one slot = 1 ns
    m.ranks[0].tensor("g", np.arange(64, dtype=np.int32))  # 256 B = 4 lines
    seen = {}

    def body(ctx):
        g = ctx.tensor("g")
        vals = [int(ctx.gm_read_scalar(g, 4 * i, np.int32)) for i in (0, 1, 15, 16)]
        seen["loads"] = ctx.t
        ctx.dcache.dcci_line(g, 0)
        vals.append(int(ctx.gm_read_scalar(g, 8, np.int32)))
        seen["after_dcci"] = ctx.t
        ctx.gm_write_scalar(g, 4, 99, np.int32)
        seen["store"] = ctx.t
        seen["vals"] = vals
        yield from ctx.sync()

    launch(m, _only({0}, {0}, body))
    # lines 0 (elements 0..15) and 1 (16..): 2 misses (1 + 100 each) and 2 hits (1 each)
    assert seen["loads"] == pytest.approx(2 * (1 + MISS) + 2 * 1)
    assert seen["after_dcci"] == pytest.approx(seen["loads"] + DCCI + 1 + MISS)
    assert seen["store"] == pytest.approx(seen["after_dcci"] + 1)  # no fill on a store
    assert seen["vals"] == [0, 1, 15, 16, 2]
    assert m.ranks[0].tensors["g"].read(4, 4).view(np.int32)[0] == 99


def test_a_plain_store_to_another_rank_is_refused():
    m = Machine(_hw(), world=2)

    def body(ctx):
        ctx.gm_write_scalar(ctx.window(1), 0, 1, np.int32)
        yield from ctx.sync()

    with pytest.raises(KernelError, match="signal_op"):
        launch(m, _only({0}, {0}, body))


@pytest.mark.parametrize("cores,rounds", [(1, 0), (2, 1), (4, 2), (5, 3), (8, 3), (48, 6)])
def test_dissemination_rounds_are_ceil_log2_of_the_cores(cores, rounds):
    assert dissemination_rounds(cores) == rounds


@pytest.mark.parametrize("cores,rounds", [(4, 2), (5, 3)])
def test_barrier_core_soft_runs_its_rounds_on_gm_flags(cores, rounds):
    hw = _hw(chip__aiv_cores=8)
    m = Machine(hw, world=1)
    ends = {}

    def program(ctx):
        yield from ctx.shmem.barrier_core_soft()
        ends[ctx.core_id] = ctx.t

    launch(m, program, cores=cores)
    # the counter load misses (100); each round: dcci 50 after the signal store, the flag
    # lands a local write (100 + 64/10) later, the waiter's polls (dcci 50 + fill 100)
    # read at 150 and 300 after its dcci: the round ends 200 after it began
    assert all(t == pytest.approx(MISS + rounds * 200) for t in ends.values())
    assert len(ends) == cores
    pool = m.ranks[0].tensors[CORE_SYNC_POOL]
    slots = pool.read(0, cores * LOG_MAX_AIV_PER_NPU * 64).view(np.int32)[::16]
    slots = slots.reshape(cores, LOG_MAX_AIV_PER_NPU)
    assert (slots[:, :rounds] == 1).all() and (slots[:, rounds:] == 0).all()
    assert pool.read(pool.nbytes - 64, 4).view(np.int32)[0] == 1  # the counter


def test_a_late_core_holds_the_barrier():
    m = Machine(_hw(), world=1)
    ends = {}

    def program(ctx):
        if ctx.core_id == 3:
            ctx.t += 1000  # arrives 1 us late
        yield from ctx.shmem.barrier_core_soft()
        ends[ctx.core_id] = ctx.t

    launch(m, program, cores=4)
    assert min(ends.values()) > 1000 + MISS


@pytest.mark.parametrize("nbytes", [14336, 400 * 1024])  # H 7168 fp16: 1 chunk; 3 chunks
def test_mte_put_nbi_on_the_a3_preset_is_its_figures(nbytes):
    """Rank 0 -> rank 1 (the same package: the SIO link) on atlas_a3, from its figures."""
    from npusim.hw.config import load_hardware

    hw = load_hardware("atlas_a3")
    m = Machine(hw, world=2)
    m.ranks[0].tensor("x", np.ones(nbytes, np.uint8))
    seen = {}

    def body(ctx):
        buf = ctx.alloc("tmp", 190 * 1024)
        last = yield from ctx.shmem.mte_put_nbi(1, 0, ctx.tensor("x"), 0, nbytes, buf,
                                                190 * 1024, 2)
        yield from ctx.wait(last)
        seen["t"] = ctx.t

    launch(m, _only({0}, {0}, body), launch_ns=0.0)
    issue = hw.scalar.cycles_per_op / hw.chip.clock_ghz
    pkg = hw.fabric.levels[0]
    mte = hw.mte
    want = 0.0
    for _, n in chunks(nbytes, 190 * 1024, 2):
        want += issue + mte.gm_to_ub_latency_ns + n / mte.gm_to_ub_gbps  # MTE2 into UB
        want += issue + mte.put_latency_ns + pkg.latency_ns + n / min(mte.put_gbps,
                                                                     pkg.link_gbps)
    assert seen["t"] == pytest.approx(want)
