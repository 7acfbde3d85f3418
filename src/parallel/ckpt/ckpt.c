/* parallel/ckpt/ckpt.c - distributed checkpoints (see ckpt.h, docs/checkpoints.md). */
#include "parallel/ckpt/ckpt.h"

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

#define ERRMSG_MAX 400

/* ---- test hook ------------------------------------------------------------ */

static void (*g_hook)(const char *phase, int rank);

void par__ckpt_set_test_hook(void (*hook)(const char *phase, int rank))
{
    g_hook = hook;
}

static void hook(const char *phase, int rank)
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

static int64_t tensor_numel(const par_ckpt_tensor *t)
{
    return par_shape_numel(t->ndim, t->shape, 0);
}

/* Sorted index of tensor names for lookups. */
typedef struct {
    const par_ckpt_tensor *t;
    int n;
    int *order; /* indices sorted by name */
} name_index;

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

static void index_free(name_index *ix)
{
    par_free(ix->order);
    ix->order = NULL;
}

static par_status index_build(name_index *ix, const par_ckpt_tensor *t, int n, const char *what)
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
            index_free(ix);
            return st;
        }
    return PAR_OK;
}

static int index_find(const name_index *ix, const char *name)
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

static par_status check_tensors(const par_ckpt_tensor *t, int n, const char *what)
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
static par_status check_roles(const par_ckpt_tensor *t, int n, const char *what)
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
    int j = k < PAR_CKPT_SLOT_COUNT ? index_find(ix, pn) : -1;
    if (j < 0 || t[j].ndim != t[i].ndim || memcmp(t[j].shape, t[i].shape, (size_t)t[i].ndim * sizeof t[i].shape[0]))
        return -1;
    *slot = (par_ckpt_slot)k;
    return j;
}

/* Roles of a checkpoint written before metadata.json recorded them, from
 * the contract's names (the one place a name becomes a role; ckpt.h,
 * par_ckpt_open).  A name that does not match is a plain parameter. */
static void roles_from_names(par_ckpt_tensor *t, int n, const name_index *ix)
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

/* ---- coverage ------------------------------------------------------------- */

typedef struct {
    int t;        /* tensor index */
    int rank;     /* shard        */
    int64_t b, e; /* range        */
} span;

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
        int64_t numel = tensor_numel(&t[i]);
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

/* ---- shard descriptors ----------------------------------------------------- */

typedef struct {
    int rank;
    char file[32];
    char sha[PAR_SHA256_HEX];
    int n;               /* non-empty slices */
    par_ckpt_slice *s;   /* [n] */
} shard_desc;

static void desc_free(shard_desc *d)
{
    par_free(d->s);
    d->s = NULL;
    d->n = 0;
}

static void shard_file_name(char *buf, size_t n, int rank)
{
    snprintf(buf, n, "rank-%05d.safetensors", rank);
}

static void slice_key(char *buf, size_t n, const char *name, int64_t begin)
{
    snprintf(buf, n, "%s@%lld", name, (long long)begin);
}

#define KEY_MAX (PAR_CKPT_NAME_MAX + 24)

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

static cJSON *desc_json(const shard_desc *d)
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
static par_status desc_parse(const cJSON *o, const char *what, int idx, shard_desc *d)
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
    shard_file_name(d->file, sizeof d->file, d->rank);
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
            desc_free(d);
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
static par_status check_slice(const name_index *ix, const par_ckpt_slice *s, const char *what, int *ti)
{
    int i = index_find(ix, s->name);
    if (i < 0)
        return par_err(PAR_ENOTFOUND, "%s: slice of unknown tensor '%s'", what, s->name);
    int64_t numel = tensor_numel(&ix->t[i]);
    if (s->begin < 0 || s->begin > s->end || s->end > numel)
        return par_err(PAR_ERANGE, "%s: tensor '%s': slice [%lld, %lld) is outside [0, %lld]", what, s->name,
                       (long long)s->begin, (long long)s->end, (long long)numel);
    *ti = i;
    return PAR_OK;
}

/* Writes rank's shard into tmp; fills d (non-empty slices in item order). */
static par_status write_shard(const char *tmp, int rank, const name_index *ix, const par_ckpt_item *items,
                              int nitems, shard_desc *d)
{
    memset(d, 0, sizeof *d);
    d->rank = rank;
    shard_file_name(d->file, sizeof d->file, rank);
    char what[64];
    snprintf(what, sizeof what, "checkpoint save, rank %d", rank);
    par_status st = PAR_OK;
    d->s = par_calloc((size_t)(nitems > 0 ? nitems : 1), sizeof *d->s, PAR_TAG_IO);
    par_st_writer *w = NULL;
    char *path = NULL;
    if (!d->s)
        return par_err(PAR_ENOMEM, "%s: out of memory", what);
    st = par_st_writer_new(&w);
    if (st)
        goto fail_free_desc;
    char v[32];
    snprintf(v, sizeof v, "%d", rank);
    if ((st = par_st_writer_meta(w, "format", PAR_CKPT_FORMAT)) || (st = par_st_writer_meta(w, "rank", v)))
        goto fail_free_writer;
    snprintf(v, sizeof v, "%d", PAR_CKPT_VERSION);
    if ((st = par_st_writer_meta(w, "version", v)))
        goto fail_free_writer;
    for (int k = 0; k < nitems; k++) {
        int ti;
        if ((st = check_slice(ix, &items[k].s, what, &ti)))
            goto fail_free_writer;
        int64_t len = items[k].s.end - items[k].s.begin;
        if (!len)
            continue;
        if (!items[k].data) {
            st = par_err(PAR_EINVAL, "%s: tensor '%s' slice [%lld, %lld) has no data", what, items[k].s.name,
                         (long long)items[k].s.begin, (long long)items[k].s.end);
            goto fail_free_writer;
        }
        char key[KEY_MAX];
        slice_key(key, sizeof key, items[k].s.name, items[k].s.begin);
        par_tensor tv = par_tensor_view(ix->t[ti].dtype, 1, &len, items[k].data);
        if ((st = par_st_writer_add(w, key, &tv))) {
            if (st == PAR_EINVAL)
                st = par_err(PAR_EINVAL, "%s: tensor '%s' slice at %lld given twice", what, items[k].s.name,
                             (long long)items[k].s.begin);
            goto fail_free_writer;
        }
        d->s[d->n++] = items[k].s;
    }
    path = par_path_join(tmp, d->file);
    if (!path) {
        st = par_err(PAR_ENOMEM, "%s: out of memory", what);
        goto fail_free_writer;
    }
    if ((st = par_st_writer_write(w, path)))
        goto fail_free_path;
    if ((st = par_sha256_file(path, d->sha)))
        goto fail_free_path;
    par_free(path);
    par_st_writer_free(w);
    return PAR_OK;

fail_free_path:
    par_free(path);
fail_free_writer:
    par_st_writer_free(w);
fail_free_desc:
    desc_free(d);
    return st;
}

/* ---- metadata --------------------------------------------------------------- */

