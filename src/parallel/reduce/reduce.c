/* parallel/reduce/reduce.c - what a parallel step sums across ranks: statistics,
 * the CP aux counts of a microbatch, shared gradients (see
 * parallel/reduce/reduce.h, docs/parallel.md "The reduction module"). */
#include "parallel/reduce/reduce.h"

#include "core/racc.h"

#include <string.h>

#include "core/alloc.h"

/* ------------------------------------------------------------ statistics -- */

/* The partial statistics of one rank as fields: loads (int64) and the
 * per-sample CE sums (double) over its own blocks' rows: summed over the
 * ranks of one stage that hold parts of the same rows (CP, SP).  The aux
 * counts were summed per microbatch (par_reduce_mb_stats); the counts
 * n_main / n_mtp / n_tokens are the executor's global ones: not summed. */
static int stats_fields(PAR_FN(par_stats) *st, par_field *f)
{
    const int64_t nb = st->n_blocks, E = st->E, Ns = st->Ns;
    f[0] = PAR_FIELD(st->loads, nb * E, PAR_C_I64);
    f[1] = PAR_FIELD(st->ce_main, Ns, PAR_C_F64);
    f[2] = PAR_FIELD(st->ce_mtp, Ns, PAR_C_F64);
    return 3;
}

/* What the pipeline sums once every stage has its own blocks' aux terms:
 * the fields above and aux [nb, Ns] (each block's terms on the one pipeline
 * rank that holds it, exact zeros elsewhere). */
static int pipeline_fields(PAR_FN(par_stats) *st, par_field *f)
{
    int n = stats_fields(st, f);
    f[n] = PAR_FIELD(st->aux, st->n_blocks * st->Ns, PAR_C_REAL);
    return n + 1;
}

/* The CP ranks of a data-parallel group hold parts of the same rows: they
 * must share one sample window. */
static par_status cp_window_check(par_comm *c, const PAR_FN(par_stats) *st)
{
    if (!c || par_comm_size(c) <= 1)
        return PAR_OK;
    int CP = par_comm_size(c);
    int64_t win[2] = {st->q0, st->Ns};
    int64_t *all = par_malloc((size_t)CP * 2 * sizeof *all, PAR_TAG_COMM);
    if (!all)
        return par_err(PAR_ENOMEM, "stats reduce (cp): out of memory for %d windows", CP);
    par_status s = par_allgather(c, win, all, 2, PAR_C_I64);
    for (int r = 0; r < CP && !s; r++)
        if (all[2 * r] != win[0] || all[2 * r + 1] != win[1])
            s = par_err(PAR_EMISMATCH,
                        "stats reduce (cp): CP rank %d's window is samples %lld + %lld, rank %d's %lld + %lld: "
                        "the CP ranks of a data-parallel group must share one window",
                        r, (long long)all[2 * r], (long long)all[2 * r + 1], par_comm_rank(c), (long long)win[0],
                        (long long)win[1]);
    par_free(all);
    return s;
}

/* The DP ranks' windows tile [0, Ns_global) in rank order: wins[2r] =
 * first sample of rank r, wins[2r+1] its samples. */
static par_status dp_windows(par_comm *dp, const PAR_FN(par_stats) *st, int64_t *wins)
{
    int N = par_comm_size(dp);
    int64_t mine[2] = {st->q0, st->Ns}, next = 0;
    par_status s = par_allgather(dp, mine, wins, 2, PAR_C_I64);
    for (int r = 0; r < N && !s; r++) {
        if (wins[2 * r] != next || wins[2 * r + 1] < 0)
            return par_err(PAR_EMISMATCH,
                           "stats reduce: rank %d's samples start at %lld (%lld samples), expected %lld: "
                           "the ranks' windows must tile the %lld samples of the global batch in rank order",
                           r, (long long)wins[2 * r], (long long)wins[2 * r + 1], (long long)next,
                           (long long)st->Ns_global);
        next += wins[2 * r + 1];
    }
    if (!s && next != st->Ns_global)
        s = par_err(PAR_EMISMATCH, "stats reduce: the ranks hold %lld samples, the global batch %lld",
                    (long long)next, (long long)st->Ns_global);
    return s;
}

