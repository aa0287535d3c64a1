"""Family ``deepep``: DeepEP-Ascend (sgl-project/sgl-kernel-npu, python/deep_ep, kernels in
csrc/deepep/ops for the Atlas A3, csrc/deepep/ops2 for the Atlas A2), a family of modes:

- ``mode: normal`` (normal.py): dispatch_layout, notify_dispatch, cam_moe_dispatch_normal,
  cam_moe_combine_normal, also on the Ascend 950 (their A5 variants);
- ``mode: low_latency`` (low_latency.py): low_latency_dispatch / low_latency_combine, mc2's V2
  programs on the A3 and on one A2 server;
- ``mode: low_latency`` with ``comm_alg: hierarchy`` (layered.py): on 2+ A2 servers the
  layered kernels;
- ``mode: normal`` with ``context: shmem`` (shmem_normal.py): the `shmem_ver` branch's
  SHMEM kernels on the A3 (dispatch_layout, ShmemNotifyDispatch, ShmemMoeDispatchNormal,
  ShmemMoeCombineNormal);
- ``mode: low_latency`` with ``context: shmem`` (shmem_low_latency.py): the branch's
  ShmemMoeDistributeDispatchV2 / CombineV2 on the A3.

What the modes share (options, platform, HCCL_BUFFSIZE, the A2 limits, the inputs) lives in
common.py; a scenario's workload runs the mode its options pick (`Family.mode`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.kernels.deepep.common import DeepepMode
from npusim.kernels.deepep.layered import LAYERED
from npusim.kernels.deepep.low_latency import LOW_LATENCY
from npusim.kernels.deepep.normal import NORMAL, buffer_dispatch_fields
from npusim.kernels.deepep.shmem_low_latency import LOW_LATENCY_SHMEM
from npusim.kernels.deepep.shmem_normal import NORMAL_SHMEM
from npusim.kernels.family import Family

__all__ = ["FAMILY", "DeepEP", "buffer_dispatch_fields"]


class DeepEP(DeepepMode):
    help = ("DeepEP-Ascend (sgl-kernel-npu csrc/deepep/ops on A3 and the Ascend 950, ops2 on "
            "one A2 server): normal mode (dispatch_layout, notify_dispatch, "
            "cam_moe_dispatch_normal, cam_moe_combine_normal) or low latency "
            "(MoeLowLatencyDispatchV2 / CombineV2: mc2's V2 programs on A3 and on one A2 "
            "server, the layered kernels on 2+ A2 servers); with context shmem the shmem_ver "
            "branch's SHMEM kernels of either mode")
    modes = {"normal": NORMAL, "low_latency": LOW_LATENCY, "layered": LAYERED,
             "normal_shmem": NORMAL_SHMEM, "low_latency_shmem": LOW_LATENCY_SHMEM}
    ops = tuple(dict.fromkeys(k for m in modes.values() for k in m.ops))
    runs = NORMAL.runs

    def mode(self, options: Mapping[str, Any]) -> Family:
        """workload.mode's family; context shmem: the shmem_ver kernels; low latency with
        comm_alg hierarchy: the layered one."""
        shmem = options.get("context") == "shmem"
        if options.get("mode") != "low_latency":
            return self.modes["normal_shmem" if shmem else "normal"]
        if shmem:
            return self.modes["low_latency_shmem"]
        return self.modes["layered" if options.get("comm_alg") == "hierarchy"
                          else "low_latency"]


FAMILY = DeepEP()
