/* parallel/ckptwire.c - the driver's checkpoint ownership, save and load
 * (see parallel/ckptwire.h, docs/checkpoints.md "With the driver"). */
#include "parallel/ckptwire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "parallel/driver.h"
#include "parallel/groups.h"

#if PAR_REAL_BITS == 64
#define CK_BITS 64
#define CK_PREC "f64"
#else
#define CK_BITS 32
#define CK_PREC "f32"
#endif

typedef PAR_FN(par_zero_plan) plan_t;

/* ---- the ownership rule (one definition: the f64 unit) -------------------- */

#if PAR_REAL_BITS == 64

/* Entry of a checkpoint tensor list: a parameter (slot -1) or the state
 * slot of parameter `param` (0 momentum / exp_avg, 1 exp_avg_sq). */
typedef struct {
    int param; /* index into the synthetic table */
    int slot;
} ck_role;

static int expert_of(const char *name)
{
    const char *e = strstr(name, ".experts.");
    return e ? atoi(e + 9) : -1;
}

/* The layout's sizes for a world of nranks, as a grid usable by the rank
 * functions of groups.h (only the sizes are read). */
static par_status owner_layout(const par_layout *in, int nranks, par_layout *l)
{
    *l = *in;
    if (l->tp < 1)
        l->tp = 1;
    if (l->pp < 1)
        l->pp = 1;
    if (l->cp < 1)
        l->cp = 1;
    if (l->ep < 1)
        l->ep = 1;
    if (l->etp < 1)
        l->etp = 1;
    l->world = nranks;
    if (l->tp > 1 || l->etp > 1)
        return par_err(PAR_EUNSUPPORTED, "checkpoint ownership: TP %lld / ETP %lld > 1 is not supported",
                       (long long)l->tp, (long long)l->etp);
    int64_t a = l->pp * l->tp * l->cp, e = l->pp * l->etp * l->ep;
    if (nranks % a || nranks % e)
        return par_err(PAR_EINVAL, "checkpoint ownership: world %d does not fold: N/PP = TP*CP*Da = ETP*EP*De needs "
                       "N divisible by PP*TP*CP = %lld and PP*ETP*EP = %lld", nranks, (long long)a, (long long)e);
    l->da = nranks / a;
    l->de = nranks / e;
    l->resolved = 1;
    return PAR_OK;
}

/* Block index of a parameter name: layers.N.* -> N, mtp.N.* -> n_layers + N,
 * anything else -1 (embed, head, the main head's norm / hc_head_*). */
static int block_of(const char *name, int n_layers)
{
    if (!strncmp(name, "layers.", 7))
        return atoi(name + 7);
    if (!strncmp(name, "mtp.", 4))
        return n_layers + atoi(name + 4);
    return -1;
}

/* The pipeline part a table entry belongs to, as an index into the holder
 * arrays of pipe_holders: a block b -> b, embed -> nb, head -> nb + 1,
 * the rest (norm.weight, hc_head_*) -> nb + 2. */
static int part_of(const par_param *p, int nb)
{
    if (p->layer >= 0)
        return p->layer;
    if (!strcmp(p->name, "embed.weight"))
        return nb;
    if (!strcmp(p->name, "head.weight"))
        return nb + 1;
    return nb + 2;
}

/* Which pipeline ranks hold which parts, exactly as parallel/pp.c builds a
 * stage's model (seg_hold over the schedule's (direction, stage) -> rank
 * map): low[part] = the lowest pipeline rank holding the part (the one that
 * writes it; -1: none), mine[part] = 1 when pipeline rank `me` holds it.
 * Parts as part_of: nb blocks, embed, head, final.  The segments come from
 * the resolved layout (l->pipe), or, for a layout that was not resolved
 * against a model, from its layout string / Megatron's default split with
 * the block counts of the tensor list. */
