#!/bin/sh
# `parity plan` with config A's flags prints the tuning guide's numbers and
# writes them as JSON; the planning flags refuse bad input with exit 2.
# Usage: plan.sh PARITY
P="$1"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
A="--preset v4-pro --world-size 1024 --pipeline-model-parallel-size 8 --expert-model-parallel-size 64
   --micro-batch-size 1 --global-batch-size 4096 --use-distributed-optimizer"
L='Et*7|t*8|t*8|t*8|t*8|t*8|t*7|t*7mL'

$P plan $A --pipeline-model-parallel-layout "$L" --guide --json "$T/a.json" >"$T/out" 2>"$T/err" ||
    fail "config A: $(cat "$T/err")"
for want in "66,060,288" "12.68 GB" "6.34 GB" "3.17 GB" "7/39 = 17.9 %" "524,288 unique tokens" \
            "= 8192 assignments" "63.6 %" "30.4 %" "131,072" "M=4" "plan written: $T/a.json"; do
    grep -qF "$want" "$T/out" || fail "config A output lacks '$want'"
done
grep -q '"expert_params":[[:space:]]*66060288' "$T/a.json" || fail "JSON lacks expert_params"
grep -q '"t_group":[[:space:]]*524288' "$T/a.json" || fail "JSON lacks t_group"
grep -q '"stages"' "$T/a.json" || fail "JSON lacks the memory stages"

mkdir "$T/dir"
$P plan $A --pipeline-model-parallel-layout "$L" --json "$T/dir" >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "is a directory" "$T/err" || fail "--json DIR: $(cat "$T/err")"
$P plan --runtime gpu >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "runtime expects" "$T/err" || fail "--runtime: $(cat "$T/err")"
$P plan --search >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "needs --world-size" "$T/err" || fail "--search without N: $(cat "$T/err")"
$P plan --search --world-size 8 --memory-per-gpu lots >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "not a size" "$T/err" || fail "--memory-per-gpu: $(cat "$T/err")"

$P plan --preset v4-tiny --search --world-size 8 --memory-per-gpu 6MB --runtime parity --json "$T/s.json" \
    >"$T/out" 2>"$T/err" || fail "tiny search: $(cat "$T/err")"
grep -q "candidates:" "$T/out" || fail "search table: $(cat "$T/out")"
grep -q '"status":[[:space:]]*"kept"' "$T/s.json" || fail "search JSON has no kept candidate"
grep -q '"status":[[:space:]]*"memory"' "$T/s.json" || fail "search JSON has no memory-dropped candidate"
# issue 15 (tpcomp15): SP is modelled, not refused: TP 2 + SP holds fewer activation bytes than TP 2
# alone (the tokens between TP regions at 1/TP); SP without TP is refused with the rule
act() { sed -n 's/.*"activations":[[:space:]]*\([0-9]*\).*/\1/p' "$1" | head -1; }
$P plan --preset v4-tiny --tensor-model-parallel-size 2 --world-size 2 --runtime parity --json "$T/tp.json" \
    >/dev/null 2>"$T/err" || fail "TP 2 plan: $(cat "$T/err")"
$P plan --preset v4-tiny --tensor-model-parallel-size 2 --world-size 2 --runtime parity --sequence-parallel \
    --json "$T/sp.json" >/dev/null 2>"$T/err" || fail "TP 2 + SP plan: $(cat "$T/err")"
a=$(act "$T/tp.json"); b=$(act "$T/sp.json")
[ -n "$a" ] && [ -n "$b" ] && [ "$b" -lt "$a" ] || fail "SP activations $b not below TP's $a"
$P plan --preset v4-tiny --sequence-parallel >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "needs tensor-model-parallel-size > 1" "$T/err" || fail "SP without TP: $(cat "$T/err")"
echo ok
