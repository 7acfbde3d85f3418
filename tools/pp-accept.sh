#!/bin/sh
# v4-mini acceptance cells of issue 7 (pipeline parallelism in `parity run`):
# 2 training steps of each layout against the serial golden of the same data
# and seed (f64 policy, `parity compare`).  Minutes per cell; not in CI
# (tests/parallel/meson.build registers them in the 'slow' suite with
# -Dslow_tests=true; docs/parallel.md "Pipeline parallelism").
#
#   tools/pp-accept.sh [-p PARITY] [-w WORKDIR] [CELL...]
#
# Cells (default: all):
#   pp2 pp4 pp8             PP 2 / 4 / 8, Megatron's even split, 1F1B (N = PP)
#   pp3_uneven              PP 3, 'Et*3|t*2|t*3mL'
#   pp2_vpp2                PP 2 x VPP 2, interleaved 1F1B (4 segments of 2 layers)
#   pp4_zbh1                PP 4, ZB-H1
#   pp4_dualpipe            PP 4, DualPipe (two directions, parameter copies)
#   pp4_dualpipev           PP 4 x VPP 2, DualPipeV (a V of 8 segments)
#   pp2_cp2                 PP 2 x CP 2 (N = 4)
#   pp2_cp2_ep64            PP 2 x CP 2 x EP 64, N = 128, B = 128 (Da 32, 4 microbatches)
# Prints one line per cell: PASS/FAIL and the wall time of the run; exit 1 if
# any failed.
P=build/parity
W=
while getopts p:w: o; do
    case $o in
    p) P=$OPTARG ;;
    w) W=$OPTARG ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ -n "$W" ] || { W=$(mktemp -d) && trap 'rm -rf "$W"' EXIT; }
mkdir -p "$W"
CELLS=${*:-"pp2 pp4 pp8 pp3_uneven pp2_vpp2 pp4_zbh1 pp4_dualpipe pp4_dualpipev pp2_cp2 pp2_cp2_ep64"}
export PARITY_COMM_TIMEOUT=${PARITY_COMM_TIMEOUT:-7200}
golden() { # B
    [ -d "$W/g$1" ] || "$P" golden --preset v4-mini --global-batch-size "$1" --steps 2 --quiet --out "$W/g$1" >/dev/null
}
fail=0
cell() { # name B args...
    n=$1 b=$2
    shift 2
    golden "$b" || { echo "$n: golden FAILED"; fail=1; return; }
    rm -rf "$W/$n"
    t0=$(date +%s.%N)
    if "$P" run --preset v4-mini --global-batch-size "$b" --steps 2 --quiet "$@" --dump "$W/$n" >"$W/$n.log" 2>&1; then
        t1=$(date +%s.%N)
        if "$P" compare "$W/g$b" "$W/$n" >"$W/$n.cmp" 2>&1; then
            r=PASS
        else
            r=FAIL
            fail=1
        fi
        printf '%-16s %s  run %.1f s  %s\n' "$n" "$r" "$(echo "$t1 - $t0" | bc)" "$(tail -1 "$W/$n.cmp")"
        grep '^pipeline:' "$W/$n.log" | sed 's/^/                 /'
    else
        echo "$n: run FAILED: $(tail -1 "$W/$n.log")"
        fail=1
    fi
}
for c in $CELLS; do
    case $c in
    pp2) cell pp2 32 --pipeline-model-parallel-size 2 ;;
    pp4) cell pp4 32 --pipeline-model-parallel-size 4 ;;
    pp8) cell pp8 32 --pipeline-model-parallel-size 8 ;;
    pp3_uneven) cell pp3_uneven 32 --pipeline-model-parallel-size 3 --pipeline-model-parallel-layout 'Et*3|t*2|t*3mL' ;;
    pp2_vpp2) cell pp2_vpp2 32 --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 ;;
    pp4_zbh1) cell pp4_zbh1 32 --pipeline-model-parallel-size 4 --pipeline-schedule zb-h1 ;;
    pp4_dualpipe) cell pp4_dualpipe 32 --pipeline-model-parallel-size 4 --pipeline-schedule dualpipe ;;
    pp4_dualpipev) cell pp4_dualpipev 32 --pipeline-model-parallel-size 4 --pipeline-schedule dualpipev ;;
    pp2_cp2) cell pp2_cp2 32 --pipeline-model-parallel-size 2 --context-parallel-size 2 ;;
    pp2_cp2_ep64) cell pp2_cp2_ep64 128 --pipeline-model-parallel-size 2 --context-parallel-size 2 \
        --expert-model-parallel-size 64 --world-size 128 ;;
    *) echo "unknown cell '$c'"; fail=1 ;;
    esac
done
exit $fail
