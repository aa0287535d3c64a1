"""Family ``hixl``: HIXL's one-sided transfers between an initiator die and a target
process's device or host memory, in any of the eight directions hicann/hixl's benchmark
measures (D2rD, rD2D, D2rH, rH2D, H2rH, rH2H, H2rD, rD2H), on one server or two.

Two forms of a transfer: the benchmark's (`block_bytes`: `total_bytes`, 128 MiB, in blocks
of that size, one TransferSync) and the cann-recipes-infer article's KV block (61 layers x
(128 KiB latent + 16 KiB rope), 100 transfers, the first dropped). Tensors: `kv` on each
initiator (its device GM, or its host memory for H2r* / r*2H) and `remote_kv` on each
target (its GM, or its host memory for *2rH / rH2*). The report gives latency per
transfer, GB/s per pair, and what bounds it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npusim.hw.host import capacity_problem, path_problem, socket_of
from npusim.kernels.family import Misfit, Option
from npusim.kernels.hixl.bound import bound_fields
from npusim.kernels.hixl.transfer import PATHS, HixlTiling, resolve, transfer_program
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.vector_sample import Unwindowed

# what each transport carries (hicann/hixl benchmarks/performance.md, A3: 不支持 elsewhere)
TRANSPORTS: dict[str, tuple[str, ...]] = {
    "fabric_mem": tuple(PATHS),
    "hccs": ("D2rD", "rD2D", "H2rD", "rD2H"),
    "roce": tuple(PATHS),
}
EXPANSIONS = {"fabric_mem": ("aicpu", "host"), "hccs": ("aicpu",), "roce": ("aicpu",)}


def _local(t: HixlTiling, r: int) -> tuple[int, ...]:
    return (t.nbytes,) if t.remote_of(r) is not None else (0,)


def _remote(t: HixlTiling, r: int) -> tuple[int, ...]:
    return (t.nbytes,) if t.is_target(r) else (0,)


KV = TensorSpec("kv", const(np.uint8), _local, "[bytes] the initiator's buffer (its GM, or "
                "its host memory for H2r* and r*2H)")
REMOTE_KV = TensorSpec("remote_kv", const(np.uint8), _remote, "[bytes] the target's buffer "
                       "(its GM, or its host memory for *2rH and rH2*)")


def transfer_fields(t: HixlTiling, frames: Sequence[Sequence[Mapping[str, Any]]]
                    ) -> dict[str, Any]:
    """Latency per transfer (the first dropped when there are more), GB/s per pair and in
    all, what bounds it, and the target sockets the pairs share."""
    per_pair, firsts = [], []
    for pair in range(t.pairs):
        r = t.local_of(pair)
        f = frames[r][0] if r < len(frames) and frames[r] else {}
        spans = [f[k][1] - f[k][0] for k in (f"transfer{i}" for i in range(t.transfers))
                 if k in f]
        if not spans:
            continue
        firsts.append(spans[0])
        kept = spans[1:] if len(spans) > 1 else spans
        per_pair.append(sum(kept) / len(kept))
    mean = sum(per_pair) / len(per_pair) if per_pair else 0.0
    out = {
        "path": t.path, "transport": t.transport, "expansion": t.expansion,
        "servers": t.servers, "bytes_per_transfer": t.nbytes,
        "block_bytes": t.block_bytes or t.nbytes, "descriptors": len(t.pieces()),
        "transfers_timed": max(1, t.transfers - 1),
        "latency_us": mean / 1000.0, "latency_us_first": (sum(firsts) / len(firsts) / 1000.0
                                                          if firsts else 0.0),
        "latency_us_max_pair": max(per_pair) / 1000.0 if per_pair else 0.0,
        "gbps_per_pair": t.nbytes / mean if mean else 0.0,
        "gbps_total": t.pairs * t.nbytes / mean if mean else 0.0,
        **bound_fields(t),
    }
    if t.remote_host:
        out.update(_sockets(t))
    return out


def _sockets(t: HixlTiling) -> dict[str, Any]:
    """Which target sockets the pairs' host memory sits on, and what they share there."""
    host = t.hw.host
    sockets: dict[str, int] = {}
    for pair in range(t.pairs):
        server, sock = socket_of(host, t.target_of(pair))
        key = f"server{server}.socket{sock}"
        sockets[key] = sockets.get(key, 0) + 1
    most = max(sockets.values())
    port, rate = (("write port", host.write_gbps) if t.op == "put"
                  else ("read port", host.read_gbps))
    return {
        "pairs_per_remote_socket": sockets,
        "shared_link": (f"each target socket's {port} ({rate:g} GB/s) and DRAM "
                        f"({host.dram_gbps:g} GB/s) serve up to {most} pair(s): "
                        f"{min(rate, host.dram_gbps) / most:g} GB/s each when all stream"),
    }


