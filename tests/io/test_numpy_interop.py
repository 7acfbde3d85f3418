#!/usr/bin/python3
"""numpy <-> parity interop: numpy writes safetensors by hand (no safetensors
package), `parity compare` judges them (exit 0 equal / 1 mismatch / 2 bad
input), and files written by parity's writer are read back by numpy.

usage: test_numpy_interop.py PARITY_EXE ST_ROUNDTRIP_EXE
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

DT = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "BF16": np.dtype("<u2"),
      "I32": np.dtype("<i4"), "I64": np.dtype("<i8")}


def write_st(path, tensors, meta=None):
    """tensors: {name: (dtype name, ndarray)}; bf16 as uint16 bit patterns."""
    header, blobs, off = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr, dtype=DT[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header not padded to 8"
    hdr = json.loads(raw[8:8 + n].decode())
    meta = hdr.pop("__metadata__", {})
    data = raw[8 + n:]
    out, end = {}, 0
    for name in sorted(hdr):
        e = hdr[name]
        b, e2 = e["data_offsets"]
        assert b == end, f"{name}: not packed in name order ({b} != {end})"
        end = e2
        out[name] = (e["dtype"], np.frombuffer(data[b:e2], dtype=DT[e["dtype"]]).reshape(e["shape"]))
    assert end == len(data), "trailing bytes"
    return out, meta


def bf16(x):
    """float32 -> bf16 bits, round to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def sample():
    rng = np.random.default_rng(1234)
    return {
        "layers.0.attn.wq_a.weight": ("F64", rng.standard_normal((6, 4))),
        "layers.1.ffn.experts.2.w1.weight": ("F32", rng.standard_normal((3, 5)).astype(np.float32)),
        "hc_head_scale": ("BF16", bf16(rng.standard_normal((1,)))),
        "input.tokens": ("I32", rng.integers(0, 100, (2, 8)).astype(np.int32)),
        "router.layers.0.load": ("I64", rng.integers(0, 1 << 40, (4,))),
        "out.loss": ("F64", np.array(2.75)),
        "empty": ("F32", np.zeros((0, 3), np.float32)),
    }


failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def main():
    parity, roundtrip = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="parity-np-") as d:
        a, b = os.path.join(d, "a.safetensors"), os.path.join(d, "b.safetensors")
        t = sample()
        write_st(a, t, {"source": "numpy"})
        # the same values written in another order: equal
        write_st(b, dict(reversed(list(t.items()))))
        rc, out, err = run([parity, "compare", a, b])
        check(rc == 0 and "EQUAL" in out, f"equal files -> exit 0 (rc {rc}) {err.strip()}")

        # inside f64 tolerance
        t2 = dict(t)
        w = t["layers.0.attn.wq_a.weight"][1].copy()
        w[2, 1] *= 1 + 1e-13
        t2["layers.0.attn.wq_a.weight"] = ("F64", w)
        write_st(b, t2)
        rc, out, _ = run([parity, "compare", a, b])
        check(rc == 0, f"1e-13 relative change -> exit 0 (rc {rc})")

        # outside: 1e-6 relative at [2,1]
        w[2, 1] = t["layers.0.attn.wq_a.weight"][1][2, 1] * (1 + 1e-6)
        write_st(b, t2)
        rep = os.path.join(d, "r.json")
        rc, out, _ = run([parity, "compare", a, b, "--json", rep])
        check(rc == 1, f"1e-6 relative change -> exit 1 (rc {rc})")
        check("FAIL a.safetensors layers.0.attn.wq_a.weight" in out and "layer 0" in out,
              "report names the tensor and its layer:\n" + out)
        r = json.load(open(rep))
        bad = [x for x in r["tensors"] if not x["pass"]]
        check(r["pass"] is False and len(bad) == 1 and bad[0]["mismatches"][0]["coord"] == [2, 1],
              "JSON report: one failing tensor, mismatch at [2,1]")
        rc, _, _ = run([parity, "compare", a, b, "--policy", "f32"])
        check(rc == 0, f"same change under --policy f32 -> exit 0 (rc {rc})")

        # integer change, NaN against a number
        t3 = dict(t)
        tok = t["input.tokens"][1].copy()
        tok[1, 7] += 1
        t3["input.tokens"] = ("I32", tok)
        write_st(b, t3)
        rc, out, _ = run([parity, "compare", a, b, "--policy", "bf16"])
        check(rc == 1 and "integers differ at 1 of 16" in out and f"A={tok[1, 7] - 1} B={tok[1, 7]}" in out,
              f"integer change -> exit 1 even under bf16 (rc {rc})")
        t4 = dict(t)
        f = t["layers.1.ffn.experts.2.w1.weight"][1].copy()
        f[0, 0] = np.nan
        t4["layers.1.ffn.experts.2.w1.weight"] = ("F32", f)
        write_st(b, t4)
        rc, out, _ = run([parity, "compare", a, b])
        check(rc == 1 and "NaN/Inf differ" in out and "expert 2" in out, f"NaN -> exit 1 (rc {rc})")

        # bad usage / unreadable input -> 2
        rc, _, _ = run([parity, "compare", a, os.path.join(d, "missing.safetensors")])
        check(rc == 2, f"missing file -> exit 2 (rc {rc})")
        rc, _, _ = run([parity, "compare", a, b, "--policy", "fp8"])
        check(rc == 2, f"bad policy -> exit 2 (rc {rc})")
        rc, _, _ = run([parity, "compare", a])
        check(rc == 2, f"one path -> exit 2 (rc {rc})")
        with open(b, "wb") as fh:
            fh.write(open(a, "rb").read()[:-3])
        rc, _, err = run([parity, "compare", a, b])
        check(rc == 2 and "b.safetensors" in err, f"truncated file -> exit 2 naming it (rc {rc}) {err.strip()}")
        rc, out, _ = run([parity, "compare", "--help"])
        check(rc == 0 and "usage" in out, "--help -> exit 0")

        # parity's writer, read back by numpy
        c = os.path.join(d, "c.safetensors")
        rc, _, err = run([roundtrip, a, c])
        check(rc == 0, f"parity read+write (rc {rc}) {err.strip()}")
        back, meta = read_st(c)
        check(meta == {"source": "numpy"}, f"metadata kept: {meta}")
        check(sorted(back) == sorted(t), "same tensor names")
        for name, (dt, arr) in t.items():
            bdt, barr = back[name]
            check(bdt == dt and barr.shape == arr.shape and
                  barr.tobytes() == np.ascontiguousarray(arr, DT[dt]).tobytes(),
                  f"{name}: {dt} {list(arr.shape)} bit-identical after the parity round trip")
        rc, _, _ = run([parity, "compare", a, c, "--policy", "bitwise"])
        check(rc == 0, f"numpy file vs parity rewrite: bitwise equal (rc {rc})")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all numpy interop checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
