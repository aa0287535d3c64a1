"""Does a workload fit the CANN sample's window layout and core roles? One line if not.

The window (reference/kernels.md): 1 GiB per rank, two dispatch data states of 512 MiB
(double buffering), the status region from 1022 MiB on. One data state holds the combine
receive area and, when dispatching, the dispatch grid; the region check of WindowLayout
catches overlaps the sizes alone do not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npusim.kernels.cann_sample import layout
from npusim.kernels.family import Misfit
from npusim.workload.shape import MoeShape

MIB = layout.MiB
# State 1 starts at 512 MiB and must end before the status region.
STATE_LIMIT_BYTES = min(layout.DATA_HALF, layout.STATUS_REGION - layout.DATA_HALF)


def window_data_bytes(shape: MoeShape, dispatch_quant: str, combine_quant: str,
                      dispatching: bool) -> int:
    """Bytes one data state needs: combine receive area + (if dispatching) the grid.

    recv = BS*(K+S)*Align512(2H) (S shared-expert slots) and grid = W*L*BS*slot_bytes, as
    in the sample (reference/kernels.md); a shared rank's grid (W blocks) is smaller.
    """
    d_slot = layout.dispatch_record_layout(shape.H, dispatch_quant, shape.dtype).slot_bytes
    c_slot = layout.combine_record_layout(shape.H, combine_quant, shape.dtype).slot_bytes
    recv = shape.BS * (shape.K + shape.S) * c_slot
    grid = shape.W * shape.L * shape.BS * d_slot if dispatching else 0
    return recv + grid


def window_misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
                  dispatching: bool) -> Misfit | None:
    if hardware.window.bytes < layout.WINDOW_BYTES:
        return Misfit(
            "hardware.window.bytes",
            f"window of {hardware.window.bytes} bytes is smaller than the sample's layout "
            f"({layout.WINDOW_BYTES} bytes: two 512 MiB data states, status at 1022 MiB)")
    need = window_data_bytes(shape, options["dispatch_quant"], options["combine_quant"],
                             dispatching)
    if need <= STATE_LIMIT_BYTES:
        if not dispatching:
            return None
        lay = layout.WindowLayout.of(shape, options["dispatch_quant"], hardware.chip.aiv_cores,
                                     hardware.window.bytes)
        try:
            lay.validate()
        except ValueError as exc:
            return Misfit("workload.bs", f"window layout does not fit: {exc}")
        return None
    max_bs = STATE_LIMIT_BYTES // (need // shape.BS)  # need is linear in bs
    allowed = (
        f"bs <= {max_bs} with these h, k, experts and quantisation"
        if max_bs >= 1
        else "no bs fits; reduce h, k, ep_world_size or experts_per_rank"
    )
    return Misfit(
        "workload.bs",
        f"window too small: one data state needs {need / MIB:.1f} MiB (combine receive area "
        f"BS*(K+S)*Align512(2H) + dispatch grid E*BS*slot_bytes) but holds "
        f"{STATE_LIMIT_BYTES / MIB:.0f} MiB; allowed: {allowed}")


def cores_misfit(shape: MoeShape, hardware: Any) -> Misfit | None:
    """The sample's dispatch needs a cum-sum core and an all-to-all core; the shared-send
    cores (V2: max(1, C*S // (K+S))) must leave both."""
    cores = hardware.chip.aiv_cores
    if cores < 2:
        return Misfit(
            "hardware.chip.aiv_cores",
            f"chip.aiv_cores {cores}: the kernels need at least 2 AIV cores (a cum-sum core "
            "and an all-to-all core); allowed: 2 or more")
    if not shape.S:
        return None
    n_sh = layout.shared_send_core_count(cores, shape.K, shape.S)
    if cores - n_sh < 2:
        return Misfit(
            "workload.shared_experts",
            f"{shape.S} shared experts with k={shape.K} take {n_sh} of the {cores} AIV "
            "cores (max(1, C*S // (K+S))), leaving fewer than the 2 that MoE sends and counts "
            "need; allowed: fewer shared experts or more chip.aiv_cores")
    return None


def case_misfit(path: Path, shape: MoeShape, kernels: tuple[str, ...]) -> str | None:
    """Cheap shape checks so a wrong case directory fails before the run starts."""
    try:
        if not path.is_dir():
            return f"{path} is not a directory"
        inp = path / "input"
        if not inp.is_dir():
            return (f"{path} has no input/ folder; expected input/chip_<r>/ per rank "
                    "as written by the CANN sample's gen_data.py")
        chips = [d for d in inp.iterdir() if d.is_dir() and re.fullmatch(r"chip_\d+", d.name)]
        if len(chips) != shape.W:
            return (f"{path} has {len(chips)} input/chip_* folders but "
                    f"workload.ep_world_size is {shape.W}; they must match")
        tb = 2  # float16 / bfloat16
        expect: dict[str, tuple[int | None, str]] = {
            "expert_ids": (shape.BS * shape.K * 4, "[BS, K] int32")
        }
        if "dispatch" in kernels:
            expect["x"] = (shape.BS * shape.H * tb, f"[BS, H] {shape.dtype}")
        if "combine" in kernels:
            expect["expert_scales"] = (shape.BS * shape.K * 4, "[BS, K] float32")
            expect["expand_x"] = (None, f"[A, H] {shape.dtype}")
        for r in range(shape.W):
            for stem, (size, what) in expect.items():
                f = inp / f"chip_{r}" / f"{stem}_{r}.bin"
                if not f.is_file():
                    return f"missing {f.relative_to(path)} ({what})"
                actual = f.stat().st_size
                if size is not None and actual != size:
                    return (f"{f.relative_to(path)} has {actual} bytes; the workload "
                            f"(bs={shape.BS}, h={shape.H}, k={shape.K}) needs {size} bytes "
                            f"({what})")
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return None
