/* comm/p2p.c - point-to-point messages, requests and in-process mailboxes.
 *
 * Every rank has a mailbox with two lists: sends addressed to it that no
 * receive has matched yet (in arrival order) and receives it posted that no
 * send has matched yet (in posting order).  A new send scans the receiver's
 * posted receives, a new receive scans its unmatched sends, both under the
 * receiver's mailbox lock; the first match (same group, same sender, same tag)
 * wins, so messages between two ranks with one tag arrive in sending order.
 * The data moves once, from the send buffer to the receive buffer, under the
 * lock; then both requests are marked done.  A send completes only when it
 * is matched (synchronous send).
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/device.h"
#include "core/log.h"

static void describe_req(const par_request *r, char *buf, size_t n)
{
    snprintf(buf, n, "%s %s rank %d (world rank %d), tag %d, group %s (%s x %zu)",
             r->kind == PAR__REQ_SEND ? "send" : "recv", r->kind == PAR__REQ_SEND ? "to" : "from",
             r->peer, r->peer_wrank, r->tag, r->comm->name, par_ctype_name(r->dtype), r->count);
}

static int matches(const par_request *send, const par_request *recv)
{
    return send->gid == recv->gid && send->wrank == recv->peer_wrank && send->tag == recv->tag;
}

/* Under the receiver's mailbox lock; both requests are off every list. */
static void complete_pair(par_request *send, par_request *recv)
{
    par_status st = PAR_OK;
    if (send->count != recv->count || send->dtype != recv->dtype) {
        st = PAR_EMISMATCH;
        char msg[320];
        snprintf(msg, sizeof msg,
                 "message mismatch in group %s, tag %d: rank %d sends %s x %zu to rank %d, "
                 "which receives %s x %zu",
                 recv->comm->name, send->tag, recv->peer, par_ctype_name(send->dtype),
                 send->count, send->peer, par_ctype_name(recv->dtype), recv->count);
        memcpy(send->msg, msg, sizeof msg);
        memcpy(recv->msg, msg, sizeof msg);
    } else if (send->count) {
        /* device to device when both sides are there (ranks sharing one GPU) */
        par_dev_comm_copy(recv->buf, send->buf, send->count * par_ctype_size(send->dtype));
    }
    send->vpeer = recv->vpost; /* the virtual clocks of the two sides */
    recv->vpeer = send->vpost;
    send->status = st;
    recv->status = st;
    /* Last touches: a waiter may free its request as soon as it sees done. */
    atomic_store_explicit(&send->done, 1, memory_order_release);
    atomic_store_explicit(&recv->done, 1, memory_order_release);
}

static void append(par_request **head, par_request *r)
{
    r->mb_next = NULL;
    while (*head)
        head = &(*head)->mb_next;
    *head = r;
}

void par__p2p_post(par_request *r)
{
    par__world *w = r->comm->world;
    int send = r->kind == PAR__REQ_SEND;
    par__mailbox *mb = &w->mb[send ? r->peer_wrank : r->wrank];
    pthread_mutex_lock(&mb->mu);
    par_request **pp = send ? &mb->recvs : &mb->sends;
    while (*pp && !(send ? matches(r, *pp) : matches(*pp, r)))
        pp = &(*pp)->mb_next;
    if (*pp) {
        par_request *other = *pp;
        *pp = other->mb_next;
        other->mb_next = NULL;
        if (send)
            complete_pair(r, other);
        else
            complete_pair(other, r);
    } else {
        append(send ? &mb->sends : &mb->recvs, r);
    }
    pthread_mutex_unlock(&mb->mu);
}

int par__p2p_cancel(par_request *r)
{
    par__world *w = r->comm->world;
    int send = r->kind == PAR__REQ_SEND;
    par__mailbox *mb = &w->mb[send ? r->peer_wrank : r->wrank];
    int removed = 0;
    pthread_mutex_lock(&mb->mu);
    for (par_request **pp = send ? &mb->sends : &mb->recvs; *pp; pp = &(*pp)->mb_next) {
        if (*pp == r) {
            *pp = r->mb_next;
            removed = 1;
            break;
        }
    }
    pthread_mutex_unlock(&mb->mu);
    return removed;
}

