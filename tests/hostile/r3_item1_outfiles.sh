#!/usr/bin/env bash
# Issue 34 item 1: single-file outputs (run --summary / --trace, matrix
# --report .md / .json, compare --json, plan --json, schedule --svg /
# --trace, ckpt export FILE) never replace a file parity did not write, nor a
# symlink; parity's own files are replaced; --overwrite replaces a foreign
# file (never a link).  Usage: r3_item1_outfiles.sh path/to/parity
. "$(dirname "$0")/lib.sh"

same() { # same FILE TEXT: FILE is a regular file holding exactly TEXT
  [ -f "$1" ] && [ ! -L "$1" ] && [ "$(cat "$1")" = "$2" ]
}
foreign() { # foreign FILE FLAG CMD...: refused (exit 2, names FILE), FILE untouched
  local f=$1 flag=$2
  shift 2
  echo "my own $f" >"$f"
  expect 2 "$flag $f: the file exists and was not written by parity" "$@"
  check "$f still holds the user's text" same "$f" "my own $f"
  ln -sf "$f" "link-$f"
  local args=() a
  for a in "$@"; do [ "$a" = "$f" ] && args+=("link-$f") || args+=("$a"); done
  expect 2 "is a symbolic link" "${args[@]}"
  check "link-$f is still a link to $f" test "$(readlink "link-$f")" = "$f"
  args+=(--overwrite)
  expect 2 "is a symbolic link" "${args[@]}"
  check "no temporary left next to $f" test -z "$(ls | grep -F "$f.tmp-")"
}

# ---- run --summary, run --trace (also makes the checkpoint and a golden set)
foreign notes.json --summary "$P" run --preset v4-tiny --steps 1 --summary notes.json
foreign tr.json --trace "$P" run --preset v4-tiny --steps 1 --trace tr.json
expect 0 "" "$P" run --preset v4-tiny --steps 1 --summary s.json --trace t.json --save ck --dump g --quiet
expect 0 "" "$P" run --preset v4-tiny --steps 1 --summary s.json --trace t.json --quiet
check "run replaced its own summary" grep -q '"format":[[:space:]]*"parity-run-summary"' s.json
check "the trace says parity wrote it" grep -q '"generator": "parity"' t.json
expect 0 "" "$P" run --preset v4-tiny --steps 1 --summary notes.json --overwrite --quiet
check "--overwrite replaced notes.json" grep -q parity-run-summary notes.json
# a golden set's own file is not a single-file output
expect 2 "was not written by parity" "$P" run --preset v4-tiny --steps 1 --summary g/manifest.json --quiet

# ---- compare --json
foreign cmp.json --json "$P" compare g g --json cmp.json
expect 0 "" "$P" compare g g --json c.json
expect 0 "" "$P" compare g g --json c.json
check "compare replaced its own report" grep -q '"format":[[:space:]]*"parity-compare"' c.json

# ---- plan --json
foreign plan.json --json "$P" plan --json plan.json
expect 0 "" "$P" plan --json p.json
expect 0 "" "$P" plan --json p.json
check "plan replaced its own report" grep -q '"format":[[:space:]]*"parity-plan"' p.json

# ---- schedule --svg / --trace
S=("$P" schedule --pipeline-schedule 1f1b --pipeline-model-parallel-size 2 --microbatches 4)
foreign pic.svg --svg "${S[@]}" --svg pic.svg
foreign perf.json --trace "${S[@]}" --trace perf.json
expect 0 "" "${S[@]}" --svg a.svg --trace a.json
expect 0 "" "${S[@]}" --svg a.svg --trace a.json
# a run's trace and a schedule's are both parity traces
expect 0 "" "${S[@]}" --trace t.json

# ---- ckpt export FILE
foreign weights.safetensors FILE "$P" ckpt export ck weights.safetensors
check "ckpt export writes e.safetensors" "$P" ckpt export ck e.safetensors
check "ckpt export replaces its own e.safetensors" "$P" ckpt export ck e.safetensors
# a golden set's safetensors file is not an export
cp g/params.0.safetensors p0.safetensors 2>/dev/null || cp "$(ls g/params.*.safetensors | head -1)" p0.safetensors
expect 2 "was not written by parity" "$P" ckpt export ck p0.safetensors
check "ckpt export --overwrite replaces p0.safetensors" "$P" ckpt export ck p0.safetensors --overwrite

# ---- matrix --report .md / .json (the issue's reproducer first)
echo "my readme" >README.md
expect 2 "--report README.md: the file exists and was not written by parity" \
  "$P" matrix --quick --cell serial-f64 --report README.md --out m --quiet
check "README.md untouched" same README.md "my readme"
ln -s README.md link.md
expect 2 "is a symbolic link" "$P" matrix --quick --cell serial-f64 --report link.md --out m --quiet
check "link.md is still a link" test -L link.md
echo '{"mine": 1}' >mine.json
expect 2 "--report mine.json: the file exists and was not written by parity" \
  "$P" matrix --quick --cell serial-f64 --report mine.json --out m --quiet
expect 0 "" "$P" matrix --quick --cell serial-f64 --report r.md --out m --quiet
check "the Markdown report starts with its header" test "$(head -1 r.md)" = "# parity matrix"
cp m/report.json r.json
expect 0 "" "$P" matrix --quick --cell serial-f64 --report r.json --out m --quiet
expect 0 "" "$P" matrix --quick --cell serial-f64 --report r.md --out m --quiet
# ---- matrix --report .xml (JUnit): its own file replaced, another tool's refused
expect 0 "" "$P" matrix --quick --cell serial-f64 --report r.xml --out m --quiet
expect 0 "" "$P" matrix --quick --cell serial-f64 --report r.xml --out m --quiet
printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="pytest">\n' >theirs.xml
expect 2 "--report theirs.xml: the file exists and was not written by parity" \
  "$P" matrix --quick --cell serial-f64 --report theirs.xml --out m --quiet
finish
