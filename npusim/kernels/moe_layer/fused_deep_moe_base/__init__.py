"""What FusedDeepMoe's two builds (the A3's `fused_deep_moe`, the 950's
`fused_deep_moe_a5`) share, named after the header both include (fused_deep_moe_base.h,
one include guard FUSED_DEEP_MOE_BASE_H in both): the sizes their kernels derive alike
(`sizes`), the window constants and flag words their GMM1 kernels declare alike (`window`)
and the grouped GEMMs' block walk (`swizzle`). Each build's own steps (its record layout,
host checks, tiles, window order, stages) stay in its package."""