static cJSON *layout_json(const par_layout *l, int64_t world)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    int64_t tp = l->tp > 0 ? l->tp : 1, pp = l->pp > 0 ? l->pp : 1, cp = l->cp > 0 ? l->cp : 1;
    int64_t ep = l->ep > 0 ? l->ep : 1, etp = l->etp > 0 ? l->etp : 1;
    cJSON_AddNumberToObject(o, "world_size", (double)world);
    cJSON_AddNumberToObject(o, "tp", (double)tp);
    cJSON_AddNumberToObject(o, "pp", (double)pp);
    cJSON_AddNumberToObject(o, "vpp", (double)(l->vpp > 0 ? l->vpp : 1));
    cJSON_AddNumberToObject(o, "cp", (double)cp);
    cJSON_AddNumberToObject(o, "ep", (double)ep);
    cJSON_AddNumberToObject(o, "etp", (double)etp);
    cJSON_AddNumberToObject(o, "da", (double)(world / (pp * tp * cp)));
    cJSON_AddNumberToObject(o, "de", (double)(world / (pp * etp * ep)));
    cJSON_AddNumberToObject(o, "micro_batch", (double)l->micro_batch);
    cJSON_AddNumberToObject(o, "global_batch", (double)l->global_batch);
    cJSON_AddBoolToObject(o, "distributed_optimizer", l->distributed_optimizer != 0);
    cJSON_AddStringToObject(o, "schedule", l->schedule);
    cJSON_AddStringToObject(o, "pp_layout", l->pp_layout);
    return o;
}

static par_status layout_parse(const cJSON *o, const char *what, par_layout *l)
{
    par_layout_init(l);
    struct {
        const char *k;
        int64_t *dst;
    } f[] = {{"world_size", &l->world}, {"tp", &l->tp},   {"pp", &l->pp},
             {"vpp", &l->vpp},          {"cp", &l->cp},   {"ep", &l->ep},
             {"etp", &l->etp},          {"da", &l->da},   {"de", &l->de},
             {"micro_batch", &l->micro_batch}, {"global_batch", &l->global_batch}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!par_json_int(o, f[i].k, f[i].dst))
            return par_err(PAR_EFORMAT, "%s: layout.%s: missing or not an integer", what, f[i].k);
    const cJSON *dopt = cJSON_GetObjectItemCaseSensitive(o, "distributed_optimizer");
    const char *sch = par_json_str(o, "schedule"), *ppl = par_json_str(o, "pp_layout");
    if (!cJSON_IsBool(dopt) || !sch || !ppl || strlen(sch) >= sizeof l->schedule ||
        strlen(ppl) >= sizeof l->pp_layout)
        return par_err(PAR_EFORMAT, "%s: layout: needs \"distributed_optimizer\" (bool), \"schedule\" and \"pp_layout\"",
                       what);
    l->distributed_optimizer = cJSON_IsTrue(dopt);
    snprintf(l->schedule, sizeof l->schedule, "%s", sch);
    snprintf(l->pp_layout, sizeof l->pp_layout, "%s", ppl);
    l->resolved = 0;
    return PAR_OK;
}

static cJSON *tensors_json(const par_ckpt_tensor *t, int n)
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

static char *seed_str(uint64_t seed, char *buf, size_t n)
{
    snprintf(buf, n, "%" PRIu64, seed);
    return buf;
}

/* The metadata.json tree of a save (NULL: out of memory). */
static cJSON *metadata_json(const par_ckpt_info *info, int64_t world, const shard_desc *d, int nshards)
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
    cJSON_AddStringToObject(rng, "seed", seed_str(info->state.seed, buf, sizeof buf));
    cJSON_AddNumberToObject(rng, "step", (double)info->state.step);
    cJSON_AddStringToObject(root, "precision", info->state.precision[0] ? info->state.precision : "unknown");
    cJSON_AddNumberToObject(root, "world_size", (double)world);
    if (info->layout)
        cJSON_AddItemToObject(root, "layout", layout_json(info->layout, world));
    if (info->model)
        cJSON_AddItemToObject(root, "model", cJSON_Duplicate(info->model, 1));
    cJSON_AddItemToObject(root, "tensors", tensors_json(info->tensors, info->ntensors));
    cJSON *sh = cJSON_AddArrayToObject(root, "shards");
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    for (int r = 0; r < nshards && sh && files; r++) {
        cJSON_AddItemToArray(sh, desc_json(&d[r]));
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

/* tmp/SHA256SUMS in sha256sum's text form: metadata.json (hash msha), then
 * the shards in rank order (file names sort the same way). */
static par_status write_sums(const char *tmp, const char *msha, const shard_desc *d, int nshards)
{
    size_t cap = (size_t)(nshards + 1) * (PAR_SHA256_HEX + 48) + 1, len = 0;
    char *txt = par_malloc(cap, PAR_TAG_IO);
    char *path = par_path_join(tmp, PAR_CKPT_SUMS);
    par_status st = PAR_OK;
    if (!txt || !path) {
        st = par_err(PAR_ENOMEM, "checkpoint metadata: out of memory");
    } else {
        len += (size_t)snprintf(txt + len, cap - len, "%s  %s\n", msha, PAR_CKPT_META);
        for (int r = 0; r < nshards; r++)
            len += (size_t)snprintf(txt + len, cap - len, "%s  %s\n", d[r].sha, d[r].file);
        st = par_file_write_atomic(path, txt, len);
    }
    par_free(path);
    par_free(txt);
    return st;
}

/* Writes metadata.json and SHA256SUMS into tmp. */
static par_status write_metadata(const char *tmp, const par_ckpt_info *info, int64_t world, const shard_desc *d,
                                 int nshards)
{
    cJSON *root = metadata_json(info, world, d, nshards);
    char *path = root ? par_path_join(tmp, PAR_CKPT_META) : NULL;
    par_status st = PAR_OK;
    if (!path) {
        st = par_err(PAR_ENOMEM, "checkpoint metadata: out of memory");
        goto fail_free_root;
    }
    if ((st = par_json_write_file(path, root)))
        goto fail_free_path;
    hook("metadata", 0);
    char msha[PAR_SHA256_HEX];
    if ((st = par_sha256_file(path, msha)) || (st = write_sums(tmp, msha, d, nshards)))
        goto fail_free_path;
    hook("sums", 0);
fail_free_path:
    par_free(path);
fail_free_root:
    cJSON_Delete(root);
    return st;
}

/* Coverage of the gathered descriptors against the tensor table. */
static par_status check_descs(const char *what, const name_index *ix, const shard_desc *d, int nshards)
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
            if ((st = check_slice(ix, &d[r].s[i], w, &ti)))
                break;
            if (d[r].s[i].end > d[r].s[i].begin)
                sp[k++] = (span){ti, r, d[r].s[i].begin, d[r].s[i].end};
        }
    if (!st)
        st = check_coverage(what, ix->t, ix->n, sp, k);
    par_free(sp);
    return st;
}

/* Rank-0 part of a save: coverage, metadata, sums, commit.  Frees tmp. */
static par_status finalize(char *tmp, const char *dir, const par_ckpt_info *info, const name_index *ix,
                           int64_t world, const shard_desc *d, int nshards)
{
    char what[ERRMSG_MAX];
    snprintf(what, sizeof what, "checkpoint save %s", dir);
    par_status st = check_descs(what, ix, d, nshards);
    if (!st)
        st = write_metadata(tmp, info, world, d, nshards);
    if (st) {
        par_adir_abort(tmp);
        return st;
    }
    hook("commit", 0);
    return par_adir_commit(tmp, dir);
}

/* Digest of what must agree over ranks: tensor table and training state. */
static void info_digest(const par_ckpt_info *info, uint8_t out[PAR_SHA256_BYTES])
{
    cJSON *o = cJSON_CreateObject();
    char buf[32];
    char *txt = NULL;
    if (o) {
        cJSON_AddItemToObject(o, "t", tensors_json(info->tensors, info->ntensors));
        cJSON_AddNumberToObject(o, "step", (double)info->state.step);
        cJSON_AddNumberToObject(o, "cursor", (double)info->state.cursor);
        cJSON_AddStringToObject(o, "seed", seed_str(info->state.seed, buf, sizeof buf));
        cJSON_AddStringToObject(o, "precision", info->state.precision);
        txt = cJSON_PrintUnformatted(o);
    }
    if (txt)
        par_sha256(txt, strlen(txt), out);
    else
        memset(out, 0xff, PAR_SHA256_BYTES); /* out of memory: disagree loudly */
    cJSON_free(txt);
    cJSON_Delete(o);
}

