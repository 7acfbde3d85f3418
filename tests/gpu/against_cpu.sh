#!/bin/sh
# The GPU route against the CPU golden (docs/gpu.md), in an offload build:
#   emulated  PARITY_GPU_EMULATE=1: the device copies are host buffers, the
#             kernels' device forms run as OpenMP host fallback, stale copies
#             are poison (a missing transfer shows as NaN or an abort);
#   real      the kernels on the GPU OpenMP sees; SKIP (exit 77, the reason
#             on stdout) when it sees none.
# Serial golden f64 and f32 (--device gpu) against the CPU golden under the
# f64 / f32 policy; parity run --device gpu refused (layouts not on the
# device path yet).
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
    # f64: the whole set; f32: the step.K pairs (docs/gpu-rollout.md: updated
    # f32 parameters with tiny AdamW steps are informational, as in the matrix)
    if [ $prec = f64 ]; then
        pairs="$T/cpu-$prec:$T/gpu-$prec"
    else
        pairs="$T/cpu-$prec/step.0.safetensors:$T/gpu-$prec/step.0.safetensors"
        pairs="$pairs $T/cpu-$prec/step.1.safetensors:$T/gpu-$prec/step.1.safetensors"
    fi
    for pr in $pairs; do
        "$P" compare "${pr%%:*}" "${pr#*:}" --policy $prec >"$T/cmp" 2>&1 ||
            fail "serial $prec on the $MODE GPU vs the CPU golden (${pr#*:}): $(tail -8 "$T/cmp")"
        echo "serial $prec ($MODE GPU) vs CPU golden, $(basename "${pr#*:}"): $(grep -m1 'EQUAL' "$T/cmp")"
    done
done

# layouts: refused on the device path (docs/gpu.md, "How far it goes")
"$P" run $G --device gpu --world-size 2 --dump "$T/dp2" >/dev/null 2>"$T/err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "layouts do not run on the device yet" "$T/err" ||
    fail "run --device gpu ($MODE): exit $rc, expected 2 and the layouts message: $(cat "$T/err")"
[ ! -e "$T/dp2" ] || fail "run --device gpu wrote its dump"
echo "layouts ($MODE GPU): refused with exit 2 (not on the device path yet)"
