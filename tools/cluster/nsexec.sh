#!/bin/bash
# hydra's launcher for the cluster tier (tools/cluster-tier.sh): called as an
# ssh would be, `nsexec.sh [-x] HOST COMMAND...`, it runs COMMAND in network
# namespace par-HOST, so the processes of different "nodes" talk over TCP
# through veth pairs (UCX_TLS=tcp,self; MPIR_CVAR_NOLOCAL=1).  They keep the
# machine's hostname: with a UTS namespace per node (unshare --uts, hostname
# HOST) the 4 processes printed their results and then spun at 100 % CPU at
# the end for minutes (MPICH 4.0.2 / UCX; not diagnosed), so parity sees one
# host (its dead-process check then uses pids, not the 6 s heartbeat).
while [ "${1#-}" != "$1" ]; do shift; done
h=$1
shift
exec ip netns exec "par-$h" sh -c "exec $*"
