"""``form: dispatch_ffn_combine`` of family moe_layer: DeepEP-Ascend's DispatchFFNCombine
(FuseMode.DISPATCH_FFN_COMBINE, ascend910_93) as one MIX launch (1 AIC : 2 AIV).
One module per concept: tiling (sizes and refusals), window (the symmetric segment),
routing_quant, pulls (count all-gather, cumsums, remote GETs), gmm (the AIC's grouped
GEMMs), program (per-core roles), reference (numpy)."""