/* ---- collective save -------------------------------------------------------------- */

typedef struct {
    int64_t status;
    int64_t desc_len;
    uint8_t digest[PAR_SHA256_BYTES];
} rank_report;

/* Broadcasts root's status and message; every rank returns the same. */
static par_status agree(par_comm *c, int root, par_status mine, const char *ctx)
{
    char msg[ERRMSG_MAX];
    int64_t s = mine;
    memset(msg, 0, sizeof msg);
    if (par_comm_rank(c) == root && mine)
        snprintf(msg, sizeof msg, "%s", par_last_error());
    par_status cst = par_bcast(c, &s, 1, PAR_C_I64, root);
    if (!cst)
        cst = par_bcast(c, msg, sizeof msg, PAR_C_BYTE, root);
    if (cst)
        return cst;
    if (!s)
        return PAR_OK;
    if (par_comm_rank(c) == root)
        return (par_status)s;
    msg[sizeof msg - 1] = 0;
    return par_err((par_status)s, "%s (rank %d): %s", ctx, root, msg);
}

/* One rank's part of a save between its steps. */
typedef struct {
    par_comm *world;
    int rank, size;
    const char *dir;
    char ctx[ERRMSG_MAX];  /* "checkpoint save DIR"                              */
    name_index ix;         /* the tensor table's names                            */
    char *tmp;             /* rank 0: the temporary directory until committed     */
    char tmpname[4096];    /* every rank: its name                                */
    shard_desc mine;       /* this rank's shard                                   */
    char *desc_txt;        /* ... as JSON                                         */
    rank_report *rep;      /* [size] every rank's status, descriptor size, digest */
    size_t *counts;        /* [2*size] descriptor lengths, then displacements     */
    char *all_txt;         /* every rank's descriptor                             */
    shard_desc *descs;     /* rank 0: [size] parsed                               */
} save_ctx;

static void save_ctx_free(save_ctx *c)
{
    if (c->tmp)
        par_adir_abort(c->tmp);
    for (int r = 0; c->descs && r < c->size; r++)
        desc_free(&c->descs[r]);
    par_free(c->descs);
    par_free(c->all_txt);
    par_free(c->counts);
    par_free(c->rep);
    cJSON_free(c->desc_txt);
    desc_free(&c->mine);
    index_free(&c->ix);
}

/* Step 1: local checks (*st: this rank's verdict), rank 0 makes the
 * temporary directory and every rank learns its name.  A failure of rank 0
 * is every rank's (the return value); another rank's stays in *st until
 * step 3. */
static par_status save_begin(save_ctx *c, const par_ckpt_info *info, par_status *st)
{
    *st = check_tensors(info->tensors, info->ntensors, c->ctx);
    if (!*st)
        *st = check_roles(info->tensors, info->ntensors, c->ctx);
    if (!*st)
        *st = index_build(&c->ix, info->tensors, info->ntensors, c->ctx);
    if (!*st && info->layout && par_ckpt_layout_world(info->layout) != c->size)
        *st = par_err(PAR_EMISMATCH, "%s: layout world size %lld but the world has %d ranks", c->ctx,
                      (long long)par_ckpt_layout_world(info->layout), c->size);
    if (c->rank == 0 && !*st && !(*st = par_adir_begin(c->dir, &c->tmp)))
        hook("tmp", 0);
    par_status cst = agree(c->world, 0, *st, c->ctx);
    if (cst)
        return cst;
    if (c->rank == 0)
        snprintf(c->tmpname, sizeof c->tmpname, "%s", c->tmp);
    cst = par_bcast(c->world, c->tmpname, sizeof c->tmpname, PAR_C_BYTE, 0);
    c->tmpname[sizeof c->tmpname - 1] = 0;
    return cst;
}

/* Step 2: this rank writes its shard and describes it. */
static void save_shard(save_ctx *c, const par_ckpt_item *items, int nitems, par_status *st)
{
    if (*st || (*st = write_shard(c->tmpname, c->rank, &c->ix, items, nitems, &c->mine)))
        return;
    hook("shard", c->rank);
    cJSON *j = desc_json(&c->mine);
    c->desc_txt = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!c->desc_txt)
        *st = par_err(PAR_ENOMEM, "%s: rank %d: out of memory", c->ctx, c->rank);
}

/* Step 3: every rank's status, digest and descriptor to every rank;
 * *failed = the first rank that failed (-1: none; then no descriptors). */
static par_status save_gather(save_ctx *c, const par_ckpt_info *info, par_status st, int *failed)
{
    c->rep = par_calloc((size_t)c->size, sizeof *c->rep, PAR_TAG_IO);
    rank_report me = {st, c->desc_txt ? (int64_t)strlen(c->desc_txt) : 0, {0}};
    info_digest(info, me.digest);
    if (!c->rep) /* the world is stopped by this rank's failure */
        return par_err(PAR_ENOMEM, "%s: out of memory", c->ctx);
    par_status cst = par_allgather(c->world, &me, c->rep, sizeof me, PAR_C_BYTE);
    if (cst)
        return cst;
    *failed = -1;
    for (int r = 0; r < c->size && *failed < 0; r++)
        if (c->rep[r].status)
            *failed = r;
    if (*failed >= 0)
        return PAR_OK;
    c->counts = par_calloc((size_t)c->size * 2, sizeof *c->counts, PAR_TAG_IO);
    size_t total = 0;
    for (int r = 0; c->counts && r < c->size; r++) {
        c->counts[r] = (size_t)c->rep[r].desc_len;
        c->counts[c->size + r] = total;
        total += c->counts[r];
    }
    if (!c->counts || !(c->all_txt = par_malloc(total + 1, PAR_TAG_IO)))
        return par_err(PAR_ENOMEM, "%s: out of memory", c->ctx);
    return par_allgatherv(c->world, c->desc_txt, (size_t)me.desc_len, c->all_txt, c->counts, c->counts + c->size,
                          PAR_C_BYTE);
}

/* Step 4, rank 0: every rank passed the same table and state; coverage,
 * metadata, commit (finalize). */
static par_status save_commit(save_ctx *c, const par_ckpt_info *info)
{
    hook("gathered", 0);
    for (int r = 1; r < c->size; r++)
        if (memcmp(c->rep[r].digest, c->rep[0].digest, PAR_SHA256_BYTES))
            return par_err(PAR_EMISMATCH, "%s: rank %d passed another tensor table or training state than rank 0",
                           c->ctx, r);
    if (!(c->descs = par_calloc((size_t)c->size, sizeof *c->descs, PAR_TAG_IO)))
        return par_err(PAR_ENOMEM, "%s: out of memory", c->ctx);
    for (int r = 0; r < c->size; r++) {
        cJSON *j = NULL;
        par_status st = par_json_parse(c->all_txt + c->counts[c->size + r], c->counts[r], c->ctx, &j);
        if (!st)
            st = desc_parse(j, c->ctx, r, &c->descs[r]);
        cJSON_Delete(j);
        if (st)
            return st;
    }
    par_status st = finalize(c->tmp, c->dir, info, &c->ix, c->size, c->descs, c->size);
    c->tmp = NULL; /* committed or removed */
    if (!st)
        hook("done", 0);
    return st;
}

