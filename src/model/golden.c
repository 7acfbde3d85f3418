/* model/golden.c - golden sets of the serial reference (see model/golden.h,
 * GOLDEN.md, docs/golden.md). */
#include "model/golden.h"

#include <cblas.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static par_status add(par_st_writer *w, const char *name, par_dtype dt, int ndim,
                      const int64_t *shape, const void *data)
{
    par_tensor t = par_tensor_view(dt, ndim, shape, (void *)data);
    return par_st_writer_add(w, name, &t);
}

static par_status write_file(par_st_writer *w, const char *dir, const char *kind, int64_t k)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%lld.safetensors", kind, (long long)k);
    char kbuf[32];
    snprintf(kbuf, sizeof kbuf, "%lld", (long long)k);
    par_status s = par_st_writer_meta(w, "format", "parity-golden");
    if (!s)
        s = par_st_writer_meta(w, "precision", PREC_NAME);
    if (!s)
        s = par_st_writer_meta(w, "step", kbuf);
    if (s)
        return s;
    char *path = par_path_join(dir, name);
    if (!path)
        return par_err(PAR_ENOMEM, "golden: out of memory for a path");
    s = par_st_writer_write(w, path);
    par_free(path);
    return s;
}

par_status PAR_FN(par_golden_write_params)(const PAR_FN(par_model) *M, const char *dir, int64_t k,
                                           int with_opt)
{
    par_st_writer *w = NULL;
    par_status s = par_st_writer_new(&w);
    if (s)
        return s;
    char name[PAR_PARAM_NAME_MAX + 32];
    for (int i = 0; i < M->tab.n && !s; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype == PAR_PDT_I32) {
            s = add(w, p->name, PAR_I32, p->ndim, p->shape, M->i32 + p->offset);
            continue;
        }
        s = add(w, p->name, PAR_REAL_DTYPE, p->ndim, p->shape, M->params + p->offset);
        if (s || !with_opt)
            continue;
        if (p->opt == PAR_OPT_MUON) {
            snprintf(name, sizeof name, "opt.%s.momentum", p->name);
            s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, M->opt_m + p->offset);
        } else if (p->opt == PAR_OPT_ADAMW) {
            snprintf(name, sizeof name, "opt.%s.exp_avg", p->name);
            s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, M->opt_m + p->offset);
            if (!s) {
                snprintf(name, sizeof name, "opt.%s.exp_avg_sq", p->name);
                s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, M->opt_v + p->offset);
            }
        }
    }
    if (!s)
        s = write_file(w, dir, "params", k);
    par_st_writer_free(w);
    return s;
}

