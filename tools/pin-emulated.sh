#!/bin/sh
# tools/pin-emulated.sh - regenerates golden/emulated-clock.json, the pinned
# emulated clock (issue 35; docs/matrix.md "The emulated clock, pinned").
#
# Runs the matrix with the pins switched off (PARITY_EMULATED_PINS=none;
# the plan comparison too, PARITY_PLAN_CHECK=none: the clock is what is pinned),
# in this process (threads; the cells that name fiber run on fiber), and
# writes, for every layout / resume cell that passed, the run summary's
# clock figures -- "emulated" (step time, exposed communication, per rank
# total / compute / comm / idle seconds and bytes per tier), "pipeline"
# (bubble, makespan), "expert_parallel" (dispatch / combine bytes by tier,
# emulated times), "context_parallel" (halo, gather, reduce-scatter bytes)
# -- under "PRESET CELL DATA" with the cell's steps and seed (a run of other
# steps or another seed is not checked).  Entries of cells this run did not select
# are kept.  The matrix compares them exactly; a change of the network
# model or of what a collective charges makes every affected cell FAIL
# until this is rerun ON PURPOSE, with the reason in the commit message.
#
# Usage: tools/pin-emulated.sh [BUILD_DIR] [parity matrix selection...]
#   tools/pin-emulated.sh build                    # the quick tier (v4-tiny)
#   tools/pin-emulated.sh build --preset v4-mini   # the default tier (minutes)
# Run it under the heavy lock (flock /work/heavy.lock nice ...).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
bdir=${1:-$root/build}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- --quick
pins=$root/golden/emulated-clock.json
out=$(mktemp -d /tmp/parity-pin-emulated-XXXXXX)
trap 'rm -rf "$out"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
set +e
PARITY_EMULATED_PINS=none PARITY_PLAN_CHECK=none "$bdir/parity" matrix --quiet --backend threads "$@" --out "$out/m" \
    --report "$out/report.json" >"$out/table.txt" 2>"$out/stderr.txt"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
    cat "$out/table.txt" "$out/stderr.txt" >&2
    echo "pin-emulated: the matrix exited $rc: pins are taken from a passing matrix only" >&2
    exit 1
fi
python3 - "$out/report.json" "$pins" <<'PY'
import json, os, sys
rep = json.load(open(sys.argv[1]))
path = sys.argv[2]
keys = ("emulated", "pipeline", "expert_parallel", "context_parallel")
doc = json.load(open(path)) if os.path.exists(path) else {}
cells = doc.get("cells", {})
n = 0
for c in rep["cells"]:
    run = c.get("run")
    if not run or c["result"] not in ("PASS", "WARN"):
        continue
    pin = {"steps": c["steps"], "seed": c["seed"]}
    pin.update({k: run.get(k) for k in keys})
    cells["%s %s %s" % (c["preset"], c["cell"], c["data"])] = pin
    n += 1
out = {"format": "parity-emulated-pins", "version": 1,
       "note": "the emulated clock of every layout cell of the matrix (issue 35): compared exactly by "
               "`parity matrix`; regenerate on purpose with tools/pin-emulated.sh (docs/matrix.md)",
       "network": "reference preset (comm/netmodel.c), in-process runs",
       "cells": dict(sorted(cells.items()))}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(out, f, indent=1, sort_keys=False)
    f.write("\n")
os.replace(tmp, path)
print("pin-emulated: %d cells pinned from this run, %d in %s" % (n, len(cells), path))
PY
