/* parallel/ckpt/ckpt.c - the checkpoint format: tensor tables and roles, coverage, shard
 * descriptors, the metadata JSON (see ckpt.h, ckpt-impl.h, docs/checkpoints.md). */
#include "parallel/ckpt/ckpt.h"
#include "parallel/ckpt/ckpt-impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/sha256.h"

/* ---- test hook ------------------------------------------------------------ */

static void (*g_hook)(const char *phase, int rank);

void par__ckpt_set_test_hook(void (*hook)(const char *phase, int rank))
{
    g_hook = hook;
}

void par__ckpt_hook(const char *phase, int rank)
{
    if (g_hook)
        g_hook(phase, rank);
}

int64_t par_ckpt_layout_world(const par_layout *l)
{
    if (!l)
        return 1;
    if (l->world > 0)
        return l->world;
    return par_layout_default_world(l->tp, l->pp, l->cp, l->ep, l->etp);
}

/* ---- tensors and their roles -------------------------------------------------- */

static const char *const slot_names[PAR_CKPT_SLOT_COUNT] = {"param", "momentum", "exp_avg", "exp_avg_sq"};

const char *par_ckpt_slot_name(par_ckpt_slot s)
{
    return s >= 0 && s < PAR_CKPT_SLOT_COUNT ? slot_names[s] : NULL;
}

void par_ckpt_tensor_init(par_ckpt_tensor *x, const char *name, par_dtype dtype, int ndim, const int64_t *shape)
{
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = dtype;
    x->ndim = ndim;
    for (int d = 0; d < ndim && d < PAR_MAX_DIMS; d++)
        x->shape[d] = shape[d];
    x->slot = PAR_CKPT_PARAM;
    x->param = x->expert = x->layer = x->mtp = -1;
}

/* Table entry p (list index i) as a parameter, or as state slot `slot` of
 * it; p's shape is [out, in], or [n] with shape[1] = 0 in the list. */
static void set_tensor(par_ckpt_tensor *x, const par_param *p, int i, par_ckpt_slot slot, par_dtype dt,
                       int64_t n_layers)
{
    const int64_t shape[2] = {p->shape[0], p->ndim > 1 ? p->shape[1] : 0};
    par_ckpt_tensor_init(x, "", dt, p->ndim, shape);
    if (slot == PAR_CKPT_PARAM)
        snprintf(x->name, sizeof x->name, "%s", p->name);
    else
        snprintf(x->name, sizeof x->name, "opt.%s.%s", p->name, slot_names[slot]);
    x->slot = slot;
    x->param = slot == PAR_CKPT_PARAM ? -1 : i;
    x->expert = p->expert;
    x->layer = p->layer >= 0 && p->layer < n_layers ? p->layer : -1;
    x->mtp = p->layer >= n_layers ? (int)(p->layer - n_layers) : -1;
}

par_status par_ckpt_tensors_of_params(const par_param_table *t, int precision_bits, par_ckpt_tensor **out, int *n)
{
    if (precision_bits != 64 && precision_bits != 32)
        return par_err(PAR_EINVAL, "checkpoint tensors: precision %d bits, expected 64 or 32", precision_bits);
    int cap = 0;
    for (int i = 0; i < t->n; i++)
        cap += 1 + (t->p[i].opt == PAR_OPT_MUON ? 1 : t->p[i].opt == PAR_OPT_ADAMW ? 2 : 0);
    par_ckpt_tensor *v = par_calloc((size_t)(cap > 0 ? cap : 1), sizeof *v, PAR_TAG_IO);
    if (!v)
        return par_err(PAR_ENOMEM, "checkpoint tensors: out of memory for %d tensors", cap);
    const par_dtype real = precision_bits == 64 ? PAR_F64 : PAR_F32;
    const int64_t nl = t->cfg.n_layers;
    int k = 0;
    for (int i = 0; i < t->n; i++)
        set_tensor(&v[k++], &t->p[i], i, PAR_CKPT_PARAM, t->p[i].dtype == PAR_PDT_I32 ? PAR_I32 : real, nl);
    for (int i = 0; i < t->n; i++) {
        const par_param *p = &t->p[i];
        if (p->opt == PAR_OPT_MUON) {
            set_tensor(&v[k++], p, i, PAR_CKPT_MOMENTUM, real, nl);
        } else if (p->opt == PAR_OPT_ADAMW) {
            set_tensor(&v[k++], p, i, PAR_CKPT_EXP_AVG, real, nl);
            set_tensor(&v[k++], p, i, PAR_CKPT_EXP_AVG_SQ, real, nl);
        }
    }
    *out = v;
    *n = k;
    return PAR_OK;
}

