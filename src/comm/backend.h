/* comm/backend.h - the interface between src/comm and its backends.
 *
 * src/comm does everything generic: argument checks, the safety metadata of
 * every call, the deterministic (rank-order) reductions, group membership of
 * a split, in-process point-to-point mailboxes, waits with timeouts and the
 * world's failure state.  A backend only
 *   - launches the ranks of a world (threads, processes, ...),
 *   - creates the shared state of the world group and of split groups,
 *   - moves bytes in one primitive, `exchange`: a generalized all-to-all in
 *     which every rank gives, per peer, a byte range to send and a byte range
 *     to receive into (zero-length ranges move nothing).  The backend makes
 *     all members' call metadata meet first and checks it with
 *     par__check_metas / par__pair_mismatch before any byte moves.
 * Every collective of comm.h is one or two exchanges; barrier is an exchange
 * without bytes.  See docs/comm.md ("How to add a backend").
 */
#ifndef PAR_COMM_BACKEND_H
#define PAR_COMM_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

typedef struct par__world par__world;

/* ---- call metadata ------------------------------------------------------ */

typedef enum {
    PAR__OP_NONE = 0,
    PAR__OP_BARRIER,
    PAR__OP_BCAST,
    PAR__OP_ALLREDUCE,
    PAR__OP_REDUCE_SCATTER,
    PAR__OP_ALLGATHER,
    PAR__OP_ALLGATHERV,
    PAR__OP_ALLTOALL,
    PAR__OP_ALLTOALLV,
    PAR__OP_SPLIT,
    PAR__OP_SEND,
    PAR__OP_RECV,
    PAR__OP_COUNT
} par__op;

const char *par__op_name(par__op op);

/* What one rank calls; every field but `rank` (and `count` where the
 * collective allows per-rank counts, see par__check_metas) must agree over
 * the group. */
typedef struct {
    uint64_t group_id;   /* par_comm.id                                   */
    uint64_t seq;        /* collective number in this group, from 1       */
    uint64_t count;      /* elements (allgatherv: this rank's send count) */
    uint64_t shape;      /* hash of what else must agree: op, root, counts*/
    int32_t op;          /* par__op                                       */
    int32_t dtype;       /* par_ctype                                     */
    int32_t redop;       /* par_redop or -1                               */
    int32_t root;        /* bcast root or -1                              */
    int32_t phase;       /* exchange number within the collective (0, 1) */
    int32_t rank;        /* caller's rank in the group                    */
    /* The emulated network (src/comm/clock.c; 0 without one): the caller's
     * virtual clock when it arrived at this step and its modeled cost of the
     * step.  Not part of the agreement check; par__check_metas, which sees
     * every member's meta, derives the step's end from them.  A backend that
     * moves metas between processes must carry the whole struct. */
    double vclock;
    double vcost;
} par__callmeta;

/* One per-peer column of an exchange (an offset or a byte count for each
 * group rank j), given as a rule instead of a p-long array: a collective
 * over a group of p ranks then costs each rank O(1) bytes of description,
 * not 32 p (docs/comm.md "Exchange columns").  Read with par__col_at. */
typedef enum {
    PAR__COL_ZERO = 0,  /* 0 for every j (a zeroed column)                     */
    PAR__COL_CONST,     /* a                                                   */
    PAR__COL_STEP,      /* a * j                                               */
    PAR__COL_BLKOFF,    /* b * (d + offset of block j when a elements are cut
                         * into k near-equal blocks, the first a % k longer)   */
    PAR__COL_BLKLEN,    /* b * (length of that block j past its first d
                         * elements, at most w of them; w 0: no limit)         */
    PAR__COL_AT,        /* a at j == k, 0 elsewhere                            */
    PAR__COL_BUT,       /* a at j != k, 0 at k                                 */
    PAR__COL_ARRAY,     /* b * v[j]                                            */
} par__colkind;

typedef struct {
    par__colkind kind;
    int k;
    size_t a, b;
    const size_t *v;
    size_t d, w;        /* BLKOFF / BLKLEN: a window of the blocks (chunks) */
} par__col;

