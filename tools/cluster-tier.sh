#!/usr/bin/env bash
# The cluster tier (issue 34): a small cluster of this machine's own network
# namespaces, one per "node", joined by veth pairs to a bridge (10.77.0.0/24,
# no route out: no packet leaves this machine's namespaces), MPICH's hydra
# launching each node's processes inside its namespace, with the node's name
# as hostname (tools/cluster/nsexec.sh), UCX over TCP only (no shared memory
# between nodes).  Opt-in: it needs root (ip netns, unshare, tc) and minutes;
# not part of tools/test.sh.  docs/testing.md says how it is started.
#
#   sudo bash tools/cluster-tier.sh [--runs N] [--only S[,S...]] [BUILD_DIR]
#        (default 10 runs of every scenario, build)
#
# Scenarios, each N times, wall and exit measured:
#   bitwise   PP2 x CP2 x EP2 (4 ranks, 2 per node) over 2 nodes == one host (threads)
#   netem     the same (1 step) under tc netem delay 100ms loss 1% on every node link
#   linkdown  node n2's link goes down after the first checkpoint of a long run
#             (--save-interval 2): every process (both sides of the partition)
#             ends within DEADLINE s with a report naming a lost process, its
#             host, its ranks and what it waited on; no process left in either
#             namespace; the checkpoint is the last complete one (ckpt info)
#             and no ck.tmp-* is left
#   resume    a checkpoint saved across nodes resumed on one host, and the
#             reverse, == the uninterrupted run
# Prints one line per run and a summary per scenario (min / median / max).
# Everything it made (namespaces, veths, bridge, processes in the
# namespaces, the scratch directory) is removed on exit, also when it is
# interrupted (INT, TERM, HUP); after a kill -9 the next run removes what
# is left before it starts.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=10
only=bitwise,netem,linkdown,resume
DEADLINE=30 # s from the link going down to the last process's exit
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) break ;;
  esac
done
B=$(realpath "${1:-build}")
P=$B/parity
[ "$(id -u)" = 0 ] || { echo "cluster-tier: needs root (ip netns)"; exit 2; }
for c in ip tc unshare bc mpiexec; do
  command -v $c >/dev/null || { echo "cluster-tier: needs $c (bash tools/setup.sh --with-cluster)"; exit 2; }
