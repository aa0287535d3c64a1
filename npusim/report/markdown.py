"""report.md: the report document as Markdown tables a reviewer can read in a browser.

Built from the report document only (like the summary), so it can be regenerated from a
saved report.json. Contains no wall-clock time: identical runs give identical files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.fidelity.ledger import doc_lines
from npusim.report.summary import family_options, fmt_bytes, phase_spread, vector_lines


def _table(head: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(head))]
    return ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(r) + " |" for r in rows)]


def _us(x: float | None) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "-"


def _op_section(op: Mapping[str, Any], shared_ranks: int = 0) -> list[str]:
    crit = op.get("critical") or {}
    diag = op.get("diagnosis") or {}
    out = [f"## {op.get('op', '?')}", "",
           f"- latency: **{op.get('latency_us', 0.0):.3f} us**"]
    if crit.get("rank") is not None:
        out.append(f"- critical: rank {crit['rank']}, core {crit.get('core')}, "
                   f"phase {crit.get('phase')}")
    if diag.get("text"):
        out.append(f"- diagnosis: {diag['text']}")
    out.append(f"- bytes put to other ranks: {fmt_bytes(op.get('bytes_sent_total', 0))} "
               "in total")
    if op.get("l2_held_bytes_total"):
        out.append(f"- GM writes held by the L2 (no HBM traffic during the op): "
                   f"{fmt_bytes(op['l2_held_bytes_total'])} in total")
    out += [f"- {line.strip()}" for line in vector_lines(op)]
    out += _fidelity(op.get("fidelity"))
    names = list(op.get("phase_order") or op.get("phases", {}))
    if names:
        out += ["", "### Phases (us from the op's start; min / max over ranks)", ""]
        out += _table(["phase", "start min", "start max", "end min", "end max", "busy max"],
                      [[n, *(_us(v) for v in phase_spread(op, n))] for n in names])
        out += ["", "### Per rank (phase cells: start - end, us)", ""]
        rows = []
        for r in op.get("ranks", []):
            cells = []
            for n in names:
                ph = r.get("phases", {}).get(n)
                cells.append(f"{ph['start_us']:.3f} - {ph['end_us']:.3f}" if ph else "-")
            label = f"{r['rank']} (shared)" if r["rank"] < shared_ranks else str(r["rank"])
            rows.append([label, _us(r.get("latency_us")), *cells,
                         str(r.get("bytes_sent")), str(r.get("bytes_received"))])
        out += _table(["rank", "latency us", *names, "bytes sent", "bytes received"], rows)
    classes = op.get("link_classes", {})
    if classes:
        out += ["", "### Links (achieved GB/s = bytes / op duration)", ""]
        rows = [[k, str(c["links"]), f"{c['bandwidth_gbps']:g}", str(c["bytes"]),
                 f"{c['achieved_gbps_mean']:.1f}", f"{c['achieved_gbps_max']:.1f}",
                 f"{c['utilisation_max']:.1%}",
                 f"{c['utilisation_in_phase']:.1%} ({c['phase']})" if c.get("phase") else "-",
                 c["busiest"]]
                for k, c in classes.items()]
        out += _table(["class", "links", "GB/s each", "bytes", "GB/s mean", "GB/s max",
                       "util op", "util in phase", "busiest"], rows)
    ports = op.get("ports", {})
    if ports:
        out += ["", "### Busiest core per MTE pipe (bytes at port rate)", ""]
        rows = [[p, f"rank {v['rank']} core {v['core']}", str(v["bytes"]),
                 _us(v["stream_us"]), f"{v['share_of_latency']:.1%}"]
                for p, v in ports.items()]
        out += _table(["pipe", "core", "bytes", "stream us", "share of latency"], rows)
    out += _family_fields(op.get("family_fields") or {}, len(op.get("ranks", [])))
    return out


def _fidelity(doc: Mapping[str, Any] | None) -> list[str]:
    """The op's ledger (docs/fidelity.md): its status, each table, the assumed values."""
    if not doc:
        return []
    first, *rest = doc_lines(doc)
    return ["", "### Fidelity", "", f"- {first}", *(f"- {line}" for line in rest)]


