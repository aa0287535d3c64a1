"""ops-transformer's MoeDistributeDispatch / MoeDistributeCombine as a family declares them.

A family that runs these operators, or implements the same ones, takes their tensor names,
so its dispatch chains to its combine the same way, and names its quantisations by the
operators' ``dispatch_quant`` / ``combine_quant`` options.
"""

from __future__ import annotations

from npusim.kernels.exchange import QUANTS, Chain, ExchangeFamily

MOE_DISTRIBUTE_CHAIN = Chain({n: n for n in ("expand_x", "assist_info_for_combine",
                                             "ep_recv_count")}, counts="ep_recv_count")
"""Combine takes dispatch's expand_x, assist_info_for_combine and ep_recv_count under the
same names; ep_recv_count's last entry is the rows received."""


class MoeDistributeFamily(ExchangeFamily):
    """A family of the MoeDistribute operators: a numpy reference and the chain above, and
    `npusim advise`'s quantisations as the operators' options (combine: none or INT8)."""

    references = chains = True
    chain = MOE_DISTRIBUTE_CHAIN
    dispatch_quants = {q: {"dispatch_quant": q} for q in QUANTS}
    combine_quants = {q: {"combine_quant": q} for q in ("none", "int8")}
