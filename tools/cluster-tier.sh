#!/usr/bin/env bash
# The cluster tier (issue 34): a small cluster of this machine's own network
# namespaces, one per "node", joined by veth pairs to a bridge (10.77.0.0/24,
# no route out: no packet leaves this machine's namespaces), MPICH's hydra
# launching each node's processes inside its namespace (tools/cluster/
# nsexec.sh), UCX over TCP only (no shared memory between nodes).  Opt-in: it
# needs root (ip netns, tc) and minutes; not part of tools/test.sh.
#
#   sudo bash tools/cluster-tier.sh [--runs N] [BUILD_DIR]     (default 10, build)
#
# Scenarios, each N times, wall and exit measured:
#   bitwise   PP2 x CP2 x EP2 (4 ranks, 2 per node) over 2 nodes == one host (threads)
#   netem     the same (1 step) under tc netem delay 100ms loss 1% on every node link
#   linkdown  node n2's link goes down mid-run: every survivor ends within the
#             deadline naming the lost process, its ranks and what it waited
#             on; no parity process left; the --save checkpoint not half-written
#   resume    a checkpoint saved across nodes resumed on one host, and the
#             reverse, == the uninterrupted run
# Prints one line per run and a summary per scenario (min / median / max).
set -uo pipefail
cd "$(dirname "$0")/.."
runs=10
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    *) break ;;
  esac
done
B=$(realpath "${1:-build}")
P=$B/parity
[ "$(id -u)" = 0 ] || { echo "cluster-tier: needs root (ip netns)"; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "cluster-tier: needs iproute2 (ip, tc)"; exit 2; }
NSEXEC=$(realpath tools/cluster/nsexec.sh)
W=$(mktemp -d)
NODES=(n1 n2)
down() {
  for h in "${NODES[@]}"; do ip netns del "par-$h" 2>/dev/null; ip link del "vp-$h" 2>/dev/null; done
  ip link del br-par 2>/dev/null
  true
}
up() {
  down
  ip link add br-par type bridge && ip addr add 10.77.0.1/24 dev br-par && ip link set br-par up || return 1
  local i=10
  for h in "${NODES[@]}"; do
    i=$((i + 1))
    ip netns add "par-$h" && ip link add "vp-$h" type veth peer name eth0 netns "par-$h" &&
      ip link set "vp-$h" master br-par up && ip -n "par-$h" addr add "10.77.0.$i/24" dev eth0 &&
      ip -n "par-$h" link set eth0 up && ip -n "par-$h" link set lo up || return 1
  done
}
trap 'down; rm -rf "$W"' EXIT
up || { echo "cluster-tier: cannot build the namespaces"; exit 2; }
export UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 MPIR_CVAR_NOLOCAL=1
MPI=(mpiexec -launcher ssh -launcher-exec "$NSEXEC" -iface br-par -hosts n1:2,n2:2 -n 4
  -genvlist UCX_TLS,UCX_NET_DEVICES,MPIR_CVAR_NOLOCAL,PATH)
L=(--preset v4-tiny --world-size 4 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*2|tmL'
  --context-parallel-size 2 --expert-model-parallel-size 2 --quiet)
cd "$W"
"$P" run "${L[@]}" --steps 2 --backend threads --dump ref2 >/dev/null 2>&1 || { echo "reference run failed"; exit 1; }
"$P" run "${L[@]}" --steps 1 --backend threads --dump ref1 >/dev/null 2>&1
fails=0
declare -A T
now() { date +%s.%N; }
record() { T[$1]="${T[$1]:-} $2"; echo "  time $1 $2"; }
bytes() { cat /sys/class/net/vp-n1/statistics/tx_bytes /sys/class/net/vp-n2/statistics/tx_bytes | paste -sd+ | bc; }
ok() { echo "  ok: $*"; }
bad() { echo "  FAIL: $*"; fails=$((fails + 1)); }
cluster_run() { # cluster_run DUMP STEPS [extra...]: the 2-node run; its status
  local d=$1 s=$2
  shift 2
  rm -rf "$d"
  timeout 300 "${MPI[@]}" "$P" run "${L[@]}" --backend mpi --steps "$s" --dump "$d" "$@" >"$d.log" 2>&1
}