done
[ -x "$P" ] || { echo "cluster-tier: no $P (bash tools/build.sh ${1:-build})"; exit 2; }
NSEXEC=$(realpath tools/cluster/nsexec.sh)
W=$(mktemp -d)
NODES=(n1 n2)
JOB= # the mpiexec in flight (its timeout's pid)
ns_kill() { # every process in the tier's namespaces (all started by this script)
  local h p
  for h in "${NODES[@]}"; do
    for p in $(ip netns pids "par-$h" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
}
ns_left() { # ns_left [PROGRAM]: how many processes (running PROGRAM) the namespaces hold
  local h p n=0
  for h in "${NODES[@]}"; do
    for p in $(ip netns pids "par-$h" 2>/dev/null); do
      [ -z "${1:-}" ] || tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$1 " && n=$((n + 1))
    done
  done
  echo $n
}
down() {
  [ -n "$JOB" ] && kill "$JOB" 2>/dev/null
  ns_kill
  local h
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
trap 'exit 130' INT TERM HUP
up || { echo "cluster-tier: cannot build the namespaces"; exit 2; }
export UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 MPIR_CVAR_NOLOCAL=1 WRAP_DIR=$W/wrap
MPI=(mpiexec -launcher ssh -launcher-exec "$NSEXEC" -iface br-par -hosts n1:2,n2:2 -n 4
  -genvlist UCX_TLS,UCX_NET_DEVICES,MPIR_CVAR_NOLOCAL,PATH,WRAP_DIR)
L=(--preset v4-tiny --world-size 4 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*2|tmL'
  --context-parallel-size 2 --expert-model-parallel-size 2 --quiet)
cd "$W"
# linkdown's launcher does not end the job when a process fails (hydra would
# kill the survivors before they report): each parity process runs under a
# shell that ignores hydra's SIGUSR1 and writes its exit status and time
cat > wrap.sh <<'EOF'
#!/bin/sh
trap '' USR1
"$@" > "$WRAP_DIR/out.$PMI_RANK" 2> "$WRAP_DIR/err.$PMI_RANK"
echo "$? $(date +%s.%N)" > "$WRAP_DIR/rc.$PMI_RANK"
EOF
chmod +x wrap.sh
"$P" run "${L[@]}" --steps 2 --backend threads --dump ref2 >/dev/null 2>&1 || { echo "reference run failed"; exit 1; }
"$P" run "${L[@]}" --steps 1 --backend threads --dump ref1 >/dev/null 2>&1
fails=0
skipped=
declare -A T
now() { date +%s.%N; }
record() { T[$1]="${T[$1]:-} $2"; echo "  time $1 $2"; }
bytes() { cat /sys/class/net/vp-n1/statistics/tx_bytes /sys/class/net/vp-n2/statistics/tx_bytes | paste -sd+ | bc; }
ok() { echo "  ok: $*"; }
bad() { echo "  FAIL: $*"; fails=$((fails + 1)); }
mpi() { # mpi LOG ARGS...: one 2-node parity run (300 s at most); its status
  local log=$1
  shift
  timeout 300 "${MPI[@]}" "$@" >"$log" 2>&1 &
  JOB=$!
  wait $JOB
  local rc=$?
  JOB=
  [ "$(ns_left)" -eq 0 ] || { echo "  (processes left in the namespaces after mpiexec: ended)" >>"$log"; ns_kill; }
  return $rc
}

bitwise() { # bitwise LABEL STEPS: one run, equal to refSTEPS bit for bit, traffic over the veths
  local b0 t0 rc
  b0=$(bytes)
  t0=$(now)
  rm -rf c
  mpi c.log "$P" run "${L[@]}" --backend mpi --steps "$2" --dump c
  rc=$?
  record "$1" "$(echo "$(now) - $t0" | bc)"
  local moved=$(($(bytes) - b0))
  if [ $rc -ne 0 ]; then bad "$1: exit $rc: $(grep -v '^ ' c.log | tail -2)"; return; fi
  "$P" compare "ref$2" c --policy bitwise >cmp.log 2>&1 && [ "$moved" -gt 100000 ] &&
    ok "$1: bitwise equal, ${moved} bytes over the node links" || bad "$1: $(tail -1 cmp.log), $moved bytes"
}

linkdown_check() { # linkdown_check RC_COUNT: the verdict on one linkdown run
  local q host other why=""
  [ "$1" -eq 4 ] || why="$why; $((4 - $1)) of 4 processes still running after $DEADLINE s"
  for q in 0 1 2 3; do
    host=n1 other=n2
    [ $q -ge 2 ] && host=n2 other=n1
    [ "$(cut -d' ' -f1 "$WRAP_DIR/rc.$q" 2>/dev/null)" = 1 ] || why="$why; process $q ($host) exit '$(cut -d' ' -f1 "$WRAP_DIR/rc.$q" 2>/dev/null)'"
    grep -q "MPI process [0-9]* (world ranks [0-9]*\.\.[0-9]*, pid [0-9]* on host $other) died: .*; waiting here: rank $q " \
      "$WRAP_DIR/err.$q" 2>/dev/null || why="$why; process $q ($host) names no lost process on $other with its ranks and its own wait"
  done
  [ "$(ns_left "$P")" -eq 0 ] || why="$why; $(ns_left "$P") parity processes left in the namespaces"
  "$P" ckpt info ck >ckinfo.log 2>&1 || why="$why; ck: $(tail -1 ckinfo.log)"
  ! ls -d ck.tmp-* >/dev/null 2>&1 || why="$why; $(ls -d ck.tmp-*) left"
  echo "$why"
}

linkdown() { # one run; n2's link down once the first checkpoint is there
  local t0 tdown tlast q n why
  rm -rf ck ck.tmp-* "$WRAP_DIR"
  mkdir "$WRAP_DIR"
  t0=$(now)
  timeout 300 mpiexec -disable-auto-cleanup "${MPI[@]:1}" "$W/wrap.sh" "$P" run "${L[@]}" --backend mpi \
    --steps 200 --comm-timeout 20 --save ck --save-interval 2 >ld.log 2>&1 &
  JOB=$!
  for _ in $(seq 1200); do [ -e ck ] && break; sleep 0.1; done
  ip link set vp-n2 down
  tdown=$(now)
  for _ in $(seq $((DEADLINE * 10))); do
    n=$(ls "$WRAP_DIR"/rc.* 2>/dev/null | wc -l)
    [ "$n" -eq 4 ] && break
    sleep 0.1
  done
  sleep 0.3 # the wrappers' own exit
  tlast=$tdown
  for q in "$WRAP_DIR"/rc.*; do
    [ -e "$q" ] && [ "$(echo "$(cut -d' ' -f2 "$q") > $tlast" | bc)" = 1 ] && tlast=$(cut -d' ' -f2 "$q")
  done
  why=$(linkdown_check "$n")
  ip link set vp-n2 up
  for _ in $(seq 100); do kill -0 $JOB 2>/dev/null || break; sleep 0.1; done # hydra ends once it hears n2 again
  kill $JOB 2>/dev/null
  wait $JOB 2>/dev/null
  JOB=
  ns_kill
  record linkdown_exit "$(echo "$tlast - $tdown" | bc)"
  record linkdown_wall "$(echo "$(now) - $t0" | bc)"
  if [ -z "$why" ]; then
    ok "linkdown: the last of 4 processes exited $(echo "$tlast - $tdown" | bc | cut -c1-5) s after the link went down;" \
      "$(grep -m1 -o "MPI process [0-9]* (world ranks [^)]*) died: [^;]*; waiting here: rank 0 [^(]*" "$WRAP_DIR/err.0")"
  else
    bad "linkdown${why}"
  fi
}

resume() { # saved across nodes, resumed on one host; saved on one host, resumed across nodes
  local t0=$(now) rc
  rm -rf ck1 r1 ck2 r2
  mpi rs.log "$P" run "${L[@]}" --backend mpi --steps 1 --save ck1 &&
    "$P" run "${L[@]}" --backend threads --steps 2 --load ck1 --dump r1 >>rs.log 2>&1 &&
    "$P" run "${L[@]}" --backend threads --steps 1 --save ck2 >>rs.log 2>&1 &&
    mpi rs2.log "$P" run "${L[@]}" --backend mpi --steps 2 --load ck2 --dump r2
  rc=$?
  cat rs2.log >>rs.log 2>/dev/null
  record resume "$(echo "$(now) - $t0" | bc)"
  [ $rc -eq 0 ] && "$P" compare ref2 r1 --policy bitwise >/dev/null 2>&1 && "$P" compare ref2 r2 --policy bitwise >/dev/null 2>&1 &&
    ok "resume: nodes -> host and host -> nodes both equal the uninterrupted run" ||
    bad "resume: rc $rc; $(grep -v '^ ' rs.log | tail -2)"
}

netem_on() { # 0 when both links got the delay and the loss
  local h
  for h in "${NODES[@]}"; do
    ip netns exec "par-$h" tc qdisc add dev eth0 root netem delay 100ms loss 1% 2>>netem.err || return 1
  done
}
netem_off() { for h in "${NODES[@]}"; do ip netns exec "par-$h" tc qdisc del dev eth0 root 2>/dev/null; done; }
want() { case ",$only," in *",$1,"*) return 0 ;; esac; return 1; }

for k in $(seq "$runs"); do
  echo "run $k of $runs"
  want bitwise && bitwise bitwise 2
  if want netem; then
    if netem_on; then
      bitwise netem 1
    else # a kernel without sch_netem: say so, never a pass
      skipped="netem ($(sort -u netem.err | head -1))"
      echo "  SKIPPED: netem: tc cannot add the netem qdisc: $(sort -u netem.err | head -1)"
    fi
    netem_off
  fi
  want linkdown && linkdown
  want resume && resume
done
echo "scenario: seconds over $runs runs (min / median / max)"
for s in bitwise netem linkdown_wall linkdown_exit resume; do
  echo "${T[$s]:-}" | tr ' ' '\n' | grep . | sort -g |
    awk -v s="$s" '{v[NR]=$1} END {if (NR) printf "  %-14s %6.2f / %6.2f / %6.2f  (%d runs)\n", s, v[1], v[int((NR+1)/2)], v[NR], NR}'
done
echo "$fails failure(s)${skipped:+; skipped: $skipped}"
[ "$fails" -eq 0 ]
