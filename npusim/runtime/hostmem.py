"""Host memory as a kernel reaches it: SHMEM's HOST_SIDE heap mapped into the device.

hicann/shmem maps a PE's HOST_SIDE heap (aclshmemx_malloc(..., HOST_SIDE), src/host/mem/
shmem_mm.cpp) into every device's address space (p2p_host_heap_base[pe],
shmem_device_mte.hpp), so a kernel reaches it with the calls it uses for GM; each costs
what its path costs (npusim.hw.host: the die's host port, the socket's CPU port and DRAM,
and between servers the supernode fabric) and the table walks of the pages the die's SMMU
does not hold (added to each access's latency; an SDMA SQE's engine holds for them):

    host_tensor(ctx, name, pe)        a declared GM tensor of PE pe, living in its host DRAM
                                      (SHMEM's huge pages, or pinned base pages)
    copy_in_host / copy_out_host      an MTE2 read / MTE3 write of host-mapped GM
    HostSdma.put_nbi_host / _get_     aclshmemx_sdma_put_nbi / _get_nbi to and from a PE's
                                      HOST_SIDE memory (D2H, D2rH; H2D, rH2D), SQEs of the
                                      die's SDMA engine posted as runtime.sdma does
    scalar_p / scalar_g               aclshmem_<type>_p / _g: a scalar store and dcci of its
                                      line / a line fill, over the host path

Nothing here knows of a family.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from npusim.hw import sdma as engine
from npusim.hw.copy_path import Memory, engine_copy
from npusim.hw.cores import pipe_cap
from npusim.hw.host import HostRegion, Path, host_of, walk_of
from npusim.hw.memory import Region
from npusim.hw.pipe import Op
from npusim.hw.ub import INF, UBBuffer
from npusim.runtime.conditions import Wait
from npusim.runtime.sdma import BLOCK_BYTES, Sdma

if TYPE_CHECKING:
    from npusim.runtime.context import KernelContext



def host_tensor(ctx: KernelContext, name: str, pe: int | None = None,
                huge_pages: bool = True) -> HostRegion:
    """GM tensor `name` of PE `pe` (default this one) as host memory: the first call on any
    core moves it into that PE's host DRAM (the bytes the host wrote before the launch),
    in SHMEM's huge pages or, with `huge_pages` False, in the OS's base pages (pinned
    memory registered with the device); the run's outputs are read back from there."""
    pe = ctx.rank_id if pe is None else ctx._whole(pe, f"host_tensor {name!r}", "pe")
    if ctx.cfg.host is None:
        raise ctx.error(f"the {ctx.cfg.name} preset has no host memory (hardware.host)")
    if not 0 <= pe < ctx.world:
        raise ctx.error(f"host_tensor {name!r}: PE {pe} is not one of the {ctx.world} PEs")
    return host_of(ctx.machine).adopt(ctx.machine.ranks[pe], name, huge_pages)


def _host(ctx: KernelContext, region: Region, what: str) -> HostRegion:
    if not isinstance(region, HostRegion):
        raise ctx.error(f"{what}: {region.name!r} of rank {region.rank} is device GM, not "
                        "HOST_SIDE memory (host_tensor)")
    return region


def write_path(ctx: KernelContext, dst: HostRegion) -> Path:
    """This die writing into `dst`'s host memory (D2H or D2rH)."""
    return host_of(ctx.machine).write_path(ctx.rank_id, dst.rank)


def read_path(ctx: KernelContext, src: HostRegion) -> Path:
    """This die reading `src`'s host memory (H2D or rH2D)."""
    return host_of(ctx.machine).read_path(ctx.rank_id, src.rank)


