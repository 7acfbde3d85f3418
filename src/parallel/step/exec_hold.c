/* parallel/step/exec_hold.c - which pipeline rank holds what: this rank's stages
 * and items, the model of its stages, and the lowest pipeline holder of
 * every table entry (it counts the entry in the norm and supplies it to a
 * dump).  Part of the step executor (parallel/step/exec-impl.h). */
#include <math.h>
#include <string.h>

#include "parallel/step/exec-impl.h"

#include "core/alloc.h"
#include "kernels/recipe.h"
#include "parallel/layout/tp_split.h"

/* Blocks and top-level parts of segment `seg` into hold / blocks. */
static void seg_hold(const par_layout *l, const par_config *c, int seg, uint8_t *blocks, par_model_hold *h)
{
    const par_pplayout *pl = &l->pipe;
    int t = par_pplayout_offset(pl, seg, PAR_BLK_LAYER), mt = par_pplayout_offset(pl, seg, PAR_BLK_MTP);
    for (int i = pl->seg_off[seg]; i < pl->seg_off[seg + 1]; i++) {
        switch (pl->items[i]) {
        case PAR_BLK_EMBED:
            h->embed = 1;
            break;
        case PAR_BLK_LAYER:
            blocks[t++] = 1;
            break;
        case PAR_BLK_MTP:
            blocks[c->n_layers + mt++] = 1;
            h->embed = 1;
            h->head = 1;
            break;
        case PAR_BLK_LOSS:
            h->head = 1;
            h->final = 1;
            break;
        }
    }
}

/* The hold of pipeline rank r (stages of every direction). */
static void rank_hold(const exec_t *ex, int r, uint8_t *blocks, par_model_hold *h)
{
    memset(blocks, 0, (size_t)ex->n_blocks);
    memset(h, 0, sizeof *h);
    for (int dir = 0; dir < ex->sch.n_dirs; dir++)
        for (int s = 0; s < ex->n_stages; s++)
            if (par_schedule_stage_rank(&ex->sch, dir, s) == r)
                seg_hold(ex->lay, &ex->cfg, s, blocks, h);
    h->blocks = blocks;
}

/* Entry idx's slot in ex->holder_pp: its block, else n_blocks + 0 embed,
 * + 1 head, + 2 the final norm's. */
static int holder_slot(const exec_t *ex, const par_param_table *t, int idx)
{
    const par_param *p = &t->p[idx];
    if (p->layer >= 0)
        return p->layer;
    return ex->n_blocks + (idx == t->top.embed ? 0 : idx == t->top.head ? 1 : 2);
}

int PAR_FN(par__exec_holder_pp)(const exec_t *ex, const par_param_table *t, int idx)
{
    if (idx < 0 || idx >= t->n || t->p[idx].dtype != PAR_PDT_REAL)
        return -1;
    return ex->holder_pp[holder_slot(ex, t, idx)];
}

static par_status build_lstage(exec_t *ex, lstage *ls, int dir, int stage)
{
    const par_pplayout *pl = &ex->lay->pipe;
    ls->stage = stage;
    ls->dir = dir;
    ls->chunk = par_schedule_stage_chunk(&ex->sch, dir, stage);
    ls->n_items = pl->seg_off[stage + 1] - pl->seg_off[stage];
    ls->items = par_malloc((size_t)(ls->n_items + 1), PAR_TAG_MODEL);
    ls->block = par_malloc((size_t)(ls->n_items + 1) * sizeof *ls->block, PAR_TAG_MODEL);
    if (!ls->items || !ls->block)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    int t = par_pplayout_offset(pl, stage, PAR_BLK_LAYER), mt = par_pplayout_offset(pl, stage, PAR_BLK_MTP);
    for (int j = 0; j < ls->n_items; j++) {
        char c = pl->items[pl->seg_off[stage] + j];
        ls->items[j] = c;
        ls->block[j] = c == PAR_BLK_LAYER ? t++ : c == PAR_BLK_MTP ? (int)ex->cfg.n_layers + mt++ : -1;
    }
    return PAR_OK;
}

/* This rank's stages, in (direction, stage) order. */
static par_status local_stages(exec_t *ex)
{
    int nsd = ex->n_stages * ex->sch.n_dirs;
    ex->stage_local = par_malloc((size_t)nsd * sizeof *ex->stage_local, PAR_TAG_MODEL);
    ex->ls = par_calloc((size_t)nsd, sizeof *ex->ls, PAR_TAG_MODEL);
    ex->blocks = par_calloc((size_t)ex->n_blocks, 1, PAR_TAG_MODEL);
    if (!ex->stage_local || !ex->ls || !ex->blocks)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    for (int dir = 0; dir < ex->sch.n_dirs; dir++)
        for (int st = 0; st < ex->n_stages; st++) {
            int i = dir * ex->n_stages + st;
            ex->stage_local[i] = -1;
            if (par_schedule_stage_rank(&ex->sch, dir, st) != ex->me)
                continue;
            ex->stage_local[i] = ex->n_local;
            par_status s = build_lstage(ex, &ex->ls[ex->n_local++], dir, st);
            if (s)
                return s;
        }
    return PAR_OK;
}

/* The lowest pipeline holder of every block and top-level part (per part,
 * not per entry: the table's entries of a part share it); norm_skip marks
 * what this rank holds but a lower one counts. */
