#!/bin/sh
# tools/tp-fault-demo.sh - the matrix catches a deliberately broken TP build
# (issue 15's acceptance; docs/parallel.md "Deliberate faults", the way
# tools/fault-demo.sh does it for CP).
#
# Builds parity with one TP bug compiled in (meson -Dfault=NAME, the
# PAR_TP_FAULT_* bit of src/parallel/tp/tp.h set in every run), in its own build
# directory, runs `parity matrix --quick`, and checks that
#   - the matrix exits 1,
#   - every cell the fault reaches FAILs with a diagnosis ("first divergence")
#     whose root cause is the fault's first effect:
#       tp_wkv_no_reduce  every TP cell: a gradient of step 0, attn.wkv.weight
#                         (each TP rank keeps its heads' share of wkv's gradient)
#       tp_ce_log_tp      every TP cell (the vocab-parallel CE is the default
#                         under TP): a loss of step 0 (out.*loss*), off by
#                         log(TP) (the softmax denominator reduced twice)
#       tp_muon_shard     every TP cell: a TP-split matrix in params.1 (each
#                         rank's shard orthogonalized by itself; step 0 is right)
#       tp_shared_no_reduce every TP cell (the shared expert is TP-split
#                         whatever EP and ETP are): step 0's output of block 0,
#                         act.layers.0 (each TP rank keeps its hidden units'
#                         share of the shared expert's output)
#   - every other cell passes (PASS, or WARN for the informational one).
# Usage: tools/tp-fault-demo.sh FAULT [BUILD_DIR]   (default build-fault-FAULT)
#        PARITY_FAULT_CELLS="tp2 tp2-sp etp2 ..." runs only those cells
#        (`--cell` each) instead of the whole quick matrix.
# About 4 minutes on 2 cores (the build, then the quick matrix); run it
# under `flock /work/heavy.lock` on a shared machine.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
fault=${1:-}
case $fault in
tp_ce_log_tp | tp_wkv_no_reduce | tp_muon_shard | tp_shared_no_reduce) ;;
*) echo "usage: tools/tp-fault-demo.sh tp_ce_log_tp|tp_wkv_no_reduce|tp_muon_shard|tp_shared_no_reduce [BUILD_DIR]" >&2; exit 2 ;;
esac
bdir=${2:-$root/build-fault-$fault}
. "$root/tools/fault-lib.sh"
cells=
for c in ${PARITY_FAULT_CELLS:-}; do cells="$cells --cell $c"; done
# shellcheck disable=SC2086
fault_matrix tp-fault-demo "$fault" "$bdir" $cells
python3 - "$out/report.json" "$fault" <<'PY'
import json, math, re, sys
r = json.load(open(sys.argv[1]))
fault = sys.argv[2]

def reached(c):
    lay = c["layout"]
    return re.search(r"(?<!E)TP=", lay) is not None  # TP, not ETP

def first_effect(c):
    rc = c["root_cause"]
    t, f = rc["tensor"], rc["file"]
    if fault == "tp_wkv_no_reduce":
        return f == "step.0" and t.startswith("grad.") and t.endswith(".attn.wkv.weight")
    if fault == "tp_ce_log_tp":
        return f == "step.0" and t.startswith("out.") and "loss" in t
    if fault == "tp_shared_no_reduce":
        return f == "step.0" and t == "act.layers.0"
    return f == "params.1" and (".attn." in t or ".shared_experts." in t)

bad, n_hit = [], 0
for c in r["cells"]:
    if reached(c):
        n_hit += 1
        if c["result"] != "FAIL":
            bad.append("%s %s: %s, expected FAIL (the fault reaches it)" % (c["cell"], c["fixture"], c["result"]))
        elif not c["diagnosis"] or not c["root_cause"] or "first divergence" not in c["diagnosis"]:
            bad.append("%s %s: FAIL without a readable diagnosis: %r" % (c["cell"], c["fixture"], c["diagnosis"]))
        elif not first_effect(c):
            bad.append("%s %s: root cause %s %s is not the fault's first effect" %
                       (c["cell"], c["fixture"], c["root_cause"]["file"], c["root_cause"]["tensor"]))
    elif c["result"] not in ("PASS", "WARN") or (c["result"] == "WARN" and not c["informational"]):
        bad.append("%s %s: %s, expected PASS (the fault does not reach it)" % (c["cell"], c["fixture"], c["result"]))
if n_hit == 0:
    bad.append("no cell the fault reaches ran")
if bad:
    print("tp-fault-demo: FAILED:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
for c in r["cells"]:
    if c["result"] == "FAIL":
        print("FAIL %s %s: %s" % (c["cell"], c["fixture"], c["diagnosis"]))
print("tp-fault-demo: OK (%s): %d cells FAIL naming the root cause, %d other cells pass" %
      (fault, n_hit, len(r["cells"]) - n_hit))
PY
