"""FusedDeepMoe on the Ascend 950 (sgl-kernel-npu csrc/deepep/ops/op_kernel/
fused_deep_moe_a5, branch main): dispatch, MX GMM1, SwiGLU, MX requant, GMM2 and combine
in one MIX launch. `tiling` holds the host checks and the block walk, `window` the HCCL
window and the status space, `dispatch` / `gmm1` / `quant` / `gmm2` the kernel's stages,
`program` the per-core order, `reference` the numpy layer."""
