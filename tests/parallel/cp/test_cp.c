/* parallel: context parallelism for the attention layer (parallel/cp/cp.h), f64,
 * threads backend.
 *
 * Every case runs the serial layer (par_attn_forward/backward) on whole
 * packed rows, then the CP layer on CP ranks (each holding its S/CP slice of
 * every row) and checks:
 * - y and selected bitwise equal to the serial slices;
 * - dx (per rank) and dW (summed over ranks in rank order) within 1e-12 of
 *   the serial values (relative to the tensor's largest magnitude); indexer
 *   gradient slots untouched;
 * - the bytes handed to src/comm (halo rows, entries, entry gradients);
 * - the attention hook's own memory (parallel/cp/cp_hook.h): a table of one
 *   pointer per (slot, HELD block), the saved states allocated per forward
 *   (64 slots of a model or of one held block stay a few KiB);
 * - each rank's memory (its allocation scope): the saved forward is exactly
 *   its working rows' state (halo + local rows, window layout) plus the
 *   whole rows' entries, never the whole rows' per-token state; the
 *   backward's extra peak is bounded by the working rows' scratch.
 * Packings put a sample start exactly at a split, inside a halo, a sample
 * across all ranks, samples shorter than the window and lengths that are not
 * multiples of m.  m = 0, 4, 8, 16; CP = 1, 2, 3, 4; a DP x CP world whose CP
 * groups come from par_comm_split; S/CP < D_window is refused.
 */
#include <criterion/criterion.h>

#include "attn_weights.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/rng.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/cp/cp.h"
#include "parallel/cp/cp_hook.h"

void openblas_set_num_threads(int num_threads);
int omp_get_max_threads(void);

typedef par_attn_weights_f64 wts;
typedef par_cp_attn_saved_f64 cpsaved;

enum { NW = PAR_TEST_ATTN_NW, MAXROWS = 8 };

static int is_indexer_slot(int k) { return k >= 12; }

/* One case: the layer, the whole rows, the serial results. */
typedef struct {
    par_attn_dims dm;
    par_rope rope;
    int64_t rows, S, T, nw;
    int32_t *pos;
    double *x, *dy, *y, *dx, *wbuf, *dwbuf;
    wts W, dW;
    int32_t *sel;
} layer;