par_status par_ckpt_save(par_comm *world, const char *dir, const par_ckpt_info *info,
                         const par_ckpt_item *items, int nitems)
{
    save_ctx c;
    memset(&c, 0, sizeof c);
    c.world = world;
    c.rank = par_comm_rank(world);
    c.size = par_comm_size(world);
    c.dir = dir;
    snprintf(c.ctx, sizeof c.ctx, "checkpoint save %s", dir);
    par_status st = PAR_OK;
    int failed = -1;
    par_status cst = save_begin(&c, info, &st);
    if (!cst) {
        save_shard(&c, items, nitems, &st);
        cst = save_gather(&c, info, st, &failed);
    }
    if (!cst && failed >= 0) /* every rank reports the first failure, in its rank's words */
        cst = agree(world, failed, c.rank == failed ? st : PAR_OK, c.ctx);
    else if (!cst) {
        if (c.rank == 0)
            st = save_commit(&c, info);
        cst = agree(world, 0, st, c.ctx);
    }
    save_ctx_free(&c);
    return cst;
}

/* ---- loading ------------------------------------------------------------------ */

typedef struct {
    int64_t b, e;
    int rank;
    const void *data; /* element b of the tensor */
} piece;

struct par_ckpt {
    char *dir;
    par_ckpt_state state;
    int nt;
    par_ckpt_tensor *t;
    name_index ix;
    int nranks;
    shard_desc *d;
    par_st_file **files;  /* [nranks] */
    int has_layout;
    par_layout layout;
    cJSON *model;
    /* per tensor: its pieces sorted by begin */
    int64_t *poff;        /* [nt+1] */
    piece *pieces;
};

void par_ckpt_close(par_ckpt *ck)
{
    if (!ck)
        return;
    if (ck->files)
        for (int r = 0; r < ck->nranks; r++)
            par_st_close(ck->files[r]);
    if (ck->d)
        for (int r = 0; r < ck->nranks; r++)
            desc_free(&ck->d[r]);
    par_free(ck->files);
    par_free(ck->d);
    index_free(&ck->ix);
    par_free(ck->t);
    par_free(ck->poff);
    par_free(ck->pieces);
    cJSON_Delete(ck->model);
    par_free(ck->dir);
    par_free(ck);
}

typedef struct {
    char name[256];
    char sha[PAR_SHA256_HEX];
} sum_line;

/* Parses SHA256SUMS ("<64 hex>  <name>\n" lines; "*" binary marker allowed). */
static par_status parse_sums(const char *txt, size_t len, const char *label, sum_line **out, int *n)
{
    int cap = 16, k = 0;
    sum_line *v = par_malloc((size_t)cap * sizeof *v, PAR_TAG_IO);
    if (!v)
        return par_err(PAR_ENOMEM, "%s: out of memory", label);
    size_t i = 0;
    int line = 0;
    while (i < len) {
        line++;
        size_t j = i;
        while (j < len && txt[j] != '\n')
            j++;
        size_t ll = j - i;
        const char *s = txt + i;
        if (ll < 67 || (s[64] != ' ') || (s[65] != ' ' && s[65] != '*') || ll - 66 >= sizeof v[0].name) {
            par_free(v);
            return par_err(PAR_EFORMAT, "%s: line %d is not '<sha256>  <file>'", label, line);
        }
        if (k == cap) {
            sum_line *nv = par_realloc(v, (size_t)(cap *= 2) * sizeof *v, PAR_TAG_IO);
            if (!nv) {
                par_free(v);
                return par_err(PAR_ENOMEM, "%s: out of memory", label);
            }
            v = nv;
        }
        memcpy(v[k].sha, s, 64);
        v[k].sha[64] = 0;
        memcpy(v[k].name, s + 66, ll - 66);
        v[k].name[ll - 66] = 0;
        if (!par_sha256_hex_valid(v[k].sha) || strchr(v[k].name, '/') || !strcmp(v[k].name, "..") ||
            !strcmp(v[k].name, ".")) {
            par_free(v);
            return par_err(PAR_EFORMAT, "%s: line %d: bad hash or file name", label, line);
        }
        for (char *c = v[k].sha; *c; c++)
            if (*c >= 'A' && *c <= 'F')
                *c = (char)(*c - 'A' + 'a');
        k++;
        i = j + 1;
    }
    *out = v;
    *n = k;
    return PAR_OK;
}

static const sum_line *sums_find(const sum_line *v, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name))
            return &v[i];
    return NULL;
}

static par_status check_file_hash(const char *dir, const char *name, const char *want, const char *label)
{
    char *path = par_path_join(dir, name);
    if (!path)
        return par_err(PAR_ENOMEM, "%s: out of memory", label);
    if (!par_path_exists(path)) {
        par_status st = par_err(PAR_ENOTFOUND, "%s: file %s is missing (listed in %s)", label, name, PAR_CKPT_SUMS);
        par_free(path);
        return st;
    }
    char got[PAR_SHA256_HEX];
    par_status st = par_sha256_file(path, got);
    if (!st && strcmp(got, want)) {
        FILE *f = fopen(path, "rb");
        long sz = -1;
        if (f && fseek(f, 0, SEEK_END) == 0)
            sz = ftell(f);
        if (f)
            fclose(f);
        st = par_err(PAR_EMISMATCH, "%s: file %s is corrupt or truncated (%ld bytes): sha256 %s, expected %s", label,
                     name, sz, got, want);
    }
    par_free(path);
    return st;
}

/* The role members of tensors[i] ("slot", "param", "expert", "layer",
 * "mtp"); *has = 0 when the entry has none (a checkpoint written before they
 * were recorded). */
static par_status parse_role(const cJSON *e, const char *label, int i, par_ckpt_tensor *x, int *has)
{
    const char *slot = par_json_str(e, "slot");
    *has = slot != NULL || cJSON_GetObjectItemCaseSensitive(e, "slot");
    if (!*has)
        return PAR_OK;
    const char *keys[4] = {"param", "expert", "layer", "mtp"};
    int *dst[4] = {&x->param, &x->expert, &x->layer, &x->mtp};
    int k = 0;
    while (slot && k < PAR_CKPT_SLOT_COUNT && strcmp(slot, slot_names[k]))
        k++;
    if (!slot || k == PAR_CKPT_SLOT_COUNT)
        return par_err(PAR_EFORMAT, "%s: tensors[%d] ('%s'): \"slot\" must be param|momentum|exp_avg|exp_avg_sq",
                       label, i, x->name);
    x->slot = (par_ckpt_slot)k;
    for (int j = 0; j < 4; j++) {
        int64_t v;
        if (!par_json_int(e, keys[j], &v) || v < -1 || v > INT32_MAX)
            return par_err(PAR_EFORMAT, "%s: tensors[%d] ('%s'): \"%s\" missing or not an integer >= -1", label, i,
                           x->name, keys[j]);
        *dst[j] = (int)v;
    }
    return PAR_OK;
}

