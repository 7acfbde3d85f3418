#!/bin/sh
# Offload build, CPU mode (--device cpu), fiber ranks: the cell that aborted with
# heap corruption (`double free or corruption`) before hc_pre_backward's Sinkhorn
# scratch was sized per token in offload builds.  In such a build a kernel loop
# runs as a target region's host fallback, which libgomp starts as a fresh
# initial thread: its parallel team takes the process's default thread count,
# not the fiber worker's 1 that sized a per-thread scratch (docs/gpu.md,
# "Offload build, CPU mode").  OMP_NUM_THREADS=4 makes the team larger than
# one on any machine.  Passes in the default build too (the cell as it is).
set -eu
parity=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for cell in etp2-ep4-de2 fiber-pp2-cp2-ep2; do
  if ! OMP_NUM_THREADS=4 "$parity" matrix --quick --cell "$cell" --backend fiber --device cpu --quiet \
       --out "$out/$cell" >"$out/$cell.log" 2>&1; then
    cat "$out/$cell.log"
    echo "FAIL: $cell on fiber ranks, CPU mode"
    exit 1
  fi
  grep -q "1 passed, 0 failed" "$out/$cell.log" || { cat "$out/$cell.log"; echo "FAIL: $cell: no PASS line"; exit 1; }
  echo "ok: $cell on fiber ranks, CPU mode"
done
