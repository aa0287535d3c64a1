"""Link classes, port stream times and the diagnosis, from hand-built runs (hand arithmetic)."""

from __future__ import annotations

from typing import Any

from npusim.engine.trace import Span
from npusim.kernels import registry
from npusim.report.build import build_report
from npusim.report.diagnose import diagnose
from npusim.report.markdown import format_markdown
from npusim.report.summary import format_summary
from npusim.result import LinkStats, OpRun, RunResult, TransferStat

HW = {"name": "hand", "mte": {"gm_to_ub_gbps": 16.0, "ub_to_gm_gbps": 32.0, "put_gbps": 8.0}}


def put(n: int, nbytes: int, phase: str = "send_data") -> TransferStat:
    return TransferStat(phase, "mte3", "put_token", True, n, nbytes)


def run(puts: list[list[list[TransferStat]]], egress_gbps: float = 10.0) -> dict[str, Any]:
    """Two ranks of two cores; the op runs 0..10 us; rank 0 core 0 ends last (local_copy)."""
    spans = [Span(r, c, "phase", "send_data", 0.0, 4000.0 if c == 0 else 2000.0)
             for r in range(2) for c in range(2)]
    spans += [Span(0, 0, "phase", "local_copy", 4000.0, 10000.0),
              Span(1, 0, "phase", "local_copy", 4000.0, 8000.0)]
    op = OpRun(
        "dispatch", 0.0, 10000.0, ranks=2, cores_per_rank=2, spans=spans,
        bytes_sent=[40000, 24000], bytes_received=[24000, 40000],
        links=[LinkStats("rank0.egress", "egress", 0, egress_gbps, 40000),
               LinkStats("rank1.egress", "egress", 1, egress_gbps, 24000),
               LinkStats("rank0.hbm", "hbm", 0, 100.0, 50000)],
        core_bytes_put=[[sum(t.bytes for t in cs if t.remote) for cs in row] for row in puts],
        core_transfers=puts,
    )
    return build_report(RunResult({"name": "hand"}, HW, [op], events=1, wall_s=0.0))["ops"][0]


UNEVEN = [[[put(4, 32000), TransferStat("send_data", "mte2", "load_token", False, 4, 16000)],
           [put(1, 8000)]],
          [[put(2, 16000)], [put(1, 8000)]]]


def test_link_classes_ports_and_per_core_work() -> None:
    op = run(UNEVEN)
    assert op["latency_us"] == 10.0
    assert op["critical"] == {"rank": 0, "core": 0, "phase": "local_copy"}
    # rank 0 egress: 40000 B / 10 GB/s = 4 us, i.e. all of send_data (0..4 us), 40% of the op
    assert op["link_classes"]["egress"] == {
        "links": 2, "bandwidth_gbps": 10.0, "bytes": 64000,
        "achieved_gbps_mean": 3.2, "achieved_gbps_max": 4.0, "utilisation_max": 0.4,
        "busiest": "rank0.egress", "busiest_rank": 0, "busiest_bytes": 40000,
        "phase": "send_data", "utilisation_in_phase": 1.0,
    }
    hbm = op["link_classes"]["hbm"]  # HBM serves every phase: measured over the whole op
    assert (hbm["phase"], hbm["utilisation_in_phase"], hbm["utilisation_max"]) == (None, 0.05, 0.05)
    # rank 0 core 0: puts 32000 B / 8 GB/s = 4 us, loads 16000 B / 16 GB/s = 1 us
    assert op["ports"] == {
        "mte2": {"rank": 0, "core": 0, "bytes": 16000, "stream_us": 1.0, "share_of_latency": 0.1},
        "mte3": {"rank": 0, "core": 0, "bytes": 32000, "stream_us": 4.0, "share_of_latency": 0.4},
    }
    core = op["ranks"][0]["cores"][0]
    assert core["bytes_put"] == 32000 and core["stream_us"] == {"mte2": 1.0, "mte3": 4.0}
    assert op["transfer_fields"] == ["phase", "pipe", "name", "remote", "count", "bytes"]
    assert core["transfers"][0] == ["send_data", "mte3", "put_token", True, 4, 32000]


def test_diagnosis_link_bound() -> None:
    d = run(UNEVEN)["diagnosis"]
    assert d["kind"] == "bytes-bound" and d["resource"] == "egress"
    assert d["text"] == ("bytes-bound on die egress (100% utilised during send_data; "
                         "busiest rank0.egress)")


def test_diagnosis_imbalance_names_the_core_and_its_work() -> None:
    d = run(UNEVEN, egress_gbps=100.0)["diagnosis"]  # egress 10% busy: not the limit
    # send_data stream: 4, 1, 2, 1 us -> median (lower) 1 us on rank 0 core 1; excess 3 us
    assert d["kind"] == "imbalance" and d["phase"] == "send_data"
    assert (d["rank"], d["core"], d["median_rank"], d["median_core"]) == (0, 0, 0, 1)
    assert d["text"] == ("imbalance: rank 0 core 0 sends 4 put_token in send_data, median "
                         "core 1 (4.0 us vs 1.0 us of transfers at port rate, 30% of the "
                         "latency)")