/* One entry of "tensors": name, dtype, shape and the role members. */
static par_status parse_tensor(const cJSON *e, const char *label, int i, par_ckpt_tensor *x, int *has_role)
{
    const char *nm = par_json_str(e, "name"), *dt = par_json_str(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    par_dtype dtype;
    if (!nm || !dt || !cJSON_IsArray(sh) || strlen(nm) >= PAR_CKPT_NAME_MAX ||
        cJSON_GetArraySize(sh) > PAR_MAX_DIMS || par_dtype_parse(dt, &dtype))
        return par_err(PAR_EFORMAT, "%s: tensors[%d]: needs \"name\", \"dtype\" (F64|F32|BF16|I32|I64) and "
                                    "\"shape\" (at most %d dims)", label, i, PAR_MAX_DIMS);
    int64_t shape[PAR_MAX_DIMS] = {0};
    const int ndim = cJSON_GetArraySize(sh);
    for (int d = 0; d < ndim; d++)
        if (!par_json_as_int(cJSON_GetArrayItem(sh, d), &shape[d]) || shape[d] < 0)
            return par_err(PAR_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", label, nm, d);
    par_ckpt_tensor_init(x, nm, dtype, ndim, shape);
    return parse_role(e, label, i, x, has_role);
}

/* "tensors" of metadata.json; *legacy = 1 when no entry records its role
 * (then roles_from_names gives them, once the names are indexed). */
static par_status parse_tensors(const cJSON *a, const char *label, par_ckpt_tensor **out, int *n, int *legacy)
{
    if (!cJSON_IsArray(a))
        return par_err(PAR_EFORMAT, "%s: \"tensors\" missing or not an array", label);
    int k = cJSON_GetArraySize(a), i = 0, with_role = 0;
    par_ckpt_tensor *t = par_calloc((size_t)(k > 0 ? k : 1), sizeof *t, PAR_TAG_IO);
    if (!t)
        return par_err(PAR_ENOMEM, "%s: out of memory", label);
    par_status st = PAR_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        int has = 0;
        if ((st = parse_tensor(e, label, i, &t[i], &has)))
            break;
        if (i > 0 && has != (with_role > 0)) {
            st = par_err(PAR_EFORMAT, "%s: tensors[%d] ('%s') %s its role (\"slot\", ...) but tensors[0] %s", label,
                         i, t[i].name, has ? "records" : "lacks", has ? "does not" : "does");
            break;
        }
        with_role += has;
        i++;
    }
    if (!st && (st = check_tensors(t, k, label)))
        st = par_err(PAR_EFORMAT, "%s", par_last_error());
    if (st) {
        par_free(t);
        return st;
    }
    *out = t;
    *n = k;
    *legacy = k > 0 && with_role == 0;
    return PAR_OK;
}

static int cmp_piece(const void *pa, const void *pb)
{
    const piece *a = pa, *b = pb;
    return a->b < b->b ? -1 : a->b > b->b;
}

/* Checks shard r's file against its slice list and records its pieces. */
static par_status check_shard(par_ckpt *ck, int r, const char *label, int64_t *cursor_per_tensor)
{
    const shard_desc *d = &ck->d[r];
    const par_st_file *f = ck->files[r];
    int nonempty = 0;
    for (int i = 0; i < d->n; i++) {
        const par_ckpt_slice *s = &d->s[i];
        int ti;
        par_status st = check_slice(&ck->ix, s, label, &ti);
        if (st)
            return par_err(PAR_EFORMAT, "%s: shard %s: %s", label, d->file, par_last_error());
        int64_t len = s->end - s->begin;
        if (!len)
            continue;
        nonempty++;
        char key[KEY_MAX];
        slice_key(key, sizeof key, s->name, s->begin);
        const par_tensor *x = par_st_find(f, key);
        if (!x)
            return par_err(PAR_EMISMATCH, "%s: shard %s has no tensor '%s' (listed in %s)", label, d->file, key,
                           PAR_CKPT_META);
        if (x->dtype != ck->t[ti].dtype || x->ndim != 1 || x->shape[0] != len)
            return par_err(PAR_EMISMATCH,
                           "%s: shard %s: '%s' is %s [%lld] (%d dims), metadata says %s [%lld] for [%lld, %lld)",
                           label, d->file, key, par_dtype_name(x->dtype), (long long)(x->ndim ? x->shape[0] : 0),
                           x->ndim, par_dtype_name(ck->t[ti].dtype), (long long)len, (long long)s->begin,
                           (long long)s->end);
        piece *p = &ck->pieces[cursor_per_tensor[ti]++];
        *p = (piece){s->begin, s->end, r, x->data};
    }
    if (par_st_count(f) != nonempty)
        return par_err(PAR_EMISMATCH, "%s: shard %s holds %d tensors, metadata lists %d non-empty slices", label,
                       d->file, par_st_count(f), nonempty);
    return PAR_OK;
}

/* What par_ckpt_open reads before it trusts anything. */
typedef struct {
    const char *dir;
    char label[ERRMSG_MAX];   /* "checkpoint DIR"                */
    char ml[ERRMSG_MAX + 16]; /* "checkpoint DIR: metadata.json" */
    char *mtxt, *stxt;        /* metadata.json, SHA256SUMS       */
    size_t mlen, slen;
    sum_line *sums;
    int nsums;
    cJSON *root;              /* metadata.json, parsed           */
} open_ctx;

static void open_ctx_free(open_ctx *c)
{
    par_free(c->mtxt);
    par_free(c->stxt);
    par_free(c->sums);
    cJSON_Delete(c->root);
}

/* Reads DIR/name into *txt; PAR_ENOTFOUND "<label>: <name> is missing<why>". */
static par_status read_member(const open_ctx *c, const char *name, const char *why, char **txt, size_t *len)
{
    char *path = par_path_join(c->dir, name);
    if (!path)
        return par_err(PAR_ENOMEM, "%s: out of memory", c->label);
    par_status st = PAR_OK;
    if (!par_path_exists(path))
        st = par_err(PAR_ENOTFOUND, "%s: %s is missing%s", c->label, name, why);
    else
        st = par_file_read(path, PAR_TAG_IO, (void **)txt, len);
    par_free(path);
    return st;
}

/* metadata.json and SHA256SUMS read, the sums parsed, the metadata parsed
 * (a parse failure with a wrong hash says "corrupt"), format and version
 * checked first (a newer format may hash differently). */
static par_status open_metadata(open_ctx *c)
{
    par_status st;
    if ((st = read_member(c, PAR_CKPT_META, " (not a checkpoint, or an unfinished save)", &c->mtxt, &c->mlen)) ||
        (st = read_member(c, PAR_CKPT_SUMS, "", &c->stxt, &c->slen)))
        return st;
    char sl[ERRMSG_MAX + 16];
    snprintf(sl, sizeof sl, "%s: %s", c->label, PAR_CKPT_SUMS);
    if ((st = parse_sums(c->stxt, c->slen, sl, &c->sums, &c->nsums)))
        return st;
    const sum_line *ms = sums_find(c->sums, c->nsums, PAR_CKPT_META);
    if (!ms)
        return par_err(PAR_EFORMAT, "%s: %s does not list %s", c->label, PAR_CKPT_SUMS, PAR_CKPT_META);
    if ((st = par_json_parse(c->mtxt, c->mlen, c->ml, &c->root))) {
        char got[PAR_SHA256_HEX];
        par_sha256_hex(c->mtxt, c->mlen, got);
        if (strcmp(got, ms->sha))
            st = par_err(PAR_EMISMATCH, "%s: %s is corrupt: sha256 %s, expected %s", c->label, PAR_CKPT_META, got,
                         ms->sha);
        return st;
    }
    const char *fmt = par_json_str(c->root, "format");
    int64_t version;
    if (!fmt || strcmp(fmt, PAR_CKPT_FORMAT))
        return par_err(PAR_EFORMAT, "%s: format '%s', expected '%s'", c->ml, fmt ? fmt : "(missing)",
                       PAR_CKPT_FORMAT);
    if (!par_json_int(c->root, "version", &version))
        return par_err(PAR_EFORMAT, "%s: \"version\" missing or not an integer", c->ml);
    if (version != PAR_CKPT_VERSION)
        return par_err(PAR_EUNSUPPORTED, "%s: format version %lld, this build reads version %d", c->ml,
                       (long long)version, PAR_CKPT_VERSION);
    return PAR_OK;
}

/* Training state, precision, world size, layout and model of metadata.json. */
static par_status parse_state(par_ckpt *ck, const open_ctx *c, int64_t *world)
{
    const cJSON *state = par_json_obj(c->root, "state"), *rng = par_json_obj(c->root, "rng");
    const char *seed = rng ? par_json_str(rng, "seed") : NULL, *prec = par_json_str(c->root, "precision");
    char *end = NULL;
    if (!state || !par_json_int(state, "step", &ck->state.step) ||
        !par_json_int(state, "data_cursor", &ck->state.cursor) || !seed || !prec ||
        !par_json_int(c->root, "world_size", world))
        return par_err(PAR_EFORMAT, "%s: needs \"state\": {step, data_cursor}, \"rng\": {seed}, \"precision\" and "
                                    "\"world_size\"", c->ml);
    errno = 0;
    ck->state.seed = strtoull(seed, &end, 10);
    if (errno || !*seed || *end || *seed == '-')
        return par_err(PAR_EFORMAT, "%s: rng.seed '%s' is not an unsigned 64-bit integer", c->ml, seed);
    snprintf(ck->state.precision, sizeof ck->state.precision, "%s", prec);
    const cJSON *lay = par_json_obj(c->root, "layout");
    if (lay) {
        par_status st = layout_parse(lay, c->ml, &ck->layout);
        if (st)
            return st;
        ck->has_layout = 1;
        if (ck->layout.world != *world)
            return par_err(PAR_EFORMAT, "%s: layout.world_size %lld but world_size %lld", c->ml,
                           (long long)ck->layout.world, (long long)*world);
    }
    const cJSON *model = par_json_obj(c->root, "model");
    if (model && !(ck->model = cJSON_Duplicate(model, 1)))
        return par_err(PAR_ENOMEM, "%s: out of memory", c->label);
    return PAR_OK;
}

/* The tensor list: entries, the name index (no name twice), the roles (from
 * the names for a checkpoint written before they were recorded), their
 * rules.  Every fault is PAR_EFORMAT. */
static par_status parse_table(par_ckpt *ck, const open_ctx *c)
{
    int legacy = 0;
    par_status st = parse_tensors(cJSON_GetObjectItemCaseSensitive(c->root, "tensors"), c->ml, &ck->t, &ck->nt,
                                  &legacy);
    if (st)
        return st;
    if ((st = index_build(&ck->ix, ck->t, ck->nt, c->ml)))
        return par_err(PAR_EFORMAT, "%s", par_last_error());
    if (legacy)
        roles_from_names(ck->t, ck->nt, &ck->ix);
    if ((st = check_roles(ck->t, ck->nt, c->ml)))
        return par_err(PAR_EFORMAT, "%s", par_last_error());
    return PAR_OK;
}

/* One descriptor per rank; each shard's hash the same in "shards", "files"
 * and SHA256SUMS (a shard file not there: PAR_ENOTFOUND); *npieces = the
 * non-empty slices. */
static par_status parse_shards(par_ckpt *ck, const open_ctx *c, int64_t world, int64_t *npieces)
{
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(c->root, "shards");
    const cJSON *files = par_json_obj(c->root, "files");
    if (!cJSON_IsArray(shards) || !files || cJSON_GetArraySize(shards) != world || world < 1)
        return par_err(PAR_EFORMAT, "%s: needs \"shards\" (one per rank of world_size %lld) and \"files\"", c->ml,
                       (long long)world);
    ck->nranks = (int)world;
    ck->d = par_calloc((size_t)world, sizeof *ck->d, PAR_TAG_IO);
    ck->files = par_calloc((size_t)world, sizeof *ck->files, PAR_TAG_IO);
    if (!ck->d || !ck->files)
        return par_err(PAR_ENOMEM, "%s: out of memory", c->label);
    *npieces = 0;
    for (int r = 0; r < ck->nranks; r++) {
        par_status st = desc_parse(cJSON_GetArrayItem(shards, r), c->ml, r, &ck->d[r]);
        if (st)
            return st;
        const char *fsha = par_json_str(files, ck->d[r].file);
        const sum_line *s = sums_find(c->sums, c->nsums, ck->d[r].file);
        if (!fsha || strcmp(fsha, ck->d[r].sha) || !s || strcmp(s->sha, ck->d[r].sha)) {
            char *p = par_path_join(c->dir, ck->d[r].file);
            int exists = p && par_path_exists(p);
            par_free(p);
            if (!exists)
                return par_err(PAR_ENOTFOUND, "%s: shard %s of rank %d is missing", c->label, ck->d[r].file, r);
            return par_err(PAR_EMISMATCH, "%s: shard %s: the hashes in %s, \"files\" and %s disagree", c->label,
                           ck->d[r].file, PAR_CKPT_META, PAR_CKPT_SUMS);
        }
        for (int i = 0; i < ck->d[r].n; i++)
            *npieces += ck->d[r].s[i].end > ck->d[r].s[i].begin;
    }
    return PAR_OK;
}

/* Reads every shard file, checks it against its slice list and records its
 * pieces, per tensor sorted by begin. */
static par_status load_shards(par_ckpt *ck, const char *label, int64_t npieces)
{
    ck->poff = par_calloc((size_t)ck->nt + 1, sizeof *ck->poff, PAR_TAG_IO);
    ck->pieces = par_malloc((size_t)(npieces > 0 ? npieces : 1) * sizeof *ck->pieces, PAR_TAG_IO);
    int64_t *cur = par_calloc((size_t)ck->nt + 1, sizeof *cur, PAR_TAG_IO);
    par_status st = PAR_OK;
    if (!ck->poff || !ck->pieces || !cur) {
        par_free(cur);
        return par_err(PAR_ENOMEM, "%s: out of memory", label);
    }
    for (int r = 0; r < ck->nranks; r++)
        for (int i = 0; i < ck->d[r].n; i++)
            if (ck->d[r].s[i].end > ck->d[r].s[i].begin)
                ck->poff[index_find(&ck->ix, ck->d[r].s[i].name) + 1]++;
    for (int t = 0; t < ck->nt; t++)
        ck->poff[t + 1] += ck->poff[t];
    memcpy(cur, ck->poff, (size_t)ck->nt * sizeof *cur);
    for (int r = 0; r < ck->nranks && !st; r++) {
        char *path = par_path_join(ck->dir, ck->d[r].file);
        if (!path)
            st = par_err(PAR_ENOMEM, "%s: out of memory", label);
        else if (!(st = par_st_read(path, &ck->files[r])))
            st = check_shard(ck, r, label, cur);
        par_free(path);
    }
    par_free(cur);
    for (int t = 0; t < ck->nt && !st; t++)
        qsort(ck->pieces + ck->poff[t], (size_t)(ck->poff[t + 1] - ck->poff[t]), sizeof *ck->pieces, cmp_piece);
    return st;
}

par_status par_ckpt_open(const char *dir, par_ckpt **out)
{
    open_ctx c = {.dir = dir};
    snprintf(c.label, sizeof c.label, "checkpoint %s", dir);
    snprintf(c.ml, sizeof c.ml, "%s: %s", c.label, PAR_CKPT_META);
    if (!par_path_is_dir(dir))
        return par_err(par_path_exists(dir) ? PAR_EINVAL : PAR_ENOTFOUND, "%s: %s", c.label,
                       par_path_exists(dir) ? "not a directory" : "no such directory");
    par_ckpt *ck = par_calloc(1, sizeof *ck, PAR_TAG_IO);
    if (!ck || !(ck->dir = par_strdup(dir, PAR_TAG_IO))) {
        par_free(ck);
        return par_err(PAR_ENOMEM, "%s: out of memory", c.label);
    }
    int64_t world = 0, npieces = 0;
    par_status st = open_metadata(&c);
    for (int i = 0; !st && i < c.nsums; i++) /* every file's hash */
        st = check_file_hash(dir, c.sums[i].name, c.sums[i].sha, c.label);
    if (!st)
        st = parse_state(ck, &c, &world);
    if (!st)
        st = parse_table(ck, &c);
    if (!st)
        st = parse_shards(ck, &c, world, &npieces);
    if (!st) /* coverage before reading shard files (cheap, and names the gap) */
        st = check_descs(c.label, &ck->ix, ck->d, ck->nranks);
    if (!st)
        st = load_shards(ck, c.label, npieces);
    open_ctx_free(&c);
    if (st) {
        par_ckpt_close(ck);
        return st;
    }
    *out = ck;
    return PAR_OK;
}

const char *par_ckpt_dir(const par_ckpt *ck)
{
    return ck->dir;
}
const par_ckpt_state *par_ckpt_state_of(const par_ckpt *ck)
{
    return &ck->state;
}
int par_ckpt_ntensors(const par_ckpt *ck)
{
    return ck->nt;
}
const par_ckpt_tensor *par_ckpt_tensor_at(const par_ckpt *ck, int i)
{
    return i >= 0 && i < ck->nt ? &ck->t[i] : NULL;
}
const par_ckpt_tensor *par_ckpt_find(const par_ckpt *ck, const char *name)
{
    int i = index_find(&ck->ix, name);
    return i >= 0 ? &ck->t[i] : NULL;
}
int par_ckpt_nranks(const par_ckpt *ck)
{
    return ck->nranks;
}
const par_layout *par_ckpt_layout(const par_ckpt *ck)
{
    return ck->has_layout ? &ck->layout : NULL;
}
const cJSON *par_ckpt_model(const par_ckpt *ck)
{
    return ck->model;
}
int par_ckpt_rank_nslices(const par_ckpt *ck, int r)
{
    return r >= 0 && r < ck->nranks ? ck->d[r].n : 0;
}
const par_ckpt_slice *par_ckpt_rank_slice(const par_ckpt *ck, int r, int i)
{
    return r >= 0 && r < ck->nranks && i >= 0 && i < ck->d[r].n ? &ck->d[r].s[i] : NULL;
}

par_status par_ckpt_read(const par_ckpt *ck, const par_ckpt_item *items, int nitems)
{
    char label[ERRMSG_MAX];
    snprintf(label, sizeof label, "checkpoint %s: load", ck->dir);
    for (int k = 0; k < nitems; k++) {
        int ti;
        par_status st = check_slice(&ck->ix, &items[k].s, label, &ti);
        if (st)
            return st;
        if (items[k].s.end > items[k].s.begin && !items[k].data)
            return par_err(PAR_EINVAL, "%s: tensor '%s' slice [%lld, %lld) has no destination", label,
                           items[k].s.name, (long long)items[k].s.begin, (long long)items[k].s.end);
    }
    for (int k = 0; k < nitems; k++) {
        int ti = index_find(&ck->ix, items[k].s.name);
        size_t es = par_dtype_size(ck->t[ti].dtype);
        int64_t b = items[k].s.begin, e = items[k].s.end;
        const piece *p = ck->pieces + ck->poff[ti];
        int64_t np = ck->poff[ti + 1] - ck->poff[ti];
        /* first piece with end > b (pieces tile [0, numel) in order) */
        int64_t lo = 0, hi = np;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (p[mid].e <= b)
                lo = mid + 1;
            else
                hi = mid;
        }
        char *dst = items[k].data;
        for (int64_t i = lo; i < np && b < e; i++) {
            int64_t s = b > p[i].b ? b : p[i].b, t = e < p[i].e ? e : p[i].e;
            if (t <= s)
                continue;
            memcpy(dst + (size_t)(s - items[k].s.begin) * es, (const char *)p[i].data + (size_t)(s - p[i].b) * es,
                   (size_t)(t - s) * es);
            b = t;
        }
        if (b < e) /* cannot happen after the coverage check */
            return par_err(PAR_EINTERNAL, "%s: tensor '%s': elements from %lld not covered", label,
                           items[k].s.name, (long long)b);
    }
    return PAR_OK;
}

