#!/bin/bash
# Issue 13 item 2: absurd model sizes are refused (exit 2, the rule and the
# numbers) before any buffer is sized; no overflow, no crash.
. "$(dirname "$0")/lib.sh"
for v in 2147483647 2147483648 3000000000 9223372036854775807; do
  expect 2 "dim must be <= 65536, got $v" "$P" run --set dim=$v --quiet
done
expect 2 "dim must be <= 65536, got 2147483648" "$P" plan --set dim=2147483648
expect 2 "n_routed_experts must be <= 65536" "$P" plan --set n_routed_experts=1000000 --set n_activated_experts=2
expect 2 "hc_sinkhorn_iters must be <= 1000" "$P" run --set hc_sinkhorn_iters=100000000 --quiet
expect 2 "window_size must be <= 16777216" "$P" run --set window_size=2147483647 --quiet
expect 2 "index_topk must be <= 16777216" "$P" run --set index_topk=2147483647 --quiet
expect 2 "tokens per step" "$P" plan --set seq_length=16777216 --set global_batch_size=1024
expect 2 "vocab_size must be <= 16777216" "$P" golden --set vocab_size=4294967296 --out g --quiet
finish