bitwise() { # bitwise LABEL STEPS: one run, equal to refSTEPS bit for bit, traffic over the veths
  local b0 t0 rc
  b0=$(bytes)
  t0=$(now)
  cluster_run c "$2"
  rc=$?
  record "$1" "$(echo "$(now) - $t0" | bc)"
  local moved=$(($(bytes) - b0))
  if [ $rc -ne 0 ]; then bad "$1: exit $rc: $(tail -2 c.log)"; return; fi
  "$P" compare "ref$2" c --policy bitwise >cmp.log 2>&1 && [ "$moved" -gt 100000 ] &&
    ok "$1: bitwise equal, ${moved} bytes over the node links" || bad "$1: $(tail -1 cmp.log), $moved bytes"
}

linkdown() { # one run; n2's link down 4 s in
  local t0 tdown rc
  rm -rf ck ck.tmp-*
  t0=$(now)
  timeout 300 "${MPI[@]}" "$P" run "${L[@]}" --backend mpi --steps 200 --comm-timeout 20 --save ck \
    --save-interval 1000 >ld.log 2>&1 &
  local job=$!
  sleep 4
  ip link set vp-n2 down
  tdown=$(now)
  wait $job
  rc=$?
  local tend=$(now)
  ip link set vp-n2 up
  sleep 0.5
  local left=$(pgrep -f "$P run" | wc -l)
  record linkdown_exit "$(echo "$tend - $tdown" | bc)"
  record linkdown_wall "$(echo "$tend - $t0" | bc)"
  local named=$(grep -c "MPI process [0-9]* (world ranks" ld.log)
  [ $rc -ne 0 ] && [ "$left" -eq 0 ] && [ "$named" -gt 0 ] && [ ! -e ck ] && ! ls -d ck.tmp-* >/dev/null 2>&1 &&
    ok "linkdown: exit $rc $(echo "$tend - $tdown" | bc | cut -c1-5) s after the link went down; $(grep -m1 -o "MPI process [0-9]* (world ranks [0-9.]*[^)]*)[^;]*" ld.log | head -1)" ||
    bad "linkdown: exit $rc, $left parity processes left, $named reports naming a process, ck: $(ls -d ck* 2>/dev/null); $(grep -v '^ ' ld.log | tail -3)"
  pkill -f "$P run" 2>/dev/null
}

resume() { # saved across nodes, resumed on one host; saved on one host, resumed across nodes
  local t0=$(now) rc
  rm -rf ck1 r1 ck2 r2
  timeout 300 "${MPI[@]}" "$P" run "${L[@]}" --backend mpi --steps 1 --save ck1 >rs.log 2>&1 &&
    "$P" run "${L[@]}" --backend threads --steps 2 --load ck1 --dump r1 >>rs.log 2>&1 &&
    "$P" run "${L[@]}" --backend threads --steps 1 --save ck2 >>rs.log 2>&1 &&
    timeout 300 "${MPI[@]}" "$P" run "${L[@]}" --backend mpi --steps 2 --load ck2 --dump r2 >>rs.log 2>&1
  rc=$?
  record resume "$(echo "$(now) - $t0" | bc)"
  [ $rc -eq 0 ] && "$P" compare ref2 r1 --policy bitwise >/dev/null 2>&1 && "$P" compare ref2 r2 --policy bitwise >/dev/null 2>&1 &&
    ok "resume: nodes -> host and host -> nodes both equal the uninterrupted run" ||
    bad "resume: rc $rc; $(grep -v '^ ' rs.log | tail -2)"
}

netem_on() { for h in "${NODES[@]}"; do ip netns exec "par-$h" tc qdisc add dev eth0 root netem delay 100ms loss 1%; done; }
netem_off() { for h in "${NODES[@]}"; do ip netns exec "par-$h" tc qdisc del dev eth0 root 2>/dev/null; done; }

for k in $(seq "$runs"); do
  echo "run $k of $runs"
  bitwise bitwise 2
  netem_on
  bitwise netem 1
  netem_off
  linkdown
  resume
done
echo "scenario: wall seconds over $runs runs (min / median / max)"
for s in bitwise netem linkdown_wall linkdown_exit resume; do
  echo "${T[$s]:-}" | tr ' ' '\n' | grep . | sort -g |
    awk -v s="$s" '{v[NR]=$1} END {if (NR) printf "  %-14s %6.2f / %6.2f / %6.2f  (%d runs)\n", s, v[1], v[int((NR+1)/2)], v[NR], NR}'
done
echo "$fails failure(s)"
[ "$fails" -eq 0 ]
