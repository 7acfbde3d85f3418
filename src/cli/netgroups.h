/* cli/netgroups.h - the emulated network's cost per process-group kind.
 *
 * From the spans a par_netrun recorded (record_spans = 1), sums per group
 * kind (the group name up to ':', e.g. "cp", "ep", "dp-cp", "edp": the
 * names parallel/layout/groups.c gives) and per tier: the bytes ranks sent
 * (collective steps' sends, point-to-point sends) and the exposed
 * communication time (the blocked parts), summed over ranks and the largest
 * rank's.  So `parity run --context-parallel-size 4 --topology ...` reports
 * the halo exchange and the entry all-gathers (group "cp") per tier.
 */
#ifndef PAR_CLI_NETGROUPS_H
#define PAR_CLI_NETGROUPS_H

#include <stdio.h>

#include "comm/clock.h"

/* Prints the table (nothing when no span was recorded). */
void par_net_group_summary(const par_netrun *r, FILE *f);

#endif