/* rows: lengths of samples, each row's list ends with 0 */
static void layer_init(layer *Ly, int64_t m, int64_t window, int64_t S, const int *const *rows,
                       int64_t nrows, uint64_t seed)
{
    memset(Ly, 0, sizeof *Ly);
    par_attn_dims *dm = &Ly->dm;
    dm->d = 8, dm->H = 2, dm->hd = 8, dm->rd = 4, dm->q_lora = 6, dm->o_groups = 2;
    dm->o_lora = 3, dm->window = window, dm->iH = 2, dm->ihd = 8, dm->topk = 2;
    dm->norm_eps = 1e-6, dm->m = m;
    if (m > 0)
        par_rope_init(&Ly->rope, (int)dm->rd, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    else
        par_rope_init(&Ly->rope, (int)dm->rd, 10000.0, 0, 16.0, 65536, 32.0, 1.0);
    dm->rope = &Ly->rope;
    Ly->rows = nrows, Ly->S = S, Ly->T = nrows * S;
    const int64_t T = Ly->T, d = dm->d;
    Ly->pos = malloc((size_t)T * sizeof(int32_t));
    for (int64_t b = 0; b < nrows; b++) {
        int64_t t = 0;
        for (const int *len = rows[b]; *len; len++)
            for (int p = 0; p < *len; p++)
                Ly->pos[b * S + t++] = p;
        cr_assert_eq(t, S, "row %lld of the packing has %lld tokens, not S = %lld", (long long)b,
                     (long long)t, (long long)S);
    }
    Ly->x = malloc((size_t)(T * d) * sizeof(double));
    Ly->dy = malloc((size_t)(T * d) * sizeof(double));
    Ly->y = malloc((size_t)(T * d) * sizeof(double));
    Ly->dx = calloc((size_t)(T * d), sizeof(double));
    par_philox_key kx = par_rng_key(seed, "x"), kg = par_rng_key(seed, "dy");
    for (int64_t i = 0; i < T * d; i++) {
        Ly->x[i] = 2 * par_rng_uniform(kx, (uint64_t)i, 0) - 1;
        Ly->dy[i] = par_rng_normal(kg, (uint64_t)i, 0);
    }
    int64_t tot = 0;
    for (int k = 0; k < NW; k++)
        tot += wcount(dm, k, NULL);
    Ly->nw = tot;
    Ly->wbuf = malloc((size_t)tot * sizeof(double));
    Ly->dwbuf = calloc((size_t)tot, sizeof(double));
    int64_t off = 0;
    for (int k = 0; k < NW; k++) {
        int64_t fan, n = wcount(dm, k, &fan);
        if (!n)
            continue;
        *wslot(&Ly->W, k) = Ly->wbuf + off;
        *wslot(&Ly->dW, k) = Ly->dwbuf + off;
        par_philox_key kw = par_rng_key(seed, wname[k]);
        for (int64_t i = 0; i < n; i++) {
            double u = 2 * par_rng_uniform(kw, (uint64_t)i, 0) - 1;
            Ly->wbuf[off + i] = fan ? u * 1.5 / sqrt((double)fan)
                                    : strstr(wname[k], "norm") ? 1 + 0.3 * u : u;
        }
        off += n;
    }
    Ly->sel = m == 4 ? malloc((size_t)(T * dm->topk) * sizeof(int32_t)) : NULL;
}

static void layer_free(layer *Ly)
{
    free(Ly->pos);
    free(Ly->x);
    free(Ly->dy);
    free(Ly->y);
    free(Ly->dx);
    free(Ly->wbuf);
    free(Ly->dwbuf);
    free(Ly->sel);
}

/* the serial reference on the whole rows */
static void layer_serial(layer *Ly)
{
    par_attn_saved_f64 s;
    void *buf = par_malloc(par_attn_saved_bytes_f64(&Ly->dm, Ly->T), PAR_TAG_ACT);
    cr_assert_not_null(buf);
    par_attn_saved_carve_f64(&s, buf, &Ly->dm, Ly->T);
    par_status st = par_attn_forward_f64(Ly->y, &s, Ly->sel, Ly->x, Ly->pos, &Ly->W, &Ly->dm, Ly->T);
    cr_assert_eq(st, PAR_OK, "serial forward: %s", par_last_error());
    st = par_attn_backward_f64(Ly->dx, &Ly->dW, Ly->dy, &s, Ly->x, Ly->pos, &Ly->W, &Ly->dm, Ly->T);
    cr_assert_eq(st, PAR_OK, "serial backward: %s", par_last_error());
    par_free(buf);
}

/* ---------------------------------------------------------------- world */

typedef struct {
    const layer *Ly;
    int cp, dp;           /* world = dp * cp; CP groups from par_comm_split when dp > 1 */
    double *y, *dx;       /* [T, d], slices written by their owners */
    int32_t *sel;         /* [T, topk] */
    double *dw;           /* [world, nw]: each rank's dW */
    par_cp_traffic *tr;   /* [world] */
    int use_null_comm;    /* cp == 1 without a communicator */
    int64_t *fwd_act;     /* [world]: activation bytes live after the forward (the saved state) */
    int64_t *bwd_act;     /* [world]: activation peak of the backward above that */
} run_ctx;

#define RCHECK(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond))                                                                         \
            return par_err(PAR_ECHECK, __VA_ARGS__);                                         \
    } while (0)

