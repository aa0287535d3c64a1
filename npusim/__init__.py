"""npusim: a cycle-approximate discrete-event simulator of Ascend NPUs for MoE kernels."""

__version__ = "0.1.0"
