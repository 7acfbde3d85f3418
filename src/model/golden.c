/* model/golden.c - golden sets of the serial reference (see model/golden.h,
 * GOLDEN.md, docs/golden.md). */
#include "model/golden.h"

#include <cblas.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/device.h"
#include "core/fileio.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "model/data.h"
#include "parity_config.h"

#if PAR_REAL_BITS == 64
#define PREC_NAME "f64"
#else
#define PREC_NAME "f32"
#endif

const char *PAR_FN(par_golden_blas_core)(void)
{
    const char *s = openblas_get_corename();
    return s ? s : "unknown";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------- writing -- */

/* A tensor with its data, or (data NULL) declared by its shape for a
 * stream (par_golden_step_writer). */
static par_status add(par_st_writer *w, const char *name, par_dtype dt, int ndim,
                      const int64_t *shape, const void *data)
{
    if (!data)
        return par_st_writer_add_shape(w, name, dt, ndim, shape);
    par_tensor t = par_tensor_view(dt, ndim, shape, (void *)data);
    par_dev_host_read(data, par_tensor_nbytes(&t)); /* GPU mode: current on the host */
    return par_st_writer_add(w, name, &t);
}

/* The metadata of a golden file of step k. */
static par_status set_meta(par_st_writer *w, int64_t k)
{
    char kbuf[32];
    snprintf(kbuf, sizeof kbuf, "%lld", (long long)k);
    par_status s = par_st_writer_meta(w, "format", "parity-golden");
    if (!s)
        s = par_st_writer_meta(w, "precision", PREC_NAME);
    if (!s)
        s = par_st_writer_meta(w, "step", kbuf);
    return s;
}

char *PAR_FN(par_golden_file_path)(const char *dir, const char *kind, int64_t k)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%lld.safetensors", kind, (long long)k);
    char *path = par_path_join(dir, name);
    if (!path)
        par_err(PAR_ENOMEM, "golden: out of memory for a path");
    return path;
}

static par_status write_file(par_st_writer *w, const char *dir, const char *kind, int64_t k)
{
    par_status s = set_meta(w, k);
    if (s)
        return s;
    char *path = PAR_FN(par_golden_file_path)(dir, kind, k);
    if (!path)
        return PAR_ENOMEM;
    s = par_st_writer_write(w, path);
    par_free(path);
    return s;
}

par_status PAR_FN(par_golden_write_params_buf)(const par_param_table *t, const par_real *params,
                                               const par_real *opt_m, const par_real *opt_v,
                                               const int32_t *i32, const char *dir, int64_t k)
{
    par_st_writer *w = NULL;
    par_status s = par_st_writer_new(&w);
    if (s)
        return s;
    char name[PAR_PARAM_NAME_MAX + 32];
    for (int i = 0; i < t->n && !s; i++) {
        const par_param *p = &t->p[i];
        if (p->dtype == PAR_PDT_I32) {
            s = add(w, p->name, PAR_I32, p->ndim, p->shape, i32 + p->offset);
            continue;
        }
        s = add(w, p->name, PAR_REAL_DTYPE, p->ndim, p->shape, params + p->offset);
        if (s || !opt_m)
            continue;
        if (p->opt == PAR_OPT_MUON) {
            snprintf(name, sizeof name, "opt.%s.momentum", p->name);
            s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, opt_m + p->offset);
        } else if (p->opt == PAR_OPT_ADAMW) {
            snprintf(name, sizeof name, "opt.%s.exp_avg", p->name);
            s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, opt_m + p->offset);
            if (!s) {
                snprintf(name, sizeof name, "opt.%s.exp_avg_sq", p->name);
                s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, opt_v + p->offset);
            }
        }
    }
    if (!s)
        s = write_file(w, dir, "params", k);
    par_st_writer_free(w);
    return s;
}

static par_status need_all(const PAR_FN(par_model) *M, const char *what)
{
    if (M->e0 != 0 || M->e1 != M->E)
        return par_err(PAR_EINVAL,
                       "golden: %s needs a model holding every expert (this one holds [%lld, %lld) of %lld); "
                       "a parallel layout gathers first (src/parallel/train/run.c)",
                       what, (long long)M->e0, (long long)M->e1, (long long)M->E);
    return PAR_OK;
}

par_status PAR_FN(par_golden_write_params)(const PAR_FN(par_model) *M, const char *dir, int64_t k,
                                           int with_opt)
{
    par_status s = need_all(M, "writing parameters");
    if (s)
        return s;
    /* owning everything, the local layout is the table's */
    return PAR_FN(par_golden_write_params_buf)(&M->tab, M->params, with_opt ? M->opt_m : NULL, M->opt_v,
                                               M->i32, dir, k);
}

