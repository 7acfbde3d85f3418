/* model/params.c - the parameter table: names, shapes, kinds, offsets. */
#include "model/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"

/* The builder walks the model once; in counting mode it only sums sizes. */
typedef struct {
    par_param_table *t; /* NULL: counting only */
    int cap;
    int64_t n_tensors, n_float, n_i32;
    par_status st;
} builder;

/* Adds one tensor; returns its index (or the would-be index when counting). */
static int add(builder *b, const char *name, par_param_dtype dt, int ndim, int64_t s0, int64_t s1, int layer,
               int expert, int shared, par_opt_kind opt, int wd, int zero_grad, par_init_kind init,
               double init_a)
{
    int idx = (int)b->n_tensors;
    int64_t numel = 0;
    int64_t *total = dt == PAR_PDT_REAL ? &b->n_float : &b->n_i32;
    int64_t off = *total;
    b->n_tensors++;
    /* the config's ranges keep these far from overflow; checked all the same */
    if (s0 < 0 || s1 < 0 || __builtin_mul_overflow(s0, ndim == 2 ? s1 : 1, &numel) ||
        __builtin_add_overflow(*total, numel, total) || b->n_tensors > INT32_MAX) {
        if (!b->st)
            b->st = par_err(PAR_ERANGE, "parameter table: tensor '%s' [%lld, %lld] overflows the 64-bit element "
                                        "count (or the table exceeds 2^31 tensors)",
                            name, (long long)s0, (long long)s1);
        *total = 0;
        return idx;
    }
    if (!b->t || b->st)
        return idx;
    par_param_table *t = b->t;
    if (idx >= b->cap) {
        int nc = b->cap ? 2 * b->cap : 256;
        par_param *np = par_realloc(t->p, (size_t)nc * sizeof *np, PAR_TAG_MODEL);
        if (!np) {
            b->st = par_err(PAR_ENOMEM, "parameter table: no memory for %d entries", nc);
            return idx;
        }
        t->p = np;
        b->cap = nc;
    }
    par_param *p = &t->p[idx];
    memset(p, 0, sizeof *p);
    if (strlen(name) >= PAR_PARAM_NAME_MAX) {
        b->st = par_err(PAR_EINTERNAL, "parameter name '%s' longer than %d", name, PAR_PARAM_NAME_MAX - 1);
        return idx;
    }
    strcpy(p->name, name);
    p->dtype = dt;
    p->ndim = ndim;
    p->shape[0] = s0;
    p->shape[1] = ndim == 2 ? s1 : 1;
    p->numel = numel;
    p->offset = off;
    p->layer = layer;
    p->expert = expert;
    p->shared = shared;
    p->opt = opt;
    p->weight_decay = wd;
    p->has_grad = (dt == PAR_PDT_REAL && opt != PAR_OPT_NONE);
    p->zero_grad = zero_grad;
    p->init = init;
    p->init_a = init_a;
    t->n = idx + 1;
    return idx;
}

/* Shorthands.  A Linear/2-D matrix [out, in]: Muon, wd, N(0, 1/in). */
static int mat(builder *b, const char *name, int64_t out, int64_t in, int layer, int expert, int shared,
               int zero_grad)
{
    return add(b, name, PAR_PDT_REAL, 2, out, in, layer, expert, shared, PAR_OPT_MUON, 1, zero_grad,
               PAR_INIT_NORMAL, 1.0 / sqrt((double)in));
}
/* A 1-D float vector: AdamW, no wd. */
static int vec(builder *b, const char *name, int64_t n, int layer, int zero_grad, par_init_kind init, double a)
{
    return add(b, name, PAR_PDT_REAL, 1, n, 1, layer, -1, 0, PAR_OPT_ADAMW, 0, zero_grad, init, a);
}

#define HC_BASE_NOISE 0.1
#define HC_SCALE_INIT 0.5
#define APE_STD 0.5