static par_status pipe_holders(const par_layout *l, int n_layers, int n_mtp, int me, int *low, uint8_t *mine)
{
    const int nb = n_layers + n_mtp, np = nb + 3, p = (int)l->pp;
    for (int i = 0; i < np; i++) {
        low[i] = p <= 1 ? 0 : -1;
        mine[i] = p <= 1;
    }
    if (p <= 1)
        return PAR_OK;
    par_layout lr = *l;
    par_status s;
    if (!lr.schedule[0])
        snprintf(lr.schedule, sizeof lr.schedule, "%s", lr.vpp > 1 ? "interleaved" : "1f1b");
    if (lr.pipe.n_segments <= 0) {
        int64_t vpp = lr.vpp > 0 ? lr.vpp : !strcmp(lr.schedule, "dualpipev") ? 2 : 1;
        if ((s = lr.pp_layout[0] ? par_pplayout_parse(lr.pp_layout, &lr.pipe)
                                 : par_pplayout_default(&lr.pipe, lr.pp, vpp, n_layers, n_mtp)))
            return s;
        if (lr.pp_layout[0] && (s = par_pplayout_check(&lr.pipe, lr.pp, lr.pipe.n_segments / lr.pp, n_layers, n_mtp)))
            return s;
    }
    const par_pplayout *pl = &lr.pipe;
    const int dual = !strcmp(lr.schedule, "dualpipe");
    for (int sg = 0; sg < pl->n_segments; sg++) {
        int ranks[2] = {par_layout_segment_rank(&lr, sg), dual ? p - 1 - sg : -1};
        int t = par_pplayout_offset(pl, sg, PAR_BLK_LAYER), mt = par_pplayout_offset(pl, sg, PAR_BLK_MTP);
        for (int i = pl->seg_off[sg]; i < pl->seg_off[sg + 1]; i++) {
            int parts[3] = {-1, -1, -1};
            switch (pl->items[i]) {
            case PAR_BLK_EMBED:
                parts[0] = nb;
                break;
            case PAR_BLK_LAYER:
                parts[0] = t++;
                break;
            case PAR_BLK_MTP: /* the MTP input embeds, the MTP head */
                parts[0] = n_layers + mt++;
                parts[1] = nb;
                parts[2] = nb + 1;
                break;
            case PAR_BLK_LOSS:
                parts[0] = nb + 1;
                parts[1] = nb + 2;
                break;
            }
            for (int k = 0; k < 3; k++)
                for (int j = 0; j < 2 && parts[k] >= 0; j++) {
                    int r = ranks[j];
                    if (r < 0 || parts[k] >= np)
                        continue;
                    if (low[parts[k]] < 0 || r < low[parts[k]])
                        low[parts[k]] = r;
                    if (r == me)
                        mine[parts[k]] = 1;
                }
        }
    }
    return PAR_OK;
}

/* Finds parameter `name` (length len) among t->p, starting at *cur (the
 * state tensors come in table order), wrapping once. */
static int find_param(const par_param_table *t, const char *name, size_t len, int *cur)
{
    for (int k = 0; k < t->n; k++) {
        int i = (*cur + k) % t->n;
        if (strlen(t->p[i].name) == len && !strncmp(t->p[i].name, name, len)) {
            *cur = i + 1;
            return i;
        }
    }
    return -1;
}

