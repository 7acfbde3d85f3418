/* parallel/plan/memmodel_act.h - the activation table of the memory model: what one
 * block, head and MTP input keep between forward and backward, and the
 * scratch their backward adds, in bytes for T tokens (untemplated).
 *
 * ONE place to update when the model's saved tensors change: every entry
 * names the code that allocates it (block.c, head.c, step.c, stage.c, the
 * kernels' *_saved_bytes, ep.c's blk_state, cp.c's saved state).  The
 * memory model (parallel/plan/memmodel.h) multiplies these by the microbatches a
 * schedule keeps in flight; tests/parallel/plan/test_memmodel.c checks the table
 * against the kernels' own size functions and against the allocator's
 * per-rank peaks of real runs.  docs/planning.md, "Activations".
 *
 * Sizes are doubles (bytes): absurd configs must give huge numbers, not
 * overflow.  Counts of reals use `es` bytes (8 f64, 4 f32, 2 bf16); int32
 * and int64 arrays keep their width.
 */
#ifndef PAR_PARALLEL_PLAN_MEMMODEL_ACT_H
#define PAR_PARALLEL_PLAN_MEMMODEL_ACT_H

#include <stdint.h>

#include "model/config.h"

typedef struct {
    const par_config *cfg;
    double es;          /* bytes of a real (activation storage)                  */
    /* executors (parallel/moe/ep.h, parallel/cp/cp_hook.h) */
    int64_t ep;         /* EP size; 1: the serial MoE kernel (moe.c saved struct) */
    double recv_factor; /* EP: rows this rank receives per row it sends (1: balanced
                         * routing; measured: rows_recv / rows_sent of a run)      */
    int64_t cp;         /* CP size; > 1: cp.c keeps the attention state of its halo +
                         * local rows and the whole rows' compressed entries       */
    int64_t cp_rank;    /* CP rank (rank 0 has no halo)                           */
    int64_t rows;       /* rows of the microbatch (CP: T = rows * S / CP)         */
    int64_t tp;         /* TP size; > 1: tp_hook.c keeps the shard's attention state
                         * of the microbatch's T tokens (0: 1)                    */
    int64_t etp;        /* ETP size; > 1: etp_hook.c (EP 1) or ep_etp.c (EP > 1) keep
                         * the rows layer's state of the group's gathered rows (0: 1) */
    int gate_logits;    /* 1: the router's logits [T, E] are saved (a GPU job); 0:
                         * parity's block.c recomputes them (and the scores) from
                         * the normed input in the backward                        */
    int64_t sp;         /* sequence parallelism: the TP size (0, 1: none); T is then the
                         * rank's tokens, the TP layers' state is of sp * T gathered */
    int vocab;          /* 1: the vocab-parallel head / CE (tp_vocab_hook.c)        */
    int tp_mlp;         /* 1: the TP shared expert's own hook (tp_moe_hook.c, EP = ETP = 1) */
    int tp_shared;      /* 1: the shared expert runs TP-split, whatever EP and ETP are
                         * (parallel/layout/tp_split.h par_tp_shared_expert_split; inside ep.c
                         * and etp_hook.c with EP or ETP > 1): tp_mlp.c's state of
                         * tp_tokens and I/TP hidden units, and the w2 shard     */
    int recompute;      /* 1: full recomputation (Megatron --recompute-granularity
                         * full): a block keeps its input only (planning; parity
                         * does not recompute)                                    */
} par_memmodel_act_ctx;

/* Bytes kept by block b's forward on T tokens until its backward (block.c:
 * two mHC states, the attention sub-layer, the gate and the MoE sub-layer
 * through the serial kernel, ep.c or cp.c). */
double par_memmodel_act_block_saved(const par_memmodel_act_ctx *c, int b, int64_t T);
/* The part of par_memmodel_act_block_saved the TP / ETP hooks keep in their own
 * state (tp_hook.c / cptp_hook.c with TP > 1, etp_hook.c with ETP > 1 and
 * EP 1): freed at the next forward of the same block and microbatch slot,
 * not with the pipeline slot (so a pipeline keeps it for every microbatch
 * of the step).  ep.c's blk_state (EP > 1) and cp_hook.c's saved rows
 * (CP > 1, TP 1) are freed by the block's weight pass, with the
 * microbatch: they are in par_memmodel_act_block_saved's released part. */
double par_memmodel_act_block_exec_kept(const par_memmodel_act_ctx *c, int b, int64_t T);
/* The most bytes block b's backward holds at once beyond what it saved
 * (block.c's gradient buffers + the larger of the MoE and the attention
 * backward's scratch). */
double par_memmodel_act_block_bwd_peak(const par_memmodel_act_ctx *c, int b, int64_t T);

/* The kernels' saved structs (mhc.c par_hc_saved_bytes, attention.c
 * par_attn_saved_bytes of block b), for T tokens. */
double par_memmodel_act_hc_saved(const par_memmodel_act_ctx *c, int64_t T);
double par_memmodel_act_attn_saved(const par_memmodel_act_ctx *c, int b, int64_t T);

/* A head (main or MTP; head.c): kept, and its backward's scratch. */
/* What the input pass (B) of a split backward keeps for its weight pass
 * (W), from B until W (model/block.c wkeep_alloc and the serial attention's
 * par_attn_keep, or cp.c's kept projections' gradients; ep.c's dy rows;
 * head.c's dxn, dx; the MTP input's dep, den, demb, dhn). */
double par_memmodel_act_block_wkeep(const par_memmodel_act_ctx *c, int b, int64_t T);
double par_memmodel_act_head_wkeep(const par_memmodel_act_ctx *c, int64_t T);
double par_memmodel_act_mtp_input_wkeep(const par_memmodel_act_ctx *c, int64_t T);
double par_memmodel_act_head_saved(const par_memmodel_act_ctx *c, int64_t T);
/* The vocab-parallel head's saved forward (tp_vocab_hook.c: one per
 * microbatch and head, kept for the step; 0 without the hook). */
double par_memmodel_act_head_hook_kept(const par_memmodel_act_ctx *c, int64_t T);
double par_memmodel_act_head_bwd_peak(const par_memmodel_act_ctx *c, int64_t T);
/* The MTP input (head.c): kept, and its backward's scratch. */
double par_memmodel_act_mtp_input_saved(const par_memmodel_act_ctx *c, int64_t T);
double par_memmodel_act_mtp_input_bwd_peak(const par_memmodel_act_ctx *c, int64_t T);

/* The residual stream [T, n, d] (block outputs, pipeline messages). */
double par_memmodel_act_stream(const par_memmodel_act_ctx *c, int64_t T);
/* A batch of T tokens (model/data.c: six int32 arrays). */
double par_memmodel_act_batch(int64_t T);
/* The statistics of a window of Ns samples with rows for `rows` blocks (a
 * pipeline rank's stages' blocks; < 0: every block) (model.c
 * par_stats_alloc_held). */
double par_memmodel_act_stats(const par_memmodel_act_ctx *c, int64_t Ns, int64_t rows);
/* Its two parts: the window's per-sample terms (par_stats_alloc_terms: what
 * a pipeline rank keeps for the step) and the aux counts of its rows (what
 * each slot's par_stats_view holds for one microbatch's Ns samples). */
double par_memmodel_act_stats_terms(const par_memmodel_act_ctx *c, int64_t Ns, int64_t rows);
double par_memmodel_act_stats_rows(const par_memmodel_act_ctx *c, int64_t Ns, int64_t rows);

#endif
