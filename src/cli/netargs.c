/* cli/netargs.c - the emulated-network flags (see netargs.h). */
#include "cli/netargs.h"

#include <string.h>

#include "core/fileio.h"

void par_net_args_init(par_net_args *a) { memset(a, 0, sizeof *a); }

int par_net_opts(par_opt *opts, int n, int cap, par_net_args *a)
{
    const par_opt mine[] = {
        {"topology", PAR_OPT_STR, &a->topology, "FILE|PRESET",
         "emulated network: a JSON topology file or reference|h800|h100"},
        {"gpus-per-node", PAR_OPT_INT, &a->gpus_per_node, "N", "emulated GPUs (ranks) per node", PAR_CHK_POS, 1 << 20},
        {"nvlink-gbps", PAR_OPT_DOUBLE, &a->nvlink_gbps, "GB/s",
         "emulated NVLink bandwidth in gigabytes/s", PAR_CHK_POS_REAL, 1e9},
        {"ib-gbps", PAR_OPT_DOUBLE, &a->ib_gbps, "GB/s",
         "emulated InfiniBand bandwidth per NIC in gigabytes/s", PAR_CHK_POS_REAL, 1e9},
        {"trace", PAR_OPT_STR, &a->trace, "FILE",
         "write the emulated timeline as Chrome trace JSON (Perfetto)"},
    };
    int k = (int)(sizeof mine / sizeof mine[0]);
    if (n < 0 || n + k > cap)
        return -1;
    memcpy(opts + n, mine, sizeof mine);
    return n + k;
}

par_status par_net_args_resolve(const par_net_args *a, par_netmodel *out, int *enabled)
{
    *enabled = a->topology || a->gpus_per_node || a->nvlink_gbps || a->ib_gbps || a->trace;
    if (!*enabled)
        return PAR_OK;
    par_netmodel m;
    par_status st;
    if (!a->topology)
        st = par_netmodel_preset("reference", &m);
    else if (par_path_exists(a->topology))
        st = par_netmodel_load(a->topology, &m);
    else if (par_netmodel_preset(a->topology, &m) == PAR_OK)
        st = PAR_OK;
    else
        st = par_err(PAR_ENOTFOUND, "--topology %s: neither a file nor a preset (reference, "
                                    "h800, h100)", a->topology);
    if (st != PAR_OK)
        return st;
    if (a->gpus_per_node < 0 || a->gpus_per_node > 1 << 20)
        return par_err(PAR_EINVAL, "--gpus-per-node %lld: must be in 1..%d",
                       (long long)a->gpus_per_node, 1 << 20);
    if (a->nvlink_gbps < 0 || a->ib_gbps < 0)
        return par_err(PAR_EINVAL, "--nvlink-gbps %g / --ib-gbps %g: must be positive",
                       a->nvlink_gbps, a->ib_gbps);
    if (a->gpus_per_node)
        m.gpus_per_node = (int)a->gpus_per_node;
    if (a->nvlink_gbps)
        m.bw[PAR_TIER_NVLINK] = a->nvlink_gbps * 1e9;
    if (a->ib_gbps)
        m.bw[PAR_TIER_IB] = a->ib_gbps * 1e9;
    st = par_netmodel_validate(&m);
    if (st != PAR_OK)
        return st;
    *out = m;
    return PAR_OK;
}
