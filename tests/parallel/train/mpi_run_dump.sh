#!/bin/sh
# parity run under mpiexec (2 processes x 2 thread ranks, EP4) writes one
# complete dump equal to the serial golden, and leaves no temporary
# directory behind (only the process hosting rank 0 commits the dump).
# usage: mpi_run_dump.sh PARITY MPIEXEC
set -eu
parity=$1
mpiexec=$2
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
"$parity" golden --preset v4-tiny --steps 2 --out "$w/golden" 2>/dev/null
# MPICH/UCX leak ~1 KB from plugins they unload at MPI_Finalize ("<unknown
# module>" to LeakSanitizer, so not suppressible by name): under a sanitizer
# build, leak checking is off for the MPI processes only (parity's own
# allocations are leak-checked by every other test, and by tests/comm's MPI
# driver before MPI shuts down).
for i in 1 2 3; do
  ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" "$mpiexec" -n 2 "$parity" run --backend mpi --preset v4-tiny --steps 2 --world-size 4 \
    --ranks-per-process 2 --expert-model-parallel-size 4 --quiet --comm-timeout 120 \
    --dump "$w/dump" >/dev/null
  "$parity" compare "$w/golden" "$w/dump" >/dev/null
  if ls -d "$w"/dump.tmp-* >/dev/null 2>&1; then
    echo "FAIL: a temporary dump directory was left behind"; exit 1
  fi
done
echo "mpi run dump: 3 runs equal to the golden, no temporary left"
