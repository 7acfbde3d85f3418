/* Point-to-point: rings with isend/irecv, blocking pairs, order of messages,
 * tags, self messages, empty messages, par_test, sub-groups. */
#include "comm_test.h"

static par_status ring_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    int right = (r + 1) % p, left = (r + p - 1) % p;
    for (size_t n = 0; n < 40; n += 13) {
        double *out = malloc(n * 8 + 8), *in = malloc(n * 8 + 8);
        for (size_t i = 0; i < n; i++)
            out[i] = r * 1000.0 + (double)i;
        par_request *rq[2];
        TRY(par_irecv(c, in, n, PAR_C_F64, left, 5, &rq[0]));
        TRY(par_isend(c, out, n, PAR_C_F64, right, 5, &rq[1]));
        TRY(par_waitall(2, rq));
        CHECK(rq[0] == NULL && rq[1] == NULL, "requests released");
        for (size_t i = 0; i < n; i++)
            CHECK(in[i] == left * 1000.0 + (double)i, "n=%zu element %zu", n, i);
        free(out), free(in);
    }
    /* blocking pairs: even ranks send first, odd receive first */
    if (p > 1 && !(p % 2 == 1 && r == p - 1)) {
        int peer = r ^ 1;
        int64_t mine = r, theirs = -1;
        if (r % 2 == 0) {
            TRY(par_send(c, &mine, 1, PAR_C_I64, peer, 1));
            TRY(par_recv(c, &theirs, 1, PAR_C_I64, peer, 1));
        } else {
            TRY(par_recv(c, &theirs, 1, PAR_C_I64, peer, 1));
            TRY(par_send(c, &mine, 1, PAR_C_I64, peer, 1));
        }
        CHECK(theirs == peer, "pair got %lld", (long long)theirs);
    }
    return PAR_OK;
}

Test(p2p, ring_and_pairs)
{
    RUN_ALL_WORLDS(ring_fn, NULL);
}

/* Rank 0 receives from every rank (itself too) five messages with tag 1 and
 * one with tag 2, taking tag 2 first: same-tag messages keep their order. */
static par_status order_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    int32_t msgs[6];
    par_request *sq[6];
    for (int k = 0; k < 5; k++) {
        msgs[k] = r * 100 + k;
        TRY(par_isend(c, &msgs[k], 1, PAR_C_I32, 0, 1, &sq[k]));
    }
    msgs[5] = -r;
    TRY(par_isend(c, &msgs[5], 1, PAR_C_I32, 0, 2, &sq[5]));
    if (r == 0) {
        for (int q = p - 1; q >= 0; q--) {
            int32_t v;
            TRY(par_recv(c, &v, 1, PAR_C_I32, q, 2));
            CHECK(v == -q, "tag 2 from %d: %d", q, v);
            for (int k = 0; k < 5; k++) {
                TRY(par_recv(c, &v, 1, PAR_C_I32, q, 1));
                CHECK(v == q * 100 + k, "from %d message %d: %d", q, k, v);
            }
        }
    }
    TRY(par_waitall(6, sq));
    /* empty message and par_test polling */
    if (p > 1) {
        par_request *rq = NULL;
        if (r == 1) {
            TRY(par_irecv(c, NULL, 0, PAR_C_BYTE, 0, 9, &rq));
            int done = 0, polls = 0;
            while (!done) {
                TRY(par_test(&rq, &done));
                polls++;
            }
            CHECK(rq == NULL, "test released the request");
        } else if (r == 0) {
            TRY(par_send(c, NULL, 0, PAR_C_BYTE, 1, 9));
        }
    }
    return PAR_OK;
}

Test(p2p, order_tags_self_empty_test)
{
    RUN_ALL_WORLDS(order_fn, NULL);
}

/* Messages in a sub-group use its ranks and do not match the parent's. */
static par_status group_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c);
    par_comm *half = NULL;
    TRY(par_comm_split(c, r % 2, r, &half));
    int hr = par_comm_rank(half), hp = par_comm_size(half);
    int32_t mine = r, got = -1, got_world = -1;
    par_request *rq[4];
    int nq = 0;
    /* same tag on both groups: each receive gets its own group's message */
    TRY(par_irecv(half, &got, 1, PAR_C_I32, (hr + hp - 1) % hp, 3, &rq[nq++]));
    TRY(par_irecv(c, &got_world, 1, PAR_C_I32, r, 3, &rq[nq++]));
    TRY(par_isend(c, &mine, 1, PAR_C_I32, r, 3, &rq[nq++]));
    TRY(par_isend(half, &mine, 1, PAR_C_I32, (hr + 1) % hp, 3, &rq[nq++]));
    TRY(par_waitall((size_t)nq, rq));
    CHECK(got == par_comm_world_rank(half, (hr + hp - 1) % hp), "group message from %d", got);
    CHECK(got_world == r, "world message %d", got_world);
    par_comm_free(half);
    return PAR_OK;
}

Test(p2p, sub_group_messages)
{
    RUN_ALL_WORLDS(group_fn, NULL);
}