par_status PAR_FN(par_golden_write_step)(const PAR_FN(par_model) *M, const char *dir, int64_t k)
{
    if (!M->have_fwd)
        return par_err(PAR_EINVAL, "golden: step %lld has no forward to write", (long long)k);
    const par_config *c = &M->cfg;
    const par_batch *bt = M->batch;
    int64_t B = bt->B, S = bt->S, n = M->n, d = M->d, V = M->V, E = M->E, K = M->K;
    int64_t L = c->n_layers;
    par_real scal[5] = {(par_real)M->last.loss, (par_real)M->last.loss_main,
                        (par_real)M->last.loss_mtp, (par_real)M->last.loss_aux,
                        (par_real)M->last.grad_norm};
    static const char *const scal_names[5] = {"out.loss", "out.loss_main", "out.loss_mtp",
                                              "out.loss_aux", "out.grad_norm"};
    par_st_writer *w = NULL;
    par_status s = par_st_writer_new(&w);
    if (s)
        return s;
    int64_t sh2[2] = {B, S}, shV[3] = {B, S, V}, shX[4] = {B, S, n, d}, shK[3] = {B, S, K},
            shE[1] = {E}, shI[3] = {B, S, c->index_topk};
    char name[PAR_PARAM_NAME_MAX + 32];
    s = add(w, "input.tokens", PAR_I32, 2, sh2, bt->tokens);
    if (!s)
        s = add(w, "input.segments", PAR_I32, 2, sh2, bt->segments);
    for (int i = 0; i < 5 && !s; i++)
        s = add(w, scal_names[i], PAR_REAL_DTYPE, 0, NULL, &scal[i]);
    if (!s)
        s = add(w, "out.logits", PAR_REAL_DTYPE, 3, shV, M->head.logits);
    if (!s && c->n_mtp_layers > 0)
        s = add(w, "out.mtp_logits", PAR_REAL_DTYPE, 3, shV, M->mtp_head.logits);
    for (int b = 0; b < M->n_blocks && !s; b++) {
        const PAR_FN(par_block_act) *a = &M->blk[b];
        char pfx[32];
        if (b < L)
            snprintf(pfx, sizeof pfx, "layers.%d", b);
        else
            snprintf(pfx, sizeof pfx, "mtp.%lld", (long long)(b - L));
        snprintf(name, sizeof name, "act.%s", pfx);
        s = add(w, name, PAR_REAL_DTYPE, 4, shX, a->Xout);
        if (!s) {
            snprintf(name, sizeof name, "router.%s.idx", pfx);
            s = add(w, name, PAR_I32, 3, shK, a->idx);
        }
        if (!s) {
            snprintf(name, sizeof name, "router.%s.load", pfx);
            s = add(w, name, PAR_I64, 1, shE, M->stats.loads + (int64_t)b * E);
        }
        if (!s && M->adims[b].m == 4) {
            snprintf(name, sizeof name, "attn.%s.selected", pfx);
            s = add(w, name, PAR_I32, 3, shI, a->as.sel);
        }
    }
    for (int i = 0; i < M->tab.n && !s; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype != PAR_PDT_REAL || !p->has_grad)
            continue;
        snprintf(name, sizeof name, "grad.%s", p->name);
        s = add(w, name, PAR_REAL_DTYPE, p->ndim, p->shape, M->grads + p->offset);
    }
    if (!s)
        s = write_file(w, dir, "step", k);
    par_st_writer_free(w);
    return s;
}

/* ---------------------------------------------------------------- data -- */

typedef struct {
    int kind; /* 0 generator, 1 fixture, 2 file */
    par_fixture fx;
    par_pack_plan plan; /* fixture plan */
    par_st_file *file;
    const int32_t *tok, *seg;
    int64_t R;
    int64_t cursor0, cursor;
    char sha[PAR_SHA256_HEX];
} data_src;

static void data_close(data_src *ds)
{
    if (ds->kind == 1) {
        par_pack_plan_free(&ds->plan);
        par_fixture_free(&ds->fx);
    }
    par_st_close(ds->file);
    memset(ds, 0, sizeof *ds);
}

static par_status data_open(data_src *ds, const par_golden_opts *o, par_config *cfg)
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
            s = par_err(PAR_EFORMAT, "%s: input.tokens and input.segments must both be I32 [R,S]",
                        o->data_path);
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

static par_status data_next(data_src *ds, const par_golden_opts *o, const par_config *cfg, int64_t k,
                            par_batch *b)
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

static cJSON *data_json(const data_src *ds, const par_golden_opts *o, const par_config *cfg)
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

static cJSON *layout_json(const par_config *cfg)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    char host[256] = "unknown";
    if (gethostname(host, sizeof host - 1) != 0)
        strcpy(host, "unknown");
    host[sizeof host - 1] = 0;
    cJSON_AddNumberToObject(j, "world_size", 1);
    cJSON_AddNumberToObject(j, "tensor_model_parallel_size", 1);
    cJSON_AddNumberToObject(j, "pipeline_model_parallel_size", 1);
    cJSON_AddNumberToObject(j, "virtual_pipeline_model_parallel_size", 1);
    cJSON_AddNumberToObject(j, "context_parallel_size", 1);
    cJSON_AddNumberToObject(j, "expert_model_parallel_size", 1);
    cJSON_AddNumberToObject(j, "expert_tensor_parallel_size", 1);
    cJSON_AddNumberToObject(j, "micro_batch_size", (double)cfg->global_batch_size);
    cJSON_AddNumberToObject(j, "global_batch_size", (double)cfg->global_batch_size);
    cJSON_AddBoolToObject(j, "use_distributed_optimizer", 0);
    cJSON_AddStringToObject(j, "pipeline_schedule", "none");
    cJSON_AddStringToObject(j, "backend", "self");
    cJSON_AddStringToObject(j, "blas_core", PAR_FN(par_golden_blas_core)());
    cJSON_AddStringToObject(j, "host", host);
    return j;
}