#define PAR__COL_C(n) ((par__col){.kind = PAR__COL_CONST, .a = (n)})
#define PAR__COL_S(n) ((par__col){.kind = PAR__COL_STEP, .a = (n)})
#define PAR__COL_AT1(j, n) ((par__col){.kind = PAR__COL_AT, .k = (j), .a = (n)})

static inline size_t par__col_at(const par__col *c, int j)
{
    size_t q, rem, uj = (size_t)j, len;
    switch (c->kind) {
    case PAR__COL_CONST: return c->a;
    case PAR__COL_STEP: return c->a * uj;
    case PAR__COL_BLKOFF:
        q = c->a / (size_t)c->k, rem = c->a % (size_t)c->k;
        return c->b * (c->d + uj * q + (uj < rem ? uj : rem));
    case PAR__COL_BLKLEN:
        len = c->a / (size_t)c->k + (uj < c->a % (size_t)c->k);
        len = len > c->d ? len - c->d : 0;
        return c->b * (c->w && len > c->w ? c->w : len);
    case PAR__COL_AT: return j == c->k ? c->a : 0;
    case PAR__COL_BUT: return j != c->k ? c->a : 0;
    case PAR__COL_ARRAY: return c->b * c->v[j];
    default: return 0;
    }
}

/* One exchange: per peer j (group rank), send sbytes(j) bytes at
 * sbase + soff(j) and receive rbytes(j) bytes at rbase + roff(j) (the
 * columns read with par__col_at; zeroed columns are all zero).  src/comm
 * guarantees a rank's receive ranges do not overlap its send ranges, except
 * that the range to itself may be the very same bytes (then nothing needs
 * copying). */
typedef struct {
    const char *sbase;
    par__col soff, sbytes;
    char *rbase;
    par__col roff, rbytes;
    /* 1: every member's byte columns follow from the agreed call metadata
     * alone (op, count, type, root, phase: the collectives without per-rank
     * counts), so once par__check_metas passed every pair agrees and an
     * in-process backend may skip the pair checks; the same on every member.
     * 0 (v-collectives, a split's plan): check every pair. */
    int fixed;
} par__xfer;

/* The group ranks j in [*lo, *hi) where column c may be nonzero (an AT
 * column: its one peer; zeroed: none; else all p). */
static inline void par__col_span(const par__col *c, int p, int *lo, int *hi)
{
    *lo = c->kind == PAR__COL_AT ? c->k : 0;
    *hi = c->kind == PAR__COL_AT ? c->k + 1 : c->kind == PAR__COL_ZERO ? 0 : p;
}

/* 1 when the exchange moves no bytes anywhere (both byte columns zeroed):
 * the same verdict on every member, whose metas agree. */
static inline int par__xfer_empty(const par__xfer *x)
{
    return x->sbytes.kind == PAR__COL_ZERO && x->rbytes.kind == PAR__COL_ZERO;
}

/* ---- handles ------------------------------------------------------------ */

struct par_comm {
    par__world *world;
    int rank, size;          /* in this group                              */
    int wrank;               /* this rank in the world                     */
    int *world_ranks;        /* [size] world rank of each member (the world's
                              * handles share one identity table)          */
    uint64_t id;             /* same on every member, derived from parents */
    uint64_t seq;            /* collectives called so far                  */
    uint64_t nsplit;         /* splits called so far                       */
    char name[64];
    void *bgroup;            /* the backend's state of this group          */
    struct par_comm *live_next, *live_prev;   /* per-rank list of handles  */
};

typedef enum { PAR__REQ_SEND = 0, PAR__REQ_RECV = 1 } par__reqkind;