/* ---- tensor tables ---------------------------------------------------------- */

int64_t par__ckpt_tensor_numel(const par_ckpt_tensor *t)
{
    return par_shape_numel(t->ndim, t->shape, 0);
}

static int cmp_order(const void *a, const void *b, void *ctx)
{
    const par_ckpt_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

/* Merge sort of indices by name (qsort has no context argument in C11). */
static void sort_idx(int *v, int *tmp, int n, const par_ckpt_tensor *t)
{
    if (n < 2)
        return;
    int h = n / 2;
    sort_idx(v, tmp, h, t);
    sort_idx(v + h, tmp, n - h, t);
    int i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = cmp_order(&v[j], &v[i], (void *)t) < 0 ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

void par__ckpt_index_free(name_index *ix)
{
    par_free(ix->order);
    ix->order = NULL;
}

par_status par__ckpt_index_build(name_index *ix, const par_ckpt_tensor *t, int n, const char *what)
{
    ix->t = t;
    ix->n = n;
    ix->order = par_malloc((size_t)(n > 0 ? n : 1) * sizeof(int), PAR_TAG_IO);
    int *tmp = par_malloc((size_t)(n > 0 ? n : 1) * sizeof(int), PAR_TAG_IO);
    if (!ix->order || !tmp) {
        par_free(ix->order);
        par_free(tmp);
        ix->order = NULL;
        return par_err(PAR_ENOMEM, "%s: out of memory indexing %d tensors", what, n);
    }
    for (int i = 0; i < n; i++)
        ix->order[i] = i;
    sort_idx(ix->order, tmp, n, t);
    par_free(tmp);
    for (int i = 1; i < n; i++)
        if (!strcmp(t[ix->order[i]].name, t[ix->order[i - 1]].name)) {
            /* the message first: it names the tensor through ix->order */
            par_status st = par_err(PAR_EINVAL, "%s: tensor '%s' is listed twice (tensors %d and %d)", what,
                                    t[ix->order[i]].name, ix->order[i - 1], ix->order[i]);
            par__ckpt_index_free(ix);
            return st;
        }
    return PAR_OK;
}

int par__ckpt_index_find(const name_index *ix, const char *name)
{
    int lo = 0, hi = ix->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(ix->t[ix->order[mid]].name, name);
        if (!c)
            return ix->order[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

par_status par__ckpt_check_tensors(const par_ckpt_tensor *t, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        if (!t[i].name[0] || memchr(t[i].name, 0, PAR_CKPT_NAME_MAX) == NULL)
            return par_err(PAR_EINVAL, "%s: tensor %d has an empty or unterminated name", what, i);
        if (t[i].dtype < 0 || t[i].dtype >= PAR_DTYPE_COUNT)
            return par_err(PAR_EINVAL, "%s: tensor '%s': bad dtype %d", what, t[i].name, (int)t[i].dtype);
        if (t[i].ndim < 0 || t[i].ndim > PAR_MAX_DIMS)
            return par_err(PAR_EINVAL, "%s: tensor '%s': ndim %d outside 0..%d", what, t[i].name, t[i].ndim,
                           PAR_MAX_DIMS);
        if (par_shape_numel(t[i].ndim, t[i].shape, par_dtype_size(t[i].dtype)) < 0)
            return par_err(PAR_EINVAL, "%s: tensor '%s': negative or overflowing shape", what, t[i].name);
    }
    return PAR_OK;
}

/* The role rules of par_ckpt_tensor (ckpt.h); the first broken one names
 * the tensor. */
par_status par__ckpt_check_roles(const par_ckpt_tensor *t, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        const par_ckpt_tensor *x = &t[i];
        if (x->slot < 0 || x->slot >= PAR_CKPT_SLOT_COUNT)
            return par_err(PAR_EINVAL, "%s: tensor '%s': slot %d is not one of param|momentum|exp_avg|exp_avg_sq",
                           what, x->name, (int)x->slot);
        if (x->expert < -1 || x->layer < -1 || x->mtp < -1 || (x->layer >= 0 && x->mtp >= 0))
            return par_err(PAR_EINVAL, "%s: tensor '%s': expert %d, layer %d, mtp %d (each >= -1, -1: none; not "
                           "both a layer and an MTP block)", what, x->name, x->expert, x->layer, x->mtp);
        if (x->slot == PAR_CKPT_PARAM) {
            if (x->param != -1)
                return par_err(PAR_EINVAL, "%s: tensor '%s' is a parameter but names parameter %d (must be -1)",
                               what, x->name, x->param);
            continue;
        }
        const par_ckpt_tensor *p = x->param >= 0 && x->param < n ? &t[x->param] : NULL;
        if (!p || p->slot != PAR_CKPT_PARAM)
            return par_err(PAR_EINVAL, "%s: tensor '%s' (%s) names tensor %d as its parameter, which is %s", what,
                           x->name, slot_names[x->slot], x->param, p ? "optimizer state" : "not in the list");
        if (p->ndim != x->ndim || memcmp(p->shape, x->shape, (size_t)x->ndim * sizeof x->shape[0]) ||
            p->expert != x->expert || p->layer != x->layer || p->mtp != x->mtp)
            return par_err(PAR_EINVAL, "%s: tensor '%s' (%s of '%s') has another shape, expert or block than its "
                           "parameter", what, x->name, slot_names[x->slot], p->name);
    }
    return PAR_OK;
}

/* Whole digits at s up to `stop` (a '.'): the number, or -1. */
static int leading_index(const char *s, char stop)
{
    if (*s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || v > INT32_MAX || *end != stop ? -1 : (int)v;
}

/* A parameter's expert and block from the contract's names (legacy). */
static void roles_of_param_name(par_ckpt_tensor *x)
{
    const char *e = strstr(x->name, ".experts.");
    x->expert = e ? leading_index(e + 9, '.') : -1;
    x->layer = strncmp(x->name, "layers.", 7) ? -1 : leading_index(x->name + 7, '.');
    x->mtp = strncmp(x->name, "mtp.", 4) ? -1 : leading_index(x->name + 4, '.');
}

/* The parameter of a legacy state name "opt.<P>.<slot>": P's list index when
 * P is listed with the same shape (*slot set), else -1. */
static int state_of_name(const par_ckpt_tensor *t, const name_index *ix, int i, par_ckpt_slot *slot)
{
    const char *nm = t[i].name, *dot = strrchr(nm, '.');
    if (strncmp(nm, "opt.", 4) || !dot || dot <= nm + 4)
        return -1;
    int k = PAR_CKPT_MOMENTUM;
    while (k < PAR_CKPT_SLOT_COUNT && strcmp(dot + 1, slot_names[k]))
        k++;
    char pn[PAR_CKPT_NAME_MAX];
    snprintf(pn, sizeof pn, "%.*s", (int)(dot - (nm + 4)), nm + 4);
    int j = k < PAR_CKPT_SLOT_COUNT ? par__ckpt_index_find(ix, pn) : -1;
    if (j < 0 || t[j].ndim != t[i].ndim || memcmp(t[j].shape, t[i].shape, (size_t)t[i].ndim * sizeof t[i].shape[0]))
        return -1;
    *slot = (par_ckpt_slot)k;
    return j;
}

/* Roles of a checkpoint written before metadata.json recorded them, from
 * the contract's names (the one place a name becomes a role; ckpt.h,
 * par_ckpt_open).  A name that does not match is a plain parameter. */
void par__ckpt_roles_from_names(par_ckpt_tensor *t, int n, const name_index *ix)
{
    for (int i = 0; i < n; i++) {
        t[i].slot = PAR_CKPT_PARAM;
        t[i].param = -1;
        roles_of_param_name(&t[i]);
    }
    for (int i = 0; i < n; i++) {
        par_ckpt_slot slot;
        int j = state_of_name(t, ix, i, &slot);
        par_ckpt_slot dummy;
        if (j < 0 || state_of_name(t, ix, j, &dummy) >= 0) /* the state of state is not state */
            continue;
        t[i].slot = slot;
        t[i].param = j;
        t[i].expert = t[j].expert;
        t[i].layer = t[j].layer;
        t[i].mtp = t[j].mtp;
    }
}

static int cmp_span(const void *pa, const void *pb)
{
    const span *a = pa, *b = pb;
    if (a->t != b->t)
        return a->t < b->t ? -1 : 1;
    if (a->b != b->b)
        return a->b < b->b ? -1 : 1;
    if (a->e != b->e)
        return a->e < b->e ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

/* Sorts spans[n] and checks every element of every tensor is covered exactly
 * once; the first gap or overlap (in tensor order) is the error. */
static par_status check_coverage(const char *what, const par_ckpt_tensor *t, int nt, span *sp, int64_t n)
{
    qsort(sp, (size_t)n, sizeof *sp, cmp_span);
    int64_t k = 0;
    for (int i = 0; i < nt; i++) {
        int64_t numel = par__ckpt_tensor_numel(&t[i]);
        int64_t next = 0;
        int prev_rank = -1;
        for (; k < n && sp[k].t == i; k++) {
            if (sp[k].b > next)
                return par_err(PAR_EFORMAT,
                               "%s: coverage: tensor '%s' (numel %lld): elements [%lld, %lld) are in no shard (gap)",
                               what, t[i].name, (long long)numel, (long long)next, (long long)sp[k].b);
            if (sp[k].b < next)
                return par_err(PAR_EFORMAT,
                               "%s: coverage: tensor '%s': elements [%lld, %lld) are held by rank %d and rank %d "
                               "(overlap; every element must be saved exactly once)",
                               what, t[i].name, (long long)sp[k].b,
                               (long long)(sp[k].e < next ? sp[k].e : next), prev_rank, sp[k].rank);
            next = sp[k].e;
            prev_rank = sp[k].rank;
        }
        if (next < numel)
            return par_err(PAR_EFORMAT,
                           "%s: coverage: tensor '%s' (numel %lld): elements [%lld, %lld) are in no shard (gap)",
                           what, t[i].name, (long long)numel, (long long)next, (long long)numel);
    }
    return PAR_OK;
}

void par__ckpt_desc_free(shard_desc *d)
{
    par_free(d->s);
    d->s = NULL;
    d->n = 0;
}

void par__ckpt_shard_file_name(char *buf, size_t n, int rank)
{
    snprintf(buf, n, "rank-%05d.safetensors", rank);
}

void par__ckpt_slice_key(char *buf, size_t n, const char *name, int64_t begin)
{
    snprintf(buf, n, "%s@%lld", name, (long long)begin);
}

static cJSON *slices_json(const par_ckpt_slice *s, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *e = cJSON_CreateArray();
        if (!e) {
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddItemToArray(e, cJSON_CreateString(s[i].name));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)s[i].begin));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)s[i].end));
        cJSON_AddItemToArray(a, e);
    }
    return a;
}