static par_status rank_fn(par_comm *world, void *arg)
{
    run_ctx *c = arg;
    const layer *Ly = c->Ly;
    const par_attn_dims *dm = &Ly->dm;
    const int wr = par_comm_rank(world);
    par_comm *cp = world;
    par_status st;
    if (c->dp > 1) {
        if ((st = par_comm_split(world, wr / c->cp, wr % c->cp, &cp)))
            return st;
    }
    if (c->use_null_comm)
        cp = NULL;
    const int r = cp ? par_comm_rank(cp) : 0, g = wr / c->cp;
    const int64_t S = Ly->S, L = S / c->cp, d = dm->d, K = dm->topk;
    const int64_t rows = Ly->rows / c->dp, row0 = g * rows;
    /* this rank's slice of its DP group's rows */
    double *x = malloc((size_t)(rows * L * d) * sizeof(double));
    double *y = malloc((size_t)(rows * L * d) * sizeof(double));
    double *dyl = malloc((size_t)(rows * L * d) * sizeof(double));
    double *dx = calloc((size_t)(rows * L * d), sizeof(double));
    int32_t *sel = malloc((size_t)(rows * L * K) * sizeof(int32_t));
    RCHECK(x && y && dyl && dx && sel, "rank %d: test buffers", wr);
    for (int64_t b = 0; b < rows; b++) {
        const int64_t src = ((row0 + b) * S + r * L) * d;
        memcpy(x + b * L * d, Ly->x + src, (size_t)(L * d) * sizeof(double));
        memcpy(dyl + b * L * d, Ly->dy + src, (size_t)(L * d) * sizeof(double));
    }
    wts dW = Ly->dW;
    double *dwb = c->dw + (size_t)wr * (size_t)Ly->nw;
    for (int k = 0; k < NW; k++)
        if (*wslot(&dW, k))
            *wslot(&dW, k) = dwb + (*wslot((wts *)&Ly->dW, k) - Ly->dwbuf);
    cpsaved sv;
    memset(&sv, 0, sizeof sv);
    const int scope = par_alloc_scope_open(); /* this rank's own memory (test buffers are malloc's) */
    par_alloc_stats as;
    st = par_cp_attn_forward_f64(y, &sv, dm->m == 4 ? sel : NULL, x, Ly->pos + row0 * S, &Ly->W,
                                 dm, rows, L, cp, &c->tr[wr]);
    par_alloc_scope_stats(scope, &as);
    c->fwd_act[wr] = as.live[PAR_TAG_ACT];
    par_alloc_scope_reset_peaks(scope);
    if (!st)
        st = par_cp_attn_backward_f64(dx, &dW, dyl, &sv, &Ly->W, cp, &c->tr[wr]);
    par_alloc_scope_stats(scope, &as);
    c->bwd_act[wr] = as.peak[PAR_TAG_ACT] - c->fwd_act[wr];
    par_alloc_scope_close(scope);
    if (!st)
        for (int64_t b = 0; b < rows; b++) {
            const int64_t t0 = (row0 + b) * S + r * L;
            memcpy(c->y + t0 * d, y + b * L * d, (size_t)(L * d) * sizeof(double));
            memcpy(c->dx + t0 * d, dx + b * L * d, (size_t)(L * d) * sizeof(double));
            if (dm->m == 4)
                memcpy(c->sel + t0 * K, sel + b * L * K, (size_t)(L * K) * sizeof(int32_t));
        }
    par_cp_attn_saved_free_f64(&sv);
    free(x);
    free(y);
    free(dyl);
    free(dx);
    free(sel);
    if (cp && cp != world)
        par_comm_free(cp);
    return st;
}

static void rank_init(int rank, void *ud)
{
    (void)rank;
    (void)ud;
    openblas_set_num_threads(1);
}

static par_status run_cp(run_ctx *c)
{
    const par_backend *be = NULL;
    par_status st = par_backend_get(c->use_null_comm ? "self" : "threads", &be);
    if (st)
        return st;
    par_world_opts o = {.timeout_s = 20.0, .rank_init = rank_init};
    return par_world_run(be, c->dp * c->cp, rank_fn, c, &o);
}

/* largest |a - b| over the largest |b| (1e-300 floor) */
static double rel_err(const double *a, const double *b, int64_t n)
{
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - b[i]));
        mb = fmax(mb, fabs(b[i]));
    }
    return md / fmax(mb, 1e-300);
}

static int64_t entries_on(const layer *Ly, int64_t row0, int64_t rows, int64_t L, int64_t q)
{
    int64_t n = 0;
    for (int64_t b = row0; b < row0 + rows; b++)
        for (int64_t t = q * L; t < (q + 1) * L; t++)
            n += Ly->dm.m > 0 && (Ly->pos[b * Ly->S + t] + 1) % Ly->dm.m == 0;
    return n;
}

