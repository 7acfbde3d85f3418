#!/usr/bin/env bash
# Proves that a change moved no number: compares, cell by cell, the golden
# sets two `parity matrix --keep` runs left behind (the build before the
# change and the build after it) with `parity compare --policy bitwise`.
#
#   tools/bitwise-check.sh BEFORE_OUT AFTER_OUT [PARITY]
#
# BEFORE_OUT / AFTER_OUT: the --out directories of the two matrix runs (made
# with --keep so every cell's set is still there).  Cells are matched by
# name and data (the NN- numbering may differ when cells were added); a cell
# present on one side only is listed, not failed.  PARITY: the binary that
# compares (default build/parity).  Ends with "N passed, N failed"; exit 1
# when any common cell differs in any bit.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: tools/bitwise-check.sh BEFORE_OUT AFTER_OUT [PARITY]" >&2
  exit 2
fi
before=$1 after=$2
parity=${3:-build/parity}
for d in "$before/cells" "$after/cells"; do
  [ -d "$d" ] || { echo "bitwise-check: '$d' is not a matrix results directory" >&2; exit 2; }
done
key() { basename "$1" | sed 's/^[0-9]*-//'; }
declare -A after_of
for c in "$after"/cells/*/; do
  after_of[$(key "$c")]=${c%/}
done
passed=0 failed=0 only=0
for c in "$before"/cells/*/; do
  k=$(key "$c")
  b=${after_of[$k]:-}
  if [ -z "$b" ]; then
    echo "only before: $k"
    only=$((only + 1))
    continue
  fi
  unset "after_of[$k]"
  if [ ! -d "$c/set" ] || [ ! -d "$b/set" ]; then
    # cells that hand over another set (serial) or check without one
    if [ -d "$c/set" ] || [ -d "$b/set" ]; then
      echo "DIFF  $k: a set on one side only"
      failed=$((failed + 1))
    fi
    continue
  fi
  if out=$("$parity" compare "$c/set" "$b/set" --policy bitwise 2>&1); then
    echo "same  $k"
    passed=$((passed + 1))
  else
    echo "DIFF  $k"
    printf '%s\n' "$out" | head -8 | sed 's/^/      /'
    failed=$((failed + 1))
  fi
done
# the serial references the matrix made (cells that hand them over keep no set)
for r in "$before"/ref/*/; do
  k=ref/$(basename "$r")
  [ -f "$r/manifest.json" ] || continue
  if [ ! -d "$after/$k" ]; then
    echo "only before: $k"
    continue
  fi
  if out=$("$parity" compare "$r" "$after/$k" --policy bitwise 2>&1); then
    echo "same  $k"
    passed=$((passed + 1))
  else
    echo "DIFF  $k"
    printf '%s\n' "$out" | head -8 | sed 's/^/      /'
    failed=$((failed + 1))
  fi
done
for k in "${!after_of[@]}"; do
  echo "only after: $k"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
