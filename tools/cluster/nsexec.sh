#!/bin/bash
# hydra's launcher for the cluster tier (tools/cluster-tier.sh): called as an
# ssh would be, `nsexec.sh [-x] HOST COMMAND...`, it runs COMMAND in network
# namespace par-HOST with its own UTS namespace whose hostname is HOST, so
# MPICH and parity see distinct hosts that talk over TCP through veth pairs.
while [ "${1#-}" != "$1" ]; do shift; done
h=$1
shift
exec ip netns exec "par-$h" unshare --uts sh -c "hostname $h && exec $*"