class _Transfer(Kernel):
    engines = ("sdma", "rdma")  # the SDMA engine, or over RoCE the NIC (if the preset has it)
    core_kind = "aicpu"
    profiles = True  # fields reads Call.frames: the transfer frames
    bandwidth = "gbps_per_pair"

    def cores(self, tiling: HixlTiling) -> int:
        return 1

    def program(self, tiling: HixlTiling) -> Any:
        return transfer_program(tiling.of(self.name), self.name)

    def fields(self, call: Call) -> dict[str, Any]:
        return transfer_fields(call.tiling.of(self.name), call.frames) if call.frames else {}


def _phase(op: str, verb: str) -> Phase:
    """put and get expand descriptors alike; only the direction of each SQE differs."""
    return Phase(op, "AICPU 0 of each initiator die (or the host thread, host expansion): "
                 "per transfer, one SQE (over RoCE a NIC WQE) per descriptor "
                 f"{verb} the target's memory, in kernels of 128 with a notify wait every "
                 "1920 (frame transfer<i>)")


class Put(_Transfer):
    name = "put"
    phases = (_phase("put", "writing"),)
    inputs, outputs = (KV,), (REMOTE_KV,)


class Get(_Transfer):
    name = "get"
    phases = (_phase("get", "reading"),)
    inputs, outputs = (REMOTE_KV,), (KV,)


