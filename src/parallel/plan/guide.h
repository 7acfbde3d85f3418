/* parallel/plan/guide.h - the tuning guide's arithmetic (../shared/reference/
 * 001_*: "DeepSeek-V4 training parallel tuning, 1k and 10k GPUs") for a
 * resolved layout, and its configs A, B, C.  Untemplated; docs/planning.md
 * gives every formula with its section.
 *
 *   routed expert parameters   P_expert = 3 h f                  (显存估算)
 *   routed weights per rank    layers * E/EP * P_expert * 2 B    (bf16, ETP 1, no FSDP)
 *   microbatches               m = B / (b * Da)                  (PP 与 microbatch)
 *   1F1B bubble                (p - 1) / (m + p - 1)
 *   interleaved VPP            PP <= microbatch group <= m (Megatron's check)
 *   tokens per EP dispatch     T_group = EP * b * S / CP         (CP 与专家批次)
 *   assignments per expert     E[T_expert] = k * T_group / E
 *   boundary exchange          S / CP >= D_window                (长上下文边界)
 */
#ifndef PAR_PARALLEL_PLAN_GUIDE_H
#define PAR_PARALLEL_PLAN_GUIDE_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

typedef struct {
    int64_t world, pp, vpp, tp, cp, ep, etp, da, de, b, B, S;
    int64_t m;                 /* microbatches per step and pipeline           */
    double bubble;             /* (p-1)/(m+p-1) (0 without PP)                 */
    int vpp_legal;             /* the interleaved schedule with VPP 2 passes   */
    char vpp_why[256];         /* its refusal (the schedule's message), or ""  */
    int64_t t_group;           /* EP * b * S / CP                              */
    double e_t_expert;         /* k * T_group / E                              */
    int64_t local_rows, d_window;
    int d_window_ok;           /* local_rows >= d_window (always with CP 1)    */
    int64_t expert_params;     /* 3 h f                                        */
    int64_t moe_layers;        /* MoE layers of the fullest pipeline rank      */
} par_guide_row;

/* The row of a resolved layout.  The VPP check's refusal goes through
 * par_err (quiet it, as the CLI does, to keep it off the log). */
par_status par_guide_row_of(const par_config *cfg, const par_layout *l, par_guide_row *out);

/* bf16 routed weights of `moe_layers` MoE layers on one rank for EP: the
 * guide's table (显存估算). */
typedef struct {
    int64_t ep, experts_per_rank, de, moe_layers;
    double bytes;
} par_guide_ep_row;

/* Rows for EP/2, EP, 2*EP (those that divide E and N/PP), at the layout's
 * N/PP and its fullest stage's MoE layers; returns the row count (<= 3). */
int par_guide_ep_table(const par_config *cfg, const par_layout *l, par_guide_ep_row rows[3]);

/* The guide's configs A (1024 GPUs, CP 1), B (8192, CP 1), C (8192, CP 4),
 * each PP 8, EP 64, TP = ETP = 1, b = 1, B = 4096, resolved against cfg
 * (the uneven split par_pplayout_suggest gives for the layers).  rows[i]
 * is config "ABC"[i]. */
par_status par_guide_configs(const par_config *cfg, par_guide_row rows[3]);
/* The layout of config i (0..2) before resolution. */
void par_guide_config_layout(const par_config *cfg, int i, par_layout *l);

#endif