/* one 64-byte aligned piece of n bytes (attention.c CARVE) */
static int64_t piece(int64_t n) { return (n + 63) / 64 * 64; }

/* The rank's memory: the saved forward is exactly cp.c's working-row state
 * (window arrays of rows * (Dh + L) tokens without the entries, the entries
 * [rows, S] of the whole rows, xw, pos), and the backward's extra peak stays
 * within the working rows' scratch (cp.c scratch_alloc and keep_alloc, one
 * row's proj_backward, the core's per-thread key scratch) plus a little. */
static void check_memory(const layer *Ly, const run_ctx *c, int64_t nworld, const char *what)
{
    const par_attn_dims *dm = &Ly->dm;
    const int64_t m = dm->m, hd = dm->hd, ihd = dm->ihd, H = dm->H, HD = H * hd, d = dm->d, ql = dm->q_lora;
    const int64_t S = Ly->S, L = S / c->cp, D = par_cp_layer_halo_f64(dm), rows = Ly->rows / c->dp;
    const int64_t nc = m > 0 ? (m == 4 ? 2 : 1) * hd : 0, ne = m > 0 ? hd + (m == 4 ? ihd : 0) : 0;
    for (int64_t w = 0; w < nworld; w++) {
        const int64_t r = c->use_null_comm ? 0 : w % c->cp, W_ = (r > 0 ? D : 0) + L, Tw = rows * W_;
        const int64_t Tt = rows * S;
        int64_t win = (int64_t)par_attn_saved_bytes_f64(dm, Tw);
        if (m > 0)
            win -= piece(Tw * hd * 8);
        if (m == 4)
            win -= piece(Tw * ihd * 8);
        const int64_t want = win + Tt * ne * 8 + (Tw * d + 1) * 8 + (Tt + 1) * 4;
        cr_assert_eq(c->fwd_act[w], want, "%s: rank %lld keeps %lld bytes after the forward, want %lld (its %lld "
                     "working rows)", what, (long long)w, (long long)c->fwd_act[w], (long long)want, (long long)Tw);
        if (W_ < S)
            cr_assert_lt(c->fwd_act[w], (int64_t)par_attn_saved_bytes_f64(dm, Tt), "%s: rank %lld keeps more than "
                         "the whole rows' saved struct", what, (long long)w);
        const int64_t scratch = 8 * (3 * Tw * HD + Tw * H + Tw * hd + (m > 0 ? Tt * hd : 0) + 2 * Tw * nc + Tw * d + 1);
        const int64_t keep = 8 * Tw * (HD + 2 * hd + 2 * nc) + 1, proj = 8 * W_ * (HD + 2 * ql + hd);
        const int64_t core = 24 * (int64_t)omp_get_max_threads() * (dm->window + S) + 8 * (L * H + 1);
        const int64_t bound = scratch + keep + proj + core + 4096;
        cr_assert_leq(c->bwd_act[w], bound, "%s: rank %lld's backward peaks %lld bytes above its saved state, "
                      "more than its working rows' %lld", what, (long long)w, (long long)c->bwd_act[w],
                      (long long)bound);
    }
}