#define TERMS_TAG 7403

/* DP rank r's rows of one per-sample array (w elements of type t per
 * sample, rank r's window's worth) into DP rank 0's all [Nsg, w] at its
 * window's first sample, point to point in rank order (the others send). */
static par_status rows_to_root(par_comm *dp, const int64_t *wins, const void *mine, int64_t Ns, size_t w,
                               par_ctype t, void *all, int tag)
{
    const int N = par_comm_size(dp), me = par_comm_rank(dp);
    const size_t es = par_ctype_size(t) * w;
    if (me != 0)
        return Ns ? par_send(dp, mine, (size_t)Ns * w, t, 0, tag) : PAR_OK;
    if (Ns)
        memcpy((char *)all + (size_t)wins[0] * es, mine, (size_t)Ns * es);
    par_status s = PAR_OK;
    for (int r = 1; r < N && !s; r++)
        if (wins[2 * r + 1])
            s = par_recv(dp, (char *)all + (size_t)wins[2 * r] * es, (size_t)wins[2 * r + 1] * w, t, r, tag);
    return s;
}

/* Every DP rank's per-sample terms ([q][2] CE sums, [q][nb] aux terms) in
 * global sample order into DP rank 0's ce [2, Nsg] and aux [nb, Nsg] (NULL
 * on the others).  Only rank 0 holds the global batch's samples: every rank
 * used to gather them all (two all-gathers of O(global samples x blocks) on
 * every rank at once: configs B and C's 8,192 ranks each held the 4,096
 * rows' samples). */
static par_status dp_gather_terms(par_comm *dp, const PAR_FN(par_stats) *st, const int64_t *wins, double *ce,
                                  par_real *aux)
{
    const int64_t nb = st->n_blocks, Ns = st->Ns, Nsg = st->Ns_global;
    size_t nsl = (size_t)(Ns > 0 ? Ns : 1), nsg = (size_t)(Nsg > 0 ? Nsg : 1), nbb = (size_t)(nb > 0 ? nb : 1);
    const int root = par_comm_rank(dp) == 0;
    double *ce_loc = par_malloc(nsl * 2 * sizeof *ce_loc, PAR_TAG_COMM);
    par_real *aux_loc = par_malloc(nsl * nbb * sizeof *aux_loc, PAR_TAG_COMM);
    double *ce_all = root ? par_malloc(nsg * 2 * sizeof *ce_all, PAR_TAG_COMM) : NULL;
    par_real *aux_all = root ? par_malloc(nsg * nbb * sizeof *aux_all, PAR_TAG_COMM) : NULL;
    par_status s = PAR_OK;
    if (!ce_loc || !aux_loc || (root && (!ce_all || !aux_all))) {
        s = par_err(PAR_ENOMEM, "stats reduce: out of memory (%lld samples, %lld blocks)", (long long)Nsg,
                    (long long)nb);
        goto done;
    }
    for (int64_t q = 0; q < Ns; q++) {
        ce_loc[2 * q] = st->ce_main[q];
        ce_loc[2 * q + 1] = st->ce_mtp[q];
        for (int64_t b = 0; b < nb; b++)
            aux_loc[q * nb + b] = st->aux[b * Ns + q];
    }
    if ((s = rows_to_root(dp, wins, ce_loc, Ns, 2, PAR_C_F64, ce_all, TERMS_TAG)) ||
        (s = rows_to_root(dp, wins, aux_loc, Ns, (size_t)nb, PAR_C_REAL, aux_all, TERMS_TAG + 1)) || !root)
        goto done;
    for (int64_t q = 0; q < Nsg; q++) {
        ce[q] = ce_all[2 * q];
        ce[Nsg + q] = ce_all[2 * q + 1];
        for (int64_t b = 0; b < nb; b++)
            aux[b * Nsg + q] = aux_all[q * nb + b];
    }
done:
    par_free(ce_loc);
    par_free(aux_loc);
    par_free(ce_all);
    par_free(aux_all);
    return s;
}

