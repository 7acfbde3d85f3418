#!/usr/bin/env python3
"""Checks parity's casts (src/core/quant.c, through tests/core/quant_dump) bit
for bit against an independent numpy reading of the reference definitions
(docs/precisions.md names the sources):

  e4m3  PyTorch c10 Float8_e4m3fn's fp32 -> fp8 bit algorithm (what
        `.to(torch.float8_e4m3fn)` runs), after the kernels' clamp to +-448
  e2m1  nearest of the eight E2M1 magnitudes, ties to the even code
  bf16  fp32 bits + 0x7fff + lsb (c10 round_to_nearest_even); for f64 inputs
        exact rational rounding (fractions)
  act_quant / fp4_act_quant: the V4 tilelang kernels (amax floor, amax *
        fl32(1/max), fast_log2_ceil on the fp32 bits, fast_pow2, x / s in
        fp32, clamp, cast); 128x128 weight tiles the same formula per tile
  fp4 -> fp8: convert.py's cast_e2m1fn_to_e4m3fn

Prints the cases run and the differing bits per check; exits 1 if any bit
differs.  Usage: quant_check.py PATH/TO/quant_dump [--seed N]
"""
import os
import subprocess
import sys
import tempfile
from fractions import Fraction

import numpy as np

F32 = np.float32
U32 = np.uint32


def popcount(a):
    a = np.ascontiguousarray(a).view(np.uint8)
    return int(np.unpackbits(a).sum())


# ---------------------------------------------------------------- elements --

def torch_e4m3(x):
    """c10 fp8e4m3fn_from_fp32_value, vectorized (non-saturating: >= 480 -> NaN)."""
    x = np.asarray(x, dtype=F32)
    fb = x.view(U32).copy()
    sign = fb & U32(0x80000000)
    fb ^= sign
    out = np.zeros(fb.shape, dtype=np.uint8)
    big = fb >= U32(1087 << 20)
    small = fb < U32(121 << 23)
    denorm = U32(141 << 23)
    with np.errstate(over="ignore", invalid="ignore"):
        f = (fb.view(F32) + denorm.reshape(()).view(F32)).astype(F32)
    out_small = ((f.view(U32) - denorm) & U32(0xff)).astype(np.uint8)
    mant_odd = (fb >> U32(20)) & U32(1)
    norm = (fb + U32(0xc407ffff) + mant_odd) & U32(0xffffffff)
    out_norm = ((norm >> U32(20)) & U32(0xff)).astype(np.uint8)
    out = np.where(small, out_small, out_norm)
    out = np.where(big, np.uint8(0x7f), out)
    return (out | (sign >> U32(24)).astype(np.uint8)).astype(np.uint8)


def e4m3_value(c):
    c = np.asarray(c, dtype=np.uint8)
    e = (c >> 3) & 0xf
    m = (c & 7).astype(np.float64)
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e.astype(np.float64) - 7))
    v = np.where((c & 0x7f) == 0x7f, np.nan, v)
    return np.where(c & 0x80, -v, v)


GRID4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])


def e2m1(x):
    """Nearest E2M1 magnitude, ties to the even code; clamp to 6; NaN -> code of 6."""
    x = np.asarray(x, dtype=np.float64)
    a = np.clip(np.abs(np.nan_to_num(x, nan=6.0)), 0, 6)
    d = np.abs(a[..., None] - GRID4)
    best = np.argmin(d, axis=-1)
    dmin = d.min(axis=-1)
    tie = np.sum(d == dmin[..., None], axis=-1) > 1
    best = np.where(tie & (best % 2 == 1), best + 1, best)  # two nearest: take the even code
    return (best | np.where(np.signbit(x), 8, 0)).astype(np.uint8)


def e2m1_value(c):
    c = np.asarray(c, dtype=np.uint8)
    v = GRID4[c & 7]
    return np.where(c & 8, -v, v)


def torch_bf16(x32):
    b = np.asarray(x32, dtype=F32).view(U32)
    r = ((b + U32(0x7fff) + ((b >> U32(16)) & U32(1))) >> U32(16)).astype(np.uint16)
    return r


def exact_round(v, mbits, emin, maxexp):
    """Fraction-exact RNE of a finite double to a format with mbits mantissa
    bits, smallest normal exponent emin; returns a Fraction (inf as None)."""
    q = Fraction(v)
    if q == 0:
        return q
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2)**e > a:
        e -= 1
    while Fraction(2)**(e + 1) <= a:
        e += 1
    e = max(e, emin)
    step = Fraction(2)**(e - mbits)
    n = a / step
    fl = n.numerator // n.denominator
    rem = n - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    r = fl * step
    if r >= Fraction(2)**(maxexp + 1):
        return None
    return r if q > 0 else -r


