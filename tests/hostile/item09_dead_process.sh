#!/bin/bash
# Issue 13 item 9: under a launcher that does not kill the job, a process
# killed with -9 (or stopped: silent) must not leave the others hanging:
# every surviving process exits within 10 s with a report naming the dead
# process and what its ranks waited on; no orphans.  Prints the time from
# the kill to the exit of the last survivor.  usage: PARITY MPIEXEC
. "$(dirname "$0")/mpi_lib.sh"
# scenario NAME SIGNAL VICTIM NPROCS ARGS...: start, wait for step 1, signal the victim
scenario() {
  local name=$1 sig=$2 victim=$3 np=$4
  shift 4
  rm -f pid.* out.* err.* rc.*
  timeout 300 "$MPIEXEC" -disable-auto-cleanup -n $np ./wrap.sh "$P" run --backend mpi --comm-timeout 300 "$@" \
    >mpiexec.out 2>&1 &
  local mpid=$!
  for _ in $(seq 1200); do grep -q "step 1/" err.0 2>/dev/null && break; sleep 0.1; done
  local vp
  vp=$(pgrep -P "$(cat pid.$victim)" | head -1)
  if [ -z "$vp" ]; then echo "FAIL: $name: no victim process"; fails=$((fails + 1)); kill $mpid; wait; return; fi
  local t0
  t0=$(date +%s.%N)
  kill -$sig "$vp"
  local survivors=() q
  for q in $(seq 0 $((np - 1))); do [ "$q" != "$victim" ] && survivors+=("$q"); done
  local left=1
  for _ in $(seq 300); do # 30 s at most
    left=0
    for q in "${survivors[@]}"; do [ -f rc.$q ] || left=$((left + 1)); done
    [ $left -eq 0 ] && break
    sleep 0.1
  done
  local dt
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  [ "$sig" = STOP ] && kill -9 "$vp" 2>/dev/null # the stopped one is ours to end
  if [ $left -ne 0 ]; then # hanging survivors (the landed build): end them, by pid
    for f in pid.*; do kill -9 $(pgrep -P "$(cat $f)") 2>/dev/null; done
  fi
  wait $mpid 2>/dev/null
  echo "measured: $name: the last of ${#survivors[@]} survivors exited $dt s after the SIG$sig (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  if [ $left -ne 0 ]; then echo "FAIL: $name: $left survivors still running after 30 s"; fails=$((fails + 1)); fi
  check "$name: within 10 s" [ "$(echo "$dt <= 10" | bc)" = 1 ]
  for q in "${survivors[@]}"; do
    check "$name: process $q exit status 1 (rc $(cat rc.$q 2>/dev/null))" [ "$(cat rc.$q 2>/dev/null)" = 1 ]
    check "$name: process $q names the dead process" grep -q "MPI process $victim (world ranks .*) died" err.$q
    check "$name: process $q says what it waited on" grep -q "waiting here: rank" err.$q
  done
  check "$name: one story: every survivor names the same first failure" \
    [ "$(grep -ho 'rank [0-9]* failed first' err.* | sort -u | wc -l)" = 1 ]
  local orphans=0
  for f in pid.*; do pgrep -P "$(cat $f)" >/dev/null 2>&1 && orphans=$((orphans + 1)); done
  check "$name: no orphan processes" [ $orphans -eq 0 ]
}
# ITEM09_RUNS=N repeats each scenario N times; ITEM09_ONLY=1|2|3|4 runs one
# (the stress runs of docs/comm.md: under `taskset -c 1` beside busy loops)
want() { [ -z "${ITEM09_ONLY:-}" ] || [ "$ITEM09_ONLY" = "$1" ]; }
for _ in $(seq "${ITEM09_RUNS:-1}"); do
  want 1 &&
    scenario "kill -9, 4 processes" KILL 2 4 --world-size 4 --expert-model-parallel-size 4 --steps 200
  want 2 &&
    scenario "kill -9, 2 processes x 2 ranks" KILL 1 2 --world-size 4 --ranks-per-process 2 \
      --expert-model-parallel-size 4 --steps 200
  want 3 &&
    scenario "SIGSTOP (silent, heartbeats stop), 4 processes" STOP 3 4 --world-size 4 --steps 200
  # fiber-hosted ranks park while they wait: the watchdog and the poll hook still see the death
  want 4 &&
    scenario "kill -9, 2 processes x 4 fiber ranks" KILL 1 2 --world-size 8 --ranks-per-process 4 \
      --rank-host fiber --expert-model-parallel-size 8 --steps 200
done
finish
