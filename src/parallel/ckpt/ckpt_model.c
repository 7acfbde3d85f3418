/* parallel/ckpt/ckpt_model.c - a rank's model and optimizer state to and from a
 * checkpoint (see parallel/ckpt/ckpt_model.h, docs/checkpoints.md "With the
 * driver"). */
#include "parallel/ckpt/ckpt_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/tensor.h"
#include "parallel/ckpt/ckpt_owner.h"
#include "parallel/layout/tp_split.h"

#if PAR_REAL_BITS == 64
#define CK_BITS 64
#define CK_PREC "f64"
#else
#define CK_BITS 32
#define CK_PREC "f32"
#endif

typedef PAR_FN(par_zero_plan) plan_t;

/* The model's tensor list (par_ckpt_tensors_of_params) puts parameter i of
 * the table at list index i, so a list entry's table index is its own index
 * (a parameter) or its param field (optimizer state). */
static int table_index(const par_ckpt_tensor *x, int i)
{
    return x->slot == PAR_CKPT_PARAM ? i : x->param;
}

/* dp_step.h's state slots: 0 momentum / exp_avg, 1 exp_avg_sq. */
static int dpw_slot(par_ckpt_slot s)
{
    return s == PAR_CKPT_EXP_AVG_SQ;
}

/* Offset `at` of entry idx mapped by `map` between the logical entry and the
 * block this rank holds (parallel/layout/tp_split.h): par_tp_logical_run takes a
 * logical element to its offset in the block (whole: itself; a row shard:
 * less the block's first element; a column shard: its row's slice of the
 * rank's columns; -1 when not in the block), par_tp_shard_run is the
 * inverse; *run: the elements from there contiguous in both. */
typedef int64_t (*tp_run_map)(int64_t rows, int64_t cols, par_tp_cut cut, int rank, int P, int64_t at,
                              int64_t *run);
static int64_t map_run(const PAR_FN(par_model) *M, int idx, int64_t at, tp_run_map map, int64_t *run)
{
    const par_model_cut *c = PAR_FN(par_model_cut_of)(M, idx);
    const par_param *p = &M->tab.p[idx];
    if (!c) {
        *run = p->numel - at;
        return at;
    }
    return map(p->shape[0], p->shape[1], (par_tp_cut)c->cut, c->rank, c->P, at, run);
}

/* Where this rank keeps logical element `begin` of entry i of the model's
 * list: NULL when not held here; *avail = elements from there contiguous
 * in both the held block and the logical tensor. */
static void *held_ptr(const PAR_FN(par_model) *M, PAR_FN(par_dpw) *w, const par_ckpt_tensor *list, int i,
                      int64_t begin, int64_t *avail)
{
    const int idx = table_index(&list[i], i);
    const par_param *p = &M->tab.p[idx];
    int64_t run = 0;
    const int64_t j = begin >= 0 && begin < p->numel ? map_run(M, idx, begin, par_tp_logical_run, &run) : -1;
    if (j < 0)
        return NULL;
    if (list[i].slot != PAR_CKPT_PARAM) {
        void *d = PAR_FN(par_dpw_state_ptr)(w, idx, dpw_slot(list[i].slot), j, avail);
        if (d && *avail > run)
            *avail = run;
        return d;
    }
    *avail = run;
    if (p->dtype == PAR_PDT_I32)
        return M->i32 + p->offset + j;
    par_real *d = PAR_FN(par_model_ptr)(M, M->params, idx);
    return d ? d + j : NULL;
}

/* Index of tensor `name` in list[n], searching from *cur (the owner's
 * slices come in list order); -1 if absent. */
static int find_from(const par_ckpt_tensor *list, int n, const char *name, int *cur)
{
    for (int j = 0; j < n; j++) {
        const int i = (*cur + j) % n;
        if (!strcmp(list[i].name, name)) {
            *cur = i;
            return i;
        }
    }
    return -1;
}

/* The save items of this rank: the owned slices with pointers into its
 * parameters and plans (an owned slice it does not hold is PAR_EINTERNAL:
 * the rule and the run's plans disagree). */
static par_status save_items(const par_pctx *P, const PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                             const par_ckpt_tensor *list, int nt, par_ckpt_item **out, int *nout)
{
    par_ckpt_slice *sl = NULL;
    int ns = 0, cur = 0;
    par_status s = par_ckpt_owner_driver(P->lay, P->N, P->rank, list, nt, &sl, &ns, NULL);
    if (s)
        return s;
    par_ckpt_item *it = par_calloc((size_t)(ns > 0 ? ns : 1), sizeof *it, PAR_TAG_IO);
    if (!it)
        s = par_err(PAR_ENOMEM, "checkpoint save: out of memory for %d slices", ns);
    for (int k = 0; !s && k < ns; k++) {
        const int i = find_from(list, nt, sl[k].name, &cur);
        int64_t avail = 0;
        void *p = i >= 0 ? held_ptr(M, w, list, i, sl[k].begin, &avail) : NULL;
        if (!p || avail < sl[k].end - sl[k].begin)
            s = par_err(PAR_EINTERNAL, "checkpoint save: rank %d owns '%s' [%lld, %lld) but does not hold it "
                        "(the ownership rule and the run's plans disagree)", P->rank, sl[k].name,
                        (long long)sl[k].begin, (long long)sl[k].end);
        it[k].s = sl[k];
        it[k].data = p;
    }
    par_free(sl);
    if (s) {
        par_free(it);
        return s;
    }
    *out = it;
    *nout = ns;
    return PAR_OK;
}

