#!/usr/bin/env bash
# Issue 34 (the cluster tier's BAD TERMINATION): a job over two "hosts" on
# this machine (hydra's fork launcher), two processes each; the odd processes
# are slow to exit (tests/comm/mpi_leave.c).  Every process must end on its
# own: mpiexec exit 0 and both slow processes' last line printed (before the
# fix hydra's proxy killed them when process 0 left, and mpiexec still said 0).
#   bash tests/comm/mpi_leave.sh MPIEXEC MPI_LEAVE
set -u
mpiexec=$1 prog=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout 120 "$mpiexec" -launcher fork -hosts ha:2,hb:2 -n 4 "$prog" >"$out" 2>&1
rc=$?
fail=0
[ $rc -eq 0 ] || { echo "FAIL: mpiexec exit $rc"; fail=1; }
for q in 1 3; do
  grep -q "process $q ends after its slow exit" "$out" || { echo "FAIL: process $q did not end on its own (killed at its exit)"; fail=1; }
done
grep -v 'UCX  ERROR' "$out"
[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
