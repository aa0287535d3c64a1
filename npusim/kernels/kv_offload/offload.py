"""Prefill's per-layer offload (modeling_deepseek.py, the prefill branch of the attention
prolog with enable_offload): after a layer's MLA prolog has written the layer's KV cache
into the device-side temp cache (offload_cache.temp_kv_cache, one layer's worth), the
d2h stream waits on an event and copies it into the layer's full cache in host memory,
`nope_cache_dst.copy_(nope_cache_src, non_blocking=True)` and the rope cache likewise
(no rope with the int8 cache): the whole temp cache, contiguous when prefill runs
without context parallelism. The layer's last op waits on the copy's event.

A non-blocking copy_ between two device-addressed tensors is an aclrtMemcpyAsync the
host thread puts on the current stream (the d2h stream), which the die's SDMA engine
executes: npusim.runtime.acl_stream.memcpy_async per tensor on one Stream (the host's
call, then one SQE D2H over the die's host write path, npusim.hw.host), then
Stream.synchronize for the layer's wait on the copy's event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npusim.hw.copy_path import Memory
from npusim.kernels.kv_offload.tiling import KvTiling
from npusim.runtime import hostmem
from npusim.runtime.acl_stream import Stream, memcpy_async


def offload_program(t: KvTiling) -> Callable[[Any], Any]:
    rows = t.f_blocks * t.block

    def program(ctx: Any) -> Any:
        if ctx.core_id:
            return
        d2h = Stream()
        device, host = Memory(ctx.rank_id), Memory(ctx.rank_id, host=True)
        with ctx.phase("offload"):
            for src, dst, n in (("layer_kv_cache", "full_kv_cache", t.kv_bytes),
                                ("layer_k_rope", "full_k_rope", t.rope_bytes)):
                if not n:
                    continue
                region = hostmem.host_tensor(ctx, dst, huge_pages=t.huge_pages)
                memcpy_async(ctx, d2h, ctx.tensor(src), 0, region, 0, rows * n, device,
                             host, name="copy_ D2H")
            yield from d2h.synchronize(ctx)
    return program
