#!/bin/sh
# tools/bench/backend-threshold.sh - where the default backend switches
# from OS threads to fibers (issue 33 item 1; src/cli/autobackend.c).  One
# global batch, a serial run, then N ranks on threads and on fiber side by
# side for each N: wall and peak RSS as multiples of the serial run's, and
# threads' wall over fiber's.  The rule's threshold is the most ranks per
# core at which threads is still not slower than fiber.  Not a test:
# numbers only.  Take the heavy lock:
#
#   flock /work/heavy.lock sh tools/bench/backend-threshold.sh [PARITY] [N...]
#                                             (default build/parity 2 4 8 16 32 64)
#
# The batch (BATCH to replace it): v4-tiny with 64 routed experts, 64 rows
# of 64 tokens (--set n_routed_experts=64 --global-batch-size 64), one
# step, f64, no network; each N runs flat EP (EP = N, Da = N: every rank
# 64/N rows and 64/N experts).  BATCH="--preset v4-mini --quiet --steps 1
# --global-batch-size 64" for the larger model (384 experts; minutes).
# The cores are this process's (nproc): the per-core figure is N / nproc.
set -u
P=${1:-build/parity}
[ $# -gt 0 ] && shift
NS=${*:-2 4 8 16 32 64}
B=${BATCH:-"--preset v4-tiny --quiet --steps 1 --set n_routed_experts=64 --global-batch-size 64"}
CORES=$(nproc)
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT

# runs parity with args; sets wall (s) and rss (KiB), or returns 1
run() {
    if ! /usr/bin/time -f 'TIME %e %M' "$P" run $B --backend "$@" >"$T/log" 2>&1; then
        echo "FAILED: parity run $B --backend $*: $(grep -v '^TIME' "$T/log" | tail -1)"
        return 1
    fi
    set -- $(sed -n 's/^TIME \([0-9.]*\) \([0-9]*\)$/\1 \2/p' "$T/log")
    wall=$1 rss=$2
}

echo "backend-threshold: $CORES cores; $(uptime)"
run self --world-size 1 || exit 1
W0=$wall R0=$rss
printf 'serial: %.2f s, %d MiB\n' "$W0" "$((R0 / 1024))"
printf '%6s %9s | %9s %7s %7s | %9s %7s %7s | %s\n' N "N/core" "threads" "x ser" "x RSS" "fiber" "x ser" "x RSS" \
    "threads/fiber"
for n in $NS; do
    run threads --world-size "$n" --expert-model-parallel-size "$n" || continue
    tw=$wall tr=$rss
    run fiber --world-size "$n" --expert-model-parallel-size "$n" || continue
    awk -v n="$n" -v c="$CORES" -v tw="$tw" -v tr="$tr" -v fw="$wall" -v fr="$rss" -v w0="$W0" -v r0="$R0" \
        'BEGIN { printf "%6d %9.1f | %8.2fs %6.2fx %6.2fx | %8.2fs %6.2fx %6.2fx | %.2f\n",
                 n, n / c, tw, tw / w0, tr / r0, fw, fw / w0, fr / r0, tw / fw }'
done
echo "backend-threshold: $(uptime)"
