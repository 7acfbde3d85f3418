/* model/data.h - packed batches, packing plans, token streams, fixtures
 * (untemplated).  MODEL.md section 1.
 *
 * A batch is B rows of S tokens.  Rows hold whole samples back to back;
 * segments number the samples of a row 0,1,2,...  Derived per token t
 * (flat index r*S + s):
 *   pos[t]        position inside its sample (restarts at 0)
 *   labels[t]     token t+1 of the same sample, else -1
 *   mtp_inputs[t] token t+1 of the same sample, else 0
 *   mtp_labels[t] token t+2 of the same sample, else -1
 *
 * Synthetic data: token j of global sample g is
 *   par_rng_below(par_rng_key(seed, "tokens"), g, j, vocab_size),
 * and a step's batch takes global samples in order starting at a cursor
 * (the index of the next global sample), rows in order, samples of a row in
 * order.  Resuming at a cursor reproduces the stream.
 */
#ifndef PAR_MODEL_DATA_H
#define PAR_MODEL_DATA_H

#include <stdint.h>

#include "core/status.h"

typedef struct {
    int64_t B, S;
    int32_t *tokens;     /* [B*S] */
    int32_t *segments;   /* [B*S] */
    int32_t *pos;        /* [B*S] derived */
    int32_t *labels;     /* [B*S] derived, -1 = none */
    int32_t *mtp_inputs; /* [B*S] derived, 0 at a sample's last token */
    int32_t *mtp_labels; /* [B*S] derived, -1 = none */
    int64_t n_labels;     /* tokens with labels[t] >= 0      */
    int64_t n_mtp_labels; /* tokens with mtp_labels[t] >= 0  */
} par_batch;

/* Allocates a zeroed batch (tag PAR_TAG_ACT). */
par_status par_batch_alloc(par_batch *b, int64_t B, int64_t S);
void par_batch_free(par_batch *b);

/* Checks tokens/segments of R rows of S: per row, segments start at 0, are
 * non-decreasing and contiguous (step 0 or 1); tokens in [0, vocab).
 * PAR_EINVAL with a message naming the row and position (and `what`, e.g.
 * the file name, if not NULL). */
par_status par_batch_check(const int32_t *tokens,   /* [R*S] */
                           const int32_t *segments, /* [R*S] */
                           int64_t R, int64_t S, int64_t vocab, const char *what);

/* Computes pos, labels, mtp_inputs, mtp_labels, n_labels, n_mtp_labels from
 * tokens and segments (which must pass par_batch_check). */
void par_batch_derive(par_batch *b);

/* Copies R = b->B rows of tokens/segments in, checks them, derives. */
par_status par_batch_set(par_batch *b, const int32_t *tokens, const int32_t *segments, int64_t vocab,
                         const char *what);

/* ---- packing plans ---- */
typedef struct {
    int64_t B, S;
    int64_t n_samples;  /* total samples                         */
    int64_t *row_off;   /* [B+1]: row r holds lengths[row_off[r] .. row_off[r+1]) */
    int64_t *lengths;   /* [n_samples], each >= 1, a row's sum == S */
} par_pack_plan;

/* From explicit rows: rows[r] has counts[r] lengths.  Checks every length
 * >= 1 and each row's sum == S (message names the row). */
par_status par_pack_plan_from_rows(par_pack_plan *plan, int64_t B, int64_t S,
                                   const int64_t *const *rows, const int64_t *counts);
/* Random plan: row r (global row first_row + r) is packed greedily with
 * lengths drawn uniformly in [1, S] from (seed, "pack", global row, draw k);
 * a draw longer than what is left of the row is cut to fit. */
par_status par_pack_plan_random(par_pack_plan *plan, int64_t B, int64_t S, uint64_t seed,
                                int64_t first_row);
void par_pack_plan_free(par_pack_plan *plan);

/* Fills b (B, S must match the plan) with synthetic tokens of global samples
 * cursor, cursor+1, ... along the plan; derives; *next_cursor (if not NULL)
 * = cursor + plan->n_samples. */
par_status par_batch_fill(par_batch *b, const par_pack_plan *plan, uint64_t seed, int64_t cursor,
                          int64_t vocab, int64_t *next_cursor);

/* Token j of global sample g (the pure function above). */
int32_t par_data_token(uint64_t seed, int64_t g, int64_t j, int64_t vocab);

/* ---- boundary fixtures (JSON files in fixtures/) ----
 * {"name": ..., "description": ..., "seq_length": S, "window_size": W,
 *  "rows": [[len, len, ...], ...]}   every row sums to seq_length. */
typedef struct {
    char name[64];
    char description[256];
    int64_t seq_length;
    int64_t window_size;
    int64_t n_rows;
    int64_t *row_off; /* [n_rows+1] */
    int64_t *lengths; /* [row_off[n_rows]] */
} par_fixture;

par_status par_fixture_load(par_fixture *fx, const char *path);
/* Loads `name` (no ".json") from dir, or from $PARITY_FIXTURES_DIR, or
 * else par_data_dir("fixtures") (core/datadir.h: the source tree or the
 * installed data directory) when dir is NULL. */
par_status par_fixture_load_named(par_fixture *fx, const char *name, const char *dir);
void par_fixture_free(par_fixture *fx);
/* Plan of B rows: row r is fixture row r mod n_rows (rows repeat
 * cyclically; with more fixture rows than B the first B are used).
 * PAR_EMISMATCH if S != the fixture's seq_length. */
par_status par_fixture_plan(const par_fixture *fx, int64_t B, int64_t S, par_pack_plan *plan);

#endif
