/* parallel/plan/costas.h - `parity run --cost-as PRESET`: what the virtual clock
 * charges so that a run whose numerics are a small preset costs what the
 * target preset would (docs/planning.md "--cost-as").  Untemplated; built
 * once per run from the resolved layout, read by every rank.
 *
 * The target's layout is the run's (world, sizes, schedule, micro-batch
 * size, global batch in rows, so the same microbatches m) with the target's
 * pipeline layout: `layout` when given, else the even split when the target's
 * layers divide, else par_pplayout_suggest's uneven split.  Stage s of the
 * run stands for stage s of the target.  One executor action of stage s
 * (micro-batch-size b rows; PP = 1: all rows of the rank, b at a time)
 * charges the target's forward FLOPs of its segment on T_t = b S_t / CP
 * tokens (steptime.c's table) times 1 (F, B, W) or 2 (BW); with EP > 1 the
 * routed experts are left out of that and charged by parallel/moe/ep.c on the
 * rows each rank actually received, so the run's routing skew is in the
 * cost. */
#ifndef PAR_PARALLEL_PLAN_COSTAS_H
#define PAR_PARALLEL_PLAN_COSTAS_H

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

typedef struct {
    par_config target;          /* the target preset                                 */
    par_layout tl;              /* the target's layout (resolved)                    */
    double tokens;              /* T_t: target tokens of one b-row microbatch         */
    double mb_mul;              /* b-row microbatches per executor action (PP=1: B/Da/b) */
    double row_mul;             /* target routed rows per run routed row: S_t K_t / (S_s K_s) */
    double row_bytes;           /* bytes of one target routed row: 2 d_t (bf16)      */
    double expert_flops;        /* forward FLOPs of one target routed row: 6 d_t I_t */
    int routed_apart;           /* 1 (EP > 1): f_dense leaves the routed experts to ep.c */
    int n_stages;
    double *f_dense;            /* [n_stages] forward FLOPs of one action of stage s */
    int n_blocks;
    double *blk_mul;            /* [run blocks] target MoE blocks per run MoE block of its stage */
    double pp_scale;            /* PP message bytes: (S_t n d_t 2) / (S_s n d_s es) */
    double cp_scale;            /* CP message bytes: (S_t hd_t 2) / (S_s hd_s es)   */
    double dense_scale, expert_scale; /* DP collectives: target / run floats x bytes per float / es */
} par_costas;

/* Builds the cost plan of a run (cfg, its resolved layout, its precision in
 * bits) charged as preset `target` (layout: the target's pipeline layout
 * string or NULL).  PAR_ENOTFOUND for an unknown preset, PAR_EINVAL when
 * the target's layout rules fail or a stage of the target holds MoE blocks
 * that the run's stage has none to stand for; one message naming the rule. */
par_status par_costas_build(const par_config *cfg, const par_layout *l, int precision, const char *target,
                            const char *layout, par_costas *out);
void par_costas_free(par_costas *c);

#endif
