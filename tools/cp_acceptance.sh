#!/bin/sh
# tools/cp_acceptance.sh - issue 6's acceptance cells for context parallelism
# (docs/parallel.md "Context parallelism in the step").  For every named
# boundary fixture of a preset and for random packings (several seeds):
# the serial golden (2 steps), then `parity run` at CP2 and CP4 (threads
# backend) with --dump, then `parity compare` (f64 policy; integers --
# routing, loads, attn.*.selected -- exactly equal).  v4-mini also runs
# CP4 x EP32, EP64, EP128 on 128 ranks (MoE parallel folding).
#
#   tools/cp_acceptance.sh [PARITY] [tiny|mini|ep|all]     (default: build/parity all)
#   CP_ACC_FROM=mini-mult16 tools/cp_acceptance.sh build/parity mini   (resume at a fixture)
#   CP_ACC_EPS="32 64" tools/cp_acceptance.sh build/parity ep         (some EP cells)
#
# Prints one line per cell with its wall time; exit 1 if any cell failed.
set -u
P=${1:-build/parity}
WHAT=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PARITY_FIXTURES_DIR=${PARITY_FIXTURES_DIR:-$ROOT/fixtures}
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT
fail=0

now() { date +%s.%N; }

cell() { # name golden-dir run-args...
    name=$1; g=$2; shift 2
    t0=$(now)
    if "$P" run --steps 2 --quiet "$@" --dump "$T/r" >"$T/out" 2>&1 && "$P" compare "$g" "$T/r" >"$T/cmp" 2>&1; then
        res=PASS
    else
        res=FAIL; fail=1
        tail -5 "$T/out" "$T/cmp" 2>/dev/null
    fi
    printf '%-4s %-44s %8.1f s  %s\n' "$res" "$name" "$(echo "$(now) - $t0" | bc)" "$(tail -1 "$T/cmp" 2>/dev/null)"
    rm -rf "$T/r"
}

golden() { # dir args...
    d=$1; shift
    rm -rf "$d"
    "$P" golden --steps 2 --quiet "$@" --out "$d" >/dev/null || { echo "FAIL golden $*"; fail=1; }
}

preset_cells() { # tiny|mini
    pre=v4-$1
    for f in "$PARITY_FIXTURES_DIR/$1"-*.json; do
        fx=$(basename "$f" .json)
        # CP_ACC_FROM=NAME resumes at fixture NAME (alphabetical order)
        if [ -n "${CP_ACC_FROM:-}" ] && expr "$fx" \< "$CP_ACC_FROM" >/dev/null; then continue; fi
        golden "$T/g" --preset $pre --fixture "$fx"
        for cp in 2 4; do cell "$pre $fx cp$cp" "$T/g" --preset $pre --fixture "$fx" --context-parallel-size $cp; done
    done
    for seed in 1 7 2024; do
        golden "$T/g" --preset $pre --seed $seed
        for cp in 2 4; do cell "$pre random seed $seed cp$cp" "$T/g" --preset $pre --seed $seed --context-parallel-size $cp; done
    done
}

ep_cells() {
    golden "$T/g" --preset v4-mini --seed 1234
    for ep in ${CP_ACC_EPS:-32 64 128}; do
        cell "v4-mini cp4 x ep$ep (N=128)" "$T/g" --preset v4-mini --seed 1234 --context-parallel-size 4 \
            --expert-model-parallel-size $ep --world-size 128
    done
}

case "$WHAT" in
tiny) preset_cells tiny ;;
mini) preset_cells mini ;;
ep) ep_cells ;;
all) preset_cells tiny; preset_cells mini; ep_cells ;;
*) echo "usage: $0 [PARITY] [tiny|mini|ep|all]" >&2; exit 2 ;;
esac
exit $fail
