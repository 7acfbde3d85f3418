/* parallel/ckpt/ckpt_load.c - loading: a checkpoint opened and validated (version, hashes,
 * coverage), slices read (see ckpt.h, ckpt-impl.h, docs/checkpoints.md). */
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

void par_ckpt_close(par_ckpt *ck)
{
    if (!ck)
        return;
    if (ck->files)
        for (int r = 0; r < ck->nranks; r++)
            par_st_close(ck->files[r]);
    if (ck->d)
        for (int r = 0; r < ck->nranks; r++)
            par__ckpt_desc_free(&ck->d[r]);
    par_free(ck->files);
    par_free(ck->d);
    par__ckpt_index_free(&ck->ix);
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
    while (slot && k < PAR_CKPT_SLOT_COUNT && strcmp(slot, par_ckpt_slot_name((par_ckpt_slot)k)))
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
    if (!st && (st = par__ckpt_check_tensors(t, k, label)))
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
        par_status st = par__ckpt_check_slice(&ck->ix, s, label, &ti);
        if (st)
            return par_err(PAR_EFORMAT, "%s: shard %s: %s", label, d->file, par_last_error());
        int64_t len = s->end - s->begin;
        if (!len)
            continue;
        nonempty++;
        char key[KEY_MAX];
        par__ckpt_slice_key(key, sizeof key, s->name, s->begin);
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
        par_status st = par__ckpt_layout_parse(lay, c->ml, &ck->layout);
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
    if ((st = par__ckpt_index_build(&ck->ix, ck->t, ck->nt, c->ml)))
        return par_err(PAR_EFORMAT, "%s", par_last_error());
    if (legacy)
        par__ckpt_roles_from_names(ck->t, ck->nt, &ck->ix);
    if ((st = par__ckpt_check_roles(ck->t, ck->nt, c->ml)))
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
        par_status st = par__ckpt_desc_parse(cJSON_GetArrayItem(shards, r), c->ml, r, &ck->d[r]);
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
                ck->poff[par__ckpt_index_find(&ck->ix, ck->d[r].s[i].name) + 1]++;
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
        st = par__ckpt_check_descs(c.label, &ck->ix, ck->d, ck->nranks);
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
    int i = par__ckpt_index_find(&ck->ix, name);
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
        par_status st = par__ckpt_check_slice(&ck->ix, &items[k].s, label, &ti);
        if (st)
            return st;
        if (items[k].s.end > items[k].s.begin && !items[k].data)
            return par_err(PAR_EINVAL, "%s: tensor '%s' slice [%lld, %lld) has no destination", label,
                           items[k].s.name, (long long)items[k].s.begin, (long long)items[k].s.end);
    }
    for (int k = 0; k < nitems; k++) {
        int ti = par__ckpt_index_find(&ck->ix, items[k].s.name);
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
    it.s = (par_ckpt_slice){.begin = 0, .end = par__ckpt_tensor_numel(t)};
    snprintf(it.s.name, sizeof it.s.name, "%s", name);
    if ((st = par_ckpt_read(ck, &it, 1))) {
        par_tensor_free(&x);
        return st;
    }
    *out = x;
    return PAR_OK;
}
