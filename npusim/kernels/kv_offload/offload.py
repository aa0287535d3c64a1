"""Prefill's per-layer offload (modeling_deepseek.py, the prefill branch of the attention
prolog with enable_offload): after a layer's MLA prolog has written the layer's KV cache
into the device-side temp cache (offload_cache.temp_kv_cache, one layer's worth), the
d2h stream waits on an event and copies it into the layer's full cache in host memory,
`nope_cache_dst.copy_(nope_cache_src, non_blocking=True)` and the rope cache likewise
(no rope with the int8 cache): the whole temp cache, contiguous when prefill runs
without context parallelism. The layer's last op waits on the copy's event.

A copy_ between two device-addressed tensors is a memcpy task the die's SDMA engine
executes; npusim posts it as SDMA copies from one AIV core (HostSdma.put_nbi_host: one
SQE per 1 MiB, D2H over the die's host write path, npusim.hw.host), the closest path it
has. What posting from the runtime rather than from a core changes (a few us of SQ
writes) is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npusim.kernels.kv_offload.tiling import KvTiling
from npusim.runtime import hostmem

SDMA_UB = 64  # the staging buffer HostSdma needs


def offload_program(t: KvTiling) -> Callable[[Any], Any]:
    rows = t.f_blocks * t.block

    def program(ctx: Any) -> Any:
        if ctx.core_id:
            return
        sdma = hostmem.HostSdma(ctx, ctx.alloc("sdma_tmp", SDMA_UB))
        with ctx.phase("offload"):
            for src, dst, n in (("layer_kv_cache", "full_kv_cache", t.kv_bytes),
                                ("layer_k_rope", "full_k_rope", t.rope_bytes)):
                if not n:
                    continue
                host = hostmem.host_tensor(ctx, dst)
                yield from sdma.put_nbi_host(ctx.rank_id, host, 0, ctx.tensor(src), 0,
                                             rows * n, name="copy_ D2H")
            yield from sdma.quiet()
    return program
