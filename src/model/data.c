/* model/data.c - packed batches, labels, packing plans, synthetic tokens. */
#include "model/data.h"

#include <string.h>

#include "core/alloc.h"
#include "core/device.h"
#include "core/rng.h"

par_status par_batch_alloc(par_batch *b, int64_t B, int64_t S)
{
    if (B < 1 || S < 1)
        return par_err(PAR_EINVAL, "batch: B = %lld and S = %lld must be >= 1", (long long)B, (long long)S);
    par_batch x;
    memset(&x, 0, sizeof x);
    x.B = B;
    x.S = S;
    size_t n = (size_t)(B * S);
    int32_t *all = par_calloc(6 * n, sizeof(int32_t), PAR_TAG_ACT);
    if (!all)
        return par_err(PAR_ENOMEM, "batch: no memory for %lld x %lld tokens", (long long)B, (long long)S);
    x.tokens = all;
    x.segments = all + n;
    x.pos = all + 2 * n;
    x.labels = all + 3 * n;
    x.mtp_inputs = all + 4 * n;
    x.mtp_labels = all + 5 * n;
    *b = x;
    return PAR_OK;
}

void par_batch_free(par_batch *b)
{
    if (!b)
        return;
    par_free(b->tokens);
    memset(b, 0, sizeof *b);
}

par_status par_batch_check(const int32_t *tokens, const int32_t *segments, int64_t R, int64_t S, int64_t vocab,
                           const char *what)
{
    const char *w = what ? what : "batch";
    for (int64_t r = 0; r < R; r++) {
        const int32_t *seg = segments + r * S, *tok = tokens + r * S;
        if (seg[0] != 0)
            return par_err(PAR_EINVAL, "%s: row %lld position 0: segments must start at 0, got %d", w, (long long)r,
                           seg[0]);
        for (int64_t s = 1; s < S; s++) {
            int32_t d = seg[s] - seg[s - 1];
            if (d < 0)
                return par_err(PAR_EINVAL, "%s: row %lld position %lld: segments decrease (%d after %d)", w,
                               (long long)r, (long long)s, seg[s], seg[s - 1]);
            if (d > 1)
                return par_err(PAR_EINVAL,
                               "%s: row %lld position %lld: segments not contiguous (%d after %d; samples are "
                               "numbered 0,1,2,... within a row)",
                               w, (long long)r, (long long)s, seg[s], seg[s - 1]);
        }
        for (int64_t s = 0; s < S; s++)
            if (tok[s] < 0 || tok[s] >= vocab)
                return par_err(PAR_EINVAL, "%s: row %lld position %lld: token %d outside [0, vocab_size = %lld)", w,
                               (long long)r, (long long)s, tok[s], (long long)vocab);
    }
    return PAR_OK;
}

void par_batch_derive(par_batch *b)
{
    const int64_t B = b->B, S = b->S;
    int64_t nl = 0, nm = 0;
    /* every writer of a batch ends here: the host holds the new batch
     * (kernels read tokens and positions; core/device.h) */
    int32_t *arrays[6] = {b->tokens, b->segments, b->pos, b->labels, b->mtp_inputs, b->mtp_labels};
    for (int i = 0; i < 6; i++)
        par_dev_host_set(arrays[i], (size_t)(B * S) * sizeof(int32_t));
    for (int64_t r = 0; r < B; r++) {
        const int32_t *seg = b->segments + r * S, *tok = b->tokens + r * S;
        int32_t *pos = b->pos + r * S, *lab = b->labels + r * S;
        int32_t *mi = b->mtp_inputs + r * S, *ml = b->mtp_labels + r * S;
        int32_t p = 0;
        for (int64_t s = 0; s < S; s++) {
            if (s > 0 && seg[s] != seg[s - 1])
                p = 0;
            pos[s] = p++;
            int same1 = s + 1 < S && seg[s + 1] == seg[s];
            int same2 = s + 2 < S && seg[s + 2] == seg[s];
            lab[s] = same1 ? tok[s + 1] : -1;
            mi[s] = same1 ? tok[s + 1] : 0;
            ml[s] = same2 ? tok[s + 2] : -1;
            nl += lab[s] >= 0;
            nm += ml[s] >= 0;
        }
    }
    b->n_labels = nl;
    b->n_mtp_labels = nm;
}

par_status par_batch_set(par_batch *b, const int32_t *tokens, const int32_t *segments, int64_t vocab,
                         const char *what)
{
    par_status st = par_batch_check(tokens, segments, b->B, b->S, vocab, what);
    if (st)
        return st;
    size_t n = (size_t)(b->B * b->S);
    memcpy(b->tokens, tokens, n * sizeof(int32_t));
    memcpy(b->segments, segments, n * sizeof(int32_t));
    par_batch_derive(b);
    return PAR_OK;
}

/* ---- plans ---- */

static par_status plan_alloc(par_pack_plan *p, int64_t B, int64_t S, int64_t n_samples)
{
    memset(p, 0, sizeof *p);
    p->B = B;
    p->S = S;
    p->n_samples = n_samples;
    p->row_off = par_calloc((size_t)(B + 1), sizeof(int64_t), PAR_TAG_ACT);
    p->lengths = par_calloc((size_t)(n_samples ? n_samples : 1), sizeof(int64_t), PAR_TAG_ACT);
    if (!p->row_off || !p->lengths) {
        par_pack_plan_free(p);
        return par_err(PAR_ENOMEM, "packing plan: no memory for %lld rows, %lld samples", (long long)B,
                       (long long)n_samples);
    }
    return PAR_OK;
}