# -- MTE ------------------------------------------------------------------------------------
def copy_in_host(ctx: KernelContext, dst: UBBuffer, src: Region, src_offset: int,
                 nbytes: int, dst_offset: int = 0, name: str = "copy_in_host") -> Op:
    """DataCopy(Pad) of host-mapped GM -> UB on MTE2: at the pipe's remote cap, over the
    host read path (the socket's DRAM, its CPU port, the die's host port, then the die's
    L2 or HBM is not crossed: the bytes land in UB), the MTE2 latency plus the path's."""
    host = _host(ctx, src, name)
    ctx._issue_transfer(nbytes, None, name)
    ctx._check_local(dst, name)
    ctx._check_ub(dst, dst_offset, nbytes, name)
    ctx._check_gm(host, src_offset, nbytes, name)
    path = read_path(ctx, host)
    cap = _cap(ctx, "mte2", name)
    latency = ctx._mte2_latency + path.latency_ns + _walk(ctx, host, src_offset, nbytes)
    ctx._claim_landing(dst, nbytes, name)
    op = Op(ctx.env, name, "mte2")
    pipe = ctx.core.mte2
    pipe.issue(op)
    local = dst.ub
    at = dst.offset + dst_offset

    def done(t: float) -> None:
        host.read_into(src_offset, local.data[at:at + nbytes])
        if dst_offset == 0 and nbytes == dst.nbytes:
            dst.mark_written()
        elif not dst.all_written:
            ctx._mark(at, nbytes, None, dst_side=True, local=local)
        dst.write_ready = t
        ctx._finish(pipe, op, t, nbytes)

    def begin() -> None:
        pipe.began(op)
        ctx.machine.net.start(nbytes, cap, path.resources, latency, done,
                              ctx._on_sent(pipe, op), op.event())

    ctx._count(pipe, f"{name} {path.kind}", nbytes, path.kind != "H2D")
    pipe.submit(ctx.t, begin)
    return op


def copy_out_host(ctx: KernelContext, dst: Region, dst_offset: int, src: UBBuffer,
                  nbytes: int, src_offset: int = 0, name: str = "copy_out_host") -> Op:
    """DataCopy(Pad) UB -> host-mapped GM on MTE3: at the pipe's remote cap (`mte.put_gbps`)
    over the host write path, the put latency plus the path's."""
    from npusim.runtime.context import Route

    host = _host(ctx, dst, name)
    path = write_path(ctx, host)
    route = Route(path.resources, _cap(ctx, "mte3", name), ctx.cfg.mte.put_latency_ns
                  + path.latency_ns + _walk(ctx, host, dst_offset, nbytes))
    return _send(ctx, host, dst_offset, src, src_offset, nbytes, f"{name} {path.kind}", route,
                 path.kind != "D2H")


def _send(ctx: KernelContext, dst: HostRegion, dst_offset: int, src: UBBuffer,
          src_offset: int, nbytes: int, name: str, route: Any, remote: bool) -> Op:
    """An MTE3 write of UB bytes that lands in host memory (no die's L2 or HBM)."""
    from npusim.runtime.transfer import _Send

    ctx._issue_transfer(nbytes, None, name)
    ctx._check_gm(dst, dst_offset, nbytes, name)
    ctx._check_source(src, src_offset, nbytes, None, name)
    src.read_busy = INF
    op = Op(ctx.env, name, "mte3")
    pipe = ctx.core.mte3
    pipe.issue(op)
    send = _Send()
    send.ctx, send.op, send.pipe, send.atomic, send.strided = ctx, op, pipe, None, None
    send.src, send.src_offset, send.src_span = src, src_offset, nbytes
    send.dst, send.dst_offset, send.dst_span = dst, dst_offset, nbytes
    send.nbytes, send.path, send.cap, send.latency = nbytes, route.path, route.cap_gbps, \
        route.latency_ns
    send.ack = route.ack_ns  # a host write completes at its landing (no response modelled)
    ctx._count(pipe, name, nbytes, remote)
    pipe.submit(ctx.t, send)
    return op


def _walk(ctx: KernelContext, host: HostRegion, offset: int, nbytes: int) -> float:
    """The table walks this die's SMMU needs for the access (npusim.hw.host)."""
    return walk_of(ctx.machine, ctx.rank_id, host, offset, nbytes)


def _cap(ctx: KernelContext, pipe: str, what: str) -> float:
    """The pipe's remote port cap: host memory is reached off the die, like a peer's."""
    cap = next((pipe_cap(ctx.cfg, pk, remote=True) for pk in ctx.core.kind.pipes
                if pk.name == pipe), None)
    if cap is None:
        raise ctx.error(f"{what}: core kind {ctx.core.kind.name} has no {pipe} path off the die")
    return cap