par_status par_ckpt_read_tensor(const par_ckpt *ck, const char *name, par_tag tag, par_tensor *out)
{
    const par_ckpt_tensor *t = par_ckpt_find(ck, name);
    if (!t)
        return par_err(PAR_ENOTFOUND, "checkpoint %s: no tensor '%s'", ck->dir, name);
    par_tensor x;
    par_status st = par_tensor_alloc(&x, t->dtype, t->ndim, t->shape, tag);
    if (st)
        return st;
    par_ckpt_item it = {.data = x.data};
    it.s = (par_ckpt_slice){.begin = 0, .end = tensor_numel(t)};
    snprintf(it.s.name, sizeof it.s.name, "%s", name);
    if ((st = par_ckpt_read(ck, &it, 1))) {
        par_tensor_free(&x);
        return st;
    }
    *out = x;
    return PAR_OK;
}

/* ---- tools ----------------------------------------------------------------------- */

par_status par_ckpt_export(const char *src_dir, const char *file)
{
    par_ckpt *ck;
    par_status st = par_ckpt_open(src_dir, &ck);
    if (st)
        return st;
    par_tensor *x = par_calloc((size_t)(ck->nt > 0 ? ck->nt : 1), sizeof *x, PAR_TAG_IO);
    par_st_writer *w = NULL;
    if (!x) {
        st = par_err(PAR_ENOMEM, "export %s: out of memory", src_dir);
        goto fail_close;
    }
    if ((st = par_st_writer_new(&w)))
        goto fail_free_x;
    char buf[32];
    if ((st = par_st_writer_meta(w, "format", "parity-ckpt-export")))
        goto fail_free_w;
    snprintf(buf, sizeof buf, "%lld", (long long)ck->state.step);
    if ((st = par_st_writer_meta(w, "step", buf)))
        goto fail_free_w;
    snprintf(buf, sizeof buf, "%lld", (long long)ck->state.cursor);
    if ((st = par_st_writer_meta(w, "data_cursor", buf)))
        goto fail_free_w;
    if ((st = par_st_writer_meta(w, "seed", seed_str(ck->state.seed, buf, sizeof buf))) ||
        (st = par_st_writer_meta(w, "precision", ck->state.precision)))
        goto fail_free_w;
    for (int i = 0; i < ck->nt; i++) {
        if ((st = par_ckpt_read_tensor(ck, ck->t[i].name, PAR_TAG_IO, &x[i])))
            goto fail_free_w;
        if ((st = par_st_writer_add(w, ck->t[i].name, &x[i])))
            goto fail_free_w;
    }
    st = par_st_writer_write(w, file);
fail_free_w:
    par_st_writer_free(w);
fail_free_x:
    for (int i = 0; x && i < ck->nt; i++)
        par_tensor_free(&x[i]);
    par_free(x);
fail_close:
    par_ckpt_close(ck);
    return st;
}

