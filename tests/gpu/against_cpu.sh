#!/bin/sh
# The GPU route against the CPU golden (docs/gpu.md), in an offload build:
#   emulated  PARITY_GPU_EMULATE=1: the device copies are host buffers, the
#             kernels' device forms run as OpenMP host fallback, stale copies
#             are poison (a missing transfer shows as NaN or an abort);
#   real      the kernels on the GPU OpenMP sees; SKIP (exit 77, the reason
#             on stdout) when it sees none.
# Serial golden f64 and f32 (--device gpu) against the CPU golden under the
# f64 / f32 policy; then layout cells of the quick tier (below).
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

# layouts (docs/gpu.md "The parallel layer on the device path"): quick-tier
# matrix cells on the device.  Each must PASS against the serial reference
# run on the device (the matrix's verdict), and its set must pass against the
# CPU golden of the same data (a CPU matrix of the same cells, kept): f64
# cells under the f64 policy, f32 cells' step.K under the f32 policy.
# PARITY_GPU_CELLS: the cells (default a few; "all": every quick cell);
# PARITY_GPU_FIXTURE: the fixture (default tiny-boundary-mix; "all": every one).
CELLS=${PARITY_GPU_CELLS:-"dp2 pp2-1f1b ep2 tp2"}
FIX=${PARITY_GPU_FIXTURE:-tiny-boundary-mix}
sel=""
[ "$CELLS" = all ] || for c in $CELLS; do sel="$sel --cell $c"; done
[ "$FIX" = all ] || sel="$sel --fixture $FIX"
# The CPU side only makes the CPU goldens: threads ranks, and not the cells of
# their own fiber backend (they compare fiber with threads; their data's
# goldens come from the other cells, or the cell is judged by the matrix only)
cpu_matrix() { # $1: its number; the rest: the cell selection
    i=$1
    shift
    "$P" matrix --quick --device cpu --backend threads --keep --quiet "$@" --out "$T/mcpu$i" >"$T/mcpu$i.log" 2>&1 ||
        fail "matrix cpu: $(tail -5 "$T/mcpu$i.log")"
}
if [ "$CELLS" = all ]; then # at most 64 --cell options a run: in runs of 40
    fsel=""
    [ "$FIX" = all ] || fsel="--fixture $FIX"
    "$P" matrix --quick --list | awk 'NR > 1 {print $2}' | sort -u | grep -v '^fiber-' >"$T/cells"
    split -l 40 "$T/cells" "$T/cells."
    i=0
    for part in "$T"/cells.*; do
        i=$((i + 1))
        cpu_matrix $i $fsel $(sed 's/^/--cell /' "$part")
    done
else
    cpu_matrix 1 $sel
fi
"$P" matrix --quick --device gpu --keep $sel --out "$T/mgpu" >"$T/mgpu.log" 2>&1 ||
    fail "matrix gpu ($MODE): $(grep -E 'FAIL|ERROR|error' "$T/mgpu.log" | head -5)"
grep "^device: gpu" "$T/mgpu.log" || fail "matrix gpu: no device line"
# a pipeline cell's hand-offs move device memory between the ranks (docs/gpu.md "Collectives on one device")
if grep -qE "^\[ *[0-9]+/[0-9]+\] pp[0-9]" "$T/mgpu.log" &&
    grep "^device: gpu" "$T/mgpu.log" | grep -q "between ranks: device to device 0.00 MiB"; then
    fail "matrix gpu: pipeline cells ran, but no device-to-device copy between ranks"
fi
grep -E "^[0-9]+ cells: " "$T/mgpu.log"
n=0
for set in "$T"/mgpu/cells/*/set; do
    [ -d "$set" ] || continue
    cell=$(basename "$(dirname "$set")")
    if ! ref=$(sh "$(dirname "$0")/cpu_ref.sh" "$set" "$T"/mcpu*/ref); then
        echo "$cell: no CPU golden of the same data (its own data source): judged by the matrix only"
        continue
    fi
    prec=$(grep -o '"precision":[[:space:]]*"f[0-9]*"' "$set/manifest.json" | head -1 | grep -o 'f[0-9][0-9]*')
    [ -n "$prec" ] || fail "$cell: no precision in its manifest"
    for f in "$set"/*.safetensors; do
        b=$(basename "$f")
        [ -f "$ref/$b" ] || continue
        case "$prec:$b" in f32:params.*) continue ;; esac # informational in f32 (above)
        "$P" compare "$ref/$b" "$f" --policy "$prec" >"$T/cmp" 2>&1 ||
            fail "$cell ($MODE GPU) vs the CPU golden, $b: $(tail -8 "$T/cmp")"
        n=$((n + 1))
    done
done
[ "$n" -gt 0 ] || fail "no layout set compared with the CPU golden"
echo "layouts ($MODE GPU): every cell PASS; $n files of their sets pass against the CPU golden"
