#!/bin/sh
# tools/fault-demo.sh - the matrix catches a deliberately broken build
# (issue 10's acceptance; docs/matrix.md "Fault demonstration").
#
# Builds parity with a named bug compiled in, in its own build directory,
# runs `parity matrix --quick`, and checks that
#   - the matrix exits 1,
#   - every cell whose layout has CP > 1 (cp2, cp4 on every fixture, the
#     f32 CP cell, the reshard pair that loads into CP=2) FAILs with a
#     verdict line that names the root cause -- the first divergent tensor in
#     dataflow order, a float tensor of step 0 (the fault acts from the first
#     step), never a downstream routing or selection mismatch -- except cp2
#     on tiny-half-boundary, whose samples all end at S/2: no attention
#     window crosses the CP2 split, the halo is never read, so the fault
#     cannot show there (it must PASS), and cp2, cp4 on tiny-one-token
#     (every window one token: no halo row is read either),
#   - every other cell passes (PASS, or WARN for the informational one),
#     the vs-backend cells (fiber-cp2-ep2-zero1, fiber-pp2-cp2-ep2) among them:
#     they compare a CP layout with itself on another backend, fault and all.
# Faults (meson -Dfault=NAME, src/parallel/cp/cp.c):
#   cp_halo_short      the forward halo one row short (the row next to the
#                      boundary left zero): the root cause is a forward tensor
#   cp_halo_grad_drop  the backward halo gradient of that row dropped: the
#                      forward is exact, the root cause is a gradient (grad.*)
# Usage: tools/fault-demo.sh [FAULT] [BUILD_DIR]
#        (default cp_halo_short, build-fault-FAULT)
# Takes about 3 minutes on 2 cores (the build, then ~1 minute of matrix).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
fault=${1:-cp_halo_short}
case $fault in
cp_halo_short | cp_halo_grad_drop) ;;
*) echo "usage: tools/fault-demo.sh [cp_halo_short|cp_halo_grad_drop] [BUILD_DIR]" >&2; exit 2 ;;
esac
bdir=${2:-$root/build-fault-$fault}
. "$root/tools/fault-lib.sh"
fault_matrix fault-demo "$fault" "$bdir"
python3 - "$out/report.json" "$fault" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
fault = sys.argv[2]
bad = []
n_cp = 0
untouched = {("cp2", "tiny-half-boundary"),  # samples end at S/2: the CP2 halo is never read
             ("cp2", "tiny-one-token"), ("cp4", "tiny-one-token")}  # 1-token windows: no halo is read
for c in r["cells"]:
    cp = "CP=" in c["layout"]
    if " vs threads" in c["layout"] or " vs fiber" in c["layout"]:
        # a layout against itself on another backend (vs-backend): the fault is in both runs
        if c["result"] != "PASS":
            bad.append("%s %s: %s, expected PASS (both backends carry the fault)" % (c["cell"], c["fixture"], c["result"]))
    elif (c["cell"], c["fixture"]) in untouched:
        if c["result"] != "PASS":
            bad.append("%s %s: %s, expected PASS (no sample crosses the CP split)" % (c["cell"], c["fixture"], c["result"]))
    elif cp:
        n_cp += 1
        if c["result"] != "FAIL":
            bad.append("%s %s: %s, expected FAIL (CP layout)" % (c["cell"], c["fixture"], c["result"]))
        elif not c["diagnosis"] or not c["root_cause"] or "first divergence" not in c["diagnosis"]:
            bad.append("%s %s: FAIL without a readable diagnosis: %r" % (c["cell"], c["fixture"], c["diagnosis"]))
        else:
            rc = c["root_cause"]
            t = rc["tensor"]
            integer = t.startswith("router.") or t.endswith(".selected") or t.startswith("input.")
            want_grad = fault == "cp_halo_grad_drop"
            if integer or rc["file"] != ("step.1" if c["cell"] == "reshard" else "step.0") or \
                    t.startswith("grad.") != want_grad:
                bad.append("%s %s: root cause %s %s is not the fault's first effect (%s)" %
                           (c["cell"], c["fixture"], rc["file"], t, "a gradient of step 0" if want_grad
                            else "a forward tensor of step 0"))
    elif c["result"] not in ("PASS", "WARN") or (c["result"] == "WARN" and not c["informational"]):
        bad.append("%s %s: %s, expected PASS (no CP in the layout)" % (c["cell"], c["fixture"], c["result"]))
if n_cp == 0:
    bad.append("no CP cell ran")
if bad:
    print("fault-demo: FAILED:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
for c in r["cells"]:
    if c["result"] == "FAIL":
        print("FAIL %s %s: %s" % (c["cell"], c["fixture"], c["diagnosis"]))
print("fault-demo: OK (%s): %d CP cells FAIL naming the root cause, %d other cells pass (%d of them CP cells the "
      "fault cannot reach)" % (fault, n_cp, len(r["cells"]) - n_cp, len(untouched)))
PY
