#!/usr/bin/env bash
# The cluster tier (issue 34): a small cluster of this machine's own network
# namespaces, one per "node", joined by veth pairs to a bridge (10.77.0.0/24,
# no route out: no packet leaves this machine's namespaces), MPICH's hydra
# launching each node's processes inside its namespace, with the node's name
# as hostname (tools/cluster/nsexec.sh), UCX over TCP only (no shared memory
# between nodes).  Opt-in: it needs root (ip netns, unshare, tc) and minutes;
# not part of tools/test.sh.  docs/testing.md says how it is started.
#
#   sudo bash tools/cluster-tier.sh [--runs N] [--only S[,S...]] [--logs DIR] [BUILD_DIR]
#        (default 10 runs of every scenario, build, logs under
#        BUILD_DIR/cluster-tier-logs/DATE-PID)
#
# Scenarios, each N times, wall and exit measured:
#   bitwise   PP2 x CP2 x EP2 (4 ranks, 2 per node) over 2 nodes == one host (threads)
#   netem     the same (1 step) with every packet into a node delayed 100 ms and
#             1 % of them dropped: this kernel has no sch_netem (tc netem), so
#             iptables in each node's namespace drops (-m statistic --mode random
#             --probability 0.01) and queues the rest to tools/cluster/nfdelay.c
#             (NFQUEUE), which accepts each packet 100 ms after it came; TSO off
#             (gso_max_segs 1: one wire packet per skb).  Measured per run: ping
#             n1 -> n2 round trip (>= 190 ms required), packets dropped / passed
#             (iptables counters), TCP segments retransmitted (/proc/net/snmp)
#   linkdown  node n2's link goes down after the first checkpoint of a long run
#             (--save-interval 2): every process (both sides of the partition)
#             ends within DEADLINE s with a report naming a lost process, its
#             host, its ranks and what it waited on; no process left in either
#             namespace; the checkpoint is the last complete one (ckpt info)
#             and no ck.tmp-* is left
#   resume    a checkpoint saved across nodes resumed on one host, and the
#             reverse, == the uninterrupted run
# Prints one line per run and a summary per scenario (min / median / max).
# Every scenario run works in a directory of its own; a failed run's logs
# (the commands it ran, mpiexec's output, every MPI process's stdout and
# stderr as rank.N.out/err, linkdown's per-process files, a snapshot of any
# process left in the namespaces) are kept in LOGS/SCENARIO.RUN, and the
# script names that folder; a passing run's directory is removed.
# Everything it made (namespaces, veths, bridge, processes in the
# namespaces, the scratch directory) is removed on exit, also when it is
# interrupted (INT, TERM, HUP); after a kill -9 the next run removes what
# is left before it starts.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=10
logs=
only=bitwise,netem,linkdown,resume
DEADLINE=30 # s from the link going down to the last process's exit
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    *) break ;;
  esac
done
B=$(realpath "${1:-build}")
P=$B/parity
[ "$(id -u)" = 0 ] || { echo "cluster-tier: needs root (ip netns)"; exit 2; }
for c in ip unshare bc mpiexec; do
  command -v $c >/dev/null || { echo "cluster-tier: needs $c (bash tools/setup.sh --with-cluster)"; exit 2; }
