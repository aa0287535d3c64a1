"""Bandwidth sharing: a fluid model of transfers through shared resources.

A transfer (flow) streams its bytes through every resource on its path (the rank's HBM,
a die's egress and ingress links, a die-to-die link) at a rate no higher than its own
port cap (the issuing core's MTE bandwidth), and is delivered a fixed latency after its
last byte leaves. Its rate is

    rate(f) = min(cap_f, min over r in path of level_r)

where level_r is resource r's water-filling level over the caps of the flows on it:
flows whose cap is below the level get their cap, the others split what is left equally
(INF while the caps add up to less than the bandwidth). This is max-min fairness computed
per resource: exact when each flow is limited by its own port or by one shared resource,
slightly conservative when two resources on a path are both oversubscribed
(docs/model.md).

Cost. level_r depends only on the caps on r, kept as counts per distinct cap. Flows with
the same path and cap always have the same rate, so they form a group with one virtual
clock, a heap of finish tags and one timer: a change of level on r costs O(groups on r)
(a few per rank pair), not O(flows). No step is quadratic in the number of active
transfers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import simpy
from simpy.events import NORMAL

from npusim.engine.compiled import adopt
from npusim.engine.env import SimEnv

INF = math.inf
_EPS = 1e-9
_COMPACT_MIN = 4096  # wake-ups in the heap before superseded ones are dropped
# the compiled build (or this source loaded under another name, as the tests do) compares
# heap entries by their C fields; the pure module compares in `__lt__` itself (one Python
# call per comparison heapq makes, not two)
TYPED = __name__ != "npusim.engine.flow"


class Resource:
    """A shared bandwidth in bytes per ns (numerically GB/s)."""

    __slots__ = ("name", "kind", "rank", "bandwidth", "caps", "cap_sum", "level", "groups",
                 "bytes", "nflows")

    def __init__(self, name: str, kind: str, rank: int, bandwidth_gbps: float) -> None:
        self.name = name
        self.kind = kind
        self.rank = rank
        self.bandwidth = float(bandwidth_gbps)
        self.caps: dict[float, int] = {}  # cap -> number of flows with that cap
        self.cap_sum = 0.0
        self.level = INF
        self.groups: dict[Group, None] = {}  # non-empty groups whose path crosses this resource
        self.bytes = 0
        self.nflows = 0

    def used(self) -> float:
        """Bandwidth in use now (GB/s): the rates of the flows crossing this resource."""
        return sum(g.rate * len(g.heap) for g in self.groups)

    def _water_fill(self) -> float:
        if self.cap_sum <= self.bandwidth * (1 + 1e-12):
            return INF
        left = self.bandwidth
        n = self.nflows
        for cap in sorted(self.caps):
            cnt = self.caps[cap]
            if cap * n <= left:
                left -= cap * cnt
                n -= cnt
            else:
                return left / n
        return INF

    def add_cap(self, cap: float, delta: int) -> None:
        c = self.caps.get(cap, 0) + delta
        if c:
            self.caps[cap] = c
        else:
            del self.caps[cap]
        self.nflows += delta
        self.cap_sum = self.cap_sum + cap * delta if self.nflows else 0.0


class Group:
    """Flows with one path and one cap: they share a rate, hence a virtual clock."""

    __slots__ = ("net", "path", "cap", "rate", "clock", "t_last", "heap", "wake_at",
                 "wake_seq", "anchor_at", "anchor_seq")

    def __init__(self, net: FlowNetwork, path: tuple[Resource, ...], cap: float) -> None:
        self.net = net
        self.path = path
        self.cap = cap
        self.rate = self.current_rate()
        self.clock = 0.0  # bytes every member has streamed since the group was made
        self.t_last = net.env._now
        self.heap: list[Flow] | None = []  # by finish tag; None while idle
        # when its first member will be done, and the order among wake-ups at one time
        # (wake_seq 0: not armed); anchor: the one entry of the network's wake-up heap that
        # stands for it, due no later than the wake-up itself (FlowNetwork._arm_groups)
        self.wake_at = INF
        self.wake_seq = 0
        self.anchor_at = INF
        self.anchor_seq = 0

    def current_rate(self) -> float:
        rate = self.cap
        for r in self.path:
            if r.level < rate:
                rate = r.level
        return rate

    def settle(self, now: float) -> None:
        self.clock += self.rate * (now - self.t_last)
        self.t_last = now

    def fire(self) -> None:
        """Finish the members that are done by now, then re-arm."""
        net = self.net
        now = net.env._now
        self.settle(now)
        done = []
        rate = self.rate
        while self.heap:
            f = self.heap[0]
            tag = f.tag
            # done within the tolerance, or so close that its finish rounds to this very
            # instant (late in a run, when bytes left / rate is below the clock's
            # resolution: re-arming at `now` would fire again for ever)
            if not (tag <= self.clock + _EPS * max(1.0, tag)
                    or (rate > 0.0 and now + (tag - self.clock) / rate <= now)):
                break
            done.append(heapq.heappop(self.heap))
        if not self.heap:  # idle: level changes need not re-rate it until a flow joins
            for r in self.path:
                del r.groups[self]
            self.heap = None  # and it holds no list (a W 768 run has 589,825 groups)
        for f in done:
            net._finish(f)
        net._dirty[self] = None  # re-armed once the instant's level changes are applied


class Wake:
    """An entry of the network's heaps of wake-ups and calls, ordered by (at, seq) as the
    tuple (at, seq, item) it replaces: the compiled build compares the two C fields, where
    heapq compared tuples item by item through their float and int objects."""

    __slots__ = ("at", "seq", "item")

    at: float
    seq: int
    item: Group | Callable[[], None]

    def __lt__(self, other: Wake) -> bool:
        if TYPED:
            return self.before(other)
        return self.at < other.at or (self.at == other.at and self.seq < other.seq)

    def before(self, other: Wake) -> bool:
        return self.at < other.at or (self.at == other.at and self.seq < other.seq)


def wake(at: float, seq: int, item: Group | Callable[[], None]) -> Wake:
    w = Wake.__new__(Wake)  # no __init__ call: the fields set here
    w.at = at
    w.seq = seq
    w.item = item
    return w


class Flow:
    """One transfer in flight: what its finish and delivery need, and no more (a W 768
    dispatch has hundreds of thousands at once). Its progress is its group's clock
    against its finish tag; it is its own entry in the group's heap, ordered by (tag,
    seq) (the start order breaks ties)."""

    __slots__ = ("size", "group", "latency", "on_done", "on_sent", "event", "tag", "seq")

    def __init__(self, size: int, group: Group, latency: float,
                 on_done: Callable[[float], None], on_sent: Callable[[], None] | None,
                 event: simpy.Event | None) -> None:
        self.size = size
        self.group = group  # its path and cap
        self.latency = latency
        self.on_done = on_done
        self.on_sent = on_sent
        self.event = event
        self.tag = 0.0  # set when it joins its group's heap
        self.seq = 0

    def __lt__(self, other: Flow) -> bool:
        if TYPED:
            return self.before(other)
        return self.tag < other.tag or (self.tag == other.tag and self.seq < other.seq)

    def before(self, other: Flow) -> bool:
        return self.tag < other.tag or (self.tag == other.tag and self.seq < other.seq)

    def __call__(self, event: simpy.Event) -> None:
        """The delivery: the flow is its delivery event's callback itself (a closure per
        flow cost 80 B more, for every transfer in flight)."""
        self.on_done(event.env._now)


class FlowNetwork:
    """Owns all flows of one simulation.

    Level changes are applied once per instant, not once per start or finish: the flows
    that finish at one time, and the transfers their pipes start at once in their place,
    are netted out first (a pipe handing over to its next transfer on the same path moves
    no level at all), then the levels are recomputed and the groups re-rated. No time
    passes in between, so the rates over every interval are exactly those of the
    one-at-a-time order."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.active = 0
        self._seq = 0
        self._groups: dict[tuple[tuple[Resource, ...], float], Group] = {}
        # one simulator timer for the whole network (env's alarm): a heap of (time, seq,
        # group) wake-ups, each group's anchor among them and superseded ones skipped, so
        # re-rating a group costs no simulator event
        self._wakes: list[Wake] = []
        self._compact_at = _COMPACT_MIN
        self._timer_version = 0  # only without SimEnv's alarm
        self._timer_at = INF  # when env's alarm (the network's timer) is set for
        # observer(resource, t_ns, used_gbps) after every change of a resource's used
        # bandwidth; None (the default) costs one test per flush
        self.observer: Callable[[Resource, float, float], None] | None = None
        # changes of this instant not yet applied: net flow count per group (a finish and
        # a start in one group cancel: most do, as a pipe hands over to its next
        # transfer), groups that got their first flow, groups to re-arm; flushed when
        # _batch is 0
        self._pending: dict[Group, int] = {}
        self._joining: list[Group] = []
        self._dirty: dict[Group, None] = {}
        self._batch = 0
        # calls due at a time (a pipe starting its next transfer): (time, seq, fn), run by
        # the same timer as the wake-ups, inside the instant's batch
        self._calls: list[Wake] = []
        # the timer is env's alarm (a SimEnv), set in place; the tick as one bound method
        self._alarm = isinstance(env, SimEnv)
        self._tick_fn = self._tick

    def close(self) -> None:
        """Drop the groups, the pending wake-ups and calls, the observer and the bound tick
        once the op is over: each points back here, cycles that only a full collection
        would free."""
        self._groups.clear()
        self._wakes.clear()
        self._calls.clear()
        self._pending.clear()
        self._joining.clear()
        self._dirty.clear()
        self.observer = None
        self._tick_fn = None

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run fn() at time t (> now) from the network's timer: no simulator event of its
        own, and a transfer started there joins the instant's netted level changes."""
        self._seq += 1
        heapq.heappush(self._calls, wake(t, self._seq, fn))
        if t < self._timer_at:
            self._arm_timer(t)

    def start(self, size: int, cap_gbps: float, path: tuple[Resource, ...], latency_ns: float,
              on_done: Callable[[float], None], on_sent: Callable[[], None] | None = None,
              event: simpy.Event | None = None) -> Flow:
        """Start streaming now; on_sent() when the last byte has left the source port,
        on_done(t) when the bytes are delivered (latency_ns later). If `event` is given
        it becomes the delivery event (on_done runs first among its callbacks), so a
        core waiting for the transfer costs no extra event."""
        now = self.env._now
        cap = float(cap_gbps)
        self.active += 1
        for r in path:
            r.bytes += size
        key = (path, cap)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = Group(self, path, cap)
        f = Flow(size, g, float(latency_ns), on_done, on_sent, event)
        if not g.heap:  # (re)joins its resources; its rate is set when the levels are
            g.heap = []
            g.t_last = now
            for r in path:
                r.groups[g] = None
            self._joining.append(g)
        else:
            g.settle(now)
        self._seq += 1
        f.tag = g.clock + size
        f.seq = self._seq
        heapq.heappush(g.heap, f)
        if g.heap[0] is f:
            self._dirty[g] = None
        self._pending[g] = self._pending.get(g, 0) + 1
        if not self._batch:
            self._flush()
        return f

    def _flush(self) -> None:
        """Apply this instant's starts and finishes: move the levels, re-rate the groups
        that cross a resource whose level moved, re-arm the groups whose first finish
        moved."""
        now = self.env._now
        old_levels: dict[Resource, float] = {}
        for g, delta in self._pending.items():
            if not delta:
                continue
            cap = g.cap
            for r in g.path:
                if r not in old_levels:
                    old_levels[r] = r.level
                r.add_cap(cap, delta)
        self._pending.clear()
        rerate: dict[Group, None] = dict.fromkeys(self._joining)
        self._joining.clear()
        for r, old in old_levels.items():
            new = r._water_fill()
            if new == old:
                continue
            r.level = new
            for g in r.groups:
                if g.rate <= new and g.rate != old:
                    continue  # r neither limited this group before nor limits it now
                rerate[g] = None
        dirty = self._dirty
        for g in rerate:  # Group.current_rate and Group.settle, inlined (the hot loop)
            rate = g.cap
            for r in g.path:
                if r.level < rate:
                    rate = r.level
            if rate != g.rate:
                g.clock += g.rate * (now - g.t_last)
                g.t_last = now
                g.rate = rate
                dirty[g] = None
        if dirty:
            self._arm_groups(now)
        if self.observer is not None:
            touched = dict.fromkeys(old_levels)
            for g in rerate:
                touched.update(dict.fromkeys(g.path))
            for r in touched:
                self.observer(r, now, r.used())

    def _arm_groups(self, now: float) -> None:
        """Tell the network when each dirty group's first member will be done, in order
        (inlined: a level change on a busy link re-arms dozens of groups).

        A wake-up goes into the heap only if it is earlier than the group's anchor, the
        entry already there for it: a later one (a rate cut, the next member after a
        finish) is only noted on the group, and pushed when the anchor comes up
        (`_reanchor`). Every key (time, seq) is the one an entry per re-arm would have
        had, and the anchor pops no later than it, so the wake-ups fire in the same order,
        and the timer, set from the due wake-ups alone, at the same times."""
        wakes = self._wakes
        seq = self._seq
        first = self._timer_at
        push = heapq.heappush
        for g in self._dirty:
            h = g.heap
            if h:
                lead = h[0]
                delay = (lead.tag - g.clock) / g.rate
                t = now + (delay if delay > 0.0 else 0.0)  # max(0.0, delay), NaN as 0.0
                seq += 1
                g.wake_at = t
                g.wake_seq = seq
                if t < g.anchor_at:
                    push(wakes, wake(t, seq, g))
                    g.anchor_at = t
                    g.anchor_seq = seq
                if t < first:
                    first = t
            else:
                g.wake_seq = 0
        self._seq = seq
        self._dirty.clear()
        if first < self._timer_at:
            self._arm_timer(first)
        if len(wakes) > self._compact_at:
            self._compact()

    def _reanchor(self, g: Group) -> None:
        """g's anchor has left the heap before its wake-up was due: push the wake-up as
        the new anchor (if g is still armed)."""
        if g.wake_seq:
            heapq.heappush(self._wakes, wake(g.wake_at, g.wake_seq, g))
            g.anchor_at = g.wake_at
            g.anchor_seq = g.wake_seq
        else:
            g.anchor_at = INF
            g.anchor_seq = 0

    def _compact(self) -> None:
        """Drop superseded wake-ups (an anchor replaced by an earlier one leaves one
        behind), once they are as many as the live ones: a stale entry costs a pop of the
        whole heap, the compaction a fraction of that. Keys (time, seq) are unique, so the
        heap pops in the same order after."""
        live = [w for w in self._wakes if w.seq == w.item.anchor_seq]
        heapq.heapify(live)
        self._wakes = live
        self._compact_at = max(_COMPACT_MIN, 2 * len(live))

    def _arm_timer(self, t: float) -> None:
        self._timer_at = t
        env = self.env
        delay = max(0.0, t - env._now)
        if self._alarm:  # SimEnv.alarm(delay, self._tick), inlined: one per tick
            env._alarm_at = env._now + delay
            env._alarm_eid = env._queue.next_eid()
            env._alarm_fn = self._tick_fn
            return
        self._timeout_tick(delay)

    def _timeout_tick(self, delay: float) -> None:
        """The timer on a plain simpy environment: a Timeout per setting, the superseded
        ones do nothing."""
        self._timer_version += 1
        v = self._timer_version
        self.env.timeout(delay).callbacks.append(
            lambda _e: self._tick() if v == self._timer_version else None)

    def _tick(self) -> None:
        self._timer_at = INF
        now = self.env._now
        wakes = self._wakes
        calls = self._calls
        self._batch += 1
        while wakes:
            w = wakes[0]
            if w.at > now:
                break
            heapq.heappop(wakes)
            seq = w.seq
            group = w.item
            if seq != group.anchor_seq:
                continue  # superseded
            if seq == group.wake_seq:
                group.anchor_at = INF
                group.anchor_seq = 0
                group.fire()
            else:
                self._reanchor(group)  # its wake-up is later (maybe still due by now)
        while calls:
            w = calls[0]
            if w.at > now:
                break
            heapq.heappop(calls)
            w.item()
        self._batch -= 1
        self._flush()
        wakes = self._wakes  # a new list if the flush compacted it
        while wakes:  # down to a due wake-up: the timer is set from it alone
            w = wakes[0]
            seq = w.seq
            group = w.item
            if seq == group.wake_seq:
                break
            heapq.heappop(wakes)
            if seq == group.anchor_seq:
                self._reanchor(group)
        nxt = INF
        if wakes:
            w = wakes[0]
            nxt = w.at
        if calls:
            w = calls[0]
            if w.at < nxt:
                nxt = w.at
        if nxt < self._timer_at:
            self._arm_timer(nxt)

    def _finish(self, f: Flow) -> None:
        """Last byte sent: free the bandwidth, tell the pipe, deliver after the latency."""
        self.active -= 1
        g = f.group
        self._pending[g] = self._pending.get(g, 0) - 1
        if f.on_sent is not None:
            f.on_sent()
        env = self.env
        ev = f.event
        if ev is not None:
            ev._ok = True  # what Event.succeed does, with a delay (as a Timeout does)
            ev._value = None
            ev.callbacks.insert(0, f)
            env.schedule(ev, NORMAL, f.latency)
        elif f.latency > 0:
            env.timeout(f.latency).callbacks.append(f)
        else:
            f.on_done(env._now)


if __name__ == "npusim.engine.flow":  # this module, not its compiled build: use the build
    adopt(globals(), "npusim.engine._flow", ("Resource", "Group", "Wake", "Flow", "FlowNetwork"))
