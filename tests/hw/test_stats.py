"""Components report their own statistics (npusim/engine/stats.py): one put of 10 000 B
from core 0 of rank 0 into rank 1's window on round_hw (ports 10 B/ns, put latency 200 ns,
link 50 ns), every figure by hand."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.engine.stats import TransferStat
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch
from tests.conftest import round_hw

N = 10000


@pytest.fixture(scope="module")
def ran():
    m = Machine(round_hw(), world=2)

    def program(ctx):
        buf = ctx.alloc("out", N)
        ctx.ub_write(buf, 0, np.ones(N, np.uint8), ops=0)
        if ctx.rank_id == 0 and ctx.core_id == 0:
            yield from ctx.wait(ctx.put(1, 0, buf, N))

    return m, launch(m, program)


def test_ranks_report_what_crossed_their_windows(ran):
    m, _ = ran
    sent, received = m.ranks[0].stats(), m.ranks[1].stats()
    assert (sent.bytes_sent, sent.bytes_received) == (N, 0)
    assert (received.bytes_sent, received.bytes_received) == (0, N)
    # the 10 000 B are far below the die's L2: the receiver's L2 holds them all
    assert received.l2_held == N and sent.l2_held == 0


def test_the_machine_reports_bytes_on_the_links_the_put_crossed(ran):
    m, _ = ran
    used = {(s.name, s.bytes) for s in m.link_stats() if s.bytes}
    assert used == {("rank0.egress", N), ("rank1.ingress", N)}


def test_a_core_reports_its_put_its_pipes_and_its_counters(ran):
    _, res = ran
    putter, idle = res.contexts[0][0].stats(), res.contexts[0][1].stats()
    assert putter.bytes_put == N and idle.bytes_put == 0
    assert putter.transfers == [TransferStat("start", "mte3", "put", True, 1, N)]
    # MTE3 busy from the issue to the landing: N / 10 B/ns + 200 ns + the 50 ns link
    assert putter.busy_ns["mte3"] == pytest.approx(N / 10 + 200 + 50)
    assert idle.busy_ns["mte3"] == 0 and idle.transfers == []
    assert putter.label == "aiv 0" and idle.label == "aiv 1"