/* Block b's part of the step file (NULL pointers: declared for a stream). */
static par_status add_block(par_st_writer *w, const par_config *c, const PAR_FN(par_golden_step_view) *v, int b)
{
    int64_t B = v->B, S = v->S, n = c->hc_mult, d = c->dim, K = c->n_activated_experts, E = c->n_routed_experts;
    int64_t shX[4] = {B, S, n, d}, shK[3] = {B, S, K}, shE[1] = {E}, shI[3] = {B, S, c->index_topk};
    char pfx[32], name[PAR_PARAM_NAME_MAX + 32];
    par_golden_block_prefix(c, b, pfx, sizeof pfx);
    snprintf(name, sizeof name, "act.%s", pfx);
    par_status s = add(w, name, PAR_REAL_DTYPE, 4, shX, v->act ? v->act[b] : NULL);
    if (!s) {
        snprintf(name, sizeof name, "router.%s.idx", pfx);
        s = add(w, name, PAR_I32, 3, shK, v->idx ? v->idx[b] : NULL);
    }
    if (!s) {
        snprintf(name, sizeof name, "router.%s.load", pfx);
        s = add(w, name, PAR_I64, 1, shE, v->loads + (int64_t)b * E);
    }
    if (!s && par_config_ratio(c, b) == 4) {
        snprintf(name, sizeof name, "attn.%s.selected", pfx);
        s = add(w, name, PAR_I32, 3, shI, v->sel ? v->sel[b] : NULL);
    }
    return s;
}

par_status PAR_FN(par_golden_step_writer)(const par_param_table *t, const PAR_FN(par_golden_step_view) *v,
                                          int64_t k, par_st_writer **out)
{
    const par_config *c = &t->cfg;
    int64_t B = v->B, S = v->S, V = c->vocab_size;
    static const char *const scal_names[5] = {"out.loss", "out.loss_main", "out.loss_mtp",
                                              "out.loss_aux", "out.grad_norm"};
    par_st_writer *w = NULL;
    par_status s = par_st_writer_new(&w);
    if (s)
        return s;
    int64_t sh2[2] = {B, S}, shV[3] = {B, S, V};
    char name[PAR_PARAM_NAME_MAX + 32];
    s = add(w, "input.tokens", PAR_I32, 2, sh2, v->tokens);
    if (!s)
        s = add(w, "input.segments", PAR_I32, 2, sh2, v->segments);
    for (int i = 0; i < 5 && !s; i++) /* declared: put with par_golden_put_scalars */
        s = par_st_writer_add_shape(w, scal_names[i], PAR_REAL_DTYPE, 0, NULL);
    if (!s)
        s = add(w, "out.logits", PAR_REAL_DTYPE, 3, shV, v->logits);
    if (!s && c->n_mtp_layers > 0)
        s = add(w, "out.mtp_logits", PAR_REAL_DTYPE, 3, shV, v->mtp_logits);
    for (int b = 0; b < t->n_blocks && !s; b++)
        s = add_block(w, c, v, b);
    for (int i = 0; i < t->n && !s; i++) {
        const par_param *p = &t->p[i];
        if (p->dtype != PAR_PDT_REAL || !p->has_grad)
            continue;
        snprintf(name, sizeof name, "grad.%s", p->name);
        s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, v->grads ? v->grads + p->offset : NULL);
    }
    if (!s)
        s = set_meta(w, k);
    if (s) {
        par_st_writer_free(w);
        return s;
    }
    *out = w;
    return PAR_OK;
}

/* The five out.* scalars of v in the working precision, into the stream. */
par_status PAR_FN(par_golden_put_scalars)(par_st_stream *st, const PAR_FN(par_golden_step_view) *v)
{
    const par_real scal[5] = {(par_real)v->out.loss, (par_real)v->out.loss_main, (par_real)v->out.loss_mtp,
                              (par_real)v->out.loss_aux, (par_real)v->out.grad_norm};
    static const char *const names[5] = {"out.loss", "out.loss_main", "out.loss_mtp", "out.loss_aux",
                                         "out.grad_norm"};
    par_status s = PAR_OK;
    for (int i = 0; i < 5 && !s; i++)
        s = par_st_stream_put(st, names[i], &scal[i], sizeof scal[i]);
    return s;
}

par_status PAR_FN(par_golden_write_step_view)(const par_param_table *t,
                                              const PAR_FN(par_golden_step_view) *v, const char *dir,
                                              int64_t k)
{
    par_st_writer *w = NULL;
    par_status s = PAR_FN(par_golden_step_writer)(t, v, k, &w);
    if (s)
        return s;
    char *path = PAR_FN(par_golden_file_path)(dir, "step", k);
    par_st_stream *st = NULL;
    if (!path)
        s = PAR_ENOMEM;
    else if (!(s = par_st_stream_begin(w, path, &st)) && !(s = PAR_FN(par_golden_put_scalars)(st, v)))
        s = par_st_stream_commit(st);
    else
        par_st_stream_abort(st);
    par_free(path);
    par_st_writer_free(w);
    return s;
}

