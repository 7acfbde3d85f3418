#!/bin/bash
# Issue 13 item 16: values that were silently accepted are refused (exit 2,
# the rule and the value).
. "$(dirname "$0")/lib.sh"
expect 2 "--world-size must be >= 1, got 0" "$P" run --world-size 0 --quiet
expect 2 "--micro-batch-size must be >= 1, got 0" "$P" run --micro-batch-size 0 --quiet
expect 2 "--global-batch-size must be >= 1, got 0" "$P" run --global-batch-size 0 --quiet
expect 2 "--global-batch-size must be >= 1, got 0" "$P" golden --global-batch-size 0 --out g --quiet
for v in 0 -1; do expect 2 "--comm-timeout must be > 0, got $v" "$P" run --comm-timeout $v --quiet; done
expect 2 "--comm-timeout expects a finite number, got 'nan'" "$P" run --comm-timeout nan --quiet
expect 2 "--save-interval must be >= 1, got 0" "$P" run --save-interval 0 --save ck --quiet
expect 2 "--gpus-per-node must be >= 1, got 0" "$P" run --gpus-per-node 0 --quiet
expect 2 "--rank must be >= 0, got -1" "$P" plan --rank -1
expect 2 "--latency must be <= 1000000000000, got 1e308" "$P" schedule --pipeline-schedule 1f1b \
  --pipeline-model-parallel-size 2 --microbatches 4 --latency 1e308
expect 2 "--pipeline-model-parallel-layout needs a non-empty value" "$P" run --pipeline-model-parallel-layout '' --quiet
expect 2 "--ranks-per-process applies to --backend mpi only" "$P" run --ranks-per-process 2 --quiet
expect 2 "--rank-host applies to --backend mpi only" "$P" run --rank-host fiber --quiet
expect 2 "--rank-host expects fiber or threads, got 'os'" "$P" run --backend mpi --rank-host os --quiet
expect 2 "--steps is given twice ('1' and '2')" "$P" run --steps 1 --steps 2 --quiet
expect 2 "--use-distributed-optimizer is given twice" "$P" run --use-distributed-optimizer --use-distributed-optimizer --quiet
expect 2 "--policy is given twice" "$P" compare a b --policy f64 --policy=bitwise
expect 2 "--expert-model-parallel-size is given twice" "$P" plan --expert-model-parallel-size 2 --expert-model-parallel-size 4
finish
