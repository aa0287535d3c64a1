"""What a kernel author imports: the family contract, the MoE exchange template, the kernel
context and its waits, the number formats and the units, in one module.

    from npusim.author import ExchangeFamily, Chain, Kernel, Phase, TensorSpec, Wait

`npusim.api` is the other face, the one that runs scenarios; a kernel file needs only
this one (docs/authoring.md builds a family on it step by step).
"""

from __future__ import annotations

from npusim.formats import TOKEN_DTYPE_NAMES, token_dtype
from npusim.kernels.exchange import (
    COMBINE,
    DISPATCH,
    EXCHANGE_RUNS,
    Chain,
    ExchangeFamily,
    Received,
    received,
)
from npusim.kernels.family import Family, Misfit, Option, Touched, Variant
from npusim.kernels.kernel import Arrays, Call, CoreTiming, Kernel, Phase, TensorSpec, const
from npusim.kernels.shape import OnShape
from npusim.runtime.conditions import AllEqual, AtLeast, SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import GiB, KiB, MiB, align32, align256, align512, align_up, ceil_div
from npusim.workload.inputs import generate_inputs
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape, ShapeLimits

__all__ = [
    # the family contract
    "Family", "Kernel", "Option", "Phase", "TensorSpec", "Misfit", "Variant", "Arrays",
    "Call", "CoreTiming", "Touched", "const",
    # the MoE exchange template
    "ExchangeFamily", "Chain", "Received", "received", "EXCHANGE_RUNS", "DISPATCH", "COMBINE",
    "MoeShape", "ShapeLimits", "OnShape", "Routing", "generate_inputs",
    # the kernel context and its waits
    "KernelContext", "Strided", "Wait", "AllEqual", "AtLeast", "SumEquals",
    # number formats and units
    "TOKEN_DTYPE_NAMES", "token_dtype", "ceil_div", "align_up", "align32", "align256",
    "align512", "KiB", "MiB", "GiB",
]
