"""The sizes both FusedDeepMoe builds' kernels derive alike from the launch's shape.

The A3's FusedDeepMoe::Init (fused_deep_moe.h:319-332) and the 950's
(fused_deep_moe_a5/fused_deep_moe_a5.h:362-369) size GMM1's rows and GMM2's K the same
way, and both GMM1 kernels size a window slot alike (GMM1K:1414,
dispatch_mx_gmm1_swiglu.h:1210). What differs stays in each build's tiling: the dispatched
token's record (int8 + fp32 scale vs MX codes + E8M0 scales), the host's window check and
the tile sizes.
"""

from __future__ import annotations

TOKEN_DTYPE_BYTE_SIZE = 2  # sizeof(XType): bf16 tokens (both GMM1 kernels' XType)


class FusedSizes:
    """A mixin for a build's tiling, which supplies W, K, L (local experts), H, max_bs
    (globalBs / W) and n1 (gmm1HLen, the gate and up columns)."""

    W: int
    K: int
    L: int
    H: int
    max_bs: int
    n1: int

    @property
    def capacity(self) -> int:
        """m_ / maxTokenNum: maxBs * W * min(topK, L), GMM1's rows and the rows every
        per-row workspace is sized for."""
        return self.max_bs * self.W * min(self.K, self.L)

    @property
    def n2(self) -> int:
        """GMM2's K (k2_ / gmm2InputDim_, the SwiGLU output's columns): N1 / 2."""
        return self.n1 // 2

    @property
    def slot_bytes(self) -> int:
        """expertPerSizeOnWin: one (source rank, local expert) slot of a data half."""
        return self.max_bs * self.H * TOKEN_DTYPE_BYTE_SIZE

    @property
    def data_half_bytes(self) -> int:
        """One data state's W * L slots."""
        return self.W * self.L * self.slot_bytes
