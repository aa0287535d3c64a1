"""Family ``shmem_doubleplane``: hicann/shmem's dispatch_doubleplane / combine_doubleplane.

The classic family with stage 1 on two planes (npusim.kernels.shmem_doubleplane.planes):
the remote segments the rule picks (rule.py) move on the die's SDMA engine, everything
else and all control on MTE. Same tensors, window, inputs, options, reference, --perf
metrics and CSV as shmem_classic (the examples share data_gen.py and check scripts); the
report adds which plane carried which payload bytes. Atlas A2/A3 only: the examples do
not support the Ascend950, which has no SDMA engine in its preset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Call, Phase
from npusim.kernels.shmem_classic.combine import combine_classic
from npusim.kernels.shmem_classic.dispatch import dispatch_classic
from npusim.kernels.shmem_classic.family import CombineClassic, DispatchClassic, ShmemClassic
from npusim.kernels.shmem_classic.layout import ClassicTiling
from npusim.kernels.shmem_doubleplane.planes import SDMA_UB_OFFSET, combine_send, dispatch_send
from npusim.runtime.sdma import LINE
from npusim.workload.shape import MoeShape

PAYLOAD = {"mte": ("mte3", "mte_put_nbi"), "sdma": ("sdma", "sdma_put_nbi")}


def plane_fields(transfers: Sequence[Sequence[Sequence[Any]]]) -> dict[str, Any]:
    """Payload bytes per plane, all and to other ranks only, and the SQEs posted."""
    out = {"mte": 0, "sdma": 0}
    remote = {"mte": 0, "sdma": 0}
    sqes = 0
    for row in transfers:
        for stats in row:
            for s in stats:
                for plane, (pipe, name) in PAYLOAD.items():
                    if s.pipe == pipe and s.name == name:
                        out[plane] += s.bytes
                        remote[plane] += s.bytes if s.remote else 0
                        sqes += s.count if plane == "sdma" else 0
    total = out["mte"] + out["sdma"]
    return {"plane_payload_bytes": out, "plane_payload_bytes_remote": remote,
            "payload_bytes": total, "sdma_sqes": sqes,
            "sdma_share": out["sdma"] / total if total else 0.0}


class _Planes:
    """What both doubleplane kernels add to classic's: the SDMA engines, stage 1 on two
    planes (`send`, run by classic's kernel `run`) and the plane accounting."""

    engines = ("sdma",)
    run: Any
    send: Any

    def program(self, tiling: ClassicTiling) -> Any:
        run, send = self.run, self.send

        def program(ctx: Any) -> Any:
            yield from run(ctx, tiling, send=send)
        return program

    def fields(self, call: Call) -> dict[str, Any]:
        """The plane accounting, then classic's harness frames."""
        return {**plane_fields(call.transfers), **super().fields(call)}


class DispatchDoubleplane(_Planes, DispatchClassic):
    run, send = staticmethod(dispatch_classic), staticmethod(dispatch_send)
    phases = (
        Phase("send", "every core c (dst_rank c): the segment counts and rule, SDMA "
              "payloads (sdma_quiet every 256 and at the end), MTE payloads + quiet, then "
              "assist / ready / count entries of the MTE and then of the SDMA segments on "
              "MTE (frame comm_only); barrier_core_soft"),
        *DispatchClassic.phases[1:],
    )


class CombineDoubleplane(_Planes, CombineClassic):
    run, send = staticmethod(combine_classic), staticmethod(combine_send)
    phases = (
        Phase("send", "every core c (src_rank c): the threshold from ep_recv_count, SDMA "
              "payloads of the large segments, MTE rows (payload + status, quiet each) of "
              "the others, sdma_quiet, then the SDMA rows' status puts (frame comm_only)"),
        *CombineClassic.phases[1:],
    )


DISPATCH, COMBINE = DispatchDoubleplane(), CombineDoubleplane()


class ShmemDoubleplane(ShmemClassic):
    name = "shmem_doubleplane"
    help = ("hicann/shmem's dispatch_doubleplane / combine_doubleplane examples: classic "
            "with remote segments of at least 2 MiB, above the average, on the SDMA engine "
            "(Atlas A2/A3)")
    ops = (DISPATCH, COMBINE)
    # classic's limits: the doubleplane examples keep DISPATCH_MAX_LOCAL_EXPERT_NUM = 1024
    # (dispatch_doubleplane/dispatch_kernel.h, main.cpp, scripts/run.sh), one core per peer
    # and aclshmemi_barrier_core_soft (dispatch_doubleplane_kernel.cpp)
    shape_limits = ShmemClassic.shape_limits

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if hardware.sdma is None:
            return Misfit("hardware", f"{hardware.name} has no SDMA engine (no sdma section): "
                          "hicann/shmem's doubleplane examples do not support the Ascend950 "
                          "(their README); allowed: atlas_a3, atlas_a2 or a preset with sdma")
        if SDMA_UB_OFFSET + LINE > hardware.ub.bytes:
            return Misfit("hardware.ub.bytes", f"{hardware.ub.bytes} B: the SDMA staging "
                          f"buffer sits at UB offset {SDMA_UB_OFFSET} ({LINE} B); allowed: "
                          f"at least {SDMA_UB_OFFSET + LINE} B")
        return super().misfit(shape, options, hardware, op)


FAMILY = ShmemDoubleplane()
