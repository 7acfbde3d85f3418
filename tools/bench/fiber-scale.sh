#!/bin/sh
# tools/bench/fiber-scale.sh - one global batch, serial against N ranks, on
# the fiber and threads backends side by side, then the tuning guide's
# config cells (issue 18 item 4).  Not a test: numbers only.  Take the
# heavy lock:
#
#   flock /work/heavy.lock sh tools/bench/fiber-scale.sh [PARITY] [N...]
#                                           (default build/parity 32 128 1024)
#
# The batch: v4-tiny with 1,024 routed experts, 1,024 rows of 16 tokens
# (--set n_routed_experts=1024 --set seq_length=16 --global-batch-size 1024),
# one step, f64, no network.  For each N: flat EP (EP = N, Da = N) and
# PP x EP (PP 2 'Et*1|t*2mL' 1F1B, EP = N/2), each on fiber and threads
# (THREADS_MAX caps the threads runs, default 64: the brief's limit of OS
# threads on a shared machine).  Prints wall and peak RSS (/usr/bin/time)
# per run, both as multiples of the serial run's, and, for fiber, its
# switches into ranks and rank wake-ups (the backend's info line) per wall
# second.
#
# Then the matrix cells of CONFIGS (default "config-a"; "config-a config-b
# config-c" for all three, 8,192 ranks each for B and C): `parity matrix
# --scale --cell NAME`, the serial golden and the fiber world in one
# process, with the emulated network: wall, peak RSS, wake-ups, verdict.
# CONFIGS="" skips them.
set -u
P=${1:-build/parity}
[ $# -gt 0 ] && shift
NS=${*:-32 128 1024}
TMAX=${THREADS_MAX:-64}
CONFIGS=${CONFIGS-config-a}
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT
B="--preset v4-tiny --quiet --steps 1 --set n_routed_experts=1024 --set seq_length=16 --global-batch-size 1024"
W0="" R0=""

# wall (s), peak RSS (KiB) and the fiber line's "S switches, W wake-ups (R /s)" of the log in $T/log
measure() {
    set -- $(sed -n 's/^TIME \([0-9.]*\) \([0-9]*\)$/\1 \2/p' "$T/log")
    wall=$1 rss=$2
    sw=$(sed -n 's/.*fiber: .* \([0-9]*\) switches into ranks, \([0-9]*\) wake-ups.*/\1 \2/p' "$T/log" | tail -1)
    extra=""
    if [ -n "$sw" ]; then
        set -- $sw
        extra=$(awk -v s="$1" -v w="$2" -v t="$wall" 'BEGIN { printf "%d switches, %d wake-ups (%.0f /s)", s, w, w / t }')
    fi
}

failed() { # label what: /usr/bin/time's own line ends the log, show parity's last line beside it
    printf '%-26s %-7s FAILED: %s (%s)\n' "$1" "$2" \
        "$(grep -v -e '^TIME' -e '^Command ' "$T/log" | tail -1)" "$(grep '^Command ' "$T/log" | tail -1)"
}

one() { # label backend args...
    label=$1 be=$2; shift 2
    if ! PARITY_LOG=info /usr/bin/time -f 'TIME %e %M' "$P" run $B --backend "$be" "$@" >"$T/log" 2>&1; then
        failed "$label" "$be"
        return
    fi
    measure
    [ -z "$W0" ] && W0=$wall R0=$rss
    x=$(awk -v w="$wall" -v r="$rss" -v w0="$W0" -v r0="$R0" 'BEGIN { printf "%5.2fx %5.2fx", w / w0, r / r0 }')
    printf '%-26s %-7s %8.1f s %8.0f MiB  %s  %s\n' "$label" "$be" "$wall" "$((rss / 1024))" "$x" "$extra"
}

cell() { # matrix cell name
    rm -rf "$T/mx"
    if ! PARITY_LOG=info /usr/bin/time -f 'TIME %e %M' "$P" matrix --scale --cell "$1" --out "$T/mx" \
        --report "$T/$1.json" >"$T/log" 2>&1; then
        grep -q '^\[ *1/1\].*PASS' "$T/log" || { failed "$1" matrix; return; }
    fi
    measure
    v=$(sed -n 's/^\[ *1\/1\] [^ ]* *[^ ]* *\([A-Z]*\) (.*/\1/p' "$T/log" | tail -1)
    st=$(sed -n 's/.*"emulated_step_s":[[:space:]]*\([0-9.e+-]*\).*/\1/p' "$T/$1.json" | head -1)
    printf '%-26s %-7s %8.1f s %8.0f MiB  %s, emulated step %s s  %s\n' "$1" matrix "$wall" "$((rss / 1024))" \
        "${v:-?}" "${st:-?}" "$extra"
}

echo "fiber-scale: $(uptime)"
printf '%-26s %-7s %10s %12s  %-13s %s\n' run backend wall "peak RSS" "x serial" "fiber"
one "serial" self --world-size 1
for n in $NS; do
    h=$((n / 2))
    for be in fiber threads; do
        [ "$be" = threads ] && [ "$n" -gt "$TMAX" ] && continue
        one "N=$n flat EP$n" $be --world-size $n --expert-model-parallel-size $n
        one "N=$n PP2 x EP$h" $be --world-size $n --expert-model-parallel-size $h \
            --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*1|t*2mL' \
            --pipeline-schedule 1f1b
    done
done
for c in $CONFIGS; do
    cell "$c"
done
echo "fiber-scale: $(uptime)"
