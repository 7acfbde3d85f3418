#!/bin/sh
# tools/cp_acceptance.sh - the acceptance cells of context parallelism
# (docs/parallel.md "Context parallelism in the step").  For every named
# boundary fixture of a preset and for random packings (several seeds):
# the serial golden (2 steps), then `parity run` at CP2 and CP4 (threads
# backend) with --dump, compared under the f64 policy (integers -- routing,
# loads, attn.*.selected -- exactly equal).  v4-mini also runs CP4 x EP32,
# EP64, EP128 on 128 ranks (MoE parallel folding).  The cells are rows of the
# matrix's scale tier (src/matrix/cells.c, docs/matrix.md): cp2_s2 and
# cp4_s2 (every fixture), cp2_seedN / cp4_seedN, cp4_epN_s2.
#
#   tools/cp_acceptance.sh [PARITY] [tiny|mini|ep|all]     (default: build/parity all)
#   CP_ACC_FROM=mini-mult16 tools/cp_acceptance.sh build/parity mini   (resume at a fixture)
#   CP_ACC_EPS="32 64" tools/cp_acceptance.sh build/parity ep         (some EP cells)
#
# Prints the matrix's table per preset; exit 1 if any cell failed.
set -u
P=${1:-build/parity}
WHAT=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PARITY_FIXTURES_DIR=${PARITY_FIXTURES_DIR:-$ROOT/fixtures}
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT
fail=0

preset_cells() { # tiny|mini
    set -- "$1" --cell cp2_s2 --cell cp4_s2
    for seed in 1 7 2024; do set -- "$@" --cell cp2_seed$seed --cell cp4_seed$seed; done
    pre=$1
    shift
    if [ -n "${CP_ACC_FROM:-}" ]; then # resume at fixture NAME (alphabetical order)
        for f in "$PARITY_FIXTURES_DIR/$pre"-*.json; do
            fx=$(basename "$f" .json)
            expr "$fx" \< "$CP_ACC_FROM" >/dev/null || set -- "$@" --fixture "$fx"
        done
    fi
    "$P" matrix --preset "v4-$pre" "$@" --out "$T/$pre" || fail=1
}

ep_cells() {
    set --
    for ep in ${CP_ACC_EPS:-32 64 128}; do set -- "$@" --cell cp4_ep${ep}_s2; done
    "$P" matrix --preset v4-mini "$@" --out "$T/ep" || fail=1
}

case "$WHAT" in
tiny) preset_cells tiny ;;
mini) preset_cells mini ;;
ep) ep_cells ;;
all) preset_cells tiny; preset_cells mini; ep_cells ;;
*) echo "usage: $0 [PARITY] [tiny|mini|ep|all]" >&2; exit 2 ;;
esac
exit $fail
