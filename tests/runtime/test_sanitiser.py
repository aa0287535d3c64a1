"""The always-on sanitiser: each kernel-program bug is an error naming rank, core, step,
address and size."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import KernelError
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch


def _on(core, body):
    def program(ctx):
        if ctx.core_id == core:
            with ctx.phase("send_data"):
                yield from body(ctx)
    return program


def _zoned(hw):
    m = Machine(hw, world=2)
    for rank in m.ranks:
        rank.window.set_zones({"data": (0, 4096), "flags": (8192, 8192 + 256)})
    return m


def test_put_across_a_zone_boundary(hw):
    m = _zoned(hw)

    def body(ctx):
        buf = ctx.alloc("out", 512)
        ctx.ub_write(buf, 0, np.zeros(512, np.uint8), ops=0)
        ctx.put(1, 4096 - 256, buf, 512)
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(m, _on(2, body))
    e = info.value
    assert (e.rank, e.core, e.step, e.address, e.size) == (0, 2, "send_data", 4096 - 256, 512)
    assert "crosses the end of window zone 'data'" in str(e)


def test_put_outside_every_zone(hw):
    m = _zoned(hw)

    def body(ctx):
        buf = ctx.alloc("out", 32)
        ctx.ub_write(buf, 0, np.zeros(32, np.uint8), ops=0)
        ctx.put(1, 6000, buf, 32)
        yield from ()

    with pytest.raises(KernelError, match="outside every zone"):
        launch(m, _on(0, body))


def test_two_puts_on_the_same_bytes_are_a_race(hw):
    m = _zoned(hw)

    def body(ctx):
        buf = ctx.alloc("flag", 32)
        ctx.ub_write(buf, 0, np.ones(8, np.float32), ops=0)
        ctx.put(1, 8192 + 32 * ctx.rank_id, buf, 32)  # each rank its own entry: fine
        ctx.put(1, 8192 + 16, buf, 32)  # rank 0 and rank 1 both hit bytes 8208..8239
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(m, _on(1, body))
    assert "race" in str(info.value) and info.value.address == 8192 + 16


def test_sending_ub_bytes_nothing_wrote(hw):
    m = Machine(hw, world=2)

    def body(ctx):
        buf = ctx.alloc("out", 64)
        ctx.ub_write(buf, 0, np.zeros(32, np.uint8), ops=0)  # only the first half
        ctx.put(1, 0, buf, 64)
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(m, _on(3, body))
    e = info.value
    assert e.core == 3 and e.address == 32 and "nothing wrote" in str(e)


def test_ub_left_over_from_an_earlier_call_does_not_count(hw):
    m = Machine(hw, world=2)

    def writes(ctx):
        buf = ctx.alloc("out", 32)
        ctx.ub_write(buf, 0, np.zeros(32, np.uint8), ops=0)
        yield from ()

    def reads(ctx):
        buf = ctx.alloc("out", 32)
        ctx.ub_read(buf, np.uint8, 32)
        yield from ()

    launch(m, _on(0, writes))
    with pytest.raises(KernelError, match="nothing wrote"):
        launch(m, _on(0, reads))


def test_misaligned_ub_transfer(hw):
    m = Machine(hw, world=2)
    m.ranks[0].tensor("x", 256)
    m.ranks[1].tensor("x", 256)

    def body(ctx):
        buf = ctx.alloc("in", 256)
        ctx.copy_in(buf, ctx.tensor("x"), 0, 64, dst_offset=8)
        yield from ()

    with pytest.raises(KernelError, match="not 32 B aligned") as info:
        launch(m, _on(0, body))
    assert info.value.address == 8