static int be_cancel(par_request *r)
{
    const par_backend *be = r->comm->world->be;
    return be->p2p_cancel ? be->p2p_cancel(r) : par__p2p_cancel(r);
}

static int is_done(par_request *r)
{
    if (atomic_load_explicit(&r->done, memory_order_acquire))
        return 1;
    const par_backend *be = r->comm->world->be;
    return be->p2p_poll ? be->p2p_poll(r) : 0;
}

static void release(par_request *r)
{
    par__rankstate *rs = &r->comm->world->ranks[r->comm->wrank];
    if (r->live_prev)
        r->live_prev->live_next = r->live_next;
    else
        rs->reqs = r->live_next;
    if (r->live_next)
        r->live_next->live_prev = r->live_prev;
    par_free(r);
}

static par_status post(par_comm *c, par__reqkind kind, void *buf, size_t count, par_ctype t,
                       int peer, int tag, par_request **req)
{
    const char *what = kind == PAR__REQ_SEND ? "send" : "recv";
    if (!c || !req)
        return par_err(PAR_EINVAL, "%s: comm and request are required", what);
    par_status st = par__check_world(c, what);
    if (st != PAR_OK)
        return st;
    if (par_ctype_size(t) == 0)
        return par_err(PAR_EINVAL, "%s in group %s: invalid element type %d", what, c->name,
                       (int)t);
    if (peer < 0 || peer >= c->size)
        return par_err(PAR_EINVAL, "%s in group %s: rank %d is not one of its %d ranks", what,
                       c->name, peer, c->size);
    if (tag < 0)
        return par_err(PAR_EINVAL, "%s in group %s: tag %d must be >= 0", what, c->name, tag);
    if (!buf && count)
        return par_err(PAR_EINVAL, "%s in group %s: buffer is NULL with %zu elements", what,
                       c->name, count);
    par_request *r = par_calloc(1, sizeof *r, PAR_TAG_COMM);
    if (!r)
        return par_err(PAR_ENOMEM, "%s in group %s: no memory for a request", what, c->name);
    r->comm = c;
    r->gid = c->id;
    r->kind = kind;
    r->peer = peer;
    r->peer_wrank = c->world_ranks[peer];
    r->wrank = c->wrank;
    r->tag = tag;
    r->dtype = t;
    r->count = count;
    r->buf = buf;
    par__rankstate *rs = &c->world->ranks[c->wrank];
    r->live_next = rs->reqs;
    if (rs->reqs)
        rs->reqs->live_prev = r;
    rs->reqs = r;
    par__net_p2p_post(r);
    const par_backend *be = c->world->be;
    if (be->p2p_post)
        be->p2p_post(r);
    else
        par__p2p_post(r);
    *req = r;
    return PAR_OK;
}

par_status par_isend(par_comm *c, const void *buf, size_t count, par_ctype t, int dst, int tag,
                     par_request **req)
{
    return post(c, PAR__REQ_SEND, (void *)buf, count, t, dst, tag, req);
}

par_status par_irecv(par_comm *c, void *buf, size_t count, par_ctype t, int src, int tag,
                     par_request **req)
{
    return post(c, PAR__REQ_RECV, buf, count, t, src, tag, req);
}

/* A done request released (*req = NULL), its status raised in the calling
 * thread; clock: counts it on the emulated network (par__net_p2p_done). */
static par_status release_done(par_request **req, int clock)
{
    par_request *r = *req;
    par_status st = r->status;
    if (st != PAR_OK)
        par_err(st, "%s", r->msg);
    else if (clock)
        par__net_p2p_done(r);
    release(r);
    *req = NULL;
    return st;
}

static par_status finish(par_request **req) { return release_done(req, 1); }

