/* cli/netargs.h - the emulated-network flags of `parity run` (and friends).
 *
 *   --topology FILE|PRESET   a JSON topology file (docs/network.md) or a preset
 *                            name: reference, h800, h100
 *   --gpus-per-node N        override GPUs (ranks) per node
 *   --nvlink-gbps X          override NVLink bandwidth, GB/s (gigaBYTES, 1e9 B/s)
 *   --ib-gbps X              override per-NIC InfiniBand bandwidth, GB/s
 *   --trace FILE             write a Chrome trace (implies the network)
 *
 * Any of them switches the emulated network on (base: the "reference"
 * preset).  Wiring, in a command:
 *
 *   par_net_args na; par_net_args_init(&na);
 *   n = par_net_opts(opts, n, cap, &na);              // before par_args_parse
 *   ...parse...
 *   par_netmodel m; int on;
 *   if (par_net_args_resolve(&na, &m, &on) != PAR_OK) return 2;
 *   par_netrun *net = NULL;
 *   if (on && par_netrun_create(&m, world_size, na.trace != NULL, &net)) ...
 *   wopts.net = net;  par_world_run(...);
 *   if (net) { par_trace_summary(net, stdout, 64);
 *              if (na.trace) par_trace_write_chrome(net, na.trace);
 *              par_netrun_free(net); }
 */
#ifndef PAR_CLI_NETARGS_H
#define PAR_CLI_NETARGS_H

#include <stdint.h>

#include "cli/args.h"
#include "comm/netmodel.h"
#include "core/status.h"

typedef struct {
    const char *topology;    /* file or preset name; NULL: none given */
    int64_t gpus_per_node;   /* 0: from the topology                  */
    double nvlink_gbps;      /* 0: from the topology                  */
    double ib_gbps;          /* 0: from the topology                  */
    const char *trace;       /* Chrome trace path or NULL             */
} par_net_args;

void par_net_args_init(par_net_args *a);
/* Appends the options to `opts` (capacity checked); returns the new count
 * or -1. */
int par_net_opts(par_opt *opts, int n, int cap, par_net_args *a);
/* *enabled = 1 when any flag was given, and then *out is the model (a
 * preset or file, with the overrides applied and validated). */
par_status par_net_args_resolve(const par_net_args *a, par_netmodel *out, int *enabled);

#endif
