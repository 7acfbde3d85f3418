# MPI helpers of the hostile scripts: usage SCRIPT PARITY MPIEXEC
. "$(dirname "$0")/lib.sh"
MPIEXEC=$BUILD_ARG
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v "$2")
# MPICH/UCX leak at MPI_Finalize (see tests/parallel/train/mpi_run_dump.sh)
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
# A launcher that does not kill the job when one process dies: each parity
# process is a child of a shell that ignores hydra's SIGUSR1 notices, so
# hydra sees the shell exit, not a process killed by a signal.
cat > wrap.sh <<'W'
#!/bin/sh
trap '' USR1
echo $$ > "$WRAP_DIR/pid.$PMI_RANK"
"$@" > "$WRAP_DIR/out.$PMI_RANK" 2> "$WRAP_DIR/err.$PMI_RANK"
echo "$?" > "$WRAP_DIR/rc.$PMI_RANK"
W
chmod +x wrap.sh
export WRAP_DIR=$W
