/* parallel/plan/steptime.h - an analytical step time for a resolved layout on
 * an emulated network (untemplated; docs/planning.md "Step time").
 *
 *   compute    the model's GEMM FLOPs (steptime.c's table, backward = 2 x
 *              forward) at the network's peak FLOP/s times `efficiency`;
 *   EP         four all-to-alls per MoE layer and microbatch (dispatch and
 *              combine, forward and backward) of k * T / EP bf16 rows to
 *              every EP peer, the heaviest receiver `skew` times its share,
 *              costed by comm/netmodel.c's par_net_alltoall (alpha-beta by
 *              tier, IB through the rank's NIC share);
 *   CP         a ring all-gather of the compressed entries per compressed
 *              attention layer and microbatch (forward; twice backward);
 *   PP         the schedule's dry run (parallel/schedule/schedule.h) with those
 *              per-stage F / B / W costs and the p2p time of one [T, n, d]
 *              bf16 message as latency: makespan and bubble;
 *   DP         once per step, exposed: reduce-scatter of the fp32 gradients
 *              and all-gather of the bf16 parameters (ZeRO-1) or an
 *              all-reduce (replicated), over dp-cp and edp (par_net_ring).
 * step = makespan + DP.  No overlap of communication with compute is
 * assumed (an upper bound on the exposed part).
 */
#ifndef PAR_PARALLEL_PLAN_STEPTIME_H
#define PAR_PARALLEL_PLAN_STEPTIME_H

#include "comm/netmodel.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

#define PAR_STEPTIME_MAX_PP 128

typedef struct {
    double efficiency; /* fraction of peak FLOP/s the GEMMs reach (0: 1.0) */
    double skew;       /* EP receive skew (0: memmodel.h's default)          */
    int recompute;     /* full recomputation: the backward runs the forward again */
    /* > 0 (must be PP): measured skews per pipeline rank (`parity run --cost-as`'s
     * cost_as.stage_skew): they replace `skew` in the EP receive bytes and make the
     * routed experts of the stage cost stage_skew times their share (its hottest rank) */
    int n_stage_skew;
    double stage_skew[PAR_STEPTIME_MAX_PP];
} par_steptime_opts;

typedef struct {
    double flops;           /* model FLOPs of one step (all ranks)            */
    double compute_s;       /* compute of the busiest pipeline rank            */
    double ep_s, cp_s;      /* its EP / CP communication                       */
    double pp_p2p_s;        /* one activation message between stages           */
    double dp_s;            /* the DP gradient / parameter exchange            */
    double makespan_s;      /* the pipeline (or the microbatch loop)           */
    double bubble;          /* idle fraction of the dry run (0 without PP)     */
    double step_s;          /* makespan + DP                                   */
    double ep_bytes[PAR_TIER_COUNT]; /* EP bytes one rank sends per step, by tier */
    double ep_bytes_world[PAR_TIER_COUNT]; /* EP bytes all ranks send per step, by tier (dispatch + combine) */
} par_steptime;

/* Forward GEMM FLOPs of block b (main layer or MTP block) on T tokens. */
double par_steptime_block_flops(const par_config *cfg, int b, double T);
/* Forward FLOPs of the output head (and of the MTP input) on T tokens. */
double par_steptime_head_flops(const par_config *cfg, double T);
double par_steptime_mtp_input_flops(const par_config *cfg, double T);
/* Forward FLOPs of segment s of resolved layout l on T tokens (its blocks,
 * MTP input and heads); *moe: its MoE blocks (layers and MTP), *cmp: the
 * compressed ones among them. */
double par_steptime_segment_flops(const par_config *cfg, const par_layout *l, int s, double T, int *moe, int *cmp);

par_status par_steptime_estimate(const par_config *cfg, const par_layout *l, const par_netmodel *net,
                                 const par_steptime_opts *o, par_steptime *out);

#endif
