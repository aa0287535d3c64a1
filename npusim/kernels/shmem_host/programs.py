"""The kernels of hicann/shmem's host-memory examples, step by step.

sdma_d2h_demo (examples/sdma_d2h_demo/main.cpp) launches SDMA_BLOCK_NUM (20) blocks of two
AIVs; only sub-block 0 of each block submits (one SDMA queue per block). Block b moves its
share of a PE's elem_count elements (get_sdma_elem_range: the first elem_count % blocks
blocks take one more):

    put  for every pe: aclshmemx_sdma_put_nbi(host_dst + elem_count * my_pe + off,
         device_src + off, tmp UB @1024 (64 B), count, pe)   -- D2H (pe == my_pe) or D2rH
         then aclshmemx_sdma_quiet
    get  for every pe: aclshmemx_sdma_get_nbi(device_dst + elem_count * pe + off,
         host_src + elem_count * pe + off, ..., count, pe)   -- H2D or rH2D; quiet

rma_d2h_demo (examples/rma_d2h_demo/main.cpp kernel_test) runs on AIV 0 only, 10 times:
aclshmem_int32_p(input, peer, peer); aclshmem_quiet; get = aclshmem_int32_g(input, peer);
aclshmem_quiet; *output = get.

`targets` narrows the loop over pe to this PE (self) or the others (peers), so a run
isolates one path; the examples' own loop is `all`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.runtime import hostmem

SDMA_UB_OFFSET = 1024  # the example's fixed UB scratch: offset 1024, 64 B
SDMA_UB_SIZE = 64
AIVS_PER_BLOCK = 2
RMA_LOOPS = 10  # kernel_test's loop


@dataclass(frozen=True)
class HostTiling:
    """One launch of the examples: the PEs, where they sit, the segment and the split."""

    pes: int
    elements: int  # elem_count: elements per PE segment
    dtype: str  # numpy name of the element type
    blocks: int  # SDMA_BLOCK_NUM
    targets: str  # all | self | peers
    stride: int  # dies between consecutive PEs (1: PE i on die i; host.dies: one per server)
    rma_bytes: int  # rma_d2h_demo's HOST_SIDE buffer (2 MiB)
    hw: Any = None  # the preset (the report's lone-path figures)
    host_dies: int = 1  # dies per server
    sdma_latency_ns: float = 0.0
    sdma_gbps: float = 0.0
    payload: bool = True  # False (timing-only): the inputs are left zero, never written

    @property
    def world(self) -> int:
        return (self.pes - 1) * self.stride + 1

    @property
    def cores(self) -> int:
        return self.blocks * AIVS_PER_BLOCK

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def segment_bytes(self) -> int:
        return self.elements * self.itemsize

    def pe_of(self, rank: int) -> int | None:
        """The PE on die `rank`, or None for a die no PE runs on."""
        return rank // self.stride if rank % self.stride == 0 else None

    def rank_of(self, pe: int) -> int:
        return pe * self.stride

    def peers(self, me: int) -> list[int]:
        """The PEs a worker of PE `me` moves data to or from, in the example's order."""
        every = range(self.pes)
        if self.targets == "self":
            return [me]
        if self.targets == "peers":
            return [pe for pe in every if pe != me]
        return list(every)


def elem_range(elements: int, worker: int, workers: int) -> tuple[int, int]:
    """get_sdma_elem_range: (offset, count) of worker `worker`'s elements."""
    base, extra = divmod(elements, workers)
    if worker < extra:
        return worker * (base + 1), base + 1
    return extra * (base + 1) + (worker - extra) * base, base


def _worker(ctx: Any, t: HostTiling) -> tuple[int, int, int] | None:
    """(my_pe, offset, count) of this core's share, or None: a second AIV of its block, a
    die no PE runs on, or an empty range."""
    me = t.pe_of(ctx.rank_id)
    if me is None or ctx.core_id % AIVS_PER_BLOCK:
        return None
    off, count = elem_range(t.elements, ctx.core_id // AIVS_PER_BLOCK, t.blocks)
    return (me, off, count) if count else None


def _sdma(ctx: Any) -> hostmem.HostSdma:
    ctx.alloc("ub_head", SDMA_UB_OFFSET)  # the example's scratch sits at UB offset 1024
    return hostmem.HostSdma(ctx, ctx.alloc("tmp_buff", SDMA_UB_SIZE))


Each = Callable[[Any, hostmem.HostSdma, int, int, int, int], Any]


def _sdma_program(t: HostTiling, phase: str, each: Each) -> Callable[[Any], Any]:
    """The body both SDMA kernels share: this worker's share, `each(ctx, sdma, me, pe, off,
    count)` for every target pe in order, then aclshmemx_sdma_quiet (frame transfer)."""

    def program(ctx: Any) -> Any:
        share = _worker(ctx, t)
        if share is None:
            return
        me, off, count = share
        with ctx.phase(phase):
            ctx.prof_start("transfer")
            sdma = _sdma(ctx)
            for pe in t.peers(me):
                yield from each(ctx, sdma, me, pe, off, count)
            yield from sdma.quiet()
            ctx.prof_end("transfer")
    return program


def put_program(t: HostTiling) -> Callable[[Any], Any]:
    item = t.itemsize

    def put(ctx: Any, sdma: hostmem.HostSdma, me: int, pe: int, off: int, count: int) -> Any:
        # dst = host_dst + elem_count * my_pe + off, translated to PE pe's heap
        dst = hostmem.host_tensor(ctx, "host_dst", t.rank_of(pe))
        yield from sdma.put_nbi_host(t.rank_of(pe), dst, (t.elements * me + off) * item,
                                     ctx.tensor("device_src"), off * item, count * item)
    return _sdma_program(t, "put", put)


def get_program(t: HostTiling) -> Callable[[Any], Any]:
    item = t.itemsize

    def get(ctx: Any, sdma: hostmem.HostSdma, me: int, pe: int, off: int, count: int) -> Any:
        src = hostmem.host_tensor(ctx, "host_src", t.rank_of(pe))
        at = (t.elements * pe + off) * item
        yield from sdma.get_nbi_host(t.rank_of(pe), ctx.tensor("device_dst"), at, src, at,
                                     count * item)
    return _sdma_program(t, "get", get)


def rma_program(t: HostTiling) -> Callable[[Any], Any]:
    def program(ctx: Any) -> Any:
        me = t.pe_of(ctx.rank_id)
        if me is None or ctx.core_id != 0:
            return
        peer = (me + 1) % t.pes
        target = hostmem.host_tensor(ctx, "input", t.rank_of(peer))
        with ctx.phase("rma"):
            ctx.prof_start("transfer")
            got = 0
            for _ in range(RMA_LOOPS):
                hostmem.scalar_p(ctx, target, 0, peer, np.int32)
                yield from ctx.shmem.quiet()
                got = yield from hostmem.scalar_g(ctx, target, 0, np.int32)
                yield from ctx.shmem.quiet()
            ctx.prof_end("transfer")
            ctx.gm_write_scalar(ctx.tensor("output"), 0, got, np.int32)  # *output = get_num
    return program
