"""Copies a host thread puts on ACL streams: aclrtMemcpyAsync and aclrtSynchronizeStream.

The host thread pays `host.memcpy_async_ns` per call (the task's submission); the copy is
one SQE of the die's SDMA engine (npusim.hw.copy_path: any two memories the die can
address, device GM or host memory), and a stream runs its copies one after another: the
next starts once the one before it has completed. Synchronising waits for a stream's
last copy. The host thread is drawn on the lane of the core that runs it here (it is no
device core), and its copies are counted among that core's transfers on the engine's
pipe. Nothing here knows of a library or a family.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from npusim.hw import sdma as engine
from npusim.hw.copy_path import Memory, counted, engine_copy


class Stream:
    """An ACL stream of copies on engine `engine_index` of the die."""

    def __init__(self, engine_index: int = 0) -> None:
        self.engine = engine_index
        self.queue: deque[tuple[float, Callable[[float], Any]]] = deque()
        self.busy = False
        self.last: Any = None

    def submit(self, at: float, start: Callable[[float], Any]) -> None:
        """A task reaching the stream at `at`; `start(t)` begins it and returns its op."""
        self.queue.append((at, start))
        if not self.busy:
            self._next(at)

    def _next(self, now: float) -> None:
        if not self.queue:
            self.busy = False
            return
        at, start = self.queue.popleft()
        self.busy = True
        self.last = start(max(at, now))

    def synchronize(self, ctx: Any) -> Iterator[Any]:
        """aclrtSynchronizeStream: until the stream's last task has completed."""
        while self.busy:
            op = self.last
            yield from ctx.wait(op)
            if self.last is op and not self.queue:
                return


def memcpy_async(ctx: Any, stream: Stream, src: Any, src_offset: int, dst: Any,
                 dst_offset: int, nbytes: int, a: Memory, b: Memory,
                 name: str = "aclrtMemcpyAsync") -> None:
    """aclrtMemcpyAsync of `nbytes` from region `src` (in memory `a`) to `dst` (in `b`)
    on `stream`: the host thread's call, then the copy once the stream reaches it."""
    ctx.t += ctx.cfg.host.memcpy_async_ns
    pipe = engine.engine_pipe(ctx.machine, ctx.rank_id, stream.engine)
    ctx._count(pipe, name, nbytes, a.rank != ctx.rank_id or b.rank != ctx.rank_id)

    def start(at: float) -> Any:
        via = engine_copy(ctx.machine, ctx.rank_id, a, b, nbytes)
        return engine.sqe(ctx.machine, ctx.rank_id, src, src_offset, dst, dst_offset, nbytes,
                          at, name, stream.engine, core=ctx.core_id, via=via, count=counted(a, b),
                          landed=lambda t: stream._next(t))

    stream.submit(ctx.t, start)
