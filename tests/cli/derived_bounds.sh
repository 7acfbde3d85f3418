#!/bin/sh
# Issue 32 item 5: derived per-tensor bounds (parity bounds, compare --policy derived).
# v4-tiny, recipe v4, 1 step: bounds from three f32 variants (--bitwise, row blocks of 1 and 4);
# the f32 one-shot golden (not among them) must pass every tensor; seeded bugs must fail;
# hostile bounds files exit 2.  Usage: derived_bounds.sh PATH/TO/parity
set -u
P=$(realpath "$1")
T=$(realpath "$(dirname "$0")/../../tools/seed-bug.py")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
A="--preset v4-tiny --fixture tiny-boundary-mix --steps 1 --seed 1234 --quiet"
for x in "R --recipe v4 --router-scores" "N --router-scores" "V1 --recipe v4 --precision f32 --bitwise --router-scores" \
         "V2 --recipe v4 --precision f32 --rows-per-block 1" "V3 --recipe v4 --precision f32 --rows-per-block 4" \
         "G --recipe v4 --precision f32" "F8 --recipe fp8 --precision f32"; do
  set -- $x; d=$1; shift
  "$P" golden $A "$@" --out "$d" > "$d.log" 2>&1 || { bad "golden $d: $(tail -1 "$d.log")"; exit 1; }
done
# derivation
"$P" bounds R --variant V1 --variant V2 --variant V3 --exact N --out R/bounds.json > b.log 2>&1 \
  && ok "bounds derived: $(head -1 b.log)" || bad "bounds: $(cat b.log)"
