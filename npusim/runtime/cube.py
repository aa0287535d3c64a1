"""The AIC (cube) core's instructions: MTE1 loads, the cube's mmad, FixPipe out of L0C.

An AIC core (npusim.hw.cores.AIC) has no UB: MTE2 copies GM into L1 (`ctx.copy_in` with an
L1 buffer), MTE1 moves L1 into L0A/L0B (`load_data`), the cube multiplies L0A by L0B into
L0C (`mmad`) and FixPipe writes L0C out, converted, to GM or to an AIV core's UB of the
same MIX block (`fixpipe`). Every figure is the preset's `aic` section.

Layout: the bytes of an operand keep the ND (row-major) order of its matrix; the fractal
(Nz/Zz) layout the hardware uses is not modelled, but its padding is: an operand occupies
its dimensions rounded up to whole fractals (16 rows, 32 B of K), and an mmad is charged
whole fractals.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from npusim.hw.memory import Region
from npusim.hw.pipe import Op
from npusim.hw.ub import INF, UBBuffer
from npusim.units import align_up, ceil_div

FRACTAL = 16  # rows of M and columns of N per fractal (cube_m_size, cube_n_size)
K_BYTES = 32  # bytes of K per fractal: 16 fp16, 32 int8/fp8 elements
MX_BLOCK = 32  # elements of K per E8M0 scale (MX formats)
FP16 = ("float16", "bfloat16")
FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3", "hifloat8")
INT8 = ("int8",)


def np_dtype(name: str) -> np.dtype:
    """numpy dtype of an operand type name (ml_dtypes for bfloat16 and the fp8s, imported
    here: it costs a process over a second of CPU, paid only by runs that name them)."""
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def fractals(m: int, n: int, k: int, itemsize: int) -> int:
    """Fractal operations of an m x n x k mmad: ceil(m/16) ceil(n/16) ceil(k / k0)."""
    k0 = K_BYTES // itemsize
    return ceil_div(m, FRACTAL) * ceil_div(n, FRACTAL) * ceil_div(k, k0)


def padded_bytes(rows: int, cols: int, itemsize: int, k_cols: bool) -> int:
    """Bytes an operand occupies in L0: rows to 16, K (the columns of A, rows of B) to
    32 B; `k_cols` says the columns are K."""
    k0 = K_BYTES // itemsize
    r = align_up(rows, FRACTAL)
    c = align_up(cols, k0 if k_cols else FRACTAL)
    return r * c * itemsize


def e8m0(scales: np.ndarray) -> np.ndarray:
    """E8M0 exponent bytes -> their fp32 factors 2^(e - 127)."""
    return np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)


def _int8_product(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x @ y of int8 matrices, exactly, as int64: through BLAS (fp32 while every partial
    sum stays below 2^24: k <= 1024; fp64 beyond, exact below 2^53); zero when an operand
    is all zeros (a timing-only run's)."""
    if not (x.any() and y.any()):
        return np.zeros((x.shape[0], y.shape[1]), np.int64)
    ft = np.float32 if x.shape[1] <= 1024 else np.float64
    return (x.astype(ft) @ y.astype(ft)).astype(np.int64)


