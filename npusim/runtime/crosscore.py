"""CrossCoreSetFlag / CrossCoreWaitFlag: counters between the cores of a rank.

As Ascend C documents them (CrossCoreSetFlag(ISASI)): every flag id of a core is a counter
starting at 0; a set adds 1 to the counters it targets when its pipe reaches it, a wait
blocks while the counter is 0 and then takes 1. The mode says whom a set targets:

* mode 0: every core of the setter's kind, once all of them have set the id;
* mode 1: both AIVs of the block, once both have set it;
* mode 2: the AIC's set targets both AIVs of its block; the AIC's counter rises once
  both AIVs have set the id (Atlas A2/A3 and the 950);
* mode 4 (the 950 only): AIV0's id f reaches the AIC as f, AIV1's as f + 16; the AIC's
  ids 0-10 reach AIV0, 16-26 AIV1 (as 0-10).

Ids are 0-10 (16-26 on the AIC in mode 4); a counter holds at most 15 pending sets. A set
on PIPE_S (pipe "scalar") is the 950's only, as mode 4 is. A set
becomes visible `aic.flag_ns` after its pipe has completed everything issued before it.
A wait that no set will ever satisfy stays blocked until the simulator runs out of
events, and is then reported with the deadlock (npusim.runtime.launch).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from npusim.hw.pipe import TransferPipe

MAX_PENDING = 15
IDS = range(0, 11)
AIV1_SHIFT = 16  # mode 4: AIV1's ids as the AIC sees them, and the AIC's ids for AIV1


class FlagBoard:
    """The flag counters of one rank's launched cores, by (core row, flag id)."""

    def __init__(self, env: simpy.Environment, kinds: dict[str, list[int]]) -> None:
        self.env = env
        self.count: dict[tuple[int, int], int] = {}
        self.waiter: dict[tuple[int, int], simpy.Event] = {}
        self.kinds = kinds  # kind name -> the core rows of that kind (mode 0's groups)
        self.arrivals: dict[tuple[Any, int], list[int]] = {}  # modes 0, 1, 2: who has set
        self.inflight: dict[tuple[int, int], int] = {}  # sets issued, not landed, by target

    def reserve(self, core: int, flag: int, setter: Any) -> None:
        """A set on its way to (core, flag): refused if the counter would pass the cap."""
        key = (core, flag)
        n = self.count.get(key, 0) + self.inflight.get(key, 0) + 1
        if n > MAX_PENDING:
            raise setter.error(f"CrossCoreSetFlag: flag {flag} of core {core} would hold "
                               f"{n} pending sets; the hardware counts at most {MAX_PENDING}")
        self.inflight[key] = self.inflight.get(key, 0) + 1

    def add(self, core: int, flag: int, setter: Any) -> None:
        key = (core, flag)
        if self.inflight.get(key):
            self.inflight[key] -= 1
        n = self.count.get(key, 0) + 1
        if n > MAX_PENDING:
            raise setter.error(f"CrossCoreSetFlag: flag {flag} of core {core} would hold "
                               f"{n} pending sets; the hardware counts at most {MAX_PENDING}")
        self.count[key] = n
        ev = self.waiter.pop(key, None)
        if ev is not None:
            ev.succeed()

    def arrive(self, group: Any, members: list[int], who: int, flag: int) -> bool:
        """One set of a group that fires once every member has set (and resets)."""
        got = self.arrivals.setdefault((group, flag), [0] * len(members))
        got[members.index(who)] += 1
        if all(got):
            for i in range(len(got)):
                got[i] -= 1
            return True
        return False