par_status par_wait(par_request **req)
{
    if (!req || !*req)
        return PAR_OK;
    par_request *r = *req;
    if (is_done(r))
        return finish(req);
    par_comm *c = r->comm;
    par__callmeta m = {.group_id = c->id, .count = r->count,
                       .op = r->kind == PAR__REQ_SEND ? PAR__OP_SEND : PAR__OP_RECV,
                       .dtype = r->dtype, .redop = -1, .root = r->tag, .rank = c->rank};
    par__call_enter(c, &m, r->peer_wrank);
    par__waiter wt;
    par__wait_start(&wt, c->world, 0);
    par_status st = PAR_OK;
    while (!is_done(r)) {
        st = par__wait_poll(&wt, c->world);
        if (st != PAR_OK) {
            if (!be_cancel(r)) { /* matched meanwhile: done */
                while (!is_done(r))
                    ;
                st = PAR_OK;
                break;
            }
            char what[300];
            describe_req(r, what, sizeof what);
            int peer = r->peer;
            st = par__wait_failed(c, st, what, &peer, 1);
            release(r);
            *req = NULL;
            par__call_leave(c);
            return st;
        }
    }
    par__call_leave(c);
    return finish(req);
}

par_status par_waitall(size_t n, par_request **reqs)
{
    par_status first = PAR_OK;
    for (size_t i = 0; i < n; i++) {
        par_status st = par_wait(&reqs[i]);
        if (st != PAR_OK && first == PAR_OK)
            first = st;
    }
    return first;
}

par_status par_test(par_request **req, int *done)
{
    if (!done)
        return par_err(PAR_EINVAL, "par_test: done is required");
    *done = 1;
    if (!req || !*req)
        return PAR_OK;
    par_request *r = *req;
    if (is_done(r))
        return finish(req);
    par_comm *c = r->comm;
    par__world *w = c->world;
    double now = par__now();
    if (r->first_test == 0)
        r->first_test = now;
    par_status st = par__world_failed(w) ? PAR_ECOMM
                    : now - r->first_test > par__world_timeout(w) ? PAR_ETIMEOUT
                                                                  : PAR_OK;
    if (st == PAR_OK || !be_cancel(r)) {
        *done = 0;
        if (w->be->rank_wait) /* ranks are fibers: let the others run */
            (void)w->be->rank_wait(w, 0);
        return PAR_OK;
    }
    char what[300];
    describe_req(r, what, sizeof what);
    int peer = r->peer;
    st = par__wait_failed(c, st, what, &peer, 1);
    release(r);
    *req = NULL;
    return st;
}

par_status par_test_due(par_request **req, int *done)
{
    if (!done)
        return par_err(PAR_EINVAL, "par_test_due: done is required");
    if (!req || !*req) {
        *done = 1;
        return PAR_OK;
    }
    par_request *r = *req;
    if (!is_done(r) || (r->status == PAR_OK && !par__net_p2p_settle(r))) {
        *done = 0;
        return PAR_OK;
    }
    par_status st = release_done(req, 0); /* a due send was counted by par__net_p2p_settle */
    *done = st == PAR_OK;
    return st;
}

par_status par_send(par_comm *c, const void *buf, size_t count, par_ctype t, int dst, int tag)
{
    par_request *r = NULL;
    par_status st = par_isend(c, buf, count, t, dst, tag, &r);
    return st != PAR_OK ? st : par_wait(&r);
}

par_status par_recv(par_comm *c, void *buf, size_t count, par_ctype t, int src, int tag)
{
    par_request *r = NULL;
    par_status st = par_irecv(c, buf, count, t, src, tag, &r);
    return st != PAR_OK ? st : par_wait(&r);
}

void par__p2p_release_rank(par__world *w, int wrank)
{
    par__rankstate *rs = &w->ranks[wrank];
    int pending = 0;
    while (rs->reqs) {
        par_request *r = rs->reqs;
        if (!atomic_load(&r->done) && be_cancel(r))
            pending++;
        else
            while (!is_done(r))
                ;
        release(r);
    }
    if (pending)
        par_log(PAR_LOG_WARN, "rank %d returned with %d pending point-to-point requests; "
                              "cancelled them", wrank, pending);
}