done
[ -x "$P" ] || { echo "cluster-tier: no $P (bash tools/build.sh ${1:-build})"; exit 2; }
NSEXEC=$(realpath tools/cluster/nsexec.sh)
NFDELAY_C=$(realpath tools/cluster/nfdelay.c)
RANKIO=$(realpath tools/cluster/rankio.sh)
logs=$(realpath -m "${logs:-$B/cluster-tier-logs/$(date +%Y%m%d-%H%M%S)-$$}")
W=$(mktemp -d)
NODES=(n1 n2)
want() { case ",$only," in *",$1,"*) return 0 ;; esac; return 1; }
JOB= # the mpiexec in flight (its timeout's pid)
ns_kill() { # every process in the tier's namespaces (all started by this script)
  local h p
  for h in "${NODES[@]}"; do
    for p in $(ip netns pids "par-$h" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
}
ns_left() { # ns_left [PROGRAM]: how many processes (running PROGRAM) the namespaces hold, the delayers aside
  local h p n=0
  for h in "${NODES[@]}"; do
    for p in $(ip netns pids "par-$h" 2>/dev/null); do
      case " ${NFD_PIDS:-} " in *" $p "*) continue ;; esac
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
export UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 MPIR_CVAR_NOLOCAL=1 WRAP_DIR= RANK_DIR=
MPI=(mpiexec -launcher ssh -launcher-exec "$NSEXEC" -iface br-par -hosts n1:2,n2:2 -n 4
  -genvlist UCX_TLS,UCX_NET_DEVICES,MPIR_CVAR_NOLOCAL,PATH,WRAP_DIR,RANK_DIR)
L=(--preset v4-tiny --world-size 4 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*2|tmL'
  --context-parallel-size 2 --expert-model-parallel-size 2 --quiet)
cd "$W"
# the netem scenario's delayer (sch_netem is missing from many kernels, this one's too)
! want netem || cc -O2 -o nfdelay "$NFDELAY_C" -lnetfilter_queue -lnfnetlink >nfdelay.cc 2>&1 || rm -f nfdelay
# linkdown's launcher does not end the job when a process fails (hydra would
# kill the survivors before they report): each parity process runs under a
# shell that ignores hydra's SIGUSR1 and writes its exit status and time
cat > wrap.sh <<'EOW'
#!/bin/sh
trap '' USR1
"$@" > "$WRAP_DIR/out.$PMI_RANK" 2> "$WRAP_DIR/err.$PMI_RANK"
echo "$? $(date +%s.%N)" > "$WRAP_DIR/rc.$PMI_RANK"
EOW
chmod +x wrap.sh
"$P" run "${L[@]}" --steps 2 --backend threads --dump ref2 >/dev/null 2>&1 || { echo "reference run failed"; exit 1; }
"$P" run "${L[@]}" --steps 1 --backend threads --dump ref1 >/dev/null 2>&1
echo "cluster-tier: a failed run's logs are kept in $logs/SCENARIO.RUN"
fails=0
kept=0
skipped=
declare -A T F
now() { date +%s.%N; }
record() { T[$1]="${T[$1]:-} $2"; echo "  time $1 $2"; }
bytes() { cat /sys/class/net/vp-n1/statistics/tx_bytes /sys/class/net/vp-n2/statistics/tx_bytes | paste -sd+ | bc; }
ok() { echo "  ok: $*"; }
bad() { echo "  FAIL: $*"; echo "FAIL: $*" >>verdict; fails=$((fails + 1)); RFAIL=1; F[$RNAME]=$((${F[$RNAME]:-0} + 1)); }
note_cmd() { printf '%s' "$(now) load $(cut -d' ' -f1-3 /proc/loadavg):" >>commands; printf ' %q' "$@" >>commands; echo >>commands; }
ns_snapshot() { # ns_snapshot FILE: every process left in the namespaces, what it waits in
  local h p t
  for h in "${NODES[@]}"; do
    for p in $(ip netns pids "par-$h" 2>/dev/null); do
      {
        echo "== $h pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
        grep -E '^(State|PPid|Threads)' "/proc/$p/status" 2>/dev/null | tr '\n' ' '
        echo
        for t in /proc/$p/task/*; do echo "  task ${t##*/} $(cut -d' ' -f3 "$t/stat" 2>/dev/null) wchan $(cat "$t/wchan" 2>/dev/null)"; done
        cat "/proc/$p/stack" 2>/dev/null | sed 's/^/  /'
      } >>"$1"
    done
  done
}
begin() { # begin SCENARIO RUN: a fresh directory for one run of a scenario, made the current one
  RNAME=$1 RFAIL=0 R=$W/runs/$1.$2
  mkdir -p "$R" && cd "$R" || exit 1
}
finish() { # the run's directory: its logs kept when it failed, then removed
  cd "$W" || exit 1
  if [ "$RFAIL" = 1 ]; then
    mkdir -p "$logs/${R##*/}"
    find "$R" -maxdepth 1 -type f -exec cp {} "$logs/${R##*/}/" \;
    [ -d "$R/wrap" ] && cp -r "$R/wrap" "$logs/${R##*/}/"
    ls -la "$R" >"$logs/${R##*/}/listing"
    echo "  logs kept: $logs/${R##*/}"
    kept=$((kept + 1))
  fi
  rm -rf "$R"
}
mpi() { # mpi LOG ARGS...: one 2-node parity run (300 s at most), each process's output kept; its status
  local log=$1
  shift
  note_cmd "${MPI[@]}" "$RANKIO" "$@"
  RANK_DIR=$R timeout 300 "${MPI[@]}" "$RANKIO" "$@" >"$log" 2>&1 &
  JOB=$!
  wait $JOB
  local rc=$?
  JOB=
  echo "$(now) mpiexec exit $rc" >>commands
  sleep 0.2 # the tee processes of rankio.sh
  if [ "$(ns_left)" -ne 0 ]; then
    echo "  (processes left in the namespaces after mpiexec: ended; see left.txt)" >>"$log"
    ns_snapshot left.txt
    ns_kill
  fi
  return $rc
}
host() { # host LOG ARGS...: one run on this host (threads), logged
  local log=$1
  shift
  note_cmd "$@"
  "$@" >>"$log" 2>&1
  local rc=$?
  echo "$(now) exit $rc" >>commands
  return $rc
}

