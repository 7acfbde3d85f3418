#!/usr/bin/env bash
# Issue 34 item 5: `parity plan --search` answers absurd inputs fast: a budget
# below every layout's weights says "nothing fits" at once; a budget of 1e30
# and a world of 2^20 GPUs are bounded by --search-seconds (progress on
# stderr) and end within seconds (the old build ran for minutes).
# Usage: r3_item5_plan_search.sh path/to/parity
. "$(dirname "$0")/lib.sh"
EXPECT_TIMEOUT=15
expect 0 "nothing fits: every layout needs at least" "$P" plan --preset v4-pro --search --world-size 1024 \
  --memory-per-gpu 1B
expect 0 "nothing fits" "$P" plan --search --world-size 8 --memory-per-gpu 1B
expect 0 "stopped after 2 s" "$P" plan --preset v4-pro --search --world-size 1024 --memory-per-gpu 1e30 \
  --search-seconds 2
expect 0 "candidates evaluated (" "$P" plan --preset v4-pro --search --world-size 1024 --memory-per-gpu 1e30 \
  --search-seconds 2
expect 0 "search   1048576 GPUs, B 16777216" "$P" plan --search --world-size 1048576 --global-batch-size 16777216 \
  --search-seconds 2
# the default bound (5 s) without --search-seconds
expect 0 "stopped after 5 s" "$P" plan --search --world-size 1048576 --global-batch-size 16777216
expect 0 "stopped after 5 s" "$P" plan --preset v4-pro --search --world-size 1024 --memory-per-gpu 1e30
expect 0 '"nothing_fits":' bash -c '"$0" plan --search --world-size 8 --memory-per-gpu 1B --json n.json && cat n.json' "$P"
expect 2 "--search-seconds" "$P" plan --search --world-size 8 --search-seconds 0
finish