class CubeOps:
    """Mixed into KernelContext: the AIC's MTE1, cube and FixPipe instructions."""

    __slots__ = ()

    def _aic(self: Any) -> Any:
        aic = self.cfg.aic
        if aic is None:
            raise self.error(f"preset {self.cfg.name} has no AIC cores (no aic section)")
        return aic

    def load_data(self: Any, dst: UBBuffer, src: UBBuffer, nbytes: int, dst_offset: int = 0,
                  src_offset: int = 0, name: str = "load_data") -> Op:
        """LoadData L1 -> L0A or L0B on MTE1: `aic.mte1_issue_cycles` + nbytes at the
        destination's rate (`aic.mte1_l0a_bytes_per_cycle` / `mte1_l0b_...`) cycles."""
        aic = self._aic()
        rates = {"l0a": aic.mte1_l0a_bytes_per_cycle, "l0b": aic.mte1_l0b_bytes_per_cycle}
        kind = self._buffer_kind(dst)
        if kind not in rates or self._buffer_kind(src) != "l1":
            raise self.error(f"{name}: LoadData moves L1 to L0A or L0B, not "
                             f"{src.ub.label} to {dst.ub.label}", address=dst.offset)
        self._check_ub(src, src_offset, nbytes, name)
        self._check_ub(dst, dst_offset, nbytes, name)
        self._check_written(src, src_offset, nbytes, None, name)
        cycles = aic.mte1_issue_cycles + math.ceil(nbytes / rates[kind])

        def effect() -> None:
            dst.bytes_at(dst_offset, nbytes)[:] = src.bytes_at(src_offset, nbytes)

        return self.fixed("mte1", name, cycles * self.cycle_ns, [src], [dst], effect)

    def mmad_cycles(self: Any, m: int, n: int, k: int, dtype: str) -> float:
        """The cube's cycles for one m x n x k mmad: `aic.cube_issue_cycles` + whole
        fractals x (16 x 16 x k0 MACs) / the dtype's MACs per cycle."""
        aic = self._aic()
        rate = self._cube_rate(aic, dtype)
        item = np_dtype(dtype).itemsize
        macs = FRACTAL * FRACTAL * (K_BYTES // item)
        return aic.cube_issue_cycles + fractals(m, n, k, item) * macs / rate

    def _cube_rate(self: Any, aic: Any, dtype: str) -> float:
        if dtype in FP16:
            rate = aic.cube_fp16_macs_per_cycle
        elif dtype in INT8:
            rate = aic.cube_int8_macs_per_cycle
        elif dtype in FP8:
            rate = aic.cube_fp8_macs_per_cycle
        else:
            raise self.error(f"mmad of {dtype}: the cube takes {', '.join(FP16 + INT8 + FP8)}")
        if rate <= 0:
            raise self.error(f"mmad of {dtype}: the cube of preset {self.cfg.name} does not "
                             f"take {dtype} (aic.cube_*_macs_per_cycle is 0)")
        return rate

    def mmad(self: Any, c: UBBuffer, a: UBBuffer, b: UBBuffer, m: int, n: int, k: int,
             dtype: str, accumulate: bool = False, a_scale: UBBuffer | None = None,
             b_scale: UBBuffer | None = None, name: str = "mmad") -> Op:
        """Mmad on the cube: C[m, n] (+)= A[m, k] @ B[k, n]; A in L0A, B in L0B, C in L0C
        (fp32; int32 for int8). With `a_scale` [m, ceil(k/32)] and `b_scale`
        [ceil(k/32), n] (E8M0 bytes, any local buffer) it is the MX mmad: each 32 elements
        of K scaled by 2^(e-127). Costs mmad_cycles on the cube pipe."""
        m, n, k = (self._whole(v, name, dim) for v, dim in ((m, "m"), (n, "n"), (k, "k")))
        item = np_dtype(dtype).itemsize
        for buf, want in ((a, "l0a"), (b, "l0b"), (c, "l0c")):
            if self._buffer_kind(buf) != want:
                raise self.error(f"{name}: operand {buf.name!r} is in {buf.ub.label}, the cube "
                                 f"reads A from L0A, B from L0B and writes C to L0C",
                                 address=buf.offset)
        self._check_ub(a, 0, padded_bytes(m, k, item, True), name)
        self._check_ub(b, 0, padded_bytes(k, n, item, False), name)
        self._check_ub(c, 0, m * n * 4, name)
        scales = [s for s in (a_scale, b_scale) if s is not None]
        if len(scales) == 1:
            raise self.error(f"{name}: an MX mmad needs both a_scale and b_scale")
        kb = ceil_div(k, MX_BLOCK)
        if scales:
            self._check_ub(a_scale, 0, m * kb, name)
            self._check_ub(b_scale, 0, kb * n, name)
        cycles = self.mmad_cycles(m, n, k, dtype)
        for buf, nbytes in ((a, m * k * item), (b, k * n * item),
                            *(((a_scale, m * kb), (b_scale, kb * n)) if scales else ())):
            self._check_written(buf, 0, nbytes, None, name)
        dt = np_dtype(dtype)
        out = np.int32 if dtype in INT8 else np.float32

        def effect() -> None:
            x = a.view(dt, m * k).reshape(m, k)
            y = b.view(dt, k * n).reshape(k, n)
            if out is np.int32:
                prod = _int8_product(x, y)
            else:
                xf, yf = x.astype(np.float32), y.astype(np.float32)
                if scales:
                    sa = np.repeat(e8m0(a_scale.view(np.uint8, m * kb).reshape(m, kb)),
                                   MX_BLOCK, axis=1)[:, :k]
                    sb = np.repeat(e8m0(b_scale.view(np.uint8, kb * n).reshape(kb, n)),
                                   MX_BLOCK, axis=0)[:k, :]
                    xf, yf = xf * sa, yf * sb
                prod = xf @ yf
            acc = c.view(out, m * n).reshape(m, n)
            acc[...] = (acc + prod if accumulate else prod).astype(out)

        reads: list[UBBuffer] = [a, b, *scales] + ([c] if accumulate else [])
        self._l0c_dtype[id(c)] = out
        return self.fixed("cube", name, cycles * self.cycle_ns, reads, [c], effect)

    def fixpipe(self: Any, dst: Region | UBBuffer, src: UBBuffer, m: int, n: int,
                out_dtype: str, dst_offset: int = 0, relu: bool = False,
                src_offset: int = 0, name: str = "fixpipe", dst_row_bytes: int = 0,
                channel_scale: UBBuffer | None = None) -> Op:
        """Fixpipe L0C -> GM (a tensor or the own window) or -> an AIV's UB of this MIX
        block (a buffer from `peer_buffer`): C[m, n] (fp32/int32 in L0C) converted to
        `out_dtype` (float32, float16, bfloat16), optionally ReLU'd, row-major at
        dst_offset. A transfer on the FixPipe pipe: m n itemsize bytes at
        `aic.fixpipe_gm_bytes_per_cycle` through the HBM, or `fixpipe_ub_bytes_per_cycle`
        on chip (0: no such path on this preset), then `aic.fixpipe_latency_ns`.
        `src_offset` (bytes) picks rows of a larger C (a tile's half for each AIV).
        `dst_row_bytes` > 0 (GM only): row i lands at dst_offset + i * dst_row_bytes (a
        tile of a wider matrix). int32 out of an int32 L0C is copied exactly.
        `channel_scale` (an L1 buffer of n uint64, the quant-pre scale FixBuf takes,
        QuantMode DEQF16-style per channel): C is dequantised on the way out, f32(c) times
        the fp32 held in each uint64's low 32 bits, then rounded to `out_dtype` (RNE)."""
        aic = self._aic()
        m, n = self._whole(m, name, "m"), self._whole(n, name, "n")
        if self._buffer_kind(src) != "l0c":
            raise self.error(f"{name}: FixPipe reads L0C, not {src.ub.label}",
                             address=src.offset)
        if isinstance(dst, UBBuffer) and aic.fixpipe_ub_bytes_per_cycle <= 0:
            raise self.error(f"{name}: FixPipe into an AIV's UB is not a path of preset "
                             f"{self.cfg.name} (aic.fixpipe_ub_bytes_per_cycle is 0)")
        odt = np_dtype(out_dtype)
        acc_dtype = self._l0c_dtype.get(id(src), np.float32)
        nbytes = m * n * odt.itemsize
        self._check_ub(src, src_offset, m * n * 4, name)
        if src.write_ready > self.t:
            raise self.error(f"{name} reads L0C buffer {src.name!r} before the mmad into it "
                             f"({src.writer}) completes: missing wait", address=src.offset)
        self._check_written(src, src_offset, m * n * 4, None, name)
        if channel_scale is not None:
            if self._buffer_kind(channel_scale) != "l1":
                raise self.error(f"{name}: the per-channel scale comes from L1, not "
                                 f"{channel_scale.ub.label}", address=channel_scale.offset)
            self._check_ub(channel_scale, 0, n * 8, name)
            self._check_written(channel_scale, 0, n * 8, None, name)
        to_ub = isinstance(dst, UBBuffer)
        if to_ub:
            if all(dst.ub is not ctx.ub for ctx in self.block if ctx is not self):
                raise self.error(f"{name}: UB buffer {dst.name!r} is not in an AIV of this "
                                 "MIX block", address=dst.offset)
            self._check_ub(dst, dst_offset, nbytes, name)
            self._claim_landing(dst, nbytes, name)
            cap, path = aic.fixpipe_ub_bytes_per_cycle * self.cfg.chip.clock_ghz, ()
        else:
            if dst.rank != self.rank_id:
                raise self.error(f"{name}: FixPipe writes this rank's GM only")
            span = (m - 1) * dst_row_bytes + n * odt.itemsize if dst_row_bytes else nbytes
            self._check_gm(dst, dst_offset, span, name)
            cap, path = self._mte_cap("fixpipe"), self.rank.write_path(nbytes)
        self.t += self.issue_ns
        self.counters["SCALAR"] += 1
        src.read_busy = INF
        op = Op(self.env, name, "fixpipe")
        pipe = self.core.fixpipe
        pipe.issue(op)

        def done(t: float) -> None:
            if channel_scale is not None:
                bits = channel_scale.view(np.uint64, n).astype(np.uint32)
                deq = bits.view(np.float32)
                vals = src.view(acc_dtype, m * n, src_offset).reshape(m, n).astype(np.float32)
                vals = (vals * deq[None, :]).astype(np.float32)
                if relu:
                    vals = np.maximum(vals, 0)
                raw = vals.reshape(-1).astype(odt).view(np.uint8)
            elif odt == np.int32 and acc_dtype == np.int32 and not relu:
                raw = src.view(np.int32, m * n, src_offset).copy().view(np.uint8)
            else:
                vals = src.view(acc_dtype, m * n, src_offset).astype(np.float32)
                if relu:
                    vals = np.maximum(vals, 0)
                raw = vals.astype(odt).view(np.uint8)
            if to_ub:
                dst.bytes_at(dst_offset, nbytes)[:] = raw
                dst.ub.mark(dst.offset + dst_offset, nbytes)
                dst.write_ready = t
            elif dst_row_bytes:
                row = n * odt.itemsize
                for i in range(m):
                    dst.write(dst_offset + i * dst_row_bytes, raw[i * row:(i + 1) * row])
            else:
                dst.write(dst_offset, raw)
            src.read_busy = t
            self._finish(pipe, op, t, nbytes)

        def begin() -> None:
            pipe.began(op)
            self.machine.net.start(nbytes, cap, path, aic.fixpipe_latency_ns, done,
                                   self._on_sent(pipe, op), op.event())

        self._count(pipe, name, nbytes, False)
        pipe.submit(self.t, begin)
        return op

    def peer_buffer(self: Any, sub_block: int, name: str) -> UBBuffer:
        """The UB buffer `name` of AIV sub-block `sub_block` (0 or 1) of this MIX block, for
        a FixPipe into it (the kernels address the AIV's UB by a fixed offset; npusim by
        the AIV's allocation, which must exist when the FixPipe is issued)."""
        aivs = [ctx for ctx in self.block if ctx.core.kind.name == "aiv"]
        if not 0 <= sub_block < len(aivs):
            raise self.error(f"no AIV sub-block {sub_block} in this core's MIX block "
                             f"({len(aivs)} AIV)")
        for buf in reversed(aivs[sub_block].core.ub.buffers):
            if buf.name == name:
                return buf
        raise self.error(f"AIV sub-block {sub_block} has no UB buffer {name!r} (allocate it "
                         "before the cube writes into it)")

    def _buffer_kind(self: Any, buf: UBBuffer) -> str:
        for kind, local in self.core.buffers.items():
            if local is buf.ub:
                return kind
        return "another core's " + buf.ub.label

    def _mte_cap(self: Any, pipe: str) -> float:
        return self._port(pipe)[0]