static void block(builder *b, const par_config *c, int L, const char *pre, par_block_params *bp)
{
    char nm[PAR_PARAM_NAME_MAX + 32];
    const int64_t d = c->dim, n = c->hc_mult, H = c->n_heads, hd = c->head_dim;
    const int64_t m = c->compress_ratios[L], E = c->n_routed_experts, I = c->moe_inter_dim;
    const int64_t ihd = c->index_head_dim, G = c->o_groups;
    const int64_t mixw = (2 + n) * n;
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    par_block_params x;
    memset(&x, -1, sizeof x);

    int is_mtp = L >= c->n_layers;
    if (is_mtp) {
        x.enorm = vec(b, NM("%senorm.weight", pre), d, L, 0, PAR_INIT_ONE, 0);
        x.hnorm = vec(b, NM("%shnorm.weight", pre), d, L, 0, PAR_INIT_ONE, 0);
        x.e_proj = mat(b, NM("%se_proj.weight", pre), d, d, L, -1, 0, 0);
        x.h_proj = mat(b, NM("%sh_proj.weight", pre), d, d, L, -1, 0, 0);
    }
    x.hc_attn_fn = mat(b, NM("%shc_attn_fn", pre), mixw, n * d, L, -1, 0, 0);
    x.hc_attn_base = vec(b, NM("%shc_attn_base", pre), mixw, L, 0, PAR_INIT_HC_BASE, HC_BASE_NOISE);
    x.hc_attn_scale = vec(b, NM("%shc_attn_scale", pre), 3, L, 0, PAR_INIT_CONST, HC_SCALE_INIT);
    x.attn_norm = vec(b, NM("%sattn_norm.weight", pre), d, L, 0, PAR_INIT_ONE, 0);

    x.attn_sink = vec(b, NM("%sattn.attn_sink", pre), H, L, 0, PAR_INIT_ZERO, 0);
    x.wq_a = mat(b, NM("%sattn.wq_a.weight", pre), c->q_lora_rank, d, L, -1, 0, 0);
    x.q_norm = vec(b, NM("%sattn.q_norm.weight", pre), c->q_lora_rank, L, 0, PAR_INIT_ONE, 0);
    x.wq_b = mat(b, NM("%sattn.wq_b.weight", pre), H * hd, c->q_lora_rank, L, -1, 0, 0);
    x.wkv = mat(b, NM("%sattn.wkv.weight", pre), hd, d, L, -1, 0, 0);
    x.kv_norm = vec(b, NM("%sattn.kv_norm.weight", pre), hd, L, 0, PAR_INIT_ONE, 0);
    if (m > 0) {
        int64_t coff = m == 4 ? 2 : 1;
        x.cmp_wkv = mat(b, NM("%sattn.compressor.wkv.weight", pre), coff * hd, d, L, -1, 0, 0);
        x.cmp_wgate = mat(b, NM("%sattn.compressor.wgate.weight", pre), coff * hd, d, L, -1, 0, 0);
        x.cmp_ape = add(b, NM("%sattn.compressor.ape", pre), PAR_PDT_REAL, 2, m, coff * hd, L, -1, 0,
                        PAR_OPT_ADAMW, 0, 0, PAR_INIT_NORMAL, APE_STD);
        x.cmp_norm = vec(b, NM("%sattn.compressor.norm.weight", pre), hd, L, 0, PAR_INIT_ONE, 0);
    }
    if (m == 4) {
        /* The indexer takes no gradient by contract (MODEL.md 3); its tensors
         * keep a gradient slot (always zero) and stay in the optimizer. */
        x.idx_wq_b = mat(b, NM("%sattn.indexer.wq_b.weight", pre), c->index_n_heads * ihd, c->q_lora_rank, L,
                         -1, 0, 1);
        x.idx_weights_proj =
            mat(b, NM("%sattn.indexer.weights_proj.weight", pre), c->index_n_heads, d, L, -1, 0, 1);
        x.idx_cmp_wkv = mat(b, NM("%sattn.indexer.compressor.wkv.weight", pre), 2 * ihd, d, L, -1, 0, 1);
        x.idx_cmp_wgate = mat(b, NM("%sattn.indexer.compressor.wgate.weight", pre), 2 * ihd, d, L, -1, 0, 1);
        x.idx_cmp_ape = add(b, NM("%sattn.indexer.compressor.ape", pre), PAR_PDT_REAL, 2, 4, 2 * ihd, L, -1,
                            0, PAR_OPT_ADAMW, 0, 1, PAR_INIT_NORMAL, APE_STD);
        x.idx_cmp_norm = vec(b, NM("%sattn.indexer.compressor.norm.weight", pre), ihd, L, 1, PAR_INIT_ONE, 0);
    }
    x.wo_a = mat(b, NM("%sattn.wo_a.weight", pre), G * c->o_lora_rank, H * hd / G, L, -1, 0, 0);
    x.wo_b = mat(b, NM("%sattn.wo_b.weight", pre), d, G * c->o_lora_rank, L, -1, 0, 0);

    x.hc_ffn_fn = mat(b, NM("%shc_ffn_fn", pre), mixw, n * d, L, -1, 0, 0);
    x.hc_ffn_base = vec(b, NM("%shc_ffn_base", pre), mixw, L, 0, PAR_INIT_HC_BASE, HC_BASE_NOISE);
    x.hc_ffn_scale = vec(b, NM("%shc_ffn_scale", pre), 3, L, 0, PAR_INIT_CONST, HC_SCALE_INIT);
    x.ffn_norm = vec(b, NM("%sffn_norm.weight", pre), d, L, 0, PAR_INIT_ONE, 0);

    x.gate_weight = mat(b, NM("%sffn.gate.weight", pre), E, d, L, -1, 0, 0);
    if (L < c->n_hash_layers)
        x.gate_tid2eid = add(b, NM("%sffn.gate.tid2eid", pre), PAR_PDT_I32, 2, c->vocab_size,
                             c->n_activated_experts, L, -1, 0, PAR_OPT_NONE, 0, 0, PAR_INIT_TID2EID, 0);
    else
        x.gate_bias = add(b, NM("%sffn.gate.bias", pre), PAR_PDT_REAL, 1, E, 1, L, -1, 0, PAR_OPT_NONE, 0, 0,
                          PAR_INIT_ZERO, 0);
    for (int64_t e = 0; e < E; e++) {
        int i1 = mat(b, NM("%sffn.experts.%lld.w1.weight", pre, (long long)e), I, d, L, (int)e, 0, 0);
        mat(b, NM("%sffn.experts.%lld.w2.weight", pre, (long long)e), d, I, L, (int)e, 0, 0);
        mat(b, NM("%sffn.experts.%lld.w3.weight", pre, (long long)e), I, d, L, (int)e, 0, 0);
        if (e == 0)
            x.expert0 = i1;
    }
    x.shared_w1 = mat(b, NM("%sffn.shared_experts.w1.weight", pre), I, d, L, -1, 1, 0);
    x.shared_w2 = mat(b, NM("%sffn.shared_experts.w2.weight", pre), d, I, L, -1, 1, 0);
    x.shared_w3 = mat(b, NM("%sffn.shared_experts.w3.weight", pre), I, d, L, -1, 1, 0);

    if (is_mtp) {
        x.norm = vec(b, NM("%snorm.weight", pre), d, L, 0, PAR_INIT_ONE, 0);
        x.hc_head_fn = mat(b, NM("%shc_head_fn", pre), n, n * d, L, -1, 0, 0);
        x.hc_head_base = vec(b, NM("%shc_head_base", pre), n, L, 0, PAR_INIT_HC_BASE, HC_BASE_NOISE);
        x.hc_head_scale = vec(b, NM("%shc_head_scale", pre), 1, L, 0, PAR_INIT_CONST, HC_SCALE_INIT);
    }
#undef NM
    if (bp)
        *bp = x;
}