/* Runs one case and checks everything against the serial layer. */
static void check_case(int64_t m, int64_t window, int64_t S, const int *const *rows,
                       int64_t nrows, int cp, int dp, int null_comm, const char *what)
{
    openblas_set_num_threads(1);
    layer Ly;
    layer_init(&Ly, m, window, S, rows, nrows, 1000 + (uint64_t)(m * 37 + S + cp));
    layer_serial(&Ly);
    const int64_t T = Ly.T, d = Ly.dm.d, K = Ly.dm.topk, nworld = (int64_t)dp * cp;
    run_ctx c = {.Ly = &Ly, .cp = cp, .dp = dp, .use_null_comm = null_comm};
    c.y = calloc((size_t)(T * d), sizeof(double));
    c.dx = calloc((size_t)(T * d), sizeof(double));
    c.sel = calloc((size_t)(T * K), sizeof(int32_t));
    c.dw = calloc((size_t)(nworld * Ly.nw), sizeof(double));
    c.tr = calloc((size_t)nworld, sizeof(par_cp_traffic));
    c.fwd_act = calloc((size_t)nworld, sizeof(int64_t));
    c.bwd_act = calloc((size_t)nworld, sizeof(int64_t));
    par_status st = run_cp(&c);
    cr_assert_eq(st, PAR_OK, "%s: CP world failed: %s", what, par_last_error());
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "%s: comm memory left", what);
    check_memory(&Ly, &c, nworld, what);

    /* forward: bitwise */
    for (int64_t t = 0; t < T; t++)
        cr_assert(memcmp(c.y + t * d, Ly.y + t * d, (size_t)d * sizeof(double)) == 0,
                  "%s: y of token %lld (row %lld, position %lld) differs from the serial layer",
                  what, (long long)t, (long long)(t / S), (long long)(t % S));
    if (m == 4)
        for (int64_t t = 0; t < T; t++)
            cr_assert(memcmp(c.sel + t * K, Ly.sel + t * K, (size_t)K * sizeof(int32_t)) == 0,
                      "%s: selected of token %lld: cp (%d, %d), serial (%d, %d)", what,
                      (long long)t, c.sel[t * K], c.sel[t * K + 1], Ly.sel[t * K],
                      Ly.sel[t * K + 1]);
    /* backward: dx per token, dW summed over ranks in rank order */
    double e = rel_err(c.dx, Ly.dx, T * d);
    cr_assert(e <= 1e-12, "%s: dx differs from the serial layer by %.3g (relative)", what, e);
    double worst_dw = 0;
    double *dws = calloc((size_t)Ly.nw, sizeof(double));
    for (int64_t w = 0; w < nworld; w++)
        for (int64_t i = 0; i < Ly.nw; i++)
            dws[i] += c.dw[w * Ly.nw + i];
    int64_t off = 0;
    for (int k = 0; k < NW; k++) {
        int64_t n = wcount(&Ly.dm, k, NULL);
        if (!n)
            continue;
        if (is_indexer_slot(k)) {
            for (int64_t i = 0; i < n; i++)
                cr_assert_eq(dws[off + i], 0.0, "%s: indexer gradient %s touched", what, wname[k]);
        } else {
            double ek = rel_err(dws + off, Ly.dwbuf + off, n);
            cr_assert(ek <= 1e-12, "%s: d%s differs from the serial layer by %.3g (relative)",
                      what, wname[k], ek);
            worst_dw = fmax(worst_dw, ek);
        }
        off += n;
    }
    cr_log_info("%s: dx rel err %.3g, worst dW rel err %.3g", what, e, worst_dw);
    /* traffic: halo rows both ways, entries, entry gradients */
    const int64_t L = S / cp, D = par_cp_layer_halo_f64(&Ly.dm), rws = nrows / dp;
    const int64_t ew = Ly.dm.hd + (m == 4 ? Ly.dm.ihd : 0);
    for (int64_t w = 0; w < nworld; w++) {
        const int64_t r = w % cp, row0 = (w / cp) * rws;
        const par_cp_traffic *tr = &c.tr[w];
        int64_t want_hf = (cp > 1 && !null_comm && r + 1 < cp) ? rws * D * d * 8 : 0;
        int64_t want_hb = (cp > 1 && !null_comm && r > 0) ? rws * D * d * 8 : 0;
        int64_t want_g = (cp > 1 && m > 0) ? entries_on(&Ly, row0, rws, L, r) * ew * 8 : 0;
        int64_t maxe = 0;
        for (int64_t q = 0; q < cp; q++) {
            int64_t n = entries_on(&Ly, row0, rws, L, q);
            maxe = n > maxe ? n : maxe;
        }
        int64_t want_rs = (cp > 1 && m > 0) ? maxe * Ly.dm.hd * cp * 8 : 0;
        cr_assert_eq(tr->halo_fwd, want_hf, "%s: rank %lld forward halo bytes %lld, want %lld",
                     what, (long long)w, (long long)tr->halo_fwd, (long long)want_hf);
        cr_assert_eq(tr->halo_bwd, want_hb, "%s: rank %lld backward halo bytes %lld, want %lld",
                     what, (long long)w, (long long)tr->halo_bwd, (long long)want_hb);
        cr_assert_eq(tr->gather_fwd, want_g, "%s: rank %lld entry bytes %lld, want %lld", what,
                     (long long)w, (long long)tr->gather_fwd, (long long)want_g);
        cr_assert_eq(tr->rs_bwd, want_rs, "%s: rank %lld entry-gradient bytes %lld, want %lld",
                     what, (long long)w, (long long)tr->rs_bwd, (long long)want_rs);
    }
    free(dws);
    free(c.y);
    free(c.dx);
    free(c.sel);
    free(c.dw);
    free(c.tr);
    free(c.fwd_act);
    free(c.bwd_act);
    layer_free(&Ly);
    cr_assert_eq(par_alloc_live(PAR_TAG_ACT), 0, "%s: activation memory left", what);
}

