/* parallel/cpwire.c - context parallelism in the training driver (see
 * parallel/cpwire.h, docs/parallel.md). */
#include "parallel/cpwire.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/groups.h"

struct PAR_FN(par_cpw_s) {
    par_comm *c;
    int64_t rows, S, L, cp;
    int nb;
    PAR_FN(par_cp_attn_saved) *sv; /* [nb] the last forward of each block */
    int32_t *pos_rows;             /* [rows, S] positions of the whole rows */
    int32_t *sample;               /* [rows, L] window sample of each local token */
    int64_t Ns;                    /* samples of the window (the rows) */
    par_cp_traffic tr;
    PAR_FN(par_model) *M;          /* installed on (its Ns_in follows the batch) */
};

static par_status attn_fwd(void *ctx, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *x, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cpw) *w = ctx;
    if (b < 0 || b >= w->nb || T != w->rows * w->L)
        return par_err(PAR_EINVAL, "cp attention: block %d on %lld tokens, the executor has %d blocks of %lld x %lld",
                       b, (long long)T, w->nb, (long long)w->rows, (long long)w->L);
    PAR_FN(par_cp_attn_saved_free)(&w->sv[b]);
    return PAR_FN(par_cp_attn_forward)(y, &w->sv[b], sel, x, w->pos_rows, W, &M->adims[b], w->rows, w->L, w->c,
                                       &w->tr);
}

static par_status attn_bwd(void *ctx, PAR_FN(par_model) *M, int b, par_real *dx, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cpw) *w = ctx;
    (void)M;
    if (b < 0 || b >= w->nb || T != w->rows * w->L || !w->sv[b].buf)
        return par_err(PAR_EINVAL, "cp attention backward: block %d has no forward on %lld tokens", b,
                       (long long)T);
    return PAR_FN(par_cp_attn_backward)(dx, dW, dy, &w->sv[b], W, w->c, &w->tr);
}

par_status PAR_FN(par_cpw_create)(PAR_FN(par_cpw) **out, par_comm *cp, const PAR_FN(par_model) *M,
                                  int64_t rows, int64_t S)
{
    *out = NULL;
    int64_t CP = cp ? par_comm_size(cp) : 1;
    if (rows < 1 || S < 1 || S % CP != 0)
        return par_err(PAR_EINVAL,
                       "context parallelism: sequence length %lld is not divisible by the context-parallel size "
                       "%lld (or no rows: %lld)",
                       (long long)S, (long long)CP, (long long)rows);
    PAR_FN(par_cpw) *w = par_calloc(1, sizeof *w, PAR_TAG_MODEL);
    if (!w)
        return par_err(PAR_ENOMEM, "context parallelism: out of memory");
    w->c = cp;
    w->rows = rows;
    w->S = S;
    w->cp = CP;
    w->L = S / CP;
    w->nb = M->n_blocks;
    w->sv = par_calloc((size_t)w->nb, sizeof *w->sv, PAR_TAG_ACT);
    w->pos_rows = par_malloc((size_t)(rows * S) * sizeof *w->pos_rows, PAR_TAG_ACT);
    w->sample = par_malloc((size_t)(rows * w->L) * sizeof *w->sample, PAR_TAG_ACT);
    if (!w->sv || !w->pos_rows || !w->sample) {
        PAR_FN(par_cpw_free)(w);
        return par_err(PAR_ENOMEM, "context parallelism: out of memory for %lld rows of %lld", (long long)rows,
                       (long long)S);
    }
    *out = w;
    return PAR_OK;
}

void PAR_FN(par_cpw_install)(PAR_FN(par_cpw) *w, PAR_FN(par_model) *M)
{
    M->attn.fwd = attn_fwd;
    M->attn.bwd = attn_bwd;
    M->attn.ctx = w;
    w->M = M;
    M->sample_in = w->sample;
    M->Ns_in = w->Ns;
}

void PAR_FN(par_cpw_free)(PAR_FN(par_cpw) *w)
{
    if (!w)
        return;
    for (int b = 0; w->sv && b < w->nb; b++)
        PAR_FN(par_cp_attn_saved_free)(&w->sv[b]);
    par_free(w->sv);
    par_free(w->pos_rows);
    par_free(w->sample);
    par_free(w);
}

par_status PAR_FN(par_cpw_batch)(PAR_FN(par_cpw) *w, par_batch *local, const par_batch *full)
{
    const int64_t R = w->rows, S = w->S, L = w->L;
    if (full->B != R || full->S != S || local->B != R || local->S != L)
        return par_err(PAR_EINVAL, "cp batch: rows %lld x %lld -> %lld x %lld, expected %lld x %lld -> %lld x %lld",
                       (long long)full->B, (long long)full->S, (long long)local->B, (long long)local->S,
                       (long long)R, (long long)S, (long long)R, (long long)L);
    int64_t c0 = (int64_t)par_comm_rank(w->c) * L;
    int32_t *const dst[6] = {local->tokens, local->segments, local->pos,
                             local->labels, local->mtp_inputs, local->mtp_labels};
    const int32_t *const src[6] = {full->tokens, full->segments, full->pos,
                                   full->labels, full->mtp_inputs, full->mtp_labels};
    int64_t nl = 0, nm = 0, base = 0;
    for (int64_t r = 0; r < R; r++) {
        for (int k = 0; k < 6; k++)
            memcpy(dst[k] + r * L, src[k] + r * S + c0, (size_t)L * sizeof(int32_t));
        for (int64_t j = 0; j < L; j++) {
            nl += local->labels[r * L + j] >= 0;
            nm += local->mtp_labels[r * L + j] >= 0;
            /* segments number a row's samples 0, 1, ...: window sample =
             * samples of the earlier rows + the segment */
            w->sample[r * L + j] = (int32_t)(base + full->segments[r * S + c0 + j]);
        }
        base += (int64_t)full->segments[(r + 1) * S - 1] + 1;
    }
    local->n_labels = nl;
    local->n_mtp_labels = nm;
    memcpy(w->pos_rows, full->pos, (size_t)(R * S) * sizeof *w->pos_rows);
    w->Ns = base;
    if (w->M)
        w->M->Ns_in = base;
    return PAR_OK;
}

void PAR_FN(par_cpw_traffic)(const PAR_FN(par_cpw) *w, par_cp_traffic *out)
{
    if (w)
        *out = w->tr;
    else
        memset(out, 0, sizeof *out);
}

par_status PAR_FN(par_cpw_place)(void *out, const void *in, size_t n, size_t esz, const par_layout *l,
                                 int64_t Bl)
{
    if (Bl < 1 || n % (size_t)Bl != 0)
        return par_err(PAR_EINVAL, "cp gather: %zu elements per rank are not %lld rows", n, (long long)Bl);
    size_t chunk = n / (size_t)Bl * esz; /* one row's slice, bytes */
    for (int r = 0; r < (int)l->world; r++) {
        par_rank_coords rc;
        par_status s = par_rank_coords_of(l, r, &rc);
        if (s)
            return s;
        if (rc.tp != 0 || rc.pp != 0)
            continue;
        const char *piece = (const char *)in + (size_t)r * n * esz;
        for (int64_t i = 0; i < Bl; i++) {
            size_t g = (size_t)((int64_t)rc.dp * Bl + i);
            memcpy((char *)out + (g * (size_t)l->cp + (size_t)rc.cp) * chunk, piece + (size_t)i * chunk, chunk);
        }
    }
    return PAR_OK;
}