class CrossCoreOps:
    """Mixed into KernelContext: cross_core_set_flag and cross_core_wait_flag."""

    __slots__ = ()

    def _flag_modes(self: Any) -> tuple[int, ...]:
        aic = self.cfg.aic
        if aic is None:
            raise self.error(f"preset {self.cfg.name} gives no cross-core flags (no aic "
                             "section)")
        return tuple(int(m) for m in aic.flag_modes.split(","))

    def _role(self: Any) -> str:
        """'aic', 'aiv0', 'aiv1' in a MIX block; the kind's name otherwise."""
        kind = self.core.kind.name
        return f"aiv{self.sub_block_idx}" if self.block and kind == "aiv" else kind

    def _member(self: Any, role: str) -> int:
        """The core row of a member of this core's MIX block."""
        for ctx in self.block:
            if ctx._role() == role:
                return ctx.core_id
        raise self.error(f"no {role} in this core's block: cross-core modes 1, 2 and 4 need "
                         "a MIX launch (core kind mix_aic_1_2)")

    def cross_core_set_flag(self: Any, mode: int, flag: int, pipe: str = "scalar") -> None:
        """CrossCoreSetFlag<mode, pipe>(flag): issued by the scalar unit, it takes effect
        when `pipe` has completed everything issued on it before (a FixPipe's last
        transfer, an MTE3 write), `aic.flag_ns` later."""
        modes = self._flag_modes()
        if mode not in modes:
            raise self.error(f"CrossCoreSetFlag mode {mode}: preset {self.cfg.name} has "
                             f"modes {', '.join(map(str, modes))}")
        role = self._role()
        ids = (*IDS, *(f + AIV1_SHIFT for f in IDS)) if mode == 4 and role == "aic" else IDS
        if flag not in ids:
            raise self.error(f"CrossCoreSetFlag<{mode}> by the {role}: flag id {flag} is "
                             f"outside {min(ids)}-{max(ids)}")
        if pipe == "scalar" and 4 not in modes:
            raise self.error(f"CrossCoreSetFlag on PIPE_S: preset {self.cfg.name} does not "
                             "take it (PIPE_S, like mode 4, is the 950's); name the pipe the "
                             "set follows")
        targets = self._flag_targets(mode, flag, role)
        self.t += self.issue_ns
        self.counters["SCALAR"] += 1
        p = self._pipe(pipe)
        ops = [*p.open] if isinstance(p, TransferPipe) else [p.last] if p.last else []
        at = max([self.t, *(op.done_at for op in ops if op.done_at is not None)])
        self.env.process(self._deliver(ops, at + self.cfg.aic.flag_ns, targets))
        self.trace.activity(self.rank_id, self.core_id, "scalar", f"set_flag {flag}",
                            self.t - self.issue_ns, self.t)

    def _flag_targets(self: Any, mode: int, flag: int, role: str) -> Any:
        """A function applying the set to the board when it lands."""
        board = self.flags
        me = self.core_id
        if mode == 0:
            kind = self.core.kind.name
            rows = board.kinds[kind]
            return lambda: [board.add(c, flag, self) for c in rows] \
                if board.arrive(kind, rows, me, flag) else None
        if mode == 1:
            if role == "aic":
                raise self.error("CrossCoreSetFlag<1> synchronises the AIVs of a block")
            aivs = [self._member("aiv0"), self._member("aiv1")]
            return lambda: [board.add(c, flag, self) for c in aivs] \
                if board.arrive(("aiv", self.block_idx), aivs, me, flag) else None
        if mode == 2:
            if role == "aic":
                aivs = [self._member("aiv0"), self._member("aiv1")]
                for c in aivs:
                    board.reserve(c, flag, self)
                return lambda: [board.add(c, flag, self) for c in aivs]
            aivs = [self._member("aiv0"), self._member("aiv1")]
            aic = self._member("aic")
            return lambda: board.add(aic, flag, self) \
                if board.arrive(("aic", self.block_idx), aivs, me, flag) else None
        # mode 4
        if role == "aic":
            sub, f = ("aiv1", flag - AIV1_SHIFT) if flag >= AIV1_SHIFT else ("aiv0", flag)
            target = self._member(sub)
            board.reserve(target, f, self)
            return lambda: board.add(target, f, self)
        aic = self._member("aic")
        f = flag + (AIV1_SHIFT if role == "aiv1" else 0)
        board.reserve(aic, f, self)
        return lambda: board.add(aic, f, self)

    def _deliver(self: Any, ops: list, at: float, apply: Any) -> Generator[Any, Any, None]:
        for op in ops:
            if op.done_at is None:
                yield op.event()
        at = max([at, *(op.done_at + self.cfg.aic.flag_ns for op in ops)])
        if at > self.env.now:
            yield self.env.timeout(at - self.env.now)
        apply()

    def cross_core_wait_flag(self: Any, flag: int) -> Generator[Any, Any, None]:
        """CrossCoreWaitFlag(flag): block while this core's counter of `flag` is 0, then
        take 1 from it."""
        modes = self._flag_modes()
        role = self._role()
        ids = (*IDS, *(f + AIV1_SHIFT for f in IDS)) if 4 in modes and role == "aic" else IDS
        if flag not in ids:
            raise self.error(f"CrossCoreWaitFlag by the {role}: flag id {flag} is outside "
                             f"{min(ids)}-{max(ids)}")
        self.t += self.issue_ns
        self.counters["SCALAR"] += 1
        yield from self.sync()
        board = self.flags
        key = (self.core_id, flag)
        if board.count.get(key, 0) == 0:
            ev = board.waiter[key] = self.env.event()
            yield from self._block(ev, f"CrossCoreWaitFlag({flag}) by the {role}, counter 0: "
                                   f"{self._setters(flag, role)}", f"wait_flag {flag}")
        board.count[key] -= 1

    def _setters(self: Any, flag: int, role: str) -> str:
        """Who could raise this counter, for a deadlock report."""
        if role == "aic":
            if flag >= AIV1_SHIFT:
                return f"set by AIV1's CrossCoreSetFlag<4>({flag - AIV1_SHIFT})"
            return (f"set by AIV0's CrossCoreSetFlag<4>({flag}) or both AIVs' "
                    f"CrossCoreSetFlag<2>({flag})")
        if role.startswith("aiv"):
            aic_id = flag + (AIV1_SHIFT if role == "aiv1" else 0)
            return (f"set by the AIC's CrossCoreSetFlag<4>({aic_id}) or <2>({flag}), or "
                    f"every AIV's <0>({flag}) or both AIVs' <1>({flag})")
        return f"set by every {role} core's CrossCoreSetFlag<0>({flag})"
