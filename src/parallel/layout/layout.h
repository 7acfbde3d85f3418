/* parallel/layout/layout.h - a parallel layout (Megatron-LM's sizes) and its
 * validation against the model.  Untemplated; a par_layout is a plain value.
 *
 * The folding rule (MoE Parallel Folding): with N ranks and PP stages,
 *   N / PP = TP * CP * Da = ETP * EP * De,
 * Da the attention data-parallel size, De the expert data-parallel size.
 * Without a world size, N = PP * lcm(TP*CP, ETP*EP), the smallest that folds.
 *
 * Usage:
 *   par_layout l;
 *   par_layout_init(&l);                 // all sizes 1, nothing resolved
 *   l.pp = 2; l.cp = 2; l.ep = 4; l.world = 16;
 *   par_layout_model m = {.n_layers = 8, .n_mtp_layers = 1, ...};
 *   if (par_layout_resolve(&l, &m) != PAR_OK) puts(par_last_error());
 *   // l.da, l.de, l.n_micro, l.vpp, l.schedule, l.pipe are now set
 *
 * docs/layouts.md lists every rule and its message.
 */
#ifndef PAR_PARALLEL_LAYOUT_LAYOUT_H
#define PAR_PARALLEL_LAYOUT_LAYOUT_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/pplayout.h"

#define PAR_LAYOUT_STR_MAX 1024

/* What the layout rules need from the model and batch config (MODEL.md
 * names; plain integers so tests and tools need no par_config). */
typedef struct {
    int64_t n_layers;
    int64_t n_mtp_layers;
    int64_t n_routed_experts;  /* E                                   */
    int64_t seq_length;        /* S tokens per row                    */
    int64_t global_batch_size; /* B rows; used when the layout has 0  */
    int64_t window_size;
    int64_t n_ratios;                /* entries of compress_ratios (0: none) */
    const int64_t *compress_ratios;  /* [n_ratios], block b's ratio     */
} par_layout_model;

typedef struct {
    /* ---- given (Megatron-LM flag names in comments) ---- */
    int64_t tp;            /* --tensor-model-parallel-size              */
    int64_t pp;            /* --pipeline-model-parallel-size            */
    int64_t vpp;           /* --virtual-pipeline-model-parallel-size; 0: from the layout string, else 1 */
    int64_t cp;            /* --context-parallel-size                   */
    int64_t ep;            /* --expert-model-parallel-size              */
    int64_t etp;           /* --expert-tensor-parallel-size             */
    int64_t world;         /* N; 0: PP * lcm(TP*CP, ETP*EP)             */
    int64_t micro_batch;   /* --micro-batch-size; 0: 1                  */
    int64_t global_batch;  /* --global-batch-size; 0: the model's B     */
    int64_t mb_group;      /* --microbatch-group-size-per-virtual-pipeline-stage; 0: PP */
    int distributed_optimizer;                /* --use-distributed-optimizer */
    char schedule[16];     /* --pipeline-schedule; "": interleaved when VPP > 1, else 1f1b */
    char pp_layout[PAR_LAYOUT_STR_MAX];       /* --pipeline-model-parallel-layout; "": none */
    int sequence_parallel; /* --sequence-parallel (TP > 1) */
    int tp_all_layers;     /* --tp-all-layers: accepted, a deprecated no-op (TP > 1 always splits the
                            * embedding / head / CE vocab-parallel and the shared expert, as Megatron) */

    /* ---- derived by par_layout_resolve ---- */
    int resolved;
    int64_t da;            /* N / (PP * TP * CP)                       */
    int64_t de;            /* N / (PP * ETP * EP)                      */
    int64_t n_micro;       /* m = B / (Da * micro_batch)               */
    int64_t d_window;      /* max(window_size, d_comp of every block)  */
    par_pplayout pipe;     /* the blocks of every segment              */
} par_layout;

/* Sizes 1, vpp/world/micro_batch/global_batch/mb_group 0 (defaults),
 * schedule and layout string empty. */
void par_layout_init(par_layout *l);

/* Sets the layout string (copied); NULL or "" clears it.  PAR_EINVAL when it
 * is longer than PAR_LAYOUT_STR_MAX - 1. */
par_status par_layout_set_pp_layout(par_layout *l, const char *str);
/* Sets the schedule name (checked by par_layout_resolve). */
par_status par_layout_set_schedule(par_layout *l, const char *name);

/* PP * lcm(TP*CP, ETP*EP): the smallest world the folding rule allows
 * (0 when a size is < 1 or the result overflows). */
int64_t par_layout_default_world(int64_t tp, int64_t pp, int64_t cp, int64_t ep, int64_t etp);

/* D_window = max(window_size, max over blocks of d_comp(ratio)),
 * d_comp(0) = 0, d_comp(4) = 8 (overlapping compression), d_comp(r) = r
 * otherwise. */
int64_t par_layout_d_window(const par_layout_model *m);

/* Fills the defaults, checks every rule (first broken one: PAR_EINVAL, or
 * PAR_EUNSUPPORTED for TP/ETP > 1, with one message naming the rule and the
 * numbers), parses or builds the pipeline layout and sets the derived
 * fields.  On failure *l keeps its given fields and resolved = 0. */
par_status par_layout_resolve(par_layout *l, const par_layout_model *m);

/* What `parity run` runs of a resolved layout's TP / ETP / SP: the rules of
 * layout.c's TP rules (docs/parallel.md "Tensor parallelism in the step"); PAR_EUNSUPPORTED naming the sizes otherwise.
 * The step executor and the planner's search (which marks such candidates
 * unsupported) both ask it. */
par_status par_layout_run_rules(const par_layout *l);

/* The layout rules' view of a config (points into cfg->compress_ratios). */
void par_layout_model_from_config(par_layout_model *m, const par_config *cfg);

/* Which pipeline rank runs segment s, and as which virtual chunk: Megatron's
 * interleaving (rank s % PP, chunk s / PP), except for dualpipev's V shape
 * (VPP 2: segment s < PP on rank s, segment s >= PP on rank 2*PP-1-s). */
int par_layout_segment_rank(const par_layout *l, int s);
int par_layout_segment_chunk(const par_layout *l, int s);
/* Segment run by pipeline rank pp_rank as virtual chunk `chunk`. */
int par_layout_segment_of(const par_layout *l, int pp_rank, int chunk);
/* 1 when a segment of pipeline rank pp_rank holds a block of kind k. */
int par_layout_stage_has(const par_layout *l, int pp_rank, par_block_kind k);

/* Known --pipeline-schedule names, NULL-terminated. */
const char *const *par_layout_schedule_names(void);

#endif
