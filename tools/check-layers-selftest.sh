#!/usr/bin/env bash
# Shows that tools/check-layers.sh catches what it is for: on a copy of the tree, each seeded
# violation below must make it fail (and name the rule), and the unchanged copy must pass.
# A meson test (suite 'build', build_layers_selftest).  Ends with "N passed, N failed".
set -uo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
fresh() {
  rm -rf "$tmp/t" && mkdir -p "$tmp/t/tools" &&
    cp -r "$root/src" "$root/backends" "$tmp/t/" && cp "$root/tools/check-layers.sh" "$tmp/t/tools/"
}
# expect NAME RULE-WORD FILE LINE: LINE appended to FILE must fail check-layers with RULE-WORD
expect() {
  local name=$1 word=$2 file=$3 line=$4 out
  fresh
  mkdir -p "$(dirname "$tmp/t/$file")"
  printf '%s\n' "$line" >>"$tmp/t/$file"
  if out=$(bash "$tmp/t/tools/check-layers.sh" "$tmp/t" 2>&1); then
    echo "FAIL $name: check-layers passed"
    failed=$((failed + 1))
  elif ! grep -q "$word" <<<"$out"; then
    echo "FAIL $name: failed without naming '$word':"; printf '%s\n' "$out" | head -5
    failed=$((failed + 1))
  else
    echo "ok   $name"
    passed=$((passed + 1))
  fi
}
fresh
if bash "$tmp/t/tools/check-layers.sh" "$tmp/t" >/dev/null 2>&1; then
  echo "ok   the unchanged tree passes"; passed=$((passed + 1))
else
  echo "FAIL the unchanged tree fails"; failed=$((failed + 1))
fi
expect "a room includes a room above it" "room rule" src/parallel/layout/layout.c '#include "parallel/step/exec.h"'
expect "tp includes cp" "room rule" src/parallel/tp/tp_attn.c '#include "parallel/cp/cp.h"'
expect "parallel includes the matrix" "layer rule" src/parallel/train/run.c '#include "matrix/matrix.h"'
expect "model includes parallel" "layer rule" src/model/model.c '#include "parallel/layout/layout.h"'
expect "an -impl.h from outside its folder" "impl rule" src/parallel/train/run.c '#include "parallel/step/exec-impl.h"'
expect "a folder without a rule" "has no rule" src/parallel/newroom/x.c '/* a new room */'
expect "an include circle inside a room" "include circle" src/parallel/layout/pplayout.h '#include "parallel/layout/layout.h"'
expect "exit() in library code" "library rule" src/parallel/dp/zero.c 'static void die(void) { exit(1); }'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
