#!/usr/bin/env bash
# No host pointer is dereferenced inside a kernel's target region (docs/gpu.md
# "Device loops read no host memory"; a meson test, suite 'build').
#
# A pointer that a target region uses without is_device_ptr / map gets an
# implicit zero-length map: on a GPU it is the device twin of a mapped block or
# NULL, never the host address.  The host fallback and the emulated device run
# the region on the host, where the address works, so only a real device shows
# it (the first GPU run, 4 December 2026: `cuCtxSynchronize error: an illegal
# memory access` in par_indexer_select, which read dm->fp4_index in its loop).
# This check finds every such pointer at compile time: each source with a
# target construct is compiled as in BUILD (its compile_commands.json) with
# -fopenmp -DPAR_OFFLOAD=1 and GCC's omplower dump, and every implicit
# zero-length map ("map(alloc:MEM[(char *)P] [len: 0])") is reported with its
# region (the offload compiler is not needed: gimplification decides the maps).
# Usage: check-offload-maps.sh [BUILD]   (default: build); "N passed, N failed".
#        check-offload-maps.sh --selftest   (a seeded host-pointer read is found, a clean region passes)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --selftest ]; then
  S=$(mktemp -d) || exit 1
  mkdir -p "$S/src"
  cat >"$S/src/seeded.c" <<'C'
typedef struct { long n; double f; } dims;
void seeded(double *x, const dims *dm, long n)
{
#pragma omp target teams distribute parallel for is_device_ptr(x)
    for (long i = 0; i < n; i++)
        x[i] *= dm->f;
}
C
  cat >"$S/src/clean.c" <<'C'
typedef struct { long n; double f; } dims;
void clean(double *x, const dims *dm, long n)
{
    const double f = dm->f;
#pragma omp target teams distribute parallel for is_device_ptr(x)
    for (long i = 0; i < n; i++)
        x[i] *= f;
}
C
  printf '[{"directory": "%s", "file": "src/seeded.c", "command": "gcc -std=c11 -O2 -o seeded.o -c src/seeded.c"},\n {"directory": "%s", "file": "src/clean.c", "command": "gcc -std=c11 -O2 -o clean.o -c src/clean.c"}]\n' \
    "$S" "$S" >"$S/compile_commands.json"
  out=$(bash "$0" "$S" 2>&1)
  rm -rf "$S"
  if echo "$out" | grep -q "seeded.c: seeded._omp_fn.0: the target region uses host pointer 'dm'" &&
     ! echo "$out" | grep -q "clean.c:" && echo "$out" | grep -q "2 translation units"; then
    echo "1 passed, 0 failed"; exit 0
  fi
  echo "selftest: the seeded read was not reported as expected:"; echo "$out"; echo "0 passed, 1 failed"; exit 1
fi
BUILD=${1:-build}
[ -f "$BUILD/compile_commands.json" ] || { echo "check-offload-maps: no $BUILD/compile_commands.json" >&2; exit 2; }
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
python3 - "$BUILD" "$T" <<'PY'
import json, os, re, shlex, subprocess, sys
build, tmp = sys.argv[1], sys.argv[2]
target = re.compile(r"PAR_KLOOP|PAR_KSERIAL|#\s*pragma\s+omp\s+target")
seen, units, bad = set(), 0, []
for n, c in enumerate(json.load(open(os.path.join(build, "compile_commands.json")))):
    src = os.path.normpath(os.path.join(c["directory"], c["file"]))
    if "/src/" not in src or not src.endswith(".c"):
        continue
    if not target.search(open(src, errors="replace").read()):
        continue
    args = shlex.split(c["command"])
    keep, skip = [], 0
    for a in args:  # drop the outputs and dependency files; keep defines, includes, flags
        if skip:
            skip -= 1
            continue
        if a in ("-o", "-MQ", "-MF", "-MT"):
            skip = 1
            continue
        if a in ("-MD", "-MMD", "-c") or a.startswith("-foffload") or a.startswith("-Werror"):
            continue
        keep.append(a)
    d = os.path.join(tmp, str(n))
    os.makedirs(d)
    cmd = keep[:-1] + ["-fopenmp", "-foffload=disable", "-DPAR_OFFLOAD=1", "-fdump-tree-omplower",
                       "-dumpdir", d + "/", "-c", keep[-1], "-o", os.path.join(d, "x.o")]
    r = subprocess.run(cmd, cwd=c["directory"], capture_output=True, text=True)
    if r.returncode:
        print(f"check-offload-maps: {src}: did not compile:\n{r.stderr[-2000:]}")
        sys.exit(1)
    units += 1
    for f in os.listdir(d):
        if not f.endswith("omplower"):
            continue
        for line in open(os.path.join(d, f), errors="replace"):
            if "pragma omp target" not in line:
                continue
            fn = re.search(r"child fn: (\S+)", line)
            for v in re.findall(r"map\(\w+:MEM\[\(char \*\)(\w+)\] \[len: 0\]\)", line):
                key = (os.path.relpath(src), fn.group(1) if fn else "?", v)
                if key not in seen:
                    seen.add(key)
                    bad.append(key)
if units == 0:
    print("check-offload-maps: no source with a target region found (a renamed macro?)")
    sys.exit(1)
for src, fn, v in bad:
    print(f"{src}: {fn}: the target region uses host pointer '{v}' (implicit zero-length map): "
          "list it in is_device_ptr, or read what the loop needs from it into locals before the region")
print(f"check-offload-maps: {units} translation units with target regions; "
      f"{len(bad)} regions using a host pointer")
sys.exit(1 if bad else 0)
PY
rc=$?
if [ $rc -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit $rc
