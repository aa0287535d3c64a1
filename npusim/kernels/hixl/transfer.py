"""HIXL's FabricMem transfer, step by step (hicann/hixl src/hixl/fabric_mem).

A pair is a local die on server 0 and a remote process on server 1 whose host memory was
exported and imported into the local process's page tables (aclrtMemExportToShareable-
HandleV2 / ...ImportFromShareableHandleV2), so the local die's SDMA engine reads and writes
it (NPU -> L1 UB switch -> L2 -> remote L1 -> CPU -> DDR). In AICPU expansion
(fabric_mem_aicpu_dispatcher.cc) one descriptor is one SQE (up to 4 GiB - 1) and the
AICPU kernel writes them into the RTSQ, then waits for them (NotifyRecord). A KV block
of DeepSeek-R1 is 61 layers x (128 KiB latent + 16 KiB rope): 122 descriptors.

Per transfer the pair's poster (AIV 0 of the local die, standing in for the AICPU: the
SQE writes and the doorbell cost what runtime.sdma's do) posts every descriptor of the
block behind one doorbell and waits with a flag SQE (sdma quiet). The article times 100
transfers and drops the first (its link set-up); each transfer here is framed
(`transfer<i>`) for the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npusim.runtime import hostmem

SQE_MAX = (4 << 30) - 1  # one descriptor, one SQE, up to 4 GiB - 1


@dataclass(frozen=True)
class HixlTiling:
    pairs: int
    layers: int
    k_bytes: int  # per layer: the latent (nope) part of the block
    v_bytes: int  # per layer: the rope part
    transfers: int
    remote_first: int  # the first remote die (server 1's die 0)
    hw: Any = None

    @property
    def world(self) -> int:
        return self.remote_first + self.pairs

    @property
    def cores(self) -> int:
        return 1

    @property
    def block_bytes(self) -> int:
        return self.layers * (self.k_bytes + self.v_bytes)

    def pieces(self) -> list[tuple[int, int, int]]:
        """The block's descriptors (offset, offset, bytes): layer by layer, latent then rope,
        each at its own offset of a contiguous buffer on both sides."""
        out = []
        at = 0
        for _ in range(self.layers):
            for n in (self.k_bytes, self.v_bytes):
                if n:
                    out.append((at, at, n))
                    at += n
        return out

    def remote_of(self, rank: int) -> int | None:
        """The remote PE of local die `rank` (None: not a local die of a pair)."""
        return self.remote_first + rank if rank < self.pairs else None


def transfer_program(t: HixlTiling, direction: str) -> Callable[[Any], Any]:
    """direction: put (D2rH, the local block into the remote host) or get (rH2D)."""
    pieces = t.pieces()

    def program(ctx: Any) -> Any:
        remote = t.remote_of(ctx.rank_id)
        if remote is None or ctx.core_id:
            return
        sdma = hostmem.HostSdma(ctx, ctx.alloc("sdma_tmp", 64))
        kv = ctx.tensor("kv")
        host = hostmem.host_tensor(ctx, "remote_kv", remote)
        with ctx.phase(direction):
            for i in range(t.transfers):
                ctx.prof_start(f"transfer{i}")
                if direction == "put":
                    yield from sdma.put_batch_host(remote, host, kv, pieces, "hixl_put")
                else:
                    yield from sdma.get_batch_host(remote, kv, host, pieces, "hixl_get")
                yield from sdma.quiet()
                ctx.prof_end(f"transfer{i}")
    return program
