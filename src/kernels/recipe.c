/* kernels/recipe.c - recipes, weight classes, the cast table and the weight
 * registry (kernels/recipe.h).  Untemplated: one registry for both precisions. */
#include "kernels/recipe.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[PAR_RECIPE_COUNT] = {"none", "bf16", "fp8", "v4"};

const char *par_recipe_name(par_recipe r)
{
    return (unsigned)r < PAR_RECIPE_COUNT ? names[r] : "?";
}

par_status par_recipe_parse(const char *s, par_recipe *out)
{
    for (int r = 0; s && r < PAR_RECIPE_COUNT; r++)
        if (!strcmp(s, names[r])) {
            *out = (par_recipe)r;
            return PAR_OK;
        }
    return par_err(PAR_EINVAL, "recipe '%s' is not one of none, bf16, fp8, v4", s ? s : "(null)");
}

/* ---- weight classes: the V4 inference code's dtypes (model.py) ---- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

par_wclass par_recipe_wclass_of(const char *name)
{
    static const struct {
        const char *suffix;
        par_wclass c;
    } table[] = {
        /* Compressor: Linear(..., dtype=torch.float32), before the FP8 names below */
        {"compressor.wkv.weight", PAR_WCLASS_F32},
        {"compressor.wgate.weight", PAR_WCLASS_F32},
        {"indexer.weights_proj.weight", PAR_WCLASS_BF16}, /* ColumnParallelLinear(..., bfloat16) */
        {"indexer.wq_b.weight", PAR_WCLASS_FP8},
        {"attn.wq_a.weight", PAR_WCLASS_FP8},
        {"attn.wq_b.weight", PAR_WCLASS_FP8},
        {"attn.wkv.weight", PAR_WCLASS_FP8},
        {"attn.wo_a.weight", PAR_WCLASS_BF16}, /* ColumnParallelLinear(..., bfloat16) */
        {"attn.wo_b.weight", PAR_WCLASS_FP8},
        {"shared_experts.w1.weight", PAR_WCLASS_FP8},
        {"shared_experts.w2.weight", PAR_WCLASS_FP8},
        {"shared_experts.w3.weight", PAR_WCLASS_FP8},
        {"e_proj.weight", PAR_WCLASS_FP8},
        {"h_proj.weight", PAR_WCLASS_FP8},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (ends_with(name, table[i].suffix))
            return table[i].c;
    if (strstr(name, ".ffn.experts.") && (ends_with(name, ".w1.weight") || ends_with(name, ".w2.weight") ||
                                          ends_with(name, ".w3.weight")))
        return PAR_WCLASS_FP4; /* expert_dtype "fp4" */
    return PAR_WCLASS_F32;     /* gate (x.float(), weight.float()), head (float32), hc fns, norms */
}

/* ---- the cast table ---- */

#define NONE {PAR_CAST_NONE, {0, 0, 1, 1}, PAR_CAST_NONE, {0, 0, 1, 1}}
#define BF16 {PAR_CAST_BF16, {0, 0, 1, 1}, PAR_CAST_BF16, {0, 0, 1, 1}}
/* act_quant with scale_fmt None (fp32 scales) and 128x128 fp32-scaled weights */
#define FP8_F32SCALE                                                                                     \
    {PAR_CAST_QUANT, {PAR_QFMT_E4M3, PAR_QSCALE_F32, 1, 128}, PAR_CAST_QUANT,                           \
     {PAR_QFMT_E4M3, PAR_QSCALE_F32, 128, 128}}
#define FP8_UE8M0 {PAR_CAST_QUANT, PAR_QSPEC_ACT_FP8, PAR_CAST_QUANT, PAR_QSPEC_WEIGHT_FP8}
#define FP4_UE8M0 {PAR_CAST_QUANT, PAR_QSPEC_ACT_FP8, PAR_CAST_QUANT, PAR_QSPEC_MXFP4}

static const par_recipe_cast casts[PAR_RECIPE_COUNT][PAR_WCLASS_COUNT] = {
    /*                 F32   BF16  FP8           FP4 (routed experts) */
    [PAR_RECIPE_NONE] = {NONE, NONE, NONE, NONE},
    [PAR_RECIPE_BF16] = {NONE, BF16, BF16, BF16},
    [PAR_RECIPE_FP8] = {NONE, BF16, FP8_F32SCALE, FP8_F32SCALE},
    [PAR_RECIPE_V4] = {NONE, BF16, FP8_UE8M0, FP4_UE8M0},
};