/* ----------------------------------------------------------------- run -- */

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

    data_src ds;
    if ((s = data_open(&ds, o, &cfg)))
        return s;
    PAR_FN(par_model) M;
    par_batch batch;
    memset(&batch, 0, sizeof batch);
    char *tmp = NULL;
    par_manifest man;
    par_manifest_init(&man);
    par_golden_step_info *info = par_calloc((size_t)o->steps, sizeof *info, PAR_TAG_MISC);
    if (!info) {
        data_close(&ds);
        return par_err(PAR_ENOMEM, "golden: out of memory");
    }
    if ((s = PAR_FN(par_model_init)(&M, &cfg, o->seed)))
        goto fail_data;
    if ((s = par_batch_alloc(&batch, cfg.global_batch_size, cfg.seq_length)))
        goto fail_model;
    if ((s = par_adir_begin(o->out_dir, &tmp)))
        goto fail_batch;
    if ((s = PAR_FN(par_golden_write_params)(&M, tmp, 0, 0)))
        goto fail_tmp;
    for (int64_t k = 0; k < o->steps; k++) {
        if ((s = data_next(&ds, o, &cfg, k, &batch)))
            goto fail_tmp;
        double t0 = now_s();
        if ((s = PAR_FN(par_model_forward)(&M, &batch)) || (s = PAR_FN(par_model_backward)(&M)))
            goto fail_tmp;
        double t1 = now_s();
        if ((s = PAR_FN(par_golden_write_step)(&M, tmp, k)))
            goto fail_tmp;
        double t2 = now_s();
        if ((s = PAR_FN(par_model_update)(&M)))
            goto fail_tmp;
        double t3 = now_s();
        info[k].loss = M.last.loss;
        info[k].loss_main = M.last.loss_main;
        info[k].loss_mtp = M.last.loss_mtp;
        info[k].loss_aux = M.last.loss_aux;
        info[k].grad_norm = M.last.grad_norm;
        info[k].wall_s = (t1 - t0) + (t3 - t2);
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
    if ((s = par_manifest_set_generator(&man, "parity", PARITY_VERSION)) ||
        (s = par_manifest_set_precision(&man, PREC_NAME)))
        goto fail_tmp;
    man.steps = o->steps;
    man.model = par_config_section_to_json(&cfg, PAR_CFG_MODEL);
    man.train = par_config_section_to_json(&cfg, PAR_CFG_TRAIN);
    if (man.train) {
        cJSON_AddNumberToObject(man.train, "global_batch_size", (double)cfg.global_batch_size);
        cJSON_AddNumberToObject(man.train, "seq_length", (double)cfg.seq_length);
    }
    man.layout = layout_json(&cfg);
    man.data = data_json(&ds, o, &cfg);
    if (!man.model || !man.train || !man.layout || !man.data) {
        s = par_err(PAR_ENOMEM, "golden: out of memory building the manifest");
        goto fail_tmp;
    }
    if ((s = par_manifest_write(&man, tmp)))
        goto fail_tmp;
    s = par_adir_commit(tmp, o->out_dir);
    tmp = NULL;
    if (s)
        goto fail_batch;
    if (sum) {
        memset(sum, 0, sizeof *sum);
        sum->steps = o->steps;
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
    par_batch_free(&batch);
fail_model:
    PAR_FN(par_model_free)(&M);
fail_data:
    data_close(&ds);
    par_manifest_free(&man);
    par_free(info);
    return s;
}