par_status par_ckpt_reshard_open(const par_ckpt *ck, const char *dst_dir, const par_layout *layout,
                                 par_ckpt_owner_fn fn, void *ud)
{
    int64_t world = par_ckpt_layout_world(layout);
    char ctx[ERRMSG_MAX];
    snprintf(ctx, sizeof ctx, "reshard %s -> %s", ck->dir, dst_dir);
    if (!fn)
        return par_err(PAR_EINVAL, "%s: needs an ownership rule (parallel/ckpt/ckpt_owner.h: par_ckpt_owner_driver for "
                       "the training driver's layouts)", ctx);
    if (world < 1 || world > (1 << 20))
        return par_err(PAR_EINVAL, "%s: world size %lld outside 1..%d", ctx, (long long)world, 1 << 20);
    par_status st = PAR_OK;
    char *tmp = NULL;
    shard_desc *d = par_calloc((size_t)world, sizeof *d, PAR_TAG_IO);
    if (!d)
        return par_err(PAR_ENOMEM, "%s: out of memory", ctx);
    if ((st = par_adir_begin(dst_dir, &tmp)))
        goto fail_free_d;
    for (int r = 0; r < world && !st; r++) {
        par_ckpt_slice *sl = NULL;
        int n = 0;
        if ((st = fn(layout, (int)world, r, ck->t, ck->nt, &sl, &n, ud)))
            break;
        par_ckpt_item *it = par_calloc((size_t)(n > 0 ? n : 1), sizeof *it, PAR_TAG_IO);
        if (!it)
            st = par_err(PAR_ENOMEM, "%s: out of memory", ctx);
        for (int i = 0; !st && i < n; i++) {
            int ti;
            char w[ERRMSG_MAX + 32];
            snprintf(w, sizeof w, "%s: owner of rank %d", ctx, r);
            if ((st = check_slice(&ck->ix, &sl[i], w, &ti)))
                break;
            it[i].s = sl[i];
            size_t bytes = (size_t)(sl[i].end - sl[i].begin) * par_dtype_size(ck->t[ti].dtype);
            if (bytes && !(it[i].data = par_malloc(bytes, PAR_TAG_IO)))
                st = par_err(PAR_ENOMEM, "%s: out of memory", ctx);
        }
        if (!st)
            st = par_ckpt_read(ck, it, n);
        if (!st)
            st = write_shard(tmp, r, &ck->ix, it, n, &d[r]);
        for (int i = 0; it && i < n; i++)
            par_free(it[i].data);
        par_free(it);
        par_free(sl);
    }
    if (st) {
        par_adir_abort(tmp);
        goto fail_free_d;
    }
    par_ckpt_info info = {.state = ck->state, .tensors = ck->t, .ntensors = ck->nt, .layout = layout,
                          .model = ck->model};
    st = finalize(tmp, dst_dir, &info, &ck->ix, world, d, (int)world);
fail_free_d:
    for (int r = 0; d && r < world; r++)
        desc_free(&d[r]);
    par_free(d);
    return st;
}