par_status PAR_FN(par_golden_write_step)(const PAR_FN(par_model) *M, const char *dir, int64_t k)
{
    if (!M->have_fwd)
        return par_err(PAR_EINVAL, "golden: step %lld has no forward to write", (long long)k);
    par_status s = need_all(M, "writing a step");
    if (s)
        return s;
    const par_real **act = par_calloc((size_t)M->n_blocks, sizeof *act, PAR_TAG_IO);
    const int32_t **idx = par_calloc((size_t)M->n_blocks, sizeof *idx, PAR_TAG_IO);
    const int32_t **sel = par_calloc((size_t)M->n_blocks, sizeof *sel, PAR_TAG_IO);
    if (!act || !idx || !sel) {
        s = par_err(PAR_ENOMEM, "golden: out of memory");
        goto fail_free;
    }
    for (int b = 0; b < M->n_blocks; b++) {
        act[b] = M->blk[b].Xout;
        idx[b] = M->blk[b].idx;
        sel[b] = M->blk[b].as.sel;
    }
    PAR_FN(par_golden_step_view) v = {
        .B = M->batch->B, .S = M->batch->S, .tokens = M->batch->tokens, .segments = M->batch->segments,
        .out = M->last, .logits = M->head.logits, .mtp_logits = M->mtp_head.logits, .act = act,
        .idx = idx, .loads = M->stats.loads, .sel = sel, .grads = M->grads,
    };
    s = PAR_FN(par_golden_write_step_view)(&M->tab, &v, dir, k);
fail_free:
    par_free((void *)act);
    par_free((void *)idx);
    par_free((void *)sel);
    return s;
}

/* Whether block b is score-routed and kept its gate input (a->xfn) for the
 * step's T tokens. */
static int PAR_FN(score_routed)(const PAR_FN(par_model) *M, int b)
{
    const PAR_FN(par_block_act) *a = &M->blk[b];
    return !a->hash && a->xfn && a->T == M->batch->B * M->batch->S;
}

/* Block b's gate scores sc [T, E] (sqrt(softplus(logits)), before the
 * bias), recomputed from its saved input and the weights the forward used
 * (the update has not run yet), and its bias (NULL: none); lg: scratch
 * [T, E].  0, nothing written, when b is not score_routed. */
static int PAR_FN(gate_scores_of)(const PAR_FN(par_model) *M, int b, par_real *lg, par_real *sc,
                                  const par_real **bias)
{
    const int64_t T = M->batch->B * M->batch->S, E = M->E;
    const PAR_FN(par_block_act) *a = &M->blk[b];
    if (!PAR_FN(score_routed)(M, b))
        return 0;
    const par_real *wg = PAR_FN(par_model_ptr)(M, M->params, M->tab.blocks[b].gate_weight);
    *bias = PAR_FN(par_model_ptr)(M, M->params, M->tab.blocks[b].gate_bias);
    par_dev_host_read(a->xfn, (size_t)(T * M->d) * sizeof(par_real)); /* GPU mode: on the host */
    PAR_FN(par_moe_gate_logits)(lg, a->xfn, wg, T, M->d, (int)E);
    PAR_FN(par_moe_gate_scores)(sc, lg, T * E);
    par_dev_host_read(sc, (size_t)(T * E) * sizeof(par_real));
    return 1;
}

/* router.<block>.ties I32 [B, S, E] of every score-routed block whose
 * selection has an exact tie at the top-K boundary in some row (kernels/moe.h
 * par_moe_gate_ties), from the scores recomputed from the block's saved
 * input and the weights and bias the forward used (the update has not run
 * yet).  Blocks without such a row write nothing, so a golden of continuous
 * scores (the presets) keeps its ties.K unchanged; *any is set when one
 * is added.  keep[b] holds block b's tensor until the file is written;
 * rc: rows with a choice and with a tie over those blocks. */