/* ------------------------------------------------------------- packings */

/* S = 16: a start at the CP=2 split (8), starts inside halos (5, 11), one
 * sample over all ranks, samples shorter than the window, lengths that are
 * not multiples of m */
static const int p16a[] = {8, 3, 5, 0}, p16b[] = {5, 6, 5, 0}, p16c[] = {16, 0},
                 p16d[] = {1, 1, 2, 3, 9, 0};
static const int *const rows16[] = {p16a, p16b, p16c, p16d};
/* S = 32: starts at 8, 19 (inside rank 3's halo for CP=4), 24; 13 (inside
 * rank 2's halo), 16; one sample of 32; short samples */
static const int p32a[] = {8, 11, 5, 8, 0}, p32b[] = {32, 0},
                 p32c[] = {1, 2, 3, 5, 7, 2, 9, 3, 0}, p32d[] = {13, 3, 16, 0};
static const int *const rows32[] = {p32a, p32b, p32c, p32d};
/* S = 24 (CP = 3): starts at 8 (split), 17 (inside rank 2's halo), 3, 13 */
static const int p24a[] = {8, 9, 7, 0}, p24b[] = {24, 0}, p24c[] = {3, 10, 11, 0};
static const int *const rows24[] = {p24a, p24b, p24c};
/* S = 64 (CP = 4, L = 16, D = 8 for m = 4 and w = 4: working rows 24 of
 * 64): one sample over the row (entries of rank 3's row before its halo),
 * starts at 20 (rank 1's local rows), 40 (inside rank 2's local rows just
 * before rank 3's halo), 50 (inside rank 3's halo) */
static const int p64a[] = {64, 0}, p64b[] = {20, 20, 10, 14, 0};
static const int *const rows64[] = {p64a, p64b};

Test(cp, m0_window_only)
{
    check_case(0, 3, 16, rows16, 4, 2, 1, 0, "m=0 w=3 S=16 CP=2");
    check_case(0, 4, 32, rows32, 4, 4, 1, 0, "m=0 w=4 S=32 CP=4");
    check_case(0, 4, 16, rows16, 4, 4, 1, 0, "m=0 w=4 S=16 CP=4 (S/CP == D_window)");
}

Test(cp, m4_indexer)
{
    check_case(4, 3, 16, rows16, 4, 2, 1, 0, "m=4 w=3 S=16 CP=2 (S/CP == D_window)");
    check_case(4, 4, 32, rows32, 4, 4, 1, 0, "m=4 w=4 S=32 CP=4");
    check_case(4, 3, 32, rows32, 4, 2, 1, 0, "m=4 w=3 S=32 CP=2");
    check_case(4, 4, 24, rows24, 3, 3, 1, 0, "m=4 w=4 S=24 CP=3");
    check_case(4, 4, 64, rows64, 2, 4, 1, 0, "m=4 w=4 S=64 CP=4 (working rows 24 of 64)");
}

Test(cp, m8_compressed)
{
    check_case(8, 4, 16, rows16, 4, 2, 1, 0, "m=8 w=4 S=16 CP=2");
    check_case(8, 3, 32, rows32, 4, 4, 1, 0, "m=8 w=3 S=32 CP=4");
    check_case(8, 4, 24, rows24, 3, 3, 1, 0, "m=8 w=4 S=24 CP=3");
}

