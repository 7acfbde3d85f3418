#!/bin/bash
# Issue 13 item 10: MPI processes started with different arguments that do
# not change any shape are refused before they run, naming the keys.
# usage: PARITY MPIEXEC
. "$(dirname "$0")/mpi_lib.sh"
two() { # two "ARGS OF PROCESS 0" "ARGS OF PROCESS 1": exit status and output of the pair
  timeout 300 "$MPIEXEC" -n 1 "$P" run --backend mpi --world-size 2 --quiet $1 : \
    -n 1 "$P" run --backend mpi --world-size 2 --quiet $2 2>&1
}
mpi_expect() { # mpi_expect RC NEEDLE A B
  local out rc
  out=$(two "$3" "$4")
  rc=$?
  if [ $rc -ne $1 ] || ! printf '%s' "$out" | grep -qF -- "$2"; then
    echo "FAIL: '$3' vs '$4': exit $rc (want $1), output lacks '$2':"; printf '%s\n' "$out" | head -4
    fails=$((fails + 1))
  else
    echo "ok: '$3' vs '$4': $(printf '%s' "$out" | grep -F -m1 -- "$2" | cut -c1-200)"
  fi
}
mpi_expect 2 "run.seed: process 0 has 1234, process 1 has 7" "" "--seed 7"
mpi_expect 2 "train.lr: process 0 has 0.001, process 1 has 0.5" "" "--set lr=0.5"
mpi_expect 2 "run.steps: process 0 has 1, process 1 has 2" "" "--steps 2"
"$P" golden --steps 1 --out g1 --quiet >/dev/null
"$P" golden --steps 1 --seed 9 --out g2 --quiet >/dev/null
mpi_expect 2 "data.file_sha256: process 0 has" "--data g1/step.0.safetensors" "--data g2/step.0.safetensors"
mpi_expect 2 "data.source: process 0 has generator, process 1 has fixture tiny-full-row" "" "--fixture tiny-full-row"
mpi_expect 0 "step" "" ""
finish
