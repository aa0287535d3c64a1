"""What the host-memory examples leave behind, in numpy (for tests and --workers 2)."""

from __future__ import annotations

import numpy as np

from npusim.kernels.kernel import Arrays
from npusim.kernels.shmem_host.programs import HostTiling

VALUE = 10  # pattern_value: pe + 10


def _segments(t: HostTiling, me: int) -> np.ndarray:
    """[n_pes * elem_count]: segment pe holds pe + 10 where PE me and PE pe exchange data
    (both put and get: the host initialised the rest to 0)."""
    out = np.zeros((t.pes, t.elements), np.dtype(t.dtype))
    for pe in range(t.pes):
        if me == pe and t.targets != "peers" or me != pe and t.targets != "self":
            out[pe] = pe + VALUE
    return out.reshape(-1)


def expected(kernel: str, t: HostTiling) -> list[Arrays]:
    """Per rank the outputs of `kernel` (put, get, rma); empty tensors on dies without a PE."""
    dt = np.dtype(t.dtype)
    out: list[Arrays] = []
    for r in range(t.world):
        me = r // t.stride if r % t.stride == 0 else None
        if kernel == "rma":
            if me is None:
                out.append({"input": np.zeros(0, np.int32), "output": np.zeros(0, np.int32)})
                continue
            written = np.zeros(t.rma_bytes // 4, np.int32)
            written[0] = me  # the previous PE's aclshmem_int32_p(input, peer, peer)
            out.append({"input": written, "output": np.array([(me + 1) % t.pes], np.int32)})
            continue
        name = "host_dst" if kernel == "put" else "device_dst"
        out.append({name: np.zeros(0, dt) if me is None else _segments(t, me)})
    return out