# -- scalar ---------------------------------------------------------------------------------
def scalar_p(ctx: KernelContext, dst: Region, offset: int, value: Any, dtype: Any,
             name: str = "aclshmem_p") -> Op:
    """aclshmem_<type>_p into HOST_SIDE memory: a scalar store to the translated address and
    a dcci of its line (one slot + `dcache.dcci_ns`); the line travels the host write path
    at `mte.put_gbps`, landing `mte.put_latency_ns` + the path's latency after. quiet waits
    for it (it joins the core's posted write-backs)."""
    host = _host(ctx, dst, name)
    raw = np.asarray(value, dtype=dtype).reshape(1).view(np.uint8).copy()
    ctx._check_gm(host, offset, raw.size, name)
    ctx.scalar(1)
    ctx.t += ctx.cfg.dcache.dcci_ns
    line = int(ctx.cfg.dcache.line_bytes)
    path = write_path(ctx, host)
    latency = ctx.cfg.mte.put_latency_ns + path.latency_ns + _walk(ctx, host, offset, raw.size)

    def effect(t: float) -> None:
        host.write(offset, raw)

    op = _line(ctx, f"{name} {path.kind}", line, path, latency, effect)
    ctx.dcache.writebacks.append(op)
    return op


def scalar_g(ctx: KernelContext, src: Region, offset: int, dtype: Any,
             name: str = "aclshmem_g") -> Wait:
    """aclshmem_<type>_g from HOST_SIDE memory: a scalar load whose line fill crosses the
    host read path (one slot, then `dcache.miss_ns` + the path's round trip + the line at
    `mte.put_gbps`); the core stalls until it lands. Returns the value."""
    host = _host(ctx, src, name)
    item = np.dtype(dtype).itemsize
    ctx._check_gm(host, offset, item, name)
    ctx.scalar(1)
    line = int(ctx.cfg.dcache.line_bytes)
    path = read_path(ctx, host)
    got: list[Any] = []

    def effect(t: float) -> None:
        got.append(host.read(offset, item).view(dtype)[0])

    latency = ctx.cfg.dcache.miss_ns + path.latency_ns + _walk(ctx, host, offset, item)
    op = _line(ctx, f"{name} {path.kind}", line, path, latency, effect)
    yield from ctx.wait(op)
    return got[0]


def _line(ctx: KernelContext, name: str, nbytes: int, path: Path, latency: float,
          effect: Callable[[float], None]) -> Op:
    """One cache line over a host path from the core's clock; `effect(t)` at landing."""
    env = ctx.env
    op = Op(env, name, "scalar")
    op.start_at = ctx.t
    cap = ctx.cfg.mte.put_gbps
    ctx._count(ctx.core.mte3, name, nbytes, path.kind not in ("D2H", "H2D"))

    def done(t: float) -> None:
        effect(t)
        op.complete(t)

    def begin() -> None:
        ctx.machine.net.start(nbytes, cap, path.resources, latency, done)

    if ctx.t > env.now:
        ctx.machine.net.call_at(ctx.t, begin)
    else:
        begin()
    return op


