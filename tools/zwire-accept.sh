#!/bin/sh
# v4-mini acceptance cells of issue 8 (DP reduction / ZeRO-1) and issue 9
# (distributed checkpoints through `parity run`).  Minutes per cell; not in CI.
#
#   tools/zwire-accept.sh [-p PARITY] [-w WORKDIR] [CELL...]
#
# Cells (default: all that the driver supports today):
#   dp8 dp8_zero            DP8 (N=8), 3 steps vs the serial golden
#   dp4_cp2 dp4_cp2_zero    DP4 x CP2 (N=8)
#   cp4_ep32 cp4_ep32_zero  CP4 x EP32, De = 4 (N=128)
#   pp2_ep16 pp2_ep16_zero  PP2 x DP16 x EP16 (N=32)
#   reshard_dp8z_dp2        DP8 + ZeRO-1 -> DP2 replicated: A -> B -> export == A -> export (bytes)
#   reshard_ep128_ep32      EP128 -> EP32 (N=32): the same
#   reshard_pp2ep32_pp4ep64cp2  PP2 x EP32 (N=64) -> PP4 x EP64 x CP2 (N=256): the same
#   reshard_pp4vpp2_pp1     PP4 x VPP2 interleaved (N=4) -> PP1 (N=1): the same
#   resume_pp2ep16z_ep32    2 steps PP2 x DP16 x EP16 + ZeRO-1, load under EP32 (no PP), 2 more: as resume_*
#   resume_dp8_pp4vpp2      2 steps DP8, load under PP4 x VPP2 x DP2 + ZeRO-1 (N=8), 2 more: the same
#   resume_ep32z_dp8        2 steps EP32 + ZeRO-1, save, load under DP8, 2 more steps:
#                           == the serial golden's params.4 and == 4 steps under A (f64 policy)
# Every compare includes the optimizer state (opt.<name>.<slot>) of params.1.. .
# Prints one line per cell: PASS/FAIL and the wall time; exit 1 if any failed.
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
CELLS=${*:-"dp8 dp8_zero dp4_cp2 dp4_cp2_zero cp4_ep32 cp4_ep32_zero pp2_ep16 pp2_ep16_zero reshard_dp8z_dp2 reshard_ep128_ep32 resume_ep32z_dp8 reshard_pp2ep32_pp4ep64cp2 reshard_pp4vpp2_pp1 resume_pp2ep16z_ep32 resume_dp8_pp4vpp2"}
M="--preset v4-mini --quiet"
export PARITY_COMM_TIMEOUT=${PARITY_COMM_TIMEOUT:-7200}
golden() { # steps
    [ -d "$W/g$1" ] || "$P" golden $M --steps "$1" --out "$W/g$1" >/dev/null
}
mini() { # name steps args...: run with a dump and compare against the golden
    n=$1 k=$2
    shift 2
    golden "$k" && rm -rf "$W/$n" && "$P" run $M --steps "$k" "$@" --dump "$W/$n" >"$W/$n.log" 2>&1 &&
        "$P" compare "$W/g$k" "$W/$n" >"$W/$n.cmp" 2>&1
}
reshard() { # name "A flags" "B flags"
    n=$1
    rm -rf "$W/$n.a" "$W/$n.b" &&
        "$P" run $M --steps 1 $2 --save "$W/$n.a" >"$W/$n.log" 2>&1 &&
        "$P" ckpt reshard "$W/$n.a" "$W/$n.b" $3 >>"$W/$n.log" 2>&1 &&
        "$P" ckpt export "$W/$n.a" "$W/$n.a.st" && "$P" ckpt export "$W/$n.b" "$W/$n.b.st" &&
        cmp "$W/$n.a.st" "$W/$n.b.st"
}
resume() { # name "A flags" "B flags"
    n=$1
    golden 4 && rm -rf "$W/$n".* &&
        "$P" run $M --steps 2 $2 --save "$W/$n.a2" >"$W/$n.log" 2>&1 &&
        "$P" run $M --steps 2 $3 --load "$W/$n.a2" --save "$W/$n.r4" --dump "$W/$n.d" >>"$W/$n.log" 2>&1 &&
        "$P" compare "$W/g4/params.4.safetensors" "$W/$n.d/params.2.safetensors" >"$W/$n.cmp" 2>&1 &&
        "$P" run $M --steps 4 $2 --save "$W/$n.a4" >>"$W/$n.log" 2>&1 &&
        "$P" ckpt export "$W/$n.a4" "$W/$n.a4.st" && "$P" ckpt export "$W/$n.r4" "$W/$n.r4.st" &&
        "$P" compare "$W/$n.a4.st" "$W/$n.r4.st" >>"$W/$n.cmp" 2>&1
}
fails=0
for c in $CELLS; do
    t0=$(date +%s)
    case $c in
    dp8) mini $c 3 --world-size 8 ;;
    dp8_zero) mini $c 3 --world-size 8 --use-distributed-optimizer ;;
    dp4_cp2) mini $c 3 --world-size 8 --context-parallel-size 2 ;;
    dp4_cp2_zero) mini $c 3 --world-size 8 --context-parallel-size 2 --use-distributed-optimizer ;;
    cp4_ep32) mini $c 3 --context-parallel-size 4 --expert-model-parallel-size 32 --world-size 128 ;;
    cp4_ep32_zero) mini $c 3 --context-parallel-size 4 --expert-model-parallel-size 32 --world-size 128 \
        --use-distributed-optimizer ;;
    pp2_ep16) mini $c 3 --pipeline-model-parallel-size 2 --expert-model-parallel-size 16 --world-size 32 ;;
    pp2_ep16_zero) mini $c 3 --pipeline-model-parallel-size 2 --expert-model-parallel-size 16 --world-size 32 \
        --use-distributed-optimizer ;;
    reshard_dp8z_dp2) reshard $c "--world-size 8 --use-distributed-optimizer" "--world-size 2" ;;
    reshard_ep128_ep32) reshard $c "--expert-model-parallel-size 128 --global-batch-size 128" \
        "--expert-model-parallel-size 32 --world-size 32" ;;
    resume_ep32z_dp8) resume $c "--expert-model-parallel-size 32 --use-distributed-optimizer" "--world-size 8" ;;
    reshard_pp2ep32_pp4ep64cp2) reshard $c "--pipeline-model-parallel-size 2 --expert-model-parallel-size 32 --world-size 64" \
        "--pipeline-model-parallel-size 4 --expert-model-parallel-size 64 --context-parallel-size 2 --world-size 256" ;;
    reshard_pp4vpp2_pp1) reshard $c "--pipeline-model-parallel-size 4 --virtual-pipeline-model-parallel-size 2 --world-size 4" \
        "--world-size 1" ;;
    resume_pp2ep16z_ep32) resume $c "--pipeline-model-parallel-size 2 --expert-model-parallel-size 16 --world-size 32 \
        --use-distributed-optimizer" "--expert-model-parallel-size 32" ;;
    resume_dp8_pp4vpp2) resume $c "--world-size 8" "--pipeline-model-parallel-size 4 \
        --virtual-pipeline-model-parallel-size 2 --world-size 8 --use-distributed-optimizer" ;;
    *) echo "unknown cell $c" >&2; false ;;
    esac
    rc=$?
    t1=$(date +%s)
    if [ $rc -eq 0 ]; then
        echo "PASS $c $((t1 - t0)) s"
    else
        fails=$((fails + 1))
        echo "FAIL $c $((t1 - t0)) s (logs: $W/$c.log $W/$c.cmp)"
        tail -3 "$W/$c.log" "$W/$c.cmp" 2>/dev/null | sed 's/^/    /'
    fi
done
[ $fails -eq 0 ]
