"""A2, the receive cores (sub-block 0 of every block; recvCoreIdx = block): RecvCoreFunc
(GMM1K:1219-1268).

- RecvCount (1030-1079): spin until the W * L count entries' fp32 words 0 add up to
  W * L (within 0.5), then the entries in UB;
- the split (1225-1242): aicNum / L cores per local expert, the W source ranks of the
  expert over them (the remainder to the first); cores past the L groups receive nothing;
- GetCumSum (1081-1124): the counts (entry word 1, expert-major: local expert, then
  source rank); core 0 writes them out as ep_recv_count; the inclusive prefix to the
  core's first entry;
- RecvToken (1126-1217): per entry, per record of its slot in data half 0: spin on the
  flag word until it holds the token flag, reset it to 0, copy the H + 512 B record in, the
  scale out to x1_scale and the int8 row to x1 at the row's prefix position; then the
  entries' inclusive prefixes out to ep_send_count;
- the group line (1250-1266): {vToCFlag, group, 0, rows received} AtomicAdd'ed into the
  group's line of the status area, which the AIC and the comp AIV spin on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.moe_layer.fused_deep_moe.roles import (
    DISPATCH_STATE,
    SUM_TARGET,
    LaunchTiling,
    core_num_per_group,
)
from npusim.kernels.moe_layer.fused_deep_moe_base.window import (
    STATE_OFFSET,
    TOKEN_FLAG_1,
    V_TO_C_FLAG_1,
)
from npusim.runtime.conditions import AllEqual, SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided

F32, I32 = np.float32, np.int32
ENTRY_BYTES = 32
STATUS_TOLERANCE = 0.5  # minTarget / maxTarget (GMM1K:1055-1056)


def recv_count(ctx: KernelContext, lt: LaunchTiling, status: Any) -> Wait:
    """RecvCount, then the entries' first 32 B in UB (`status`)."""
    t, win = lt.t, lt.window
    n = t.W * t.L
    first = win.status_entry(DISPATCH_STATE, 0)
    yield from ctx.spin_until(ctx.window(), first,
                              SumEquals(F32, SUM_TARGET * n, stride=STATE_OFFSET,
                                        tolerance=STATUS_TOLERANCE),
                              n * STATE_OFFSET, name="recv_count")
    ld = ctx.copy_in(status, ctx.window(), first, n * ENTRY_BYTES, name="copy_status",
                     strided=Strided(n, ENTRY_BYTES, STATE_OFFSET - ENTRY_BYTES, 0))
    yield from ctx.wait(ld)
    op = ctx.vector_seq("gather_sum", [("gather_mask", n * 8, I32), ("sum", n, F32)],
                        reads=[status])
    yield from ctx.wait(op)


def dispatch_recv(ctx: KernelContext, lt: LaunchTiling, core: int) -> Wait:
    t, win = lt.t, lt.window
    n = t.W * t.L
    status = ctx.alloc("status", n * ENTRY_BYTES)
    yield from recv_count(ctx, lt, status)
    per_group = core_num_per_group(t)
    group, in_group = divmod(core, per_group)
    lo, hi = split_to_core(t.W, per_group, in_group)
    start, end = t.W * group + lo, t.W * group + hi
    received = 0
    if start < n:
        counts = ctx.ub_read(status, I32, n * 8).reshape(n, 8)[:, 1].astype(np.int64)
        op = ctx.vector_seq("get_cum_sum", [("gather_mask", n * 8, I32),
                                            ("reduce_sum", start + 1, F32)], reads=[status])
        yield from ctx.wait(op)
        if core == 0:
            out = ctx.alloc("recv_count", n * 4)
            ctx.ub_write(out, 0, counts.astype(I32), ops=1)
            yield from ctx.wait(ctx.copy_out(ctx.tensor("ep_recv_count"), 0, out, n * 4,
                                             name="copy_ep_recv_count"))
        received = yield from _recv_tokens(ctx, lt, counts, start, end)
    line = ctx.alloc("group_line", ENTRY_BYTES)
    words = np.zeros(8, I32)
    words[0], words[1], words[3] = V_TO_C_FLAG_1, group, received
    yield from ctx.drain()
    ctx.ub_write(line, 0, words, ops=3)
    ctx.set_atomic_add(I32)
    op = ctx.copy_out(ctx.window(), win.group_line(group), line, ENTRY_BYTES,
                      name="atomic_add_group_line")
    ctx.set_atomic_none()
    yield from ctx.wait(op)


def _recv_tokens(ctx: KernelContext, lt: LaunchTiling, counts: np.ndarray, start: int,
                 end: int) -> Any:
    """RecvToken over entries [start, end): returns the rows this core received."""
    t, win = lt.t, lt.window
    rec = ctx.alloc("x_tmp", t.record_bytes)
    prefix = ctx.alloc("send_count", (end - start) * 4)
    x1, x1s = ctx.tensor("x1"), ctx.tensor("x1_scale")
    incl = np.cumsum(counts)
    last: list[Any] = []
    received = 0
    for index in range(start, end):
        count = int(counts[index])
        received += count
        begin = int(incl[index]) - count
        src, local = index % t.W, index // t.W
        for j in range(count):
            at = win.record(ctx.rank_id, DISPATCH_STATE, src, local, j)
            yield from ctx.spin_until(ctx.window(), at + t.H + 4,
                                      AllEqual(I32, TOKEN_FLAG_1), 4, name="wait_token_flag")
            ctx.store_remote(ctx.rank_id, at + t.H + 4, np.zeros(1, I32),
                             name="reset_token_flag")
            yield from ctx.drain()
            if last:
                yield from ctx.wait(*last)
            ld = ctx.copy_in(rec, ctx.window(), at, t.record_bytes, name="copy_record")
            yield from ctx.wait(ld)
            last = [ctx.copy_out(x1s, (begin + j) * 4, rec, 4, src_offset=t.H,
                                 name="copy_scale"),
                    ctx.copy_out(x1, (begin + j) * t.H, rec, t.H, name="copy_token")]
    if last:
        yield from ctx.wait(*last)
    yield from ctx.drain()
    ctx.ub_write(prefix, 0, incl[start:end].astype(I32), ops=end - start)
    yield from ctx.wait(ctx.copy_out(ctx.tensor("ep_send_count"), start * 4, prefix,
                                     (end - start) * 4, name="copy_ep_send_count"))
    return received