def test_diagnosis_port_bound_and_latency_bound() -> None:
    even = [[[put(4, 32000)], [put(4, 32000)]], [[put(4, 32000)], [put(4, 32000)]]]
    d = run(even, egress_gbps=100.0)["diagnosis"]
    assert d["kind"] == "bytes-bound" and d["resource"] == "mte3"
    assert d["text"] == ("bytes-bound on core MTE3 (UB->GM, puts) ports (rank 0 core 0 "
                         "streams 4.0 us of the 10.0 us latency at port rate)")
    small = [[[put(1, 8000)], [put(1, 8000)]], [[put(1, 8000)], [put(1, 8000)]]]
    d = run(small, egress_gbps=100.0)["diagnosis"]
    assert d["kind"] == "latency-bound" and d["phase"] == "local_copy"
    assert d["text"] == ("latency-bound: flag round trips and fixed latencies (moving the "
                         "bytes at full rate explains 10% of 10.0 us; critical phase "
                         "local_copy)")


def test_diagnosis_without_data() -> None:
    assert diagnose({"latency_us": 0.0})["kind"] == "unknown"
    assert diagnose({"latency_us": 3.0, "phase_order": ["x"]})["text"] == (
        "unknown: no transfer statistics recorded")


def test_phases_in_kernel_order_whatever_came_first() -> None:
    spans = [Span(0, 0, "phase", "local_copy", 10.0, 20.0),
             Span(0, 1, "phase", "experiment", 5.0, 6.0),
             Span(0, 1, "phase", "send_status", 0.0, 5.0),
             Span(0, 0, "phase", "send_data", 0.0, 10.0)]
    order = registry.get("cann_sample").kernel("dispatch").phase_order()
    op = OpRun("dispatch", 0.0, 20.0, ranks=1, cores_per_rank=2, spans=spans, phase_order=order)
    rep = build_report(RunResult({"name": "x"}, {"name": "h"}, [op], events=1, wall_s=0.0))
    assert rep["ops"][0]["phase_order"] == ["send_data", "send_status", "local_copy",
                                            "experiment"]


def test_summary_and_markdown_carry_the_diagnosis_and_links() -> None:
    op = OpRun("dispatch", 0.0, 10000.0, ranks=2, cores_per_rank=2)
    rep = build_report(RunResult({"name": "hand"}, HW, [op], events=1, wall_s=0.0))
    rep["ops"][0] = run(UNEVEN)
    text = format_summary(rep)
    assert "diagnosis: bytes-bound on die egress" in text
    (egress,) = [ln for ln in text.splitlines() if ln.split()[:1] == ["egress"]]
    assert egress.split() == ["egress", "2", "10", "62.50", "KiB", "3.2", "4.0", "40.0%",
                              "100.0%", "send_data"]
    md = format_markdown(rep)
    assert md.startswith("# npusim report: hand\n")
    assert "- diagnosis: bytes-bound on die egress" in md
    # rank ends: both ranks end send_data at 4 us (core 0); busiest core 4 us
    assert "| send_data | 0.000 | 0.000 | 4.000 | 4.000 | 4.000 |" in md
    assert "| 0 | 10.000 | 0.000 - 4.000 | 4.000 - 10.000 | 40000 | 24000 |" in md
    assert "| mte3 | rank 0 core 0 | 32000 | 4.000 | 40.0% |" in md
    assert "wall" not in md.split("Simulation:")[0]


def test_latency_is_the_last_core_end_including_the_drain() -> None:
    """With kernel ends recorded, a core's end includes its pipes draining after its last
    phase (what the perf harness measures and `npusim validate` compares)."""
    spans = [Span(0, 0, "phase", "send_data", 0.0, 4000.0),
             Span(0, 1, "phase", "send_data", 0.0, 3000.0),
             Span(0, 1, "phase", "combine", 3000.0, 4500.0),
             Span(1, 0, "phase", "send_data", 0.0, 4800.0)]
    op = OpRun("combine", 0.0, 5200.0, ranks=2, cores_per_rank=2, spans=spans,
               core_end_ns=[[4000.0, 5200.0], [4800.0, 100.0]])
    rep = build_report(RunResult({"name": "x"}, {"name": "h"}, [op], events=1, wall_s=0.0))
    o = rep["ops"][0]
    # rank 0 core 1 drains until 5.2 us, 0.7 us after its last phase (combine) ends
    assert o["latency_us"] == 5.2 and [r["latency_us"] for r in o["ranks"]] == [5.2, 4.8]
    assert o["critical"] == {"rank": 0, "core": 1, "phase": "combine"}
    assert [c["end_us"] for c in o["ranks"][0]["cores"]] == [4.0, 5.2]
