"""GeLU as the sample's CPU check computes it (the tanh approximation), in float64."""

from __future__ import annotations

import numpy as np


def gelu_reference(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the formula of the sample README."""
    v = x.astype(np.float64)
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v ** 3)))