static par_status PAR_FN(router_ties)(const PAR_FN(par_model) *M, par_st_writer *w, int32_t **keep, int64_t rc[2],
                                      int *any)
{
    const int64_t T = M->batch->B * M->batch->S, E = M->E, K = M->K;
    int64_t sh[3] = {M->batch->B, M->batch->S, E};
    par_real *lg = par_malloc((size_t)(T * E > 0 ? T * E : 1) * sizeof *lg, PAR_TAG_IO);
    par_real *sc = par_malloc((size_t)(T * E > 0 ? T * E : 1) * sizeof *sc, PAR_TAG_IO);
    par_status s = lg && sc ? PAR_OK : par_err(PAR_ENOMEM, "golden: out of memory for the router's ties");
    rc[0] = rc[1] = 0;
    for (int b = 0; b < M->n_blocks && !s; b++) {
        const par_real *bias;
        if (!PAR_FN(gate_scores_of)(M, b, lg, sc, &bias))
            continue;
        int64_t c[2];
        int32_t *tie = keep[b] = par_malloc((size_t)(T * E > 0 ? T * E : 1) * sizeof *tie, PAR_TAG_IO);
        if (!tie)
            s = par_err(PAR_ENOMEM, "golden: out of memory for the router's ties (%lld tokens)", (long long)T);
        if (s || (s = PAR_FN(par_moe_gate_ties)(tie, c, sc, bias, T, (int)E, (int)K)))
            continue;
        rc[0] += c[0], rc[1] += c[1];
        if (c[1] == 0)
            continue;
        char pfx[32], name[64];
        par_golden_block_prefix(&M->cfg, b, pfx, sizeof pfx);
        snprintf(name, sizeof name, "router.%s.ties", pfx);
        if (!(s = add(w, name, PAR_I32, 3, sh, tie)))
            *any = 1;
    }
    par_free(lg);
    par_free(sc);
    return s;
}

/* scores.K.safetensors (par_golden_opts.router_scores; docs/recipes.md
 * "Derived bounds"): router.<block>.score [B, S, E] of every score-routed
 * block, the values the gate selects its top K on (s + bias, summed in
 * par_real as par_moe_gate_ties does), recomputed from the block's saved
 * input and the weights the forward used (the update has not run yet).
 * Nothing is written when no block is score-routed. */
par_status PAR_FN(par_golden_write_scores)(const PAR_FN(par_model) *M, const char *dir, int64_t k)
{
    const int64_t T = M->batch->B * M->batch->S, E = M->E;
    const int64_t sh[3] = {M->batch->B, M->batch->S, E};
    const size_t n = (size_t)(T * E > 0 ? T * E : 1);
    par_st_writer *w = NULL;
    par_real **keep = par_calloc((size_t)M->n_blocks + 1, sizeof *keep, PAR_TAG_IO);
    par_real *lg = par_malloc(n * sizeof *lg, PAR_TAG_IO);
    par_status s = keep && lg ? par_st_writer_new(&w) : par_err(PAR_ENOMEM, "golden: out of memory for the router's scores");
    int any = 0;
    for (int b = 0; b < M->n_blocks && !s; b++) {
        if (!PAR_FN(score_routed)(M, b))
            continue;
        par_real *v = keep[b] = par_malloc(n * sizeof *v, PAR_TAG_IO);
        if (!v) {
            s = par_err(PAR_ENOMEM, "golden: out of memory for the router's scores (%lld tokens)", (long long)T);
            break;
        }
        const par_real *bias;
        PAR_FN(gate_scores_of)(M, b, lg, v, &bias);
        for (int64_t i = 0; bias && i < T * E; i++)
            v[i] = v[i] + bias[i % E];
        char pfx[32], name[64];
        par_golden_block_prefix(&M->cfg, b, pfx, sizeof pfx);
        snprintf(name, sizeof name, "router.%s.score", pfx);
        if (!(s = add(w, name, PAR_REAL_DTYPE, 3, sh, v)))
            any = 1;
    }
    if (!s && any)
        s = write_file(w, dir, "scores", k);
    par_st_writer_free(w);
    for (int b = 0; keep && b < M->n_blocks; b++)
        par_free(keep[b]);
    par_free(keep);
    par_free(lg);
    return s;
}

/* ties.K.safetensors: attn.<block>.ties I32 [B, S, S/4] of every ratio-4
 * block whose saved indexer state the forward kept (kernels/attention.h
 * par_indexer_ties); counts[0], counts[1]: the rows with a choice and with
 * an exact tie at the top-k boundary, over those blocks.  A model without
 * any writes nothing. */
