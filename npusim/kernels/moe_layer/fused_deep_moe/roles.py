"""What every core of FusedDeepMoe's MIX launch knows of its launch: the tiling, the
window, its role, the tokens' flag values of this launch, and its tensors.

Roles (GMM1K:1361-1378, AivInitParams; FDM.h:335-427): block b is AIC b, AIV 2b
(sub-block 0: receive, GMM1 epilogue, GMM2 epilogue, AllToAllSend) and AIV 2b + 1
(sub-block 1: send, GMM2 epilogue, ReducePermute).

Launch state (GMM1K:1380-1450 AivInitState, CAMC:232-250 and 329-345): the dispatch toggles
the cores' data-state words, the combine (initialised after GMM1, FDM.h:417-420) toggles
them back, so the dispatch always writes data half 0 and status area 0 and the combine
half 1 and area 1; each area's self-status word is toggled once a launch. npusim runs one
launch on a zeroed window: dispatch and combine both see state 0, so both wait for a
status sum of 1.0 per entry, the tokens carry TOKEN_FLAG_1 and the V -> C lines
V_TO_C_FLAG_1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npusim.kernels.moe_layer.fused_deep_moe.tiling import FusedTiling
from npusim.kernels.moe_layer.fused_deep_moe.window import FusedWindow
from npusim.kernels.moe_layer.fused_deep_moe_base.window import V_TO_C_FLAG_1
from npusim.kernels.moe_layer.tiling import GmmTiling

DISPATCH_STATE, COMBINE_STATE = 0, 1  # data half and status area of each side
SUM_TARGET = 1.0


@dataclass(frozen=True)
class LaunchTiling:
    """The fused kernel's tiling: the host's (`t`), the two GEMMs' tile plans and the
    window; `timing_only` as the scenario asks."""

    t: FusedTiling
    gmm1: GmmTiling
    gmm2: GmmTiling
    timing_only: bool

    @property
    def window(self) -> FusedWindow:
        return FusedWindow(self.t)

    # what TensorSpec shapes read
    world, L, H, BS, K = (property(lambda s, n=n: getattr(s.t, n))
                          for n in ("W", "L", "H", "BS", "K"))

    @property
    def rows(self) -> int:
        return self.t.capacity

    @property
    def aic(self) -> int:
        return self.t.aic


def core_num_per_group(t: FusedTiling) -> int:
    """recvCoreNum / localExpertNum (GMM1K:1226, 1276): receive cores per local expert."""
    return t.aic // t.L


def v_to_c_target(t: FusedTiling) -> int:
    """What the group line's word 0 reaches once every receive core of the group added
    its vToCFlag: coreNumPerGroup * vToCFlag as a uint32 product read as int32."""
    v = (core_num_per_group(t) * V_TO_C_FLAG_1) & 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def tensors(ctx: Any, *names: str) -> list[Any]:
    return [ctx.tensor(n) for n in names]