static void walk(builder *b, const par_config *c, par_top_params *top, par_block_params *blocks)
{
    char pre[32];
    const int64_t d = c->dim, n = c->hc_mult, V = c->vocab_size;
    par_top_params tp;
    tp.embed = add(b, "embed.weight", PAR_PDT_REAL, 2, V, d, -1, -1, 0, PAR_OPT_ADAMW, 1, 0, PAR_INIT_NORMAL, 1.0);
    for (int64_t L = 0; L < c->n_layers; L++) {
        snprintf(pre, sizeof pre, "layers.%lld.", (long long)L);
        block(b, c, (int)L, pre, blocks ? &blocks[L] : NULL);
    }
    tp.norm = vec(b, "norm.weight", d, -1, 0, PAR_INIT_ONE, 0);
    tp.head = add(b, "head.weight", PAR_PDT_REAL, 2, V, d, -1, -1, 0, PAR_OPT_ADAMW, 1, 0, PAR_INIT_NORMAL,
                  1.0 / sqrt((double)d));
    tp.hc_head_fn = mat(b, "hc_head_fn", n, n * d, -1, -1, 0, 0);
    tp.hc_head_base = vec(b, "hc_head_base", n, -1, 0, PAR_INIT_HC_BASE, HC_BASE_NOISE);
    tp.hc_head_scale = vec(b, "hc_head_scale", 1, -1, 0, PAR_INIT_CONST, HC_SCALE_INIT);
    for (int64_t i = 0; i < c->n_mtp_layers; i++) {
        snprintf(pre, sizeof pre, "mtp.%lld.", (long long)i);
        block(b, c, (int)(c->n_layers + i), pre, blocks ? &blocks[c->n_layers + i] : NULL);
    }
    if (top)
        *top = tp;
}