par_status par_ckpt_owner_driver(const par_layout *layout, int nranks, int rank, const par_ckpt_tensor *tensors,
                                 int ntensors, par_ckpt_slice **out, int *nout, void *ud)
{
    (void)ud;
    par_layout l;
    par_status s;
    if (!layout || nranks < 1 || rank < 0 || rank >= nranks || (ntensors > 0 && !tensors))
        return par_err(PAR_EINVAL, "checkpoint ownership: needs a layout, a rank in [0, %d) and tensors", nranks);
    if ((s = owner_layout(layout, nranks, &l)))
        return s;
    par_rank_coords rc;
    if ((s = par_rank_coords_of(&l, rank, &rc)))
        return s;

    par_param_table t;
    memset(&t, 0, sizeof t);
    ck_role *role = par_calloc((size_t)(ntensors > 0 ? ntensors : 1), sizeof *role, PAR_TAG_IO);
    t.p = par_calloc((size_t)(ntensors > 0 ? ntensors : 1), sizeof *t.p, PAR_TAG_IO);
    int *lists = par_malloc((size_t)(ntensors > 0 ? ntensors : 1) * 2 * sizeof *lists, PAR_TAG_IO);
    par_ckpt_slice *sl = par_calloc((size_t)(ntensors > 0 ? ntensors : 1), sizeof *sl, PAR_TAG_IO);
    plan_t pl[2];
    memset(pl, 0, sizeof pl);
    int *low = NULL;
    uint8_t *held = NULL;
    if (!role || !t.p || !lists || !sl) {
        s = par_err(PAR_ENOMEM, "checkpoint ownership: out of memory for %d tensors", ntensors);
        goto done;
    }
    /* the synthetic table: parameters in list order (= table order) */
    int64_t E = 0;
    for (int i = 0; i < ntensors; i++) {
        const par_ckpt_tensor *x = &tensors[i];
        if (!strncmp(x->name, "opt.", 4))
            continue;
        par_param *p = &t.p[t.n];
        if (strlen(x->name) >= sizeof p->name) {
            s = par_err(PAR_EINVAL, "checkpoint ownership: tensor name '%s' is too long for a parameter", x->name);
            goto done;
        }
        snprintf(p->name, sizeof p->name, "%s", x->name);
        p->dtype = x->dtype == PAR_I32 ? PAR_PDT_I32 : PAR_PDT_REAL;
        p->ndim = x->ndim;
        p->shape[0] = x->ndim > 0 ? x->shape[0] : 1;
        p->shape[1] = x->ndim > 1 ? x->shape[1] : 1;
        p->numel = par_shape_numel(x->ndim, x->shape, 0);
        p->expert = expert_of(x->name);
        p->layer = -1; /* set below, once the number of main layers is known */
        if (p->dtype == PAR_PDT_REAL) {
            p->offset = t.n_float;
            t.n_float += p->numel;
        }
        if (p->expert + 1 > E)
            E = p->expert + 1;
        role[i].param = t.n++;
        role[i].slot = -1;
    }
    /* blocks: layers.N and mtp.N, from the names */
    int n_layers = 0, n_mtp = 0;
    for (int i = 0; i < t.n; i++) {
        if (!strncmp(t.p[i].name, "layers.", 7) && atoi(t.p[i].name + 7) + 1 > n_layers)
            n_layers = atoi(t.p[i].name + 7) + 1;
        if (!strncmp(t.p[i].name, "mtp.", 4) && atoi(t.p[i].name + 4) + 1 > n_mtp)
            n_mtp = atoi(t.p[i].name + 4) + 1;
    }
    for (int i = 0; i < t.n; i++)
        t.p[i].layer = block_of(t.p[i].name, n_layers);
    /* the pipeline stages: which parts this rank's stages hold, and which
     * pipeline rank writes each part (the lowest holder) */
    const int nb = n_layers + n_mtp;
    low = par_malloc((size_t)(nb + 3) * sizeof *low, PAR_TAG_IO);
    held = par_malloc((size_t)(nb + 3), PAR_TAG_IO);
    if (!low || !held) {
        s = par_err(PAR_ENOMEM, "checkpoint ownership: out of memory for %d pipeline parts", nb + 3);
        goto done;
    }
    if ((s = pipe_holders(&l, n_layers, n_mtp, rc.pp, low, held)))
        goto done;
    for (int i = 0; i < t.n; i++)
        if (low[part_of(&t.p[i], nb)] < 0) {
            s = par_err(PAR_EINVAL, "checkpoint ownership: no pipeline stage of the layout holds '%s' (the layout "
                        "has %d segments for %d layers + %d MTP blocks)", t.p[i].name, l.pipe.n_segments, n_layers,
                        n_mtp);
            goto done;
        }
    int cur = 0;
    for (int i = 0; i < ntensors; i++) {
        const char *nm = tensors[i].name;
        if (strncmp(nm, "opt.", 4))
            continue;
        const char *dot = strrchr(nm, '.');
        int idx = dot && dot > nm + 4 ? find_param(&t, nm + 4, (size_t)(dot - (nm + 4)), &cur) : -1;
        int slot = !dot ? -1 : !strcmp(dot, ".momentum") ? 0 : !strcmp(dot, ".exp_avg") ? 0
                              : !strcmp(dot, ".exp_avg_sq") ? 1 : -1;
        if (idx < 0 || slot < 0 || t.p[idx].dtype != PAR_PDT_REAL) {
            s = par_err(PAR_EINVAL, "checkpoint ownership: '%s' is not the optimizer state of a float parameter "
                        "in the list (opt.<name>.momentum|exp_avg|exp_avg_sq)", nm);
            goto done;
        }
        t.p[idx].opt = !strcmp(dot, ".momentum") ? PAR_OPT_MUON : PAR_OPT_ADAMW;
        role[i].param = idx;
        role[i].slot = slot;
    }
    int64_t El = E;
    if (E > 0) {
        if (E % l.ep) {
            s = par_err(PAR_EINVAL, "checkpoint ownership: %lld routed experts do not split over EP %lld",
                        (long long)E, (long long)l.ep);
            goto done;
        }
        El = E / l.ep;
    }
    const int64_t e0 = (int64_t)rc.ep * El, e1 = e0 + El;
    /* the plans of this rank's groups, exactly as the run builds them (the
     * entries its stages hold, parallel/dpwire.c) */
    int nl[2] = {0, 0};
    for (int i = 0; i < t.n; i++) {
        const par_param *p = &t.p[i];
        if (p->dtype != PAR_PDT_REAL || !held[part_of(p, nb)])
            continue;
        if (p->expert < 0)
            lists[nl[0]++] = i;
        else if (p->expert >= e0 && p->expert < e1)
            lists[t.n + nl[1]++] = i;
    }
    par_dp_mode mode = l.distributed_optimizer ? PAR_DP_ZERO1 : PAR_DP_REPLICATED;
    int gsize[2] = {(int)(l.da * l.cp), (int)l.de}, grank[2] = {rc.cp + (int)l.cp * rc.dp, rc.edp};
    for (int k = 0; k < 2; k++)
        if ((s = PAR_FN(par_zero_plan_build)(&pl[k], &t, lists + k * t.n, nl[k], gsize[k], grank[k], mode)))
            goto done;
    const int dense_des = rc.tp == 0 && rc.cp == 0 && rc.dp == 0, exp_des = rc.etp == 0 && rc.edp == 0;
    int n = 0;
    for (int i = 0; i < ntensors; i++) {
        const par_param *p = &t.p[role[i].param];
        /* held here, and this is the lowest pipeline rank holding it */
        int part = part_of(p, nb);
        int mine = held[part] && low[part] == rc.pp && (p->expert < 0 || (p->expert >= e0 && p->expert < e1));
        int des = p->expert < 0 ? dense_des : exp_des;
        if (!mine)
            continue;
        int64_t a = 0, b = p->numel;
        if (role[i].slot >= 0 && mode == PAR_DP_ZERO1) {
            const plan_t *z = &pl[p->expert < 0 ? 0 : 1];
            const par_zero_entry *e = &z->e[z->entry_of[role[i].param]];
            if (e->opt == PAR_OPT_MUON) {
                if (e->owner != z->rank)
                    continue;
            } else {
                int64_t lo = (int64_t)z->rank * z->shard, hi = lo + z->shard;
                a = (e->pos > lo ? e->pos : lo) - e->pos;
                b = (e->pos + e->numel < hi ? e->pos + e->numel : hi) - e->pos;
                if (a >= b)
                    continue;
            }
        } else if (!des) {
            continue;
        }
        if (a == b)
            continue;
        snprintf(sl[n].name, sizeof sl[n].name, "%s", tensors[i].name);
        sl[n].begin = a;
        sl[n].end = b;
        n++;
    }
    *out = sl;
    *nout = n;
    sl = NULL;
    s = PAR_OK;
done:
    PAR_FN(par_zero_plan_free)(&pl[0]);
    PAR_FN(par_zero_plan_free)(&pl[1]);
    par_free(held);
    par_free(low);
    par_free(sl);
    par_free(lists);
    par_free(t.p);
    par_free(role);
    return s;
}

