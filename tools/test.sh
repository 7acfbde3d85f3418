#!/usr/bin/env bash
# The test command: installs what is missing, builds with warnings as errors,
# runs every registered test, and ends with one line "N passed, N failed"
# counting Criterion test cases (and each non-Criterion test as one).
# Usage: tools/test.sh [BUILD_DIR] [extra meson test args...]
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
dir=${1:-build}
shift || true
# PARITY_SETUP_ARGS: extra `meson setup` options (tools/sanitize.sh uses it).
if ! bash tools/build.sh "$dir" -Dwerror=true ${PARITY_SETUP_ARGS:-}; then
  echo "build failed"
  echo "0 passed, 1 failed"
  exit 1
fi
meson test -C "$dir" --print-errorlogs --num-processes 2 "$@"
rc=$?
python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, re, sys
passed = failed = 0
syn = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = (t.get("stdout") or "") + (t.get("stderr") or "")
    m = syn.search(out)
    res = t.get("result")
    if m and res in ("OK", "FAIL"):
        p, f, c = int(m.group(2)), int(m.group(3)), int(m.group(4))
        passed += p
        failed += f + c
        if res == "FAIL" and f + c == 0:
            failed += 1
    elif res == "OK":
        passed += 1
    elif res == "SKIP":
        why = [l for l in out.splitlines() if l.startswith("SKIP")]
        print(f"skipped: {t.get('name')}: {why[0] if why else 'no reason given'}")
    else:
        failed += 1
print(f"{passed} passed, {failed} failed")
PY
exit $rc
