/* parallel/ckpt/ckpt_save.c - the collective save: shards, metadata and SHA256SUMS written
 * atomically, every rank agreeing (see ckpt.h, ckpt-impl.h, docs/checkpoints.md). */
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

/* Writes rank's shard into tmp; fills d (non-empty slices in item order). */
par_status par__ckpt_write_shard(const char *tmp, int rank, const name_index *ix, const par_ckpt_item *items,
                              int nitems, shard_desc *d)
{
    memset(d, 0, sizeof *d);
    d->rank = rank;
    par__ckpt_shard_file_name(d->file, sizeof d->file, rank);
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
        if ((st = par__ckpt_check_slice(ix, &items[k].s, what, &ti)))
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
        par__ckpt_slice_key(key, sizeof key, items[k].s.name, items[k].s.begin);
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
    par__ckpt_desc_free(d);
    return st;
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
    cJSON *root = par__ckpt_metadata_json(info, world, d, nshards);
    char *path = root ? par_path_join(tmp, PAR_CKPT_META) : NULL;
    par_status st = PAR_OK;
    if (!path) {
        st = par_err(PAR_ENOMEM, "checkpoint metadata: out of memory");
        goto fail_free_root;
    }
    if ((st = par_json_write_file(path, root)))
        goto fail_free_path;
    par__ckpt_hook("metadata", 0);
    char msha[PAR_SHA256_HEX];
    if ((st = par_sha256_file(path, msha)) || (st = write_sums(tmp, msha, d, nshards)))
        goto fail_free_path;
    par__ckpt_hook("sums", 0);
fail_free_path:
    par_free(path);
fail_free_root:
    cJSON_Delete(root);
    return st;
}

/* Rank-0 part of a save: coverage, metadata, sums, commit.  Frees tmp. */
par_status par__ckpt_finalize(char *tmp, const char *dir, const par_ckpt_info *info, const name_index *ix,
                           int64_t world, const shard_desc *d, int nshards)
{
    char what[ERRMSG_MAX];
    snprintf(what, sizeof what, "checkpoint save %s", dir);
    par_status st = par__ckpt_check_descs(what, ix, d, nshards);
    if (!st)
        st = write_metadata(tmp, info, world, d, nshards);
    if (st) {
        par_adir_abort(tmp);
        return st;
    }
    par__ckpt_hook("commit", 0);
    return par_adir_commit(tmp, dir);
}

/* Digest of what must agree over ranks: tensor table and training state. */
static void info_digest(const par_ckpt_info *info, uint8_t out[PAR_SHA256_BYTES])
{
    cJSON *o = cJSON_CreateObject();
    char buf[32];
    char *txt = NULL;
    if (o) {
        cJSON_AddItemToObject(o, "t", par__ckpt_tensors_json(info->tensors, info->ntensors));
        cJSON_AddNumberToObject(o, "step", (double)info->state.step);
        cJSON_AddNumberToObject(o, "cursor", (double)info->state.cursor);
        cJSON_AddStringToObject(o, "seed", par__ckpt_seed_str(info->state.seed, buf, sizeof buf));
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
        par__ckpt_desc_free(&c->descs[r]);
    par_free(c->descs);
    par_free(c->all_txt);
    par_free(c->counts);
    par_free(c->rep);
    cJSON_free(c->desc_txt);
    par__ckpt_desc_free(&c->mine);
    par__ckpt_index_free(&c->ix);
}

/* Step 1: local checks (*st: this rank's verdict), rank 0 makes the
 * temporary directory and every rank learns its name.  A failure of rank 0
 * is every rank's (the return value); another rank's stays in *st until
 * step 3. */
static par_status save_begin(save_ctx *c, const par_ckpt_info *info, par_status *st)
{
    *st = par__ckpt_check_tensors(info->tensors, info->ntensors, c->ctx);
    if (!*st)
        *st = par__ckpt_check_roles(info->tensors, info->ntensors, c->ctx);
    if (!*st)
        *st = par__ckpt_index_build(&c->ix, info->tensors, info->ntensors, c->ctx);
    if (!*st && info->layout && par_ckpt_layout_world(info->layout) != c->size)
        *st = par_err(PAR_EMISMATCH, "%s: layout world size %lld but the world has %d ranks", c->ctx,
                      (long long)par_ckpt_layout_world(info->layout), c->size);
    if (c->rank == 0 && !*st && !(*st = par_adir_begin(c->dir, &c->tmp)))
        par__ckpt_hook("tmp", 0);
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
    if (*st || (*st = par__ckpt_write_shard(c->tmpname, c->rank, &c->ix, items, nitems, &c->mine)))
        return;
    par__ckpt_hook("shard", c->rank);
    cJSON *j = par__ckpt_desc_json(&c->mine);
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
    par__ckpt_hook("gathered", 0);
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
            st = par__ckpt_desc_parse(j, c->ctx, r, &c->descs[r]);
        cJSON_Delete(j);
        if (st)
            return st;
    }
    par_status st = par__ckpt_finalize(c->tmp, c->dir, info, &c->ix, c->size, c->descs, c->size);
    c->tmp = NULL; /* committed or removed */
    if (!st)
        par__ckpt_hook("done", 0);
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