cJSON *par__ckpt_desc_json(const shard_desc *d)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "rank", d->rank);
    cJSON_AddStringToObject(o, "file", d->file);
    cJSON_AddStringToObject(o, "sha256", d->sha);
    cJSON *a = slices_json(d->s, d->n);
    if (!a) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToObject(o, "slices", a);
    return o;
}

/* Parses a shard entry of metadata.json (or a gathered descriptor). */
par_status par__ckpt_desc_parse(const cJSON *o, const char *what, int idx, shard_desc *d)
{
    memset(d, 0, sizeof *d);
    int64_t rank;
    const char *file = par_json_str(o, "file"), *sha = par_json_str(o, "sha256");
    const cJSON *sl = cJSON_GetObjectItemCaseSensitive(o, "slices");
    if (!cJSON_IsObject(o) || !par_json_int(o, "rank", &rank) || !file || !sha || !cJSON_IsArray(sl))
        return par_err(PAR_EFORMAT, "%s: shards[%d]: needs \"rank\", \"file\", \"sha256\" and \"slices\"", what, idx);
    if (rank != idx)
        return par_err(PAR_EFORMAT, "%s: shards[%d] has rank %lld (shards are listed in rank order)", what, idx,
                       (long long)rank);
    d->rank = (int)rank;
    par__ckpt_shard_file_name(d->file, sizeof d->file, d->rank);
    if (strcmp(file, d->file))
        return par_err(PAR_EFORMAT, "%s: shards[%d]: file '%s', expected '%s'", what, idx, file, d->file);
    if (!par_sha256_hex_valid(sha))
        return par_err(PAR_EFORMAT, "%s: shards[%d]: sha256 '%s' is not 64 hex characters", what, idx, sha);
    snprintf(d->sha, sizeof d->sha, "%s", sha);
    for (char *c = d->sha; *c; c++)
        if (*c >= 'A' && *c <= 'F')
            *c = (char)(*c - 'A' + 'a');
    int n = cJSON_GetArraySize(sl);
    d->s = par_calloc((size_t)(n > 0 ? n : 1), sizeof *d->s, PAR_TAG_IO);
    if (!d->s)
        return par_err(PAR_ENOMEM, "%s: out of memory", what);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, sl)
    {
        const cJSON *nm = cJSON_GetArrayItem(e, 0);
        int64_t b, en;
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 3 || !cJSON_IsString(nm) ||
            !par_json_as_int(cJSON_GetArrayItem(e, 1), &b) || !par_json_as_int(cJSON_GetArrayItem(e, 2), &en) ||
            strlen(nm->valuestring) >= PAR_CKPT_NAME_MAX) {
            par__ckpt_desc_free(d);
            return par_err(PAR_EFORMAT, "%s: shards[%d].slices[%d]: expected [name, begin, end]", what, idx, i);
        }
        snprintf(d->s[i].name, sizeof d->s[i].name, "%s", nm->valuestring);
        d->s[i].begin = b;
        d->s[i].end = en;
        i++;
    }
    d->n = i;
    return PAR_OK;
}

