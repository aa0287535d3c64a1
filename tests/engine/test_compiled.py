"""The optional compiled core gives exactly what the pure modules give, and the pure
modules serve when it is absent or NPUSIM_PURE_PYTHON is set.

The pure modules are loaded from their source under another name (so they keep their
pure classes), the compiled ones are their builds; both run the same random scenario
(transfers queued on MTE pipes, fenced, started by the network's timer, sharing links,
with delivery latencies) through a launch's event loop and must record the same times,
to the last bit, in the same order. The UB's write marks and the window's put claims,
zones and watchers answer a random sequence of calls alike; and a whole run (kernel
programs copying and putting through the compiled transfer path) digests the same on
both paths."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.engine import env as env_module
from npusim.engine import flow
from npusim.engine.compiled import BUILDS, in_use
from npusim.engine.env import SimEnv
from npusim.hw import memory, pipe, ub

ROOT = Path(__file__).resolve().parents[2]


def pure(module) -> object:
    """A fresh copy of `module` from its source, under another name (so it keeps its pure
    classes)."""
    spec = importlib.util.spec_from_file_location(f"pure_{module.__name__}", module.__file__)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (a dataclass looks its module up)
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


# (op, start, nbytes): marks of UB bytes as written, then questions about ranges
UB_OPS = st.lists(st.tuples(st.sampled_from(["mark", "unwritten", "blocks"]),
                            st.integers(0, 1000), st.integers(0, 300)), max_size=40)


def ub_log(ub_mod, ops: list[tuple]) -> list:
    local = ub_mod.UnifiedBuffer(1536, 32)
    a = local.alloc("a", 700)
    b = local.alloc("b", 100)
    log: list = [(a.offset, a.nbytes, b.offset, b.nbytes, local.top)]
    for op, start, n in ops:
        if op == "mark":
            local.mark(start, n)
        elif op == "blocks":
            local.mark_blocks(start, n % 7, 1 + n % 13, 1 + n % 29)
        else:
            log.append(local.unwritten(start, n))
        a.write_ready, b.read_busy = start * 0.5, n / 3.0
        log.append((a.write_ready, b.read_busy))
    b.mark_written()
    log.append((local.written.tobytes(), b.all_written, a.view("float16", 8, 64).tobytes()))
    local.reset(new_call=True)
    log.append((local.top, local.written.tobytes()))
    return log


@pytest.mark.skipif("npusim.hw._ub" not in in_use(), reason="no compiled build here")
@settings(max_examples=60, deadline=None)
@given(ops=UB_OPS)
def test_compiled_ub_marks_match_the_pure_module(ops):
    assert ub.UnifiedBuffer.__module__ == "npusim.hw._ub"
    assert ub_log(ub, ops) == ub_log(pure(ub), ops)


# (op, offset, nbytes): writes (non-zero or zero bytes), put claims, zone questions,
# releases, over a window with three zones and a watcher
REGION_OPS = st.lists(st.tuples(st.sampled_from(["write", "zeros", "claim", "zone", "release"]),
                                st.integers(0, 3 << 16), st.integers(1, 70000)), max_size=30)


def region_log(mem_mod, ops: list[tuple]) -> list:
    win = mem_mod.SparseRegion("window", 3, 1 << 20)
    win.set_zones({"data": (0, 1 << 17), "status": (1 << 17, (1 << 17) + 4096),
                   "flags": (1 << 18, 3 << 17)})
    log: list = []
    watcher = mem_mod.Watcher(1 << 17, 64, lambda: log.append("woken"))
    win.watch(watcher)
    for i, (op, offset, n) in enumerate(ops):
        if op in ("write", "zeros"):
            data = np.full(n, (i % 251) + 1 if op == "write" else 0, np.uint8)
            win.write(offset, data)
            log.append(win.read(offset, n).tobytes() == data.tobytes())
        elif op == "claim":
            log.append(win.claim(offset, n, (i, i % 3, f"step{i % 2}")))
        elif op == "zone":
            log.append(win.zone_problem(offset, n))
        else:
            win.release(offset, n)
    win.unwatch(watcher)
    log.append((win.buf.tobytes(), win._written.tobytes(), win.puts(), win.watchers))
    return log


@pytest.mark.skipif("npusim.hw._memory" not in in_use(), reason="no compiled build here")
@settings(max_examples=40, deadline=None)
@given(ops=REGION_OPS)
def test_compiled_regions_match_the_pure_module(ops):
    assert memory.SparseRegion.__module__ == "npusim.hw._memory"
    assert region_log(memory, ops) == region_log(pure(memory), ops)


RUN = ("import sys; sys.path.insert(0, 'benchmarks')\n"
       "from fingerprint import parts\n"
       "from npusim.engine.compiled import in_use\n"
       "from npusim.scenario import load_scenario\n"
       "from npusim.sim import simulate\n"
       "for name in ('dispatch_combine_bs8', 'examples/link_bound',\n"
       "             'shmem_classic/a3_int32_ep2'):\n"
       "    r = simulate(load_scenario(f'scenarios/{name}.yaml'), workers=1)\n"
       "    print(name, r.events, sorted(parts(r).items()))\n"
       "print(in_use())")


@pytest.mark.skipif(in_use() != list(BUILDS), reason="no compiled build here")
def test_a_run_through_the_compiled_transfer_path_digests_as_the_pure_one():
    """Copies, puts, window writes and UB marks of whole kernel runs: the same events,
    times, bytes and outputs on both paths."""
    built, reference = python(RUN).splitlines(), python(RUN, NPUSIM_PURE_PYTHON="1").splitlines()
    assert built[-1] == repr(list(BUILDS)) and reference[-1] == "[]"
    assert built[:-1] == reference[:-1]


HOT_CALLS = """
import random
import numpy as np
from npusim.errors import KernelError
from npusim.hw.config import load_hardware
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch
from npusim.runtime.transfer import Strided, TransferPath
hw = load_hardware('atlas_a3', {'chip.aiv_cores': 4})