par_status PAR_FN(par_golden_write_ties)(const PAR_FN(par_model) *M, const char *dir, int64_t k, int64_t counts[2],
                                         int64_t rcounts[2])
{
    const int64_t B = M->batch->B, S = M->batch->S, T = B * S, ne = S / 4 > 0 ? S / 4 : 1;
    int64_t sh[3] = {B, S, ne}, tot[2] = {0, 0};
    par_st_writer *w = NULL;
    int32_t **tie = par_calloc((size_t)(2 * M->n_blocks), sizeof *tie, PAR_TAG_IO); /* indexer, router */
    par_status s = tie ? par_st_writer_new(&w) : par_err(PAR_ENOMEM, "golden: out of memory");
    int any = 0;
    for (int b = 0; b < M->n_blocks && !s; b++) {
        const PAR_FN(par_attn_saved) *as = &M->blk[b].as;
        if (M->adims[b].m != 4 || !as->iq)
            continue;
        int64_t c[2];
        char pfx[32], name[64];
        if (!(tie[b] = par_malloc((size_t)(T * ne) * sizeof(int32_t), PAR_TAG_IO)))
            s = par_err(PAR_ENOMEM, "golden: out of memory for the indexer's ties (%lld tokens)", (long long)T);
        const par_attn_dims *dm = &M->adims[b];
        par_dev_host_read(as->iq, (size_t)(T * dm->iH * dm->ihd) * sizeof(par_real)); /* GPU mode: on the host */
        par_dev_host_read(as->iw, (size_t)(T * dm->iH) * sizeof(par_real));
        par_dev_host_read(as->icmp, (size_t)(T * dm->ihd) * sizeof(par_real));
        if (!s)
            s = PAR_FN(par_indexer_ties)(tie[b], ne, c, as->iq, as->iw, as->icmp, M->batch->pos, dm, T);
        par_golden_block_prefix(&M->cfg, b, pfx, sizeof pfx);
        snprintf(name, sizeof name, "attn.%s.ties", pfx);
        if (!s)
            s = add(w, name, PAR_I32, 3, sh, tie[b]);
        if (!s)
            tot[0] += c[0], tot[1] += c[1], any = 1;
    }
    if (!s)
        s = PAR_FN(router_ties)(M, w, tie + M->n_blocks, rcounts, &any);
    if (!s && any)
        s = write_file(w, dir, "ties", k);
    if (!s)
        counts[0] = tot[0], counts[1] = tot[1];
    par_st_writer_free(w);
    for (int b = 0; tie && b < 2 * M->n_blocks; b++)
        par_free(tie[b]);
    par_free(tie);
    return s;
}

/* ---------------------------------------------------------------- data -- */

void PAR_FN(par_golden_data_close)(par_golden_data *ds)
{
    if (ds->kind == 1) {
        par_pack_plan_free(&ds->plan);
        par_fixture_free(&ds->fx);
    }
    par_st_close(ds->file);
    memset(ds, 0, sizeof *ds);
}

par_status PAR_FN(par_golden_data_open)(par_golden_data *ds, const par_golden_opts *o, par_config *cfg)
{
    memset(ds, 0, sizeof *ds);
    par_status s;
    int64_t B = cfg->global_batch_size;
    if (o->data_path && o->fixture)
        return par_err(PAR_EINVAL, "golden: give --data or --fixture, not both");
    if (o->fixture) {
        ds->kind = 1;
        s = par_fixture_load_named(&ds->fx, o->fixture, o->fixtures_dir);
        if (s)
            return s;
        if (ds->fx.seq_length != cfg->seq_length) {
            /* a fixture fixes the row length */
            par_config c2 = *cfg;
            c2.seq_length = ds->fx.seq_length;
            if ((s = par_config_validate(&c2))) {
                par_fixture_free(&ds->fx);
                return s;
            }
            *cfg = c2;
        }
        s = par_fixture_plan(&ds->fx, B, cfg->seq_length, &ds->plan);
        if (s) {
            par_fixture_free(&ds->fx);
            return s;
        }
        return PAR_OK;
    }
    if (o->data_path) {
        ds->kind = 2;
        s = par_st_read(o->data_path, &ds->file);
        if (s)
            return s;
        const par_tensor *tt = par_st_find(ds->file, "input.tokens");
        const par_tensor *ts = par_st_find(ds->file, "input.segments");
        if (!tt || !ts) {
            s = par_err(PAR_ENOTFOUND, "%s: needs tensors input.tokens and input.segments (I32 [R,S])",
                        o->data_path);
            goto fail_close;
        }
        if (tt->dtype != PAR_I32 || ts->dtype != PAR_I32 || tt->ndim != 2 ||
            !par_tensor_same_shape(tt, ts)) {
            char a[96], b[96];
            par_shape_str(tt->ndim, tt->shape, a, sizeof a);
            par_shape_str(ts->ndim, ts->shape, b, sizeof b);
            s = par_err(PAR_EFORMAT, "%s: input.tokens and input.segments must both be I32 [R,S]; the file has "
                        "input.tokens %s %s and input.segments %s %s", o->data_path, par_dtype_name(tt->dtype), a,
                        par_dtype_name(ts->dtype), b);
            goto fail_close;
        }
        ds->R = tt->shape[0];
        if (tt->shape[1] != cfg->seq_length) {
            par_config c2 = *cfg;
            c2.seq_length = tt->shape[1];
            if ((s = par_config_validate(&c2)))
                goto fail_close;
            *cfg = c2;
        }
        if (ds->R < o->steps * B) {
            s = par_err(PAR_EINVAL, "%s: %lld rows, but %lld steps of %lld rows need %lld", o->data_path,
                        (long long)ds->R, (long long)o->steps, (long long)B, (long long)(o->steps * B));
            goto fail_close;
        }
        ds->tok = tt->data;
        ds->seg = ts->data;
        s = par_batch_check(ds->tok, ds->seg, o->steps * B, cfg->seq_length, cfg->vocab_size,
                            o->data_path);
        if (s)
            goto fail_close;
        s = par_sha256_file(o->data_path, ds->sha);
        if (s)
            goto fail_close;
        return PAR_OK;
    fail_close:
        par_st_close(ds->file);
        ds->file = NULL;
        return s;
    }
    ds->kind = 0;
    return PAR_OK;
}