void par_run_register_ckpt_owner(void)
{
    par_ckpt_set_owner(par_ckpt_owner_driver, NULL);
}

#endif /* PAR_REAL_BITS == 64 */

/* ---- save / load (both precisions) -------------------------------------- */

/* Where this rank keeps elements [begin, ...) of checkpoint tensor x (a
 * parameter or an opt.* state tensor): NULL when not held here; *avail =
 * contiguous elements from there. */
static void *held_ptr(const PAR_FN(par_model) *M, PAR_FN(par_dpw) *w, const par_ckpt_tensor *x, int64_t begin,
                      int64_t *avail)
{
    const par_param_table *t = &M->tab;
    if (strncmp(x->name, "opt.", 4)) {
        int idx = par_param_find(t, x->name);
        if (idx < 0 || begin < 0 || begin > t->p[idx].numel)
            return NULL;
        *avail = t->p[idx].numel - begin;
        if (t->p[idx].dtype == PAR_PDT_I32)
            return M->i32 + t->p[idx].offset + begin;
        par_real *p = PAR_FN(par_model_ptr)(M, M->params, idx);
        return p ? p + begin : NULL;
    }
    char nm[PAR_CKPT_NAME_MAX];
    snprintf(nm, sizeof nm, "%s", x->name + 4);
    char *dot = strrchr(nm, '.');
    if (!dot)
        return NULL;
    int slot = !strcmp(dot, ".exp_avg_sq") ? 1 : 0;
    *dot = 0;
    int idx = par_param_find(t, nm);
    if (idx < 0)
        return NULL;
    return PAR_FN(par_dpw_state_ptr)(w, idx, slot, begin, avail);
}

