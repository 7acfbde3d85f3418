#!/bin/bash
# Issue 32 item 4: the release's quantized storage (FP8 E4M3 + 128x128 E8M0
# .scale, FP4 packed E2M1 + 1x32 .scale) through export hf --quantize and
# import hf: the round trip is bitwise with --scales-from, and hostile
# storage (a truncated scale, a NaN scale, a shape that does not divide by
# the tile) is refused with exit 2, naming the tensor and the numbers.
. "$(dirname "$0")/lib.sh"
SRC=$(dirname "$P")/../golden/v4-tiny/params.0.safetensors
[ -f "$SRC" ] || SRC=$(realpath "$(dirname "$0")/../../golden/v4-tiny/params.0.safetensors")
# edit NAME FIELD VALUE IN OUT: rewrites one tensor of a safetensors file
# (stdlib python): FIELD shape=[..] keeps the data's first bytes, byte=V sets
# every byte of its data to V.
edit() {
  /usr/bin/python3 - "$@" <<'PY'
import json, struct, sys
name, field, value, src, dst = sys.argv[1:6]
b = open(src, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]
parts, off = [], 0
meta = h.pop("__metadata__", None)
for k in sorted(h, key=lambda k: h[k]["data_offsets"][0]):
    e = h[k]; d = data[e["data_offsets"][0]:e["data_offsets"][1]]
    if k == name and field == "shape":
        e["shape"] = json.loads(value); cnt = 1
        for s in e["shape"]: cnt *= s
        d = d[:cnt]
    elif k == name and field == "byte":
        d = bytes([int(value, 0)]) * len(d)
    e["data_offsets"] = [off, off + len(d)]; off += len(d); parts.append(d)
if meta is not None: h["__metadata__"] = meta
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(parts))
PY
}
expect 2 "FP4 (MXFP4) storage needs in_features divisible by the 1x32 tile; [32,16] has 16 = 32 * 0 + 16" \
  "$P" export hf "$SRC" q16 --quantize --preset v4-tiny
check "a refused export leaves no OUT" test ! -e q16
expect 2 "--scales-from needs --quantize" "$P" export hf "$SRC" q --scales-from x --preset v4-tiny
check "golden with moe_inter_dim 32" "$P" golden --preset v4-tiny --set moe_inter_dim=32 --steps 1 --out G --quiet
expect 0 "FP8/FP4 weights quantized with a .scale each" "$P" export hf G Q --quantize --dtype bf16
expect 0 "131 dequantized from FP8/FP4 storage" "$P" import hf Q p.safetensors
expect 0 "0 tiles not represented exactly by them" \
  "$P" export hf p.safetensors Q2 --quantize --dtype bf16 --scales-from Q --preset v4-tiny --set moe_inter_dim=32
S=model-00001-of-00001.safetensors
check "FP8 + FP4 storage -> import -> export --quantize --scales-from: bit-identical shard" cmp -s Q/$S Q2/$S
# hostile storage: one file, no index
mkdir -p T && cp Q/config.json T/
edit layers.0.attn.wq_a.scale shape '[1,0]' Q/$S T/model.safetensors
expect 2 "the scale of 'layers.0.attn.wq_a.weight' has shape [1,0]; FP8 [16,32] needs 128x128 tiles: [1,1]" \
  "$P" import hf T t.safetensors
check "a refused import writes nothing" test ! -e t.safetensors
edit layers.0.attn.wq_a.scale byte 0xff Q/$S T/model.safetensors
expect 2 "the scale of 'layers.0.attn.wq_a.weight': element 0 (tile row 0, col 0) is nan" "$P" import hf T t.safetensors
edit layers.0.ffn.experts.0.w1.scale shape '[32,0]' Q/$S T/model.safetensors
expect 2 "FP4 [32,32] needs 1x32 tiles: [32,1]" "$P" import hf T t.safetensors
head -c 20000 Q/$S > T/model.safetensors
expect 2 "T/model.safetensors" "$P" import hf T t.safetensors
finish
