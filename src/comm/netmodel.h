/* comm/netmodel.h - the emulated network and GPU of parity's virtual clock.
 *
 * A par_netmodel describes a cluster of nodes of `gpus_per_node` GPUs: pairs
 * of ranks on one node talk over NVLink, pairs on different nodes over
 * InfiniBand through the node's `nics_per_node` NICs.  Rank r sits on node
 * r / gpus_per_node (world ranks).  Every tier has a latency alpha (seconds
 * per message) and a bandwidth (bytes per second, one direction); a message
 * of n bytes over a tier takes alpha + n / bandwidth.  The emulated GPU has a
 * peak FLOP/s and an HBM bandwidth for the compute roofline.
 *
 * Cost functions below give the time of one rank's part of one exchange step
 * under the algorithm parity charges for it (docs/network.md): ring for
 * all-reduce / reduce-scatter / all-gather, direct pairwise for all-to-all
 * (off-node bytes over the rank's share of the node's NICs), a pipelined
 * chain for broadcast, dissemination for barrier.  Pure functions of their
 * arguments: the emulated timeline is the same on every backend.
 */
#ifndef PAR_COMM_NETMODEL_H
#define PAR_COMM_NETMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum {
    PAR_TIER_SELF = 0, /* a rank to itself: free                 */
    PAR_TIER_NVLINK,   /* same node                              */
    PAR_TIER_IB,       /* different nodes, through the NICs      */
    PAR_TIER_COUNT
} par_tier;

const char *par_tier_name(par_tier t); /* "self", "nvlink", "ib" */

typedef struct {
    char name[32];
    int gpus_per_node;              /* ranks per node                       */
    int nics_per_node;              /* IB NICs per node                     */
    double bw[PAR_TIER_COUNT];      /* bytes/s one direction ([SELF] unused) */
    double alpha[PAR_TIER_COUNT];   /* seconds per message ([SELF] 0)        */
    double peak_flops;              /* FLOP/s of one emulated GPU            */
    double hbm_bw;                  /* bytes/s of its HBM                    */
} par_netmodel;

/* Presets: "reference" (the design notes: NVLink 900 GB/s, IB 50 GB/s per
 * NIC, 8 GPUs and 8 NICs per node), "h800", "h100" (sources in
 * docs/network.md).  Unknown name: PAR_ENOTFOUND listing the presets. */
par_status par_netmodel_preset(const char *name, par_netmodel *out);
/* Name of preset i (NULL past the end). */
const char *par_netmodel_preset_name(int i);

/* Loads a JSON topology file (docs/network.md): an object with optional
 * "preset" (the base, default "reference") and overrides "name",
 * "gpus_per_node", "nics_per_node", "nvlink_gbps", "ib_gbps" (GB/s, 1e9
 * bytes/s), "nvlink_latency_us", "ib_latency_us", "peak_tflops",
 * "hbm_gbps".  Unknown keys are an error (a typo would silently change
 * nothing).  The result is validated. */
par_status par_netmodel_load(const char *path, par_netmodel *out);
/* The same from JSON text (label names it in messages). */
par_status par_netmodel_parse(const char *text, size_t len, const char *label,
                              par_netmodel *out);
/* Every count >= 1, every bandwidth and the peaks > 0 and finite, latencies
 * >= 0. */
par_status par_netmodel_validate(const par_netmodel *m);
/* One line: "h800: 8 GPUs/node, NVLink 160 GB/s (2 us), IB 8 x 50 GB/s (5 us), ...". */
void par_netmodel_describe(const par_netmodel *m, char *buf, size_t n);

/* Node of a world rank, and the tier between two world ranks. */
int par_net_node(const par_netmodel *m, int wrank);
par_tier par_net_tier(const par_netmodel *m, int wa, int wb);
/* Off-node bandwidth of one rank: its share of the node's NICs,
 * bw[IB] * nics_per_node / gpus_per_node. */
double par_net_nic_share(const par_netmodel *m);

/* What one rank's part of one step costs. */
typedef struct {
    double time;                     /* seconds                           */
    par_tier tier;                   /* slowest tier used (SELF: nothing) */
    uint64_t bytes[PAR_TIER_COUNT];  /* bytes this rank sends, by tier    */
    uint64_t msgs[PAR_TIER_COUNT];   /* messages this rank sends, by tier */
} par_netcost;

/* Compute time of flops and HBM bytes: max(flops/peak, bytes/hbm_bw). */
double par_net_compute_time(const par_netmodel *m, uint64_t flops, uint64_t bytes);
/* A point-to-point message of `bytes` from world rank wa to wb. */
par_netcost par_net_p2p(const par_netmodel *m, int wa, int wb, size_t bytes);
/* `steps` ring steps of `step_bytes` each over the group in rank order
 * (wranks[p]: world ranks), rank `me` sending to me+1: every step costs the
 * slowest link's alpha + step_bytes / bandwidth.  All-reduce is two such
 * phases of p-1 steps of n/p bytes: 2(p-1) alpha + 2(p-1)/p n / beta. */
par_netcost par_net_ring(const par_netmodel *m, const int *wranks, int p, int me, int steps,
                         size_t step_bytes);
/* Direct pairwise all-to-all: rank `me` sends bytes_to[j] to and receives
 * bytes_from[j] from every group rank j != me (NULL: none).  Each side costs
 * max(NVLink: n_msgs alpha + bytes / bw, IB: n_msgs alpha + bytes / NIC
 * share), messages being the non-empty peers; the rank's time is the larger
 * side. */
par_netcost par_net_alltoall(const par_netmodel *m, const int *wranks, int p, int me,
                             const size_t *bytes_to, const size_t *bytes_from);
/* The same with the bytes of group rank j given as fn(ctx, j) (NULL fn:
 * none): for callers that describe them by a rule, not an array. */
typedef size_t (*par_net_bytes_fn)(const void *ctx, int j);
par_netcost par_net_alltoall_by(const par_netmodel *m, const int *wranks, int p, int me,
                                par_net_bytes_fn to, const void *to_ctx, par_net_bytes_fn from,
                                const void *from_ctx);
/* Broadcast as a pipelined chain from root through the group in rank
 * order: (p-1) alpha + bytes / beta of the slowest chain link. */
par_netcost par_net_chain(const par_netmodel *m, const int *wranks, int p, int me, int root,
                          size_t bytes);
/* Dissemination barrier: ceil(log2 p) rounds of the slowest tier's alpha. */
par_netcost par_net_barrier(const par_netmodel *m, const int *wranks, int p);

#endif
