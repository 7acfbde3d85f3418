#!/usr/bin/env python3
"""A second check of parity's casts (src/core/quant.c through tests/core/quant_dump),
this time against a line-by-line reading of DeepSeek's V4 inference code in PyTorch
(docs/precisions.md "Sources": T = inference/kernel.py and convert.py of the V4-Flash
release, C10 = PyTorch's c10 Float8_e4m3fn.h).

PyTorch 1.13 (Debian's python3-torch) has bfloat16 but no float8 or float4 dtypes, so:

  bf16      the real thing: torch's own `.to(torch.bfloat16)` (c10's
            round_to_nearest_even), read back with `.view(torch.int16)`
  e4m3      c10 fp8e4m3fn_from_fp32_value (what `.to(torch.float8_e4m3fn)` runs),
            written statement by statement in torch int64 ops on the fp32 bits
  e2m1      the GPU's fp32 -> e2m1 conversion (round to nearest even, satfinite),
            written as the seven decision thresholds of the E2M1 grid
  act_quant_kernel / fp4_quant_kernel (T): every statement in torch float32 ops
            (reduce_absmax, T.max with the floor, fast_log2_ceil / fast_pow2 on the
            int32 bits, x / s, clamp, cast; inplace: fl32(cast) * s)
  cast_e2m1fn_to_e4m3fn (convert.py): its torch statements as written, with the
            e4m3 cast above in place of `.to(torch.float8_e4m3fn)`

The inputs are quant_check.py's (the same tile kinds: random, zero, amax at powers of
two, E4M3 / E2M1 ties, subnormal codes, the amax floors, NaN, inf); its numpy reading is
not used.  NaN policy: torch writes 0x7fc0 for every NaN bf16, parity keeps the sign;
those inputs are counted apart (docs/precisions.md).  Tiles holding a NaN or an inf are
compared by their simulated values (all NaN on both sides), as in quant_check.py.

Prints cases and differing bits per check; exits 1 if any bit differs.
Usage: /usr/bin/python3 quant_check_torch.py PATH/TO/quant_dump [--seed N]
"""
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant_check import BLOCK_MODES, Runner, make_input  # noqa: E402  (inputs and the runner only)

F32 = torch.float32


def bits_of(x):
    """fp32 tensor -> its bits as non-negative int64."""
    return x.to(F32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def from_bits(b):
    b = b & 0xFFFFFFFF
    return torch.where(b >= 2**31, b - 2**32, b).to(torch.int32).view(F32)


def popcount(t):
    a = t.contiguous().numpy().view(np.uint8)
    return int(np.unpackbits(a).sum())


# ---------------------------------------------------------------- c10 e4m3 --

def c10_fp8e4m3fn_from_fp32(f):
    fp8_max = 1087 << 20
    denorm_mask = 141 << 23
    f_bits = bits_of(f)
    sign = f_bits & 0x80000000
    f_bits = f_bits ^ sign
    # f_bits < 121 << 23: f = fp32_from_bits(f_bits) + fp32_from_bits(denorm_mask)
    small_f = from_bits(f_bits) + from_bits(torch.full_like(f_bits, denorm_mask))
    small = (bits_of(small_f) - denorm_mask) & 0xFF
    # normal: mant_odd = (f_bits >> 20) & 1; f_bits += ((7 - 127) << 23) + 0x7FFFF; f_bits += mant_odd
    mant_odd = (f_bits >> 20) & 1
    nb = (f_bits + (((7 - 127) << 23) & 0xFFFFFFFF) + 0x7FFFF) & 0xFFFFFFFF
    nb = (nb + mant_odd) & 0xFFFFFFFF
    normal = (nb >> 20) & 0xFF
    result = torch.where(f_bits < (121 << 23), small, normal)
    result = torch.where(f_bits >= fp8_max, torch.full_like(result, 0x7F), result)
    return (result | (sign >> 24)).to(torch.uint8)


def e4m3_to_f32(c):
    c = c.to(torch.int64)
    e = (c >> 3) & 0xF
    m = (c & 7).to(torch.float64)
    v = torch.where(e == 0, m * 2.0**-9, (1 + m / 8) * torch.pow(2.0, (e - 7).to(torch.float64)))
    v = torch.where((c & 0x7F) == 0x7F, torch.full_like(v, float("nan")), v)
    return torch.where((c & 0x80) != 0, -v, v).to(F32)


# -------------------------------------------------------------- GPU e2m1 --

FP4_TABLE = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                          0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=F32)  # convert.py


def cvt_rn_satfinite_e2m1(x):
    """fp32 -> E2M1 code, nearest, ties to the even code: the decision thresholds
    are the grid's midpoints, taken (>=) where the upper neighbour is even."""
    a = x.abs()
    code = ((a > 0.25).to(torch.int64) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
            + (a > 2.5) + (a >= 3.5) + (a > 5.0))
    neg = bits_of(x) >= 2**31
    return (code + torch.where(neg, 8, 0)).to(torch.uint8)


# -------------------------------------------------------------- kernel.py --

