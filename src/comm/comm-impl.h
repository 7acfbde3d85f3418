/* comm/comm-impl.h - state shared by the files of src/comm (not backends). */
#ifndef PAR_COMM_COMM_IMPL_H
#define PAR_COMM_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm/backend.h"

typedef enum {
    PAR__RANK_IDLE = 0,      /* not started                       */
    PAR__RANK_RUNNING,
    PAR__RANK_RETURNED,
} par__rankstate_kind;

/* What one rank of this process is and does (read by other ranks' reports). */
typedef struct {
    pthread_mutex_t mu;
    par__rankstate_kind state;
    par_status ret;          /* fn's status once returned         */
    int in_call;             /* inside a comm call: `call` is set */
    par__callmeta call;
    char group[64];
    int peer_wrank;          /* p2p: world rank of the other side */
    void *clock;             /* virtual clock slot (next part)    */
    par_comm *comms;         /* live handles                      */
    par_request *reqs;       /* live requests                     */
} par__rankstate;

/* Unmatched messages addressed to one rank (in-process backends). */
typedef struct {
    pthread_mutex_t mu;
    par_request *sends;      /* sends to this rank, arrival order        */
    par_request *recvs;      /* receives this rank posted, posting order */
} par__mailbox;

struct par__world {
    const par_backend *be;
    void *bworld;
    int n;
    double timeout_s;
    unsigned spin;           /* pause iterations before yielding  */
    double yield_s;          /* seconds of yielding before blocking */
    par_world_fn fn;
    void *arg;
    par_world_opts opts;
    _Atomic int failed;      /* 0 or the first failure's status   */
    pthread_mutex_t fail_mu;
    int fail_rank;
    char fail_msg[768];
    par__rankstate *ranks;   /* [n] */
    par__mailbox *mb;        /* [n] */
    int *ident;              /* [n] 0..n-1: world_ranks of every rank's world handle */
};

/* comm.c: activity of the calling rank, for reports. */
void par__call_enter(par_comm *c, const par__callmeta *m, int peer_wrank);
void par__call_leave(par_comm *c);
/* Fails fast on a failed world: PAR_ECOMM (PAR_ETIMEOUT if the first
 * failure was a timeout) with a message naming the failed rank. */
par_status par__check_world(par_comm *c, const char *what);

/* group.c.  world_ranks NULL: the world's identity (w->ident, shared). */
par_status par__comm_new(par__world *w, int wrank, int rank, int size, const int *world_ranks,
                         uint64_t id, const char *name, void *bgroup, par_comm **out);
void par__comm_destroy(par_comm *c);

/* p2p.c: cancels and releases what a returning rank left behind. */
void par__p2p_release_rank(par__world *w, int wrank);

/* clock.c: the virtual clock (comm/clock.h), all no-ops on a world without
 * an emulated network (opts.net NULL). */
/* On rank r's thread, before fn / after fn returned. */
void par__net_rank_begin(par__world *w, int r);
void par__net_rank_end(par__world *w, int r);
/* Before an exchange step (x NULL: no bytes): charges the compute counted
 * since the last event, stamps m->vclock and m->vcost, counts the bytes. */
void par__comm_account(par_comm *c, par__callmeta *m, const par__xfer *x);
/* From par__check_metas once all members' metas agree: the step starts at
 * the latest arrival and costs the largest member cost. */
void par__clock_sync(par_comm *c, const par__callmeta *metas, size_t stride);
/* After the exchange step returned st: advances the clock to its end. */
void par__comm_settle(par_comm *c, const par__callmeta *m, par_status st);
/* p2p: before posting r (sets r->vpost), and when r completed successfully
 * (advances the clock to max(now, completion)). */
void par__net_p2p_post(par_request *r);
void par__net_p2p_done(par_request *r);
/* p2p: r completed successfully; when its virtual completion is not later
 * than the rank's clock now (nothing charged), counts it as
 * par__net_p2p_done would, which would not move the clock, and returns 1;
 * else 0 (1 without a network). */
int par__net_p2p_settle(par_request *r);

#endif
