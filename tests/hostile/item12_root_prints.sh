#!/bin/bash
# Issue 13 item 12: under mpiexec only the process hosting rank 0 prints the
# results (the others printed a table of loss 0, grad_norm 0).
# usage: PARITY MPIEXEC
. "$(dirname "$0")/mpi_lib.sh"
for np in 2 4; do
  timeout 300 "$MPIEXEC" -n $np "$P" run --backend mpi --world-size 4 --expert-model-parallel-size 4 --steps 1 \
    --quiet >out.txt 2>err.txt
  rc=$?
  check "$np processes: exit 0 (got $rc)" [ $rc -eq 0 ]
  check "$np processes: one results table" [ "$(grep -c '^step  loss' out.txt)" = 1 ]
  check "$np processes: one summary line" [ "$(grep -c '^run: preset' out.txt)" = 1 ]
  check "$np processes: no table of zeros" [ "$(grep -c '^0  *0  ' out.txt)" = 0 ]
done
finish
