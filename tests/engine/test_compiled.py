"""The optional compiled core gives exactly what the pure modules give, and the pure
modules serve when it is absent or NPUSIM_PURE_PYTHON is set.

The pure modules are loaded from their source under another name (so they keep their
pure classes), the compiled ones are their builds; both run the same random scenario
(transfers queued on MTE pipes, fenced, started by the network's timer, sharing links,
with delivery latencies) through a launch's event loop and must record the same times,
to the last bit, in the same order."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.engine import env as env_module
from npusim.engine import flow
from npusim.engine.compiled import BUILDS, in_use
from npusim.engine.env import SimEnv
from npusim.hw import pipe

ROOT = Path(__file__).resolve().parents[2]


def pure(module) -> object:
    """A fresh copy of `module` from its source, under another name (so it keeps its pure
    classes)."""
    spec = importlib.util.spec_from_file_location(f"pure_{module.__name__}", module.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(flow_mod, pipe_mod, links: list[float], flows: list[tuple]) -> list[tuple]:
    """Issue each (start, size, cap, path indices, latency, fenced) transfer on one of
    three MTE pipes (queued behind the pipe's earlier transfers, fenced ones behind their
    deliveries), started by the network's timer when the issue lies ahead; run the loop
    a launch runs. Returns every stream end, delivery and bandwidth change in order."""
    env = SimEnv()
    net = flow_mod.FlowNetwork(env)
    res = [flow_mod.Resource(f"r{i}", "test", i, b) for i, b in enumerate(links)]
    pipes = [pipe_mod.TransferPipe(env, f"mte{i}", net.call_at) for i in range(3)]
    log: list[tuple] = []
    net.observer = lambda r, t, used: log.append(("used", r.name, t, used))

    def issue(i, at, size, cap, path, latency, fenced):
        pipe = pipes[i % 3]
        op = pipe_mod.Op(env, f"t{i}", pipe.name)
        pipe.issue(op)
        if fenced:
            pipe.fence()

        def sent():
            log.append(("sent", i, env.now))
            pipe.sent()

        def done(t):
            pipe.landed(op, t)
            op.complete(t)
            pipe.delivered(op)
            log.append(("done", i, t, op.start_at, pipe.busy_ns, pipe.busy_union_ns))

        def begin():
            pipe.began(op)
            net.start(size, cap, path, latency, done, sent, op.event() if i % 2 else None)

        pipe.submit(at, begin)

    def core(flows):
        for i, (start, size, cap, path, latency, fenced) in enumerate(flows):
            if start > env.now:
                yield env.timeout(start - env.now)
            # issued 0.75 ns ahead of the simulator, as a core's clock runs ahead
            issue(i, env.now + 0.75 * (i % 2), size, cap, tuple(res[p] for p in path),
                  latency, fenced)

    env.process(core(sorted(flows, key=lambda f: f[0])))
    env.advance(env.event(), float("inf"), 15, lambda t, n: log.append(("report", t, n)))
    log.append(("end", env.now, env.events_processed, net.active, [r.bytes for r in res]))
    return log


FLOW = st.tuples(st.sampled_from([0.0, 0.0, 1.5, 3.0, 7.25]),  # issue time
                 st.integers(1, 4000),  # size
                 st.sampled_from([4.0, 8.0, 16.0, 64.0, 200.0]),  # cap
                 st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
                 st.sampled_from([0.0, 0.0, 2.0, 11.5]),  # latency
                 st.booleans())  # fenced


@pytest.mark.skipif(in_use() != list(BUILDS), reason="no compiled build here")
@settings(max_examples=60, deadline=None)
@given(links=st.lists(st.sampled_from([10.0, 25.0, 40.0, 96.0]), min_size=4, max_size=4),
       flows=st.lists(FLOW, min_size=1, max_size=24))
def test_the_compiled_core_matches_the_pure_modules_bit_for_bit(links, flows):
    assert flow.FlowNetwork.__module__ == "npusim.engine._flow"
    assert pipe.TransferPipe.__module__ == "npusim.hw._pipe"
    built = run(flow, pipe, links, flows)
    loop = env_module.run_events
    env_module.run_events = pure(env_module).run_events
    try:
        reference = run(pure(flow), pure(pipe), links, flows)
    finally:
        env_module.run_events = loop
    assert built == reference


def test_setup_builds_what_the_package_adopts():
    text = (ROOT / "setup.py").read_text()
    for name in BUILDS:
        assert f'"{name}"' in text


def python(code: str, **env: str) -> str:
    full = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_pure_modules_serve_when_the_build_is_absent():
    code = ("import sys; sys.modules['npusim.engine._flow'] = None\n"
            "from npusim.engine import flow\n"
            "from npusim.engine.env import SimEnv\n"
            "env = SimEnv(); net = flow.FlowNetwork(env)\n"
            "link = (flow.Resource('l', 'test', 0, 10.0),)\n"
            "net.start(1000, 10.0, link, 0.0, lambda t: print(t)); env.run()\n"
            "print(flow.FlowNetwork.__module__)")
    assert python(code).split() == ["100.0", "npusim.engine.flow"]


def test_npusim_pure_python_forces_the_pure_modules():
    code = ("from npusim.engine import compiled, flow; from npusim.hw import pipe\n"
            "print(flow.FlowNetwork.__module__, pipe.Op.__module__, compiled.in_use())")
    got = python(code, NPUSIM_PURE_PYTHON="1")
    assert got == "npusim.engine.flow npusim.hw.pipe []"


def test_a_build_older_than_its_edited_source_is_not_used(monkeypatch):
    """An edited pure module in an editable install runs as edited until it is rebuilt."""
    import importlib
    import os

    from npusim.engine import compiled

    try:
        build = importlib.import_module("npusim.engine._flow")
    except ImportError:
        pytest.skip("no compiled build here")
    monkeypatch.setattr(compiled, "PURE", False)
    real = os.path.getmtime
    built = real(build.__file__)

    def edited(path):  # the pure source saved just past the allowance after its build
        if str(path).endswith("flow.py"):
            return built + compiled.STALE_AFTER_S + 1.0
        return real(path)

    monkeypatch.setattr(os.path, "getmtime", edited)
    assert compiled.compiled("npusim.engine._flow") is None
    monkeypatch.setattr(os.path, "getmtime", real)
    assert compiled.compiled("npusim.engine._flow") is not None
