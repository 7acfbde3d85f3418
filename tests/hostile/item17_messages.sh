#!/bin/bash
# Issue 13 item 17: messages that misled now say what is wrong.
. "$(dirname "$0")/lib.sh"
# --data with S=48: the summary line says S=48
python3 - <<'PY'
import json, struct
R, S = 8, 48
tok = struct.pack('<%di' % (R * S), *[(i * 7) % 128 for i in range(R * S)])
seg = struct.pack('<%di' % (R * S), *[0] * (R * S))
def st(entries, name):
    hdr, data, off = {}, b'', 0
    for n, dt, shape, raw in entries:
        hdr[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw; off += len(raw)
    h = json.dumps(hdr).encode()
    open(name, 'wb').write(struct.pack('<Q', len(h)) + h + data)
st([("input.tokens", "I32", [R, S], tok), ("input.segments", "I32", [R, S], seg)], 'd48.st')
f64 = struct.pack('<%dd' % (R * S), *[0.0] * (R * S))
st([("input.tokens", "F64", [R, S], f64), ("input.segments", "F64", [R, S], f64)], 'f64.st')
PY
expect 0 "S=48" "$P" run --data d48.st --quiet
expect 0 "S=48" "$P" golden --data d48.st --out g48 --quiet
expect 2 "the file has input.tokens F64 [8,48]" "$P" run --data f64.st --quiet
expect 2 "--log needs a value" "$P" --log
expect 2 "--log needs a value" "$P" run --log
expect 2 "is a directory" "$P" plan --config .
expect 2 "--microbatches must be >= 1, got 0" "$P" schedule --pipeline-schedule 1f1b --pipeline-model-parallel-size 2 --microbatches 0
expect 2 "--world-size must be >= 1, got -1" "$P" run --world-size -1 --quiet
"$P" run --steps 1 --save ck --quiet >/dev/null
expect 2 "is F64 [128,64] in this model but F64 [128,32] in the checkpoint" "$P" run --load ck --set dim=64 --quiet
expect 0 "default: PARITY_COMM_TIMEOUT, else 3600" "$P" run --help
PARITY_COMM_TIMEOUT=abc expect 2 "PARITY_COMM_TIMEOUT=abc: must be a number of seconds" "$P" run --quiet
mkdir tdir
out=$("$P" run --trace tdir/../tdir --quiet 2>&1); rc=$?
n=$(printf '%s\n' "$out" | grep -c 'tdir')
if [ $rc -eq 2 ] && [ "$n" -eq 1 ]; then echo "ok: --trace to a directory: exit 2, one message"; else
  echo "FAIL: --trace to a directory: exit $rc, $n messages"; printf '%s\n' "$out" | head -3; fails=$((fails + 1)); fi
finish
