#!/usr/bin/env python3
"""parity_torch's recipe casts (python/parity_torch/recipe.py, written from docs/recipes.md and
docs/precisions.md) against parity's C casts (src/core/quant.c through tests/core/quant_dump),
bit for bit, on the hard inputs of quant_check.py (ties, subnormals, saturation, all-zero
tiles, amax at powers of two, the scale floors, NaN / inf tiles) and on raw float64 values
(the recipes cast f64 master weights: one rounding from the exact value).

Compared: the element casts' values (BF16, E4M3, E2M1) and the tile simulations a recipe
applies (quantize + dequantize): act_quant 1x128 with UE8M0 (v4's x) and fp32 (fp8's x)
scales, 128x128 weight tiles with UE8M0 (v4) and fp32 (fp8) scales, MXFP4 1x32 (v4's
experts and the indexer).  Prints cases and differing bits; exits 1 if any bit differs.
Usage: /usr/bin/python3 recipe_cast_check.py PATH/TO/quant_dump [--seed N]
"""
import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import quant_check as qc  # noqa: E402  (inputs, the quant_dump runner, code decoding)
from parity_torch import recipe  # noqa: E402

SIM_MODES = [  # quant_dump mode, tile, fmt, UE8M0 scales, shape, the recipe that uses it
    ("act128", (1, 128), "e4m3", True, (64, 1024), "v4 x"),
    ("act128f32", (1, 128), "e4m3", False, (64, 1024), "fp8 x"),
    ("w128", (128, 128), "e4m3", True, (384, 320), "v4 W"),
    ("w128f32", (128, 128), "e4m3", False, (384, 320), "fp8 W"),
    ("mxfp4", (1, 32), "e2m1", True, (64, 1024), "v4 expert W, indexer q/k"),
]


def bits64(a):
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def diff_bits(a, b):
    return int(qc.popcount(bits64(a) ^ bits64(b)))


def f64_inputs(rng, n):
    """Raw float64 values (not float32-representable) across the formats' ranges."""
    return rng.standard_normal(n) * np.exp2(rng.integers(-30, 12, n)) * (1 + rng.standard_normal(n) * 2.0**-30)


def check_elements(run, rng):
    n = 100000
    mids4 = (qc.e4m3_value(np.arange(0x7e, dtype=np.uint8)) + qc.e4m3_value(np.arange(1, 0x7f, dtype=np.uint8))) / 2
    x = np.concatenate([f64_inputs(rng, n), mids4, -mids4, np.nextafter(mids4, 0), np.nextafter(mids4, 1e9),
                        [448, 449, 463.99, 464, 479, 480, 1e9, np.inf, -np.inf, -0.0, 0.0, 2.0**-10, 3 * 2.0**-11]])
    out, _ = run.run("e4m3", 0, 0, x.tobytes())
    want = qc.e4m3_value(np.frombuffer(out, np.uint8))
    got = recipe.e4m3(torch.from_numpy(x)).numpy()
    run.report("recipe e4m3 element, f64 in", x.size, diff_bits(got, want))

    g4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
    m2 = (g4[:-1] + g4[1:]) / 2
    x4 = np.concatenate([rng.standard_normal(n) * 3 * (1 + rng.standard_normal(n) * 2.0**-30), m2, -m2,
                         np.nextafter(m2, 0), np.nextafter(m2, 9), [6.5, 100, np.inf, -np.inf, -0.0, 0.0]])
    out, _ = run.run("e2m1", 0, 0, x4.tobytes())
    want = qc.e2m1_value(np.frombuffer(out, np.uint8))
    got = recipe.e2m1(torch.from_numpy(x4)).numpy()
    run.report("recipe e2m1 element, f64 in", x4.size, diff_bits(got, want))

    xb = np.concatenate([rng.standard_normal(n) * np.exp2(rng.integers(-140, 120, n)), f64_inputs(rng, n)])

    grid = (np.arange(0x7f00, dtype=np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    ties = (grid[1:] + grid[:-1]) / 2                       # exact f64 midpoints of the BF16 grid
    xb = np.concatenate([xb, ties[::7], -ties[::11], np.nextafter(ties[::13], 0), np.nextafter(ties[::13], np.inf),
                         [3.3895313892515355e38, 3.39e38, 3.4e38, 1e-40, -1e-45, np.inf, -np.inf]])
    out, _ = run.run("bf16", 0, 0, xb.tobytes())
    want = (np.frombuffer(out, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    got = recipe.bf16(torch.from_numpy(xb)).numpy()
    run.report("recipe bf16 element, f64 in (once, from the exact value)", xb.size, diff_bits(got, want))


def check_sims(run, rng):
    for mode, tile, fmt, ue, (rows, cols), use in SIM_MODES:
        for kind in ("bf16", "f64"):
            x = qc.make_input(rng, rows, cols, tile[0], tile[1], bf16=True).astype(np.float64)
            if kind == "f64":  # the master weights: values between the f32 grid points
                x = x * (1 + rng.standard_normal(x.shape) * 2.0**-35)
            out, _ = run.run(mode, rows, cols, x.tobytes())
            n = rows * cols
            ns = -(-rows // tile[0]) * -(-cols // tile[1])
            want = np.frombuffer(out[n + 4 * ns:], np.float64).reshape(rows, cols)
            got = recipe.quant_sim(torch.from_numpy(x), tile, fmt, ue).numpy()
            fin = np.isfinite(want)
            bits = diff_bits(got[fin], want[fin]) + int(np.count_nonzero(np.isfinite(got[~fin])))
            run.report(f"recipe {mode} ({use}), {kind} in", n, bits)


def main():
    tool = sys.argv[1]
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 20261204
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        run = qc.Runner(tool, tmp)
        check_elements(run, rng)
        check_sims(run, rng)
    print(f"total: cases {run.total_cases}, differing bits {run.total_bits}")
    return 1 if run.total_bits else 0


if __name__ == "__main__":
    sys.exit(main())