par_status PAR_FN(par_golden_data_next)(par_golden_data *ds, const par_golden_opts *o, const par_config *cfg,
                                        int64_t k, par_batch *b)
{
    int64_t B = cfg->global_batch_size, S = cfg->seq_length;
    par_status s;
    if (ds->kind == 2)
        return par_batch_set(b, ds->tok + k * B * S, ds->seg + k * B * S, cfg->vocab_size, o->data_path);
    if (ds->kind == 1)
        return par_batch_fill(b, &ds->plan, o->seed, ds->cursor, cfg->vocab_size, &ds->cursor);
    par_pack_plan plan;
    s = par_pack_plan_random(&plan, B, S, o->seed, k * B);
    if (s)
        return s;
    s = par_batch_fill(b, &plan, o->seed, ds->cursor, cfg->vocab_size, &ds->cursor);
    par_pack_plan_free(&plan);
    return s;
}

cJSON *PAR_FN(par_golden_data_json)(const par_golden_data *ds, const par_golden_opts *o, const par_config *cfg)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    if (ds->kind == 2) {
        cJSON_AddStringToObject(j, "source", "file");
        cJSON_AddStringToObject(j, "path", o->data_path);
        cJSON_AddStringToObject(j, "sha256", ds->sha);
        cJSON_AddNumberToObject(j, "first_row", 0);
        cJSON_AddNumberToObject(j, "rows_per_step", (double)cfg->global_batch_size);
    } else {
        cJSON_AddStringToObject(j, "source", ds->kind == 1 ? "fixture" : "generator");
        if (ds->kind == 1)
            cJSON_AddStringToObject(j, "fixture", o->fixture);
        cJSON_AddStringToObject(j, "generator", "parity-synthetic");
        cJSON_AddStringToObject(j, "packing", ds->kind == 1 ? "fixture" : "random");
        cJSON_AddNumberToObject(j, "seed", (double)o->seed);
        cJSON_AddNumberToObject(j, "cursor", (double)ds->cursor0);
        cJSON_AddNumberToObject(j, "next_cursor", (double)ds->cursor);
    }
    return j;
}

/* par_golden_write_manifest, with the f32 golden's AdamW tolerances from
 * amp (NULL: none). */
static par_status write_manifest(const char *dir, const par_config *cfg, int64_t steps, int64_t first_step,
                                 cJSON *layout, cJSON *data, const PAR_FN(par_golden_amp) *amp,
                                 const PAR_FN(par_model) *M)
{
    par_manifest man;
    par_manifest_init(&man);
    man.layout = layout;
    man.data = data;
    par_status s;
    if ((s = par_manifest_set_generator(&man, "parity", PARITY_VERSION)) ||
        (s = par_manifest_set_precision(&man, PREC_NAME)) ||
        (amp && (s = PAR_FN(par_golden_amp_overrides)(amp, M, steps, &man))))
        goto done;
    man.steps = steps;
    man.first_step = first_step;
    man.model = par_config_section_to_json(cfg, PAR_CFG_MODEL);
    man.train = par_config_section_to_json(cfg, PAR_CFG_TRAIN);
    if (man.train) {
        cJSON_AddNumberToObject(man.train, "global_batch_size", (double)cfg->global_batch_size);
        cJSON_AddNumberToObject(man.train, "seq_length", (double)cfg->seq_length);
    }
    if (!man.model || !man.train || !man.layout || !man.data) {
        s = par_err(PAR_ENOMEM, "golden: out of memory building the manifest");
        goto done;
    }
    s = par_manifest_write(&man, dir);
done:
    par_manifest_free(&man);
    return s;
}

par_status PAR_FN(par_golden_write_manifest)(const char *dir, const par_config *cfg, int64_t steps,
                                             int64_t first_step, cJSON *layout, cJSON *data)
{
    return write_manifest(dir, cfg, steps, first_step, layout, data, NULL, NULL);
}

/* ----------------------------------------------------------------- run -- */

/* The full-batch buffers a row-blocked step keeps for its step file. */
typedef struct {
    PAR_FN(par_model_keep) k;
    void **all; /* [3 * n_blocks + 2] every buffer, for the free */
    int n;
} blocked_keep;

