"""The flow network against a brute-force fluid model written here from the definition.

Definition (docs/model.md): rate(f) = min(cap_f, min over r in path of level_r), where
level_r is the water-filling level over the caps of the flows on r (inf when they fit).
The brute force recomputes every rate from scratch at every start and finish.
"""

from __future__ import annotations

import heapq
import math
import random
import tracemalloc

import pytest
import simpy

from npusim.engine.env import SimEnv
from npusim.engine.flow import Flow, FlowNetwork, Resource, wake


def level(bandwidth: float, caps: list[float]) -> float:
    if sum(caps) <= bandwidth:
        return math.inf
    left, n = bandwidth, len(caps)
    for c in sorted(caps):
        if c * n <= left:
            left -= c
            n -= 1
        else:
            return left / n
    return math.inf


def brute_force(bw: dict[str, float], flows: list[tuple[float, float, float, tuple[str, ...]]]
                ) -> list[float]:
    """Stream-end time of each (start, size, cap, path) flow."""
    remaining = [size for _, size, _, _ in flows]
    end = [math.nan] * len(flows)
    t = 0.0
    while any(math.isnan(e) for e in end):
        active = [i for i, (s, *_rest) in enumerate(flows)
                  if s <= t + 1e-12 and math.isnan(end[i])]
        levels = {r: level(b, [flows[i][2] for i in active if r in flows[i][3]])
                  for r, b in bw.items()}
        rates = {i: min([flows[i][2]] + [levels[r] for r in flows[i][3]]) for i in active}
        upcoming = [s for s, *_ in flows if s > t + 1e-12]
        dt = min([remaining[i] / rates[i] for i in active] + [u - t for u in upcoming])
        for i in active:
            remaining[i] -= rates[i] * dt
        t += dt
        for i in active:
            if remaining[i] <= 1e-6 * flows[i][1]:
                end[i] = t
    return end


def simulate(bw: dict[str, float], flows) -> list[float]:
    env = SimEnv()
    net = FlowNetwork(env)
    res = {name: Resource(name, "test", 0, b) for name, b in bw.items()}
    ends = [math.nan] * len(flows)

    def starter(i, start, size, cap, path):
        yield env.timeout(start)

        def sent(i=i):
            ends[i] = env.now

        net.start(size, cap, tuple(res[r] for r in path), 0.0, lambda _t: None, sent)

    for i, f in enumerate(flows):
        env.process(starter(i, *f))
    env.run()
    return ends


def test_two_equal_flows_on_one_link_each_get_half():
    two = [(0.0, 1000.0, 10.0, ("link",)), (0.0, 1000.0, 10.0, ("link",))]
    ends = simulate({"link": 10.0}, two)
    assert ends == pytest.approx([200.0, 200.0])


def test_capped_flow_leaves_the_rest_to_the_others():
    # link 30: caps 5, 100, 100 -> 5 + 12.5 + 12.5
    ends = simulate({"link": 30.0}, [(0.0, 50.0, 5.0, ("link",)),
                                     (0.0, 125.0, 100.0, ("link",)),
                                     (0.0, 125.0, 100.0, ("link",))])
    assert ends == pytest.approx([10.0, 10.0, 10.0])


@pytest.mark.parametrize("seed", range(12))
def test_random_mixes_match_the_brute_force(seed):
    rng = random.Random(seed)
    bw = {"hbm": rng.choice([20.0, 50.0]), "egress": rng.choice([10.0, 25.0]),
          "ingress": rng.choice([10.0, 40.0])}
    paths = [("hbm",), ("egress", "ingress", "hbm"), ("egress", "ingress"), ("ingress",)]
    flows = [(round(rng.uniform(0, 50), 3), float(rng.randint(50, 800)),
              rng.choice([4.0, 8.0, 16.0, 64.0]), rng.choice(paths)) for _ in range(14)]
    assert simulate(bw, flows) == pytest.approx(brute_force(bw, flows), rel=1e-6)


