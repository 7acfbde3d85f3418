#!/bin/sh
# tools/bench/bitwise-cost.sh - what the bitwise mode (docs/bitwise.md) costs,
# side by side in one run: the serial golden step (wall, peak RSS) and a set of
# layout runs, each in the tolerance mode and with --bitwise, alternating so
# that both see the same machine load; the ratio bitwise / tolerance per line.
# Not a test: numbers only.  Take the heavy lock:
#
#   flock /work/heavy.lock sh tools/bench/bitwise-cost.sh [PARITY] [REPEATS]
#                                                  (default build/parity 2)
#
# PRESET (default v4-mini, 1 step) picks the model; the layouts are those the
# mode makes bitwise (DP2, EP2, CP2, PP2 1F1B, TP2, TP2 + SP, ETP2) on the
# default backend.  MATRIX=1 adds the default tier (`parity matrix` against
# `parity matrix --bitwise`, 24 cells): the 1.5x rule of issue 30 is about it.
# Beside wall and peak RSS each line gives the CPU time (user + sys), which a
# shared machine's load changes less than the wall.
set -u
P=${1:-build/parity}
N=${2:-2}
PRESET=${PRESET:-v4-mini}
C="--preset $PRESET --steps 1 --quiet"
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT
case $PRESET in
    v4-tiny) PPL='Et*1|t*2mL' ;;
    *) PPL='Et*4|t*4mL' ;;
esac

# one timed command; prints "wall rss cpu" (s, MiB, s) or "- - -" when it failed
timed() {
    rm -rf "$T/out"
    if ! /usr/bin/time -f 'TIME %e %M %U %S' "$@" >"$T/log" 2>&1; then
        echo "FAILED: $* : $(grep -v '^TIME' "$T/log" | tail -1)" >&2
        echo "- - -"
        return
    fi
    awk '/^TIME /{printf "%s %.1f %.2f\n", $2, $3 / 1024, $4 + $5}' "$T/log"
}

row() { # LABEL KIND ARGS...   KIND golden|run|matrix
    label=$1 kind=$2
    shift 2
    tw=999999 tr=0 tc=0 bw=999999 br=0 bc=0 i=0
    while [ $i -lt "$N" ]; do
        case $kind in
            golden)
                r=$(timed "$P" golden $C "$@" --out "$T/out")
                b=$(timed "$P" golden $C "$@" --bitwise --out "$T/out") ;;
            matrix)
                r=$(timed "$P" matrix "$@" --out "$T/out")
                b=$(timed "$P" matrix "$@" --bitwise --out "$T/out") ;;
            *)
                r=$(timed "$P" run $C "$@")
                b=$(timed "$P" run $C "$@" --bitwise) ;;
        esac
        w=${r%% *} m=$(echo "$r" | cut -d' ' -f2) c=${r##* }
        [ "$w" != - ] && awk "BEGIN{exit !($w < $tw)}" && tw=$w tr=$m tc=$c
        w=${b%% *} m=$(echo "$b" | cut -d' ' -f2) c=${b##* }
        [ "$w" != - ] && awk "BEGIN{exit !($w < $bw)}" && bw=$w br=$m bc=$c
        i=$((i + 1))
    done
    awk -v l="$label" -v tw="$tw" -v tr="$tr" -v tc="$tc" -v bw="$bw" -v br="$br" -v bc="$bc" \
        'BEGIN{printf "%-22s %9.2f %9.1f %9.2f %9.2f %9.1f %9.2f %7.2fx %7.2fx %7.2fx\n", l, tw, tr, tc, bw, br, bc,
               bw / tw, br / tr, (tc > 0 ? bc / tc : 0)}'
}

echo "bitwise-cost: $PRESET, best of $N; $(nproc) cores; $(uptime)"
printf "%-22s %9s %9s %9s %9s %9s %9s %8s %8s %8s\n" "" "tol s" "tol MiB" "tol cpu" "bit s" "bit MiB" "bit cpu" \
    "wall" "rss" "cpu"
row "serial golden" golden
row "dp2" run --world-size 2
row "ep2" run --world-size 2 --expert-model-parallel-size 2
row "cp2" run --world-size 2 --context-parallel-size 2
row "pp2 1f1b" run --world-size 2 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "$PPL" \
    --pipeline-schedule 1f1b
row "tp2" run --world-size 2 --tensor-model-parallel-size 2
row "tp2 sp" run --world-size 2 --tensor-model-parallel-size 2 --sequence-parallel
row "etp2" run --world-size 2 --expert-tensor-parallel-size 2
[ "${MATRIX:-0}" = 1 ] && row "matrix (default tier)" matrix