par_status PAR_FN(par_ckptw_save)(const par_pctx *P, const PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                  const char *dir, const par_ckpt_state *st)
{
    par_ckpt_tensor *tens = NULL;
    par_ckpt_slice *sl = NULL;
    par_ckpt_item *it = NULL;
    cJSON *model = NULL;
    int nt = 0, ns = 0;
    par_status s = par_ckpt_tensors_of_params(&M->tab, CK_BITS, &tens, &nt);
    if (!s)
        s = par_ckpt_owner_driver(P->lay, P->N, P->rank, tens, nt, &sl, &ns, NULL);
    if (!s && !(it = par_calloc((size_t)(ns > 0 ? ns : 1), sizeof *it, PAR_TAG_IO)))
        s = par_err(PAR_ENOMEM, "checkpoint save: out of memory for %d slices", ns);
    for (int i = 0, cur = 0; !s && i < ns; i++) {
        const par_ckpt_tensor *x = NULL;
        for (int j = 0; j < nt && !x; j++) /* slices come in list order: a cursor */
            if (!strcmp(tens[(cur + j) % nt].name, sl[i].name)) {
                x = &tens[(cur + j) % nt];
                cur = (cur + j) % nt;
            }
        int64_t avail = 0;
        void *p = x ? held_ptr(M, w, x, sl[i].begin, &avail) : NULL;
        if (!p || avail < sl[i].end - sl[i].begin) {
            s = par_err(PAR_EINTERNAL, "checkpoint save: rank %d owns '%s' [%lld, %lld) but does not hold it "
                        "(the ownership rule and the run's plans disagree)", P->rank, sl[i].name,
                        (long long)sl[i].begin, (long long)sl[i].end);
            break;
        }
        it[i].s = sl[i];
        it[i].data = p;
    }
    /* every rank takes part in the collective save, even after a local
     * failure (then with no items: the save fails on the coverage check) */
    if (!s) {
        model = par_config_to_json(&M->cfg);
        if (!model)
            s = par_err(PAR_ENOMEM, "checkpoint save: out of memory for the model config");
    }
    par_ckpt_info info = {.state = *st, .tensors = tens, .ntensors = nt, .layout = P->lay, .model = model};
    par_status s2 = par_ckpt_save(P->world, dir, &info, s ? NULL : it, s ? 0 : ns);
    if (!s)
        s = s2;
    cJSON_Delete(model);
    par_free(it);
    par_free(sl);
    par_free(tens);
    return s;
}

