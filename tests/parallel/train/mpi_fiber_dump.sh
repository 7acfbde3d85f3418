#!/bin/sh
# The MPI fold (issue 18): the same world folded into 2, 4 and 8 MPI processes,
# their ranks hosted as fibers (--rank-host fiber) or as OS threads
# (--rank-host threads, the default), writes byte for byte the dump of the
# single-process fiber run, and the virtual clock of every rank a process
# reports (its summary holds its own ranks) equals the single-process one.
# v4-tiny, world 32 = PP2 x (EP8 x De2 | Da16), 1F1B with 2 microbatches,
# reference network, 2 steps.  Every exchange between two processes is one
# metadata and one data message each way, packed by the group's leader on
# each side: 8 x 4 has 28 process pairs, and groups with 1 to 4 members on
# a process.
# usage: mpi_fiber_dump.sh PARITY MPIEXEC
set -eu
parity=$1
mpiexec=$2
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
layout='Et*2|tmL'
flags="--preset v4-tiny --steps 2 --world-size 32 --pipeline-model-parallel-size 2
  --expert-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 32 --topology reference
  --quiet --comm-timeout 120"
# shellcheck disable=SC2086
"$parity" run --backend fiber $flags --pipeline-model-parallel-layout "$layout" --dump "$w/one" --summary "$w/one.json" >/dev/null
same() { # DUMP SUMMARY what
  for f in "$w"/one/*.safetensors; do
    cmp -s "$f" "$1/$(basename "$f")" || { echo "FAIL: $3: $(basename "$f") differs from the single-process dump"; exit 1; }
  done
  # the manifests differ in the backend's name only
  sed '/"backend":/d' "$w/one/manifest.json" >"$w/a.m"
  sed '/"backend":/d' "$1/manifest.json" >"$w/b.m"
  cmp -s "$w/a.m" "$w/b.m" || { echo "FAIL: $3: the manifest differs (beyond the backend's name)"; exit 1; }
  python3 - "$w/one.json" "$2" "$3" <<'PY'
import json, sys
a, b, what = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
ra = {r["rank"]: r for r in a["emulated"]["ranks"]}
rb = {r["rank"]: r for r in b["emulated"]["ranks"]}
bad = [k for k in rb if ra.get(k) != rb[k]]
strip = lambda L: [{k: v for k, v in x.items() if k != "wall_s"} for x in L]
if not rb or bad or strip(a["losses"]) != strip(b["losses"]):
    sys.exit("FAIL: %s: virtual clocks or losses differ (ranks %s of %d reported)" % (what, bad[:5], len(rb)))
PY
}
for run in "2 fiber" "4 fiber" "8 fiber" "4 threads"; do
  set -- $run
  # MPICH/UCX leak ~1 KB at MPI_Finalize (see mpi_run_dump.sh): leak checks off for the processes
  # shellcheck disable=SC2086
  ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" "$mpiexec" -n "$1" "$parity" run --backend mpi \
    --rank-host "$2" $flags --pipeline-model-parallel-layout "$layout" --dump "$w/m$1$2" --summary "$w/m$1$2.json" >/dev/null
  same "$w/m$1$2" "$w/m$1$2.json" "$1 processes x $((32 / $1)) $2 ranks"
done
echo "mpi fold: 2 x 16 fiber, 4 x 8 fiber, 8 x 4 fiber, 4 x 8 threads: dumps byte-equal to the single-process fiber run, clocks equal"