def fast_log2_ceil(x):
    bits_x = bits_of(x)
    exp_x = (bits_x >> 23) & 0xFF
    man_bits = bits_x & ((1 << 23) - 1)
    return exp_x - 127 + (man_bits != 0).to(torch.int64)


def fast_pow2(x):
    return from_bits((x + 127) << 23)


def fast_round_scale(amax, max_inv):
    return fast_pow2(fast_log2_ceil(amax * max_inv))


def quant_kernel(x, tr, tc, fmt, round_scale):
    """act_quant_kernel (fmt e4m3) / fp4_quant_kernel (e2m1) on tr x tc tiles, inplace
    and not: returns codes, scales, the inplace values fl32(cast) * s."""
    rows, cols = x.shape
    qmax = 448.0 if fmt == "e4m3" else 6.0
    floor = torch.tensor(1e-4 if fmt == "e4m3" else 6 * 2.0**-126, dtype=F32)  # T.max(amax, literal) in fp32
    max_inv = torch.tensor(1 / qmax, dtype=F32)  # fp8_max_inv = 1 / fp8_max, a python float, fp32 in the kernel
    pr, pc = -(-rows // tr) * tr, -(-cols // tc) * tc
    xp = torch.zeros(pr, pc, dtype=F32)
    xp[:rows, :cols] = x
    t = xp.view(pr // tr, tr, pc // tc, tc).transpose(1, 2)
    amax_local = t.abs().amax(dim=(-1, -2))  # T.reduce_absmax (zero padding cannot raise it)
    nonfinite = ~torch.isfinite(t).all(dim=-1).all(dim=-1)
    amax_local = torch.maximum(amax_local, floor)
    if round_scale:
        s_local = fast_round_scale(amax_local, max_inv)
    else:
        s_local = amax_local * max_inv
    y = torch.clamp(t / s_local[..., None, None], -qmax, qmax)
    codes = c10_fp8e4m3fn_from_fp32(y) if fmt == "e4m3" else cvt_rn_satfinite_e2m1(y)
    # the inplace path's T.Cast(FP32, T.Cast(FP4, .)): the hardware decode keeps -0.0
    val = e4m3_to_f32(codes) if fmt == "e4m3" else torch.where(codes >= 8, -1.0, 1.0) * FP4_TABLE[codes.long() & 7]
    sim = val.to(F32) * s_local[..., None, None]
    unt = lambda v: v.transpose(1, 2).reshape(pr, pc)[:rows, :cols]  # noqa: E731
    return unt(codes), s_local, unt(sim), nonfinite


# -------------------------------------------------------------- convert.py --

def cast_e2m1fn_to_e4m3fn(codes, scale, out_dim, in_dim):
    x = FP4_TABLE[codes.long()].view(out_dim, in_dim)  # the stack/flatten of low, high nibbles unpacked
    bOut, bIn = out_dim // 128, in_dim // 128
    x = x.view(bOut, 128, bIn, 128).transpose(1, 2)
    scale = scale.float().view(bOut, 128, bIn, -1).transpose(1, 2).flatten(2)
    scale_max_offset_bits = scale.amax(dim=-1, keepdim=True) / (2**6)
    offset = scale / scale_max_offset_bits
    offset = offset.unflatten(-1, (128, -1)).repeat_interleave(32, dim=-1)
    x = (x * offset).transpose(1, 2).reshape(out_dim, in_dim)
    return c10_fp8e4m3fn_from_fp32(x), scale_max_offset_bits.squeeze(-1)


# ------------------------------------------------------------------ checks --

def check_elements(run, rng):
    n = 200000
    x = np.concatenate([rng.standard_normal(n) * np.exp2(rng.integers(-20, 12, n)),
                        e4m3_to_f32(torch.arange(256)).double().numpy(),
                        [448, 449, 463.99, 464, 479, 480, 1e9, np.inf, -np.inf, -0.0, 0.0, 2.0**-10,
                         3 * 2.0**-11, 2.0**-6 - 2.0**-10]]).astype(np.float32).astype(np.float64)
    mids = (e4m3_to_f32(torch.arange(0x7E)).double() + e4m3_to_f32(torch.arange(1, 0x7F)).double()) / 2
    x = np.concatenate([x, mids.numpy(), -mids.numpy()])
    out, _ = run.run("e4m3", 0, 0, x.tobytes())
    got = torch.from_numpy(np.frombuffer(out, np.uint8).copy())
    want = c10_fp8e4m3fn_from_fp32(torch.clamp(torch.from_numpy(x).to(F32), -448.0, 448.0))  # the kernels' clamp
    run.report("torch: e4m3 element (c10, after clamp)", x.size, popcount(got ^ want))

    x4 = np.concatenate([rng.standard_normal(n) * 3, np.arange(-14, 15) / 4.0, [6.5, 100, np.inf, -np.inf, -0.0]])
    out, _ = run.run("e2m1", 0, 0, x4.tobytes())
    got = torch.from_numpy(np.frombuffer(out, np.uint8).copy())
    want = cvt_rn_satfinite_e2m1(torch.clamp(torch.from_numpy(x4).to(F32), -6.0, 6.0))
    run.report("torch: e2m1 element (rn satfinite)", x4.size, popcount(got ^ want))

    xb = np.concatenate([rng.standard_normal(n) * np.exp2(rng.integers(-140, 120, n)),
                         [3.3895313892515355e38, 3.39e38, 3.4e38, 1e-40, -1e-45, np.inf, -np.inf]]).astype(np.float32)
    xn = np.array([np.nan, -np.nan], np.float32)
    out, _ = run.run("bf16", 0, 0, np.concatenate([xb, xn]).astype(np.float64).tobytes())
    got = torch.from_numpy(np.frombuffer(out, np.uint16).copy().view(np.int16))
    want = torch.from_numpy(xb).to(torch.bfloat16).view(torch.int16)
    run.report("torch: bf16 element (torch .to(bfloat16))", xb.size, popcount(got[:xb.size] ^ want))
    wn = torch.from_numpy(xn).to(torch.bfloat16).view(torch.int16)
    print(f"   NaN policy: parity {[hex(v & 0xffff) for v in got[xb.size:].tolist()]}, "
          f"torch {[hex(v & 0xffff) for v in wn.tolist()]} (documented, not counted)")


def check_blocks(run, rng):
    for mode, tr, tc, fmt, pow2, (rows, cols) in BLOCK_MODES:
        for in32 in (False, True):
            x = make_input(rng, rows, cols, tr, tc, bf16=not in32)
            data = x.tobytes() if in32 else x.astype(np.float64).tobytes()
            out, _ = run.run(mode + ("_in32" if in32 else ""), rows, cols, data)
            n = rows * cols
            sr, sc = -(-rows // tr), -(-cols // tc)
            codes = torch.from_numpy(np.frombuffer(out[:n], np.uint8).reshape(rows, cols).copy())
            scales = torch.from_numpy(np.frombuffer(out[n:n + 4 * sr * sc], np.float32).reshape(sr, sc).copy())
            sim = torch.from_numpy(np.frombuffer(out[n + 4 * sr * sc:], np.float64).reshape(rows, cols).copy())
            xt = torch.from_numpy(x.astype(np.float32))
            if not in32:
                xt = xt.to(torch.bfloat16).to(F32)  # X: T.Tensor[..., in_dtype = BF16]
            rc, rs, rsim, nonfin = quant_kernel(xt, tr, tc, fmt, pow2)
            fm = (~nonfin).repeat_interleave(tr, 0).repeat_interleave(tc, 1)[:rows, :cols]
            bits = popcount((codes ^ rc)[fm]) + popcount((bits_of(scales) ^ bits_of(rs))[~nonfin])
            bits += popcount((sim.view(torch.int64) ^ rsim.double().view(torch.int64))[fm])
            # tiles with a NaN / inf: parity gives them a NaN scale (every value NaN); the
            # kernel's result there (inf scale from fast_pow2, NaN rules of max/clamp) is
            # not modelled (docs/precisions.md): counted apart, not compared
            bits += 0 if bool(torch.isnan(sim[~fm]).all()) else 1
            run.report(f"torch: {mode}{' f32 in' if in32 else ' bf16 in'} ({sr * sc} tiles, "
                       f"{int(nonfin.sum())} non-finite)", 3 * n + sr * sc, bits)


def check_fp4_to_fp8(run, rng):
    rows, cols = 256, 512
    codes = rng.integers(0, 16, rows * cols).astype(np.uint8)
    e = rng.integers(-8, 8, rows * cols // 32)
    e[:64] = rng.integers(-20, 0, 64)
    scales = np.ldexp(np.float32(1), e.astype(np.int32)).astype(np.float32)
    out, err = run.run("fp4to8", rows, cols, codes.tobytes() + scales.tobytes())
    n = rows * cols
    c8 = torch.from_numpy(np.frombuffer(out[:n], np.uint8).copy())
    s8 = torch.from_numpy(np.frombuffer(out[n:], np.float32).copy())
    rc8, rs8 = cast_e2m1fn_to_e4m3fn(torch.from_numpy(codes), torch.from_numpy(scales).view(rows, cols // 32),
                                     rows, cols)
    bits = popcount(c8 ^ rc8.reshape(-1)) + popcount(bits_of(s8) ^ bits_of(rs8.reshape(-1)))
    print(f"   zero codes: parity {int((c8 == 0).sum())} x 0x00, {int((c8 == 0x80).sum())} x 0x80")
    run.report(f"torch: fp4 -> fp8 (convert.py; {err.strip()})", n + s8.numel(), bits)


def main():
    tool = sys.argv[1]
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 20261203
    rng = np.random.default_rng(seed)
    print(f"torch {torch.__version__}, float8 dtypes: {hasattr(torch, 'float8_e4m3fn')}")
    with tempfile.TemporaryDirectory() as tmp:
        run = Runner(tool, tmp)
        check_elements(run, rng)
        check_blocks(run, rng)
        check_fp4_to_fp8(run, rng)
    print(f"total: cases {run.total_cases}, differing bits {run.total_bits}")
    return 1 if run.total_bits else 0


if __name__ == "__main__":
    sys.exit(main())
