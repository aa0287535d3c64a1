"""HIXL's one-sided transfers, step by step (hicann/hixl src/hixl/fabric_mem, src/hixl/cs).

A pair is an initiator (the local process, on one die) and a target (the remote process)
whose memory, device GM or host DRAM, the initiator's die reaches by address: FabricMem
imports the target's VMM handle (aclrtMemImportFromShareableHandleV2); hixl_cs over HCCS
does the same through its channel. A direction names both sides: D2rD writes local GM into
the remote GM, rH2D reads the remote host into local GM, H2rH writes local host memory
into the remote host, and so on. Every byte is moved by the initiator's die's SDMA engine
(npusim.hw.copy_path: which memories a copy crosses and how long it holds the engine), or
over RoCE by its NIC (below).

One transfer is one TransferSync of a list of descriptors (the benchmark's: `total_bytes`
in `block_bytes` blocks; the article's: a KV block's layers x {latent, rope}). How it
reaches the engine:

* AICPU expansion (FabricMem's default, and hixl_cs): the descriptors go out in AICPU
  kernels of KERNEL_DESCS on one stream (fabric_mem_aicpu_dispatcher.cc). A kernel costs
  `aicpu.kernel_ns`, writes one SQE per descriptor (`aicpu.sqe_ns` each) and moves the
  RTSQ tail once, at its end. Once NOTIFY_SQES SQEs have gone out since the last wait, and
  after the last kernel, the kernel polls the CQ until its SQEs have completed and records
  the notify the host waits on: the next kernel starts after that.
* Host expansion (FabricMem, `task_stream_num` 4): the host thread calls aclrtMemcpyAsync
  once per descriptor (`host.memcpy_async_ns` each), round robin over HOST_STREAMS streams;
  a stream runs its copies one after another; the call returns once every stream is
  synchronised (fabric_mem_host_transfer_service.cc).

Over RoCE (hixl_cs or the communicator with HCCL_INTRA_ROCE_ENABLE: the device NIC),
each descriptor is one WQE on the initiator die's NIC send queue (npusim.hw.rdma), posted
by the same AICPU expansion (HcommBatchTransferOnThread in kernels of 128, a notify wait
every 1920): a WRITE for put, a READ for get, between the two memories through both dies'
NIC ports (rdma.memory_path), never through the SDMA engine or the HCCS links.

The AICPU expansion runs on AICPU 0 of the initiator's die; host expansion's host thread
is drawn on the same lane (it is no device core). Each transfer is framed
(`transfer<i>`) for the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from npusim.hw import rdma as nic
from npusim.hw import sdma as engine
from npusim.hw.copy_path import Memory, counted, engine_copy
from npusim.runtime import hostmem
from npusim.runtime.acl_stream import Stream, memcpy_async

SQE_MAX = (4 << 30) - 1  # one descriptor, one SQE, up to 4 GiB - 1
KERNEL_DESCS = 128  # descriptors per AICPU kernel (fabric_mem_aicpu_dispatcher.cc)
NOTIFY_SQES = 1920  # SQEs between two notify waits (fabric_mem_aicpu_types.h)
HOST_STREAMS = 4  # host expansion's streams in the published table (task_stream_num)

# a direction: the op (put writes the remote side, get reads it), local and remote memory
PATHS: dict[str, tuple[str, str, str]] = {
    "D2rD": ("put", "D", "D"), "rD2D": ("get", "D", "D"),
    "D2rH": ("put", "D", "H"), "rH2D": ("get", "D", "H"),
    "H2rH": ("put", "H", "H"), "rH2H": ("get", "H", "H"),
    "H2rD": ("put", "H", "D"), "rD2H": ("get", "H", "D"),
}


def resolve(path: str, op: str) -> str:
    """`workload.path` for op put or get: auto is D2rH for put, rH2D for get."""
    return path if path != "auto" else ("D2rH" if op == "put" else "rH2D")


@dataclass(frozen=True)
class HixlTiling:
    pairs: int
    layers: int
    k_bytes: int  # per layer: the latent (nope) part of a KV block
    v_bytes: int  # per layer: the rope part
    transfers: int
    dies: int  # per server
    hw: Any = None
    path: str = "auto"  # resolved per op (of)
    expansion: str = "aicpu"
    servers: int = 2
    transport: str = "fabric_mem"
    block_bytes: int = 0  # 0: the KV-block form
    total_bytes: int = 128 << 20

    def of(self, op: str) -> HixlTiling:
        """This tiling with its path resolved for op put or get."""
        return replace(self, path=resolve(self.path, op))

    @property
    def op(self) -> str:
        return PATHS[self.path][0]

    @property
    def local_host(self) -> bool:
        return PATHS[self.path][1] == "H"

    @property
    def remote_host(self) -> bool:
        return PATHS[self.path][2] == "H"

    @property
    def world(self) -> int:
        return 2 * self.pairs if self.servers == 1 else self.dies + self.pairs

    @property
    def cores(self) -> int:
        return 1

    @property
    def nbytes(self) -> int:
        """Bytes one transfer moves (each side's buffer)."""
        if self.block_bytes:
            return self.total_bytes
        return self.layers * (self.k_bytes + self.v_bytes)

    def pieces(self) -> list[tuple[int, int, int]]:
        """The descriptors (offset, offset, bytes), each at its own offset of a contiguous
        buffer on both sides: `block_bytes` blocks of the total, or the KV block layer by
        layer, latent then rope; none above SQE_MAX."""
        if self.block_bytes:
            sizes: Iterator[int] = (min(self.block_bytes, self.total_bytes - at)
                                    for at in range(0, self.total_bytes, self.block_bytes))
        else:
            sizes = (n for _ in range(self.layers) for n in (self.k_bytes, self.v_bytes) if n)
        out, at = [], 0
        for n in sizes:
            for off in range(0, n, SQE_MAX):
                part = min(SQE_MAX, n - off)
                out.append((at, at, part))
                at += part
        return out

    def local_of(self, pair: int) -> int:
        """The initiator's die of pair `pair`: server 0's die i, or on one server the odd
        die of package i (the benchmark's initiator is device 1, its target device 0)."""
        return 2 * pair + 1 if self.servers == 1 else pair

    def target_of(self, pair: int) -> int:
        return 2 * pair if self.servers == 1 else self.dies + pair

    def remote_of(self, rank: int) -> int | None:
        """The target PE of initiator die `rank` (None: not an initiator)."""
        for pair in range(self.pairs):
            if self.local_of(pair) == rank:
                return self.target_of(pair)
        return None

    def is_target(self, rank: int) -> bool:
        return any(self.target_of(p) == rank for p in range(self.pairs))


def _buffers(ctx: Any, t: HixlTiling, remote: int) -> tuple[Any, Any, Memory, Memory]:
    """(source region, destination region, their memories) of this initiator's transfer."""
    local = hostmem.host_tensor(ctx, "kv") if t.local_host else ctx.tensor("kv")
    far = (hostmem.host_tensor(ctx, "remote_kv", remote) if t.remote_host
           else ctx.machine.ranks[remote].tensors["remote_kv"])
    mine, theirs = Memory(ctx.rank_id, t.local_host), Memory(remote, t.remote_host)
    if t.op == "put":
        return local, far, mine, theirs
    return far, local, theirs, mine


def _sqe(ctx: Any, src: Any, dst: Any, a: Memory, b: Memory, piece: tuple[int, int, int],
         at: float, name: str) -> Any:
    """One SQE the AICPU wrote, at the engine from `at` (the kernel's tail write)."""
    so, do, n = piece
    via = engine_copy(ctx.machine, ctx.rank_id, a, b, n)
    return engine.sqe(ctx.machine, ctx.rank_id, src, so, dst, do, n, at, name, 0,
                      core=ctx.core_id, via=via, count=counted(a, b))


def _wqe(ctx: Any, src: Any, dst: Any, a: Memory, b: Memory, piece: tuple[int, int, int],
         at: float, name: str) -> Any:
    """One WQE the AICPU wrote, on the NIC's send queue from `at` (the kernel's doorbell)."""
    so, do, n = piece
    via = nic.memory_path(ctx.machine, ctx.rank_id, a, b, n)
    return nic.post_send(ctx.machine, ctx.rank_id, src, so, dst, do, n, at, name,
                         core=ctx.core_id, via=via)


def aicpu_transfer(ctx: Any, t: HixlTiling, src: Any, dst: Any, a: Memory, b: Memory,
                   pieces: list[tuple[int, int, int]], name: str) -> Iterator[Any]:
    """One TransferSync in AICPU expansion: kernels of KERNEL_DESCS SQEs (WQEs over
    RoCE), a notify wait every NOTIFY_SQES and after the last."""
    cpu = ctx.cfg.aicpu
    post = _wqe if t.transport == "roce" else _sqe
    pending: list[Any] = []
    since = 0
    for first in range(0, len(pieces), KERNEL_DESCS):
        batch = pieces[first:first + KERNEL_DESCS]
        ctx.t += cpu.kernel_ns + cpu.sqe_ns * len(batch)
        pending += [post(ctx, src, dst, a, b, p, ctx.t, name) for p in batch]
        since += len(batch)
        if since >= NOTIFY_SQES or first + KERNEL_DESCS >= len(pieces):
            yield from ctx.wait(*pending)
            pending, since = [], 0


def host_transfer(ctx: Any, t: HixlTiling, src: Any, dst: Any, a: Memory, b: Memory,
                  pieces: list[tuple[int, int, int]], name: str) -> Iterator[Any]:
    """One TransferSync in host expansion: an aclrtMemcpyAsync per descriptor, round robin
    over HOST_STREAMS streams (stream s on engine s), then every stream synchronised."""
    engines = ctx.cfg.sdma.engines
    streams = [Stream(s % engines) for s in range(HOST_STREAMS)]
    for i, (so, do, n) in enumerate(pieces):
        memcpy_async(ctx, streams[i % HOST_STREAMS], src, so, dst, do, n, a, b, name)
    for stream in streams:
        yield from stream.synchronize(ctx)


def transfer_program(t: HixlTiling, op: str) -> Callable[[Any], Any]:
    """The initiator's program for op put or get (the path's direction)."""
    pieces = t.pieces()
    run = aicpu_transfer if t.expansion == "aicpu" else host_transfer
    name = f"hixl_{t.path}"

    def program(ctx: Any) -> Any:
        remote = t.remote_of(ctx.rank_id)
        if remote is None or ctx.core_id:
            return
        src, dst, a, b = _buffers(ctx, t, remote)
        with ctx.phase(op):
            for i in range(t.transfers):
                ctx.prof_start(f"transfer{i}")
                yield from run(ctx, t, src, dst, a, b, pieces, name)
                ctx.prof_end(f"transfer{i}")
    return program
