"""The die's SDMA engines: in-order queues of GM -> GM copies that AIV cores post.

An engine is a core kind (npusim.hw.cores.SDMA: `sdma.engines` per die, one transfer
pipe "sdma"), so the machine builds it like any core. It runs no program: SHMEM's
`aclshmemx_sdma_put_nbi` writes an SQE (a STARS descriptor) into the core's queue in GM
and rings the doorbell, and from then on the engine works alone. So an SQE reaches its
engine at the doorbell (`sqe(..., at=)`) and streams its bytes once the SQEs ahead of it
on that engine have streamed theirs (their landing latencies overlap, as on an MTE
pipe), at up to `sdma.bandwidth_gbps`, through the source HBM, the links of the level
it crosses and the destination HBM: the resources MTE puts use, so the two planes share
the links. Its bytes land `sdma.latency_ns` plus that level's latency after its last
byte. A fenced SQE (the flag SQE of `aclshmemx_sdma_quiet`) starts only when every
earlier SQE of its engine has landed, which is what makes the flag a completion signal.

The copied bytes are read from the source when they land (like an MTE2 read): the
kernels post SDMA copies only of GM that nothing writes during the call.

A copy to or from host memory also holds its engine for the table walks of the host
pages the die's SMMU does not hold (npusim.hw.host.walk_of), before its bytes stream.

`queued_copy` is the queue itself, shared with the NIC's send queues (npusim.hw.rdma): a
copy's path says what it streams through, at what cap, with what setup and wire bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from npusim.hw.host import walk_of
from npusim.hw.machine import Machine
from npusim.hw.memory import Region
from npusim.hw.pipe import Op, TransferPipe

KIND = "sdma"  # the core kind's and the pipe's name


def queue_pipe(machine: Machine, rank: int, index: int, kind: str) -> TransferPipe:
    """Queue `index` (modulo their number) of rank `rank`'s engines of `kind`: the one
    transfer pipe of that engine (cores_of[kind])."""
    engines = machine.ranks[rank].cores_of.get(kind)
    if not engines:
        raise KeyError(f"rank {rank} has no {kind} queue (the machine was built without the "
                       f"{kind!r} kind)")
    return engines[index % len(engines)].pipes[kind]  # type: ignore[return-value]


def engine_pipe(machine: Machine, rank: int, engine: int) -> TransferPipe:
    """The queue of engine `engine` of rank `rank` (cores_of['sdma'])."""
    return queue_pipe(machine, rank, engine, KIND)


def route(machine: Machine, rank: int, dst_rank: int, nbytes: int) -> tuple[tuple, float]:
    """The resources and landing latency (ns) of an SQE of `rank`'s engine copying
    `nbytes` into `dst_rank`'s memory: its own HBM (the read), for another rank the links
    of the level crossed, and the landing die's L2 or HBM (Rank.write_path)."""
    lat = machine.cfg.sdma.latency_ns
    read = machine.ranks[rank].read_path(nbytes)
    landing = machine.ranks[dst_rank].write_path(nbytes)
    if dst_rank == rank:  # one HBM crossing for a copy within the die, as a flow
        return read, lat
    links, level_latency = machine.fabric.route(rank, dst_rank)
    return (*read, *links, *landing), lat + level_latency


def sqe(machine: Machine, rank: int, src: Region, src_offset: int, dst: Region,
        dst_offset: int, nbytes: int, at: float, name: str = "sdma", engine: int = 0,
        fenced: bool = False, landed: Callable[[float], None] | None = None,
        core: int = 0, via: Path | None = None, count: bool | None = None) -> Op:
    """One SQE of rank `rank`'s engine, at its engine from time `at` (the doorbell):
    copy `nbytes` from `src` to `dst` (either may be on any rank). The returned op
    completes when the bytes have landed; `landed(t)` runs then. The detailed trace
    shows it on lane "sdma" of `core`, the core that posted it. `via` replaces the
    die-to-die route with a path of npusim.hw.copy_path (to or from host memory, whose
    bytes are not counted as sent to another rank unless `count`, or a read of another
    die's GM)."""
    if count is None:
        count = via is None
    if via is None:
        links, latency = route(machine, rank, dst.rank, nbytes)
        via = Path(links, latency, machine.cfg.sdma.bandwidth_gbps)
    walk = (walk_of(machine, rank, src, src_offset, nbytes)
            + walk_of(machine, rank, dst, dst_offset, nbytes))
    if walk:
        via = replace(via, setup_ns=via.setup_ns + walk)
    return queued_copy(machine, engine_pipe(machine, rank, engine), KIND, rank, src,
                       src_offset, dst, dst_offset, nbytes, at, via, name,
                       fenced=fenced, landed=landed, core=core, count=count)


@dataclass(frozen=True)
class Path:
    """How an engine's copy travels: the resources it streams through, the latency after
    its last byte, the engine's own rate cap; `wire` bytes cross the resources for each
    copy of n bytes (a NIC's packet headers; None: n), `setup_ns` of the engine's time
    before the first byte (a NIC fetching its work request)."""

    resources: tuple
    latency_ns: float
    cap_gbps: float
    wire: Callable[[int], int] | None = None
    setup_ns: float = 0.0


def queued_copy(machine: Machine, pipe: TransferPipe, kind: str, rank: int, src: Region,
                src_offset: int, dst: Region, dst_offset: int, nbytes: int, at: float,
                path: Path, name: str, fenced: bool = False,
                landed: Callable[[float], None] | None = None, core: int = 0,
                count: bool = True) -> Op:
    """One copy on an engine's in-order queue `pipe` (an SDMA engine, a NIC's send
    queue): it reaches the queue at `at`, waits for the copies ahead of it to stream
    theirs (a fenced one: to land), spends the path's setup time, streams, and lands
    the path's latency after its last byte; then the bytes are written, the op
    completes and `landed(t)` runs. `count`: the bytes count as sent to another rank."""
    if count and dst.rank != rank:
        machine.ranks[rank].bytes_out += nbytes
        machine.ranks[dst.rank].bytes_in += nbytes
    op = Op(machine.env, name, kind)
    pipe.issue(op)
    if fenced:
        pipe.fence()
    trace = machine.trace
    sent_at = [0.0]
    size = path.wire(nbytes) if path.wire is not None else nbytes

    def sent() -> None:
        sent_at[0] = machine.env.now
        pipe.sent()

    def done(t: float) -> None:
        if trace.detailed:
            trace.activity(rank, core, kind, name, op.start_at, sent_at[0], nbytes, t)
        dst.write(dst_offset, src.read(src_offset, nbytes))
        pipe.landed(op, t)
        op.complete(t)
        pipe.delivered(op)
        if landed is not None:
            landed(t)

    def stream() -> None:
        machine.net.start(size, path.cap_gbps, path.resources, path.latency_ns, done, sent,
                          op.event())

    def begin() -> None:
        pipe.began(op)
        if path.setup_ns > 0:
            pipe.later(machine.env.now + path.setup_ns, stream)
        else:
            stream()

    pipe.submit(at, begin)
    return op
