"""What bounds a HIXL transfer, from the preset alone: the steady-state cost per descriptor
of each stage it goes through, and the stage that is the slowest.

The stages run side by side, so the slowest sets the pace:

* the expansion: an AICPU kernel's fixed cost shared by its descriptors plus one SQE's
  (AICPU expansion), or one aclrtMemcpyAsync on the host thread (host expansion);
* the engine: each SQE holds it for the responses it waits on (npusim.hw.copy_path: the
  round trips), then streams its bytes at the narrowest rate on its path;
* over RoCE the NIC's send queue instead: each WQE holds it `rdma.wqe_ns`, then streams
  its bytes and their packet headers through the NIC port (npusim.hw.rdma.memory_path).

The simulated figure is what counts; this says why it is what it is, in the words a user
acts on: the descriptors (fewer, larger blocks), the round trips (the same), or a named
port (nothing a block size changes).
"""

from __future__ import annotations

from typing import Any

from npusim.hw.copy_path import Memory, hold_ns
from npusim.hw.fabric import level_between, levels_of
from npusim.hw.rdma import wire_bytes
from npusim.kernels.hixl.transfer import HOST_STREAMS, KERNEL_DESCS, HixlTiling


def _device_rates(cfg: Any, lv: Any) -> list[tuple[float, str]]:
    """The link rates a copy between two dies joined at level `lv` crosses (a level that
    shares another's ports, such as the supernode's the server's, crosses those)."""
    if lv.sharing == "pair":
        return [(lv.link_gbps, f"the {lv.name} link")]
    if lv.sharing != "die":
        lv = next(x for x in levels_of(cfg.fabric, 1) if x.name == lv.sharing)
    return [(lv.egress_gbps, f"the die's {lv.name} port"),
            (lv.ingress_gbps, f"the die's {lv.name} port")]


def legs(t: HixlTiling) -> tuple[float, list[tuple[float, str]]]:
    """(ns an SQE holds the engine, [(GB/s, what)] of every rate on its path) of pair 0:
    the holds are npusim.hw.copy_path's, the rates those of the resources it crosses."""
    cfg = t.hw
    local, target = t.local_of(0), t.target_of(0)
    rates: list[tuple[float, str]] = [(cfg.sdma.bandwidth_gbps, "the SDMA engine")]
    hold = 0.0
    reading = {False: t.op == "put", True: t.op == "get"}  # which side the engine reads
    for is_host, remote in ((t.local_host, False), (t.remote_host, True)):
        mem = Memory(target if remote else local, is_host)
        hold += hold_ns(cfg, local, mem, reading[remote])
        if is_host:
            host = cfg.host
            rates += [(host.npu_link_gbps, "the die's host port"), (host.dram_gbps, "DRAM")]
            rates.append((host.read_gbps, "the socket's read port") if reading[remote]
                         else (host.write_gbps, "the socket's write port"))
        elif remote:
            rates += _device_rates(cfg, level_between(cfg.fabric, local, target))
    return hold, rates


def nic_legs(t: HixlTiling, size: float) -> tuple[float, list[tuple[float, str]]]:
    """(ns a WQE holds the NIC's queue, [(GB/s, what)] of every rate on its path) for a
    message of `size` bytes: the port at the payload's share of the wire, and the host
    ports and DRAM of a host side (both sides' own, the same figures)."""
    cfg = t.hw
    nic = cfg.rdma
    n = max(1, round(size))
    rates = [(nic.port_gbps * n / wire_bytes(n, nic.mtu_bytes, nic.header_bytes),
              "the NIC port (payload)")]
    for is_host, reads in ((t.local_host, t.op == "put"), (t.remote_host, t.op == "get")):
        if is_host:
            host = cfg.host
            rates += [(host.npu_link_gbps, "the die's host port"), (host.dram_gbps, "DRAM")]
            rates.append((host.read_gbps, "the socket's read port") if reads
                         else (host.write_gbps, "the socket's write port"))
    return nic.wqe_ns, rates


def bound_fields(t: HixlTiling) -> dict[str, Any]:
    """The stages' costs per descriptor (us) at the transfer's mean descriptor size, and
    `bound`: the stage that sets the pace."""
    pieces = t.pieces()
    n = len(pieces)
    size = sum(p[2] for p in pieces) / n
    roce = t.transport == "roce"
    hold, rates = nic_legs(t, size) if roce else legs(t)
    rate, narrowest = min(rates)
    stream = size / rate
    landing = t.hw.sdma.latency_ns
    if t.expansion == "aicpu":
        per_kernel = min(KERNEL_DESCS, n)
        expand = t.hw.aicpu.kernel_ns / per_kernel + t.hw.aicpu.sqe_ns
        what = "the descriptors: the AICPU's kernels and SQEs"
        engine = hold + stream
    else:
        expand = t.hw.host.memcpy_async_ns
        what = "the descriptors: the host's aclrtMemcpyAsync calls"
        # each stream waits for its copy to land before the next
        engine = max(hold + stream, (hold + stream + landing) / HOST_STREAMS)
    if expand >= engine:
        bound = what
    elif hold >= stream:
        bound = ("the NIC's work per WQE (rdma.wqe_ns)" if roce else
                 "the round trips: each SQE holds the engine for the responses it waits on")
    else:
        bound = f"{narrowest} ({rate:g} GB/s)"
    return {
        "bound": bound,
        "per_descriptor_us": {"expansion": expand / 1000.0, "engine_hold": hold / 1000.0,
                              "engine_stream": stream / 1000.0},
        "narrowest_gbps": rate,
    }
