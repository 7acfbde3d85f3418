#!/bin/sh
# tools/fiber-vs-threads.sh - the fiber backend against the threads backend
# on whole training runs (docs/comm.md "The fiber backend").  Each cell runs
# `parity run` twice with the same layout, once per backend, on the
# emulated reference network with --dump and --trace, then requires
#   - the dumps bitwise equal (`parity compare --policy bitwise`), and
#   - the Chrome traces (every rank's virtual clock: compute, comm, idle
#     spans) byte for byte equal.
#
#   tools/fiber-vs-threads.sh [PARITY] [tiny|mini|all]     (default: build/parity tiny)
#
# tiny: v4-tiny DP4, DP4 ZeRO-1, EP4 x De2, EP8, CP4, PP2 1F1B, PP2 ZB-H1 (split
#       B and W), PP2 DualPipeV,
#       EP4 x PP2 1F1B (2 steps each, seconds).  mini: v4-mini EP64 x CP2
#       (64 ranks, ~6 GB per run: take the heavy lock).
# Prints one line per cell (wall and peak RSS of each backend); exit 1 if
# any cell differs.
set -u
P=${1:-build/parity}
WHAT=${2:-tiny}
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT
fail=0

stat_of() { # log -> "W s R MiB"
    sed -n 's/^wall time \([0-9.]*\) s.*peak RSS \([0-9.]*\) MiB.*/\1 s \2 MiB/p' "$1" | tail -1
}

cell() { # name run-args...
    name=$1; shift
    for be in threads fiber; do
        if ! "$P" run --quiet --topology reference --backend $be "$@" \
                --dump "$T/$be" --trace "$T/$be.json" >"$T/$be.log" 2>&1; then
            echo "FAIL $name: $be run failed"; tail -3 "$T/$be.log"; fail=1; return
        fi
    done
    res=PASS
    if ! "$P" compare "$T/threads" "$T/fiber" --policy bitwise >"$T/cmp" 2>&1; then
        res=FAIL; fail=1; tail -4 "$T/cmp"
    fi
    if ! cmp -s "$T/threads.json" "$T/fiber.json"; then
        res=FAIL; fail=1; echo "$name: the virtual clocks (traces) differ"
    fi
    printf '%-4s %-28s threads %-18s fiber %-18s %s\n' "$res" "$name" "$(stat_of "$T/threads.log")" \
        "$(stat_of "$T/fiber.log")" "$(tail -1 "$T/cmp" | sed 's/.*: //')"
    rm -rf "$T/threads" "$T/fiber"
}

tiny() {
    t="--preset v4-tiny --steps 2"
    cell "tiny dp4" $t --world-size 4
    cell "tiny dp4 zero1" $t --world-size 4 --use-distributed-optimizer
    cell "tiny ep4 de2" $t --expert-model-parallel-size 4 --world-size 8
    cell "tiny ep8" $t --expert-model-parallel-size 8
    cell "tiny cp4" $t --context-parallel-size 4
    cell "tiny pp2 1f1b" $t --pipeline-model-parallel-size 2 \
        --pipeline-model-parallel-layout 'Et*1|t*2mL' --pipeline-schedule 1f1b --world-size 4
    cell "tiny pp2 zb-h1 dp2" $t --pipeline-model-parallel-size 2 \
        --pipeline-model-parallel-layout 'Et*1|t*2mL' --pipeline-schedule zb-h1 --world-size 4
    cell "tiny pp2 dualpipev" $t --pipeline-model-parallel-size 2 \
        --virtual-pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|t|t|mL' \
        --pipeline-schedule dualpipev --world-size 4
    cell "tiny ep4 pp2 1f1b" $t --expert-model-parallel-size 4 --pipeline-model-parallel-size 2 \
        --pipeline-model-parallel-layout 'Et*1|t*2mL' --pipeline-schedule 1f1b --world-size 8
}

mini() {
    cell "mini ep64 cp2" --preset v4-mini --steps 1 --expert-model-parallel-size 64 \
        --context-parallel-size 2 --world-size 64
}

case $WHAT in
tiny) tiny ;;
mini) mini ;;
all) tiny; mini ;;
*) echo "usage: tools/fiber-vs-threads.sh [PARITY] [tiny|mini|all]" >&2; exit 2 ;;
esac
exit $fail
