#!/bin/bash
# Issue 13 item 15: `parity compare` refuses manifests its files do not back,
# reports model-config differences, refuses safetensors with gaps, trailing
# bytes, NUL or invalid UTF-8 in names.
. "$(dirname "$0")/lib.sh"
"$P" golden --steps 2 --out g --quiet >/dev/null
edit() { # edit DIR PYTHON-STATEMENT on manifest m
  rm -rf "$1" && cp -r g "$1"
  python3 -c "import json,sys; m=json.load(open('$1/manifest.json')); $2; json.dump(m, open('$1/manifest.json','w'))"
}
edit s1 "m['steps']=1000000"
expect 2 'claims "steps": 1000000' "$P" compare g s1
edit s0 "m['steps']=0"
expect 2 'past the manifest' "$P" compare g s0
edit f0 "m['files']={}"
expect 2 'is not listed in manifest.json "files"' "$P" compare g f0
edit c1 "m['model']['dim']=48; m['train']['lr']=0.5"
expect 1 "config differs: A dim = 32, B dim = 48" "$P" compare g c1
expect 1 "config differs: A lr = 0.001, B lr = 0.5" "$P" compare g c1
python3 - <<'PY'
import json, struct
def st(header, data, name):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    open(name, 'wb').write(struct.pack('<Q', len(h)) + h + data)
t = lambda a, b: {"dtype": "I32", "shape": [2], "data_offsets": [a, b]}
st({"x": t(0, 8)}, b'\0' * 8, 'ok.st')
st({"x": t(4, 12)}, b'\0' * 12, 'gap.st')
st({"x": t(0, 8)}, b'\0' * 12, 'tail.st')
st(b'{"a\\u0000b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', b'\0' * 8, 'nul.st')
st(b'{"a\xff":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', b'\0' * 8, 'utf8.st')
PY
expect 0 "EQUAL" "$P" compare ok.st ok.st
expect 2 "belong to no tensor" "$P" compare ok.st gap.st
expect 2 "4 trailing bytes" "$P" compare ok.st tail.st
expect 2 "NUL" "$P" compare ok.st nul.st
expect 2 "not valid UTF-8" "$P" compare ok.st utf8.st
finish
