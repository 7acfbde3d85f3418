"""Hugging Face-style DeepSeek-V4 checkpoint directories, as `parity export hf`
writes them and `parity import hf` reads them (numpy only).

    cfg, params, opt = load("out/hf")          # parity names, numpy arrays (bf16 widened to f32,
                                               # FP8 / FP4 storage dequantized exactly to f64)
    save("out/hf-after", cfg, params, dtype="fp32", opt=opt)
"""
import json
import os

import numpy as np

from . import names
from . import safetensors as st

INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
OPTIM = "parity_optimizer.safetensors"


def load(path, keep_bf16=False):
    """(config dict with parity names, {parity name: array}, {opt name: array}).
    tid2eid comes back as int32 (parity's dtype)."""
    with open(os.path.join(path, CONFIG)) as f:
        cfg = names.parity_config(json.load(f))
    index = os.path.join(path, INDEX)
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
    else:
        wmap, files = None, ["model.safetensors"]
    params, quant, scales = {}, {}, {}
    for fn in files:
        tensors, _ = st.read(os.path.join(path, fn), bf16="raw" if keep_bf16 else "f32")
        for hf, a in tensors.items():
            if wmap is not None and wmap.get(hf) != fn:
                raise ValueError(f"{path}/{fn}: {hf!r} is not listed for this file in {INDEX}")
            n, kind = names.parity_name(hf)
            if kind == names.SKIP:
                continue
            if kind == names.SCALE:
                scales[n[:-len(".scale")] + ".weight"] = a
                continue
            if n in params or n in quant:
                raise ValueError(f"{path}: {hf!r} (as {n!r}) appears twice")
            if isinstance(a, st.F8E4M3) or a.dtype in (np.int8, np.uint8):
                quant[n] = a
                continue
            params[n] = a.astype(np.int32) if n.endswith("tid2eid") else a
    for n in sorted(set(quant) | set(scales)):
        if n not in quant or n not in scales:
            raise ValueError(f"{path}: {n!r} " + ("is quantized but has no .scale" if n in quant else
                             "has a .scale tensor but " + ("is stored unquantized" if n in params else "no weight")))
        params[n] = dequantize(n, quant[n], scales[n])
    opt = {}
    if os.path.exists(os.path.join(path, OPTIM)):
        opt, _ = st.read(os.path.join(path, OPTIM))
    return cfg, params, opt


def _e4m3_table():
    c = np.arange(256)
    e, m = (c >> 3) & 15, (c & 7).astype(np.float64)
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7.0))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return np.where(c & 0x80, -v, v)


E4M3 = _e4m3_table()
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6])


def dequantize(name, codes, scale):
    """The release's storage of one weight -> its values (float64, exact):
    F8_E4M3 [out, in] with 128x128 scales, or packed FP4 (int8 [out, in/2],
    element 2j in the low nibble) with 1x32 scales; scales F8_E8M0 or F32
    (docs/precisions.md).  ValueError naming the tensor for shapes that do
    not fit and NaN / non-positive scales."""
    s = np.exp2(scale.view(np.uint8).astype(np.float64) - 127) if isinstance(scale, st.F8E8M0) else \
        np.asarray(scale, dtype=np.float64)
    if isinstance(scale, st.F8E8M0):
        s[scale.view(np.uint8) == 0xFF] = np.nan
    if not np.all(s > 0) or not np.all(np.isfinite(s)):
        raise ValueError(f"{name}: its scale holds a NaN, infinite or non-positive value")
    u = np.asarray(codes).view(np.uint8)
    if isinstance(codes, st.F8E4M3):
        v = E4M3[u]
        tr = tc = 128
    else:
        v = np.stack([E2M1[u & 15], E2M1[u >> 4]], axis=-1).reshape(u.shape[0], -1)
        tr, tc = 1, 32
    if np.isnan(v).any():
        raise ValueError(f"{name}: an E4M3 NaN code")
    want = (-(-v.shape[0] // tr), -(-v.shape[1] // tc))
    if s.shape != want:
        raise ValueError(f"{name}: scale of shape {list(s.shape)}; [{v.shape[0]},{v.shape[1]}] needs {list(want)}")
    full = np.repeat(np.repeat(s, tr, axis=0), tc, axis=1)[:v.shape[0], :v.shape[1]]
    return v * full


def _cast(name, a, dtype):
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        return a.astype(np.int64)                      # tid2eid: int64 as in the release
    if dtype == "fp64":
        return a.astype(np.float64)
    if dtype == "fp32" or names.release_store(name, a.ndim) == "F32":
        return a.astype(np.float32)
    return st.f32_to_bf16(a)


def save(path, cfg, params, dtype="fp32", opt=None, max_shard_bytes=4 << 30):
    """Writes an export directory (config.json, index, shards; opt aside) in the
    same layout as `parity export hf`.  dtype: "bf16" (the release's split),
    "fp32" or "fp64".  path must not exist yet."""
    os.makedirs(path)
    tdt = {"bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}[dtype]
    conv = {n: _cast(n, a, dtype) for n, a in params.items()}
    shards, cur, size = [[]], 0, 0
    for n in params:  # the caller's order (a golden set's table order)
        b = conv[n].nbytes
        if max_shard_bytes and cur and cur + b > max_shard_bytes:
            shards.append([])
            cur = 0
        shards[-1].append(n)
        cur += b
        size += b
    wmap = {}
    for k, group in enumerate(shards):
        fn = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        st.write(os.path.join(path, fn), {n: conv[n] for n in group}, {"format": "pt"})
        wmap.update({n: fn for n in group})
    with open(os.path.join(path, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": wmap}, f, indent=1)
    with open(os.path.join(path, CONFIG), "w") as f:
        json.dump(names.hf_config(cfg, tdt), f, indent=1)
    if opt:
        odt = np.float64 if dtype == "fp64" else np.float32
        st.write(os.path.join(path, OPTIM), {n: np.asarray(a, dtype=odt) for n, a in opt.items()})
