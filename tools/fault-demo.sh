#!/bin/sh
# tools/fault-demo.sh - the matrix catches a deliberately broken build
# (issue 10's acceptance; docs/matrix.md "Fault demonstration").
#
# Builds parity with -Dfault=cp_halo_short (the CP halo exchange hands
# attention one row short: src/parallel/cp.c, #if PAR_FAULT_CP_HALO_SHORT) in
# its own build directory, runs `parity matrix --quick`, and checks that
#   - the matrix exits 1,
#   - every cell whose layout has CP > 1 (cp2, cp4 on every fixture, the
#     reshard pair that loads into CP=2) FAILs with a diagnosis line naming
#     the worst tensor -- except cp2 on tiny-half-boundary, whose samples all
#     end at S/2: no attention window crosses the CP2 split, the halo is
#     never read, so the fault cannot show there (it must PASS),
#   - every other cell passes (PASS, or WARN for the informational one).
# Usage: tools/fault-demo.sh [BUILD_DIR]   (default build-fault-cp_halo_short)
# Takes about 3 minutes on 2 cores (the build, then ~1 minute of matrix).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
bdir=${1:-$root/build-fault-cp_halo_short}
out=$(mktemp -d /tmp/parity-fault-demo-XXXXXX)
trap 'rm -rf "$out"' EXIT
cd "$root"
if [ ! -d "$bdir" ]; then
    meson setup "$bdir" -Dfault=cp_halo_short -Dtests=disabled -Dmpi=disabled >/dev/null
else
    meson configure "$bdir" -Dfault=cp_halo_short >/dev/null
fi
ninja -C "$bdir" -j2 parity >/dev/null
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
set +e
"$bdir/parity" matrix --quick --quiet --out "$out/m" --report "$out/report.json" >"$out/table.txt" 2>"$out/stderr.txt"
rc=$?
set -e
cat "$out/table.txt"
if [ "$rc" -ne 1 ]; then
    echo "fault-demo: FAILED: the broken build's matrix exited $rc, expected 1" >&2
    cat "$out/stderr.txt" >&2
    exit 1
fi
python3 - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = []
n_cp = 0
untouched = {("cp2", "tiny-half-boundary")}  # samples end at S/2: the CP2 halo is never read
for c in r["cells"]:
    cp = "CP=" in c["layout"]
    if (c["cell"], c["fixture"]) in untouched:
        if c["result"] != "PASS":
            bad.append("%s %s: %s, expected PASS (no sample crosses the CP split)" % (c["cell"], c["fixture"], c["result"]))
    elif cp:
        n_cp += 1
        if c["result"] != "FAIL":
            bad.append("%s %s: %s, expected FAIL (CP layout)" % (c["cell"], c["fixture"], c["result"]))
        elif not c["diagnosis"] or not c["worst"] or "entries fail" not in c["diagnosis"]:
            bad.append("%s %s: FAIL without a readable diagnosis: %r" % (c["cell"], c["fixture"], c["diagnosis"]))
    elif c["result"] not in ("PASS", "WARN") or (c["result"] == "WARN" and not c["informational"]):
        bad.append("%s %s: %s, expected PASS (no CP in the layout)" % (c["cell"], c["fixture"], c["result"]))
if n_cp == 0:
    bad.append("no CP cell ran")
if bad:
    print("fault-demo: FAILED:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
ex = next(c for c in r["cells"] if "CP=" in c["layout"])
print("fault-demo: OK: %d CP cells FAIL, %d other cells pass (%d of them CP cells the fault cannot reach); e.g. %s %s: %s"
      % (n_cp, len(r["cells"]) - n_cp, len(untouched), ex["cell"], ex["fixture"], ex["diagnosis"]))
PY