# -- SDMA -----------------------------------------------------------------------------------
class HostSdma(Sdma):
    """aclshmemx_sdma_put_nbi / aclshmemx_sdma_get_nbi of one core between its die's GM and
    a PE's HOST_SIDE memory, posted like runtime.sdma's puts (send flag, SQ tail, one SQE
    per 1 MiB, dcci_entire, doorbell, tail); `quiet` is Sdma's."""

    def put_nbi_host(self, pe: int, dst: Region, dst_offset: int, src: Region,
                     src_offset: int, nbytes: int, name: str = "sdma_put_nbi") -> Wait:
        """`nbytes` of this die's GM `src` into `dst` (a HOST_SIDE tensor of PE `pe`) at
        `dst_offset`: D2H when pe is this PE, D2rH otherwise; one SQE per 1 MiB."""
        yield from self.put_batch_host(pe, dst, src, _split(src_offset, dst_offset, nbytes),
                                       name)

    def get_nbi_host(self, pe: int, dst: Region, dst_offset: int, src: Region,
                     src_offset: int, nbytes: int, name: str = "sdma_get_nbi") -> Wait:
        """`nbytes` of `src` (a HOST_SIDE tensor of PE `pe`) into this die's GM `dst`: H2D
        when pe is this PE, rH2D otherwise; one SQE per 1 MiB."""
        yield from self.get_batch_host(pe, dst, src, _split(src_offset, dst_offset, nbytes),
                                       name)

    def put_batch_host(self, pe: int, dst: Region, src: Region,
                       pieces: list[tuple[int, int, int]], name: str = "sdma_put") -> Wait:
        """One SQE per piece (src offset, dst offset, bytes) from this die's GM `src` into
        PE `pe`'s HOST_SIDE `dst`, behind one doorbell (a batch of descriptors)."""
        yield from self._batch_host(pe, dst, src, pieces, name, put=True)

    def get_batch_host(self, pe: int, dst: Region, src: Region,
                       pieces: list[tuple[int, int, int]], name: str = "sdma_get") -> Wait:
        """One SQE per piece (src offset, dst offset, bytes) from PE `pe`'s HOST_SIDE `src`
        into this die's GM `dst`, behind one doorbell; the copies cross the host read path
        and land in this die's L2 or HBM."""
        yield from self._batch_host(pe, src, dst, pieces, name, put=False)

    def _batch_host(self, pe: int, host_side: Region, gm: Region,
                    pieces: list[tuple[int, int, int]], name: str, put: bool) -> Wait:
        """A batch between this die's GM `gm` and PE `pe`'s HOST_SIDE `host_side`: into the
        host (`put`, the host write path) or out of it (the host read path)."""
        ctx = self.ctx
        host = _host(ctx, host_side, name)
        if host.rank != pe:
            raise ctx.error(f"{name}: {host.name!r} is PE {host.rank}'s, not PE {pe}'s")
        if gm.rank != ctx.rank_id or isinstance(gm, HostRegion):
            end = "source" if put else "destination"
            raise ctx.error(f"{name}: the {end} must be this die's GM")
        die, far = Memory(ctx.rank_id), Memory(pe, True)
        src, dst, a, b = (gm, host, die, far) if put else (host, gm, far, die)
        for so, do, n in pieces:
            ctx._check_gm(src, so, n, name)
            ctx._check_gm(dst, do, n, name)
        kind = (write_path if put else read_path)(ctx, host).kind
        yield from self._post(src, dst, pieces, a, b, kind, f"{name} {kind}")

    def _post(self, src: Region, dst: Region, pieces: list[tuple[int, int, int]],
              a: Memory, b: Memory, kind: str, name: str) -> Wait:
        """runtime.sdma's post sequence for a batch of SQEs from memory `a` to `b`, each on
        its engine path (npusim.hw.copy_path: the host legs hold the engine)."""
        ctx = self.ctx
        yield from self._set_value(0, 1, "sdma send flag")
        self._sq_tail()
        for _ in pieces:
            yield from self._fill_sqe()
        pipe = engine.engine_pipe(ctx.machine, ctx.rank_id, self.engine)
        remote = kind not in ("D2H", "H2D")

        def post(at: float) -> None:
            for so, do, n in pieces:
                via = engine_copy(ctx.machine, ctx.rank_id, a, b, n)
                engine.sqe(ctx.machine, ctx.rank_id, src, so, dst, do, n, at, name,
                           self.engine, core=ctx.core_id, via=via)
                ctx._count(pipe, name, n, remote)

        yield from self._ring(post)
        self.issued += len(pieces)
        yield from ctx.drain()


def _split(src_offset: int, dst_offset: int, nbytes: int) -> list[tuple[int, int, int]]:
    """aclshmemx_sdma_put_nbi's SQEs: one per 1 MiB block (sdma_config_t.block_bytes)."""
    return [(src_offset + off, dst_offset + off, min(BLOCK_BYTES, nbytes - off))
            for off in range(0, nbytes, BLOCK_BYTES)]
