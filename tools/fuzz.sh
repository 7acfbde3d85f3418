#!/usr/bin/env bash
# Fuzzes every parser a user can feed (tests/fuzz, docs/fuzzing.md) with
# clang's libFuzzer under AddressSanitizer + UndefinedBehaviorSanitizer, and
# prints executions, crashes and timeouts per target.
#
#   tools/fuzz.sh [--runs N] [--smoke] [--build DIR] [--jobs-timeout S] [TARGET...]
#
#   --runs N     executions per target (default 1000000, the campaign)
#   --smoke      2000 executions per target (what the test suite runs)
#   --build DIR  the clang build directory (default build-fuzz)
#
# A campaign is a heavy job: run it as `flock /work/heavy.lock bash tools/fuzz.sh`.
# New inputs go to DIR/corpus/TARGET (the checked-in corpus is only read);
# crashing inputs to DIR/artifacts/TARGET/ (crash-*, timeout-*, oom-*, leak-*).
# After a crash the target is restarted until the executions are done (at
# most 5 crashes each).  Exit 1 when any target crashed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD
runs=1000000
build=build-fuzz
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --smoke) runs=2000; shift ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ! command -v clang >/dev/null; then
  echo "fuzz: clang not found (bash tools/setup.sh --with-fuzz installs it)"; exit 2
fi
all=(safetensors manifest ckpt_metadata ckpt_sums config topology layout cli_args fixture bounds)
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
if [ ! -f "$build/build.ninja" ]; then
  CC=clang meson setup "$build" "$src" -Dfuzz=enabled -Db_sanitize=address,undefined -Db_lundef=false \
    -Dtests=disabled -Dmpi=disabled -Dbuildtype=debugoptimized >"$build.setup.log" 2>&1 ||
    { cat "$build.setup.log"; echo "fuzz: meson setup failed"; exit 2; }
  rm -f "$build.setup.log"
fi
ninja -C "$build" "${targets[@]/#/tests/fuzz/fuzz_}" >/dev/null || { echo "fuzz: build failed"; exit 2; }
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}:halt_on_error=1"
printf '%-14s %12s %8s %9s %6s %8s\n' target executions crashes timeouts ooms wall_s
bad=0
for t in "${targets[@]}"; do
  exe=$build/tests/fuzz/fuzz_$t
  work=$build/corpus/$t
  art=$build/artifacts/$t/
  mkdir -p "$work" "$art"
  done_runs=0 crashes=0 timeouts=0 ooms=0 tries=0
  t0=$(date +%s.%N)
  while [ $done_runs -lt "$runs" ] && [ $tries -lt 6 ]; do
    tries=$((tries + 1))
    before=$(ls "$art" | wc -l)
    log=$build/fuzz-$t.log
    "$exe" -runs=$((runs - done_runs)) -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$art" "$work" "$src/tests/fuzz/corpus/$t" "$src/tests/fuzz/crashes/$t" >"$log" 2>&1
    rc=$?
    n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    [ -z "$n" ] && n=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    done_runs=$((done_runs + ${n:-0}))
    [ $rc -eq 0 ] && break
    new=$(ls -t "$art" | head -$(( $(ls "$art" | wc -l) - before )))
    case "$new" in
      timeout-*) timeouts=$((timeouts + 1)) ;;
      oom-*) ooms=$((ooms + 1)) ;;
      *) crashes=$((crashes + 1)) ;;
    esac
    echo "fuzz: $t: $(echo "$new" | head -1) (see $log)" >&2
    [ -z "$new" ] && break # died without an artifact: do not loop
  done
  wall=$(echo "$(date +%s.%N) - $t0" | bc)
  printf '%-14s %12d %8d %9d %6d %8.1f\n' "$t" "$done_runs" "$crashes" "$timeouts" "$ooms" "$wall"
  [ $((crashes + timeouts + ooms)) -gt 0 ] && bad=1
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $bad