/* Step 3: loads over DP, the losses from every sample in global order on DP
 * rank 0, broadcast to the group (the same bits every rank computed when
 * each gathered every sample). */
static par_status dp_losses(par_comm *dp, PAR_FN(par_model) *M)
{
    PAR_FN(par_stats) *st = &M->stats;
    const int64_t nb = st->n_blocks, E = st->E, Nsg = st->Ns_global;
    par_field lf = PAR_FIELD(st->loads, nb * E, PAR_C_I64);
    par_status s = par_reduce_fields(dp, &lf, 1, NULL);
    if (s)
        return s;
    const int root = par_comm_rank(dp) == 0;
    size_t nsg = (size_t)(Nsg > 0 ? Nsg : 1);
    int64_t *wins = par_malloc((size_t)par_comm_size(dp) * 2 * sizeof *wins, PAR_TAG_COMM);
    double *ce = root ? par_malloc(nsg * 2 * sizeof *ce, PAR_TAG_COMM) : NULL;
    par_real *aux = root ? par_malloc(nsg * (size_t)(nb > 0 ? nb : 1) * sizeof *aux, PAR_TAG_COMM) : NULL;
    if (!wins || (root && (!ce || !aux)))
        s = par_err(PAR_ENOMEM, "stats reduce: out of memory for %lld samples", (long long)Nsg);
    if (!s && !(s = dp_windows(dp, st, wins)))
        s = dp_gather_terms(dp, st, wins, ce, aux);
    if (!s && root)
        PAR_FN(par_model_losses_from)(M, st->n_main, st->n_mtp, ce, ce + Nsg, aux, Nsg, &M->last);
    if (!s)
        s = par_bcast(dp, &M->last, sizeof M->last, PAR_C_BYTE, 0);
    par_free(wins);
    par_free(ce);
    par_free(aux);
    return s;
}

/* The order: loads and CE sums over CP (SP) first (each stage's aux terms
 * of its own blocks are there since its forwards), then the pipeline.  The
 * pipeline used to sum the whole [blocks, samples, E] arrays first, every
 * rank holding every block's: its sums only added exact zeros (a block lives
 * on one pipeline rank, the CE sums on the heads' ranks), so the values are
 * the same bits either way. */
par_status PAR_FN(par_reduce_stats)(const par_pctx *P, PAR_FN(par_model) *M)
{
    PAR_FN(par_stats) *st = &M->stats;
    par_field f[4];
    int nf = stats_fields(st, f);
    par_comm *pp = P->g.g[PAR_GROUP_PP], *cp = P->g.g[PAR_GROUP_CP];
    /* sequence parallelism: the TP ranks hold column slices of the same rows, as CP's do */
    par_comm *sp = P->lay->sequence_parallel ? P->g.g[PAR_GROUP_TP] : NULL;
    par_status s;
    PAR_FN(par_stats_settle)(st); /* the bitwise mode's CE sums as values (CP merges them again, exactly) */
    if ((cp && par_comm_size(cp) > 1 && ((s = cp_window_check(cp, st)) || (s = par_reduce_fields(cp, f, nf, NULL)))) ||
        (sp && par_comm_size(sp) > 1 && ((s = cp_window_check(sp, st)) || (s = par_reduce_fields(sp, f, nf, NULL)))))
        return s;
    nf = pipeline_fields(st, f);
    if (pp && par_comm_size(pp) > 1 && (s = par_reduce_fields(pp, f, nf, NULL)))
        return s;
    par_comm *dp = P->g.g[PAR_GROUP_DP];
    if (!dp)
        return par_err(PAR_EINTERNAL, "stats reduce: rank %d has no data-parallel group", P->rank);
    return dp_losses(dp, M);
}

/* ------------------------------------------------ CP counts, shared grads -- */

/* The bitwise mode: elements [i0, i0 + n) of an order-free accumulator
 * merged over c through the module (a buffer registered behind them for the
 * call) and rounded into out. */