# ------------------------------------------------------------------ blocks --

def pow2_ceil_bits(y):
    b = np.asarray(y, dtype=F32).view(U32)
    e = ((b >> U32(23)) & U32(0xff)).astype(np.int64) - 127 + ((b & U32(0x7fffff)) != 0)
    with np.errstate(over="ignore"):
        return np.ldexp(F32(1), e.astype(np.int32)).astype(F32)


def ref_block_quant(x, rows, cols, tr, tc, fmt, pow2):
    """The V4 kernels' act_quant / fp4_act_quant over tr x tc tiles, in fp32."""
    x = np.asarray(x, dtype=F32).reshape(rows, cols)
    mx = F32(448.0) if fmt == "e4m3" else F32(6.0)
    floor = F32(1e-4) if fmt == "e4m3" else F32(6 * 2.0**-126)
    inv = F32(1.0 / float(mx))
    sr, sc = -(-rows // tr), -(-cols // tc)
    codes = np.zeros((rows, cols), np.uint8)
    scales = np.zeros((sr, sc), F32)
    sim = np.zeros((rows, cols), np.float64)
    finite = np.ones((sr, sc), bool)
    for i in range(sr):
        for j in range(sc):
            t = x[i * tr:(i + 1) * tr, j * tc:(j + 1) * tc]
            finite[i, j] = np.all(np.isfinite(t))
            amax = np.maximum(np.max(np.abs(t)), floor).astype(F32)
            y = F32(amax * inv)
            s = pow2_ceil_bits(y) if pow2 else y
            with np.errstate(invalid="ignore", over="ignore"):
                q = np.clip((t / s).astype(F32), -mx, mx)
            c = torch_e4m3(q) if fmt == "e4m3" else e2m1(q)
            codes[i * tr:(i + 1) * tr, j * tc:(j + 1) * tc] = c
            scales[i, j] = s
            val = e4m3_value(c) if fmt == "e4m3" else e2m1_value(c)
            if not finite[i, j]:  # the torch reading's inplace path: q * s, uncast
                val = q
            with np.errstate(invalid="ignore", over="ignore"):
                sim[i * tr:(i + 1) * tr, j * tc:(j + 1) * tc] = (val.astype(F32) * s).astype(F32)
    return codes, scales, sim, finite


def ref_fp4_to_fp8(codes, scales, rows, cols):
    """convert.py cast_e2m1fn_to_e4m3fn (its FP4_TABLE has +0.0 for code 8)."""
    x = (e2m1_value(codes) + 0.0).astype(F32).reshape(rows, cols)
    s = scales.reshape(rows, cols // 32).astype(F32)
    c8 = np.zeros((rows, cols), np.uint8)
    s8 = np.zeros((rows // 128, cols // 128), F32)
    for i in range(rows // 128):
        for j in range(cols // 128):
            sb = s[i * 128:(i + 1) * 128, j * 4:(j + 1) * 4]
            base = F32(sb.max() / F32(64))
            off = (sb / base).astype(F32)
            off = np.repeat(off, 32, axis=1)
            v = (x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] * off).astype(F32)
            c8[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = torch_e4m3(v)
            s8[i, j] = base
    return c8, s8


# ------------------------------------------------------------------ inputs --

def tile_values(rng, n, kind, k):
    """One tile's values (f32-representable)."""
    if kind == "zero":
        return np.zeros(n)
    if kind == "random":
        return rng.standard_normal(n) * 2.0**rng.integers(-30, 30)
    if kind == "amax_pow2":  # amax = 448*2^k (scale exactly 2^k) or 2^k, and neighbours
        v = rng.uniform(-1, 1, n) * 2.0**k
        base = [448 * 2.0**k, 2.0**k, float(np.nextafter(F32(448 * 2.0**k), F32(np.inf))),
                float(np.nextafter(F32(448 * 2.0**k), F32(0))), 6 * 2.0**k, 3 * 2.0**k][rng.integers(0, 6)]
        v = np.clip(v, -abs(base), abs(base))
        v[rng.integers(0, n)] = base
        return v
    if kind == "ties":  # exact halfway points of E4M3 / E2M1 steps, under a scale of 2^k
        codes = rng.integers(0, 0x7e, n)
        lo = e4m3_value(codes.astype(np.uint8))
        hi = e4m3_value((codes + 1).astype(np.uint8))
        g = rng.integers(0, 7, n)
        mid4 = (GRID4[g] + GRID4[g + 1]) / 2
        v = np.where(rng.random(n) < 0.5, (lo + hi) / 2, mid4) * 2.0**k
        v[0] = 448 * 2.0**k
        return v * np.where(rng.random(n) < 0.5, -1, 1)
    if kind == "subnormal":  # tiny values under a large amax
        v = rng.standard_normal(n) * 2.0**(k - 12)
        v[rng.integers(0, n)] = 400 * 2.0**k
        return v
    if kind == "floor":  # amax below the 1e-4 / 6*2^-126 floors
        return rng.standard_normal(n) * 2.0**rng.integers(-140, -16)
    if kind == "nan":
        v = rng.standard_normal(n)
        v[rng.integers(0, n)] = np.nan
        return v
    if kind == "inf":
        v = rng.standard_normal(n)
        v[rng.integers(0, n)] = np.inf * rng.choice([-1, 1])
        return v
    raise ValueError(kind)


KINDS = ["random", "random", "zero", "amax_pow2", "ties", "subnormal", "floor", "nan", "inf"]


def make_input(rng, rows, cols, tr, tc, bf16):
    x = np.zeros((rows, cols))
    for i in range(0, rows, tr):
        for j in range(0, cols, tc):
            t = x[i:i + tr, j:j + tc]
            kind = KINDS[rng.integers(0, len(KINDS))]
            t[...] = tile_values(rng, t.size, kind, int(rng.integers(-20, 20))).reshape(t.shape)
    x = x.astype(F32)
    if bf16:  # the kernels' input dtype
        with np.errstate(over="ignore"):
            x = (torch_bf16(x).astype(U32) << U32(16)).view(F32)
    return x


# ------------------------------------------------------------------ runner --

class Runner:
    def __init__(self, tool, tmp):
        self.tool, self.tmp = tool, tmp
        self.total_cases = 0
        self.total_bits = 0

    def run(self, mode, rows, cols, data):
        fin, fout = os.path.join(self.tmp, "in"), os.path.join(self.tmp, "out")
        with open(fin, "wb") as f:
            f.write(data)
        r = subprocess.run([self.tool, mode, str(rows), str(cols), fin, fout], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"quant_dump {mode} failed: {r.returncode} {r.stderr}")
        with open(fout, "rb") as f:
            return f.read(), r.stderr

    def report(self, name, cases, bits):
        self.total_cases += cases
        self.total_bits += bits
        print(f"{name:44s} cases {cases:9d}  differing bits {bits}")


def check_elements(run, rng):
    n = 200000
    x = np.concatenate([
        rng.standard_normal(n) * np.exp2(rng.integers(-20, 12, n)),
        e4m3_value(np.arange(256, dtype=np.uint8)),
        (e4m3_value(np.arange(0x7e, dtype=np.uint8)) + e4m3_value(np.arange(1, 0x7f, dtype=np.uint8))) / 2,
        np.array([448, 449, 463.99, 464, 464.01, 479, 480, 1e9, np.inf, -np.inf, np.nan, -0.0, 0.0,
                  2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-6, 2.0**-6 - 2.0**-10]),
    ]).astype(F32).astype(np.float64)
    out, _ = run.run("e4m3", 0, 0, x.tobytes())
    got = np.frombuffer(out, np.uint8)
    with np.errstate(invalid="ignore"):
        want = torch_e4m3(np.clip(x, -448, 448).astype(F32))  # satfinite = clamp, then RNE
    run.report("e4m3 element (f32 inputs, satfinite)", x.size, popcount(got ^ want))

    x4 = np.concatenate([rng.standard_normal(n) * 3, (GRID4[:-1] + GRID4[1:]) / 2, -(GRID4[:-1] + GRID4[1:]) / 2,
                         GRID4, -GRID4, [6.5, 7, 100, np.inf, -np.inf, 0.25, 0.2500001, -0.0]])
    out, _ = run.run("e2m1", 0, 0, x4.tobytes())
    got = np.frombuffer(out, np.uint8)
    run.report("e2m1 element (f64 inputs)", x4.size, popcount(got ^ e2m1(x4)))

    xb = np.concatenate([rng.standard_normal(n) * np.exp2(rng.integers(-140, 120, n)),
                         [3.3895313892515355e38, 3.39e38, 3.4e38, 1e-40, -1e-45]]).astype(F32)
    out, _ = run.run("bf16", 0, 0, xb.astype(np.float64).tobytes())
    got = np.frombuffer(out, np.uint16)
    run.report("bf16 element (f32 inputs)", xb.size, popcount(got ^ torch_bf16(xb)))


def check_exact_f64(run, rng):
    """f64 inputs no float32 holds: one rounding, checked with fractions."""
    n = 3000
    x = rng.standard_normal(n) * np.exp2(rng.integers(-12, 9, n))
    want8, want16 = [], []
    for v in x:
        a = min(abs(v), 448.0)
        r = exact_round(a, 3, -6, 8)
        want8.append((0x80 if v < 0 else 0) | int(torch_e4m3(np.array([float(r)], F32))[0] & 0x7f))
        rb = exact_round(v, 7, -126, 127)
        want16.append(int(torch_bf16(np.array([float(rb)], F32))[0]))
    out, _ = run.run("e4m3", 0, 0, x.tobytes())
    bits = popcount(np.frombuffer(out, np.uint8) ^ np.array(want8, np.uint8))
    out, _ = run.run("bf16", 0, 0, x.tobytes())
    bits += popcount(np.frombuffer(out, np.uint16) ^ np.array(want16, np.uint16))
    run.report("e4m3 + bf16 element (f64 inputs, exact)", 2 * n, bits)


BLOCK_MODES = [  # mode, tile rows, tile cols, fmt, pow2 scales, shape
    ("act128", 1, 128, "e4m3", True, (64, 1024)),
    ("kv64", 1, 64, "e4m3", True, (64, 448)),
    ("act128f32", 1, 128, "e4m3", False, (64, 1024)),
    ("w128", 128, 128, "e4m3", True, (384, 320)),
    ("mxfp4", 1, 32, "e2m1", True, (64, 1024)),
]


def check_blocks(run, rng):
    for mode, tr, tc, fmt, pow2, (rows, cols) in BLOCK_MODES:
        for in32 in (False, True):
            x = make_input(rng, rows, cols, tr, tc, bf16=not in32)
            data = x.tobytes() if in32 else x.astype(np.float64).tobytes()
            out, _ = run.run(mode + ("_in32" if in32 else ""), rows, cols, data)
            n = rows * cols
            codes = np.frombuffer(out[:n], np.uint8).reshape(rows, cols)
            ns = (-(-rows // tr)) * (-(-cols // tc))
            scales = np.frombuffer(out[n:n + 4 * ns], F32).reshape(-(-rows // tr), -(-cols // tc))
            sim = np.frombuffer(out[n + 4 * ns:], np.float64).reshape(rows, cols)
            rc, rs, rsim, finite = ref_block_quant(x, rows, cols, tr, tc, fmt, pow2)
            # tiles holding NaN/inf: the GPU kernels leave this to min/max NaN
            # rules; parity gives the tile a NaN scale, so every simulated value
            # is NaN, as the torch reading (q * inf or NaN) gives: compare that.
            fmask = np.repeat(np.repeat(finite, tr, 0), tc, 1)[:rows, :cols]
            bits = popcount((codes ^ rc)[fmask]) + popcount((scales.view(U32) ^ rs.view(U32))[finite])
            simbits = popcount((sim.view(np.uint64) ^ rsim.view(np.uint64))[fmask])
            nan_ok = np.all(np.isnan(sim[~fmask])) and np.all(np.isnan(rsim[~fmask]))
            bits += simbits + (0 if nan_ok else 1)
            tiles = int(finite.size)
            run.report(f"{mode}{' f32 in' if in32 else ' bf16 in'} ({tiles} tiles, {int((~finite).sum())} non-finite)",
                       3 * n + tiles, bits)


def check_fp4_to_fp8(run, rng):
    rows, cols = 256, 512
    codes = rng.integers(0, 16, rows * cols).astype(np.uint8)
    e = rng.integers(-8, 8, rows * cols // 32)
    e[:64] = rng.integers(-20, 0, 64)  # a few blocks with a wide scale range (lossy)
    scales = np.ldexp(F32(1), e.astype(np.int32)).astype(F32)
    out, err = run.run("fp4to8", rows, cols, codes.tobytes() + scales.tobytes())
    n = rows * cols
    c8 = np.frombuffer(out[:n], np.uint8)
    s8 = np.frombuffer(out[n:], F32)
    rc8, rs8 = ref_fp4_to_fp8(codes, scales, rows, cols)
    bits = popcount(c8 ^ rc8.reshape(-1)) + popcount(s8.view(U32) ^ rs8.reshape(-1).view(U32))
    run.report(f"fp4 -> fp8 (convert.py; {err.strip()})", n + s8.size, bits)


def main():
    tool = sys.argv[1]
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 20261203
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        run = Runner(tool, tmp)
        check_elements(run, rng)
        check_exact_f64(run, rng)
        check_blocks(run, rng)
        check_fp4_to_fp8(run, rng)
    print(f"total: cases {run.total_cases}, differing bits {run.total_bits}")
    return 1 if run.total_bits else 0


if __name__ == "__main__":
    sys.exit(main())