par_status PAR_FN(par_ckpt_model_save)(const par_pctx *P, const PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                       const char *dir, const par_ckpt_state *st)
{
    par_ckpt_tensor *list = NULL;
    par_ckpt_item *it = NULL;
    cJSON *model = NULL;
    int nt = 0, ns = 0;
    par_status s = par_ckpt_tensors_of_params(&M->tab, CK_BITS, &list, &nt);
    if (!s)
        s = save_items(P, M, w, list, nt, &it, &ns);
    /* every rank takes part in the collective save, even after a local
     * failure (then with no items: the save fails on the coverage check) */
    if (!s && !(model = par_config_to_json(&M->cfg)))
        s = par_err(PAR_ENOMEM, "checkpoint save: out of memory for the model config");
    par_ckpt_info info = {.state = *st, .tensors = list, .ntensors = nt, .layout = P->lay, .model = model};
    par_status s2 = par_ckpt_save(P->world, dir, &info, s ? NULL : it, s ? 0 : ns);
    if (!s)
        s = s2;
    cJSON_Delete(model);
    par_free(it);
    par_free(list);
    return s;
}

/* "F64 [128, 32]" */
static const char *dtype_shape(const par_ckpt_tensor *x, char *buf, size_t n)
{
    char sh[96];
    snprintf(buf, n, "%s %s", par_dtype_name(x->dtype), par_shape_str(x->ndim, x->shape, sh, sizeof sh));
    return buf;
}

/* Model tensor a (list[]) against the checkpoint's tensor of its name. */
static par_status check_one(const par_ckpt *ck, const par_ckpt_tensor *list, const par_ckpt_tensor *a)
{
    const par_ckpt_tensor *b = par_ckpt_find(ck, a->name);
    char sa[128], sb[128];
    if (!b)
        return par_err(PAR_EINVAL, "--load %s: tensor '%s' of the model is not in the checkpoint (another model "
                       "config?)", par_ckpt_dir(ck), a->name);
    if (a->dtype != b->dtype || a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]))
        return par_err(PAR_EINVAL, "--load %s: tensor '%s' is %s in this model but %s in the checkpoint (another "
                       "model config than the saved run: see its metadata.json, \"model\")", par_ckpt_dir(ck),
                       a->name, dtype_shape(a, sa, sizeof sa), dtype_shape(b, sb, sizeof sb));
    const par_ckpt_tensor *bp = b->slot == PAR_CKPT_PARAM ? NULL : par_ckpt_tensor_at(ck, b->param);
    const char *ap = a->slot == PAR_CKPT_PARAM ? NULL : list[a->param].name;
    if (a->slot != b->slot || a->expert != b->expert || a->layer != b->layer || a->mtp != b->mtp ||
        (ap && (!bp || strcmp(ap, bp->name))))
        return par_err(PAR_EINVAL, "--load %s: tensor '%s' is a %s (expert %d, layer %d, mtp %d) in this model but "
                       "a %s (expert %d, layer %d, mtp %d) in the checkpoint", par_ckpt_dir(ck), a->name,
                       par_ckpt_slot_name(a->slot), a->expert, a->layer, a->mtp, par_ckpt_slot_name(b->slot),
                       b->expert, b->layer, b->mtp);
    return PAR_OK;
}

par_status PAR_FN(par_ckpt_model_check)(const par_ckpt *ck, const par_config *cfg)
{
    const par_ckpt_state *st = par_ckpt_state_of(ck);
    if (strcmp(st->precision, CK_PREC))
        return par_err(PAR_EINVAL, "--load %s: the checkpoint's precision is %s, this run is %s", par_ckpt_dir(ck),
                       st->precision[0] ? st->precision : "unknown", CK_PREC);
    par_param_table t;
    par_status s = par_param_table_build(&t, cfg);
    if (s)
        return s;
    par_ckpt_tensor *list = NULL;
    int nt = 0;
    if ((s = par_ckpt_tensors_of_params(&t, CK_BITS, &list, &nt)))
        goto fail_table;
    for (int i = 0; i < nt && !s; i++)
        s = check_one(ck, list, &list[i]);
    if (!s && par_ckpt_ntensors(ck) != nt)
        s = par_err(PAR_EINVAL, "--load %s: the checkpoint holds %d tensors, the model %d", par_ckpt_dir(ck),
                    par_ckpt_ntensors(ck), nt);
    par_free(list);
fail_table:
    par_param_table_free(&t);
    return s;
}