struct par_request {
    par_comm *comm;
    uint64_t gid;            /* comm->id (kept: matching outlives no comm)  */
    par__reqkind kind;
    int peer;                /* group rank of the other side               */
    int peer_wrank, wrank;   /* world ranks of the other side and this one */
    int tag;
    par_ctype dtype;
    size_t count;
    void *buf;               /* const for sends                            */
    _Atomic int done;        /* 1 when complete (status set)               */
    par_status status;
    char msg[320];           /* failure message, raised by the waiter      */
    struct par_request *mb_next;               /* in a mailbox list         */
    struct par_request *live_next, *live_prev; /* per-rank list of requests */
    double first_test;       /* when par_test first saw it pending (0)     */
    void *bdata;             /* free for a backend's own p2p               */
    /* Virtual clocks (0 without an emulated network): vpost is this side's
     * clock when it posted (set before p2p_post); when the pair matches, each
     * side's vpeer must receive the other side's vpost.  A backend with its
     * own p2p sends the sender's vpost along with the data (8 bytes) and sets
     * the receive's vpeer before marking it done; the send's vpeer is unused. */
    double vpost;
    double vpeer;
};

/* ---- the backend -------------------------------------------------------- */

/* What src/comm runs on each rank's thread; backends call it from launch. */
typedef void (*par__rank_main)(par__world *w, int rank);

/* The members of a new group from a split, computed by src/comm on every
 * rank of the parent. */
typedef struct {
    int color;               /* < 0: this rank joins no group              */
    int key;
    int size, rank;          /* of the new group (0 when color < 0)        */
    const int *parent_ranks; /* [size] parent rank of each new member      */
    int leader;              /* lowest parent rank of the new group        */
} par__splitplan;

struct par_backend {
    const char *name;        /* "self", "threads", ...                     */
    const char *summary;     /* one line for listings                      */
    int max_ranks;           /* 0: no limit                                */

    /* Once per world, on the launching thread. */
    par_status (*world_init)(par__world *w, void **bworld);
    void (*world_finalize)(par__world *w, void *bworld);
    /* Runs main(w, r) on every rank r of the world and returns when all
     * have returned.  Fails only when ranks could not be started. */
    par_status (*launch)(par__world *w, void *bworld, par__rank_main main);

    /* On rank `rank`'s thread: its state of the world group. */
    par_status (*group_world)(par__world *w, void *bworld, int rank, void **bgroup);
    /* Collective over parent (every member calls it after src/comm made
     * the members' plans agree): sets *bgroup (NULL when plan->color < 0). */
    par_status (*group_split)(par_comm *parent, const par__splitplan *plan, void **bgroup);
    /* Releases this rank's reference (not collective). */
    void (*group_free)(par_comm *c, void *bgroup);

    /* The one data primitive (see above).  Returns PAR_EMISMATCH from the
     * checks, PAR_ETIMEOUT / PAR_ECOMM from waits. */
    par_status (*exchange)(par_comm *c, const par__callmeta *m, const par__xfer *x);

    /* Optional point-to-point between ranks that do not share an address
     * space (NULL: src/comm's in-process mailboxes, par__p2p_post).  post
     * starts r; poll makes progress and returns 1 once r->done is set;
     * cancel returns 1 if r was withdrawn unmatched. */
    void (*p2p_post)(par_request *r);
    int (*p2p_poll)(par_request *r);
    int (*p2p_cancel)(par_request *r);

    /* Optional, for backends whose ranks are not OS threads (fiber): how the
     * calling rank waits in src/comm's waits.  par__wait_poll calls it
     * instead of spinning, yielding or sleeping, with the wait's deadline;
     * it returns when the rank should look again (woken by whatever it waits
     * for, past the deadline, the world failed; early returns are fine).
     * deadline 0 (a par_test that found its request pending): let the other
     * ranks run, without sleeping.  Returns 1 when it waited, 0 when the
     * calling rank is an OS thread after all (a backend that hosts ranks
     * either way, mpi): then, as with NULL, comm spins, sched_yields, blocks. */
    int (*rank_wait)(par__world *w, double deadline);
    /* Optional, with rank_wait: wakes world rank `wrank` if this process
     * hosts it as a fiber that waits in rank_wait (par_comm_store_local's
     * wake of par_comm_wait_local; any thread; an early wake is fine). */
    void (*rank_wake)(par__world *w, void *bworld, int wrank);
    /* 1 when exchange copies every byte through par_dev_comm_copy (core/device.h:
     * ranks of one process sharing its device), so that a collective's buffers
     * may stay on the device in GPU mode (docs/gpu.md "Collectives on one
     * device"); 0: the backend moves host bytes (processes, the self backend). */
    int dev_copies;
};

