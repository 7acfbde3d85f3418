#!/bin/sh
# The GPU route against the CPU golden (docs/gpu.md), in an offload build:
#   emulated  PARITY_GPU_EMULATE=1: the device copies are host buffers, the
#             kernels' device forms run as OpenMP host fallback, stale copies
#             are poison (a missing transfer shows as NaN or an abort);
#   real      the kernels on the GPU OpenMP sees; SKIP (exit 77, the reason
#             on stdout) when it sees none.
# Serial golden f64 and f32 and layout cells (--device gpu) against the CPU
# golden under the f64 / f32 policy; the offload build's CPU mode bitwise the
# same as its own host loops of the default build's numerics (same code).
# Usage: against_cpu.sh PARITY emulated|real
P="$1"
MODE="$2"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ "$MODE" = emulated ]; then
    export PARITY_GPU_EMULATE=1
else
    unset PARITY_GPU_EMULATE
    if ! "$P" golden --steps 1 --quiet --device gpu --out "$T/probe" >/dev/null 2>"$T/probe.err"; then
        echo "SKIP: GPU cases not run: $(cat "$T/probe.err")"
        exit 77
    fi
fi
G="--preset v4-tiny --steps 2 --quiet"

for prec in f64 f32; do
    "$P" golden $G --precision $prec --device cpu --out "$T/cpu-$prec" >/dev/null 2>"$T/err" ||
        fail "golden cpu $prec: $(cat "$T/err")"
    "$P" golden $G --precision $prec --device gpu --out "$T/gpu-$prec" >"$T/gpu-$prec.log" 2>"$T/err" ||
        fail "golden gpu $prec ($MODE): $(cat "$T/err")"
    grep "^device: gpu" "$T/gpu-$prec.log" || fail "golden gpu $prec: no device line"
    "$P" compare "$T/cpu-$prec" "$T/gpu-$prec" --policy $prec >"$T/cmp" 2>&1 ||
        fail "serial $prec on the $MODE GPU vs the CPU golden: $(tail -8 "$T/cmp")"
    echo "serial $prec ($MODE GPU) vs CPU golden: $(grep -m1 -i 'max\|pass\|verdict' "$T/cmp")"
done

# layout cells (threads backend, several ranks sharing the device)
cell() { # name, then parity run's layout flags
    name=$1
    shift
    "$P" run $G --precision f64 --device gpu "$@" --dump "$T/$name" >"$T/$name.log" 2>"$T/err" ||
        fail "cell $name ($MODE GPU): $(cat "$T/err")"
    "$P" compare "$T/cpu-f64" "$T/$name" --policy f64 >"$T/cmp" 2>&1 ||
        fail "cell $name on the $MODE GPU vs the CPU golden: $(tail -8 "$T/cmp")"
    echo "cell $name ($MODE GPU) vs CPU golden: passed under f64"
}
cell dp2 --world-size 2
cell ep2 --world-size 2 --expert-model-parallel-size 2