static void keep_free(blocked_keep *bk)
{
    for (int i = 0; bk->all && i < bk->n; i++)
        par_free(bk->all[i]);
    par_free(bk->all);
    memset(bk, 0, sizeof *bk);
}

static par_status keep_alloc(blocked_keep *bk, const PAR_FN(par_model) *M, int64_t T)
{
    const par_config *c = &M->cfg;
    const int nb = M->n_blocks;
    memset(bk, 0, sizeof *bk);
    bk->n = 3 * nb + 2;
    bk->all = par_calloc((size_t)bk->n, sizeof *bk->all, PAR_TAG_IO);
    if (!bk->all)
        goto fail_oom;
    bk->k.act = (par_real **)bk->all;
    bk->k.idx = (int32_t **)(bk->all + nb);
    bk->k.sel = (int32_t **)(bk->all + 2 * nb);
    size_t t = (size_t)(T > 0 ? T : 1);
    if (!(bk->k.logits = bk->all[3 * nb] = par_calloc(t * (size_t)M->V, sizeof(par_real), PAR_TAG_IO)))
        goto fail_oom;
    if (c->n_mtp_layers > 0 &&
        !(bk->k.mtp_logits = bk->all[3 * nb + 1] = par_calloc(t * (size_t)M->V, sizeof(par_real), PAR_TAG_IO)))
        goto fail_oom;
    for (int b = 0; b < nb; b++) {
        if (!(bk->k.act[b] = par_calloc(t * (size_t)(M->n * M->d), sizeof(par_real), PAR_TAG_IO)) ||
            !(bk->k.idx[b] = par_calloc(t * (size_t)M->K, sizeof(int32_t), PAR_TAG_IO)))
            goto fail_oom;
        if (par_config_ratio(c, b) == 4 &&
            !(bk->k.sel[b] = par_calloc(t * (size_t)c->index_topk, sizeof(int32_t), PAR_TAG_IO)))
            goto fail_oom;
    }
    return PAR_OK;
fail_oom:
    keep_free(bk);
    return par_err(PAR_ENOMEM, "golden: out of memory keeping the step's %lld tokens for its file", (long long)T);
}

/* The step file of a row-blocked step from what its blocks kept. */
static par_status write_blocked_step(const PAR_FN(par_model) *M, const par_batch *batch, const blocked_keep *bk,
                                     const char *dir, int64_t k)
{
    PAR_FN(par_golden_step_view) v = {
        .B = batch->B, .S = batch->S, .tokens = batch->tokens, .segments = batch->segments, .out = M->last,
        .logits = bk->k.logits, .mtp_logits = bk->k.mtp_logits, .act = (const par_real *const *)bk->k.act,
        .idx = (const int32_t *const *)bk->k.idx, .loads = M->stats.loads,
        .sel = (const int32_t *const *)bk->k.sel, .grads = M->grads,
    };
    return PAR_FN(par_golden_write_step_view)(&M->tab, &v, dir, k);
}

/* Step k: forward and backward (one shot, or over row blocks), its file,
 * the update; info[k] (wall time without the writing). */
static par_status golden_step(const par_golden_opts *o, PAR_FN(par_model) *M, const par_batch *batch,
                              blocked_keep *bk, PAR_FN(par_golden_amp) *amp, const char *dir, int64_t k,
                              par_golden_step_info *info)
{
    const int blocked = o->rows_per_block > 0 && o->rows_per_block < batch->B;
    double t0 = now_s(), t1, t2;
    par_status s;
    if (blocked && o->router_scores)
        return par_err(PAR_EINVAL, "golden: --router-scores needs one-shot steps, but the step runs over row blocks "
                       "of %lld rows (--rows-per-block or the memory limit; the blocks keep no gate input)",
                       (long long)o->rows_per_block);
    if (blocked) {
        if ((!bk->all && (s = keep_alloc(bk, M, batch->B * batch->S))) ||
            (s = PAR_FN(par_model_forward_backward_rows)(M, batch, o->rows_per_block, &bk->k)))
            return s;
        t1 = now_s();
        if ((s = write_blocked_step(M, batch, bk, dir, k)))
            return s;
    } else {
        if ((s = PAR_FN(par_model_forward)(M, batch)) || (s = PAR_FN(par_model_backward)(M)))
            return s;
        t1 = now_s();
        if ((s = PAR_FN(par_golden_write_step)(M, dir, k)) ||
            (s = PAR_FN(par_golden_write_ties)(M, dir, k, info->index_rows, info->router_rows)) ||
            (o->router_scores && (s = PAR_FN(par_golden_write_scores)(M, dir, k))))
            return s;
    }
    t2 = now_s();
    PAR_FN(par_golden_amp_mark)(amp, M);
    if ((s = PAR_FN(par_model_update)(M)))
        return s;
    double t3 = now_s();
    info->loss = M->last.loss;
    info->loss_main = M->last.loss_main;
    info->loss_mtp = M->last.loss_mtp;
    info->loss_aux = M->last.loss_aux;
    info->grad_norm = M->last.grad_norm;
    info->wall_s = (t1 - t0) + (t3 - t2);
    return PAR_OK;
}

