"""The scalar unit's data cache: scalar GM loads and stores, and DataCacheCleanAndInvalid.

A kernel that reads or writes GM element by element (SHMEM's classic MoE kernels compact
and reduce that way) goes through the core's data cache, one line (`dcache.line_bytes`)
at a time. The cost model (values in the preset's `dcache` section, docs/model.md):

- a load costs one issue slot; a line not in the cache adds its fill, `dcache.miss_ns`,
  with the scalar unit stalled;
- a store costs one issue slot. It allocates its line without a fill (the line is
  written back with byte enables, so the stored bytes are all that travel). A store to
  this rank's GM is applied at once: the core sees its own stores, and other cores read
  them only after a barrier or quiet that cleans the cache first. Stores to another
  rank's memory are made only through `store_line` (SHMEM's signal_op);
- `dcci_line` (DataCacheCleanAndInvalid of one line) costs `dcache.dcci_ns`; a dirty
  line of a signal is then written back as a transfer of one line over the path a put
  to its rank takes (posted: the scalar unit goes on);
- `dcci_entire` costs `dcache.dcci_entire_ns` and empties the cache; it returns once the
  core's posted write-backs have landed (a clean completes its writes).

The cache holds every line it filled until a dcci drops it (no capacity model: the
kernels modelled read each line once between cleans).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.hw.memory import Region, SparseRegion
from npusim.hw.pipe import Op


class DataCache:
    """One core's data cache (ctx.dcache)."""

    def __init__(self, ctx: Any) -> None:
        # the KernelContext that owns this cache (npusim.runtime.context builds it, so this
        # module knows it only by what it calls: clock, checks, trace, routes)
        self.ctx = ctx
        cfg = ctx.cfg.dcache
        self.cfg = cfg
        self.shift = int(cfg.line_bytes).bit_length() - 1
        self.lines: set[tuple[int, int]] = set()
        self.writebacks: list[Op] = []  # posted line write-backs not yet known to have landed

    def _line(self, region: Region, offset: int) -> tuple[int, int]:
        return id(region), offset >> self.shift

    def load(self, region: Region, offset: int, dtype: Any) -> Any:
        """A scalar GM load (GetValue / a __gm__ pointer read): one slot, plus a line fill
        on a miss. The value is GM's at the call."""
        ctx = self.ctx
        item = np.dtype(dtype).itemsize
        ctx._check_gm(region, offset, item, "scalar GM load")
        line = self._line(region, offset)
        if line in self.lines:
            ctx.scalar(1)
        else:
            self.lines.add(line)
            start = ctx.t
            ctx.t += ctx.issue_ns + self.cfg.miss_ns
            ctx.trace.activity(ctx.rank_id, ctx.core_id, "scalar", "gm_read_scalar", start,
                               ctx.t)
        return region.read(offset, item).view(dtype)[0]

    def store(self, region: Region, offset: int, value: Any, dtype: Any) -> None:
        """A scalar GM store into this rank's memory (SetValue / a __gm__ pointer write):
        one slot, the line allocated without a fill."""
        self.store_run(region, offset, np.asarray(value, dtype=dtype).reshape(1))
        self.lines.add(self._line(region, offset))

    def load_run(self, region: Region, offset: int, count: int, dtype: Any) -> np.ndarray:
        """`count` scalar loads of consecutive elements (an element loop's loads, costed as
        one by one): a slot each, plus a fill for every line not yet cached."""
        ctx = self.ctx
        dt = np.dtype(dtype)
        nbytes = count * dt.itemsize
        ctx._check_gm(region, offset, nbytes, "scalar GM load")
        if count <= 0:
            return np.zeros(0, dt)
        rid = id(region)
        lines = self.lines
        fills = 0
        for ln in range(offset >> self.shift, ((offset + nbytes - 1) >> self.shift) + 1):
            if (rid, ln) not in lines:
                lines.add((rid, ln))
                fills += 1
        ctx.scalar(count - fills)
        start = ctx.t
        ctx.t += fills * (ctx.issue_ns + self.cfg.miss_ns)
        if fills:
            ctx.trace.activity(ctx.rank_id, ctx.core_id, "scalar", "gm_read_scalar", start,
                               ctx.t)
        return region.read(offset, nbytes).view(dt)

    def store_run(self, region: Region, offset: int, values: np.ndarray) -> None:
        """Scalar stores of consecutive elements (an element loop's stores): a slot each."""
        ctx = self.ctx
        raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
        ctx._check_gm(region, offset, raw.size, "scalar GM store")
        if region.rank != ctx.rank_id:
            raise ctx.error(f"scalar store into rank {region.rank}'s {region.name!r}: another "
                            "rank's memory is written through signal_op (a store and a "
                            "dcci of its line)", address=offset, size=raw.size)
        self._zone(region, offset, raw.size, "scalar GM store")
        ctx.scalar(np.asarray(values).size)
        region.write(offset, raw)

    def store_line(self, pe: int, region: Region, offset: int, value: Any, dtype: Any,
                   name: str = "signal") -> Op:
        """A scalar store into rank `pe`'s `region` followed by a dcci of its line: one slot,
        `dcache.dcci_ns`, then the stored bytes travel as a one-line transfer over the
        path of a put to `pe` (its own rank: the HBM), landing when it completes."""
        ctx = self.ctx
        raw = np.asarray(value, dtype=dtype).reshape(1).view(np.uint8).copy()
        ctx._check_gm(region, offset, raw.size, name)
        self._zone(region, offset, raw.size, name)
        ctx.scalar(1)
        start = ctx.t
        ctx.t += self.cfg.dcci_ns
        ctx.trace.activity(ctx.rank_id, ctx.core_id, "scalar", "dcci_cacheline", start, ctx.t)
        self.lines.discard(self._line(region, offset))
        line = int(self.cfg.line_bytes)
        route = ctx.route(pe)  # the line lands with the put's path and latency (no response)
        cap, latency = route.cap_gbps, route.latency_ns
        path = (*route.path, *ctx.machine.ranks[pe].write_path(line))
        if pe != ctx.rank_id:
            ctx.bytes_put += line
            ctx.rank.bytes_out += line
            ctx.machine.ranks[pe].bytes_in += line
        env = ctx.env
        op = Op(env, name, "scalar")
        op.start_at = ctx.t
        self.writebacks.append(op)

        def done(t: float) -> None:
            region.write(offset, raw)
            op.complete(t)

        def begin() -> None:
            ctx.machine.net.start(line, cap, path, latency, done)

        if ctx.t > env.now:
            ctx.machine.net.call_at(ctx.t, begin)
        else:
            begin()
        return op

    def dcci_line(self, region: Region, offset: int) -> None:
        """DataCacheCleanAndInvalid of one line: `dcache.dcci_ns`; the next load misses."""
        ctx = self.ctx
        offset = ctx._whole(offset, "dcci_line", "offset")
        start = ctx.t
        ctx.t += self.cfg.dcci_ns
        ctx.trace.activity(ctx.rank_id, ctx.core_id, "scalar", "dcci_cacheline", start, ctx.t)
        self.lines.discard(self._line(region, offset))

    def dcci_entire(self) -> Generator[Any, Any, None]:
        """DataCacheCleanAndInvalid of the entire cache: `dcache.dcci_entire_ns`, every
        line dropped, and a wait until the core's posted write-backs have landed."""
        ctx = self.ctx
        start = ctx.t
        ctx.t += self.cfg.dcci_entire_ns
        ctx.trace.activity(ctx.rank_id, ctx.core_id, "scalar", "dcci_entire_cache", start,
                           ctx.t)
        self.lines.clear()
        pending, self.writebacks = self.writebacks, []
        yield from ctx.wait(*pending)

    def _zone(self, region: Region, offset: int, nbytes: int, what: str) -> None:
        if isinstance(region, SparseRegion):
            problem = region.zone_problem(offset, nbytes)
            if problem:
                raise self.ctx.error(f"{what} of {nbytes} B to the window of rank "
                                     f"{region.rank} {problem}", address=offset, size=nbytes)
