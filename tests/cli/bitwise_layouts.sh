#!/bin/sh
# issue 30, the bitwise mode (docs/bitwise.md): the serial `golden --bitwise`
# and `run --bitwise` under every parallel dimension (DP, ZeRO-1, EP, CP,
# DP x EP x ZeRO-1, PP under three schedules, PP x CP x EP x ZeRO-1, TP, SP,
# TP x CP, ETP, PP x CP x EP x TP; threads, fiber, MPI, MPI x fiber; f64 and
# f32) give the same bits
# (`compare --policy bitwise`); the same layouts in the tolerance mode differ
# from their golden in bits but pass the f64 policy (what the bitwise policy
# sees that the tolerance policy cannot); the bitwise golden agrees with the
# tolerance golden under the f64 policy, and compare notes the two modes.
# Usage: bitwise_layouts.sh PARITY
P="$1"
set -f # the layouts' '*' are not file patterns
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
common="--preset v4-tiny --steps 3 --fixture tiny-boundary-mix --quiet"
"$P" golden $common --bitwise --out "$T/gb" >/dev/null 2>"$T/err" || fail "golden --bitwise: $(cat "$T/err")"
"$P" golden $common --out "$T/gt" >/dev/null 2>"$T/err" || fail "golden: $(cat "$T/err")"
grep -q '"numerics"' "$T/gb/manifest.json" || fail "the bitwise golden's manifest does not record the mode"
grep -q '"numerics"' "$T/gt/manifest.json" && fail "the tolerance golden's manifest records a mode (it must stay as it was)"
"$P" compare "$T/gt" "$T/gb" --policy f64 >"$T/cmp" 2>&1 || fail "bitwise vs tolerance golden, f64 policy: $(tail -3 "$T/cmp")"
grep -q "made in the tolerance mode, B in the bitwise mode" "$T/cmp" || fail "compare does not note the modes"
# row blocks: in the bitwise mode the row-blocked golden is the one-shot golden, bit for bit
"$P" golden $common --bitwise --rows-per-block 3 --out "$T/gb3" >/dev/null 2>"$T/err" || fail "golden --rows-per-block 3: $(cat "$T/err")"
"$P" compare "$T/gb" "$T/gb3" --policy bitwise --subset >"$T/cmp" 2>&1 || fail "row-blocked vs one-shot: $(tail -2 "$T/cmp")"
n=0
check() { # NAME LAYOUT-FLAGS...
    name=$1
    shift
    "$P" run $common --bitwise "$@" --dump "$T/$name" >/dev/null 2>"$T/err" || fail "$name: $(tail -2 "$T/err")"
    "$P" compare "$T/gb" "$T/$name" --policy bitwise >"$T/cmp" 2>&1 || fail "$name --bitwise vs the bitwise golden: $(tail -2 "$T/cmp")"
    n=$((n + 1))
    echo "PASS bitwise: $name"
}
check dp2 --world-size 2
check dp2-zero1 --world-size 2 --use-distributed-optimizer
check ep2 --world-size 2 --expert-model-parallel-size 2
check dp2-ep2-zero1 --world-size 4 --expert-model-parallel-size 2 --use-distributed-optimizer
check cp2 --world-size 2 --context-parallel-size 2
check cp4-ep2 --world-size 4 --context-parallel-size 4 --expert-model-parallel-size 2
check pp2-cp2-ep2-zero1 --world-size 8 --context-parallel-size 2 --expert-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*1|t*2mL' --use-distributed-optimizer
for s in gpipe 1f1b dualpipe; do
    check "pp2-$s" --world-size 2 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*1|t*2mL' \
        --pipeline-schedule "$s"
done
# f32: the same mode in the other working precision
"$P" golden $common --precision f32 --bitwise --out "$T/gf" >/dev/null 2>"$T/err" || fail "golden f32 --bitwise: $(cat "$T/err")"
"$P" run $common --precision f32 --bitwise --world-size 4 --expert-model-parallel-size 2 --use-distributed-optimizer \
    --dump "$T/f32" >/dev/null 2>"$T/err" || fail "f32 dp2-ep2-zero1: $(tail -2 "$T/err")"
