"""Property: a sweep runs its base scenario as `npusim run` runs it, wherever the sweep file
is. The base names its preset, kernel, routing and case files by relative or absolute
paths, or by names its folder lacks, or leaves them unset; the sweep file sits in another
folder, beside decoys of the same names or none. Every sweep then ends as `npusim run` of
the base does: exit 0 with the same latency, or the same one line (bar the file it
names), exit 2, with nothing written."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli.sweephelp import (
    FILES,
    FORMS,
    MISSING,
    base_doc,
    run_latency,
    sweep_latency,
    sweep_of,
    write_files,
)

SETTINGS = settings(max_examples=24, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a/: the base's files; decoys/: files of the same names (and of the names a/ lacks)
    that run differently; empty/: nothing but the sweep file."""
    root = tmp_path_factory.mktemp("sweep_paths")
    write_files(root / "a", real=True)
    write_files(root / "decoys", real=False)
    write_files(root / "decoys", real=False, names=MISSING)
    (root / "empty").mkdir()
    return root


def _rest(line: str, source: str) -> str:
    """An error line without the file it names (the base for run, the sweep's point)."""
    head = f"npusim: error: {source}: "
    assert line.startswith(head), line
    return line[len(head):]


def _forms() -> st.SearchStrategy[dict[str, str]]:
    """How the base gives each path key: mostly combinations a family accepts (a kernel
    file with a routing file, or the default family with a case directory), so that most
    examples run; the rest any combination."""
    form, found = st.sampled_from(FORMS), st.sampled_from(("relative", "absolute"))
    kernel = st.fixed_dictionaries({"hardware": form, "workload.kernel": found,
                                    "workload.routing.path": form})
    case = st.fixed_dictionaries({"hardware": form, "data.case_dir": form})
    return st.one_of(kernel, case, st.fixed_dictionaries({k: form for k in FILES}))


@SETTINGS
@given(forms=_forms(), beside=st.sampled_from(["decoys", "empty"]))
def test_a_sweep_point_ends_as_run_of_its_base(folders, capsys, forms, beside):
    base = folders / "a" / "base.yaml"
    base.write_text(yaml.safe_dump(base_doc(base.parent, forms)))
    sweep = sweep_of(base, folders / beside)
    scratch = Path(tempfile.mkdtemp(dir=folders))
    capsys.readouterr()
    run_code, run_lat = run_latency(base, scratch / "run")
    run_err = capsys.readouterr().err
    code, lat = sweep_latency(sweep, scratch / "sweep")
    err = capsys.readouterr().err
    assert (code, lat) == (run_code, run_lat) and code in (0, 2)
    if code == 0:
        assert err == run_err == "" and len(lat) == 1
        return
    assert err.count("\n") == run_err.count("\n") == 1
    assert _rest(err, f"{sweep} (point s-0000)") == _rest(run_err, str(base))
    assert not (scratch / "sweep").exists()
