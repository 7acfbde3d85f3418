/* comm/topology.h - the host's topology (hwloc) and where ranks are bound.
 *
 * `parity topo` prints the machine (packages, NUMA nodes, cores, PUs) and
 * the rank-to-core binding that `--bind` uses: the ranks of one process are
 * spread evenly over its cores in hwloc's logical order (packages, then cores
 * within them), rank r of n on core floor(r * ncores / n) while n <= ncores,
 * and round-robin, core r mod ncores, when ranks outnumber cores.  hwloc is
 * a required dependency (tools/setup.sh installs libhwloc-dev).
 */
#ifndef PAR_COMM_TOPOLOGY_H
#define PAR_COMM_TOPOLOGY_H

#include <stdio.h>

#include "core/status.h"

/* Physical cores (online CPUs when hwloc cannot load the topology); at least 1. */
int par_topo_ncores(void);
/* The core (logical index) of rank `rank` of `nranks` ranks in one process
 * on a host of `ncores` cores (the rule above; -1 for bad arguments). */
int par_topo_core_of(int rank, int nranks, int ncores);
/* Prints the topology and the binding of nranks ranks of one process. */
par_status par_topo_print(FILE *f, int nranks);
/* Binds the calling thread to par_topo_core_of(rank, nranks, ncores)'s
 * processing units.  PAR_EUNSUPPORTED without hwloc. */
par_status par_topo_bind_thread(int rank, int nranks);

#endif