/* Checks a slice against the tensor table; *ti its tensor. */
par_status par__ckpt_check_slice(const name_index *ix, const par_ckpt_slice *s, const char *what, int *ti)
{
    int i = par__ckpt_index_find(ix, s->name);
    if (i < 0)
        return par_err(PAR_ENOTFOUND, "%s: slice of unknown tensor '%s'", what, s->name);
    int64_t numel = par__ckpt_tensor_numel(&ix->t[i]);
    if (s->begin < 0 || s->begin > s->end || s->end > numel)
        return par_err(PAR_ERANGE, "%s: tensor '%s': slice [%lld, %lld) is outside [0, %lld]", what, s->name,
                       (long long)s->begin, (long long)s->end, (long long)numel);
    *ti = i;
    return PAR_OK;
}

/* ---- metadata --------------------------------------------------------------- */

/* The layout record (model/layout_record.h, the one writer) of a save:
 * unset sizes 1, the data-parallel sizes of the world. */
static cJSON *layout_json(const par_layout *l, int64_t world)
{
    int64_t tp = l->tp > 0 ? l->tp : 1, pp = l->pp > 0 ? l->pp : 1, cp = l->cp > 0 ? l->cp : 1;
    int64_t ep = l->ep > 0 ? l->ep : 1, etp = l->etp > 0 ? l->etp : 1;
    const par_layout_record r = {
        .world = world, .tp = tp, .pp = pp, .vpp = l->vpp > 0 ? l->vpp : 1, .cp = cp, .ep = ep, .etp = etp,
        .da = world / (pp * tp * cp), .de = world / (pp * etp * ep), .micro_batch = l->micro_batch,
        .global_batch = l->global_batch, .distributed_optimizer = l->distributed_optimizer != 0,
        .sequence_parallel = l->sequence_parallel != 0, .schedule = l->schedule, .pp_layout = l->pp_layout};
    return par_layout_record_json(&r);
}

