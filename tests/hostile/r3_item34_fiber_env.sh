#!/usr/bin/env bash
# Issue 34 items 3 and 4: PARITY_FIBER_WORKERS and PARITY_FIBER_STACK are
# checked before any rank starts: out of range, past OpenBLAS's compiled
# thread limit (MAX_THREADS of openblas_get_config: 512 workers corrupted the
# heap, 4096 crashed) or malformed is exit 2 with the numbers; a stack below
# what a rank needs (16K died on the guard page) or above what the machine can
# map (1048576M hung) likewise.  Usage: r3_item34_fiber_env.sh path/to/parity
. "$(dirname "$0")/lib.sh"
EXPECT_TIMEOUT=30
F=(run --preset v4-tiny --steps 1 --backend fiber --quiet)
# item 3: the issue's reproducers, then the range and the syntax
expect 2 "PARITY_FIBER_WORKERS=512: expected a number of worker threads in 1.." \
  env PARITY_FIBER_WORKERS=512 "$P" "${F[@]}" --world-size 512 --set global_batch_size=512
expect 2 "PARITY_FIBER_WORKERS=4096" env PARITY_FIBER_WORKERS=4096 "$P" "${F[@]}" --world-size 512 \
  --set global_batch_size=512
bl=$(env PARITY_FIBER_WORKERS=4096 "$P" "${F[@]}" --world-size 8 2>&1 | sed -n 's/.*MAX_THREADS=\([0-9]*\).*/\1/p')
if [ -n "$bl" ]; then
  expect 2 "OpenBLAS's compiled thread limit (MAX_THREADS=$bl" env PARITY_FIBER_WORKERS=$((bl + 1)) "$P" "${F[@]}" \
    --world-size 8
  expect 0 "process peaks" env PARITY_FIBER_WORKERS="$bl" "$P" "${F[@]}" --world-size 8
fi
for w in 0 -1 abc 3x 99999999999999999999; do
  expect 2 "PARITY_FIBER_WORKERS=$w: expected a number" env PARITY_FIBER_WORKERS="$w" "$P" "${F[@]}" --world-size 8
done
expect 0 "process peaks" env PARITY_FIBER_WORKERS=2 "$P" "${F[@]}" --world-size 8
# item 4
expect 2 "PARITY_FIBER_STACK=16K (16 KiB) is below the 64 KiB a rank needs" \
  env PARITY_FIBER_STACK=16K "$P" "${F[@]}" --world-size 8
expect 2 "PARITY_FIBER_STACK=1048576M (1048576 MiB) is more than this machine's memory" \
  env PARITY_FIBER_STACK=1048576M "$P" "${F[@]}" --world-size 8
expect 2 "is not a stack size" env PARITY_FIBER_STACK=big "$P" "${F[@]}" --world-size 8
expect 2 "is not a stack size" env PARITY_FIBER_STACK=1Q "$P" "${F[@]}" --world-size 8
expect 0 "process peaks" env PARITY_FIBER_STACK=64K "$P" "${F[@]}" --world-size 8
finish
