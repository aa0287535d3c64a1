"""One line saying why an op took as long as it did, computed from the report's numbers.

The rules, in order (docs/report.md explains them with the thresholds):
1. bytes-bound on a link: the busiest link of a class needs >= LINK_BOUND of the span of
   the phase that moves that class's bytes (bytes / bandwidth over the phase's span);
2. imbalance: in some phase the core with the most transfer time (its bytes at its port
   rates) has >= IMBALANCE_RATIO x the median core's, and the excess is
   >= IMBALANCE_SHARE of the latency (what evening out the work could save at most);
3. bytes-bound on core ports: one core's transfers at its MTE port rates need
   >= PORT_BOUND of the latency;
4. otherwise latency-bound: the time goes to fixed latencies (launch, put and read
   latencies, flag round trips), not to moving bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.hw.cores import AIV, CoreKind
from npusim.report.work import link_label, port_caps

LINK_BOUND = 0.6
PORT_BOUND = 0.4
IMBALANCE_RATIO = 1.5
IMBALANCE_SHARE = 0.15


def _result(kind: str, text: str, resource: str | None = None, phase: str | None = None,
            **evidence: Any) -> dict[str, Any]:
    ev = {k: round(v, 4) if isinstance(v, float) else v for k, v in evidence.items()}
    return {"kind": kind, "resource": resource, "phase": phase, "text": text, **ev}


def _link_bound(op: Mapping[str, Any]) -> dict[str, Any] | None:
    best = None
    for kind, c in op.get("link_classes", {}).items():
        u = c.get("utilisation_in_phase", 0.0)
        if u >= LINK_BOUND and (best is None or u > best[0]):
            best = (u, kind, c)
    if best is None:
        return None
    u, kind, c = best
    during = f" during {c['phase']}" if c.get("phase") else ""
    return _result("bytes-bound", f"bytes-bound on {link_label(kind)} ({u:.0%} "
                   f"utilised{during}; busiest {c['busiest']})", resource=kind,
                   phase=c.get("phase"), utilisation=u)


def _phase_work(core: Mapping[str, Any], phase: str, caps: Mapping[tuple[str, bool], float]
                ) -> dict[str, list[float]]:
    """name -> [count, stream us, remote] of a core's transfers in one phase."""
    work: dict[str, list[float]] = {}
    for t_phase, pipe, name, remote, count, nbytes in core.get("transfers", []):
        if t_phase == phase:
            w = work.setdefault(name, [0, 0.0, 0])
            w[0] += count
            cap = caps.get((pipe, remote), 0.0)
            w[1] += nbytes / cap / 1000.0 if cap > 0 else 0.0
            w[2] = w[2] or int(remote)
    return work


def _imbalance(op: Mapping[str, Any], caps: Mapping[tuple[str, bool], float]
               ) -> dict[str, Any] | None:
    """The phase where the busiest core's stream time exceeds the median core's most."""
    latency = op.get("latency_us", 0.0)
    best = None
    for phase in op.get("phase_order", []):
        rows = []
        for rank in op.get("ranks", []):
            for core in rank.get("cores", []):
                if phase in core.get("phases", {}):
                    us = max(_stream_us(core, phase, caps).values(), default=0.0)
                    rows.append((us, -rank["rank"], -core["core"], rank["rank"], core))
        if len(rows) < 3:
            continue
        rows.sort(key=lambda row: row[:3])
        top, med = rows[-1], rows[(len(rows) - 1) // 2]
        excess = top[0] - med[0]
        if (top[0] >= IMBALANCE_RATIO * med[0] and excess >= IMBALANCE_SHARE * latency
                and (best is None or excess > best[0])):
            best = (excess, phase, top, med)
    if best is None:
        return None
    excess, phase, (us, _, _, rank, core), (m_us, _, _, m_rank, m_core) = best
    work = _phase_work(core, phase, caps)
    name, (count, _, remote) = max(work.items(), key=lambda kv: (kv[1][1], kv[0]))
    m_count = _phase_work(m_core, phase, caps).get(name, [0])[0]
    verb = "sends" if remote else "issues"
    text = (f"imbalance: rank {rank} core {core['core']} {verb} {count:.0f} {name} in {phase}, "
            f"median core {m_count:.0f} ({us:.1f} us vs {m_us:.1f} us of transfers at port rate, "
            f"{excess / latency:.0%} of the latency)")
    return _result("imbalance", text, phase=phase, rank=rank, core=core["core"],
                   stream_us=us, median_stream_us=m_us, median_rank=m_rank,
                   median_core=m_core["core"], share=excess / latency)


def _stream_us(core: Mapping[str, Any], phase: str, caps: Mapping[tuple[str, bool], float]
               ) -> dict[str, float]:
    out = dict.fromkeys(dict.fromkeys(p for p, _ in caps), 0.0)
    for t_phase, pipe, _name, remote, _count, nbytes in core.get("transfers", []):
        cap = caps.get((pipe, remote), 0.0)
        if t_phase == phase and cap > 0:
            out[pipe] = out.get(pipe, 0.0) + nbytes / cap / 1000.0
    return out


def _bytes_share(op: Mapping[str, Any]) -> tuple[float, str | None, Mapping[str, Any] | None]:
    best: tuple[float, str | None, Mapping[str, Any] | None] = (0.0, None, None)
    for pipe, p in op.get("ports", {}).items():
        if p.get("share_of_latency", 0.0) > best[0]:
            best = (p["share_of_latency"], pipe, p)
    return best


def diagnose(op: Mapping[str, Any], hardware: Mapping[str, Any] | None = None,
             kind: CoreKind = AIV) -> dict[str, Any]:
    """The op's diagnosis: kind, resource or phase, a one-line text and its evidence.
    `hardware` (the report's preset) gives the port caps of the core kind's transfer
    pipes for per-phase stream times."""
    latency = op.get("latency_us", 0.0)
    if latency <= 0 or not op.get("phase_order"):
        return _result("unknown", "unknown: no phase spans recorded")
    if not op.get("ports") and not op.get("link_classes"):
        return _result("unknown", "unknown: no transfer statistics recorded")
    found = _link_bound(op) or _imbalance(op, port_caps(hardware or {}, kind))
    if found is not None:
        return found
    share, pipe, port = _bytes_share(op)
    if port is not None and share >= PORT_BOUND:
        label = kind.labels().get(pipe or "", pipe)
        return _result("bytes-bound", f"bytes-bound on core {label} ports (rank {port['rank']} "
                       f"core {port['core']} streams {port['stream_us']:.1f} us of the "
                       f"{latency:.1f} us latency at port rate)", resource=pipe, share=share)
    crit = op.get("critical") or {}
    link_share = max((c.get("utilisation_max", 0.0) for c in op.get("link_classes", {}).values()),
                     default=0.0)
    share = max(share, link_share)
    tail = f"; critical phase {crit['phase']}" if crit.get("phase") else ""
    return _result("latency-bound", "latency-bound: flag round trips and fixed latencies "
                   f"(moving the bytes at full rate explains {share:.0%} of {latency:.1f} us"
                   f"{tail})", phase=crit.get("phase"), share=share)
