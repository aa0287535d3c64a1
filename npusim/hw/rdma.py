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
"""

from __future__ import annotations

from collections.abc import Callable

from npusim.hw.machine import Machine
from npusim.hw.memory import Region
from npusim.hw.pipe import Op, TransferPipe
from npusim.hw.sdma import Path, queue_pipe, queued_copy

KIND = "rdma"  # the core kind's and the pipe's name


def send_queue(machine: Machine, rank: int, queue: int) -> TransferPipe:
    """Send queue `queue` of rank `rank`'s NIC (cores_of['rdma'])."""
    return queue_pipe(machine, rank, queue, KIND)


def wire_bytes(nbytes: int, mtu: int, header: int) -> int:
    """What `nbytes` of payload put on the wire: ceil(n / mtu) packets of `header` each."""
    return nbytes + -(-nbytes // mtu) * header


def path(machine: Machine, rank: int, dst_rank: int, nbytes: int) -> Path:
    """A WQE's path from `rank`'s NIC into `dst_rank`'s memory: the source HBM (the
    read), the links of the level crossed, the landing die's L2 or HBM."""
    cfg = machine.cfg.rdma
    read = machine.ranks[rank].read_path(nbytes)
    landing = machine.ranks[dst_rank].write_path(nbytes)
    links, latency = machine.fabric.route(rank, dst_rank)
    return Path((*read, *links, *landing), latency, cfg.port_gbps,
                lambda n: wire_bytes(n, cfg.mtu_bytes, cfg.header_bytes), cfg.wqe_ns)


def post_send(machine: Machine, rank: int, src: Region, src_offset: int, dst: Region,
              dst_offset: int, nbytes: int, at: float, name: str = "rdma_write",
              queue: int = 0, landed: Callable[[float], None] | None = None,
              core: int = 0) -> Op:
    """One RDMA WRITE WQE on send queue `queue` of rank `rank`'s NIC, there from time `at`
    (the doorbell): `nbytes` of `src` (this rank's GM) into `dst` (another rank's). The op
    completes when the bytes have landed; `landed(t)` runs then. The detailed trace shows
    it on lane "rdma" of `core`, the core that posted it."""
    if machine.cfg.rdma is None:
        raise KeyError(f"the {machine.cfg.name} preset has no RDMA NIC (hardware.rdma)")
    if dst.rank == rank:
        raise ValueError("an RDMA WRITE goes to another rank")
    return queued_copy(machine, send_queue(machine, rank, queue), KIND, rank, src,
                       src_offset, dst, dst_offset, nbytes, at,
                       path(machine, rank, dst.rank, nbytes), name, landed=landed,
                       core=core)
