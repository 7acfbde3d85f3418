#!/bin/sh
# tools/cells-fault-demo.sh - the quick matrix's issue-35 cells catch a
# deliberately broken build (the way tools/fault-demo.sh does it for CP).
#
# Builds parity with one bug compiled in (meson -Dfault=NAME), in its own
# build directory, runs `parity matrix --quick` (or the cells named in
# PARITY_FAULT_CELLS), and checks that
#   - the matrix exits 1,
#   - the cells the fault reaches FAIL with the diagnosis of their check:
#       fiber_short_copy  backends/fiber: the last sender's bytes copied 8
#                         short on groups of more than 2 ranks: the fiber
#                         cells (fiber-cp2-ep2-zero1, fiber-pp2-cp2-ep2 against
#                         threads, fiber-cp4-dp17 against the serial run) FAIL
#                         naming the first divergent tensor
#       comm_chunk_floor  comm/collectives.c: the all-reduce's chunk count
#                         rounded down on groups over 64 ranks: fiber-cp4-dp17
#                         (68 ranks) FAILs naming the first divergent tensor
#       golden_block_zero model/step.c: the gradients zeroed before every row
#                         block of the blocked golden: golden-blocked FAILs
#                         naming the first divergent tensor
#       net_nvlink_bw     comm/netmodel.c: the reference preset's NVLink at
#                         800 GB/s, not 900: every cell with pinned figures
#                         (golden/emulated-clock.json) whose pinned run sends
#                         bytes FAILs (a resume cell pins its last leg, which
#                         is serial in the *-to-tp1 / *-to-etp1 cells)
#                         with "emulated clock vs ..." naming the first figure
#       zero1_state_unsharded  parallel/dp/zero.c: ZeRO-1 allocates the
#                         replicated state's sizes on every rank (the whole
#                         group's AdamW m, v and Muon momentum; the update uses
#                         its shard: the numerics and the clock are the same):
#                         every cell whose run the planner models with a
#                         ZeRO-1 group of more than one rank FAILs with "plan
#                         vs run ... memory.optim" (matrix_plan.c), and no
#                         other check of the matrix sees it
#   - every other cell passes (PASS, or WARN for the informational one).
# PARITY_FAULT_SELECT="--preset v4-mini" runs that selection instead of --quick
# (the default tier's pins: net_nvlink_bw).
# Usage: tools/cells-fault-demo.sh FAULT [BUILD_DIR]   (default build-fault-FAULT)
#        PARITY_FAULT_CELLS="fiber-cp4-dp17 cp2 ..." runs only those cells.
# A build, then the quick matrix (2-3 minutes on 2 cores); run it under
# `flock /work/heavy.lock` on a shared machine.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
fault=${1:-}
case $fault in
fiber_short_copy | comm_chunk_floor | golden_block_zero | net_nvlink_bw | zero1_state_unsharded) ;;
*) echo "usage: tools/cells-fault-demo.sh fiber_short_copy|comm_chunk_floor|golden_block_zero|net_nvlink_bw|zero1_state_unsharded [BUILD_DIR]" >&2; exit 2 ;;
esac
bdir=${2:-$root/build-fault-$fault}
. "$root/tools/fault-lib.sh"
cells=
for c in ${PARITY_FAULT_CELLS:-}; do cells="$cells --cell $c"; done
# shellcheck disable=SC2086
fault_matrix cells-fault-demo "$fault" "$bdir" $cells
python3 - "$out/report.json" "$fault" "$root/golden/emulated-clock.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
fault = sys.argv[2]
pins = json.load(open(sys.argv[3]))["cells"] if os.path.exists(sys.argv[3]) else {}
reach = {
    "fiber_short_copy": {"fiber-cp2-ep2-zero1", "fiber-pp2-cp2-ep2", "fiber-cp4-dp17"},
    "comm_chunk_floor": {"fiber-cp4-dp17"},
    "golden_block_zero": {"golden-blocked"},
}
bad, n_reached = [], 0
for c in r["cells"]:
    name, diag = c["cell"], c["diagnosis"] or ""
    if fault == "net_nvlink_bw":
        # a pinned run that sends bytes (a resume cell's pinned run is its last leg: serial in
        # tp2-to-tp1, etp2-zero1-to-etp1, etp2-ep4-to-etp1, no communication for the model to charge)
        em = (c["run"] or {}).get("emulated") or {}
        sends = any(r["bytes"]["nvlink"] + r["bytes"]["ib"] > 0 for r in em.get("ranks", []))
        hit = sends and "%s %s %s" % (c["preset"], c["cell"], c["data"]) in pins
        want = "emulated clock vs "
    elif fault == "zero1_state_unsharded":
        # a run the planner models (matrix_plan.c) whose ZeRO-1 plans span more than one rank
        run = c["run"] or {}
        lay, plan = run.get("layout") or {}, run.get("plan") or {}
        groups = lay.get("data_parallel_size", 1) * lay.get("context_parallel_size", 1)
        hit = (lay.get("use_distributed_optimizer") and "memory" in plan and
               (groups > 1 or lay.get("expert_data_parallel_size", 1) > 1))
        want = "plan vs run "
    else:
        hit = name in reach[fault]
        want = "first divergence"
    if hit:
        n_reached += 1
        if c["result"] != "FAIL":
            bad.append("%s %s: %s, expected FAIL" % (name, c["data"], c["result"]))
        elif want not in diag:
            bad.append("%s %s: FAIL without the expected diagnosis (%r): %r" % (name, c["data"], want, diag))
    elif c["result"] not in ("PASS", "WARN") or (c["result"] == "WARN" and not c["informational"]):
        bad.append("%s %s: %s, expected PASS (the fault does not reach it): %s" % (name, c["data"], c["result"], diag))
if n_reached == 0:
    bad.append("no cell the fault reaches ran")
if bad:
    print("cells-fault-demo: FAILED:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
shown = 0
for c in r["cells"]:
    if c["result"] == "FAIL" and shown < 12:
        print("FAIL %s %s: %s" % (c["cell"], c["data"], c["diagnosis"]))
        shown += 1
print("cells-fault-demo: OK (%s): %d cells FAIL with their diagnosis, %d other cells pass" %
      (fault, n_reached, len(r["cells"]) - n_reached))
PY
