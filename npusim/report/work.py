"""Bytes moved and the bandwidth they needed: per core, per link class, per port.

Stream time is what a byte count costs at a full rate (bytes / GB/s = ns): a core's MTE
port at its cap, a link at its bandwidth. Compared with a phase or the op latency it
says how much of the time moving bytes explains; sharing and latency only add to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from npusim.hw.cores import AIV, CoreKind, pipe_cap
from npusim.result import LinkStats, TransferStat

LINK_KINDS = ("egress", "ingress", "d2d", "hbm")  # the flat fabric's classes, in report order
# a core's transfers in report.json are rows of these (compact: W=64 has 4096 cores)
TRANSFER_FIELDS = ("phase", "pipe", "name", "remote", "count", "bytes")
LINK_LABELS = {"egress": "die egress", "ingress": "die ingress", "d2d": "die-to-die link",
               "hbm": "HBM"}


def link_label(kind: str) -> str:
    """'die egress' for the flat fabric's classes; 'server egress' for a level's."""
    return LINK_LABELS.get(kind) or kind.replace(".", " ")


def kinds_of(links: Sequence[LinkStats]) -> list[str]:
    """The link classes present: the flat fabric's in LINK_KINDS order, a topology's levels
    in the fabric's order (inner to outer), HBM last."""
    present = dict.fromkeys(lk.kind for lk in links)
    known = [k for k in LINK_KINDS if k in present]
    levels = [k for k in present if k not in LINK_KINDS]
    return [*(k for k in known if k != "hbm"), *levels, *(["hbm"] if "hbm" in present else [])]


def port_caps(hardware: Mapping[str, Any], kind: CoreKind = AIV
              ) -> dict[tuple[str, bool], float]:
    """(pipe, remote) -> the port cap in GB/s of every transfer pipe the core kind
    declares (0 when the kind or the preset does not say)."""
    hw = hardware if isinstance(hardware, Mapping) else {}
    out = {}
    for p in kind.transfer_pipes():
        for remote in (False, True):
            cap = pipe_cap(hw, p, remote)
            out[(p.name, remote)] = cap if cap is not None else 0.0
    return out


def stream_ns(stats: Sequence[TransferStat], caps: Mapping[tuple[str, bool], float],
              phase: str | None = None) -> dict[str, float]:
    """Per transfer pipe, the ns a core's transfers (of one phase, or all) take at its
    port caps."""
    out = dict.fromkeys(dict.fromkeys(p for p, _ in caps), 0.0)
    for s in stats:
        if phase is not None and s.phase != phase:
            continue
        cap = caps.get((s.pipe, s.remote), 0.0)
        if cap > 0:
            out[s.pipe] = out.get(s.pipe, 0.0) + s.bytes / cap
    return out


def bytes_by_phase(core_transfers: Sequence[Sequence[Sequence[TransferStat]]],
                   remote_only: bool) -> dict[str, int]:
    """Bytes moved per phase over every core of every rank (remote puts only, or all)."""
    out: dict[str, int] = {}
    for row in core_transfers:
        for stats in row:
            for s in stats:
                if s.remote or not remote_only:
                    out[s.phase] = out.get(s.phase, 0) + s.bytes
    return out


def heaviest(by_phase: Mapping[str, int]) -> str | None:
    """The phase that moved the most bytes (first in insertion order on a tie)."""
    best, most = None, 0
    for name, n in by_phase.items():
        if n > most:
            best, most = name, n
    return best


def link_classes(links: Sequence[LinkStats], duration_ns: float,
                 windows: Mapping[str, tuple[str | None, float]]) -> dict[str, dict[str, Any]]:
    """Per link kind: totals, the busiest link, achieved GB/s and utilisation.

    windows[kind] = (phase, ns): the span of the phase that moved that kind's bytes, so a
    link busy only during send_data is not diluted by the rest of the op; a kind not named
    takes windows["fabric"] (a topology's level links)."""
    out: dict[str, dict[str, Any]] = {}
    by_kind: dict[str, list[LinkStats]] = {}
    for lk in links:
        by_kind.setdefault(lk.kind, []).append(lk)
    for kind in kinds_of(links):
        ls = by_kind[kind]
        top = max(ls, key=lambda lk: (lk.bytes / lk.bandwidth_gbps if lk.bandwidth_gbps > 0
                                      else 0.0, -lk.rank))
        phase, window = windows.get(kind, windows.get("fabric", (None, duration_ns)))
        total = sum(lk.bytes for lk in ls)
        need = top.bytes / top.bandwidth_gbps if top.bandwidth_gbps > 0 else 0.0
        out[kind] = {
            "links": len(ls),
            "bandwidth_gbps": top.bandwidth_gbps,
            "bytes": total,
            "busiest": top.name,
            "busiest_rank": top.rank,
            "busiest_bytes": top.bytes,
            "achieved_gbps_max": top.bytes / duration_ns if duration_ns > 0 else 0.0,
            "achieved_gbps_mean": total / len(ls) / duration_ns if duration_ns > 0 else 0.0,
            "utilisation_max": need / duration_ns if duration_ns > 0 else 0.0,
            "phase": phase,
            "utilisation_in_phase": need / window if window > 0 else 0.0,
        }
    return out