bitwise() { # bitwise LABEL STEPS: one run, equal to refSTEPS bit for bit, traffic over the veths
  local b0 t0 rc
  b0=$(bytes)
  t0=$(now)
  mpi c.log "$P" run "${L[@]}" --backend mpi --steps "$2" --dump c
  rc=$?
  record "$1" "$(echo "$(now) - $t0" | bc)"
  local moved=$(($(bytes) - b0))
  if [ $rc -ne 0 ]; then bad "$1: exit $rc: $(grep -v '^ ' c.log | tail -2)"; return; fi
  host cmp.log "$P" compare "$W/ref$2" c --policy bitwise && [ "$moved" -gt 100000 ] &&
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
  [ "$(ns_left "$P")" -eq 0 ] || { why="$why; $(ns_left "$P") parity processes left in the namespaces"; ns_snapshot left.txt; }
  host ckinfo.log "$P" ckpt info ck || why="$why; ck: $(tail -1 ckinfo.log)"
  ! ls -d ck.tmp-* >/dev/null 2>&1 || why="$why; $(ls -d ck.tmp-*) left"
  echo "$why"
}

linkdown() { # one run; n2's link down once the first checkpoint is there
  local t0 tdown tlast q n why
  export WRAP_DIR=$R/wrap
  mkdir "$WRAP_DIR"
  t0=$(now)
  note_cmd mpiexec -disable-auto-cleanup "${MPI[@]:1}" "$W/wrap.sh" "$P" run "${L[@]}" --backend mpi \
    --steps 200 --comm-timeout 20 --save ck --save-interval 2
  timeout 300 mpiexec -disable-auto-cleanup "${MPI[@]:1}" "$W/wrap.sh" "$P" run "${L[@]}" --backend mpi \
    --steps 200 --comm-timeout 20 --save ck --save-interval 2 >ld.log 2>&1 &
  JOB=$!
  for _ in $(seq 1200); do [ -e ck ] && break; sleep 0.1; done
  ip link set vp-n2 down
  tdown=$(now)
  echo "$tdown link vp-n2 down" >>commands
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
  echo "$(now) link vp-n2 up" >>commands
  for _ in $(seq 100); do kill -0 $JOB 2>/dev/null || break; sleep 0.1; done # hydra ends once it hears n2 again
  kill $JOB 2>/dev/null
  wait $JOB 2>/dev/null
  JOB=
  ns_kill
  WRAP_DIR=
  record linkdown_exit "$(echo "$tlast - $tdown" | bc)"
  record linkdown_wall "$(echo "$(now) - $t0" | bc)"
  if [ -z "$why" ]; then
    ok "linkdown: the last of 4 processes exited $(echo "$tlast - $tdown" | bc | cut -c1-5) s after the link went down;" \
      "$(grep -m1 -o "MPI process [0-9]* (world ranks [^)]*) died: [^;]*; waiting here: rank 0 [^(]*" "$R/wrap/err.0")"
  else
    bad "linkdown${why}"
  fi
}

