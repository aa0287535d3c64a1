"""Sensitivity on the command line: `npusim run --sensitivity` (the run's own shape) and
`npusim presets --sensitivity PRESET` (the shipped records)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from npusim.cli.common import EXIT_OK, workers
from npusim.errors import InputError
from npusim.fidelity.ledger import Assumed

SENSITIVITY_FILE = "sensitivity.json"
SHOWN = 3  # keys printed per op after a run (sensitivity.json holds them all)


def add_preset_options(pre: argparse.ArgumentParser) -> None:
    pre.add_argument("--sensitivity", metavar="PRESET", help="regenerate the shipped "
                     "sensitivity records configs/sensitivity/PRESET/<family>.json "
                     "(docs/sensitivity.md)")
    pre.add_argument("--family", metavar="F", help="with --sensitivity: only this family's "
                     "record")
    pre.add_argument("--workers", metavar="N", default=None, help="with --sensitivity: "
                     "processes for the perturbed runs (default: one per CPU)")
    pre.add_argument("--out", metavar="DIR", default=None, help="with --sensitivity: the "
                     "perturbed runs' folders, which a rerun resumes from (default: "
                     "out/sensitivity/PRESET)")


def preset_options_misused(args: argparse.Namespace) -> None:
    """--family, --workers and --out belong to --sensitivity, which --explain is not."""
    if args.sensitivity is not None and args.explain is not None:
        raise InputError("command line", "--explain", "not with --sensitivity; one at a time")
    if args.sensitivity is None:
        for opt in ("family", "workers", "out"):
            if getattr(args, opt) is not None:
                raise InputError("command line", f"--{opt}", "only with --sensitivity PRESET")


def cmd_records(args: argparse.Namespace) -> int:
    """Write the records of one shipped preset (or of one family on it)."""
    from npusim.hw.config import preset_names
    from npusim.sensitivity.records import references, write_record

    preset = args.sensitivity
    if preset not in preset_names():
        raise InputError("command line", "--sensitivity", f"{preset!r} is no shipped preset; "
                         f"allowed: {', '.join(preset_names())}")
    fams = references(preset)
    if args.family is not None and args.family not in fams:
        raise InputError("command line", "--family", f"{args.family!r} has no shipped scenario "
                         f"on {preset}; allowed: {', '.join(fams) or 'none'}")
    n = workers(args.workers)
    out = Path(args.out) if args.out is not None else Path("out") / "sensitivity" / preset
    for family in [args.family] if args.family else list(fams):
        path = write_record(family, preset, n, out, quiet=False)
        print(f"{family}: {path} (references {', '.join(sorted(set(fams[family].values())))})")
    return EXIT_OK


def scenario_and_doc(path: str, sets: list[str], case_dir: str | None
                     ) -> tuple[Any, tuple[dict[str, Any], str, Path]]:
    """The scenario of `npusim run` (its file with the `--set` items) and the document
    it was validated from, with its name for errors and its folder: the document the
    perturbed runs start from. A --case-dir is written into it as data.case_dir."""
    from npusim.dotted import apply_sets, parse_sets
    from npusim.paths import user_path
    from npusim.scenario import read_scenario_file

    doc, src, base = read_scenario_file(path)
    scenario = apply_sets(doc, src, base, parse_sets(sets), case_dir)  # sets land in doc
    if case_dir is not None:
        data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
        doc["data"] = {**data, "case_dir": str(user_path(case_dir).resolve())}
    return scenario, (doc, src, base)


def stale_sensitivity(out_dir: Path) -> None:
    """A new report makes an earlier run's DIR/sensitivity.json stale: it goes (a
    --sensitivity run writes its own once the perturbed runs are done)."""
    (Path(out_dir) / SENSITIVITY_FILE).unlink(missing_ok=True)


def run_sensitivity(source: tuple[dict[str, Any], str, Path], out_dir: Path,
                    n_workers: int | None, quiet: bool) -> list[str]:
    """Perturb a run at its own shape: write OUT/sensitivity.json (whole or not at all)
    and return the summary's lines. The perturbed runs' folders go under
    OUT/sensitivity/, which a rerun resumes from."""
    from npusim.report.io import write_json_atomic
    from npusim.sensitivity.perturb import sensitivity

    doc, src, base = source
    sens = sensitivity(doc, src, base, out_dir / "sensitivity", n_workers, quiet,
                       title="run --sensitivity")
    path = write_json_atomic(out_dir / SENSITIVITY_FILE, sens.as_doc(), sort_keys=True,
                             inline_leaves=True)
    lines = [f"sensitivity: {len(sens.probed)} assumed value(s) perturbed by +10%"
             + (f", {len(sens.skipped)} not (see {SENSITIVITY_FILE})" if sens.skipped else "")]
    for op, ranked in sorted(sens.ranked.items()):
        if not ranked:
            lines.append(f"  {op}: no assumed value moves its time")
        for a in ranked[:SHOWN]:
            lines.append(f"  {op}: {assumed_line(a)}")
    lines.append(f"sensitivity: {path}")
    return lines


def assumed_line(a: Assumed) -> str:
    """key = value unit [lo, hi]: the effect of its step, and at the range's ends."""
    from npusim.fidelity.assumed import stepped

    up = stepped(a.value)
    step = "+10%" if not isinstance(a.value, int) else f"{up:g} ({up / a.value - 1:+.0%})"
    span = (f"; {a.span[0]:+.2%} at {a.lo:g}, {a.span[1]:+.2%} at {a.hi:g}"
            if a.span is not None else "")
    return (f"{a.key} = {a.value:g} {a.unit} (assumed, range [{a.lo:g}, {a.hi:g}]): "
            f"{a.effect:+.2%} at {step}{span}")


