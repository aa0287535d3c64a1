"""SimEnv's event queue pops in simpy's own order.

Random programs (Timeouts with delays that tie, events succeeded or failed, events
scheduled URGENT or NORMAL with a delay, alarms set and set again) run on SimEnv and on a
plain simpy.Environment, where an alarm is a Timeout whose superseded settings do nothing
(what SimEnv's alarm replaces, simpy/events.py `Timeout`). The sequence of (time, callback)
must be the same: the reference is simpy's heap of tuples, not the queue under test."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
import simpy
from simpy.events import NORMAL, URGENT

from npusim.engine.env import SimEnv

DELAYS = (0.0, 0.0, 0.5, 1.0, 1.0, 1.5, 3.0)  # ties are the point


def alarm_on(env: simpy.Environment) -> Callable[[float, Callable[[], None]], None]:
    """env.alarm on SimEnv; on simpy, a Timeout per setting, the superseded ones idle."""
    if isinstance(env, SimEnv):
        return env.alarm
    version = [0]

    def alarm(delay: float, fn: Callable[[], None]) -> None:
        version[0] += 1
        mine = version[0]
        env.timeout(delay).callbacks.append(lambda _e: fn() if version[0] == mine else None)
    return alarm


def program(env: simpy.Environment, seed: int, log: list[tuple[float, str]]) -> simpy.Event:
    """Processes drawn from `seed`; every callback logs (now, its name)."""
    rng = random.Random(seed)
    alarm = alarm_on(env)

    def note(name: str) -> Callable[[simpy.Event], None]:
        return lambda _e: log.append((env.now, name))

    def proc(p: int) -> Iterator[simpy.Event]:
        for i in range(rng.randint(1, 12)):
            name = f"p{p}.{i}"
            kind = rng.randrange(5)
            if kind == 0:  # a Timeout
                yield env.timeout(rng.choice(DELAYS))
                log.append((env.now, name))
            elif kind == 1:  # an event scheduled directly, URGENT or NORMAL, with a delay
                ev = env.event()
                ev._ok, ev._value = True, None
                ev.callbacks.append(note(name))
                env.schedule(ev, rng.choice((URGENT, NORMAL)), rng.choice(DELAYS))
            elif kind == 2:  # succeeded now, waited on
                ev = env.event()
                ev.callbacks.append(note(name))
                ev.succeed()
                yield ev
            elif kind == 3:  # failed now, the failure caught by the waiting process
                ev = env.event()
                ev.fail(ValueError(name))
                try:
                    yield ev
                except ValueError:
                    log.append((env.now, name + " failed"))
            else:  # the alarm set (again)
                alarm(rng.choice(DELAYS), lambda name=name: log.append((env.now, name)))
                yield env.timeout(rng.choice(DELAYS))

    return env.all_of([env.process(proc(p)) for p in range(rng.randint(1, 6))])


def reference(seed: int) -> list[tuple[float, str]]:
    log: list[tuple[float, str]] = []
    env = simpy.Environment()
    program(env, seed, log)
    env.run()
    return log


@pytest.mark.parametrize("seed", range(40))
def test_run_pops_in_simpys_order(seed: int) -> None:
    """env.run() (simpy's loop over SimEnv's peek and step)."""
    got: list[tuple[float, str]] = []
    env = SimEnv()
    program(env, seed, got)
    env.run()
    assert got == reference(seed)


@pytest.mark.parametrize("seed", range(40))
def test_advance_pops_in_simpys_order(seed: int) -> None:
    """The loop a launch runs (run_events), until the processes are done; then the events
    still scheduled (simpy's order continues the same in step)."""
    want = reference(seed)
    got: list[tuple[float, str]] = []
    env = SimEnv()
    done = program(env, seed, got)
    assert env.advance(done, 1e9, 0xFFFF, lambda _t, _n: None) == "done"
    env.run()
    assert got == want


def test_run_until_stops_and_resumes_in_simpys_order() -> None:
    """run(until=t) stops inside an event's callbacks (StopSimulation) and reschedules it
    first; the run resumed gives what one run gives."""
    for seed in range(20):
        want = reference(seed)
        got: list[tuple[float, str]] = []
        env = SimEnv()
        program(env, seed, got)
        env.run(until=1.0)
        assert all(t <= 1.0 for t, _ in got)
        env.run(until=2.0)
        env.run()
        assert got == want


def test_close_drops_the_events_and_their_callbacks() -> None:
    env = SimEnv()
    events = [env.timeout(d) for d in DELAYS]
    env.close()
    assert env.peek() == float("inf") and all(e.callbacks is None for e in events)
