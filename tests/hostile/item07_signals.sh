#!/bin/bash
# Issue 13 item 7: SIGINT / SIGTERM during golden, run --dump and run --save
# remove the temporaries; a temporary left by a killed process (SIGKILL) is
# swept, with a log line, by the next save of the same directory.
. "$(dirname "$0")/lib.sh"
# wait_tmp GLOB: up to 60 s for a temporary matching GLOB to appear
wait_tmp() { for _ in $(seq 600); do ls -d $1 >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }
interrupt() { # interrupt SIGNAL GLOB CMD...
  local sig=$1 glob=$2
  shift 2
  # a background job of a script starts with SIGINT ignored: restore the default
  env --default-signal=INT,TERM "$@" >out.txt 2>&1 &
  local pid=$!
  if ! wait_tmp "$glob"; then echo "FAIL: no temporary $glob appeared"; fails=$((fails + 1)); kill -9 $pid; wait $pid; return; fi
  kill -$sig $pid
  wait $pid
  local rc=$?
  if ls -d $glob >/dev/null 2>&1; then
    echo "FAIL: $sig during '$*' left $(ls -d $glob)"; fails=$((fails + 1))
  elif [ $rc -lt 128 ]; then
    echo "FAIL: $sig during '$*': exit $rc, not ended by the signal"; fails=$((fails + 1))
  else
    echo "ok: $sig during '$*' (exit $rc): $(grep -m1 'removed the temporary' out.txt)"
  fi
}
interrupt INT 'g.tmp-*' "$P" golden --steps 200 --out g --quiet
interrupt TERM 'r.tmp-*' "$P" run --steps 200 --dump r --quiet
interrupt TERM 'ck.tmp-*' "$P" run --steps 200 --save ck --save-interval 1 --quiet
interrupt INT 'ck2.tmp-*' "$P" run --steps 200 --expert-model-parallel-size 2 --save ck2 --save-interval 1 --quiet
# SIGKILL leaves the temporary; the next save sweeps it and says so
"$P" golden --steps 200 --out k --quiet >/dev/null 2>&1 &
pid=$!
wait_tmp 'k.tmp-*'
kill -9 $pid
wait $pid 2>/dev/null
check "SIGKILL left k.tmp-*" ls -d k.tmp-*
expect 0 "removed the stale temporary directory" "$P" golden --steps 1 --out k --quiet
check "no k.tmp-* after the sweep" test -z "$(ls -d k.tmp-* 2>/dev/null)"
finish
