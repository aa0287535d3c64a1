"""`npusim presets` and `npusim scenarios`: what ships with npusim, and a preset's every
value with its unit and provenance."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from npusim.cli.common import EXIT_FAIL, EXIT_OK, err, one_line
from npusim.cli.sensitivity import add_preset_options, cmd_records, preset_options_misused
from npusim.errors import InputError


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    pre = add(
        "presets",
        help="list the hardware presets in configs/, or explain "
        "one: every value with its unit and provenance",
    )
    pre.add_argument(
        "--explain",
        metavar="NAME",
        nargs="?",
        const="",
        help="a preset name or YAML path: print every value with its unit and provenance "
        "(docs/presets.md); without NAME, which shipped tables vouch for each family on "
        "each preset (the matrix of docs/fidelity.md)",
    )
    add_preset_options(pre)
    pre.set_defaults(func=cmd_presets)

    scn = add(
        "scenarios",
        help="list the shipped scenarios and sweeps (name and description), to run by name",
    )
    scn.set_defaults(func=cmd_scenarios)


def cmd_presets(args: argparse.Namespace) -> int:
    from npusim.hw.config import CONFIG_DIR, load_hardware, preset_names
    from npusim.hw.fabric import topology_text

    preset_options_misused(args)
    if args.sensitivity is not None:
        return cmd_records(args)
    if args.explain == "":
        from npusim.fidelity.matrix import matrix_lines

        print("\n".join(matrix_lines()))
        return EXIT_OK
    if args.explain:
        return _explain_preset(args.explain)
    names = preset_names()
    if not names:
        err(f"npusim: error: no presets found in {CONFIG_DIR}")
        return EXIT_FAIL
    for name in names:
        try:
            hw = load_hardware(name)
        except InputError as exc:
            print(f"{name:<14} (invalid: {one_line(str(exc))})")
            continue
        print(
            f"{name:<14} {hw.chip.aiv_cores} AIV cores, {hw.chip.clock_ghz:g} GHz, "
            f"UB {hw.ub.bytes // 1024} KiB, HBM {hw.hbm.bandwidth_gbps:g} GB/s, "
            f"{f'L2 {hw.l2.bytes >> 20} MiB, ' if hw.l2 and hw.l2.bytes else ''}"
            f"{topology_text(hw.fabric)}"
        )
    return EXIT_OK


def _explain_preset(name: str) -> int:
    """Every value of a preset with its unit and provenance, one wrapped row each."""
    import textwrap

    from npusim.hw.config import load_provenance, resolve_preset
    from npusim.hw.provenance import describe, number, sourced_problem

    path = resolve_preset(name)
    entries = load_provenance(name)
    kw = max(len(k) for k in entries)
    vw = max(len(number(v)) for v, _, _ in entries.values())
    uw = max(len(u) for _, u, _ in entries.values())
    lead = kw + vw + uw + 6
    print(f"{path}: {len(entries)} values")
    print(f"{'key':<{kw}}  {'value':>{vw}}  {'unit':<{uw}}  provenance")
    for key, (value, unit, prov) in entries.items():
        text = describe(value, unit, prov)
        if prov is not None and prov.kind == "sourced" and sourced_problem(value, unit, prov):
            text = f"(!) {sourced_problem(value, unit, prov)}. {text}"
        body = textwrap.wrap(text, width=max(40, 118 - lead)) or [""]
        print(f"{key:<{kw}}  {number(value):>{vw}}  {unit:<{uw}}  {body[0]}")
        for more in body[1:]:
            print(" " * lead + more)
    return EXIT_OK


def cmd_scenarios(args: argparse.Namespace) -> int:
    from npusim import shipped

    groups = (
        ("scenarios (npusim run NAME)", shipped.scenarios()),
        ("sweeps (npusim sweep NAME)", shipped.sweeps()),
    )
    width = max(len(n) for _, table in groups for n in table)
    print(f"shipped with npusim, in {shipped.scenarios_dir()}")
    for title, table in groups:
        print(f"{title}:")
        for name, path in table.items():
            print(f"  {name:<{width}}  {shipped.description(path)}".rstrip())
    return EXIT_OK
