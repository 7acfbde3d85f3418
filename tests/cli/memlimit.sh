#!/bin/sh
# Issue 13 item 3: absurd sizes are refused BEFORE anything is allocated, by
# the memory estimate (parallel/plan/memcheck.h): exit 2, the estimate in bytes,
# nothing written; `--max-memory` lowers the limit; a normal run still runs.
# Usage: memlimit.sh PARITY
P="$1"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

check() { # cmd, then arguments
    cmd=$1
    shift
    rm -rf "$T/out" "$T/dump"
    if [ "$cmd" = golden ]; then
        "$P" golden --steps 1 --quiet --out "$T/out" "$@" >"$T/stdout" 2>"$T/stderr"
    else
        "$P" run --steps 1 --quiet --dump "$T/dump" "$@" >"$T/stdout" 2>"$T/stderr"
    fi
    rc=$?
    [ "$rc" -eq 2 ] || fail "$cmd $*: exit $rc, expected 2 ($(cat "$T/stderr"))"
    # a value outside its key's range (item 2, docs/hostile-input.md) is refused by that rule
    # first, before any estimate or allocation; a value in range by the estimate
    if ! grep -q "parity $cmd: config: .* must be <= [0-9]*, got [0-9]*" "$T/stderr"; then
        grep -q "parity $cmd: memory: this run needs .* [0-9][0-9]* bytes" "$T/stderr" ||
            fail "$cmd $*: no estimate in bytes: $(cat "$T/stderr")"
        grep -q "nothing was allocated" "$T/stderr" || fail "$cmd $*: $(cat "$T/stderr")"
    fi
    [ ! -e "$T/out" ] && [ ! -e "$T/dump" ] || fail "$cmd $*: something was written"
    ls "$T" | grep -q "tmp-" && fail "$cmd $*: a temporary was left"
    return 0
}

for cmd in run golden; do
    check $cmd --global-batch-size 1000000
    check $cmd --global-batch-size 100000000
    check $cmd --set hc_sinkhorn_iters=2000000000  # the backward recomputes 2 iters [n, n] per token
    check $cmd --set n_routed_experts=1000000
    check $cmd --set window_size=2147483647
    check $cmd --set index_topk=2147483647
    check $cmd --max-memory 10MB
done
check run --world-size 4 --expert-model-parallel-size 2 --max-memory 20MB

"$P" run --steps 1 --quiet --max-memory 12XB >/dev/null 2>"$T/stderr"
[ $? -eq 2 ] && grep -q "max-memory '12XB' is not a size" "$T/stderr" || fail "bad size: $(cat "$T/stderr")"
# a normal run under a limit it fits
"$P" run --steps 1 --quiet --world-size 2 --max-memory 2GB >/dev/null 2>"$T/stderr" || fail "tiny run: $(cat "$T/stderr")"
"$P" golden --steps 1 --quiet --max-memory 2GB --out "$T/g" >/dev/null 2>"$T/stderr" || fail "tiny golden: $(cat "$T/stderr")"
echo "ok"
