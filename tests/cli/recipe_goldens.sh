#!/bin/sh
# Issue 32: the recipe goldens are pinned by sha256 (golden/recipes/PRESET-R.json): each is made
# again with the JSON's command and every file's sha256 must equal the pinned one.
# Usage: recipe_goldens.sh PATH/TO/parity [PRESET]   (PRESET: v4-tiny, the default, or v4-mini)
set -u
P=$(realpath "$1")
PRESET=${2:-v4-tiny}
G=$(realpath "$(dirname "$0")/../../golden/recipes")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
n=0
for pin in "$G/$PRESET"-*.json; do
  [ -f "$pin" ] || continue
  n=$((n + 1))
  r=$(basename "$pin" .json)
  r=${r#"$PRESET"-}
  # the pinned command, without its leading "parity"
  args=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["command"].split(" ", 1)[1])' "$pin")
  # shellcheck disable=SC2086 # the command's words
  "$P" $args --quiet --out "$W/$r" > "$W/$r.log" 2>&1 || { echo "FAIL: golden $r: $(tail -1 "$W/$r.log")"; fails=$((fails + 1)); continue; }
  if /usr/bin/python3 - "$pin" "$W/$r/manifest.json" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["files"]
got = json.load(open(sys.argv[2]))["files"]
bad = [f for f in sorted(set(want) | set(got)) if want.get(f) != got.get(f)]
print(f"{len(want)} files pinned, {len(bad)} differ" + (f": {', '.join(bad)}" if bad else ""))
sys.exit(1 if bad else 0)
PY
  then echo "ok: $PRESET $r"; else echo "FAIL: $PRESET $r"; fails=$((fails + 1)); fi
  rm -rf "${W:?}/$r"  # v4-mini sets are 823 MB each: one on disk at a time
done
[ "$n" -gt 0 ] || { echo "FAIL: no pins golden/recipes/$PRESET-*.json"; exit 1; }
echo "$n set(s), $fails failure(s)"
[ "$fails" -eq 0 ]
