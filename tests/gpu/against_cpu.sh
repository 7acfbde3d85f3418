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

# PARITY_GPU_SERIAL=0: the layouts only
for prec in $([ "${PARITY_GPU_SERIAL:-1}" = 0 ] || echo f64 f32); do
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
    mkdir -p "$T/cmpjson/00-serial-$prec"
    for pr in $pairs; do
        "$P" compare "${pr%%:*}" "${pr#*:}" --policy $prec \
            --json "$T/cmpjson/00-serial-$prec/$(basename "${pr#*:}").json" >"$T/cmp" 2>&1 ||
            fail "serial $prec on the $MODE GPU vs the CPU golden (${pr#*:}): $(tail -8 "$T/cmp")"
        echo "serial $prec ($MODE GPU) vs CPU golden, $(basename "${pr#*:}"): $(grep -m1 'EQUAL' "$T/cmp")"
    done
    # the emulated device runs the device forms of the loops on the host: the same operations as
    # the CPU's (the device GEMM's per-element chain, model/optim_gpu.c's batches keep each
    # matrix's), so its serial golden is the CPU's bit for bit (a real GPU's libm and contractions
    # are judged by the policy above)
    if [ "$MODE" = emulated ]; then
        "$P" compare "$T/cpu-$prec" "$T/gpu-$prec" --policy bitwise >"$T/cmp" 2>&1 ||
            fail "serial $prec on the emulated GPU is not bitwise the CPU golden: $(tail -8 "$T/cmp")"
        echo "serial $prec (emulated GPU) vs CPU golden, bitwise: $(grep -m1 'EQUAL' "$T/cmp")"
    fi
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
# The GPU matrix, within PARITY_GPU_BUDGET seconds (or until PARITY_GPU_DEADLINE, epoch s) when set
# (the lent machine's check: what ran in the budget is still compared and tabulated; the run then
# ends INCOMPLETE, exit 3).  PARITY_GPU_JOBS matrix processes share the device, each with a part
# of the cells (round robin by name; default 1 emulated, on a real device up to 4, a quarter of
# the CPUs: a launch-bound run on one GPU overlaps their host-side launch costs).  A failing cell
# or file does not stop the checks: every failure is listed, then the exit is 1.
bad=0
note() { echo "FAIL: $*" >&2; bad=$((bad + 1)); }
incomplete=0
if [ -n "${PARITY_GPU_DEADLINE:-}" ] && [ -z "${PARITY_GPU_BUDGET:-}" ]; then # what is left (at least 30 s)
    PARITY_GPU_BUDGET=$((PARITY_GPU_DEADLINE - $(date +%s)))
    [ "$PARITY_GPU_BUDGET" -ge 30 ] || PARITY_GPU_BUDGET=30
    echo "matrix gpu ($MODE): $PARITY_GPU_BUDGET s left for it"
fi
jobs=${PARITY_GPU_JOBS:-}
if [ -z "$jobs" ]; then
    jobs=1
    [ "$MODE" = emulated ] || jobs=$(( $(nproc) / 4 > 4 ? 4 : ($(nproc) / 4 > 1 ? $(nproc) / 4 : 1) ))
fi
gpu_matrix() { # $1: the part; the rest: its cell selection
    j=$1
    shift
    set -- "$P" matrix --quick --device gpu --keep "$@" --out "$T/mgpu$j"
    if [ -n "${PARITY_GPU_BUDGET:-}" ]; then
        timeout "$PARITY_GPU_BUDGET" "$@" >"$T/mgpu$j.log" 2>&1
    else
        "$@" >"$T/mgpu$j.log" 2>&1
    fi
    echo $? >"$T/mgpu$j.rc"
}
if [ "$jobs" -le 1 ]; then
    gpu_matrix 1 $sel
else # the cells' names, round robin into the parts (each part runs its names on the fixtures of $FIX)
    fsel=""
    [ "$FIX" = all ] || fsel="--fixture $FIX"
    if [ "$CELLS" = all ]; then
        "$P" matrix --quick --list | awk 'NR > 1 {print $2}' | sort -u >"$T/gcells"
    else
        printf '%s\n' $CELLS >"$T/gcells"
    fi
    echo "matrix gpu ($MODE): $(wc -l <"$T/gcells") cells' names in $jobs processes on the device"
    j=1
    while [ $j -le "$jobs" ]; do
        part=$(awk -v j=$j -v n="$jobs" '(NR - 1) % n == j - 1 {printf " --cell %s", $1}' "$T/gcells")
        [ -z "$part" ] || gpu_matrix $j $fsel $part &
        j=$((j + 1))
    done
    wait
fi
cat "$T"/mgpu[0-9]*.log >"$T/mgpu.log"
if [ -n "${PARITY_GPU_TABLE:-}" ]; then # the GPU matrix's own output beside the table
    cp "$T/mgpu.log" "$(dirname "$PARITY_GPU_TABLE")/gpu-matrix.log"
    for r in "$T"/mgpu[0-9]*/report.json; do
        [ -f "$r" ] && cp "$r" "$(dirname "$PARITY_GPU_TABLE")/gpu-matrix-$(basename "$(dirname "$r")" | sed 's/mgpu//').json"
    done
fi
for rcf in "$T"/mgpu[0-9]*.rc; do
    j=$(basename "$rcf" .rc | sed 's/mgpu//')
    rc=$(cat "$rcf")
    if [ "$rc" -eq 124 ]; then
        incomplete=1
        echo "matrix gpu ($MODE) part $j: stopped at the budget of ${PARITY_GPU_BUDGET} s after" \
             "$(grep -cE '^\[ *[0-9]+/[0-9]+\] .* (PASS|FAIL|ERROR|WARN)' "$T/mgpu$j.log") cells"
    elif [ "$rc" -ne 0 ]; then
        note "matrix gpu ($MODE) part $j, exit $rc: $(grep -E 'FAIL|ERROR|error' "$T/mgpu$j.log" | head -5)"
    fi
done
if [ $incomplete -eq 0 ]; then
    grep "^device: gpu" "$T/mgpu.log" || note "matrix gpu: no device line"
    # a pipeline cell's hand-offs move device memory between the ranks (docs/gpu.md "Collectives on one device")
    for lg in "$T"/mgpu[0-9]*.log; do
        if grep -qE "^\[ *[0-9]+/[0-9]+\] pp[0-9]" "$lg" &&
            grep "^device: gpu" "$lg" | grep -q "between ranks: device to device 0.00 MiB"; then
            note "matrix gpu: pipeline cells ran, but no device-to-device copy between ranks ($(basename "$lg"))"
        fi
    done
    grep -E "^[0-9]+ cells: " "$T/mgpu.log"
    # dp2 alone: its gradient sums move device memory between the ranks, more of it than
    # stays on the host (docs/gpu-collectives.md; all on the host before, 12 MiB)
    if [ "$CELLS" = all ] || echo " $CELLS " | grep -q " dp2 "; then
        "$P" matrix --quick --device gpu --cell dp2 --fixture tiny-boundary-mix --out "$T/mdp2" >"$T/mdp2.log" 2>&1 ||
            note "matrix gpu dp2 alone, exit $?: $(tail -3 "$T/mdp2.log")"
        between=$(grep "^device: gpu" "$T/mdp2.log" | sed -n 's/.*between ranks: device to device \([0-9.]*\) MiB.* on the host \([0-9.]*\) MiB.*/\1 \2/p')
        echo "dp2 alone, between ranks (MiB, device to device / on the host): ${between:-none}"
        echo "${between:-0 0}" | awk '{exit !($1 > 0 && $1 > $2)}' ||
            note "matrix gpu dp2: its collectives did not move device memory between the ranks (${between:-no device line})"
    fi
fi
n=0
J="$T/cmpjson"
mkdir -p "$J"
for set in "$T"/mgpu[0-9]*/cells/*/set; do
    [ -d "$set" ] || continue
    cdir=$(basename "$(dirname "$set")")
    j=$(basename "$(dirname "$(dirname "$(dirname "$set")")")" | sed 's/mgpu//')
    idx=$(echo "$cdir" | sed 's/-.*//; s/^0*//')
    # only cells that ended (a budget can stop one midway)
    grep -qE "^\[ *$idx/[0-9]+\] .* (PASS|FAIL|ERROR|WARN)" "$T/mgpu$j.log" || continue
    if ! ref=$(sh "$(dirname "$0")/cpu_ref.sh" "$set" "$T"/mcpu*/ref); then
        echo "$cdir: no CPU golden of the same data (its own data source): judged by the matrix only"
        continue
    fi
    prec=$(grep -o '"precision":[[:space:]]*"f[0-9]*"' "$set/manifest.json" | head -1 | grep -o 'f[0-9][0-9]*')
    [ -n "$prec" ] || { note "$cdir: no precision in its manifest"; continue; }
    mkdir -p "$J/p$j-$cdir"
    for f in "$set"/*.safetensors; do
        b=$(basename "$f")
        [ -f "$ref/$b" ] || continue
        case "$prec:$b" in f32:params.*) continue ;; esac # informational in f32 (above)
        "$P" compare "$ref/$b" "$f" --policy "$prec" --json "$J/p$j-$cdir/$b.json" >"$T/cmp" 2>&1 ||
            note "$cdir ($MODE GPU) vs the CPU golden, $b: $(tail -8 "$T/cmp")"
        n=$((n + 1))
    done
done
[ "$n" -gt 0 ] || note "no layout set compared with the CPU golden"
# one table: per cell the matrix's verdict on the device and the largest error against the CPU golden
if command -v python3 >/dev/null; then
    python3 "$(dirname "$0")/cell_table.py" "$J" "$T"/mgpu[0-9]*.log | tee "${PARITY_GPU_TABLE:-/dev/null}"
else
    echo "(no python3: no per-cell table)"
fi
[ $bad -eq 0 ] || { echo "layouts ($MODE GPU): $bad failures (listed above)" >&2; exit 1; }
[ $incomplete -eq 0 ] || { echo "layouts ($MODE GPU): INCOMPLETE (the budget ended the matrix); $n files of the cells that ran pass against the CPU golden"; exit 3; }
echo "layouts ($MODE GPU): every cell PASS; $n files of their sets pass against the CPU golden"
