"""The host tiling's checks for ``comm_alg: fullmesh_v2`` (family ``mc2``), as one-line
(key, message) pairs: ``CheckCommAlgAttrs`` (BS and K bounds) and ``CheckUBSize``
(``dispatch_v2/op_host/op_tiling/moe_distribute_dispatch_v2_tiling.cpp``), plus the shapes
npusim's program does not cover. The window check (tokenNeedSizeDispatch of 480/512 blocks)
is :func:`npusim.kernels.mc2.window.mc2_window`'s."""

from __future__ import annotations

from typing import Any

from npusim.kernels.mc2 import tiling as tl
from npusim.kernels.mc2.options import Mc2Options
from npusim.kernels.mc2.tiling import Mc2Tiling

SRC = "moe_distribute_dispatch_v2_tiling.cpp"


def full_mesh_misfit(shape: Any, o: Mc2Options, arch: str) -> tuple[str, str] | None:
    """CheckCommAlgAttrs: BS <= 256 on A3 (512 on the 950), K <= 12."""
    bs = max(o.bs_per_rank or (shape.BS,))
    top = tl.FULL_MESH_BS_MAX[arch]
    chip = "A3 (arch22)" if arch == "arch22" else "the 950 (arch35)"
    if bs > top:
        return ("workload.bs", f"{bs}: comm_alg fullmesh_v2 on {chip} allows bs 1..{top} "
                f"(FULLMESH_BS_UPPER_BOUND, {SRC} CheckCommAlgAttrs)")
    if shape.K > tl.FULL_MESH_K_MAX:
        return ("workload.k", f"{shape.K}: comm_alg fullmesh_v2 allows k 1..{tl.FULL_MESH_K_MAX} "
                f"(FULLMESH_K_MAX, {SRC} CheckCommAlgAttrs)")
    if o.performance_info:
        return ("workload.performance_info", "true: not modelled for comm_alg fullmesh_v2 "
                "(RecordRankCommDuration); allowed: false")
    return None


def full_mesh_ub_misfit(t: Mc2Tiling) -> tuple[str, str] | None:
    """CheckUBSize (the send path's UB as the host counts it), the send slots UB leaves
    (CalcSendTokenBufNum: 0 slots would send nothing), and the BS mode's expert scales."""
    if t.cores < 2:  # aivUsedCumSum_ is at most C / 2: one core leaves no count core
        return ("hardware.chip.aiv_cores", f"{t.cores}: comm_alg fullmesh_v2 splits the AIV "
                "cores into all-to-all cores and count cores (aivUsedCumSum_, at most C / 2), "
                "and one core leaves no count core to receive the counts; allowed: at least 2")
    for r in range(t.W):
        used = tl.host_ub_check_v2(t, r)
        if used > t.ub_bytes:
            return ("workload.bs", f"BS {t.bs(r)}, H {t.H}, K {t.K}, E {t.shape.E}: "
                    f"comm_alg fullmesh_v2's send path needs {used} B of UB, the preset's core "
                    f"has {t.ub_bytes} B (CheckUBSize, {SRC}); allowed: a smaller bs, h or k")
        bs_path = tl.bs_mode(t, r, t.bs(r))
        if (t.arch == "arch35" or bs_path) and tl.send_token_buf_num(t, r, bs_path) == 0:
            return ("workload.h", f"{t.H}: comm_alg fullmesh_v2 leaves no UB for one "
                    f"{t.window.dispatch.slot} B send slot (CalcSendTokenBufNum); allowed: "
                    "a smaller h")
        if bs_path and t.window.dispatch.expert_scale_offset is not None:
            return ("workload.expand_scales", "true: comm_alg fullmesh_v2's A3 BS mode "
                    "(SendBSExpertLoop) writes no expert scale into its slots; allowed: false "
                    "on this shape (or bs <= 16, or a bs the MoE send cores do not divide)")
    return None
