"""The sanitiser checks of a kernel context: every access is in range, aligned, on a
local buffer of the core, reads only bytes written in this call, and no two puts of a
call write the same window bytes (a race). A failed check is a KernelError naming the
rank, core, step and address. :class:`Sanitiser` holds these checks of
:class:`npusim.runtime.context.KernelContext`, but for those every transfer makes (in range
of a buffer or tensor, aligned, on a buffer of the core, its source bytes written), which
:class:`npusim.runtime.transfer.TransferPath` holds beside the transfer path, so that its
compiled build calls them as C calls.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from npusim.errors import KernelError, excerpt
from npusim.hw.memory import Region, SparseRegion
from npusim.runtime.fault import calling_line
from npusim.runtime.transfer import Strided
from npusim.values import is_integer

WHOLE = "a whole number >= 0"
AMOUNT = "a finite number >= 0"


class Sanitiser:
    """A kernel context's access checks (KernelContext mixes it in; no state of its own)."""

    __slots__ = ()

    # -- the arguments of a call -----------------------------------------------------
    def _whole(self, value: Any, call: str, name: str) -> int:
        """A size, count, offset or index as an int, refused at the call when negative,
        fractional or not a number: a negative allocation aliases the buffers after it,
        a float offset fails only when the bytes land, far from the line at fault."""
        if is_integer(value) and value >= 0:
            return int(value)
        raise self._refused(call, name, value, WHOLE)

    def _amount(self, value: Any, call: str, name: str) -> float:
        """A time or an amount of work (ops, cycles, ns), refused at the call unless finite
        and >= 0: NaN would poison every clock it reaches and surface as a deadlock
        blamed on another core, a negative one would run the clock backwards."""
        if (isinstance(value, int | float | np.integer | np.floating)
                and not isinstance(value, bool) and 0 <= value < math.inf):
            return float(value)
        raise self._refused(call, name, value, AMOUNT)

    def _refused(self, call: str, name: str, value: Any, allowed: str) -> KernelError:
        return self.error(f"{call}: {name} {excerpt(value)}; allowed: {allowed}"
                          f"{calling_line()}")

    def _check_strided(self, strided: Strided, call: str) -> None:
        """count and length whole, each gap at least -length (a gap of -length repeats one
        block; below that the blocks would run backwards)."""
        self._whole(strided.count, call, "strided.count")
        length = self._whole(strided.length, call, "strided.length")
        for name in ("src_gap", "dst_gap"):
            gap = getattr(strided, name)
            if not is_integer(gap) or gap < -length:
                raise self._refused(call, f"strided.{name}", gap,
                                    f"a whole number >= -length ({-length})")

    def _mark(self, at: int, span: int, strided: Strided | None, dst_side: bool,
              local: Any = None) -> None:
        """Record local-buffer bytes as written (the blocks only, for a strided landing)."""
        local = local if local is not None else self.ub
        gap = (strided.dst_gap if dst_side else strided.src_gap) if strided else 0
        if strided is None or gap <= 0:
            local.mark(at, span)
            return
        local.mark_blocks(at, strided.count, strided.length, strided.length + gap)

    def _claim(self, dst: SparseRegion, offset: int, span: int, strided: Strided | None
               ) -> str | None:
        """Claim a put's destination bytes for the race check: its blocks when strided
        with gaps (a strided put may interleave with another writer's blocks)."""
        who = (self.rank_id, self.core_id, self.step)
        if strided is None or strided.dst_gap <= 0:
            return dst.claim(offset, span, who)
        pitch = strided.length + strided.dst_gap
        for i in range(strided.count):
            other = dst.claim(offset + i * pitch, strided.length, who)
            if other:
                return other
        return None

    def _check_engine_put(self, dst: Region, offset: int, nbytes: int, what: str) -> None:
        """A copy an engine makes for this core into another window (SDMA, RDMA): in range,
        in a zone, and onto no bytes an earlier put of this call wrote."""
        self._check_gm(dst, offset, nbytes, what)
        if not isinstance(dst, SparseRegion):
            return
        problem = dst.zone_problem(offset, nbytes)
        if problem:
            raise self.error(f"{what} of {nbytes} B to the window of rank {dst.rank} "
                             f"{problem}", address=offset, size=nbytes)
        other = self._claim(dst, offset, nbytes, None)
        if other:
            raise self.error(f"{what} to the window of rank {dst.rank} overlaps the bytes an "
                             f"earlier put of this call wrote ({other}): a race",
                             address=offset, size=nbytes)

    def _check_polls(self, polls: list[Any], name: str) -> None:
        """Every poll reads this rank's GM in range and lands in a free local buffer."""
        for p in polls:
            if p.strided is not None:
                self._check_strided(p.strided, name)
            self._amount(p.check_ns, name, "check_ns")
            if p.read_ns is not None:
                self._amount(p.read_ns, name, "read_ns")
            span = p.strided.src_span() if p.strided else p.nbytes
            self._check_gm(p.region, p.offset, span, name)
            if p.region.rank != self.rank_id and not (
                    p.remote and isinstance(p.region, SparseRegion) and p.read_ns is not None):
                raise self.error(f"{name}: polling another rank's memory is modelled only "
                                 "for its symmetric window through shmem (a remote poll)",
                                 address=p.offset)
            if p.into is None:  # a scalar spin: the value goes to a register
                continue
            self._check_ub(p.into, p.into_offset,
                           p.strided.dst_span() if p.strided else p.nbytes, name)
            if p.into.read_busy > self.t or p.into.write_ready > self.t:
                raise self.error(f"{name} into UB buffer {p.into.name!r} while a transfer or "
                                 "vector op still uses it: missing wait", address=p.into.offset)
