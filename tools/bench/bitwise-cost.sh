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
# default backend.
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

# one timed command; prints "wall rss" (s, MiB) or FAILED
timed() {
    rm -rf "$T/out"
    if ! /usr/bin/time -f 'TIME %e %M' "$@" >"$T/log" 2>&1; then
        echo "FAILED: $* : $(grep -v '^TIME' "$T/log" | tail -1)" >&2
        echo "- -"
        return
    fi
    sed -n 's/^TIME \([0-9.]*\) \([0-9]*\)$/\1 \2/p' "$T/log" | awk '{printf "%s %.1f\n", $1, $2 / 1024}'
}

row() { # LABEL KIND ARGS...   KIND golden|run
    label=$1 kind=$2
    shift 2
    tw=999999 tr=0 bw=999999 br=0 i=0
    while [ $i -lt "$N" ]; do
        if [ "$kind" = golden ]; then
            set -- "$@"
            r=$(timed "$P" golden $C "$@" --out "$T/out")
            b=$(timed "$P" golden $C "$@" --bitwise --out "$T/out")
        else
            r=$(timed "$P" run $C "$@")
            b=$(timed "$P" run $C "$@" --bitwise)
        fi
        w=${r% *} m=${r#* }
        [ "$w" != - ] && awk "BEGIN{exit !($w < $tw)}" && tw=$w tr=$m
        w=${b% *} m=${b#* }
        [ "$w" != - ] && awk "BEGIN{exit !($w < $bw)}" && bw=$w br=$m
        i=$((i + 1))
    done
    awk -v l="$label" -v tw="$tw" -v tr="$tr" -v bw="$bw" -v br="$br" \
        'BEGIN{printf "%-22s %9.2f %9.1f %9.2f %9.1f %7.2fx %7.2fx\n", l, tw, tr, bw, br, bw / tw, br / tr}'
}

echo "bitwise-cost: $PRESET, best of $N; $(nproc) cores; $(uptime)"
printf "%-22s %9s %9s %9s %9s %8s %8s\n" "" "tol s" "tol MiB" "bit s" "bit MiB" "wall" "rss"
row "serial golden" golden
row "dp2" run --world-size 2
row "ep2" run --world-size 2 --expert-model-parallel-size 2
row "cp2" run --world-size 2 --context-parallel-size 2
row "pp2 1f1b" run --world-size 2 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "$PPL" \
    --pipeline-schedule 1f1b
row "tp2" run --world-size 2 --tensor-model-parallel-size 2
row "tp2 sp" run --world-size 2 --tensor-model-parallel-size 2 --sequence-parallel
row "etp2" run --world-size 2 --expert-tensor-parallel-size 2