par_status PAR_FN(par_golden_run)(const par_golden_opts *o, par_golden_summary *sum)
{
    double t_start = now_s();
    par_config cfg = o->cfg;
    par_status s;
    if (o->steps < 1)
        return par_err(PAR_EINVAL, "golden: --steps must be >= 1 (got %lld)", (long long)o->steps);
    if (!o->out_dir || !*o->out_dir)
        return par_err(PAR_EINVAL, "golden: no output directory");
    if ((s = par_config_validate(&cfg)) || (s = par_config_check_runnable(&cfg)))
        return s;

    par_golden_data ds;
    if ((s = PAR_FN(par_golden_data_open)(&ds, o, &cfg)))
        return s;
    PAR_FN(par_model) M;
    par_batch batch;
    memset(&batch, 0, sizeof batch);
    char *tmp = NULL;
    blocked_keep bk;
    memset(&bk, 0, sizeof bk);
    PAR_FN(par_golden_amp) amp = {0, NULL, NULL};
    par_golden_step_info *info = par_calloc((size_t)o->steps, sizeof *info, PAR_TAG_MISC);
    if (!info) {
        PAR_FN(par_golden_data_close)(&ds);
        return par_err(PAR_ENOMEM, "golden: out of memory");
    }
    if ((s = PAR_FN(par_model_init)(&M, &cfg, o->seed)))
        goto fail_data;
    if ((s = PAR_FN(par_golden_amp_init)(&amp, &M)))
        goto fail_model;
    if ((s = par_batch_alloc(&batch, cfg.global_batch_size, cfg.seq_length)))
        goto fail_amp;
    if ((s = par_adir_begin(o->out_dir, &tmp)))
        goto fail_batch;
    if ((s = PAR_FN(par_golden_write_params)(&M, tmp, 0, 0)))
        goto fail_tmp;
    for (int64_t k = 0; k < o->steps; k++) {
        if ((s = PAR_FN(par_golden_data_next)(&ds, o, &cfg, k, &batch)))
            goto fail_tmp;
        if ((s = golden_step(o, &M, &batch, &bk, &amp, tmp, k, &info[k])))
            goto fail_tmp;
        if ((s = PAR_FN(par_golden_write_params)(&M, tmp, k + 1, 1)))
            goto fail_tmp;
        if (o->progress)
            fprintf(stderr,
                    "golden: step %lld/%lld  loss %.10g  (main %.10g  mtp %.10g  aux %.6g)  "
                    "grad_norm %.6g  %.3f s\n",
                    (long long)(k + 1), (long long)o->steps, info[k].loss, info[k].loss_main,
                    info[k].loss_mtp, info[k].loss_aux, info[k].grad_norm, info[k].wall_s);
    }

    /* manifest */
    par_layout_record lay;
    par_layout_record_serial(&lay, cfg.global_batch_size, PAR_FN(par_golden_blas_core)());
    if (o->rows_per_block > 0 && o->rows_per_block < cfg.global_batch_size)
        lay.micro_batch = o->rows_per_block; /* the row blocks: the gradients' summation order */
    if ((s = write_manifest(tmp, &cfg, o->steps, 0, par_layout_record_json(&lay),
                            PAR_FN(par_golden_data_json)(&ds, o, &cfg), &amp, &M)))
        goto fail_tmp;
    s = par_adir_commit(tmp, o->out_dir);
    tmp = NULL;
    if (s)
        goto fail_batch;
    if (sum) {
        memset(sum, 0, sizeof *sum);
        sum->steps = o->steps;
        sum->seq_length = cfg.seq_length;
        sum->step = info;
        info = NULL;
        sum->n_params = M.tab.n_float;
        snprintf(sum->blas_core, sizeof sum->blas_core, "%s", PAR_FN(par_golden_blas_core)());
        sum->wall_s = now_s() - t_start;
    }
    goto fail_batch; /* normal cleanup */

fail_tmp:
    par_adir_abort(tmp);
fail_batch:
    keep_free(&bk);
    par_batch_free(&batch);
fail_amp:
    PAR_FN(par_golden_amp_free)(&amp);
fail_model:
    PAR_FN(par_model_free)(&M);
fail_data:
    PAR_FN(par_golden_data_close)(&ds);
    par_free(info);
    return s;
}
