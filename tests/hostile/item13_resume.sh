#!/bin/bash
# Issue 13 item 13: --steps K is the total step count (Megatron's
# --train-iters).  The issue's reproducer: a run resumed at step 2 with
# --steps 4 does steps 2..3, its dump carries global step numbers and
# "first_step": 2, and `parity compare` compares the steps both sets hold
# and says which.
. "$(dirname "$0")/lib.sh"
expect 0 "checkpoint written" "$P" run --steps 2 --save ck --quiet
expect 0 "golden set written" "$P" golden --steps 4 --out g --quiet
expect 0 "resumed from ck at step 2" "$P" run --steps 4 --load ck --dump r --quiet --summary r.json
check "the resumed dump holds params.2..4 and step.2..3 only" \
  test "$(cd r && ls -- *.safetensors | tr '\n' ' ')" = \
       "params.2.safetensors params.3.safetensors params.4.safetensors step.2.safetensors step.3.safetensors "
check "the manifest says steps 4, first_step 2" \
  python3 -c 'import json,sys; m=json.load(open("r/manifest.json")); sys.exit(not (m["steps"]==4 and m["first_step"]==2))'
check "the run summary: 2 steps, numbered 2 and 3" \
  python3 -c 'import json,sys; s=json.load(open("r.json")); sys.exit(not (s["steps"]==2 and s["start_step"]==2 and [x["step"] for x in s["losses"]]==[2,3]))'
expect 0 "steps compared: 2..4 (params.2..params.4, step.2..step.3); A holds steps 0..4, B 2..4" \
  "$P" compare g r --json c.json
expect 0 "EQUAL within policy: 5 files" "$P" compare g r --policy bitwise
check "compare --json records the steps" \
  python3 -c 'import json,sys; s=json.load(open("c.json"))["steps"]; sys.exit(not (s["compared"]==[2,4] and s["a"]==[0,4] and s["b"]==[2,4] and s["skipped_files_a"]==4))'
# the checkpoint at or past --steps: nothing to do (as Megatron), checked, nothing written
expect 0 "nothing to do, nothing written" "$P" run --steps 2 --load ck --dump r2 --save ck2 --quiet
check "no --dump or --save directory" test ! -e r2 -a ! -e ck2
expect 2 "in this model but F64 [128,32] in the checkpoint" "$P" run --steps 2 --load ck --set dim=64 --quiet
# sets without a step in common fail, naming the ranges
expect 0 "golden set written" "$P" golden --steps 1 --out g1 --quiet
expect 1 "no step in common: A holds steps 0..1, B 2..4" "$P" compare g1 r
# a file before the manifest's first_step is refused
cp -r r bad && cp g/params.1.safetensors bad/ && chmod -R u+w bad
python3 - <<'PY'
import hashlib, json
m = json.load(open("bad/manifest.json"))
m["files"]["params.1.safetensors"] = hashlib.sha256(open("bad/params.1.safetensors", "rb").read()).hexdigest()
json.dump(m, open("bad/manifest.json", "w"))
PY
expect 2 "params.1.safetensors is before the manifest's \"first_step\": 2" "$P" compare g bad
finish