par_status PAR_FN(par_ckptw_check)(const par_ckpt *ck, const par_config *cfg)
{
    const par_ckpt_state *st = par_ckpt_state_of(ck);
    if (strcmp(st->precision, CK_PREC))
        return par_err(PAR_EINVAL, "--load %s: the checkpoint's precision is %s, this run is %s", par_ckpt_dir(ck),
                       st->precision[0] ? st->precision : "unknown", CK_PREC);
    par_param_table t;
    par_status s = par_param_table_build(&t, cfg);
    if (s)
        return s;
    par_ckpt_tensor *tens = NULL;
    int nt = 0;
    if ((s = par_ckpt_tensors_of_params(&t, CK_BITS, &tens, &nt)))
        goto fail_table;
    for (int i = 0; i < nt && !s; i++) {
        const par_ckpt_tensor *a = &tens[i], *b = par_ckpt_find(ck, a->name);
        if (!b) {
            s = par_err(PAR_EINVAL, "--load %s: tensor '%s' of the model is not in the checkpoint (another model "
                        "config?)", par_ckpt_dir(ck), a->name);
            break;
        }
        int same = a->dtype == b->dtype && a->ndim == b->ndim;
        for (int d = 0; same && d < a->ndim; d++)
            same = a->shape[d] == b->shape[d];
        if (!same) {
            char sa[96], sb[96];
            par_shape_str(a->ndim, a->shape, sa, sizeof sa);
            par_shape_str(b->ndim, b->shape, sb, sizeof sb);
            s = par_err(PAR_EINVAL, "--load %s: tensor '%s' is %s %s in the checkpoint but %s %s in this model "
                        "(another model config: --set / --preset differ from the saved run's?)", par_ckpt_dir(ck),
                        a->name, par_dtype_name(b->dtype), sb, par_dtype_name(a->dtype), sa);
        }
    }
    if (!s && par_ckpt_ntensors(ck) != nt)
        s = par_err(PAR_EINVAL, "--load %s: the checkpoint holds %d tensors, the model %d", par_ckpt_dir(ck),
                    par_ckpt_ntensors(ck), nt);
    par_free(tens);
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

par_status PAR_FN(par_ckptw_load)(const par_pctx *P, PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                  const par_ckpt *ck)
{
    (void)P;
    const par_param_table *t = &M->tab;
    par_ckpt_item *it = NULL;
    int n = 0, cap = 0;
    par_status s = PAR_OK;
    char nm[PAR_CKPT_NAME_MAX];
    /* parameters: everything held, whole */
    for (int i = 0; i < t->n && !s; i++) {
        const par_param *p = &t->p[i];
        void *d = p->dtype == PAR_PDT_I32 ? (void *)(M->i32 + p->offset)
                                          : (void *)PAR_FN(par_model_ptr)(M, M->params, i);
        if (d)
            s = add_item(&it, &n, &cap, p->name, 0, p->numel, d);
    }
    /* optimizer state: what the plans hold (a shard, owned matrices, or all) */
    for (int k = 0; k < 2 && !s; k++) {
        const plan_t *pl = &w->plan[k];
        for (int j = 0; j < pl->n && !s; j++) {
            const par_zero_entry *e = &pl->e[j];
            const char *pn = t->p[e->idx].name;
            int nslots = e->opt == PAR_OPT_MUON ? 1 : 2;
            for (int slot = 0; slot < nslots && !s; slot++) {
                snprintf(nm, sizeof nm, "opt.%s.%s", pn,
                         e->opt == PAR_OPT_MUON ? "momentum" : slot == 0 ? "exp_avg" : "exp_avg_sq");
                /* walk the entry's held pieces */
                for (int64_t b0 = 0; b0 < e->numel && !s;) {
                    int64_t avail = 0;
                    par_real *d = PAR_FN(par_dpw_state_ptr)(w, e->idx, slot, b0, &avail);
                    if (!d) { /* not held from b0: skip to the next shard start */
                        int64_t next = e->numel;
                        if (e->opt == PAR_OPT_ADAMW && pl->mode == PAR_DP_ZERO1) {
                            int64_t lo = (int64_t)pl->rank * pl->shard;
                            next = b0 < lo - e->pos ? lo - e->pos : e->numel;
                        }
                        b0 = next;
                        continue;
                    }
                    s = add_item(&it, &n, &cap, nm, b0, b0 + avail, d);
                    b0 += avail;
                }
            }
        }
    }
    if (!s)
        s = par_ckpt_read(ck, it, n);
    if (!s)
        M->step = par_ckpt_state_of(ck)->step;
    par_free(it);
    return s;
}