resume() { # saved across nodes, resumed on one host; saved on one host, resumed across nodes
  local t0=$(now) rc
  mpi rs.log "$P" run "${L[@]}" --backend mpi --steps 1 --save ck1 &&
    host rs.log "$P" run "${L[@]}" --backend threads --steps 2 --load ck1 --dump r1 &&
    host rs.log "$P" run "${L[@]}" --backend threads --steps 1 --save ck2 &&
    mpi rs2.log "$P" run "${L[@]}" --backend mpi --steps 2 --load ck2 --dump r2
  rc=$?
  cat rs2.log >>rs.log 2>/dev/null
  record resume "$(echo "$(now) - $t0" | bc)"
  [ $rc -eq 0 ] && host cmp.log "$P" compare "$W/ref2" r1 --policy bitwise && host cmp.log "$P" compare "$W/ref2" r2 --policy bitwise &&
    ok "resume: nodes -> host and host -> nodes both equal the uninterrupted run" ||
    bad "resume: rc $rc; $(grep -v '^ ' rs.log | tail -2)"
}

NFD_PIDS= # the delayers of the netem scenario (nfdelay, one per node)
netem_on() { # delay 100 ms and drop 1 % of the packets into each node; 0 when all is in place
  local h k c
  for c in iptables ping cc; do
    command -v $c >/dev/null || { echo "needs $c (bash tools/setup.sh --with-cluster)" >netem.err; return 1; }
  done
  [ -x "$W/nfdelay" ] || { echo "cannot build tools/cluster/nfdelay.c: $(grep -m1 error "$W/nfdelay.cc" || head -1 "$W/nfdelay.cc")" >netem.err; return 1; }
  for h in "${NODES[@]}"; do
    # one wire packet per skb (no TSO): the loss counts packets, not 64 KiB super-packets
    ip -n "par-$h" link set eth0 gso_max_segs 1 &&
      ip netns exec "par-$h" iptables -A INPUT -i eth0 -m statistic --mode random --probability 0.01 -j DROP &&
      ip netns exec "par-$h" iptables -A INPUT -i eth0 -j NFQUEUE --queue-num 77 2>>netem.err || return 1
    note_cmd ip netns exec "par-$h" "$W/nfdelay" 77 100
    ip netns exec "par-$h" "$W/nfdelay" 77 100 >"nfd.$h.out" 2>"nfd.$h.err" &
    NFD_PIDS="$NFD_PIDS $!"
    for k in $(seq 50); do grep -q ready "nfd.$h.out" && break; sleep 0.1; done
    grep -q ready "nfd.$h.out" || { echo "nfdelay in $h: $(cat "nfd.$h.err")" >>netem.err; return 1; }
  done
}
netem_off() { # the rules first (no packet queued without a delayer), then the delayers (they release what they hold)
  local h p
  for h in "${NODES[@]}"; do
    ip netns exec "par-$h" iptables -F INPUT 2>/dev/null
    ip -n "par-$h" link set eth0 gso_max_segs 65535 2>/dev/null
  done
  for p in $NFD_PIDS; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  NFD_PIDS=
}
netem_counts() { # netem_counts NODE: "dropped passed retransmitted-segments" into NODE since its rules went in
  local d q
  read -r d q < <(ip netns exec "par-$1" iptables -L INPUT -v -x -n 2>/dev/null | awk '$3 == "DROP" {d = $1} $3 == "NFQUEUE" {q = $1} END {print d + 0, q + 0}')
  echo "$d $q $(ip netns exec "par-$1" awk '/^Tcp:/ {if (n++) print $13}' /proc/net/snmp)"
}
netem() { # the bitwise run under the delay and the loss, both measured
  local rtt c1 c2 before1 before2 loss
  # -U: the time at which ping reads the reply, not the kernel's receive stamp (taken before the delayer holds it)
  ip netns exec par-n1 ping -U -q -c 20 -i 0.2 10.77.0.12 >ping.log 2>&1
  rtt=$(grep -o 'rtt [^=]*= [0-9.]*/[0-9.]*' ping.log | cut -d/ -f5)
  before1=$(netem_counts n1) before2=$(netem_counts n2)
  bitwise netem 1
  c1=$(netem_counts n1) c2=$(netem_counts n2)
  echo "before: n1 $before1, n2 $before2; after: n1 $c1, n2 $c2" >counts.log
  cat nfd.*.err >>counts.log 2>/dev/null
  read -r d1 q1 r1 <<<"$c1"
  read -r d2 q2 r2 <<<"$c2"
  read -r _ _ r1b <<<"$before1"
  read -r _ _ r2b <<<"$before2"
  loss=$(echo "scale=2; 100 * ($d1 + $d2) / ($d1 + $d2 + $q1 + $q2)" | bc)
  record netem_rtt "$rtt"
  record netem_loss "$loss"
  echo "  netem: ping n1 -> n2 rtt avg ${rtt:-?} ms; into the nodes $((d1 + d2)) packets dropped of $((d1 + d2 + q1 + q2)) ($loss %)," \
    "$((r1 - r1b + r2 - r2b)) TCP segments retransmitted during the run"
  [ -n "$rtt" ] && [ "$(echo "$rtt >= 190" | bc)" = 1 ] || bad "netem: ping round trip ${rtt:-none} ms, not the 200 ms of 100 ms each way"
  [ $((d1 + d2)) -gt 0 ] || bad "netem: no packet dropped"
}