static par_status lowest_holders(exec_t *ex, const PAR_FN(par_model) *M)
{
    int ntab = M->tab.n, nh = ex->n_blocks + 3;
    uint8_t *rb = par_calloc((size_t)ex->n_blocks, 1, PAR_TAG_MODEL);
    ex->holder_pp = par_malloc((size_t)nh * sizeof *ex->holder_pp, PAR_TAG_MODEL);
    ex->norm_skip = par_calloc((size_t)ntab / 8 + 1, 1, PAR_TAG_MODEL);
    if (!rb || !ex->holder_pp || !ex->norm_skip) {
        par_free(rb);
        return par_err(PAR_ENOMEM, "pipeline: out of memory for the holders of %d entries", ntab);
    }
    for (int i = 0; i < nh; i++)
        ex->holder_pp[i] = -1;
    for (int r = ex->p - 1; r >= 0; r--) {
        par_model_hold h;
        rank_hold(ex, r, rb, &h);
        for (int b = 0; b < ex->n_blocks; b++)
            if (rb[b])
                ex->holder_pp[b] = r;
        const int top[3] = {h.embed, h.head, h.final};
        for (int k = 0; k < 3; k++)
            if (top[k])
                ex->holder_pp[ex->n_blocks + k] = r;
    }
    for (int i = 0; i < ntab; i++)
        par__exec_skip_set(ex->norm_skip, i,
                           PAR_FN(par_model_holds)(M, i) && PAR_FN(par__exec_holder_pp)(ex, &M->tab, i) != ex->me);
    par_free(rb);
    return PAR_OK;
}

/* The model's cut_of (model.h): how this rank stores entry `name`
 * (parallel/layout/tp_split.h's par_tp_storage_cut; its enum values are the
 * model's: 1 rows, 2 cols). */
static int storage_cut(void *ctx, const char *name, int *rank, int *P)
{
    const exec_t *ex = ctx;
    int64_t p = 1;
    const par_tp_cut c = par_tp_storage_cut(ex->lay, name, &p);
    if (c == PAR_TP_REPLICATED)
        return 0;
    *P = (int)p;
    *rank = par_tp_split_of(name).group == PAR_TP_GROUP_ETP ? ex->etp_rank : ex->tp_rank;
    return c == PAR_TP_ROWS ? 1 : 2;
}

/* A recipe's tile amaxes of a GEMM on a TP/ETP-cut weight (kernels/recipe.h):
 * the element-wise max over the group that cuts `name`, NaN winning.  A
 * gather, not a sum (the one sum seam stays parallel/reduce's). */
static par_status tile_max(void *ctx, const char *name, double *amax, int64_t n)
{
    const exec_t *ex = ctx;
    par_comm *g = par_tp_split_of(name).group == PAR_TP_GROUP_ETP ? ex->etpc : ex->tpc;
    if (!g || n <= 0)
        return PAR_OK;
    const int P = par_comm_size(g);
    double *all = par_malloc((size_t)(n * P) * sizeof(double), PAR_TAG_COMM);
    if (!all)
        return par_err(PAR_ENOMEM, "recipe: %lld tile amaxes over %d ranks", (long long)n, P);
    par_status s = par_allgather(g, amax, all, (size_t)n, PAR_C_F64);
    for (int64_t i = 0; !s && i < n; i++) {
        double m = all[i];
        for (int p = 1; p < P; p++) {
            const double v = all[(int64_t)p * n + i];
            m = (v > m || isnan(v)) && !isnan(m) ? v : m;
        }
        amax[i] = m;
    }
    par_free(all);
    return s;
}

par_status PAR_FN(par__exec_hold)(exec_t *ex, PAR_FN(par_model) *M, uint64_t seed, int64_t e0, int64_t e1,
                                  const par_exec_opts *o)
{
    par_status s = local_stages(ex);
    if (s)
        return s;
    par_model_hold hold;
    rank_hold(ex, ex->me, ex->blocks, &hold);
    hold.tab = o->tab;
    /* a recipe's tiles cut by TP/ETP are maxed over the caller's group (tile_max
     * with this rank's exec): such a run keeps its own weights, not the process's
     * shared DP x CP copy, whose registration would name another rank's group */
    const int own = par_recipe_has_tiles((par_recipe)ex->cfg.recipe) && (ex->lay->tp > 1 || ex->lay->etp > 1);
    hold.share = own ? NULL : o->share;
    hold.share_ctx = own ? NULL : o->share_ctx;
    if (ex->lay->tp > 1 || ex->lay->etp > 1) {
        hold.cut_of = storage_cut;
        hold.cut_ctx = ex;
        hold.tile_max = tile_max;
        hold.tile_ctx = ex;
    }
    if ((s = PAR_FN(par_model_init_held)(M, &ex->cfg, seed, e0, e1, &hold)))
        return s;
    if ((s = lowest_holders(ex, M)))
        PAR_FN(par_model_free)(M);
    return s;
}

void PAR_FN(par__exec_hold_free)(exec_t *ex)
{
    if (ex->ls)
        for (int j = 0; j < ex->n_local; j++) {
            par_free(ex->ls[j].items);
            par_free(ex->ls[j].block);
        }
    par_free(ex->ls);
    par_free(ex->stage_local);
    par_free(ex->blocks);
    par_free(ex->holder_pp);
    par_free(ex->norm_skip);
}