/* Reads the record's keys, and those of checkpoints written before the one
 * writer (par_layout_record_read). */
par_status par__ckpt_layout_parse(const cJSON *o, const char *what, par_layout *l)
{
    par_layout_record r;
    par_status st = par_layout_record_read(o, what, &r);
    if (st)
        return st;
    par_layout_init(l);
    if (strlen(r.schedule) >= sizeof l->schedule || strlen(r.pp_layout) >= sizeof l->pp_layout)
        return par_err(PAR_EFORMAT, "%s: layout: the schedule name or the pipeline layout is longer than %zu / %zu "
                       "characters", what, sizeof l->schedule - 1, sizeof l->pp_layout - 1);
    l->world = r.world;
    l->tp = r.tp;
    l->pp = r.pp;
    l->vpp = r.vpp;
    l->cp = r.cp;
    l->ep = r.ep;
    l->etp = r.etp;
    l->da = r.da;
    l->de = r.de;
    l->micro_batch = r.micro_batch;
    l->global_batch = r.global_batch;
    l->distributed_optimizer = r.distributed_optimizer;
    l->sequence_parallel = r.sequence_parallel;
    snprintf(l->schedule, sizeof l->schedule, "%s", r.schedule);
    snprintf(l->pp_layout, sizeof l->pp_layout, "%s", r.pp_layout);
    l->resolved = 0;
    return PAR_OK;
}