"$P" compare "$T/gf" "$T/f32" --policy bitwise >"$T/cmp" 2>&1 || fail "f32 dp2-ep2-zero1 vs the f32 bitwise golden: $(tail -2 "$T/cmp")"
n=$((n + 1))
echo "PASS bitwise: f32 dp2-ep2-zero1"
# every backend: fiber ranks, and (where MPICH is installed) MPI processes, alone and hosting fiber ranks
pp_ep="--world-size 8 --expert-model-parallel-size 4 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*1|t*2mL --use-distributed-optimizer"
check fiber-pp2-ep4-zero1 --backend fiber $pp_ep
if command -v mpiexec >/dev/null 2>&1; then
    mpi() { # NAME NPROC FLAGS...
        name=$1 np=$2
        shift 2
        timeout 240 mpiexec -n "$np" "$P" run --backend mpi $common --bitwise "$@" --dump "$T/$name" >/dev/null 2>"$T/err" ||
            fail "$name: $(tail -2 "$T/err")"
        "$P" compare "$T/gb" "$T/$name" --policy bitwise >"$T/cmp" 2>&1 || fail "$name vs the bitwise golden: $(tail -2 "$T/cmp")"
        n=$((n + 1))
        echo "PASS bitwise: $name"
    }
    mpi mpi4-pp2-ep2 4 --world-size 4 --expert-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --pipeline-model-parallel-layout 'Et*1|t*2mL'
    mpi mpi2xfiber4-pp2-ep4-zero1 2 --rank-host fiber $pp_ep
else
    echo "no mpiexec: the MPI layouts are not run"
fi
# tensor parallelism: TP, SP, TP x CP, ETP (and their compositions), threads, fiber, MPI, MPI x fiber, f32
check tp2 --world-size 2 --tensor-model-parallel-size 2
check tp2-sp --world-size 2 --tensor-model-parallel-size 2 --sequence-parallel
check tp2-cp2-sp --world-size 4 --tensor-model-parallel-size 2 --context-parallel-size 2 --sequence-parallel
check etp2-ep2 --world-size 4 --expert-tensor-parallel-size 2 --expert-model-parallel-size 2
check tp2-etp2-sp --world-size 2 --tensor-model-parallel-size 2 --expert-tensor-parallel-size 2 --sequence-parallel
pctp="--world-size 8 --context-parallel-size 2 --expert-model-parallel-size 2 --tensor-model-parallel-size 2 \
--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*1|t*2mL"
check pp2-cp2-ep2-tp2 $pctp
check fiber-pp2-cp2-ep2-tp2 --backend fiber $pctp
"$P" run $common --precision f32 --bitwise $pctp --dump "$T/f32tp" >/dev/null 2>"$T/err" || fail "f32 pp2-cp2-ep2-tp2: $(tail -2 "$T/err")"
"$P" compare "$T/gf" "$T/f32tp" --policy bitwise >"$T/cmp" 2>&1 || fail "f32 pp2-cp2-ep2-tp2 vs the f32 bitwise golden: $(tail -2 "$T/cmp")"
n=$((n + 1))
echo "PASS bitwise: f32 pp2-cp2-ep2-tp2"
if command -v mpiexec >/dev/null 2>&1; then
    mpi mpi8-pp2-cp2-ep2-tp2 8 $pctp
    mpi mpi2xfiber4-pp2-cp2-ep2-tp2 2 --rank-host fiber $pctp
fi
# the tolerance mode: another summation order, caught by the bitwise policy only
"$P" run $common --world-size 2 --dump "$T/dp2t" >/dev/null 2>"$T/err" || fail "dp2 (tolerance): $(tail -2 "$T/err")"
"$P" compare "$T/gt" "$T/dp2t" --policy bitwise >"$T/cmp" 2>&1 && fail "dp2 in the tolerance mode is bitwise equal: the check could not fail"
grep -q "first divergence" "$T/cmp" || fail "no diagnosis: $(tail -2 "$T/cmp")"
"$P" compare "$T/gt" "$T/dp2t" --policy f64 >"$T/cmp" 2>&1 || fail "dp2 (tolerance) under the f64 policy: $(tail -2 "$T/cmp")"
echo "$n layouts bitwise equal to the serial golden; the tolerance mode's dp2 differs in bits and passes f64"