@pytest.mark.parametrize("next_cap, want_a, want_b2", [
    # same (path, cap): the finish and the start cancel, the level stays 5 for both
    (10.0, 10.0, 10.0),
    # a slower successor: A gets 7.5 until it ends at 5 + 25/7.5, B2 then runs at its cap
    (2.5, 5 + 25 / 7.5, 15.0),
])
def test_a_successor_started_at_its_predecessors_stream_end_shares_from_that_instant(
        next_cap, want_a, want_b2):
    """Like a pipe handing over: B1 (25 B) and A (50 B) share a 10 B/ns link at 5 each;
    B1's stream end starts B2 (25 B) in the same instant (hand arithmetic)."""
    env = SimEnv()
    net = FlowNetwork(env)
    link = (Resource("link", "test", 0, 10.0),)
    ends: dict[str, float] = {}

    def sent(name):
        return lambda: ends.__setitem__(name, env.now)

    def b1_sent():
        ends["b1"] = env.now
        net.start(25, next_cap, link, 0.0, lambda _t: None, sent("b2"))

    net.start(50, 10.0, link, 0.0, lambda _t: None, sent("a"))
    net.start(25, 10.0, link, 0.0, lambda _t: None, b1_sent)
    env.run()
    assert ends["b1"] == pytest.approx(5.0)
    assert ends["a"] == pytest.approx(want_a)
    assert ends["b2"] == pytest.approx(want_b2)


def test_a_later_wake_up_is_not_pushed_and_the_timer_skips_its_anchor():
    """A group whose finish moves later keeps its earlier entry in the wake-up heap (its
    anchor) instead of pushing another; the anchor is swapped for the true wake-up before
    the timer is set, so no tick comes at the anchor's time. By hand, on a 10 B/ns link:
    A (1000 B, cap 10) alone until 20 (200 B, its anchor at 100); B (100 B, cap 9: a group
    of its own) from 20, both at 5 (2 x 9 > 10: equal shares): A's finish moves to
    20 + 800 / 5 = 180 (not pushed: two entries, A's anchor and B's wake-up at 40, the
    timer at 40). B ends at 40; A, 700 B left at 10, ends at 110: the timer goes there,
    not to the anchor's 100."""
    env = SimEnv()
    net = FlowNetwork(env)
    link = (Resource("link", "test", 0, 10.0),)
    ends: dict[str, float] = {}
    seen: dict[str, object] = {}

    def sent(name):
        return lambda: ends.__setitem__(name, env.now)

    def watch():
        yield env.timeout(20.0)
        net.start(100, 9.0, link, 0.0, lambda _t: None, sent("b"))
        yield env.timeout(10.0)
        seen["wakes at 30"] = sorted(w.at for w in net._wakes)
        seen["timer at 30"] = net._timer_at
        yield env.timeout(20.0)
        seen["wakes at 50"] = sorted(w.at for w in net._wakes)
        seen["timer at 50"] = net._timer_at

    net.start(1000, 10.0, link, 0.0, lambda _t: None, sent("a"))
    env.process(watch())
    env.run()
    assert seen == {"wakes at 30": [40.0, 100.0], "timer at 30": 40.0,
                    "wakes at 50": [110.0], "timer at 50": 110.0}
    assert ends == {"b": 40.0, "a": 110.0}


def test_delivery_comes_latency_after_the_stream_end_on_done_first():
    """A delivery lands its latency after the stream end; a core waiting on the delivery
    event resumes after on_done ran; without an event a timeout delivers it. By hand: on a
    10 B/ns link, A (100 B, cap 10) and B (50 B, cap 5) stream at 5 B/ns each; B's stream
    ends at 10 and lands at 13 (latency 3); A then has 50 B left at 10 B/ns: stream end 15,
    delivered at 22 (latency 7)."""
    env = SimEnv()
    net = FlowNetwork(env)
    link = (Resource("link", "test", 0, 10.0),)
    seen: list[tuple[str, float]] = []
    ev = env.event()

    def core():
        yield ev
        seen.append(("core", env.now))

    env.process(core())
    net.start(100, 10.0, link, 7.0, lambda t: seen.append(("done", t)),
              lambda: seen.append(("sent", env.now)), ev)
    net.start(50, 5.0, link, 3.0, lambda t: seen.append(("bare", t)))
    env.run()
    assert seen == [("bare", 13.0), ("sent", 15.0), ("done", 22.0), ("core", 22.0)]