"$P" bounds R --variant V1 --variant V2 --variant V3 --factor 100 --out wide.json > /dev/null 2>&1 || bad "bounds --factor 100"
# the stand-in for a GPU run passes every tensor (default bounds file: R/bounds.json)
"$P" compare R G --policy derived --json g.json > g.log 2>&1; rc=$?
[ $rc -eq 0 ] && ok "f32 golden within the derived bounds: $(tail -1 g.log)" || bad "f32 golden rc=$rc: $(grep -m3 FAIL g.log)"
# one expert's gradient x 1.01: flagged, while its cosine stays >= 0.99
cp -r G bug && /usr/bin/python3 "$T" bug scale step.0.safetensors grad.layers.2.ffn.experts.3.w1.weight 1.01 > /dev/null
"$P" compare R bug --policy derived --json bug.json > bug.log 2>&1; rc=$?
cos=$(/usr/bin/python3 -c "
import json; r = json.load(open('bug.json'))
e = [t for t in r['tensors'] if t['tensor'] == 'grad.layers.2.ffn.experts.3.w1.weight'][0]
print(e['cosine'] if not e['pass'] and r['failed'] == 1 else -1)")
[ $rc -eq 1 ] && /usr/bin/python3 -c "import sys; sys.exit(0 if $cos >= 0.99 else 1)" \
  && ok "expert gradient x 1.01 flagged (1 entry), cos $cos" || bad "expert gradient x 1.01: rc=$rc cos=$cos"
# the MTP loss weight 0.3 applied twice (a run with mtp_lambda 0.09 whose manifest states 0.3): flagged,
# out.loss's cosine is 1
"$P" golden $A --recipe v4 --precision f32 --set mtp_lambda=0.09 --out mtp > mtp.log 2>&1 \
  && /usr/bin/python3 "$T" mtp manifest train.mtp_lambda 0.3 > /dev/null || bad "golden mtp"
"$P" compare R mtp --policy derived --json mtp.json > mtp.log 2>&1; rc=$?
cos=$(/usr/bin/python3 -c "
import json; r = json.load(open('mtp.json'))
e = [t for t in r['tensors'] if t['tensor'] == 'out.loss'][0]
print(e['cosine'] if not e['pass'] else -1)")
[ $rc -eq 1 ] && [ "$cos" = "1" ] && ok "MTP weight applied twice flagged: $(grep -m1 MISMATCH mtp.log); out.loss cos $cos" \
  || bad "MTP weight twice: rc=$rc cos=$cos"
# a router flip where A's margin is wide: an error naming the token, layer and margin
cp -r G flipL && /usr/bin/python3 "$T" flipL flip 0 layers.1 largest --scores R > /dev/null
"$P" compare R flipL --policy derived > fl.log 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "layer 1, row .*margin in A" fl.log && ok "wide-margin flip flagged: $(grep -m1 'margin in A' fl.log)" \
  || bad "wide-margin flip: rc=$rc"
# a flip at the narrowest margin: an error under the derived eps, allowed when eps exceeds that margin
cp -r G flipS && /usr/bin/python3 "$T" flipS flip 0 layers.1 smallest --scores R > fs.txt
"$P" compare R flipS --policy derived > fs.log 2>&1; rc1=$?
"$P" compare R flipS --policy derived --bounds wide.json --json fsw.json > fsw.log 2>&1; rc2=$?
allowed=$(/usr/bin/python3 -c "
import json; r = json.load(open('fsw.json'))
print([t.get('flips_allowed', 0) for t in r['tensors'] if t['tensor'] == 'router.layers.1.idx'][0])")
[ $rc1 -eq 1 ] && [ $rc2 -eq 0 ] && [ "$allowed" = 1 ] && ok "narrow-margin flip: error at factor 4, allowed at factor 100 ($(cat fs.txt))" \
  || bad "narrow-margin flip: rc $rc1 / $rc2, allowed $allowed"
# the set without the recipe is not a run of the recipe
"$P" compare R N --policy derived > n.log 2>&1; rc=$?
[ $rc -eq 1 ] && ok "no-recipe set flagged: $(grep -m1 MISMATCH n.log)" || bad "no-recipe set rc=$rc"
# hostile or unfit bounds: exit 2, one line
head -c 300 R/bounds.json > trunc.json
sed "s/\"bound\":[[:space:]]*\([0-9]\)/\"bound\": -\1/" R/bounds.json > neg.json
"$P" bounds N --variant V1 --out x.json > /dev/null 2>&1; rc0=$?
/usr/bin/python3 - <<'PY'
import json
b = json.load(open("R/bounds.json"))
def put(name, f):
    c = json.loads(json.dumps(b)); f(c); json.dump(c, open(name + ".json", "w"))
put("fmt", lambda c: c.update(format="parity-golden"))
put("dup", lambda c: c["tensors"].append(c["tensors"][0]))
put("var", lambda c: c["tensors"][3].update(variant=7))
put("sha", lambda c: c["golden"]["files"].update({"step.0.safetensors": "xyz"}))
put("kind", lambda c: c["tensors"][1].update(kind="cosine"))
put("nan", lambda c: c.update(factor="NaN"))
put("rows", lambda c: [t.update(bound=1.5) for t in c["tensors"] if t["kind"] == "rows"])
PY
for f in trunc neg fmt dup var sha kind nan rows; do
  "$P" compare R G --policy derived --bounds $f.json > h.log 2> h.err; rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l < h.err)" -eq 1 ] && ok "$f bounds: exit 2: $(cat h.err)" || bad "$f bounds: rc=$rc $(cat h.err)"
done
"$P" compare N G --policy derived --bounds R/bounds.json > h.log 2> h.err; rc=$?
[ $rc -eq 2 ] && grep -q "another golden" h.err && ok "bounds of another golden: $(cat h.err)" || bad "other golden rc=$rc"
"$P" bounds R --variant F8 --out x.json > /dev/null 2> h.err; rc=$?
[ $rc -eq 2 ] && [ $rc0 -eq 2 ] && ok "variant of another recipe: $(cat h.err)" || bad "variant recipe rc=$rc/$rc0"
echo "$fails failure(s)"
[ "$fails" -eq 0 ]