static par_status racc_reduce_into(par_comm *c, par_racc *a, size_t i0, size_t n, par_real *out)
{
    par_racc alias = {.n = n, .e = a->e + i0, .s0 = a->s0 + i0, .s1 = a->s1 + i0, .s2 = a->s2 + i0};
    par_status s = par_racc_register(out, n, sizeof *out, &alias);
    if (s)
        return s;
    par_field f = PAR_FIELD(out, n, PAR_C_REAL);
    s = par_reduce_fields(c, &f, 1, NULL);
    par_racc_unregister(out);
    return s;
}

par_status PAR_FN(par_reduce_mb_stats)(par_comm *c, PAR_FN(par_stats) *v, const int *blocks, int n_blocks)
{
    const int64_t E = v->E, Ns = v->Ns;
    par_field *f = par_malloc((size_t)(3 * n_blocks + 1) * sizeof *f, PAR_TAG_COMM);
    if (!f)
        return par_err(PAR_ENOMEM, "reduce: out of memory for the counts of %d blocks", n_blocks);
    int nf = 0;
    for (int j = 0; j < n_blocks; j++) {
        if (blocks[j] < 0)
            continue;
        int64_t r = PAR_FN(par_stats_row)(v, blocks[j]);
        if (r < 0) {
            par_free(f);
            return par_err(PAR_EINTERNAL, "reduce: block %d has no statistics rows on this rank", blocks[j]);
        }
        f[nf++] = PAR_FIELD(v->cnt + r * Ns * E, Ns * E, PAR_C_I64);
        f[nf++] = PAR_FIELD(v->ntok + r * Ns, Ns, PAR_C_I64);
        f[nf++] = PAR_FIELD(v->psum + r * Ns * E, Ns * E, PAR_C_REAL);
    }
    par_status s = par_reduce_fields(c, f, nf, NULL);
    par_free(f);
    for (int j = 0; !s && v->psum_acc && j < n_blocks; j++) { /* the bitwise mode: psum's terms, exactly */
        int64_t r = blocks[j] < 0 ? -1 : PAR_FN(par_stats_row)(v, blocks[j]);
        if (r >= 0)
            s = racc_reduce_into(c, v->psum_acc, (size_t)(r * Ns * E), (size_t)(Ns * E), v->psum + r * Ns * E);
    }
    return s;
}

static int shared_wanted(const par_param_table *t, const PAR_FN(par_model) *M, int i, int which)
{
    const par_param *p = &t->p[i];
    int want = which == 2 ? 1 : i == (which == 0 ? t->top.embed : t->top.head);
    return want && p->dtype == PAR_PDT_REAL && p->has_grad && PAR_FN(par_model_loc)(M, i) >= 0;
}

/* The entries of a tensor-parallel sum: kind 2 the routed experts' (ETP),
 * else the PAR_TPG_* bits of par_reduce_tp_grads: the attention's
 * (layers.N.attn.* / mtp.N.attn.*; SKIP_WKV: without attn.wkv.weight, the
 * deliberate fault), VOCAB embed / head, SHARED the shared experts', ALL
 * every dense entry. */
enum { TP_KIND_ETP = 1u << 30 };
static int tp_wanted(const par_param_table *t, const PAR_FN(par_model) *M, int i, unsigned kind)
{
    const par_param *p = &t->p[i];
    if (p->dtype != PAR_PDT_REAL || !p->has_grad || PAR_FN(par_model_loc)(M, i) < 0)
        return 0;
    if (PAR_FN(par_model_cut_of)(M, i)) /* held as this rank's shard: its gradient is complete here */
        return 0;
    if (kind & TP_KIND_ETP)
        return p->expert >= 0;
    const char *a = strstr(p->name, ".attn.");
    if (a && M->cfg.bitwise) /* the bitwise mode: complete and the same on every rank (tp_attn.c) */
        return 0;
    if (a && (kind & PAR_TPG_SKIP_WKV) && strcmp(a, ".attn.wkv.weight") == 0)
        return 0;
    if (a || ((kind & PAR_TPG_ALL) && p->expert < 0))
        return 1;
    if ((kind & PAR_TPG_VOCAB) && (i == t->top.embed || i == t->top.head))
        return 1;
    return (kind & PAR_TPG_SHARED) && strstr(p->name, ".shared_experts.") != NULL;
}

