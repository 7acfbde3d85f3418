#!/bin/sh
# Issue 32: recipe goldens (parity golden --recipe) and layouts under a recipe
# (parity run --recipe) against them.
#   - --recipe none writes the bits of a golden without the flag (no recipe,
#     no cast: the hook moves no bit);
#   - each recipe's golden differs from the f64 golden, records train.recipe,
#     and compare names the two recipes;
#   - layouts that cut no tile (DP, EP, CP, PP; bf16 also TP) equal the
#     recipe's serial golden under the f64 policy;
#   - under --bitwise, v4's CP 2, EP 2, TP 2 x CP 2 and TP 2 x ETP 2 x EP 2 + SP are bit-identical to the bitwise
#     recipe golden;
#   - under TP / ETP (with SP, CP, DP, EP) a 1x128 tile of a row-parallel
#     GEMM and a 128x128 / 1x32 weight tile are cut across ranks: cast with the
#     whole tensor's tiles they equal the golden; cut per shard
#     (PARITY_RECIPE_LOCAL_TILES=1) they fail the compare.
# Usage: recipe_layouts.sh PATH/TO/parity
set -u
P=$(realpath "$1")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 2
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
gold() { # gold NAME [flags]
  n=$1; shift
  "$P" golden --preset v4-tiny --quiet "$@" --out "$n" > "$n.log" 2>&1 || { bad "golden $n: $(tail -1 "$n.log")"; }
}
cmp_line() { "$P" compare "$1" "$2" 2>&1 | grep -E '^(EQUAL|MISMATCH)' ; }
gold g-plain
gold g-none --recipe none
if "$P" compare g-plain g-none --policy bitwise > cmp.log 2>&1; then ok "--recipe none is bitwise the golden without it"
else bad "--recipe none moved bits: $(grep -E '^(EQUAL|MISMATCH)' cmp.log)"; fi
for r in bf16 fp8 v4; do
  gold "g-$r" --recipe "$r"
  grep -q "\"recipe\":[[:space:]]*\"$r\"" "g-$r/manifest.json" && ok "g-$r records train.recipe" || bad "g-$r: no train.recipe"
  out=$("$P" compare g-none "g-$r" 2>&1)
  printf '%s' "$out" | grep -q "^MISMATCH" && ok "g-$r differs from the f64 golden" || bad "g-$r equals the f64 golden"
  printf '%s' "$out" | grep -q "B under $r" && ok "compare names the recipes" || bad "compare does not name recipe $r"
done
lay() { # lay RECIPE NAME FLAGS...: the run's dump against the recipe's golden
  r=$1 n=$2; shift 2
  if ! "$P" run --preset v4-tiny --quiet --recipe "$r" "$@" --dump "$n" > "$n.log" 2>&1; then
    bad "run $n: $(tail -1 "$n.log")"; return; fi
  line=$(cmp_line "g-$r" "$n")
  case $line in EQUAL*) ok "$n: $line" ;; *) bad "$n: $line" ;; esac
}
lay v4 v4-dp2 --world-size 2
lay v4 v4-ep2 --expert-model-parallel-size 2 --world-size 2
lay v4 v4-cp2 --context-parallel-size 2
lay v4 v4-pp2 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*2|tmL'
lay fp8 fp8-cp2-ep2 --context-parallel-size 2 --expert-model-parallel-size 2 --world-size 2
lay bf16 bf16-tp2 --tensor-model-parallel-size 2
# the bitwise mode under a recipe: the same layouts give the recipe golden's bits
gold g-v4-bw --recipe v4 --bitwise
for l in "cp2 --context-parallel-size 2" "ep2 --expert-model-parallel-size 2 --world-size 2" \
  "tp2-cp2 --tensor-model-parallel-size 2 --context-parallel-size 2" \
  "tp2-etp2-ep2-sp --tensor-model-parallel-size 2 --expert-tensor-parallel-size 2 --expert-model-parallel-size 2 --world-size 4 --sequence-parallel"; do
  set -- $l; n=v4-bw-$1; shift
  "$P" run --preset v4-tiny --quiet --recipe v4 --bitwise "$@" --dump "$n" > "$n.log" 2>&1 || bad "run $n"
  line=$("$P" compare g-v4-bw "$n" --policy bitwise 2>&1 | grep -E '^(EQUAL|MISMATCH)')
  case $line in EQUAL*) ok "$n (bitwise policy): $line" ;; *) bad "$n (bitwise policy): $line" ;; esac
done
# tiles cut by TP / ETP: the whole tensors' tiles, amaxes maxed over the group
lay fp8 fp8-tp2 --tensor-model-parallel-size 2
lay fp8 fp8-tp2-sp --tensor-model-parallel-size 2 --sequence-parallel
lay v4 v4-tp2-cp2 --tensor-model-parallel-size 2 --context-parallel-size 2
lay v4 v4-tp2-dp2 --tensor-model-parallel-size 2 --world-size 4
lay v4 v4-etp2-ep2 --expert-tensor-parallel-size 2 --expert-model-parallel-size 2 --world-size 4
lay v4 v4-tp2-etp2-ep2-sp --tensor-model-parallel-size 2 --expert-tensor-parallel-size 2 \
  --expert-model-parallel-size 2 --world-size 4 --sequence-parallel
PARITY_RECIPE_LOCAL_TILES=1 "$P" run --preset v4-tiny --quiet --recipe fp8 --tensor-model-parallel-size 2 \
  --dump fp8-tp2-local > tpl.log 2>&1 || bad "the layout-local run failed: $(tail -1 tpl.log)"
line=$(cmp_line g-fp8 fp8-tp2-local)
case $line in MISMATCH*) ok "layout-local tiles (fp8, TP 2) fail against the recipe golden: $line" ;;
  *) bad "layout-local tiles passed: $line" ;; esac
echo "$fails failure(s)"
[ "$fails" -eq 0 ]
