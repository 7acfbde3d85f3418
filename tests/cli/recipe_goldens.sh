#!/bin/sh
# Issue 32: the recipe goldens of v4-tiny are pinned by sha256 (golden/recipes/v4-tiny-R.json):
# each is made again and every file's sha256 must equal the pinned one.
# Usage: recipe_goldens.sh PATH/TO/parity
set -u
P=$(realpath "$1")
G=$(realpath "$(dirname "$0")/../../golden/recipes")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
for r in bf16 fp8 v4; do
  "$P" golden --preset v4-tiny --fixture tiny-boundary-mix --steps 3 --seed 1234 --precision f64 --recipe "$r" \
    --quiet --out "$W/$r" > "$W/$r.log" 2>&1 || { echo "FAIL: golden $r: $(tail -1 "$W/$r.log")"; fails=$((fails + 1)); continue; }
  if /usr/bin/python3 - "$G/v4-tiny-$r.json" "$W/$r/manifest.json" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["files"]
got = json.load(open(sys.argv[2]))["files"]
bad = [f for f in sorted(set(want) | set(got)) if want.get(f) != got.get(f)]
print(f"{len(want)} files pinned, {len(bad)} differ" + (f": {', '.join(bad)}" if bad else ""))
sys.exit(1 if bad else 0)
PY
  then echo "ok: v4-tiny $r"; else echo "FAIL: v4-tiny $r"; fails=$((fails + 1)); fi
done
echo "$fails failure(s)"
[ "$fails" -eq 0 ]
