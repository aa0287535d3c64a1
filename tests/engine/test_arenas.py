"""Python's object arenas from huge-page maps: where objects live, never what they compute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npusim.engine import arenas
from npusim.engine.arenas import _pure

ROOT = Path(__file__).resolve().parents[2]

try:
    from npusim.engine import _arenas  # type: ignore[attr-defined]
except ImportError:
    _arenas = None

built = pytest.mark.skipif(_pure() or _arenas is None or not sys.platform.startswith("linux"),
                           reason="the compiled arena allocator is not in use here")


@pytest.mark.parametrize(("text", "mode"), [
    ("always [madvise] never\n", "madvise"),
    ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"),
    ("", ""),
])
def test_the_kernel_setting_is_read_from_its_brackets(tmp_path, monkeypatch, text, mode):
    f = tmp_path / "enabled"
    f.write_text(text)
    monkeypatch.setattr(arenas, "THP_SETTING", f)
    assert arenas._thp() == mode


def test_a_missing_setting_reads_as_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(arenas, "THP_SETTING", tmp_path / "absent")
    assert arenas._thp() == ""


CHECK = """
import json
from npusim.engine import _arenas, arenas
assert _arenas.install(arenas.arena_bytes(), arenas.MAP_BYTES)
before = _arenas.counts()
# 400 k small tuples: about 25 MiB of 64 B blocks, far more than the free space of the
# arenas made before (a fresh interpreter's), so arenas are taken, from the maps
many = [(i, i + 1) for i in range(400_000)]
during = _arenas.counts()
ranges = during["ranges"]
inside = sum(any(a <= id(t) < b for a, b in ranges) for t in many[::1000])
del many
after = _arenas.counts()
again = [(i, -i) for i in range(400_000)]
print(json.dumps({"before": before, "during": during, "after": after,
                  "again": _arenas.counts(), "inside": inside}))
"""


@built
def test_new_objects_live_in_the_maps_and_freed_arenas_are_given_back():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    before, during, after, again = (got[k] for k in ("before", "during", "after", "again"))
    assert before["arenas"] == 0 and before["maps"] == 1
    assert during["arenas"] >= 20  # 25 MiB in 1 MiB arenas, less what old ones held
    assert during["map_bytes"] % (2 << 20) == 0
    assert all(end - start == during["map_bytes"] and start % (2 << 20) == 0
               for start, end in during["ranges"])  # huge-page aligned maps
    assert got["inside"] >= 350  # of the 400 sampled; the first may fill old arenas
    assert after["arenas"] < during["arenas"]  # emptied arenas came back
    assert after["arenas_most"] >= during["arenas"]
    assert again["maps"] == during["maps"]  # and their ranges were taken again first


@built
def test_a_run_is_the_same_to_the_byte_with_and_without(tmp_path):
    """`npusim run` of a shipped scenario in two fresh processes, one with the arenas in
    huge-page maps (forced on whatever the kernel's setting), one with CPython's own."""
    reports = []
    for flag in ("1", "0"):
        out = tmp_path / flag
        env = {**os.environ, "NPUSIM_HUGE_ARENAS": flag}
        done = subprocess.run([sys.executable, "-m", "npusim", "run",
                               str(ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml"), "--out",
                               str(out)], env=env, capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        report = json.loads((out / "report.json").read_text())
        report["sim"].pop("wall_s")
        reports.append(report)
        version = subprocess.run([sys.executable, "-m", "npusim", "--version"], env=env,
                                 capture_output=True, text=True, cwd=ROOT).stdout
        assert f"huge pages: {'on' if flag == '1' else 'off'}" in version
    assert reports[0] == reports[1]