par_status par_ckpt_reshard(const char *src_dir, const char *dst_dir, const par_layout *layout,
                            par_ckpt_owner_fn fn, void *ud)
{
    par_ckpt *ck;
    par_status st = par_ckpt_open(src_dir, &ck);
    if (st)
        return st;
    st = par_ckpt_reshard_open(ck, dst_dir, layout, fn, ud);
    par_ckpt_close(ck);
    return st;
}

/* A tensor's role in words, e.g. "exp_avg of 'layers.0.ffn.experts.3.w1.weight'
 * (expert 3, layers.0)"; comparable across checkpoints (no list indices). */
static const char *role_str(const par_ckpt *ck, const par_ckpt_tensor *x, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s", slot_names[x->slot]);
    if (x->slot != PAR_CKPT_PARAM && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " of '%s'", ck->t[x->param].name);
    if (k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, " (expert %d, layer %d, mtp %d)", x->expert, x->layer, x->mtp);
    return buf;
}

static int state_equal(const par_ckpt_state *a, const par_ckpt_state *b)
{
    return a->step == b->step && a->cursor == b->cursor && a->seed == b->seed && !strcmp(a->precision, b->precision);
}

static void note(par_ckpt_diff_result *res, FILE *out, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(par_ckpt_diff_result *res, FILE *out, const char *fmt, ...)
{
    char line[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!res->first[0])
        snprintf(res->first, sizeof res->first, "%s", line);
    if (out)
        fprintf(out, "%s\n", line);
}

/* Tensor ta of A against the tensor of its name in B (tb, or NULL): one
 * noted line when they differ (presence, dtype or shape, role, values). */
static par_status diff_tensor(const par_ckpt *a, const par_ckpt *b, const par_ckpt_tensor *ta, FILE *out,
                              par_ckpt_diff_result *r)
{
    const par_ckpt_tensor *tb = par_ckpt_find(b, ta->name);
    char s1[2 * PAR_CKPT_NAME_MAX], s2[2 * PAR_CKPT_NAME_MAX];
    if (!tb) {
        r->n_tensors_diff++;
        note(r, out, "%s: only in A", ta->name);
        return PAR_OK;
    }
    if (ta->dtype != tb->dtype || ta->ndim != tb->ndim ||
        memcmp(ta->shape, tb->shape, (size_t)ta->ndim * sizeof ta->shape[0])) {
        r->n_tensors_diff++;
        note(r, out, "%s: A %s %s, B %s %s", ta->name, par_dtype_name(ta->dtype),
             par_shape_str(ta->ndim, ta->shape, s1, sizeof s1), par_dtype_name(tb->dtype),
             par_shape_str(tb->ndim, tb->shape, s2, sizeof s2));
        return PAR_OK;
    }
    if (strcmp(role_str(a, ta, s1, sizeof s1), role_str(b, tb, s2, sizeof s2))) {
        r->n_tensors_diff++;
        note(r, out, "%s: A %s, B %s", ta->name, s1, s2);
        return PAR_OK;
    }
    par_tensor xa, xb;
    par_status st = par_ckpt_read_tensor(a, ta->name, PAR_TAG_IO, &xa);
    if (st)
        return st;
    if ((st = par_ckpt_read_tensor(b, ta->name, PAR_TAG_IO, &xb))) {
        par_tensor_free(&xa);
        return st;
    }
    int64_t n = par_tensor_numel(&xa), ndiff = 0, first = -1;
    size_t es = par_dtype_size(xa.dtype);
    double maxabs = 0;
    for (int64_t k = 0; k < n; k++)
        if (memcmp((char *)xa.data + (size_t)k * es, (char *)xb.data + (size_t)k * es, es)) {
            if (first < 0)
                first = k;
            ndiff++;
            double d = fabs(par_tensor_get_f64(&xa, k) - par_tensor_get_f64(&xb, k));
            if (d > maxabs || isnan(d))
                maxabs = d;
        }
    if (ndiff) {
        r->n_tensors_diff++;
        note(r, out, "%s: %lld of %lld elements differ (first at %lld: A %.17g, B %.17g; max |A-B| %.3g)", ta->name,
             (long long)ndiff, (long long)n, (long long)first, par_tensor_get_f64(&xa, first),
             par_tensor_get_f64(&xb, first), maxabs);
    }
    par_tensor_free(&xa);
    par_tensor_free(&xb);
    return PAR_OK;
}

par_status par_ckpt_diff(const char *a_dir, const char *b_dir, FILE *out, par_ckpt_diff_result *res)
{
    par_ckpt *a, *b;
    par_status st = par_ckpt_open(a_dir, &a);
    if (st)
        return st;
    if ((st = par_ckpt_open(b_dir, &b))) {
        par_ckpt_close(a);
        return st;
    }
    par_ckpt_diff_result r = {0};
    r.state_equal = state_equal(&a->state, &b->state);
    if (!r.state_equal)
        note(&r, out, "state: A step %lld cursor %lld seed %" PRIu64 " %s; B step %lld cursor %lld seed %" PRIu64
                      " %s",
             (long long)a->state.step, (long long)a->state.cursor, a->state.seed, a->state.precision,
             (long long)b->state.step, (long long)b->state.cursor, b->state.seed, b->state.precision);
    for (int i = 0; i < b->nt; i++)
        if (index_find(&a->ix, b->t[i].name) < 0) {
            r.n_tensors_diff++;
            note(&r, out, "%s: only in B", b->t[i].name);
        }
    for (int i = 0; i < a->nt && !st; i++)
        st = diff_tensor(a, b, &a->t[i], out, &r);
    r.tensors_equal = r.n_tensors_diff == 0;
    par_ckpt_close(a);
    par_ckpt_close(b);
    if (!st && res)
        *res = r;
    return st;
}
