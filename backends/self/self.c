/* backends/self/self.c - a world of one rank, run on the calling thread. */
#include <string.h>

#include "comm/backend.h"

static int self_group; /* the one group state; its address is the handle */

static par_status s_world_init(par__world *w, void **bworld)
{
    (void)w;
    *bworld = &self_group;
    return PAR_OK;
}

static void s_world_finalize(par__world *w, void *bworld) { (void)w, (void)bworld; }

static par_status s_launch(par__world *w, void *bworld, par__rank_main main_fn)
{
    (void)bworld;
    main_fn(w, 0);
    return PAR_OK;
}

static par_status s_group_world(par__world *w, void *bworld, int rank, void **bgroup)
{
    (void)w, (void)rank;
    *bgroup = bworld;
    return PAR_OK;
}

static par_status s_split(par_comm *parent, const par__splitplan *plan, void **bgroup)
{
    *bgroup = plan->color >= 0 ? parent->bgroup : NULL;
    return PAR_OK;
}

static void s_group_free(par_comm *c, void *bgroup) { (void)c, (void)bgroup; }

static par_status s_exchange(par_comm *c, const par__callmeta *m, const par__xfer *x)
{
    size_t sent = par__col_at(&x->sbytes, 0), want = par__col_at(&x->rbytes, 0);
    if (sent != want)
        return par__pair_mismatch(c, m, 0, 0, sent, want);
    if (want) {
        const char *src = x->sbase + par__col_at(&x->soff, 0);
        char *dst = x->rbase + par__col_at(&x->roff, 0);
        if (src != dst)
            memcpy(dst, src, want);
    }
    return PAR_OK;
}

const par_backend par_backend_self = {
    .name = "self",
    .summary = "one rank on the calling thread",
    .max_ranks = 1,
    .world_init = s_world_init,
    .world_finalize = s_world_finalize,
    .launch = s_launch,
    .group_world = s_group_world,
    .group_split = s_split,
    .group_free = s_group_free,
    .exchange = s_exchange,
};