cJSON *par__ckpt_tensors_json(const par_ckpt_tensor *t, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON *sh = cJSON_CreateArray();
        if (!o || !sh) {
            cJSON_Delete(o);
            cJSON_Delete(sh);
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddStringToObject(o, "name", t[i].name);
        cJSON_AddStringToObject(o, "dtype", par_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON_AddItemToObject(o, "shape", sh);
        cJSON_AddStringToObject(o, "slot", slot_names[t[i].slot]);
        cJSON_AddNumberToObject(o, "param", t[i].param);
        cJSON_AddNumberToObject(o, "expert", t[i].expert);
        cJSON_AddNumberToObject(o, "layer", t[i].layer);
        cJSON_AddNumberToObject(o, "mtp", t[i].mtp);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

char *par__ckpt_seed_str(uint64_t seed, char *buf, size_t n)
{
    snprintf(buf, n, "%" PRIu64, seed);
    return buf;
}

/* The metadata.json tree of a save (NULL: out of memory). */
cJSON *par__ckpt_metadata_json(const par_ckpt_info *info, int64_t world, const shard_desc *d, int nshards)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    char buf[32];
    cJSON_AddStringToObject(root, "format", PAR_CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", PAR_CKPT_VERSION);
    cJSON *state = cJSON_AddObjectToObject(root, "state");
    cJSON_AddNumberToObject(state, "step", (double)info->state.step);
    cJSON_AddNumberToObject(state, "data_cursor", (double)info->state.cursor);
    cJSON *rng = cJSON_AddObjectToObject(root, "rng");
    cJSON_AddStringToObject(rng, "scheme", "philox4x32-10 counter-based, key = (seed, name hash)");
    cJSON_AddStringToObject(rng, "seed", par__ckpt_seed_str(info->state.seed, buf, sizeof buf));
    cJSON_AddNumberToObject(rng, "step", (double)info->state.step);
    cJSON_AddStringToObject(root, "precision", info->state.precision[0] ? info->state.precision : "unknown");
    cJSON_AddNumberToObject(root, "world_size", (double)world);
    if (info->layout)
        cJSON_AddItemToObject(root, "layout", layout_json(info->layout, world));
    if (info->model)
        cJSON_AddItemToObject(root, "model", cJSON_Duplicate(info->model, 1));
    cJSON_AddItemToObject(root, "tensors", par__ckpt_tensors_json(info->tensors, info->ntensors));
    cJSON *sh = cJSON_AddArrayToObject(root, "shards");
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    for (int r = 0; r < nshards && sh && files; r++) {
        cJSON_AddItemToArray(sh, par__ckpt_desc_json(&d[r]));
        cJSON_AddStringToObject(files, d[r].file, d[r].sha);
    }
    /* cJSON_Add* return NULL on allocation failure; check the tree once. */
    if (!state || !rng || !sh || !files || cJSON_GetArraySize(sh) != nshards ||
        !cJSON_GetObjectItemCaseSensitive(root, "tensors") ||
        (info->layout && !cJSON_GetObjectItemCaseSensitive(root, "layout"))) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* Coverage of the gathered descriptors against the tensor table. */
par_status par__ckpt_check_descs(const char *what, const name_index *ix, const shard_desc *d, int nshards)
{
    int64_t n = 0;
    for (int r = 0; r < nshards; r++)
        n += d[r].n;
    span *sp = par_malloc((size_t)(n > 0 ? n : 1) * sizeof *sp, PAR_TAG_IO);
    if (!sp)
        return par_err(PAR_ENOMEM, "%s: out of memory", what);
    int64_t k = 0;
    par_status st = PAR_OK;
    for (int r = 0; r < nshards && !st; r++)
        for (int i = 0; i < d[r].n && !st; i++) {
            int ti;
            char w[ERRMSG_MAX];
            snprintf(w, sizeof w, "%s: shard %s", what, d[r].file);
            if ((st = par__ckpt_check_slice(ix, &d[r].s[i], w, &ti)))
                break;
            if (d[r].s[i].end > d[r].s[i].begin)
                sp[k++] = (span){ti, r, d[r].s[i].begin, d[r].s[i].end};
        }
    if (!st)
        st = check_coverage(what, ix->t, ix->n, sp, k);
    par_free(sp);
    return st;
}