Test(cp, m16_compressed)
{
    check_case(16, 4, 32, rows32, 4, 2, 1, 0, "m=16 w=4 S=32 CP=2");
    check_case(16, 4, 64, rows64, 2, 4, 1, 0, "m=16 w=4 S=64 CP=4 (entries before the halo)");
}

Test(cp, one_rank)
{
    check_case(4, 3, 16, rows16, 4, 1, 1, 0, "m=4 CP=1 (threads x 1)");
    check_case(8, 4, 16, rows16, 4, 1, 1, 1, "m=8 CP=1 (no communicator)");
}

Test(cp, dp_by_cp_split_groups)
{
    /* world of 4 = 2 DP groups x 2 CP ranks, each DP group its own 2 rows */
    check_case(4, 4, 32, rows32, 4, 2, 2, 0, "m=4 DP=2 x CP=2");
    check_case(0, 3, 16, rows16, 4, 2, 2, 0, "m=0 DP=2 x CP=2");
}

/* ------------------------------------------------------------- refusals */

typedef struct {
    const layer *Ly;
    int cp;
    char msg[512];
    int refused[8];
} refuse_ctx;

static par_status refuse_fn(par_comm *world, void *arg)
{
    refuse_ctx *c = arg;
    const layer *Ly = c->Ly;
    const int r = par_comm_rank(world);
    const int64_t L = Ly->S / c->cp, n = Ly->rows * L * Ly->dm.d;
    double *x = calloc((size_t)n, sizeof(double)), *y = calloc((size_t)n, sizeof(double));
    cpsaved sv;
    memset(&sv, 0, sizeof sv);
    par_status st = par_cp_attn_forward_f64(y, &sv, NULL, x, Ly->pos, &Ly->W, &Ly->dm, Ly->rows,
                                            L, world, NULL);
    c->refused[r] = st == PAR_EINVAL && sv.buf == NULL;
    if (r == 0)
        snprintf(c->msg, sizeof c->msg, "%s", par_last_error());
    par_cp_attn_saved_free_f64(&sv);
    free(x);
    free(y);
    return PAR_OK;
}

static void check_refused(int64_t m, int64_t window, int64_t S, const int *const *rows,
                          int64_t nrows, int cp, const char *want)
{
    layer Ly;
    layer_init(&Ly, m, window, S, rows, nrows, 7);
    refuse_ctx c = {.Ly = &Ly, .cp = cp};
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    par_world_opts o = {.timeout_s = 20.0, .rank_init = rank_init};
    par_err_set_quiet(1);
    par_status st = par_world_run(be, cp, refuse_fn, &c, &o);
    par_err_set_quiet(0);
    cr_assert_eq(st, PAR_OK, "refusal world: %s", par_last_error());
    for (int r = 0; r < cp; r++)
        cr_assert(c.refused[r], "m=%lld S=%lld CP=%d: rank %d did not refuse", (long long)m,
                  (long long)S, cp, r);
    cr_assert(strstr(c.msg, want) != NULL, "message '%s' lacks '%s'", c.msg, want);
    cr_assert(strstr(c.msg, "local rows") != NULL && strstr(c.msg, "D_window") != NULL,
              "message '%s' does not name the local rows and D_window", c.msg);
    layer_free(&Ly);
}

Test(cp, local_rows_below_d_window_refused)
{
    /* m = 4: D_window = 2m = 8 > S/CP = 16/4 = 4 */
    check_refused(4, 3, 16, rows16, 4, 4, "local rows S/CP = 16/4 = 4 are fewer than D_window = 8");
    /* m = 16: D_window = 16 > 16/2 = 8 */
    check_refused(16, 4, 16, rows16, 4, 2, "local rows S/CP = 16/2 = 8 are fewer than D_window = 16");
    /* m = 0, window 4: D_window = 4 > 12/4 = 3 */
    static const int p12[] = {12, 0};
    static const int *const rows12[] = {p12};
    check_refused(0, 4, 12, rows12, 1, 4, "local rows S/CP = 12/4 = 3 are fewer than D_window = 4");
}