const par_recipe_cast *par_recipe_cast_of(par_recipe r, par_wclass c)
{
    if ((unsigned)r >= PAR_RECIPE_COUNT || (unsigned)c >= PAR_WCLASS_COUNT)
        return &casts[0][0];
    return &casts[r][c];
}

int par_recipe_has_tiles(par_recipe r)
{
    for (int c = 0; c < PAR_WCLASS_COUNT; c++) {
        const par_recipe_cast *k = par_recipe_cast_of(r, (par_wclass)c);
        if (k->act == PAR_CAST_QUANT || k->wt == PAR_CAST_QUANT)
            return 1;
    }
    return 0;
}

int par_recipe_fp4_indexer(par_recipe r)
{
    return r == PAR_RECIPE_V4;
}

/* ---- the registry: sorted by address, under a lock ---- */

typedef struct {
    uintptr_t lo, hi;
    const par_recipe_cast *cast;
    const void *owner; /* who registered it: a buffer shared by several models is registered by each */
    par_recipe_shard shard;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *reg;
static int64_t n_reg, cap_reg;

par_status par_recipe_register(const void *owner, const void *w, int64_t bytes, par_recipe r, par_wclass c,
                               const par_recipe_shard *shard)
{
    const par_recipe_cast *k = par_recipe_cast_of(r, c);
    if (r == PAR_RECIPE_NONE || (k->act == PAR_CAST_NONE && k->wt == PAR_CAST_NONE) || bytes <= 0)
        return PAR_OK;
    pthread_mutex_lock(&lock);
    if (n_reg == cap_reg) {
        int64_t cap = cap_reg ? 2 * cap_reg : 256;
        entry *e = realloc(reg, (size_t)cap * sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&lock);
            return par_err(PAR_ENOMEM, "recipe: no memory to register %lld weights", (long long)cap);
        }
        reg = e, cap_reg = cap;
    }
    uintptr_t lo = (uintptr_t)w;
    int64_t i = n_reg;
    while (i > 0 && reg[i - 1].lo > lo)
        reg[i] = reg[i - 1], i--;
    reg[i] = (entry){lo, lo + (uintptr_t)bytes, k, owner, {0}};
    if (shard)
        reg[i].shard = *shard;
    __atomic_store_n(&n_reg, n_reg + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    return PAR_OK;
}

void par_recipe_unregister(const void *owner)
{
    pthread_mutex_lock(&lock);
    int64_t j = 0;
    for (int64_t i = 0; i < n_reg; i++)
        if (reg[i].owner != owner)
            reg[j++] = reg[i];
    __atomic_store_n(&n_reg, j, __ATOMIC_RELEASE);
    if (!n_reg) {
        free(reg);
        reg = NULL, cap_reg = 0;
    }
    pthread_mutex_unlock(&lock);
}

static int local_tiles;

void par_recipe_set_local_tiles(int on)
{
    __atomic_store_n(&local_tiles, on, __ATOMIC_RELAXED);
}

const par_recipe_cast *par_recipe_lookup(const void *w, par_recipe_shard *shard)
{
    if (!__atomic_load_n(&n_reg, __ATOMIC_ACQUIRE)) /* no recipe anywhere: today's bits, no lock */
        return NULL;
    uintptr_t p = (uintptr_t)w;
    const par_recipe_cast *k = NULL;
    int interior = 0;
    pthread_mutex_lock(&lock);
    int64_t a = 0, b = n_reg; /* the last entry with lo <= p */
    while (a < b) {
        int64_t m = (a + b) / 2;
        if (reg[m].lo <= p)
            a = m + 1;
        else
            b = m;
    }
    if (a > 0 && p < reg[a - 1].hi) {
        interior = p != reg[a - 1].lo;
        if (!interior) {
            k = reg[a - 1].cast;
            if (shard) {
                *shard = reg[a - 1].shard;
                if (__atomic_load_n(&local_tiles, __ATOMIC_RELAXED))
                    shard->cut = 0;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    if (interior)
        par_recipe_note_failure();
    return k;
}

int64_t par_recipe_registered(void)
{
    pthread_mutex_lock(&lock);
    int64_t n = n_reg;
    pthread_mutex_unlock(&lock);
    return n;
}

static int64_t failures;

void par_recipe_note_failure(void)
{
    __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
}

int64_t par_recipe_failures(void)
{
    return __atomic_load_n(&failures, __ATOMIC_RELAXED);
}
