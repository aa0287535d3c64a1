"""Bandwidth sharing: a fluid model of transfers through shared resources.

A transfer (flow) streams its bytes through every resource on its path (a core's MTE
port cap, the rank's HBM, a die's egress and ingress links) and is delivered a fixed
latency after its last byte leaves. Its rate is the minimum, over its path, of the
resource's fair share and its own port cap.

The fair share of a resource is computed by water-filling over the caps of the flows
on it: flows whose cap is below the level get their cap, the rest split what is left
equally. This is one pass of max-min fairness (exact when each flow's bottleneck is its
own port or a single shared resource, slightly conservative otherwise); see
docs/model.md.

Cost: a resource whose flows' caps add up to less than its bandwidth is not a
bottleneck for anyone, so flows joining or leaving it change no rate and cost O(path).
Only an oversubscribed resource re-rates its own flows, O(flows on it) per change; no
step is quadratic in the number of active transfers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

INF = math.inf


class Resource:
    """A shared bandwidth: bytes per ns (numerically equal to GB/s)."""

    __slots__ = ("name", "kind", "rank", "bandwidth", "flows", "cap_sum", "_share", "bytes")

    def __init__(self, name: str, kind: str, rank: int, bandwidth_gbps: float) -> None:
        self.name = name
        self.kind = kind
        self.rank = rank
        self.bandwidth = float(bandwidth_gbps)
        self.flows: dict[Flow, None] = {}  # insertion order keeps runs deterministic
        self.cap_sum = 0.0
        self._share: float | None = INF
        self.bytes = 0

    def share(self) -> float:
        """The rate limit this resource imposes on a flow (INF when not oversubscribed)."""
        if self._share is None:
            self._share = self._water_fill()
        return self._share

    def _water_fill(self) -> float:
        if self.cap_sum <= self.bandwidth * (1 + 1e-12):
            return INF
        left = self.bandwidth
        n = len(self.flows)
        for cap in sorted(f.cap for f in self.flows):
            if cap * n <= left:
                left -= cap
                n -= 1
            else:
                return left / n
        return INF

    def saturated(self) -> bool:
        return self.cap_sum > self.bandwidth * (1 + 1e-12)


class Flow:
    """One transfer in flight."""

    __slots__ = ("size", "remaining", "rate", "t_last", "cap", "path", "latency",
                 "on_done", "on_sent", "version", "net", "timer_at")

    def __init__(self, net: FlowNetwork, size: int, cap: float, path: tuple[Resource, ...],
                 latency: float, on_done: Callable[[float], None],
                 on_sent: Callable[[], None] | None = None) -> None:
        self.net = net
        self.size = size
        self.remaining = float(size)
        self.rate = 0.0
        self.t_last = net.env.now
        self.cap = cap
        self.path = path
        self.latency = latency
        self.on_done = on_done
        self.on_sent = on_sent
        self.version = 0
        self.timer_at = INF


class FlowNetwork:
    """Owns all flows of one simulation and re-rates them when sharing changes."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.active = 0

    def start(self, size: int, cap_gbps: float, path: tuple[Resource, ...], latency_ns: float,
              on_done: Callable[[float], None], on_sent: Callable[[], None] | None = None
              ) -> Flow:
        """Start streaming now; on_sent() when the last byte has left the source port,
        on_done(t) when the bytes are delivered (latency_ns later)."""
        f = Flow(self, size, float(cap_gbps), path, float(latency_ns), on_done, on_sent)
        self.active += 1
        touched = []
        for r in path:
            r.bytes += size
            was = r.saturated()
            r.flows[f] = None
            r.cap_sum += f.cap
            r._share = None
            if was or r.saturated():
                touched.append(r)
        f.rate = self._rate(f)
        self._schedule(f)
        if touched:
            self._rerate(touched, skip=f)
        return f

    def _rate(self, f: Flow) -> float:
        rate = f.cap
        for r in f.path:
            s = r.share()
            if s < rate:
                rate = s
        return rate

    def _schedule(self, f: Flow) -> None:
        """Make sure a timeout fires no later than f's projected end of streaming.

        A flow that slowed down keeps its pending timeout: it fires early, finds bytes
        left and sets a new one. Only a flow that sped up needs a new, earlier timeout.
        """
        end = f.t_last + (f.remaining / f.rate if f.remaining > 0 else 0.0)
        if f.timer_at <= end + 1e-9 and f.timer_at >= self.env.now and f.version:
            return
        f.version += 1
        f.timer_at = end
        ev = self.env.timeout(end - self.env.now)
        ev.callbacks.append(lambda _e, f=f, v=f.version: self._timer(f, v))

    def _timer(self, f: Flow, version: int) -> None:
        if version != f.version:
            return  # superseded by an earlier timeout
        now = self.env.now
        left = f.remaining - f.rate * (now - f.t_last)
        if left > 1e-6 * max(1.0, f.size):
            f.remaining = left
            f.t_last = now
            f.version += 1
            f.timer_at = now + left / f.rate
            ev = self.env.timeout(left / f.rate)
            ev.callbacks.append(lambda _e, f=f, v=f.version: self._timer(f, v))
            return
        self._stream_end(f)

    def _rerate(self, resources: list[Resource], skip: Flow | None = None) -> None:
        now = self.env.now
        seen: set[Flow] = set()
        for r in resources:
            for g in r.flows:
                if g is skip or g in seen:
                    continue
                seen.add(g)
                new = self._rate(g)
                if new != g.rate:
                    g.remaining = max(0.0, g.remaining - g.rate * (now - g.t_last))
                    g.t_last = now
                    g.rate = new
                    self._schedule(g)

    def _stream_end(self, f: Flow) -> None:
        f.remaining = 0.0
        self.active -= 1
        touched = []
        for r in f.path:
            was = r.saturated()
            r.flows.pop(f, None)
            r.cap_sum -= f.cap
            if not r.flows:
                r.cap_sum = 0.0
            r._share = None
            if was:
                touched.append(r)
        if touched:
            self._rerate(touched)
        if f.on_sent is not None:
            f.on_sent()
        if f.latency > 0:
            ev = self.env.timeout(f.latency)
            ev.callbacks.append(lambda _e, f=f: f.on_done(self.env.now))
        else:
            f.on_done(self.env.now)