par_status par_param_count(const par_config *cfg, int64_t *n_tensors, int64_t *n_float, int64_t *n_i32)
{
    par_status st = par_config_validate(cfg);
    if (st)
        return st;
    builder b = {0};
    walk(&b, cfg, NULL, NULL);
    if (b.st)
        return b.st;
    if (n_tensors)
        *n_tensors = b.n_tensors;
    if (n_float)
        *n_float = b.n_float;
    if (n_i32)
        *n_i32 = b.n_i32;
    return PAR_OK;
}

int64_t par_param_count_routed_expert_floats(const par_config *cfg)
{
    int64_t nb = cfg->n_layers + cfg->n_mtp_layers, r = 0;
    /* a validated config stays far below 2^63; saturate rather than wrap otherwise */
    if (__builtin_mul_overflow(nb * 3, cfg->n_routed_experts, &r) || __builtin_mul_overflow(r, cfg->dim, &r) ||
        __builtin_mul_overflow(r, cfg->moe_inter_dim, &r))
        return INT64_MAX;
    return r;
}

static uint64_t hname(const char *s) { return par_name_hash64(s); }

par_status par_param_table_build(par_param_table *t, const par_config *cfg)
{
    par_status st = par_config_validate(cfg);
    if (st)
        return st;
    par_param_table tt;
    memset(&tt, 0, sizeof tt);
    tt.cfg = *cfg;
    tt.n_blocks = (int)(cfg->n_layers + cfg->n_mtp_layers);
    tt.blocks = par_calloc((size_t)tt.n_blocks, sizeof *tt.blocks, PAR_TAG_MODEL);
    if (!tt.blocks)
        return par_err(PAR_ENOMEM, "parameter table: no memory for %d blocks", tt.n_blocks);
    builder b = {0};
    b.t = &tt;
    walk(&b, cfg, &tt.top, tt.blocks);
    if (b.st) {
        st = b.st;
        goto fail_free;
    }
    tt.n_float = b.n_float;
    tt.n_i32 = b.n_i32;
    if (b.cap > tt.n && tt.n > 0) { /* the doubling's slack back: every rank holds a table */
        par_param *np = par_realloc(tt.p, (size_t)tt.n * sizeof *np, PAR_TAG_MODEL);
        if (np)
            tt.p = np;
    }
    int cap = 16;
    while (cap < 2 * tt.n)
        cap *= 2;
    tt.hash = par_malloc((size_t)cap * sizeof *tt.hash, PAR_TAG_MODEL);
    if (!tt.hash) {
        st = par_err(PAR_ENOMEM, "parameter table: no memory for the name index");
        goto fail_free;
    }
    tt.hash_cap = cap;
    for (int i = 0; i < cap; i++)
        tt.hash[i] = -1;
    for (int i = 0; i < tt.n; i++) {
        uint64_t h = hname(tt.p[i].name) & (uint64_t)(cap - 1);
        while (tt.hash[h] >= 0) {
            if (!strcmp(tt.p[tt.hash[h]].name, tt.p[i].name)) {
                st = par_err(PAR_EINTERNAL, "parameter table: duplicate name '%s'", tt.p[i].name);
                goto fail_free;
            }
            h = (h + 1) & (uint64_t)(cap - 1);
        }
        tt.hash[h] = i;
    }
    *t = tt;
    return PAR_OK;
fail_free:
    par_param_table_free(&tt);
    return st;
}

