/* model/golden.h - writing golden sets (GOLDEN.md; templated: see
 * kernels/real.h).  docs/golden.md lists what a set holds.
 *
 *   params.K.safetensors  every parameter (floats in the working precision,
 *                         gate.tid2eid I32) before update K (K = 0..steps);
 *                         for K >= 1 also the optimizer state
 *                         opt.<name>.momentum (Muon) and opt.<name>.exp_avg /
 *                         opt.<name>.exp_avg_sq (AdamW)
 *   step.K.safetensors    inputs, out.*, act.*, router.*, attn.*.selected and
 *                         grad.* of step K (K < steps)
 */
#ifndef PAR_MODEL_GOLDEN_H
#define PAR_MODEL_GOLDEN_H

#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/facade.h"
#include "model/data.h"
#include "model/layout_record.h"
#include "model/model.h"

/* Writes dir/params.K.safetensors from buffers in the table's (global)
 * layout: params, opt_m, opt_v [t->n_float], i32 [t->n_i32]; opt_m NULL =
 * no optimizer state (params.0).  A parallel layout gathers into such
 * buffers first. */
par_status PAR_FN(par_golden_write_params_buf)(const par_param_table *t, const par_real *params,
                                               const par_real *opt_m, const par_real *opt_v,
                                               const int32_t *i32, const char *dir, int64_t k);

/* What step.K holds, as full (unsharded, global-batch) buffers. */
typedef struct {
    int64_t B, S;
    const int32_t *tokens, *segments;  /* [B, S] */
    par_step_scalars out;
    const par_real *logits;            /* [B, S, V] */
    const par_real *mtp_logits;        /* [B, S, V] (when n_mtp_layers > 0) */
    const par_real *const *act;        /* [n_blocks] pointers, each [B, S, n, d] */
    const int32_t *const *idx;         /* [n_blocks] pointers, each [B, S, K] */
    const int64_t *loads;              /* [n_blocks, E] */
    const int32_t *const *sel;         /* [n_blocks] pointers, each [B, S, index_topk] (ratio-4 blocks) */
    const par_real *grads;             /* [n_float] table layout */
} PAR_FN(par_golden_step_view);

/* The step file of v as a writer for a stream (core/safetensors.h
 * par_st_stream_*): every tensor of v with data has it; NULL pointers of v
 * (logits, mtp_logits, act / idx / sel or their entries, grads) and the five
 * out.* scalars are declared by shape, to be put (par_golden_put_scalars for
 * the scalars); the metadata of step k.  The writer references v's data. */
par_status PAR_FN(par_golden_step_writer)(const par_param_table *t, const PAR_FN(par_golden_step_view) *v,
                                          int64_t k, par_st_writer **out);
par_status PAR_FN(par_golden_put_scalars)(par_st_stream *st, const PAR_FN(par_golden_step_view) *v);
/* dir/KIND.k.safetensors (par_malloc'd; NULL: out of memory, said). */
char *PAR_FN(par_golden_file_path)(const char *dir, const char *kind, int64_t k);
/* The step file's name prefix of block b: "layers.b", or "mtp.i" for b = n_layers + i. */
static inline void par_golden_block_prefix(const par_config *c, int b, char *buf, size_t n)
{
    if (b < c->n_layers)
        snprintf(buf, n, "layers.%d", b);
    else
        snprintf(buf, n, "mtp.%lld", (long long)(b - c->n_layers));
}

/* The step file in one go (a writer streamed from v, all of it in memory). */
par_status PAR_FN(par_golden_write_step_view)(const par_param_table *t,
                                              const PAR_FN(par_golden_step_view) *v, const char *dir,
                                              int64_t k);

/* Writes dir/params.K.safetensors from the model's current parameters (and
 * optimizer state when with_opt).  M must hold every expert. */
par_status PAR_FN(par_golden_write_params)(const PAR_FN(par_model) *M, const char *dir, int64_t k,
                                           int with_opt);
/* Writes dir/step.K.safetensors from the last forward + backward (before the
 * update).  Needs M->have_fwd. */