/* Appends item (name, [a, b), data) to *it. */
static par_status add_item(par_ckpt_item **it, int *n, int *cap, const char *name, int64_t a, int64_t b,
                           void *data)
{
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        par_ckpt_item *x = par_realloc(*it, (size_t)nc * sizeof *x, PAR_TAG_IO);
        if (!x)
            return par_err(PAR_ENOMEM, "checkpoint load: out of memory for %d items", nc);
        *it = x;
        *cap = nc;
    }
    par_ckpt_item *x = &(*it)[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->s.name, sizeof x->s.name, "%s", name);
    x->s.begin = a;
    x->s.end = b;
    x->data = data;
    return PAR_OK;
}

/* The elements [*a, *b) of table entry idx's optimizer state this rank
 * holds: the piece of its plan on this rank under ZeRO-1 (a shard piece, an
 * owned matrix), everything replicated; 0 when none (not in its plans). */
static int held_state(PAR_FN(par_dpw) *w, int idx, int64_t *a, int64_t *b)
{
    for (int k = 0; k < 2; k++) {
        const plan_t *pl = &w->plan[k];
        if (par_zero_geom_owner(&pl->geom, idx) == PAR_ZERO_ABSENT)
            continue;
        if (pl->mode == PAR_DP_ZERO1)
            return par_zero_geom_piece(&pl->geom, idx, pl->rank, a, b);
        *a = 0;
        *b = pl->e[par_zero_geom_entry(&pl->geom, idx)].numel;
        return *b > 0;
    }
    return 0;
}

/* 1 when entry i of the list lives in the process's shared copy and
 * another rank writes it (parallel/dp/replicas.h): the dense weights, the
 * dense plan's replicated state. */
static int others_write(const PAR_FN(par_model) *M, const PAR_FN(par_dpw) *w, const par_ckpt_tensor *list, int i)
{
    if (!w->rt || w->rt->writer)
        return 0;
    const int idx = table_index(&list[i], i);
    if (list[i].slot != PAR_CKPT_PARAM)
        return w->plan[PAR_DPW_DENSE].state_ext && par_zero_geom_entry(&w->plan[PAR_DPW_DENSE].geom, idx) >= 0;
    return M->tab.p[idx].dtype == PAR_PDT_REAL && PAR_FN(par_model_loc)(M, idx) >= 0 && PAR_FN(par_model_loc)(M, idx) < M->n_shared;
}

/* The load items of this rank: every parameter it holds (whole, or its
 * shard's logical pieces), and the optimizer state its plans hold (what
 * lives in a shared copy: by its writer alone). */
static par_status load_items(PAR_FN(par_model) *M, PAR_FN(par_dpw) *w, const par_ckpt_tensor *list, int nt,
                             par_ckpt_item **it, int *n)
{
    int cap = 0;
    for (int i = 0; i < nt; i++) {
        const int idx = table_index(&list[i], i);
        int64_t a = 0, b = PAR_FN(par_model_cut_of)(M, idx) ? PAR_FN(par_model_numel)(M, idx) : M->tab.p[idx].numel;
        if ((list[i].slot != PAR_CKPT_PARAM && !held_state(w, list[i].param, &a, &b)) || others_write(M, w, list, i))
            continue;
        for (int64_t j = a; j < b;) { /* the held block [a, b) as logical pieces (a column shard: one per row) */
            int64_t run, avail = 0;
            const int64_t g = map_run(M, idx, j, par_tp_shard_run, &run), len = run < b - j ? run : b - j;
            void *d = held_ptr(M, w, list, i, g, &avail);
            if (!d)
                break; /* a parameter of another stage */
            if (avail < len)
                return par_err(PAR_EINTERNAL, "checkpoint load: '%s' [%lld, %lld) is held in pieces", list[i].name,
                               (long long)g, (long long)(g + len));
            par_status s = add_item(it, n, &cap, list[i].name, g, g + len, d);
            if (s)
                return s;
            j += len;
        }
    }
    return PAR_OK;
}

par_status PAR_FN(par_ckpt_model_load)(const par_pctx *P, PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                       const par_ckpt *ck)
{
    par_ckpt_tensor *list = NULL;
    par_ckpt_item *it = NULL;
    int nt = 0, n = 0;
    par_status s = par_ckpt_tensors_of_params(&M->tab, CK_BITS, &list, &nt);
    if (!s)
        s = load_items(M, w, list, nt, &it, &n);
    if (!s)
        s = par_ckpt_read(ck, it, n);
    if (!s && w->rt && w->rt->writer) /* the shared copy's load phase (replicas.h) */
        PAR_FN(par_replica_publish)(w->rt, (par_counts){0, 0});
    else if (!s && w->rt)
        s = PAR_FN(par_replica_wait)(w->rt, P->world, "the shared copy's checkpoint load");
    if (!s)
        M->step = par_ckpt_state_of(ck)->step;
    par_free(it);
    par_free(list);
    return s;
}