Test(cp, check_rules)
{
    par_err_set_quiet(1);
    cr_assert_eq(par_cp_check_f64(32, 4, 8), PAR_OK);
    cr_assert_eq(par_cp_check_f64(32, 4, 9), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "local rows S/CP = 32/4 = 8 are fewer than D_window = 9"));
    cr_assert_eq(par_cp_check_f64(30, 4, 1), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "does not divide seq_length 30"));
    cr_assert_eq(par_cp_check_f64(4, 1, 16), PAR_OK, "CP = 1 has no exchange and no rule");
    cr_assert_eq(par_cp_check_f64(4, 0, 1), PAR_EINVAL);
    par_err_set_quiet(0);
    /* D of a layer: max(window, d_comp(m)), d_comp(4) = 8, d_comp(m > 4) = m */
    par_attn_dims dm = {.window = 3, .m = 0};
    cr_assert_eq(par_cp_layer_halo_f64(&dm), 3);
    dm.m = 4;
    cr_assert_eq(par_cp_layer_halo_f64(&dm), 8);
    dm.m = 8, dm.window = 12;
    cr_assert_eq(par_cp_layer_halo_f64(&dm), 12);
    dm.m = 16;
    cr_assert_eq(par_cp_layer_halo_f64(&dm), 16);
}

/* ---- the hook's fixed memory ---- */

typedef struct {
    par_model_f64 *M[2];
    int64_t bytes[2]; /* live bytes of the hook with 64 slots on M[k], every tag */
} hook_ctx;

static par_status hook_fn(par_comm *world, void *ud)
{
    hook_ctx *h = ud;
    for (int k = 0; k < 2; k++) {
        const int scope = par_alloc_scope_open();
        par_cp_hook_f64 *hk = NULL;
        par_status st = par_cp_hook_create_f64(&hk, world, h->M[k], 64);
        par_alloc_stats as;
        par_alloc_scope_stats(scope, &as);
        for (int t = 0; t < PAR_TAG_COUNT; t++)
            h->bytes[k] += as.live[t];
        par_cp_hook_free_f64(hk);
        par_alloc_scope_close(scope);
        if (st)
            return st;
    }
    return PAR_OK;
}

/* m = 64 slots (config-c has m = 16 at 8,192 ranks): the hook's table was
 * [m, n_blocks] saved-state structs (~500 B each, every block of the model
 * on every rank); now one pointer per (slot, held block). */
Test(cp, hook_memory_is_a_pointer_per_slot_and_held_block)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), 0);
    par_model_f64 A, H;
    cr_assert_eq(par_model_init_f64(&A, &c, 5), 0, "%s", par_last_error());
    cr_assert_geq(A.n_blocks, 3);
    uint8_t blocks[16] = {0};
    cr_assert_leq(A.n_blocks, 16);
    blocks[1] = 1;
    par_model_hold hold = {.blocks = blocks, .embed = 1, .head = 1, .final = 1};
    cr_assert_eq(par_model_init_held_f64(&H, &c, 5, 0, c.n_routed_experts, &hold), 0, "%s", par_last_error());
    hook_ctx h = {.M = {&A, &H}};
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("self", &be), PAR_OK);
    par_world_opts o = {.timeout_s = 20.0};
    cr_assert_eq(par_world_run(be, 1, hook_fn, &h, &o), PAR_OK, "%s", par_last_error());
    const int64_t fixed = 256 + 16 * A.n_blocks; /* the struct, the block -> row map */
    cr_expect_gt(h.bytes[0], 64 * A.n_blocks * (int64_t)sizeof(void *));
    cr_expect_leq(h.bytes[0], 64 * A.n_blocks * (int64_t)sizeof(void *) + fixed, "all blocks: %lld B",
                  (long long)h.bytes[0]);
    cr_expect_leq(h.bytes[1], 64 * (int64_t)sizeof(void *) + fixed, "one held block: %lld B",
                  (long long)h.bytes[1]);
    par_model_free_f64(&A);
    par_model_free_f64(&H);
}
