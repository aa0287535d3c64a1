"""The die's RoCE NIC: in-order send queues of RDMA WRITEs that AIV cores post.

An A2 card reaches the other servers through its RoCE port (the preset's outermost
`die` level: each card's egress and ingress). The A2 kernels post RDMA WRITEs from the AIV
itself (AIVRDMAPostSend: an hns_roce WQE and its SGE written into the queue pair's SQ in
GM, then the doorbell), and from then on the NIC works alone. So a WQE reaches its queue
when the doorbell lands (`post_send(..., at=)`) and, once the WQEs ahead of it on that
queue have streamed theirs, the NIC spends `rdma.wqe_ns` on it (reading the WQE and SGE,
the address lookup) and streams its packets at up to `rdma.port_gbps`: the message cut
into packets of at most `rdma.mtu_bytes` of payload, each carrying `rdma.header_bytes` of
framing on the wire, through the source HBM, the links of the level it crosses and the
destination HBM. The bytes land that level's latency after the last one.

The queue is the SDMA engine's (npusim.hw.sdma.queued_copy): one in-order pipe per
queue, a path with the NIC's cap, its per-WQE setup and its wire bytes. A WQE to a rank
of the same server takes the links that server level gives the pair (the kernels post
RDMA to other servers). The copied bytes are read from the source when they land.

A NIC that moves data between any two memories (a library's RDMA WRITE or READ, not a
kernel's AIV post) takes `memory_path` instead: the bytes leave the source die's NIC port
and enter the destination die's (each die's port, each way, one resource that all its
WQEs share: the NIC's own wire, not the fabric's links), read from the source's HBM or,
for host memory, from its socket through the source die's host port, and written likewise
on the far side. They land `rdma.latency_ns` after the last byte (plus the host legs'
flights). A READ is a WQE of the reading die's queue whose data comes from the far NIC:
the request goes out first, so it lands twice the latency after its last byte, but it
holds its queue no longer than a WRITE (the NIC keeps several READs outstanding).
"""

from __future__ import annotations

from collections.abc import Callable

from npusim.engine.flow import Resource
from npusim.hw.copy_path import Memory
from npusim.hw.host import host_of
from npusim.hw.machine import Machine
from npusim.hw.memory import Region
from npusim.hw.pipe import Op, TransferPipe
from npusim.hw.sdma import Path, queue_pipe, queued_copy
from npusim.units import ceil_div

KIND = "rdma"  # the core kind's and the pipe's name


def send_queue(machine: Machine, rank: int, queue: int) -> TransferPipe:
    """Send queue `queue` of rank `rank`'s NIC (cores_of['rdma'])."""
    return queue_pipe(machine, rank, queue, KIND)


def wire_bytes(nbytes: int, mtu: int, header: int) -> int:
    """What `nbytes` of payload put on the wire: ceil(n / mtu) packets of `header` each."""
    return nbytes + ceil_div(nbytes, mtu) * header


def _framed(machine: Machine) -> Callable[[int], int]:
    """The wire bytes of a message of n bytes on this preset's NIC."""
    cfg = machine.cfg.rdma
    return lambda n: wire_bytes(n, cfg.mtu_bytes, cfg.header_bytes)


def path(machine: Machine, rank: int, dst_rank: int, nbytes: int) -> Path:
    """A WQE's path from `rank`'s NIC into `dst_rank`'s memory: the source HBM (the
    read), the links of the level crossed, the landing die's L2 or HBM."""
    cfg = machine.cfg.rdma
    read = machine.ranks[rank].read_path(nbytes)
    landing = machine.ranks[dst_rank].write_path(nbytes)
    links, latency = machine.fabric.route(rank, dst_rank)
    return Path((*read, *links, *landing), latency, cfg.port_gbps, _framed(machine),
                cfg.wqe_ns)


def nic_ports(machine: Machine, rank: int) -> tuple[Resource, Resource]:
    """(out, in): die `rank`'s NIC port each way, built on first use and kept on the
    machine (Machine.nic) so that every WQE of the die shares it."""
    ports = machine.nic.get(rank)
    if ports is None:
        bw = machine.cfg.rdma.port_gbps
        ports = machine.nic[rank] = (Resource(f"rank{rank}.nic_out", "rdma.port_out", rank, bw),
                                     Resource(f"rank{rank}.nic_in", "rdma.port_in", rank, bw))
    return ports


def _side(machine: Machine, mem: Memory, nbytes: int, reading: bool) -> tuple[tuple, float]:
    """(resources, flight ns) between `mem` and its die's NIC: the die's HBM, or its
    socket's DRAM and port and the die's host port (the PE's own host memory)."""
    if not mem.host:
        rank = machine.ranks[mem.rank]
        return (rank.read_path(nbytes) if reading else rank.write_path(nbytes)), 0.0
    host = host_of(machine)
    leg = host.read_path(mem.rank, mem.rank) if reading else host.write_path(mem.rank, mem.rank)
    return leg.resources, leg.latency_ns


def memory_path(machine: Machine, rank: int, src: Memory, dst: Memory, nbytes: int) -> Path:
    """The path of a WQE of die `rank`'s NIC moving `nbytes` from `src` to `dst` (one of
    them on `rank`, the other on another die): the source side, the source die's port
    out, the destination die's port in, the destination side; at the port's rate with
    its packets' headers and `rdma.wqe_ns` first. It lands `rdma.latency_ns` after its
    last byte, twice that for a READ (`dst` on `rank`: the request went out first), plus
    the host legs' flights."""
    if src.rank == dst.rank:
        raise ValueError("an RDMA WQE moves bytes between two dies' memories")
    cfg = machine.cfg.rdma
    head, first = _side(machine, src, nbytes, True)
    tail, last = _side(machine, dst, nbytes, False)
    ports = (nic_ports(machine, src.rank)[0], nic_ports(machine, dst.rank)[1])
    trips = 1 if src.rank == rank else 2
    # two dies on one socket cross its DRAM on both sides: a flow counts it once
    resources = tuple(dict.fromkeys((*head, *ports, *tail)))
    return Path(resources, trips * cfg.latency_ns + first + last,
                cfg.port_gbps, _framed(machine), cfg.wqe_ns)


def post_send(machine: Machine, rank: int, src: Region, src_offset: int, dst: Region,
              dst_offset: int, nbytes: int, at: float, name: str = "rdma_write",
              queue: int = 0, landed: Callable[[float], None] | None = None,
              core: int = 0, via: Path | None = None) -> Op:
    """One RDMA WQE on send queue `queue` of rank `rank`'s NIC, there from time `at` (the
    doorbell): a WRITE of `nbytes` of `src` (this rank's GM) into `dst` (another rank's)
    over the fabric (`path`), or, with `via` (a `memory_path`), the copy that path names,
    a WRITE or a READ. The op completes when the bytes have landed; `landed(t)` runs
    then. The detailed trace shows it on lane "rdma" of `core`, the core that posted it."""
    if machine.cfg.rdma is None:
        raise KeyError(f"the {machine.cfg.name} preset has no RDMA NIC (hardware.rdma)")
    if via is None and dst.rank == rank:
        raise ValueError("an RDMA WRITE goes to another rank")
    return queued_copy(machine, send_queue(machine, rank, queue), KIND, rank, src,
                       src_offset, dst, dst_offset, nbytes, at,
                       via or path(machine, rank, dst.rank, nbytes), name, landed=landed,
                       core=core)
