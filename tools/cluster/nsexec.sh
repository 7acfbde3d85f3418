#!/bin/bash
# hydra's launcher for the cluster tier (tools/cluster-tier.sh): called as an
# ssh would be, `nsexec.sh [-x] HOST COMMAND...`, it runs COMMAND in network
# namespace par-HOST and in a UTS namespace of its own whose hostname is HOST,
# so the processes of different "nodes" talk over TCP through veth pairs
# (UCX_TLS=tcp,self; MPIR_CVAR_NOLOCAL=1) and parity sees two hosts (its
# watchdog checks pids on its own host, heartbeats across hosts, and its
# reports name the host of a lost process).
while [ "${1#-}" != "$1" ]; do shift; done
h=$1
shift
exec ip netns exec "par-$h" unshare --uts sh -c "hostname $h && exec $*"
