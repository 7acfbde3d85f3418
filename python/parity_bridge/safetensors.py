"""safetensors files with numpy only (the subset parity reads and writes).

Layout (docs/formats.md): u64 little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the data section.  Dtypes F64 F32 BF16 I32 I64 (and F16, U8, I8, BOOL on
read; F8_E4M3 and F8_E8M0, the release's quantized storage, as uint8 codes in
the marker views :class:`F8E4M3` / :class:`F8E8M0`, read and written).  BF16 has no numpy dtype: it is read as uint16 bit patterns and
widened with :func:`bf16_to_f32` (exact), written from float32/float64 with
:func:`f32_to_bf16` (round to nearest even).
"""
import json
import os
import struct
import tempfile

import numpy as np

DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
    "F8_E4M3": np.dtype("u1"), "F8_E8M0": np.dtype("u1"),
}
NAMES = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<i8"): "I64",
         np.dtype("<i4"): "I32", np.dtype("<f2"): "F16", np.dtype("u1"): "U8",
         np.dtype("i1"): "I8", np.dtype("?"): "BOOL"}


class BF16(np.ndarray):
    """Marker view: a uint16 array holding bfloat16 bit patterns (write as BF16)."""


class F8E4M3(np.ndarray):
    """Marker view: uint8 float8_e4m3fn codes (write as F8_E4M3)."""


class F8E8M0(np.ndarray):
    """Marker view: uint8 float8_e8m0fnu codes, 2^(b - 127) (write as F8_E8M0)."""


MARKERS = {"F8_E4M3": F8E4M3, "F8_E8M0": F8E8M0}


def bf16_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32/float64 -> bf16 bit patterns (uint16, BF16 view), round to nearest even;
    NaN stays NaN.  float64 input is rounded once, from the double."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        return _f64_to_bf16(x)
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x.astype(np.float32))
    rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded.view(BF16)


def _f64_to_bf16(x):
    """Rounds a double to bf16 once (through float32 it could round twice):
    8 significant bits, ties to even, at the spacing of its binade (fixed
    below the smallest normal)."""
    x = np.asarray(x, dtype=np.float64)
    fin = np.isfinite(x)
    xf = np.where(fin, x, 0.0)
    _, e = np.frexp(xf)
    e = np.maximum(e, -125)
    r = np.rint(np.ldexp(xf, 8 - e))              # np.rint: half to even
    r = np.ldexp(r, e - 8).astype(np.float32)     # exact in float32 (<= 8 bits)
    bits = (r.view(np.uint32) >> 16).astype(np.uint16)
    other = f32_to_bf16(x.astype(np.float32)).view(np.uint16)  # inf / NaN
    return np.where(fin, bits, other).astype(np.uint16).view(BF16)


def read(path, bf16="f32"):
    """Returns (tensors, metadata).  tensors: {name: ndarray} in file order.
    bf16: "f32" widens BF16 to float32, "raw" keeps the uint16 bit patterns."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, not a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header of {n} bytes but only {len(raw) - 8} follow")
    hdr = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = hdr.pop("__metadata__", {}) or {}
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dt = DTYPES.get(e["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name!r}: dtype {e['dtype']!r} not supported")
        b, end = e["data_offsets"]
        shape = tuple(e["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - b != count * dt.itemsize or end > len(data):
            raise ValueError(f"{path}: tensor {name!r}: {end - b} bytes for shape {shape} {e['dtype']}")
        a = np.frombuffer(data[b:end], dtype=dt, count=count).reshape(shape).copy()
        if e["dtype"] == "BF16":
            a = bf16_to_f32(a) if bf16 == "f32" else a.view(BF16)
        elif e["dtype"] in MARKERS:
            a = a.view(MARKERS[e["dtype"]])
        out[name] = a
    return out, meta


def header(path):
    """The JSON header only (dtypes and shapes without reading the data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8"))


def encode(tensors, metadata=None):
    """bytes of a safetensors file: tensors sorted by name, packed, header padded
    to 8 bytes with spaces (as parity's writer and the reference do)."""
    hdr, blobs, off = {}, [], 0
    if metadata:
        hdr["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    for name in sorted(tensors):
        a = tensors[name]
        if isinstance(a, BF16):
            dt, b = "BF16", np.ascontiguousarray(a.view(np.uint16), dtype="<u2").tobytes()
        elif isinstance(a, (F8E4M3, F8E8M0)):
            dt = "F8_E4M3" if isinstance(a, F8E4M3) else "F8_E8M0"
            b = np.ascontiguousarray(a.view(np.uint8)).tobytes()
        else:
            a = np.asarray(a)
            if a.dtype.newbyteorder("<") not in NAMES and a.dtype not in NAMES:
                raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
            le = a.dtype.newbyteorder("<")
            dt = NAMES.get(le, NAMES.get(a.dtype))
            b = np.ascontiguousarray(a, dtype=le).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(np.shape(a)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write(path, tensors, metadata=None):
    """Writes atomically: a temporary file in the same directory, fsync'ed, renamed."""
    write_bytes(path, encode(tensors, metadata))


def write_bytes(path, data):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
