"""Property: whatever JSON value stands at a report's figure (a latency, a phase's start
or end) or beside it, `npusim compare` (and `check`'s baseline reader, the same one)
answers exit 0 or 1 only when every figure is a finite number >= 0 and no phase ends
before it starts; otherwise exactly one line naming the file, exit 2. Never a traceback,
never a verdict on missing, non-finite or negative data. Derandomized: CI sees the same
cases."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.cli import main

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
SPOTS = ("latency", "start", "end", "extra")  # where the drawn value goes
# JSON texts of the values probing found trouble with, and ordinary ones
TEXTS = st.sampled_from([
    "NaN", "Infinity", "-Infinity", "-127.7", "-0.0", "0", "3.5", "12", "1e400", "-1e400",
    "9" * 400, "-" + "9" * 400, "9" * 30, "1" * 31, '"12"', "null", "true", "[]", "{}",
    "[" * 5000 + "]" * 5000, '{"a": ' * 3000 + "1" + "}" * 3000,
])
GOOD = {"start": 1.0, "end": 4.0, "latency": 6.0}


def _report(spot: str, text: str) -> str:
    """A report of one op whose figure at `spot` is the JSON `text`."""
    fig = {k: json.dumps(v) for k, v in GOOD.items()}
    extra = "0"
    if spot == "extra":
        extra = text
    else:
        fig[spot] = text
    return ('{"schema": "npusim.report/1", "scenario": {"name": "s"}, "hardware": {}, '
            f'"ops": [{{"op": "dispatch", "latency_us": {fig["latency"]}, "x": {extra}, '
            f'"phases": {{"send": {{"start_us": {fig["start"]}, "end_us": {fig["end"]}}}}}}}]}}')


def _figure_ok(spot: str, text: str) -> bool:
    """Whether the figure makes a report compare may judge (worked out from the text)."""
    if spot == "extra":
        return len(text.lstrip("-")) <= 30 or not text.lstrip("-").isdigit()
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int) and len(text.lstrip("-")) > 30:
        return False
    if not math.isfinite(value) or value < 0:
        return False
    figs = {**GOOD, spot: value}
    return figs["end"] >= figs["start"]


@SETTINGS
@given(spot=st.sampled_from(SPOTS), text=TEXTS, side=st.sampled_from("ab"))
def test_compare_judges_only_usable_figures(tmp_path_factory, capsys, spot, text, side):
    folder: Path = tmp_path_factory.mktemp("cmp")
    good, bad = folder / "good.json", folder / "bad.json"
    good.write_text(_report("extra", "0"))
    bad.write_text(_report(spot, text))
    argv = ["compare", str(good), str(bad)] if side == "b" else ["compare", str(bad),
                                                                  str(good)]
    code = main(argv)
    cap = capsys.readouterr()
    deep = text.startswith(("[[", '{"a"'))
    if _figure_ok(spot, text) and not (spot == "extra" and deep):
        assert code in (0, 1), cap.err
    else:
        assert code == 2, (spot, text[:40], cap.out)
        assert cap.err.count("\n") == 1 and cap.err.startswith(f"npusim: error: {bad}: ")