/* ---- services of src/comm for backends ---------------------------------- */

int par__world_size(const par__world *w);
double par__world_timeout(const par__world *w);
/* The options the world was started with (backend options: workers,
 * stack_bytes). */
const par_world_opts *par__world_opts(const par__world *w);

/* The world's failure state: 0 while healthy, else the first failure's
 * status.  par__world_fail records the first one (rank, status, message) and
 * later calls do nothing. */
par_status par__world_failed(const par__world *w);
void par__world_fail(par__world *w, int wrank, par_status st, const char *msg);
/* Replaces the recorded first failure (the world must have failed): the
 * backend's agreement over processes on which failure came first. */
void par__world_set_first_failure(par__world *w, int wrank, par_status st, const char *msg);
/* The first failure recorded (rank, message), for a backend to share. */
void par__world_first_failure(par__world *w, int *wrank, char *msg, size_t n);
/* par_world_opts.fingerprint of the world (NULL: none). */
const char *par__world_fingerprint(const par__world *w);

/* Waiting: spin a little, then sched_yield, then block: through `block`
 * when the backend set one (e.g. a futex the waited-for event wakes), else
 * by sleeping 100 us at a time.  Ranks that outnumber the cores spin and
 * yield only briefly.  par__wait_poll returns PAR_OK to keep waiting,
 * PAR_ECOMM when the world failed (unless ignore_abort), PAR_ETIMEOUT past
 * the deadline.  block(ctx, s) may return early, spuriously or not. */
typedef struct {
    double start, deadline, yield_until;
    unsigned iter;
    unsigned spin;
    int ignore_abort;
    void (*block)(void *ctx, double max_s);
    void *block_ctx;
} par__waiter;
void par__wait_start(par__waiter *wt, const par__world *w, int ignore_abort);
par_status par__wait_poll(par__waiter *wt, const par__world *w);
double par__now(void);

/* Raises the error of a wait that returned `st` (PAR_ECOMM or PAR_ETIMEOUT)
 * in the calling rank: "rank R: timed out after S s waiting for WHAT;
 * missing: ..." and, for a timeout, marks the world failed.  `missing` lists
 * group ranks not arrived (may be NULL).  Returns the status to pass up. */
par_status par__wait_failed(par_comm *c, par_status st, const char *what, const int *missing,
                            int nmissing);

/* Describes a call "allreduce #3 of group world (f64 x 10, sum)". */
void par__meta_describe(const par__callmeta *m, const char *group, char *buf, size_t n);
/* Describes what world rank r does now ("in barrier #2 of group world",
 * "returned from its rank function with ok", ...). */
void par__rank_describe(par__world *w, int wrank, char *buf, size_t n);

/* Checks that the metas of all members agree; group rank r's meta is at
 * (const char *)metas + r * stride.  Every member sees the same metas, so all
 * reach the same verdict.  On disagreement returns PAR_EMISMATCH with a
 * message listing each rank's call (ranks with equal calls grouped) and marks
 * the world failed. */
par_status par__check_metas(par_comm *c, const par__callmeta *metas, size_t stride);
/* One pair of an exchange disagrees: group rank `from` sends `sent` bytes to
 * group rank `to`, which expects `expected`.  Raises PAR_EMISMATCH naming both
 * calls and marks the world failed. */
par_status par__pair_mismatch(par_comm *c, const par__callmeta *m, int from, int to, size_t sent,
                              size_t expected);

/* The emulated network's hooks (src/comm/clock.c) are called by src/comm
 * itself, not by backends: par__comm_account before every exchange step and
 * point-to-point post, and par__check_metas syncs the members' clocks.
 * Per-rank slot for the virtual clock (owned by clock.c). */
void *par__rank_clock(par_comm *c);
void par__rank_set_clock(par_comm *c, void *clock);

/* In-process mailboxes of point-to-point, used by backends whose ranks
 * share the address space (self, threads). */
void par__p2p_post(par_request *r);
/* Removes r from its mailbox if still unmatched; returns 1 if removed, 0 if
 * it was matched (then it is or will soon be done). */
int par__p2p_cancel(par_request *r);

#endif