def program(seed, fault):
    def body(ctx):
        rng = random.Random(seed * 1000 + ctx.rank_id * 10 + ctx.core_id)
        ctx.family_note = (ctx.rank_id, ctx.core_id)  # what a family notes (__dict__)
        a, b = ctx.alloc('a', 2048), ctx.alloc('b', 2048)
        x, ops, puts = ctx.tensor('x'), [], 0
        for _ in range(30):
            k = rng.randrange(7)
            if k == 0:
                ctx.scalar(rng.choice([1, 2.5, 7, 0.3, 0]))
            elif k == 1:
                n = 32 * rng.randrange(1, 48)
                yield from ctx.wait(*ops)
                load = ctx.copy_in(a, x, 32 * rng.randrange(64), n)
                if fault:  # a read before the copy lands: refused
                    ctx.vector('add', n, 'float16', reads=[a], writes=[b])
                yield from ctx.wait(load)
                ops.append(ctx.vector('cast', n // 2, 'float16', reads=[a], writes=[b],
                                      passes=rng.choice([1.0, 2.0])))
            elif k == 2 and ops and b.all_written and puts < 30:
                yield from ctx.wait(*ops)
                ops.append(ctx.put(1 - ctx.rank_id, 32768 * ctx.core_id + 1024 * puts, b, 1024))
                puts += 1
            elif k == 3:
                yield from ctx.wait(*ops)
                ops.append(ctx.fixed('vector', 'dup', rng.choice([3.3, 10.0, 0.0]),
                                     writes=[a], issue_slots=rng.randrange(1, 4)))
            elif k == 4 and ops:
                yield from ctx.wait(ops[rng.randrange(len(ops))])
            elif k == 5:
                yield from ctx.pipe_barrier(rng.choice(['mte2', 'mte3', 'vector']))
                yield from ctx.wait(*ops)
                ops.append(ctx.copy_in(b, x, 0, 0, strided=Strided(4, 64, 64, 32)))
                yield from ctx.wait(ops[-1])
            else:
                yield from ctx.sync()
        yield from ctx.drain()
    return body

for seed in range(6):
    m = Machine(hw, world=2)
    for r in m.ranks:
        r.tensor('x', np.arange(8192, dtype=np.uint8))
    try:
        res = launch(m, program(seed, seed % 3 == 2))
    except KernelError as e:
        print(seed, 'refused:', e)
        continue
    for row in res.contexts:
        for c in row:
            assert isinstance(c, TransferPath) and c.family_note == (c.rank_id, c.core_id)
            print(seed, c.rank_id, c.core_id, float(c.t).hex(), sorted(c.counters.items()),
                  sorted(c.transfers.items()), c.core.busy_ns())
    print(seed, [float(t).hex() for row in res.core_end_ns for t in row], m.env.now)
print(TransferPath.__module__)
"""


@pytest.mark.skipif(in_use() != list(BUILDS), reason="no compiled build here")
def test_a_kernel_contexts_hot_calls_give_the_pure_clocks_counters_and_refusals():
    """Random programs of scalar work, vector and fixed instructions, copies (strided too),
    puts, waits, barriers and syncs on every core of two ranks, with a missing wait in
    some: the clocks to the last bit, the counters, the transfers, the pipes' busy times
    and the sanitiser's refusals are the same through the compiled `TransferPath` (the
    context's clock and hot calls as C fields and C calls) and the pure one."""
    built = python(HOT_CALLS).splitlines()
    reference = python(HOT_CALLS, NPUSIM_PURE_PYTHON="1").splitlines()
    assert (built[-1], reference[-1]) == ("npusim.runtime._transfer", "npusim.runtime.transfer")
    assert built[:-1] == reference[:-1]
    assert sum("refused:" in line and "missing wait" in line for line in built) == 2  # 2, 5
    assert sum(line.startswith("0 1 ") for line in built) == 4  # every core's line


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
    code = ("from npusim.engine import compiled, flow; from npusim.hw import memory, pipe, ub\n"
            "from npusim.runtime import transfer\n"
            "print(flow.FlowNetwork.__module__, pipe.Op.__module__, ub.UBBuffer.__module__,\n"
            "      memory.SparseRegion.__module__, transfer._Send.__module__,\n"
            "      compiled.in_use())")
    got = python(code, NPUSIM_PURE_PYTHON="1")
    assert got == ("npusim.engine.flow npusim.hw.pipe npusim.hw.ub npusim.hw.memory "
                   "npusim.runtime.transfer []")


@pytest.mark.parametrize("held", ["npusim.hw._ub", "npusim.hw._memory"])
def test_a_build_is_not_used_without_the_builds_whose_types_it_holds(held):
    """The compiled transfer path holds UB buffers and checks regions as the UB and memory
    builds' C types: with either module pure, the pure transfer path serves."""
    code = (f"import sys; sys.modules['{held}'] = None\n"
            "from npusim.engine import compiled; from npusim.runtime import transfer\n"
            "print(transfer._Send.__module__, 'npusim.runtime._transfer' in compiled.in_use())")
    assert python(code) == "npusim.runtime.transfer False"


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
