#!/bin/sh
# --device on golden / run / matrix: a bad name and gpu where it cannot run
# are refused with exit 2, one message, nothing written; --device cpu runs.
# Usage: device_flag.sh PARITY OFFLOAD(none|nvptx)
P="$1"
OFF="$2"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

refused() { # expected message, then the command's arguments
    want=$1
    shift
    "$P" "$@" >"$T/stdout" 2>"$T/stderr"
    rc=$?
    [ "$rc" -eq 2 ] || fail "$*: exit $rc, expected 2 ($(cat "$T/stderr"))"
    grep -q -- "$want" "$T/stderr" || fail "$*: stderr lacks '$want': $(cat "$T/stderr")"
    [ ! -e "$T/out" ] || fail "$*: something was written"
}

refused "the choices are cpu and gpu" golden --steps 1 --quiet --device tpu --out "$T/out"
refused "the choices are cpu and gpu" run --steps 1 --quiet --device tpu --dump "$T/out"
refused "the choices are cpu and gpu" matrix --quick --device tpu --out "$T/out"
refused "backend mpi" matrix --quick --device gpu --backend mpi --out "$T/out"
if [ "$OFF" = none ]; then
    why="this build has no GPU offload"
else
    why="OpenMP sees no offload device"
    export OMP_TARGET_OFFLOAD=disabled # no device here, whatever the machine has
fi
refused "$why" golden --steps 1 --quiet --device gpu --out "$T/out"
refused "$why" run --steps 1 --quiet --device gpu --dump "$T/out"
refused "$why" matrix --quick --device gpu --out "$T/out"

"$P" golden --steps 1 --quiet --device cpu --out "$T/g" >"$T/stdout" 2>"$T/stderr" ||
    fail "golden --device cpu: $(cat "$T/stderr")"
"$P" golden --steps 1 --quiet --out "$T/h" >/dev/null 2>&1 || fail "golden"
"$P" compare "$T/g" "$T/h" --policy bitwise >"$T/cmp" 2>&1 ||
    fail "--device cpu is not the default's numerics: $(tail -5 "$T/cmp")"
echo "device flag: refusals and --device cpu checked (build offload=$OFF)"