def test_a_delivery_event_does_not_grow_when_it_fires():
    """SimEnv's events carry every attribute firing sets from the start (simpy's own gain a
    dictionary then, 240 B each on CPython 3.11): hundreds of thousands are in flight at
    W 768."""
    env = SimEnv()
    events = [env.event() for _ in range(2000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for e in events:
            e._ok = True  # what FlowNetwork._finish does to a delivery event
            e._value = None
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16 * len(events)


def _alarms_and_timeouts(env: SimEnv, log: list[tuple[str, float]]) -> simpy.Event:
    """Timeouts and alarms at equal times, the alarm set before and after the timeouts."""
    def core(name: str, delays: list[float]):
        for d in delays:
            yield env.timeout(d)
            log.append((name, env.now))
            if name == "a" and env.now == 1.0:
                env.alarm(1.0, lambda: log.append(("alarm", env.now)))

    procs = [env.process(core("a", [1.0, 1.0, 0.5])), env.process(core("b", [2.0, 0.5]))]
    return env.all_of(procs)


def test_advance_runs_events_in_the_order_step_does():
    """SimEnv.advance inlines peek and step: the same order as stepping one by one (simpy's
    own step with the alarm), and the same count; "limit" and "idle" where it stops."""
    want: list[tuple[str, float]] = []
    env = SimEnv()
    done = _alarms_and_timeouts(env, want)
    steps = 0
    while not done.triggered:
        env.step()
        steps += 1
    got: list[tuple[str, float]] = []
    env = SimEnv()
    done = _alarms_and_timeouts(env, got)
    seen: list[int] = []
    assert env.advance(done, 10.0, 1, lambda _t, n: seen.append(n)) == "done"
    assert got == want and env.events_processed == steps
    assert seen == list(range(2, steps + 1, 2))
    env = SimEnv()
    done = _alarms_and_timeouts(env, [])
    assert env.advance(done, 1.5, 1023, lambda _t, _n: None) == "limit"
    assert env.now == 1.0
    env = SimEnv()
    assert env.advance(env.event(), 10.0, 1023, lambda _t, _n: None) == "idle"


def test_advance_raises_what_a_failed_process_raised():
    env = SimEnv()

    def broken():
        yield env.timeout(1.0)
        raise ValueError("UB overflow")

    env.process(broken())
    with pytest.raises(ValueError, match="UB overflow"):
        env.advance(env.event(), 10.0, 1023, lambda _t, _n: None)


def test_the_networks_heap_entries_pop_in_the_order_of_their_key_tuples():
    """Wake entries and flows in heapq pop by (time, seq) as the tuples they replace: the
    order of Python's sort of (time, seq, name), times drawn with many ties, pushes and
    pops interleaved."""
    rng = random.Random(7)
    wakes: list = []
    flows: list = []
    ref: list[tuple[float, int, str]] = []
    got_w: list[str] = []
    got_f: list[str] = []
    want: list[str] = []
    for seq in range(1, 2000):
        if ref and rng.random() < 0.4:
            want.append(heapq.heappop(ref)[2])
            got_w.append(heapq.heappop(wakes).item)
            got_f.append(heapq.heappop(flows).on_done)
            continue
        at = float(rng.randrange(20)) / 4
        name = f"e{seq}"
        heapq.heappush(ref, (at, seq, name))
        heapq.heappush(wakes, wake(at, seq, name))
        f = Flow(1, None, 0.0, name, None, None)
        f.tag, f.seq = at, seq
        heapq.heappush(flows, f)
    while ref:
        want.append(heapq.heappop(ref)[2])
        got_w.append(heapq.heappop(wakes).item)
        got_f.append(heapq.heappop(flows).on_done)
    assert got_w == want and got_f == want