/* g[0..n) = 0, and in the bitwise mode its accumulator emptied too (the
 * next merge reads the accumulator, not g). */
static void grads_clear(par_real *g, int64_t n)
{
    const par_racc_view v = par_racc_lookup(g, (size_t)n);
    if (v.acc)
        par_racc_zero(v.acc, v.at, (size_t)n);
    memset(g, 0, (size_t)n * sizeof *g);
}

/* Every entry of `kind` summed over c. */
static par_status tp_sum(PAR_FN(par_model) *M, par_comm *c, unsigned kind)
{
    const par_param_table *t = &M->tab;
    int n = 0;
    for (int i = 0; i < t->n; i++)
        n += tp_wanted(t, M, i, kind);
    par_field *f = par_malloc((size_t)(n + 1) * sizeof *f, PAR_TAG_COMM);
    if (!f)
        return par_err(PAR_ENOMEM, "reduce: out of memory for %d tensor-parallel gradients", n);
    for (int i = 0, k = 0; i < t->n; i++)
        if (tp_wanted(t, M, i, kind))
            f[k++] = PAR_FIELD(M->grads + PAR_FN(par_model_loc)(M, i), PAR_FN(par_model_numel)(M, i), PAR_C_REAL);
    par_status s = par_reduce_fields(c, f, n, NULL);
    par_free(f);
    return s;
}

par_status PAR_FN(par_reduce_etp_grads)(PAR_FN(par_model) *M, par_comm *etp)
{
    return etp && par_comm_size(etp) > 1 ? tp_sum(M, etp, TP_KIND_ETP) : PAR_OK;
}

par_status PAR_FN(par_reduce_tp_grads)(PAR_FN(par_model) *M, par_comm *tp, unsigned what)
{
    if (!tp || par_comm_size(tp) <= 1)
        return PAR_OK;
    const par_param_table *t = &M->tab;
    par_status s = tp_sum(M, tp, what & ~(unsigned)TP_KIND_ETP);
    /* the routed experts' group (EDP) spans the TP ranks: count them once
     * (with ALL each TP rank holds its own tokens' share: the EDP sum adds them) */
    const int all_experts = M->e0 == 0 && M->e1 == M->E; /* EP > 1: ep_tp.c leaves the TP copies out instead */
    for (int i = 0; !s && !(what & (PAR_TPG_ALL | PAR_TPG_KEEP_EXPERTS)) && all_experts && par_comm_rank(tp) != 0 && i < t->n; i++)
        if (t->p[i].expert >= 0 && t->p[i].dtype == PAR_PDT_REAL && t->p[i].has_grad && PAR_FN(par_model_loc)(M, i) >= 0)
            grads_clear(M->grads + PAR_FN(par_model_loc)(M, i), t->p[i].numel);
    return s;
}

par_status PAR_FN(par_reduce_shared_grads)(PAR_FN(par_model) *M, par_comm *c, int which)
{
    if (!c || par_comm_size(c) <= 1)
        return PAR_OK;
    const par_param_table *t = &M->tab;
    int n = 0;
    for (int i = 0; i < t->n; i++)
        n += shared_wanted(t, M, i, which);
    if (n == 0)
        return par_err(PAR_EINTERNAL, "reduce: a rank of a shared-weight group holds none of it");
    par_field *f = par_malloc((size_t)n * sizeof *f, PAR_TAG_COMM);
    if (!f)
        return par_err(PAR_ENOMEM, "reduce: out of memory for %d shared gradients", n);
    for (int i = 0, k = 0; i < t->n; i++)
        if (shared_wanted(t, M, i, which))
            f[k++] = PAR_FIELD(M->grads + PAR_FN(par_model_loc)(M, i), PAR_FN(par_model_numel)(M, i), PAR_C_REAL);
    par_status s = par_reduce_fields(c, f, n, NULL);
    par_free(f);
    return s;
}
