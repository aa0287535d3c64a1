"""The `npusim advise` command: its options, and the shape they describe."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from npusim.errors import InputError

# keys a --set may name: the shape (the family and its options are what advise chooses)
SET_PREFIXES = ("name", "hardware", "hardware_overrides.", "run.")


def add_parser(sub: Any) -> None:
    adv = sub.add_parser(
        "advise",
        help="rank every kernel family, variant and quantisation "
        "that runs a shape, by time, each with its error band; a difference "
        "inside the bands is a tie",
    )
    _add_choice_options(adv)
    adv.add_argument(
        "--out",
        metavar="DIR",
        help="where the runs are kept, to resume (default out/advise/<shape name>)",
    )
    adv.add_argument("--workers", default=None, help="parallel processes")
    adv.add_argument("--backend", default="processes", help="processes (default) or ray")
    adv.add_argument("--ray", action="store_true", help="the same as --backend ray")
    adv.add_argument(
        "--json",
        action="store_true",
        help="print the advice as JSON (npusim.advice/2) instead of the table",
    )
    adv.add_argument(
        "--plot",
        metavar="PNG",
        help="also draw the ranking (or, with --over, latency against the axis) into PNG",
    )
    adv.add_argument("--quiet", action="store_true", help="no progress on stderr")
    adv.set_defaults(func=cmd_advise)


def _add_choice_options(adv: argparse.ArgumentParser) -> None:
    """The shape and what advise may choose for it (families, quantisations, an axis)."""
    adv.add_argument(
        "scenario",
        nargs="?",
        metavar="SHAPE",
        help="a scenario file or shipped "
        "name giving the shape (its family and family options are ignored); "
        "default: the CANN sample's shape on ascend950",
    )
    adv.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a shape key: hardware=atlas_a3, workload.bs=128, "
        "workload.ep_world_size=16, workload.experts_per_rank=16, ... (repeatable)",
    )
    adv.add_argument(
        "--dispatch-quant",
        metavar="LIST",
        help="allowed dispatch quantisations, comma-separated: none, int8, mxfp8 (default none)",
    )
    adv.add_argument(
        "--combine-quant",
        metavar="LIST",
        help="allowed combine quantisations, comma-separated: none, int8 (default none)",
    )
    adv.add_argument(
        "--family",
        action="append",
        default=[],
        metavar="NAME",
        help="rank only this family's variants: a built-in name, a .py file or "
        "module:attr (repeatable; default: every built-in family that reads the MoE "
        "shape)",
    )
    adv.add_argument(
        "--band",
        metavar="ERR",
        help="the error assumed of a candidate no measured table vouches for at the "
        "shape, as 25%% or 0.25 (default 25%%)",
    )
    adv.add_argument(
        "--over",
        metavar="AXIS=V1,V2,...",
        help="rank at each value of one "
        "axis (bs=8,32,128 or any dotted key) and say where the first place changes",
    )


def _shape(arg: str | None, items: list[str]) -> tuple[dict[str, Any], str, Path]:
    from npusim import advise
    from npusim.dotted import parse_sets, set_dotted
    from npusim.scenario import read_scenario_file
    from npusim.scenario.load import scenario_name
    from npusim.shipped import resolve

    if arg is None:
        doc, src, base = copy.deepcopy(advise.DEFAULT_SHAPE), "advise", Path.cwd()
    else:
        doc, src, base = read_scenario_file(resolve(arg))
    shape = advise.shape_doc(doc)
    own = advise.own_family(doc)
    keys = advise.SHAPE_KEYS if own is None else advise.own_keys(own)
    shape_keys = tuple(f"workload.{k}" for k in keys)
    sets = parse_sets(items)
    for key, value in sets:
        if not (
            key in SET_PREFIXES
            or key.startswith(SET_PREFIXES[2:])
            or key in shape_keys
            or key.startswith(tuple(k + "." for k in shape_keys))
        ):
            raise InputError(
                "command line",
                f"--set {key}",
                "is not a shape key; allowed: "
                "name, hardware, hardware_overrides.*, run.*, workload."
                f"{{{','.join(keys)}}} (advise chooses the kernel "
                "family and its options)",
            )
        try:
            set_dotted(shape, key, value)
        except ValueError:
            raise InputError("command line", f"--set {key}", "names no scenario key") from None
    named_here = any(key == "name" for key, _ in sets)
    # the name is the default --out folder: a plain name, as `run` and `sweep` require
    scenario_name(*(("command line", "--set name") if named_here else (src, "name")),
                  shape.get("name"))
    return shape, src, base


def cmd_advise(args: argparse.Namespace) -> int:
    from npusim import advise
    from npusim.cli.common import EXIT_OK
    from npusim.cli.common import workers as _workers
    from npusim.fidelity import DEFAULT_BAND
    from npusim.report.advice import format_advice

    shape, src, base = _shape(args.scenario, args.set)
    dq = advise.quant_list(args.dispatch_quant, "--dispatch-quant")
    cq = advise.quant_list(args.combine_quant, "--combine-quant")
    axis, values = advise.axis_of(args.over) if args.over else (None, [None])
    uncalibrated = advise.band(args.band) if args.band is not None else DEFAULT_BAND
    backend = "ray" if args.ray else args.backend
    workers = _workers(args.workers)
    from npusim.outputs import output_file, output_folder

    out = output_folder(
        args.out if args.out is not None else Path("out") / "advise" / str(shape.get("name")),
        "--out",
    )
    plot = output_file(args.plot, "--plot") if args.plot is not None else None
    own = advise.own_family(shape)
    cands, missing = advise.candidates(dq, cq, args.family or ([own] if own else []))
    p = advise.plan(shape, src, base, cands, missing, axis, values)
    if not p.points:
        reasons = list(dict.fromkeys(why for *_, why in p.refused))
        if len(reasons) == 1:  # the shape itself, whichever family reads it
            raise InputError(src, None, reasons[0])
        fams = "; ".join(dict.fromkeys(f"{fam}: {why}" for _, fam, _, why in p.refused))
        raise InputError(src, None, f"no kernel family runs this shape ({fams})")
    reports = advise.run_plan(p, out, src, base, workers, backend, args.quiet)
    ranked = advise.rankings(p, reports, uncalibrated)
    doc = advise.document(shape, p, ranked, uncalibrated)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(format_advice(doc))
    if plot is not None:
        from npusim.report.plot import plot_advice

        print(f"figure: {plot_advice(doc, plot)}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK
