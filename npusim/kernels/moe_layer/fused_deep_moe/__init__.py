"""``moe_layer`` ``form: fused_deep_moe``: DeepEP-Ascend's FusedDeepMoe on the A3
(FuseMode.FUSED_DEEP_MOE; sgl-kernel-npu csrc/deepep/ops/op_kernel/fused_deep_moe.h), the
whole layer in one MIX launch. So far its host tiling and refusals (`tiling`) and the
steps of its arithmetic that differ from the unfused chain's (`reference`); the program
and the family's wiring come next (design: the module docstrings of each step)."""
