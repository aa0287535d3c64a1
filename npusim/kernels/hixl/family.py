"""Family ``hixl``: HIXL's one-sided D2rH (put) / rH2D (get) of KV blocks between servers.

The setups of the cann-recipes-infer article "NPU DeepSeek SHMEM通信优化实践" (results as images
only): one card to one card across two servers with 8784 KiB blocks (DeepSeek-R1's 61 x (128
KiB + 16 KiB)); 16 cards 1:1; large blocks. 100 transfers, the first dropped. Tensors: `kv`
on each local die (device GM), `remote_kv` in the paired remote process's host memory
(HOST_SIDE, npusim.hw.host). The report gives latency per transfer, GB/s per pair, and which
host links the concurrent pairs share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npusim.hw.host import capacity_problem, lone_path, path_problem, socket_of
from npusim.kernels.family import Arrays, Family, Kernel, Misfit, Option, Phase, TensorSpec, const
from npusim.kernels.hixl.transfer import HixlTiling, transfer_program
from npusim.kernels.shape import MoeShape
from npusim.kernels.vector_sample import NoWindow


def _local(t: HixlTiling, r: int) -> tuple[int, ...]:
    return (t.block_bytes,) if r < t.pairs else (0,)


def _remote(t: HixlTiling, r: int) -> tuple[int, ...]:
    return (t.block_bytes,) if t.remote_first <= r < t.world else (0,)


KV = TensorSpec("kv", const(np.uint8), _local, "[block bytes] the KV block on the local die")
REMOTE_KV = TensorSpec("remote_kv", const(np.uint8), _remote,
                       "[block bytes] HOST_SIDE: the block in the remote process's DRAM")


def transfer_fields(t: HixlTiling, frames: Sequence[Sequence[Mapping[str, Any]]],
                    direction: str) -> dict[str, Any]:
    """Latency per transfer (the first dropped when there are more), GB/s per pair and in
    all, and the remote host links the pairs share."""
    per_pair, firsts = [], []
    for r in range(t.pairs):
        f = frames[r][0] if r < len(frames) and frames[r] else {}
        spans = [f[k][1] - f[k][0] for k in (f"transfer{i}" for i in range(t.transfers))
                 if k in f]
        if not spans:
            continue
        firsts.append(spans[0])
        kept = spans[1:] if len(spans) > 1 else spans
        per_pair.append(sum(kept) / len(kept))
    mean = sum(per_pair) / len(per_pair) if per_pair else 0.0
    host = t.hw.host
    sockets: dict[str, int] = {}
    for r in range(t.pairs):
        server, sock = socket_of(host, t.remote_first + r)
        key = f"server{server}.socket{sock}"
        sockets[key] = sockets.get(key, 0) + 1
    latency, gbps = lone_path(t.hw, 0, t.remote_first, direction == "put")
    port = "cpu_in" if direction == "put" else "cpu_out"
    most = max(sockets.values()) if sockets else 0
    return {
        "block_bytes": t.block_bytes, "descriptors": len(t.pieces()),
        "transfers_timed": max(1, t.transfers - 1),
        "latency_us": mean / 1000.0, "latency_us_first": (sum(firsts) / len(firsts) / 1000.0
                                                          if firsts else 0.0),
        "latency_us_max_pair": max(per_pair) / 1000.0 if per_pair else 0.0,
        "gbps_per_pair": t.block_bytes / mean if mean else 0.0,
        "gbps_total": t.pairs * t.block_bytes / mean if mean else 0.0,
        "path": "D2rH" if direction == "put" else "rH2D",
        "lone_latency_us": (latency + t.hw.sdma.latency_ns) / 1000.0,
        "lone_gbps": min(gbps, t.hw.sdma.bandwidth_gbps),
        "pairs_per_remote_socket": sockets,
        "shared_link": (f"each remote socket's CPU port ({port}, {host.cpu_link_gbps:g} GB/s) "
                        f"and DRAM ({host.dram_gbps:g} GB/s) serve up to {most} pair(s): "
                        f"{min(host.cpu_link_gbps, host.dram_gbps) / most:g} GB/s each "
                        "when all stream") if most else "",
    }


class _Transfer(Kernel):
    engines = ("sdma",)
    profiles = True  # profile_fields: the transfer frames

    def cores(self, tiling: HixlTiling) -> int:
        return 1

    def program(self, tiling: HixlTiling) -> Any:
        return transfer_program(tiling, self.name)

    def profile_fields(self, tiling: HixlTiling, frames: Sequence[Sequence[Mapping[str, Any]]]
                       ) -> dict[str, Any]:
        return transfer_fields(tiling, frames, self.name)


class Put(_Transfer):
    name = "put"
    phases = (Phase("put", "AIV 0 of each local die: per transfer, one SQE per descriptor "
                    "into the remote host (D2rH) behind one doorbell, then sdma quiet (frame "
                    "transfer<i>)"),)
    inputs = (KV,)
    outputs = (REMOTE_KV,)


class Get(_Transfer):
    name = "get"
    phases = (Phase("get", "AIV 0 of each local die: per transfer, one SQE per descriptor "
                    "from the remote host (rH2D) behind one doorbell, then sdma quiet (frame "
                    "transfer<i>)"),)
    inputs = (REMOTE_KV,)
    outputs = (KV,)


class Hixl(Family):
    name = "hixl"
    uses_moe_shape = False
    help = ("HIXL FabricMem one-sided transfers of KV blocks between two Atlas A3 servers: "
            "put (D2rH) or get (rH2D), 1 or more card pairs, 100 transfers timed")
    ops = (Put(), Get())
    runs = {"put": ("put",), "get": ("get",)}
    options = (
        Option("pairs", "int", 1, "card pairs 1:1, local die i on server 0 to die i of "
               "server 1 (the article: 1 and 16)", lo=1, hi=64),
        Option("layers", "int", 61, "layers per block (DeepSeek-R1: 61)", lo=1, hi=4096),
        Option("k_bytes", "int", 131072, "bytes of a layer's latent part (128 KiB)", lo=1,
               hi=1 << 30),
        Option("v_bytes", "int", 16384, "bytes of a layer's rope part (16 KiB; 0: none)",
               lo=0, hi=1 << 30),
        Option("transfers", "int", 100, "transfers per pair, one after another (the first "
               "is dropped from the mean when there are more)", lo=1, hi=1000),
    )

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> HixlTiling:
        dies = hardware.host.dies if hardware.host is not None else options["pairs"]
        return HixlTiling(options["pairs"], options["layers"], options["k_bytes"],
                          options["v_bytes"], options["transfers"], dies, hardware)

    def window(self, tiling: HixlTiling) -> NoWindow:
        return NoWindow()

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if hardware.host is None:
            return Misfit("hardware", f"{hardware.name} has no host memory (no host section); "
                          "allowed: atlas_a3 or a preset with host")
        if hardware.sdma is None:
            return Misfit("hardware", f"{hardware.name} has no SDMA engine (no sdma section): "
                          "HIXL FabricMem needs the A3's; allowed: atlas_a3")
        return None

    def tiling_misfit(self, tiling: HixlTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        if t.pairs > hardware.host.dies:
            return Misfit("workload.pairs", f"{t.pairs}: a server has {hardware.host.dies} "
                          "dies; allowed: at most that many pairs")
        problem = path_problem(hardware, t.world)
        if problem:
            return Misfit("workload.pairs", problem)
        levels = hardware.fabric.levels
        if levels and t.world > levels[-1].dies:
            return Misfit("workload.pairs", f"two servers need {t.world} dies; "
                          f"{hardware.name} has {levels[-1].dies}")
        problem = capacity_problem(hardware, t.pairs, t.block_bytes)
        if problem:
            return Misfit("workload.layers", f"a block of {t.block_bytes} B per pair: {problem}")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Any, payload: bool) -> list[Arrays]:
        return [{"seed": np.array([routing.get("seed", 0) if payload else -1])}]

    def op_inputs(self, kernel: str, tiling: HixlTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        seed = int(inputs[0]["seed"][0])
        rng = np.random.default_rng(max(seed, 0))
        out = []
        for r in range(tiling.world):
            local, remote = _local(tiling, r)[0], _remote(tiling, r)[0]
            n = max(local, remote)
            block = (rng.integers(0, 256, n, dtype=np.uint8) if seed >= 0
                     else np.zeros(n, np.uint8))
            out.append({"kv": block[:local], "remote_kv": block[:remote]})
        return out


FAMILY = Hixl()