class Hixl(Unwindowed):
    name = "hixl"
    uses_moe_shape = False
    help = ("HIXL one-sided transfers (FabricMem, HCCS or RoCE) between an initiator die "
            "and a target's device or host memory: the eight directions of hicann/hixl's "
            "benchmark, AICPU or host expansion, one server or two")
    ops = (Put(), Get())
    runs = {"put": ("put",), "get": ("get",)}
    options = (
        Option("path", "choice", "auto", "the direction (r: the target's side; D device GM, "
               "H host memory); auto: D2rH for put, rH2D for get",
               choices=("auto", *PATHS)),
        Option("transport", "choice", "fabric_mem", "fabric_mem (FabricMem: every direction), "
               "hccs (hixl_cs over HCCS: D2rD, rD2D, H2rD, rD2H) or roce (the device NIC's "
               "RDMA WRITE and READ: every direction; needs hardware.rdma)",
               choices=tuple(TRANSPORTS)),
        Option("expansion", "choice", "aicpu", "who turns descriptors into SQEs (WQEs over "
               "roce): aicpu (AICPU kernels of 128) or host (aclrtMemcpyAsync over 4 "
               "streams; fabric_mem only)", choices=("aicpu", "host")),
        Option("servers", "int", 2, "1: initiator and target on one server (the odd and "
               "even die of a package, as the benchmark's devices 1 and 0); 2: die i of "
               "server 0 and die i of server 1", lo=1, hi=2, exact=True),
        Option("block_bytes", "int", 0, "bytes per descriptor of the benchmark's form "
               "(total_bytes in blocks of this size); 0: the KV-block form (layers, k_bytes, "
               "v_bytes)", lo=0, hi=1 << 40),
        Option("total_bytes", "int", 128 << 20, "bytes per transfer in the block form "
               "(the benchmark: 128 MiB)", lo=1, hi=1 << 44),
        Option("pairs", "int", 1, "initiator-target pairs (the article: 1 and 16)", lo=1,
               hi=64),
        Option("layers", "int", 61, "KV form: layers per block (DeepSeek-R1: 61)", lo=1,
               hi=4096),
        Option("k_bytes", "int", 131072, "KV form: a layer's latent part (128 KiB)", lo=1,
               hi=1 << 30),
        Option("v_bytes", "int", 16384, "KV form: a layer's rope part (16 KiB; 0: none)",
               lo=0, hi=1 << 30),
        Option("transfers", "int", 100, "transfers per pair, one after another (the first "
               "is dropped from the mean when there are more)", lo=1, hi=1000),
    )

    def tiling(self, shape: None, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> HixlTiling:
        dies = hardware.host.dies if hardware.host is not None else 2 * options["pairs"]
        o = options
        return HixlTiling(o["pairs"], o["layers"], o["k_bytes"], o["v_bytes"], o["transfers"],
                          dies, hardware, o["path"], o["expansion"], o["servers"],
                          o["transport"], o["block_bytes"], o["total_bytes"])

    def misfit(self, shape: None, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if hardware.host is None:
            return Misfit("hardware", f"{hardware.name} has no host memory (no host section); "
                          "allowed: atlas_a3 or a preset with host")
        if options["transport"] == "roce" and hardware.rdma is None:
            return Misfit("hardware.rdma", f"{hardware.name} has no RoCE NIC (no "
                          "hardware.rdma section); allowed: atlas_a3 or a preset with rdma")
        if options["transport"] != "roce" and hardware.sdma is None:
            return Misfit("hardware", f"{hardware.name} has no SDMA engine (no sdma section): "
                          "HIXL FabricMem needs the A3's; allowed: atlas_a3")
        if hardware.aicpu is None:
            return Misfit("hardware", f"{hardware.name} has no AICPU (no aicpu section); "
                          "allowed: atlas_a3")
        path, transport = resolve(options["path"], op), options["transport"]
        if PATHS[path][0] != op:
            same = ", ".join(p for p, v in PATHS.items() if v[0] == op)
            return Misfit("workload.path", f"{path} is a {PATHS[path][0]}; op {op} moves "
                          f"{same}")
        if path not in TRANSPORTS[transport]:
            return Misfit("workload.path", f"{path} over {transport}: not supported (不支持); "
                          f"{transport} carries {', '.join(TRANSPORTS[transport])}")
        if options["expansion"] not in EXPANSIONS[transport]:
            return Misfit("workload.expansion", f"{options['expansion']} over {transport}: "
                          f"allowed: {', '.join(EXPANSIONS[transport])}")
        block, total = options["block_bytes"], options["total_bytes"]
        if block > total:
            return Misfit("workload.block_bytes", f"{block} is above total_bytes {total}; "
                          "allowed: 1 to total_bytes, or 0 (the KV-block form)")
        return None

    def tiling_misfit(self, tiling: HixlTiling, shape: None, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling.of(op)
        most = hardware.host.dies // 2 if t.servers == 1 else hardware.host.dies
        if t.pairs > most:
            return Misfit("workload.pairs", f"{t.pairs}: {t.servers} server(s) of "
                          f"{hardware.host.dies} dies hold {most} pairs; allowed: at most "
                          f"{most}")
        problem = path_problem(hardware, t.world)
        if problem:
            return Misfit("workload.servers", problem)
        levels = hardware.fabric.levels
        if levels and t.world > levels[-1].dies:
            return Misfit("workload.pairs", f"two servers need {t.world} dies; "
                          f"{hardware.name} has {levels[-1].dies}")
        if len(t.pieces()) > 1 << 22:
            return Misfit("workload.block_bytes", f"{len(t.pieces())} descriptors per "
                          "transfer; allowed: at most 4194304 (a larger block)")
        for host_side, who in ((t.local_host, "initiator"), (t.remote_host, "target")):
            problem = host_side and capacity_problem(hardware, t.pairs, t.nbytes)
            if problem:
                key = "workload.total_bytes" if t.block_bytes else "workload.layers"
                return Misfit(key, f"{t.nbytes} B per {who} in host memory: {problem}")
        return None

    def make_inputs(self, shape: None, options: Mapping[str, Any], op: str,
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
