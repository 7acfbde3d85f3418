#!/bin/bash
# One MPI process of the cluster tier (tools/cluster-tier.sh), its output
# kept: stdout and stderr are copied to $RANK_DIR/rank.$PMI_RANK.{out,err}
# and still go to hydra (mpiexec's own log).  The process keeps this shell's
# pid (exec), so hydra's signals and exit status reach parity unchanged;
# the copies (tee) run in sessions of their own, so that hydra's cleanup of a
# failed job (a kill of the process group) cannot lose the last lines.
[ -n "${RANK_DIR:-}" ] && [ -d "$RANK_DIR" ] || exec "$@"
exec > >(exec setsid tee -a "$RANK_DIR/rank.$PMI_RANK.out") 2> >(exec setsid tee -a "$RANK_DIR/rank.$PMI_RANK.err" >&2)
exec "$@"