par_status PAR_FN(par_golden_write_step)(const PAR_FN(par_model) *M, const char *dir, int64_t k);
/* Writes dir/ties.K.safetensors from the last forward (one shot, the serial
 * attention's saved indexer state): attn.<block>.ties I32 [B, S, S/4] of
 * each ratio-4 block, 1 at the entries scored exactly the top-k boundary's
 * score on rows where that score is shared across the boundary (another
 * top-k's tie order may pick others there), 0 elsewhere.  The comparator
 * reads it next to step.K to tell a tie-order difference of
 * attn.<block>.selected from a real one (docs/golden.md "ties.K").
 * Also router.<block>.ties I32 [B, S, E] of each score-routed block with
 * an exact tie at its top-K boundary in some row (kernels/moe.h
 * par_moe_gate_ties; none on the presets, whose scores are continuous),
 * for router.<block>.idx and .load.
 * counts, rcounts: rows with a choice, rows with such a tie, of the indexer
 * and of the routers.  No file when neither has anything to write. */
par_status PAR_FN(par_golden_write_ties)(const PAR_FN(par_model) *M, const char *dir, int64_t k, int64_t counts[2],
                                         int64_t rcounts[2]);

/* Writes dir/scores.K.safetensors (par_golden_opts.router_scores): the
 * router's selection values router.<block>.score [B, S, E] (s + bias, the
 * values the top K is taken on) of every score-routed block; the derived
 * bounds' routing margins (model/bounds.h).  Needs M->have_fwd, one shot. */
par_status PAR_FN(par_golden_write_scores)(const PAR_FN(par_model) *M, const char *dir, int64_t k);

/* manifest.json of a set in dir (GOLDEN.md keys; steps the total, first_step
 * where a resumed run started); takes ownership of the layout and data
 * objects (NULL: out of memory). */
par_status PAR_FN(par_golden_write_manifest)(const char *dir, const par_config *cfg, int64_t steps,
                                             int64_t first_step, cJSON *layout, cJSON *data);
/* AdamW entries whose update amplifies the gradient's rounding (f32 only;
 * docs/golden.md "AdamW's eps regime in f32"): _mark after each step's
 * backward (before the update) marks every AdamW entry with
 * atol_f32 eps / lr < |clip factor * grad| < eps; _overrides adds to man,
 * for each AdamW parameter with k marked entries, a written-reason tolerance
 * of the f32 policy plus 2 lr sqrt(k) sum_t B_t (t = 1..steps, B_t the
 * bound of |m^|/sqrt(v^)).  In f64 all of it does nothing (on = 0). */
typedef struct {
    int on;
    uint8_t *mask;  /* [tab.n_float] marked entries */
    double *max_g;  /* [tab.n] largest marked |grad| per parameter */
} PAR_FN(par_golden_amp);
par_status PAR_FN(par_golden_amp_init)(PAR_FN(par_golden_amp) *a, const PAR_FN(par_model) *M);
void PAR_FN(par_golden_amp_mark)(PAR_FN(par_golden_amp) *a, const PAR_FN(par_model) *M);
par_status PAR_FN(par_golden_amp_overrides)(const PAR_FN(par_golden_amp) *a, const PAR_FN(par_model) *M,
                                            int64_t steps, par_manifest *man);
void PAR_FN(par_golden_amp_free)(PAR_FN(par_golden_amp) *a);

/* Where a run's batches come from (par_golden_opts' data_path / fixture /
 * generator): open (may change cfg->seq_length to the data's), the global
 * batch of step k, the manifest's "data" object, close. */
typedef struct {
    int kind; /* 0 generator, 1 fixture, 2 file */
    par_fixture fx;
    par_pack_plan plan; /* fixture plan */
    par_st_file *file;
    const int32_t *tok, *seg;
    int64_t R;
    int64_t cursor0, cursor;
    char sha[PAR_SHA256_HEX];
} par_golden_data;

par_status PAR_FN(par_golden_data_open)(par_golden_data *ds, const par_golden_opts *o, par_config *cfg);
par_status PAR_FN(par_golden_data_next)(par_golden_data *ds, const par_golden_opts *o, const par_config *cfg,
                                        int64_t k, par_batch *b);
cJSON *PAR_FN(par_golden_data_json)(const par_golden_data *ds, const par_golden_opts *o, const par_config *cfg);
void PAR_FN(par_golden_data_close)(par_golden_data *ds);

/* The whole golden run (model/facade.h's par_golden_run for this precision). */
par_status PAR_FN(par_golden_run)(const par_golden_opts *o, par_golden_summary *sum);

/* openblas_get_corename(). */
const char *PAR_FN(par_golden_blas_core)(void);

#endif
