"""A scenario's run gives each core's local buffers back to the OS as its program ends;
launch() from Python keeps them, for a test or notebook that reads them after."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from npusim.hw.config import load_hardware
from npusim.hw.machine import Machine
from npusim.hw.memory import paged_zeros, release_pages
from npusim.runtime.launch import launch

linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="MADV_DONTNEED reads back zeros on Linux")
PAGE = 4096


@linux
def test_the_whole_pages_inside_a_slice_go_back_and_its_edges_stay():
    buf = paged_zeros(4 << 20, "a test map")
    buf[:] = 7
    # from 100 B into page 1 to 50 B into page 3: only page 2 lies wholly inside
    assert release_pages(buf[PAGE + 100:3 * PAGE + 50])
    assert not buf[2 * PAGE:3 * PAGE].any()
    assert (buf[:2 * PAGE] == 7).all() and (buf[3 * PAGE:] == 7).all()


def test_an_array_of_its_own_is_left_alone():
    a = np.full(4 * PAGE, 7, np.uint8)
    assert not release_pages(a[PAGE:])
    assert (a == 7).all()


@linux
@pytest.mark.parametrize("free", [False, True])
def test_a_cores_ub_goes_back_when_its_program_ends_only_if_asked(free):
    # the A3's 48 AIV: their UBs (9 MiB) and write marks (1.1 MiB) are maps of the rank
    m = Machine(load_hardware("atlas_a3"), world=1)

    def program(ctx):
        if ctx.core_id == 1:
            buf = ctx.alloc("x", 2 * PAGE)
            ctx.ub_write(buf, 0, np.full(2 * PAGE, 5, np.uint8), ops=0)
        yield from ()

    launch(m, program, free_local=free)
    ub = m.ranks[0].cores[1].ub
    assert bool(ub.data[:2 * PAGE].any()) == (not free)
    assert bool(ub.written[:2 * PAGE // 8].any()) == (not free)