def _family_fields(fields: Mapping[str, Any], ranks: int) -> list[str]:
    """The family's own figures: a list with one list of numbers per rank as a table
    (row = rank, column = index), a mapping of `columns` and `rows` as that table (rows
    longer than the header repeat its last column's name), anything else as `name: value`."""
    if not fields:
        return []
    out = ["", "### Family fields (`family_fields`)", ""]
    for name, value in fields.items():
        if isinstance(value, Mapping) and set(value) == {"columns", "rows"}:
            cols = [str(c) for c in value["columns"]]
            width = max([len(cols), *(len(r) for r in value["rows"])])
            cols += [cols[-1]] * (width - len(cols))
            out += ["", f"{name}:", ""]
            out += _table(cols, [[str(x) for x in r] + ["-"] * (width - len(r))
                                 for r in value["rows"]])
            continue
        per_rank = (isinstance(value, list) and len(value) == ranks > 0
                    and all(isinstance(v, list) for v in value))
        if not per_rank:
            out.append(f"- {name}: {value}")
            continue
        width = max(len(v) for v in value)
        out += ["", f"{name}:", ""]
        out += _table(["rank", *(str(i) for i in range(width))],
                      [[str(r), *(str(x) for x in row), *["-"] * (width - len(row))]
                       for r, row in enumerate(value)])
    return out


def _routing(r: Any) -> str:
    if not isinstance(r, Mapping):
        return str(r)
    rest = ", ".join(f"{k} {v}" for k, v in r.items() if k != "kind" and v is not None)
    return f"{r.get('kind')} ({rest})" if rest else str(r.get("kind"))


def _shared_text(wl: Mapping[str, Any]) -> str:
    """', shared experts S=.. on ranks 0..S_r-1' when the workload has them, else ''."""
    s, sr = wl.get("shared_experts") or 0, wl.get("shared_expert_ranks") or 0
    if not s:
        return ""
    return (f", shared experts S={s} on ranks 0..{sr - 1} "
            f"(E={wl.get('num_experts')} MoE experts on ranks {sr}..)")


def format_markdown(report: Mapping[str, Any]) -> str:
    """The whole report.md text."""
    sc = report.get("scenario", {})
    wl = sc.get("workload", {})
    hw = report.get("hardware", {})
    out = [f"# npusim report: {sc.get('name', '?')}", ""]
    if sc.get("description"):
        out += [str(sc["description"]), ""]
    out.append(f"- hardware: {hw.get('name', '?')}"
               + (f" with overrides {sc['hardware_overrides']}"
                  if sc.get("hardware_overrides") else ""))
    if wl:
        out.append(
            f"- workload: {wl.get('kernel', 'cann_sample')} {wl.get('op')}, "
            + (f"W={wl.get('ep_world_size')}, BS={wl.get('bs')}, "
               f"H={wl.get('h')}, K={wl.get('k')}, L={wl.get('experts_per_rank')}, "
               if "bs" in wl else "")  # a family without the MoE shape has none of it
            + f"{wl.get('dtype')}"
            + (f", {family_options(wl)}" if family_options(wl) else "")
            + (f", routing {_routing(wl['routing'])}" if "routing" in wl else "")
            + _shared_text(wl))
    out.append(f"- schema: {report.get('schema')}; every field: docs/report.md")
    for op in report.get("ops", []):
        out += ["", *_op_section(op, int(wl.get("shared_expert_ranks") or 0))]
    events = report.get("sim", {}).get("events")
    if events is not None:
        out += ["", f"Simulation: {events} events (wall time: see report.json)."]
    return "\n".join(out) + "\n"
