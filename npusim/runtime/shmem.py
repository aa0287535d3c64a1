"""The SHMEM device API of one AIV core, as hicann/shmem's MoE examples call it.

Kernels reach it as ``ctx.shmem``; every call is made of the modelled units below it, so
its cost comes from the preset (docs/authoring.md has the table, docs/model.md the model):

    aclshmemx_mte_put_nbi(gm -> gm)   shmem.mte_put_nbi(pe, dst, src, src_offset, n, buf, ub)
    aclshmemx_mte_put_nbi(ub -> gm)   shmem.put_ub(pe, dst, buf, n)
    aclshmemx_signal_op(SET)          shmem.signal_op(pe, offset, value)
    aclshmem_signal_wait_until        yield from shmem.signal_wait_until(offset, "eq", value)
    aclshmem_quiet / aclshmem_fence   yield from shmem.quiet()
    aclshmemi_barrier_core_soft       yield from shmem.barrier_core_soft()
    aclshmem_ptr(ptr, pe)             shmem.ptr(tensor, pe) -> (rank pe's window, offset)
    aclshmem_barrier_all              yield from shmem.barrier_all(sync_offset)

Addresses are byte offsets into a region, by default the symmetric window (the SHMEM
heap); ``aclshmem_ptr(addr, pe)`` is the same offset in rank pe's window. A second family
(hicann/shmem's doubleplane kernels) reuses these calls and adds its own engine beside
them; nothing here knows of dispatch or combine.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.hw.memory import Region
from npusim.hw.pipe import Op
from npusim.hw.ub import UBBuffer
from npusim.runtime.conditions import Condition, Wait
from npusim.runtime.poll import Poll

# ACLSHMEM_CMP_EQ .. LE: signal_wait_until waits while the comparison is false
CMP: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "ge": operator.ge,
    "lt": operator.lt, "le": operator.le}
CMP_TEXT = {"eq": "==", "ne": "!=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}

# ACLSHMEM_BARRIER_TG_DISSEM_KVAL: the cores barrier_npu_v3 spreads the PEs over
BARRIER_TG_DISSEM_KVAL = 8
LOG_MAX_AIV_PER_NPU = 6  # ACLSHMEM_LOG_MAX_AIV_PER_NPU: sync slots per core (rounds)
# ACLSHMEM_MAX_AIV_PER_NPU (include/host_device/shmem_common_types.h): the cores the core
# sync pool (ACLSHMEM_CORE_SYNC_POOL_SIZE) has rows for, so the cores a kernel may
# barrier_core_soft over
MAX_AIV_PER_NPU = 48
CORE_SYNC_POOL = "shmem.core_sync_pool"  # the rank's core_sync_pool + core_sync_counter


class Signal(Condition):
    """One signal element compared with a value (ACLSHMEM_CMP_*); `accept` lists values
    that also end the wait (the barrier's 'peer already in the next barrier')."""

    def __init__(self, dtype: Any, cmp: str, value: int, accept: tuple[int, ...] = ()) -> None:
        if cmp not in CMP:
            raise ValueError(f"signal comparison {cmp!r}; allowed: {', '.join(CMP)}")
        self.dtype = np.dtype(dtype)
        self.cmp = cmp
        self.value = value
        self.accept = accept

    def current(self, data: np.ndarray) -> Any:
        return data[:self.dtype.itemsize].view(self.dtype)[0]

    def __call__(self, data: np.ndarray) -> bool:
        v = self.current(data)
        return bool(CMP[self.cmp](v, self.value)) or v in self.accept

    def describe(self, data: np.ndarray) -> str:
        also = f" (or one of {list(self.accept)})" if self.accept else ""
        return (f"expects the {self.dtype.name} signal {CMP_TEXT[self.cmp]} {self.value}"
                f"{also}; it is {self.current(data)}")


def chunks(nbytes: int, ub_size: int, itemsize: int = 1) -> list[tuple[int, int]]:
    """mte_put_nbi's serial chunks (offset, bytes): blocks of ub_size rounded down to
    whole elements, then the remainder."""
    block = ub_size // itemsize * itemsize
    if block <= 0:
        raise ValueError(f"ub_size {ub_size} B holds no element of {itemsize} B")
    full, rest = divmod(nbytes, block)
    out = [(i * block, block) for i in range(full)]
    if rest:
        out.append((full * block, rest))
    return out


def dissemination_rounds(cores: int) -> int:
    """barrier_core_soft's rounds over `cores` blocks: shift 1, 2, 4, ... below cores."""
    return math.ceil(math.log2(cores)) if cores > 1 else 0


class Shmem:
    """The aclshmem device calls of one core (ctx.shmem)."""

    def __init__(self, ctx: Any) -> None:
        # the KernelContext whose `shmem` this is (npusim.runtime.context builds it on first
        # use, so this module knows it only by the calls it makes on it)
        self.ctx = ctx

    @property
    def my_pe(self) -> int:
        return self.ctx.rank_id

    @property
    def n_pes(self) -> int:
        return self.ctx.world

    # -- RMA ----------------------------------------------------------------------------
    def mte_put_nbi(self, pe: int, dst_offset: int, src: Region, src_offset: int,
                    nbytes: int, buf: UBBuffer, ub_size: int, itemsize: int = 1,
                    name: str = "mte_put_nbi") -> Wait:
        """aclshmemx_mte_put_nbi GM -> remote GM (shmem_device_mte.hpp): serial chunks of
        at most `ub_size` bytes through `buf`, each an MTE2 copy into UB, SetFlag/WaitFlag
        <MTE2_MTE3>, an MTE3 put into rank `pe`'s window and, before the next chunk,
        SetFlag/WaitFlag<MTE3_MTE2>. The last chunk's put is left in flight (the caller's
        quiet waits for it); returns its Op."""
        ctx = self.ctx
        last: Op | None = None
        if ctx._whole(nbytes, name, "nbytes") < 1:  # it returns the last chunk's put
            raise ctx._refused(name, "nbytes", nbytes, "a whole number >= 1")
        item = ctx._whole(itemsize, name, "itemsize")
        if ctx._whole(ub_size, name, "ub_size") < max(item, 1):
            raise ctx._refused(name, "ub_size", ub_size, f"at least one element ({item} B)")
        parts = chunks(nbytes, ub_size, item)
        if buf.nbytes < parts[0][1]:
            raise ctx.error(f"{name}: chunks of {parts[0][1]} B do not fit UB buffer "
                            f"{buf.name!r} ({buf.nbytes} B)", address=buf.offset)
        for off, n in parts:
            if last is not None:
                yield from ctx.wait(last)  # WaitFlag<MTE3_MTE2>: UB free again
            load = ctx.copy_in(buf, src, src_offset + off, n, name=f"{name} gm->ub")
            yield from ctx.wait(load)  # WaitFlag<MTE2_MTE3>
            last = ctx.put(pe, dst_offset + off, buf, n, name=name)
        assert last is not None
        return last

    def put_ub(self, pe: int, dst_offset: int, buf: UBBuffer, nbytes: int,
               src_offset: int = 0, name: str = "mte_put_nbi ub") -> Op:
        """aclshmemx_mte_put_nbi UB -> remote GM: one MTE3 put, not waited for."""
        return self.ctx.put(pe, dst_offset, buf, nbytes, src_offset, name=name)

    def ptr(self, tensor: str | Region, pe: int) -> tuple[Region, int]:
        """aclshmem_ptr(ptr, pe) onto a symmetric heap tensor (npusim.runtime.symmetric):
        address arithmetic only, p2p_device_heap_base[pe] + (ptr - heap_base), two scalar
        slots (the base's load, the add); no data moves and the peer is not checked.
        Returns rank pe's window and the tensor's offset in it: copy_in from there is a
        remote pull, put to pe there a remote write."""
        ctx = self.ctx
        t = ctx.tensor(tensor) if isinstance(tensor, str) else tensor
        offset = getattr(t, "heap_offset", None)
        if offset is None:
            raise ctx.error(f"aclshmem_ptr of {t.name!r}: not a symmetric heap tensor "
                            "(shmem_malloc'd); its address on another PE would be garbage")
        ctx.scalar(2)
        return ctx.window(pe), offset

    # -- signals ------------------------------------------------------------------------
    def signal_op(self, pe: int, offset: int, value: int, op: str = "set",
                  region: Region | None = None, dtype: Any = np.int32) -> Op:
        """aclshmemx_signal_op(sig_addr, value, ACLSHMEM_SIGNAL_SET, pe) over MTE transport
        (shmem_device_so.hpp aclshmemi_signal_set): a scalar store to aclshmem_ptr(sig, pe)
        and a dcci of its line; the value lands when the line's write-back arrives.
        Returns the write-back (quiet waits for it)."""
        if op != "set":
            raise self.ctx.error(f"signal_op {op!r} is not modelled; allowed: set")
        dst = self.ctx.window(pe) if region is None else region
        return self.ctx.dcache.store_line(pe, dst, offset, value, dtype, "signal_op")

    def signal_wait_until(self, offset: int, cmp: str, value: int,
                          region: Region | None = None, dtype: Any = np.int32,
                          accept: tuple[int, ...] = (), name: str = "signal_wait_until"
                          ) -> Wait:
        """aclshmem_signal_wait_until on this rank's memory (shmem_device_p2p_sync.hpp):
        loop { dcci_cacheline; load; compare }. Event driven: each iteration costs
        `dcache.dcci_ns` + a line fill (`dcache.miss_ns`) + a compare slot +
        `sync.poll_cycles`, and the wait ends at the first iteration whose load comes after
        the signal holds. Returns the value read."""
        ctx = self.ctx
        reg = ctx.window() if region is None else region
        cond = Signal(dtype, cmp, value, accept)
        item = cond.dtype.itemsize
        d = ctx.cfg.dcache
        poll = Poll(reg, offset, cond, None, item, read_ns=d.dcci_ns + d.miss_ns,
                    check_ns=ctx.issue_ns)
        yield from ctx.poll_round_robin([poll], 0, name)
        ctx.dcache.lines.add(ctx.dcache._line(reg, offset))
        return cond.current(reg.read(offset, item))

    # -- ordering -----------------------------------------------------------------------
    def quiet(self) -> Wait:
        """aclshmem_quiet (= aclshmem_fence, shmem_device_mo.hpp): PipeBarrier<PIPE_ALL>,
        then dcci_entire_cache, which returns once this core's signal write-backs landed."""
        yield from self.ctx.drain()
        yield from self.ctx.dcache.dcci_entire()

    fence = quiet

    # -- barriers -----------------------------------------------------------------------
    def _pool(self) -> Region:
        ctx = self.ctx
        cores = ctx.core.kind.count(ctx.cfg)
        line = int(ctx.cfg.dcache.line_bytes)
        return ctx.rank.workspace(CORE_SYNC_POOL, (cores * LOG_MAX_AIV_PER_NPU + 1) * line)

    def barrier_core_soft(self) -> Wait:
        """aclshmemi_barrier_core_soft (shmemi_device_cc.h): a dissemination barrier of the
        launched cores on GM flags, one 64 B sync slot per (core, round). count = the sync
        counter + 1; in round i core c signals core (c + 2^i) mod n (signal_set: store +
        dcci) and waits for its own slot to read count (or count + 1); ceil(log2 n) rounds;
        then the counter is stored."""
        ctx = self.ctx
        n = ctx.num_cores
        rounds = dissemination_rounds(n)
        if rounds > LOG_MAX_AIV_PER_NPU:
            raise ctx.error(f"barrier_core_soft over {n} cores needs {rounds} rounds; SHMEM "
                            f"keeps {LOG_MAX_AIV_PER_NPU} sync slots per core (at most "
                            f"{1 << LOG_MAX_AIV_PER_NPU} cores)")
        pool = self._pool()
        line = int(ctx.cfg.dcache.line_bytes)
        counter = pool.nbytes - line
        count = int(ctx.gm_read_scalar(pool, counter, np.int32)) + 1
        c = ctx.core_id
        shift, rnd = 1, 0
        while shift < n:
            nxt = (c + shift) % n
            ctx.dcache.store_line(ctx.rank_id, pool, (nxt * LOG_MAX_AIV_PER_NPU + rnd) * line,
                                  count, np.int32, "barrier signal")
            yield from self.signal_wait_until((c * LOG_MAX_AIV_PER_NPU + rnd) * line, "eq",
                                              count, region=pool, accept=(count + 1,),
                                              name="barrier_core_soft")
            shift *= 2
            rnd += 1
        ctx.gm_write_scalar(pool, counter, count, np.int32)

    def barrier_all(self, sync_offset: int, name: str = "shmem_barrier_all") -> Wait:
        """aclshmem_barrier_all = aclshmemi_barrier<false>(ACLSHMEM_TEAM_WORLD)
        (aclshmem_device_cc.hpp): barrier_core, barrier_npu_v3, barrier_core. On an AIV-only
        kernel barrier_core is barrier_core_soft. No quiet inside: puts still in flight are
        the caller's to complete first (a SyncAll<true> before it waits for none either).
        `sync_offset`: the WORLD team's sync_array line in the window, its sync_counter the
        line after (the library's sync pool, placed by the caller's window layout)."""
        yield from self.barrier_core_soft()
        yield from self.barrier_npu_v3(sync_offset, name)
        yield from self.barrier_core_soft()

    def barrier_npu_v3(self, sync_offset: int, name: str = "barrier_npu_v3") -> Wait:
        """The centralized pull barrier across PEs: k = min(KVAL 8, npes, launched cores);
        count = sync_counter + 1; core v takes PEs v, v + k, ...: its own PE's sync_array
        gets count (signal_set: a store and a dcci of the line), every other PE's is polled
        through aclshmem_ptr until it reads count or count + 1 (dcci, a line fill over the
        fabric both ways, the compare); then sync_counter = count."""
        ctx = self.ctx
        win = ctx.window()
        line = int(ctx.cfg.dcache.line_bytes)
        counter = sync_offset + line
        k = min(BARRIER_TG_DISSEM_KVAL, self.n_pes, ctx.num_cores)
        yield from ctx.sync()  # every core loads the counter before any core stores it
        count = int(ctx.gm_read_scalar(win, counter, np.int32)) + 1
        d = ctx.cfg.dcache
        for i in range(ctx.core_id, self.n_pes, k):
            ctx.loop(1)
            if i == self.my_pe:
                ctx.dcache.store_line(self.my_pe, win, sync_offset, count, np.int32, name)
                continue
            level = ctx.machine.fabric.route(i, self.my_pe)[1]
            poll = Poll(ctx.window(i), sync_offset, Signal(np.int32, "eq", count, (count + 1,)),
                        None, 4, read_ns=d.dcci_ns + d.miss_ns + 2 * level,
                        check_ns=ctx.issue_ns, remote=True)
            yield from ctx.poll_round_robin([poll], 0, name)
        yield from ctx.sync()
        ctx.gm_write_scalar(win, counter, count, np.int32)