void par_pack_plan_free(par_pack_plan *plan)
{
    if (!plan)
        return;
    par_free(plan->row_off);
    par_free(plan->lengths);
    memset(plan, 0, sizeof *plan);
}

par_status par_pack_plan_from_rows(par_pack_plan *plan, int64_t B, int64_t S, const int64_t *const *rows,
                                   const int64_t *counts)
{
    if (B < 1 || S < 1)
        return par_err(PAR_EINVAL, "packing plan: B = %lld and S = %lld must be >= 1", (long long)B, (long long)S);
    int64_t ns = 0;
    for (int64_t r = 0; r < B; r++) {
        int64_t sum = 0;
        for (int64_t k = 0; k < counts[r]; k++) {
            if (rows[r][k] < 1)
                return par_err(PAR_EINVAL, "packing plan: row %lld sample %lld has length %lld, must be >= 1",
                               (long long)r, (long long)k, (long long)rows[r][k]);
            sum += rows[r][k];
        }
        if (sum != S)
            return par_err(PAR_EINVAL, "packing plan: row %lld lengths sum to %lld, must be seq_length = %lld",
                           (long long)r, (long long)sum, (long long)S);
        ns += counts[r];
    }
    par_pack_plan p;
    par_status st = plan_alloc(&p, B, S, ns);
    if (st)
        return st;
    int64_t k = 0;
    for (int64_t r = 0; r < B; r++) {
        p.row_off[r] = k;
        for (int64_t j = 0; j < counts[r]; j++)
            p.lengths[k++] = rows[r][j];
    }
    p.row_off[B] = k;
    *plan = p;
    return PAR_OK;
}

par_status par_pack_plan_random(par_pack_plan *plan, int64_t B, int64_t S, uint64_t seed, int64_t first_row)
{
    if (B < 1 || S < 1 || first_row < 0)
        return par_err(PAR_EINVAL, "packing plan: B = %lld, S = %lld must be >= 1, first_row = %lld >= 0",
                       (long long)B, (long long)S, (long long)first_row);
    par_philox_key key = par_rng_key(seed, "pack");
    /* count first, then fill (the draws are pure functions) */
    int64_t ns = 0;
    for (int64_t r = 0; r < B; r++)
        for (int64_t left = S, k = 0; left > 0; k++) {
            int64_t len = 1 + (int64_t)par_rng_below(key, (uint64_t)(first_row + r), (uint32_t)k, (uint64_t)S);
            left -= len < left ? len : left;
            ns++;
        }
    par_pack_plan p;
    par_status st = plan_alloc(&p, B, S, ns);
    if (st)
        return st;
    int64_t i = 0;
    for (int64_t r = 0; r < B; r++) {
        p.row_off[r] = i;
        for (int64_t left = S, k = 0; left > 0; k++) {
            int64_t len = 1 + (int64_t)par_rng_below(key, (uint64_t)(first_row + r), (uint32_t)k, (uint64_t)S);
            if (len > left)
                len = left;
            p.lengths[i++] = len;
            left -= len;
        }
    }
    p.row_off[B] = i;
    *plan = p;
    return PAR_OK;
}

int32_t par_data_token(uint64_t seed, int64_t g, int64_t j, int64_t vocab)
{
    par_philox_key key = par_rng_key(seed, "tokens");
    return (int32_t)par_rng_below(key, (uint64_t)g, (uint32_t)j, (uint64_t)vocab);
}

par_status par_batch_fill(par_batch *b, const par_pack_plan *plan, uint64_t seed, int64_t cursor, int64_t vocab,
                          int64_t *next_cursor)
{
    if (b->B != plan->B || b->S != plan->S)
        return par_err(PAR_EMISMATCH, "batch fill: batch is %lld x %lld, plan is %lld x %lld", (long long)b->B,
                       (long long)b->S, (long long)plan->B, (long long)plan->S);
    if (vocab < 1 || vocab > INT32_MAX)
        return par_err(PAR_EINVAL, "batch fill: vocab_size = %lld outside [1, 2^31)", (long long)vocab);
    if (cursor < 0)
        return par_err(PAR_EINVAL, "batch fill: cursor = %lld must be >= 0", (long long)cursor);
    par_philox_key key = par_rng_key(seed, "tokens");
    int64_t g = cursor;
    for (int64_t r = 0; r < plan->B; r++) {
        int64_t s = 0;
        for (int64_t k = plan->row_off[r]; k < plan->row_off[r + 1]; k++, g++) {
            int32_t segi = (int32_t)(k - plan->row_off[r]);
            for (int64_t j = 0; j < plan->lengths[k]; j++, s++) {
                b->tokens[r * b->S + s] = (int32_t)par_rng_below(key, (uint64_t)g, (uint32_t)j, (uint64_t)vocab);
                b->segments[r * b->S + s] = segi;
            }
        }
        if (s != b->S)
            return par_err(PAR_EINVAL, "batch fill: plan row %lld covers %lld tokens, not S = %lld", (long long)r,
                           (long long)s, (long long)b->S);
    }
    par_batch_derive(b);
    if (next_cursor)
        *next_cursor = g;
    return PAR_OK;
}