for k in $(seq "$runs"); do
  echo "run $k of $runs"
  want bitwise && { begin bitwise "$k"; bitwise bitwise 2; finish; }
  if want netem; then
    begin netem "$k"
    if netem_on; then
      netem
    else # no way to delay and drop here: say so, never a pass
      skipped="netem ($(sort -u netem.err | head -1))"
      echo "  SKIPPED: netem: $(sort -u netem.err | head -1)"
    fi
    netem_off
    finish
  fi
  want linkdown && { begin linkdown "$k"; linkdown; finish; }
  want resume && { begin resume "$k"; resume; finish; }
done
echo "scenario: seconds over $runs runs (min / median / max), failed runs"
for s in bitwise netem netem_rtt netem_loss linkdown_wall linkdown_exit resume; do
  echo "${T[$s]:-}" | tr ' ' '\n' | grep . | sort -g |
    awk -v s="$s" -v f="${F[${s%_*}]:-0}" '{v[NR]=$1} END {if (NR) printf "  %-14s %6.2f / %6.2f / %6.2f  (%d runs, %d failed)\n", s, v[1], v[int((NR+1)/2)], v[NR], NR, f}'
done
echo "$fails failure(s)${skipped:+; skipped: $skipped}"
[ "$kept" -eq 0 ] || echo "logs of the $kept failed run(s): $logs"
[ "$fails" -eq 0 ]
