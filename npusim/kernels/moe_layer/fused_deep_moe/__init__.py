"""``moe_layer`` ``form: fused_deep_moe``: DeepEP-Ascend's FusedDeepMoe on the A3
(FuseMode.FUSED_DEEP_MOE; sgl-kernel-npu csrc/deepep/ops/op_kernel/fused_deep_moe.h), the
whole layer in one MIX launch: its host tiling and refusals (`tiling`), window (`window`),
block walk (`swizzle`), the program's stages (`send`, `recv`, `gmm1`, `quant`, `gmm2`,
`combine`, tied together in `program`), the kernel as the family runs it (`kernel`) and
the numpy reference where it differs from the unfused chain (`reference`)."""

from npusim.kernels.moe_layer.fused_deep_moe.kernel import (
    FUSED_DEEP_MOE,
    NAME,
    fused_inputs,
    launch_misfit,
    launch_tiling,
    launch_window,
)
from npusim.kernels.moe_layer.fused_deep_moe.roles import LaunchTiling
from npusim.kernels.moe_layer.fused_deep_moe.tiling import MIN_TOKEN_LENGTH, fused_misfit

__all__ = ["FUSED_DEEP_MOE", "MIN_TOKEN_LENGTH", "NAME", "LaunchTiling", "fused_inputs",
           "fused_misfit", "launch_misfit", "launch_tiling",
           "launch_window"]