void par_param_table_free(par_param_table *t)
{
    if (!t)
        return;
    par_free(t->p);
    par_free(t->blocks);
    par_free(t->hash);
    memset(t, 0, sizeof *t);
}

int par_param_find(const par_param_table *t, const char *name)
{
    if (!t->hash || !name)
        return -1;
    uint64_t mask = (uint64_t)(t->hash_cap - 1);
    uint64_t h = hname(name) & mask;
    while (t->hash[h] >= 0) {
        if (!strcmp(t->p[t->hash[h]].name, name))
            return t->hash[h];
        h = (h + 1) & mask;
    }
    return -1;
}

const par_param *par_param_lookup(const par_param_table *t, const char *name)
{
    int i = par_param_find(t, name);
    return i < 0 ? NULL : &t->p[i];
}

par_status par_param_get(const par_param_table *t, const char *name, const par_param **out)
{
    int i = par_param_find(t, name);
    if (i < 0)
        return par_err(PAR_ENOTFOUND, "parameter '%s': no such tensor in the table", name);
    *out = &t->p[i];
    return PAR_OK;
}

static double value_at(const par_param_table *t, const par_param *p, par_philox_key key, int64_t i)
{
    switch (p->init) {
    case PAR_INIT_ZERO: return 0.0;
    case PAR_INIT_ONE: return 1.0;
    case PAR_INIT_CONST: return p->init_a;
    case PAR_INIT_NORMAL: return p->init_a * par_rng_normal(key, (uint64_t)i, 0);
    case PAR_INIT_HC_BASE: {
        /* [(2+n)n]: pre (n), post (n) at 0; comb C[j][k] at 1 on the diagonal.
         * [n] (hc_head_base): 0.  Plus N(0, init_a^2) noise everywhere. */
        int64_t n = t->cfg.hc_mult;
        double base = 0.0;
        if (p->numel == (2 + n) * n && i >= 2 * n) {
            int64_t j = (i - 2 * n) / n, k = (i - 2 * n) % n;
            base = j == k ? 1.0 : 0.0;
        }
        return base + p->init_a * par_rng_normal(key, (uint64_t)i, 0);
    }
    case PAR_INIT_TID2EID: {
        int64_t E = t->cfg.n_routed_experts, K = t->cfg.n_activated_experts;
        int64_t tok = i / K, j = i % K;
        return (double)(((tok % E) + j * (E / K)) % E);
    }
    }
    return 0.0;
}

double par_param_init_value(const par_param_table *t, int idx, uint64_t seed, int64_t i)
{
    const par_param *p = &t->p[idx];
    return value_at(t, p, par_rng_key(seed, p->name), i);
}

void par_param_init_values(const par_param_table *t, int idx, uint64_t seed, int64_t begin, int64_t end,
                           double *out)
{
    const par_param *p = &t->p[idx];
    par_philox_key key = par_rng_key(seed, p->name);
    if (p->init == PAR_INIT_NORMAL) { /* value_at's product, the draws in a batch */
        par_rng_normal_n(key, (uint64_t)begin, 0, out, end - begin);
        for (int64_t i = begin; i < end; i++)
            out[i - begin] = p->init_a * out[i - begin];
        return;
    }
    for (int64_t i = begin; i < end; i++)
        out[i - begin] = value_at(t, p, key, i);
}

const char *par_opt_kind_name(par_opt_kind k)
{
    switch (k) {
    case PAR_OPT_NONE: return "none";
    case PAR_OPT_MUON: return "muon";
    case PAR_OPT_ADAMW: return "adamw";
    }
    return "?";
}

const char *par_init_kind_name(par_init_kind k)
{
    switch (k) {
    case PAR_INIT_ZERO: return "zero";
    case PAR_INIT_ONE: return "one";
    case PAR_INIT_CONST: return "const";
    case PAR_INIT_NORMAL: return "normal";
    case PAR_INIT_HC_BASE: return "hc_base";
    case PAR_INIT_TID2EID: return "tid2eid";
    }
    return "?";
}
