/* backends/mpi/mpi.c - every rank an MPI process started by mpiexec, or, with
 * R ranks per process, R OpenMP thread ranks in each of the P processes
 * (world rank = process * R + thread).  See docs/comm.md ("MPI backend").
 *
 * Threading: MPI is initialized with MPI_THREAD_SERIALIZED.  Every MPI call
 * of a world's process is made under one mutex (the "engine" lock) by
 * whichever rank thread needs progress, and only non-blocking calls are
 * made (Isend/Irecv/Test/Iprobe/Cancel), so the lock is never held across a
 * wait and every wait polls with a deadline.
 *
 * Each world duplicates MPI_COMM_WORLD (MPI_Comm_idup, polled) and checks
 * that all processes ask the same world size.  Messages between processes:
 *   tag 1            control messages of the engine (below), any source;
 *   tag 2+2(sR+d)    exchange metadata from thread s to thread d;
 *   tag 3+2(sR+d)    exchange data from thread s to thread d;
 *   higher tags      point-to-point payloads, one tag per transfer.
 * Blocking collectives are called in the same order by every pair of ranks,
 * so one in-order channel per (sender thread, receiver thread, process
 * pair) carries every group's exchanges.
 *
 * An exchange on group rank `me`:
 *   1. local members (ranks of this process in the group) publish their
 *      metadata and transfer in shared slots (threads backend, tsync.h);
 *   2. metadata (call meta + the bytes for the pair, both ways) is sent to
 *      and received from every remote member; wait (abort-aware, deadline);
 *   3. local members arrive (tsync), so all of them hold all metadata;
 *   4. par__check_metas over all members: the same metas everywhere, the
 *      same verdict; then each pair is checked from both sides with the
 *      same numbers, so both sides of a pair agree to move it or not;
 *   5. data: remote pairs by Irecv/Isend, local pairs by one memcpy from the
 *      sender's buffer (as the threads backend);
 *   6. local members arrive again, so no buffer is reused while read.
 * Once both sides of a pair passed the checks they are committed: a send is
 * waited for even after the world failed (the receiver either takes it or,
 * when it gave up, drains it when its process ends the world), receives are
 * cancelled when the world failed.  A send that cannot complete within the
 * timeout after that is the one case that calls MPI_Abort.
 *
 * Point-to-point between processes is a rendezvous run by the engine:
 * the sender sends RTS (group, ranks, tag, type, count); the receiving
 * process matches it against posted receives in order (like comm's
 * mailboxes), posts the Irecv of the payload and answers CTS (or a mismatch:
 * both requests fail with PAR_EMISMATCH); the sender then sends the payload.
 * A send completes once its payload went to a matched receive (synchronous
 * semantics).  A send withdrawn before its CTS (timeout) sends CANCEL; if the
 * CTS crossed it, an empty payload tells the receiver the sender withdrew.
 * Pairs in one process use comm's in-process mailboxes.
 *
 * Failures cross processes as ABORT messages (rank, status, message): a
 * process whose world failed first sends one to every other process, whose
 * engine marks its world failed (par__world_fail), so their waits return
 * PAR_ECOMM / PAR_ETIMEOUT promptly.  When all ranks of a process returned,
 * it sends DONE (with its failure, if any) to every process and keeps
 * serving the engine (and draining messages nobody will receive) until it
 * has DONE from all: every process then returns the same verdict, and no
 * message is in flight when the communicator is freed.
 */
#include <errno.h>
#include <mpi.h>
#include <omp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/mpi/procs.h"
#include "backends/host/sched.h"
#include "backends/host/tsync.h"
#include "comm/backend.h"
#include "core/alloc.h"
#include "core/log.h"

#define TAG_CTRL 1
#define TAG_CHAN0 2
#define P2P_TAGS 4096 /* payload tags in rotation */

/* ---- MPI itself --------------------------------------------------------- */

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_provided = -1;   /* thread level MPI gave            */
static int g_broken;          /* an MPI operation was left pending */
static _Atomic int g_peer_gone; /* a process died or never finished: no MPI_Finalize */
static int g_multi_host;       /* hydra's MPI_LOCALNRANKS < PMI_SIZE: no MPI_Finalize */
static par_status wait_start_req(MPI_Request *req, double deadline, const char *what);

/* Hydra (mpiexec -disable-auto-cleanup) tells the survivors of a dead
 * process with SIGUSR1, whose default action would kill them before they
 * report: the watchdog finds the dead process itself. */
static void on_sigusr1(int sig) { (void)sig; }

/* MPICH 4.0.2 installs its own handler, which makes the next progress call
 * ask hydra for the failed processes (MPIR_pmi_get_failed_procs, a blocking
 * PMI read, whose answer it then drops): when the network to mpiexec is down
 * (a node's link lost), that read never returns, and the watchdog, holding
 * the engine lock, blocked every rank of the process (the cluster tier's
 * linkdown scenario: one survivor of three left running).  So parity's
 * handler replaces MPI's, unless the program had its own before MPI_Init
 * (before: the disposition then, read by par_mpi_procs; SIG_IGN, as under a
 * wrapper shell that ignores hydra's notices, is not a handler). */
static void keep_sigusr1(const struct sigaction *before)
{
    if ((before->sa_flags & SA_SIGINFO) || (before->sa_handler != SIG_DFL && before->sa_handler != SIG_IGN))
        return; /* the program handles it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

/* One PMI-1 command on hydra's socket (PMI_FD, the text protocol MPICH's
 * own PMI client speaks there: "cmd=barrier_in" / "cmd=barrier_out",
 * "cmd=finalize" / "cmd=finalize_ack") and its answer, awaited until the
 * deadline while MPI keeps progressing (a peer may still need this
 * process's UCX progress for the last bytes of the MPI barrier); 0 when the
 * expected answer came. */
static int pmi_say(int fd, const char *cmd, const char *answer, double deadline)
{
    size_t n = strlen(cmd), done = 0, got = 0;
    while (done < n) {
        ssize_t w = write(fd, cmd + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    char buf[256];
    while (par__now() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int flag = 0, r = poll(&p, 1, 1);
        if (r == 0 || (r < 0 && errno == EINTR)) {
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE); /* progress */
            continue;
        }
        ssize_t k = r < 0 ? -1 : read(fd, buf + got, sizeof buf - 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        got += (size_t)k;
        buf[got] = 0;
        if (strchr(buf, '\n'))
            return strncmp(buf, answer, strlen(answer)) ? -1 : 0;
        if (got == sizeof buf - 1)
            return -1;
    }
    return -1;
}

/* The processes of a job on several hosts end without MPI_Finalize, after a
 * barrier (polled, a minute at most).  MPICH 4.0.2's MPI_Finalize closes
 * every UCX endpoint and then waits in PMI's barrier, where it no longer
 * progresses UCX; a process whose endpoint close (a TCP one) needs that
 * peer's progress spun in MPI_Finalize for ever, and the others waited for it
 * in the barrier: measured on the cluster tier (network namespaces,
 * UCX_TLS=tcp,self), 6 of 10 runs of a 4-process MPI program with one
 * 512 KiB MPI_Allreduce before MPI_Finalize hung, and every parity run of
 * tools/cluster-tier.sh.  MPICH 4.2 drops that barrier (pmodels/mpich#6596).
 * After the MPI barrier no process sends anything.  Then PMI's barrier and
 * PMI's finalize, said here on hydra's socket as MPI_Finalize would: hydra's
 * proxy kills every other process of its host when one closes that socket
 * without finalize (and counts that one as failed, exit status 1), so the
 * first process to exit killed a peer still waiting for the MPI barrier's
 * last message or still ending (the cluster tier: 1 of 10 bitwise
 * runs "BAD TERMINATION", 1 of 10 resume runs exit 255, and 2 of 2 runs
 * under 100 ms delay; tests/comm/mpi_leave.sh: the slow processes were
 * killed and mpiexec still said 0).  PMI's barrier: no process exits before
 * every process is past the MPI barrier; then finalize.  Without hydra's
 * PMI_FD (another launcher) the process leaves after the MPI barrier. */
static void end_without_finalize(void)
{
    MPI_Request req;
    double deadline = par__now() + 60;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS ||
        wait_start_req(&req, deadline, "waiting for every process at the end (MPI_Ibarrier)") != PAR_OK)
        return;
    const char *s = getenv("PMI_FD");
    char *end = NULL;
    long fd = s ? strtol(s, &end, 10) : -1;
    if (!s || !*s || *end || fd < 0 || fd > 1 << 20)
        return;
    if (pmi_say((int)fd, "cmd=barrier_in\n", "cmd=barrier_out", deadline) == 0)
        (void)pmi_say((int)fd, "cmd=finalize\n", "cmd=finalize_ack", deadline);
}

static void mpi_at_exit(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin)
        return;
    /* MPI_Finalize waits for every process, so a dead one would hang it, and
     * MPI_Abort would kill the survivors before they report: exit as is. */
    if (atomic_load(&g_peer_gone))
        return;
    if (g_broken)
        MPI_Abort(MPI_COMM_WORLD, 1);
    else if (g_multi_host)
        end_without_finalize();
    else
        MPI_Finalize();
}

/* UCX's transports for parity's MPI worlds, unless the user chose them
 * (UCX_TLS; UCX_TLS=all is UCX's own default).  UCX reads its environment
 * in MPI_Init, so this runs before it.
 *  - Off cross-memory attach (UCX_TLS=^cma): when the peer of a CMA transfer
 *    dies (process_vm_readv/writev on its memory), UCX ends this process
 *    from inside MPI_Test (ucs_fatal_error_message in uct_cma_ep_tx,
 *    SIGABRT) before the watchdog can report.
 *  - No rendezvous lanes (UCX_MAX_RNDV_LANES=0) when every process runs on
 *    this host (hydra's MPI_LOCALNRANKS = PMI_SIZE): without CMA, UCX would
 *    move large messages between them over TCP loopback, whose connections
 *    held MPI_Finalize when the processes were slow; large messages then
 *    take the shared-memory transport of the small ones.
 * See docs/comm.md ("A process dies"). */
static void ucx_transports(void)
{
    const char *local = getenv("MPI_LOCALNRANKS"), *size = getenv("PMI_SIZE");
    g_multi_host = local && size && atoi(local) < atoi(size);
    if (getenv("UCX_TLS"))
        return;
    setenv("UCX_TLS", "^cma", 0);
    if (local && size && !strcmp(local, size))
        setenv("UCX_MAX_RNDV_LANES", "0", 0);
}

par_status par_mpi_procs(int *nprocs, int *proc)
{
    par_status st = PAR_OK;
    pthread_mutex_lock(&g_init_mu);
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) {
        st = par_err(PAR_EUNSUPPORTED, "mpi: MPI was already finalized in this process");
        goto done;
    }
    if (!inited) {
        int prov = 0;
        struct sigaction usr1;
        sigaction(SIGUSR1, NULL, &usr1);
        ucx_transports();
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS) {
            st = par_err(PAR_ECOMM, "mpi: MPI_Init_thread failed");
            goto done;
        }
        atexit(mpi_at_exit);
        /* a failed peer must not abort this process from inside MPI: calls
         * return errors and the engine's liveness checks report it */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        keep_sigusr1(&usr1);
    }
    if (g_provided < 0)
        MPI_Query_thread(&g_provided);
    int n = 1, r = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    if (nprocs)
        *nprocs = n;
    if (proc)
        *proc = r;
done:
    pthread_mutex_unlock(&g_init_mu);
    return st;
}

/* The last resort: a pending operation cannot complete and cannot be
 * withdrawn. */
static void last_resort(const char *msg)
{
    par_log(PAR_LOG_ERROR, "mpi: %s; aborting the MPI job", msg);
    fprintf(stderr, "parity: mpi: %s; aborting the MPI job\n", msg); /* past any log sink */
    MPI_Abort(MPI_COMM_WORLD, 3);
}

/* ---- the engine: one per world and process ------------------------------ */

enum { CT_RTS = 1, CT_CTS, CT_CANCEL, CT_ABORT, CT_DONE, CT_HEARTBEAT };

/* Liveness (docs/comm.md "A process dies"): a watchdog thread per process
 * sends a heartbeat to every other process every HB_EVERY seconds and
 * declares one dead when its pid is gone (same host) or nothing came from
 * it for DEAD_AFTER seconds. */
#define HB_EVERY 0.5
#define DEAD_AFTER 6.0
#define GONE_GRACE 0.3 /* a gone pid counts after this long without its DONE */
#define WATCH_EVERY_NS 100000000L

typedef struct {
    int32_t kind;
    int32_t src_wrank, dst_wrank; /* RTS, CANCEL: sender and receiver; ABORT/DONE: rank */
    int32_t tag;                  /* RTS: the user's tag                               */
    int32_t dtype;                /* RTS: sender's type; CTS: receiver's              */
    int32_t status;               /* CTS, ABORT, DONE                                  */
    int32_t data_tag;             /* CTS: payload tag, -1 for none                     */
    int32_t pad;
    uint64_t count;               /* RTS: sender's count; CTS: receiver's              */
    uint64_t gid;
    uint64_t id;                  /* the send's id at its process                      */
    double vclock;                /* RTS: the sender's virtual clock at post (vpost)   */
    char msg[640];                /* ABORT, DONE: the failure                          */
} ctrlmsg;
#define CTRL_HDR offsetof(ctrlmsg, msg)

typedef enum { OP_POSTED = 0, OP_WAIT_CTS, OP_DATA } opstate;

/* A point-to-point request with a peer in another process. */
typedef struct mop {
    struct mop *next;
    par_request *r;   /* NULL: the send was withdrawn                      */
    opstate state;
    int is_send;
    int proc;         /* the other process                                 */
    uint64_t id;      /* sends: our id                                      */
    size_t bytes;     /* receives in OP_DATA: expected                     */
    MPI_Request req;
} mop;

typedef struct unexp {
    struct unexp *next;
    int proc;
    ctrlmsg rts;      /* header only */
} unexp;

/* Sends the engine owns (control messages, requests of failed calls). */
typedef struct outmsg {
    struct outmsg *next;
    MPI_Request req;
    int proc;         /* destination process                 */
    char data[];      /* copy of a control message, if any */
} outmsg;

typedef struct grave {
    struct grave *next;
    void *block;      /* buffer of an orphaned send, freed at the end */
} grave;

/* MPI requests a rank waits for: rq[0..nrecv) are receives, the rest sends;
 * rq[i] goes to or comes from process proc[i % pmod].  A parked fiber's
 * wait is in mworld.reg, where the poll hook tests it (from `next` on). */
typedef struct {
    MPI_Request *rq;  /* [n]; NULL: no wait */
    int n, nrecv, pmod;
    const int *proc;
    int next;         /* the poll hook's cursor: rq[0..next) completed */
} mreqs;

typedef struct {
    par__world *w;
    MPI_Comm comm;
    int nprocs, proc, R, n;
    int p2p_tag0;
    pthread_mutex_t mu;
    _Atomic int notified;   /* this process's failure was sent, or came from elsewhere */
    double fail_seen;       /* when progress first saw an unsent local failure        */
    int fail_wrank;
    par_status fail_st;
    char fail_msg[640];
    uint64_t next_id;
    unsigned next_dtag;
    mop *ops;               /* sends waiting for CTS or sending, receives receiving */
    mop *posted;            /* receives not matched yet, posting order              */
    unexp *unexp;           /* RTS not matched yet, arrival order                   */
    outmsg *out;
    grave *graves;
    int ndone;              /* DONE messages received                               */
    unsigned char *proc_done; /* [nprocs] the process sent DONE                     */
    unsigned char *skip;    /* [nprocs] scratch: processes a notice need not reach   */
    /* the first failure each process reported in its DONE (this one's own
     * included): every process picks the same one (e_agree_failure) */
    int32_t *rep_rank;      /* [nprocs]                                              */
    int32_t *rep_st;        /* [nprocs] 0: no failure                                */
    char (*rep_msg)[640];   /* [nprocs]                                              */
    char *trash;            /* drained payloads                                     */
    size_t trash_n;
    ctrlmsg rx;
    tgroup *wgroup;         /* slots of this process's ranks in the world (R > 1)   */
    /* fiber-hosted ranks (R > 1, rank host fiber; NULL: OS threads) */
    fsched *fs;
    mreqs *reg;             /* [R] (under mu) what each parked fiber waits for      */
    int nreg;               /* entries of reg in use                                */
    _Atomic uint64_t completions; /* point-to-point requests completed            */
    _Atomic int wd_want;    /* the watchdog waits for mu: the ranks let it have it first */
    /* liveness: under mu but ndead (read anywhere) */
    long *pids;             /* [nprocs] each process's pid                           */
    char (*hosts)[64];      /* [nprocs] each process's host name (for the reports)   */
    unsigned char *same_host; /* [nprocs] on this host (its pid can be checked)      */
    double *heard;          /* [nprocs] when anything last came from it             */
    double *hb_sent;        /* [nprocs] when our last heartbeat went to it          */
    double *gone_since;     /* [nprocs] when its pid was first seen gone (0: not)    */
    unsigned char *dead;    /* [nprocs]                                              */
    _Atomic int ndead;
    pthread_t watchdog;
    int watchdog_on;
    _Atomic int watchdog_stop;
} mworld;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Backoff between polls: the world's spin / yield budget, then 100 us naps. */
static void backoff(par__waiter *wt)
{
    if (++wt->iter <= wt->spin) {
        cpu_relax();
    } else if (par__now() < wt->yield_until) {
        sched_yield();
    } else {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

/* The engine lock, taken by a rank: the watchdog first when it waits (a
 * process's fibers would retake the lock from one thread at once, and the
 * starved watchdog's heartbeats stop: its peers declare it dead). */
static void e_lock(mworld *e)
{
    while (atomic_load_explicit(&e->wd_want, memory_order_relaxed))
        sched_yield();
    pthread_mutex_lock(&e->mu);
}

/* Engine sends: the message is copied; the copy lives until the send is done. */
static void e_send_ctrl(mworld *e, int proc, const ctrlmsg *m)
{
    size_t len = CTRL_HDR;
    if (m->kind == CT_ABORT || m->kind == CT_DONE)
        len += strnlen(m->msg, sizeof m->msg - 1) + 1;
    if (e->dead && e->dead[proc])
        return; /* nobody there */
    outmsg *o = par_malloc(sizeof *o + len, PAR_TAG_COMM);
    if (!o) { /* small and eager: a blocking send does not wait for the peer */
        MPI_Send(m, (int)len, MPI_BYTE, proc, TAG_CTRL, e->comm);
        return;
    }
    o->proc = proc;
    memcpy(o->data, m, len);
    MPI_Isend(o->data, (int)len, MPI_BYTE, proc, TAG_CTRL, e->comm, &o->req);
    o->next = e->out;
    e->out = o;
}

static void e_orphan(mworld *e, MPI_Request *req, int proc)
{
    if (e->dead && e->dead[proc]) { /* nobody will take it */
        MPI_Cancel(req);
        MPI_Request_free(req);
        return;
    }
    outmsg *o = par_malloc(sizeof *o, PAR_TAG_COMM);
    if (!o) {
        g_broken = 1; /* lost track of it: no clean finalize */
        MPI_Request_free(req);
        return;
    }
    o->proc = proc;
    o->req = *req;
    *req = MPI_REQUEST_NULL;
    o->next = e->out;
    e->out = o;
}

static void e_bury(mworld *e, void *block)
{
    grave *g = par_malloc(sizeof *g, PAR_TAG_COMM);
    if (!g) {
        g_broken = 1;
        return; /* leak rather than free memory MPI may still read */
    }
    g->block = block;
    g->next = e->graves;
    e->graves = g;
}

/* Completes a request: the last touch of r (its waiter may free it), then
 * wakes its rank when that is a fiber (parked in par_wait, or about to). */
static void req_complete(mworld *e, par_request *r, par_status st, const char *msg)
{
    int owner = r->wrank - e->proc * e->R;
    r->bdata = NULL;
    r->status = st;
    if (st != PAR_OK)
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    atomic_store_explicit(&r->done, 1, memory_order_release);
    atomic_fetch_add_explicit(&e->completions, 1, memory_order_relaxed);
    if (e->fs)
        fsched_wake(e->fs, owner);
}

static void mismatch_msg(char *buf, size_t n, const par_request *r, int32_t other_dtype,
                         uint64_t other_count)
{
    /* sender's view: r is the send; receiver's: r is the receive */
    int send = r->kind == PAR__REQ_SEND;
    snprintf(buf, n,
             "message mismatch in group %s, tag %d: rank %d sends %s x %zu to rank %d, which "
             "receives %s x %zu",
             r->comm->name, r->tag, send ? r->comm->rank : r->peer,
             par_ctype_name(send ? r->dtype : (par_ctype)other_dtype),
             send ? r->count : (size_t)other_count, send ? r->peer : r->comm->rank,
             par_ctype_name(send ? (par_ctype)other_dtype : r->dtype),
             send ? (size_t)other_count : r->count);
}

/* A receive (op, not on any list) meets the RTS of its sender. */
static void e_match(mworld *e, mop *op, const ctrlmsg *rts, int proc)
{
    par_request *r = op->r;
    r->vpeer = rts->vclock; /* the emulated clock's receive needs the send's post time */
    ctrlmsg cts = {.kind = CT_CTS, .id = rts->id, .dtype = (int32_t)r->dtype,
                   .count = r->count, .data_tag = -1, .src_wrank = rts->src_wrank,
                   .dst_wrank = rts->dst_wrank};
    if (rts->count != r->count || rts->dtype != (int32_t)r->dtype) {
        char msg[320];
        mismatch_msg(msg, sizeof msg, r, rts->dtype, rts->count);
        cts.status = PAR_EMISMATCH;
        e_send_ctrl(e, proc, &cts);
        req_complete(e, r, PAR_EMISMATCH, msg);
        par_free(op);
        return;
    }
    size_t bytes = r->count * par_ctype_size(r->dtype);
    if (bytes == 0) {
        e_send_ctrl(e, proc, &cts);
        req_complete(e, r, PAR_OK, NULL);
        par_free(op);
        return;
    }
    cts.data_tag = e->p2p_tag0 + (int)(e->next_dtag++ % P2P_TAGS);
    MPI_Irecv_c(r->buf, (MPI_Count)bytes, MPI_BYTE, proc, cts.data_tag, e->comm, &op->req);
    op->state = OP_DATA;
    op->proc = proc;
    op->bytes = bytes;
    op->next = e->ops;
    e->ops = op;
    e_send_ctrl(e, proc, &cts);
}

static void e_remote_failure(mworld *e, const ctrlmsg *m)
{
    atomic_store(&e->notified, 1);
    if (!e->fail_msg[0]) {
        e->fail_wrank = m->src_wrank;
        e->fail_st = m->status;
        snprintf(e->fail_msg, sizeof e->fail_msg, "%s", m->msg);
    }
    par__world_fail(e->w, m->src_wrank, m->status, m->msg);
}

static void e_handle(mworld *e, ctrlmsg *m, int proc)
{
    switch (m->kind) {
    case CT_RTS: {
        mop **pp = &e->posted;
        while (*pp) {
            par_request *r = (*pp)->r;
            if (r->wrank == m->dst_wrank && r->peer_wrank == m->src_wrank && r->gid == m->gid &&
                r->tag == m->tag)
                break;
            pp = &(*pp)->next;
        }
        if (*pp) {
            mop *op = *pp;
            *pp = op->next;
            e_match(e, op, m, proc);
            return;
        }
        unexp *u = par_malloc(sizeof *u, PAR_TAG_COMM);
        if (!u) { /* refuse: the sender fails with a clear reason */
            ctrlmsg cts = {.kind = CT_CTS, .id = m->id, .status = PAR_ENOMEM, .data_tag = -1};
            e_send_ctrl(e, proc, &cts);
            return;
        }
        u->proc = proc;
        memcpy(&u->rts, m, CTRL_HDR);
        u->next = NULL;
        unexp **tail = &e->unexp;
        while (*tail)
            tail = &(*tail)->next;
        *tail = u;
        return;
    }
    case CT_CTS: {
        mop **pp = &e->ops;
        while (*pp && !((*pp)->is_send && (*pp)->id == m->id && (*pp)->proc == proc))
            pp = &(*pp)->next;
        if (!*pp)
            return;
        mop *op = *pp;
        par_request *r = op->r;
        if (!r || m->status != PAR_OK || m->data_tag < 0) {
            *pp = op->next;
            if (!r) {
                if (m->data_tag >= 0) { /* tell the matched receiver we withdrew */
                    MPI_Request q;
                    MPI_Isend(NULL, 0, MPI_BYTE, proc, m->data_tag, e->comm, &q);
                    e_orphan(e, &q, proc);
                }
            } else if (m->status == PAR_EMISMATCH) {
                char msg[320];
                mismatch_msg(msg, sizeof msg, r, m->dtype, m->count);
                req_complete(e, r, PAR_EMISMATCH, msg);
            } else if (m->status != PAR_OK) {
                char msg[320];
                snprintf(msg, sizeof msg, "send to world rank %d, tag %d: its process refused "
                         "the message (%s)", r->peer_wrank, r->tag, par_status_str(m->status));
                req_complete(e, r, m->status, msg);
            } else {
                req_complete(e, r, PAR_OK, NULL);
            }
            par_free(op);
            return;
        }
        MPI_Isend_c(r->buf, (MPI_Count)(r->count * par_ctype_size(r->dtype)), MPI_BYTE, proc,
                    m->data_tag, e->comm, &op->req);
        op->state = OP_DATA;
        return;
    }
    case CT_CANCEL:
        for (unexp **pp = &e->unexp; *pp; pp = &(*pp)->next) {
            if ((*pp)->proc == proc && (*pp)->rts.id == m->id) {
                unexp *u = *pp;
                *pp = u->next;
                par_free(u);
                return;
            }
        }
        return; /* already matched: the CTS crossed the cancel */
    case CT_ABORT: e_remote_failure(e, m); return;
    case CT_HEARTBEAT: return; /* e_progress noted when it came */
    case CT_DONE:
        /* Its failure was sent as ABORT or seen by everyone concerned; while
         * our ranks run it is kept (a mismatch every member detects itself
         * must not preempt the ranks that are about to report it), and
         * applied when they returned (e_finish). */
        e->ndone++;
        e->proc_done[proc] = 1;
        e->rep_st[proc] = m->status;
        e->rep_rank[proc] = m->src_wrank;
        snprintf(e->rep_msg[proc], sizeof e->rep_msg[proc], "%s", m->msg);
        return;
    default: return;
    }
}

/* Under e->mu: control messages, payloads, engine sends.  With drain set
 * (the world is ending) messages of any other tag are received and dropped. */
static void e_progress(mworld *e, int drain)
{
    for (int k = 0; k < 64; k++) {
        int flag = 0;
        MPI_Status s;
        MPI_Iprobe(MPI_ANY_SOURCE, drain ? MPI_ANY_TAG : TAG_CTRL, e->comm, &flag, &s);
        if (!flag)
            break;
        if (e->heard && s.MPI_SOURCE >= 0 && s.MPI_SOURCE < e->nprocs)
            e->heard[s.MPI_SOURCE] = par__now();
        if (s.MPI_TAG == TAG_CTRL) {
            memset(&e->rx, 0, CTRL_HDR + 1);
            MPI_Recv(&e->rx, (int)sizeof e->rx, MPI_BYTE, s.MPI_SOURCE, TAG_CTRL, e->comm,
                     MPI_STATUS_IGNORE);
            e->rx.msg[sizeof e->rx.msg - 1] = '\0';
            e_handle(e, &e->rx, s.MPI_SOURCE);
            continue;
        }
        MPI_Count n = 0;
        MPI_Get_count_c(&s, MPI_BYTE, &n);
        if ((size_t)n > e->trash_n) {
            char *t = par_realloc(e->trash, (size_t)n, PAR_TAG_COMM);
            if (!t)
                last_resort("no memory to drain a message at the end of a failed world");
            e->trash = t;
            e->trash_n = (size_t)n;
        }
        MPI_Recv_c(e->trash, n, MPI_BYTE, s.MPI_SOURCE, s.MPI_TAG, e->comm, MPI_STATUS_IGNORE);
    }
    for (mop **pp = &e->ops; *pp;) {
        mop *op = *pp;
        int flag = 0;
        MPI_Status s;
        if (op->state == OP_DATA)
            MPI_Test(&op->req, &flag, &s);
        if (!flag) {
            pp = &op->next;
            continue;
        }
        *pp = op->next;
        if (op->is_send) {
            req_complete(e, op->r, PAR_OK, NULL);
        } else {
            MPI_Count got = 0;
            MPI_Get_count_c(&s, MPI_BYTE, &got);
            par_request *r = op->r;
            if ((size_t)got == op->bytes) {
                req_complete(e, r, PAR_OK, NULL);
            } else {
                char msg[320];
                snprintf(msg, sizeof msg,
                         "recv from rank %d (world rank %d), tag %d, group %s: the sender "
                         "withdrew its send (it stopped waiting) after this receive matched it",
                         r->peer, r->peer_wrank, r->tag, r->comm->name);
                req_complete(e, r, PAR_ECOMM, msg);
            }
        }
        par_free(op);
    }
    for (outmsg **pp = &e->out; *pp;) {
        int flag = 0;
        MPI_Test(&(*pp)->req, &flag, MPI_STATUS_IGNORE);
        if (flag) {
            outmsg *o = *pp;
            *pp = o->next;
            par_free(o);
        } else {
            pp = &(*pp)->next;
        }
    }
}

/* Sends this process's failure to every other process (but those in
 * skip[], when given), once. */
static void e_notify_locked(mworld *e, int wrank, const char *msg, const unsigned char *skip)
{
    if (atomic_exchange(&e->notified, 1))
        return;
    par_status st = par__world_failed(e->w);
    ctrlmsg m = {.kind = CT_ABORT, .src_wrank = wrank, .status = st ? st : PAR_ECOMM};
    snprintf(m.msg, sizeof m.msg, "%s", msg && msg[0] ? msg : "(no message)");
    if (!e->fail_msg[0]) {
        e->fail_wrank = m.src_wrank;
        e->fail_st = m.status;
        snprintf(e->fail_msg, sizeof e->fail_msg, "%s", m.msg);
    }
    for (int q = 0; q < e->nprocs; q++)
        if (q != e->proc && !(skip && skip[q]))
            e_send_ctrl(e, q, &m);
}

static void e_notify(mworld *e, int wrank, const char *msg)
{
    if (atomic_load(&e->notified))
        return;
    e_lock(e);
    e_notify_locked(e, wrank, msg, NULL);
    pthread_mutex_unlock(&e->mu);
}

/* A failure of this process that nobody sent within 50 ms (a rank that
 * failed and keeps running) is sent with a generic message. */
static void e_check_unsent(mworld *e)
{
    if (atomic_load(&e->notified) || !par__world_failed(e->w))
        return;
    double now = par__now();
    if (e->fail_seen == 0) {
        e->fail_seen = now;
    } else if (now - e->fail_seen > 0.05) {
        char msg[160];
        snprintf(msg, sizeof msg, "a rank of MPI process %d failed (%s); see that process's log",
                 e->proc, par_status_str(par__world_failed(e->w)));
        e_notify_locked(e, e->proc * e->R, msg, NULL);
    }
}

/* Progress if nobody else is making it (hooks of local waits and polls). */
static void e_poll_try(void *ctx)
{
    mworld *e = ctx;
    if (!atomic_load_explicit(&e->wd_want, memory_order_relaxed) && pthread_mutex_trylock(&e->mu) == 0) {
        e_progress(e, 0);
        e_check_unsent(e);
        pthread_mutex_unlock(&e->mu);
    }
}

/* ---- fiber-hosted ranks ----------------------------------------------------- */

/* A fiber-hosted rank that waits parks (docs/comm.md "Fiber-hosted ranks"):
 * it is not scheduled again until what it waits for can have happened.  Who
 * wakes it: the last local arrival of a rendezvous (tsync), a local
 * point-to-point post that matched it, the engine when it completes one of
 * its point-to-point requests (req_complete), and the scheduler's poll hook
 * (e_poll_fibers) when the MPI requests of its exchange completed; its
 * deadline, and a failed world, through the scheduler's sweep. */

/* The calling rank's fiber in e->fs, or -1 (an OS thread rank). */
static int my_fiber(const mworld *e)
{
    return e->fs && fsched_current() == e->fs ? fsched_self(e->fs) : -1;
}

/* Tests q's requests from q->next on, in order, up to the first pending one
 * (one MPI_Test each: a completed request costs no progress call); returns 1
 * when all completed.  A completed receive counts as word from its process.
 * Under e->mu. */
static int reqs_poll(mworld *e, mreqs *q)
{
    for (; q->next < q->n; q->next++) {
        MPI_Request *r = &q->rq[q->next];
        if (*r == MPI_REQUEST_NULL)
            continue;
        int flag = 0;
        MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (!flag)
            return 0;
        if (q->next < q->nrecv && e->heard)
            e->heard[q->proc[q->next % q->pmod]] = par__now();
    }
    return 1;
}

static void reg_clear(mworld *e, int fib)
{
    if (fib >= 0 && e->reg[fib].rq) {
        e->reg[fib].rq = NULL;
        e->nreg--;
    }
}

/* The scheduler's poll hook (a worker with nothing to run, or every few
 * fibers run): engine progress (control messages, point-to-point payloads,
 * whose completion wakes their ranks), then the registered waits: a fiber
 * whose requests all completed is woken.  Nonzero when anything moved. */
static int e_poll_fibers(void *ud)
{
    mworld *e = ud;
    if (atomic_load_explicit(&e->wd_want, memory_order_relaxed) || pthread_mutex_trylock(&e->mu))
        return 0;
    uint64_t done0 = atomic_load_explicit(&e->completions, memory_order_relaxed);
    e_progress(e, 0);
    e_check_unsent(e);
    int woke = 0;
    for (int i = 0; e->nreg > 0 && i < e->R; i++) {
        if (e->reg[i].rq && reqs_poll(e, &e->reg[i])) {
            reg_clear(e, i);
            fsched_wake(e->fs, i);
            woke++;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return woke || atomic_load_explicit(&e->completions, memory_order_relaxed) != done0;
}

/* comm's waits (par__wait_poll, par_test) on a rank of this backend: a
 * fiber parks until woken or its deadline (deadline 0, a par_test: it makes
 * engine progress and lets the others run); a thread rank waits comm's way
 * (returns 0). */
static int m_rank_wait(par__world *w, double deadline)
{
    fsched *s = fsched_current();
    mworld *e = s ? fsched_user(s) : NULL;
    if (!e || e->w != w)
        return 0;
    if (deadline > 0) {
        fsched_park(s, deadline);
    } else {
        e_poll_try(e);
        fsched_yield(s);
    }
    return 1;
}

/* par_comm_store_local's wake: world rank wrank's fiber, if it is one here. */
static void m_rank_wake(par__world *w, void *bworld, int wrank)
{
    (void)w;
    mworld *e = bworld;
    if (e->fs && wrank / e->R == e->proc)
        fsched_wake(e->fs, wrank - e->proc * e->R);
}

/* One step of a backend wait whose requests are pending (and, for a fiber,
 * registered by test_reqs): a fiber parks, a thread backs off. */
static void wait_step(mworld *e, int fib, par__waiter *wt, double deadline)
{
    if (fib >= 0)
        fsched_park(e->fs, deadline);
    else
        backoff(wt);
}

static int world_failed(void *ud) { return par__world_failed(ud) != 0; }

/* How this process hosts its R > 1 ranks: par_world_opts.rank_host, else
 * PARITY_RANK_HOST, else fibers above RANK_HOST_FIBER_ABOVE ranks per
 * process and OS threads up to it (docs/comm.md "Fiber-hosted ranks": more
 * OS threads than that overload a small box; fibers park). */
#define RANK_HOST_FIBER_ABOVE 64
static par_status rank_host(const par__world *w, int R, int *fibers)
{
    int h = par__world_opts(w)->rank_host;
    const char *env = getenv("PARITY_RANK_HOST");
    if (h == PAR_RANK_HOST_DEFAULT && env && *env) {
        if (!strcmp(env, "threads"))
            h = PAR_RANK_HOST_THREADS;
        else if (!strcmp(env, "fiber"))
            h = PAR_RANK_HOST_FIBER;
        else
            return par_err(PAR_EINVAL, "PARITY_RANK_HOST=%s: expected threads or fiber", env);
    }
    *fibers = h == PAR_RANK_HOST_FIBER || (h == PAR_RANK_HOST_DEFAULT && R > RANK_HOST_FIBER_ABOVE);
    return PAR_OK;
}

/* The fibers of this process's R ranks (stacks mapped now). */
static par_status fibers_start(mworld *e)
{
    int fibers = 0;
    par_status st = rank_host(e->w, e->R, &fibers);
    if (st != PAR_OK || e->R == 1 || !fibers)
        return st;
    fsched_opts so;
    if ((st = fsched_opts_from(par__world_opts(e->w), e->R, e->nprocs, &so)))
        return st;
    so.stop = world_failed;
    so.stop_ud = e->w;
    so.user = e;
    so.poll = e_poll_fibers;
    e->reg = par_calloc((size_t)e->R, sizeof *e->reg, PAR_TAG_COMM);
    if (!e->reg)
        return par_err(PAR_ENOMEM, "mpi: no memory for %d fiber ranks", e->R);
    if ((st = fsched_new(e->R, &so, &e->fs)))
        return st;
    e->wgroup->fs = e->fs; /* the world's local rendezvous wakes fibers */
    return PAR_OK;
}

/* One line at info level, as the fiber backend's. */
static void fibers_report(const mworld *e)
{
    fsched_stats ss;
    fsched_get_stats(e->fs, &ss);
    PAR_LOG_I("mpi: process %d: %d fiber ranks on %d workers: deepest stack use %zu KiB (rank "
              "%d), stacks committed %.1f MiB (high-water marks %.1f MiB), scheduler heap %.1f "
              "MiB; %llu switches into ranks, %llu wake-ups, %llu parks, %llu yields, %llu polls, "
              "%llu naps", e->proc, e->R, ss.workers, (ss.stack_max + 1023) >> 10,
              e->proc * e->R + ss.stack_max_rank, (double)ss.stack_res / 1048576.0,
              (double)ss.stack_sum / 1048576.0, (double)ss.heap / 1048576.0,
              (unsigned long long)ss.switches, (unsigned long long)ss.wakes,
              (unsigned long long)ss.parks, (unsigned long long)ss.yields,
              (unsigned long long)ss.polls, (unsigned long long)ss.naps);
}

typedef struct {
    mworld *e;
    par__rank_main main;
} fiber_job;

static void run_rank(mworld *e, par__rank_main main_fn, int r);

static void fiber_rank(void *ud, int i)
{
    fiber_job *j = ud;
    run_rank(j->e, j->main, j->e->proc * j->e->R + i);
}

/* ---- liveness ------------------------------------------------------------- */


/* Drops what the engine holds for process q, which is gone: its control
 * messages and orphaned sends are abandoned, point-to-point requests with it
 * fail.  Under e->mu. */
static void e_forget(mworld *e, int q)
{
    for (outmsg **pp = &e->out; *pp;) {
        outmsg *o = *pp;
        if (o->proc != q) {
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        MPI_Cancel(&o->req);
        MPI_Request_free(&o->req);
        e_bury(e, o); /* MPI may still hold the bytes */
    }
    for (mop **pp = &e->ops; *pp;) {
        mop *op = *pp;
        if (op->proc != q) {
            pp = &op->next;
            continue;
        }
        *pp = op->next;
        if (op->state == OP_DATA) {
            MPI_Cancel(&op->req);
            MPI_Request_free(&op->req);
        }
        if (op->r)
            req_complete(e, op->r, PAR_ECOMM, "the peer's MPI process died during the transfer");
        par_free(op);
    }
    for (unexp **pp = &e->unexp; *pp;) {
        unexp *u = *pp;
        if (u->proc != q) {
            pp = &u->next;
            continue;
        }
        *pp = u->next;
        par_free(u);
    }
}

/* Process q is gone (why: how we know).  The world fails with a message
 * naming it and what this process's ranks were waiting on; the other live
 * processes are told.  Under e->mu. */
static void e_proc_dead(mworld *e, int q, const char *why)
{
    if (e->dead[q])
        return;
    e->dead[q] = 1;
    atomic_fetch_add(&e->ndead, 1);
    atomic_store(&g_peer_gone, 1);
    e_forget(e, q);
    char msg[720];
    size_t k = (size_t)snprintf(msg, sizeof msg,
                                "MPI process %d (world ranks %d..%d, pid %ld on host %s) died: %s; waiting here:", q,
                                q * e->R, q * e->R + e->R - 1, e->pids[q], e->hosts[q], why);
    for (int r = e->proc * e->R; r < (e->proc + 1) * e->R && k + 8 < sizeof msg; r++) {
        char d[200];
        par__rank_describe(e->w, r, d, sizeof d);
        k += (size_t)snprintf(msg + k, sizeof msg - k, "%s rank %d %s", r > e->proc * e->R ? ";" : "", r, d);
    }
    PAR_LOG_E("mpi: process %d: %s", e->proc, msg);
    par__world_fail(e->w, q * e->R, PAR_ECOMM, msg);
    e_notify_locked(e, q * e->R, msg, e->dead); /* the survivors hear the same story */
}

/* One round of the watchdog: heartbeats out, liveness in.  Under e->mu. */
static void e_watch(mworld *e)
{
    static const ctrlmsg hb = {.kind = CT_HEARTBEAT};
    double now = par__now();
    e_progress(e, 0);
    for (int q = 0; q < e->nprocs; q++) {
        if (q == e->proc || e->dead[q] || e->proc_done[q])
            continue; /* a process that said DONE may leave and fall silent */
        if (now - e->hb_sent[q] >= HB_EVERY) {
            MPI_Request rq; /* fire and forget: the buffer is static */
            if (MPI_Isend(&hb, (int)CTRL_HDR, MPI_BYTE, q, TAG_CTRL, e->comm, &rq) == MPI_SUCCESS)
                MPI_Request_free(&rq);
            e->hb_sent[q] = now;
        }
        char why[160];
        int gone = e->same_host[q] && kill((pid_t)e->pids[q], 0) != 0 && errno == ESRCH;
        if (!gone) {
            e->gone_since[q] = 0;
        } else if (e->gone_since[q] == 0) {
            e->gone_since[q] = now; /* a process that ended normally may have a DONE in flight */
        } else if (now - e->gone_since[q] > GONE_GRACE) {
            snprintf(why, sizeof why, "its pid no longer exists on this host (killed?)");
            e_proc_dead(e, q, why);
        }
        if (!gone && now - e->heard[q] > DEAD_AFTER) {
            snprintf(why, sizeof why, "nothing came from it for %.1f s (heartbeats every %.1f s)", now - e->heard[q],
                     HB_EVERY);
            e_proc_dead(e, q, why);
        }
    }
}

/* Cancels the receive *q from process proc and waits until MPI lets it go.
 * A receive that had already matched a message cannot be withdrawn: it
 * completes when the rest of the data arrives, and from a process that died
 * it never does (a blocking MPI_Wait here held the engine lock, and so the
 * watchdog and the exit, forever).  So: poll, with the lock released between
 * polls, and free the request once the process is known dead (nothing more
 * comes from it; what it sent before it died was taken meanwhile).  A live
 * process's message completes; one that does not within twice the world's
 * timeout (a minute at least) is the last resort.  Under e->mu, released
 * meanwhile. */
static void cancel_recv(mworld *e, MPI_Request *q, int proc)
{
    MPI_Cancel(q);
    double t = par__world_timeout(e->w), deadline = par__now() + (2 * t > 60 ? 2 * t : 60); /* as e_finish */
    for (unsigned iter = 0;; iter++) {
        int flag = 0;
        MPI_Test(q, &flag, MPI_STATUS_IGNORE);
        if (flag)
            return;
        if (e->dead && e->dead[proc]) {
            MPI_Request_free(q);
            return;
        }
        if (par__now() > deadline)
            last_resort("a cancelled receive from a live MPI process did not complete within twice the timeout");
        if (!e->watchdog_on && e->dead)
            e_watch(e); /* no watchdog thread: check liveness here */
        pthread_mutex_unlock(&e->mu);
        if (iter < 200) {
            sched_yield();
        } else {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&e->mu);
    }
}

static void *watchdog_main(void *arg)
{
    mworld *e = arg;
    while (!atomic_load(&e->watchdog_stop)) {
        struct timespec ts = {0, WATCH_EVERY_NS};
        nanosleep(&ts, NULL);
        atomic_store(&e->wd_want, 1); /* the ranks retake mu at once (fibers: one thread) */
        pthread_mutex_lock(&e->mu);
        atomic_store(&e->wd_want, 0);
        e_watch(e);
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* Every process's pid and host, and the watchdog thread (nprocs > 1). */
static par_status liveness_start(mworld *e, double timeout)
{
    int P = e->nprocs;
    e->pids = par_calloc((size_t)P, sizeof *e->pids, PAR_TAG_COMM);
    e->same_host = par_calloc((size_t)P, 1, PAR_TAG_COMM);
    e->hosts = par_calloc((size_t)P, sizeof *e->hosts, PAR_TAG_COMM);
    e->heard = par_calloc((size_t)P, sizeof *e->heard, PAR_TAG_COMM);
    e->hb_sent = par_calloc((size_t)P, sizeof *e->hb_sent, PAR_TAG_COMM);
    e->dead = par_calloc((size_t)P, 1, PAR_TAG_COMM);
    e->gone_since = par_calloc((size_t)P, sizeof *e->gone_since, PAR_TAG_COMM);
    typedef struct {
        int64_t pid;
        char host[120];
    } ident;
    ident *all = par_calloc((size_t)P, sizeof *all, PAR_TAG_COMM);
    if (!e->pids || !e->same_host || !e->hosts || !e->heard || !e->hb_sent || !e->dead || !e->gone_since || !all) {
        par_free(all);
        return par_err(PAR_ENOMEM, "mpi: no memory for %d processes", P);
    }
    ident me = {.pid = (int64_t)getpid()};
    gethostname(me.host, sizeof me.host - 1);
    MPI_Request req;
    MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, e->comm, &req);
    par_status st = wait_start_req(&req, par__now() + timeout, "exchanging process ids (MPI_Iallgather)");
    double now = par__now();
    for (int q = 0; q < P && !st; q++) {
        e->pids[q] = (long)all[q].pid;
        e->same_host[q] = !strcmp(all[q].host, me.host);
        snprintf(e->hosts[q], sizeof e->hosts[q], "%.*s", (int)sizeof e->hosts[q] - 1, all[q].host); /* cut to fit */
        e->heard[q] = now;
    }
    par_free(all);
    if (st || P == 1 || g_provided < MPI_THREAD_SERIALIZED) /* the watchdog calls MPI from its thread */
        return st;
    if (pthread_create(&e->watchdog, NULL, watchdog_main, e) != 0)
        return par_err(PAR_EUNSUPPORTED, "mpi: cannot start the liveness watchdog thread");
    e->watchdog_on = 1;
    return PAR_OK;
}

static void liveness_stop(mworld *e)
{
    if (!e->watchdog_on)
        return;
    atomic_store(&e->watchdog_stop, 1);
    pthread_join(e->watchdog, NULL);
    e->watchdog_on = 0;
}

/* ---- group handles ------------------------------------------------------ */

#define META_B sizeof(par__callmeta)
#define PAIR_B (2 * sizeof(uint64_t))

/* The metadata of an exchange crosses once per pair of processes: the leader
 * of a group's members on this process (the one of the lowest group rank)
 * sends every other process of the group one message, the call meta of each
 * member here and then, for each pair (member s here, member t there), the
 * bytes s sends t and the bytes s expects from t; and it receives one such
 * message from each.  (Per rank pair, a world collective at 8 x 128 ranks
 * was 114,688 messages each way per process.)  The channel is the leaders'
 * threads' tag pair: two groups with the same two leaders have them both as
 * members, which call the groups' collectives in the same order.  One pmeta
 * per group and process, shared by the members here (their tgroup's ext) or
 * a lone member's own. */
typedef struct {
    int p, np, nl;           /* members; other processes of the group; members here  */
    int lead_thr;            /* this process's leader's thread                      */
    int *qproc, *qn, *qlead; /* [np] process, its members, its leader's thread      */
    int *qfirst;             /* [np] its first member in mem                        */
    int *mem;                /* [p] members here, then each process's, by group rank */
    int *qi, *pos;           /* [p] a member's process index (-1: here), its index there */
    size_t *qin, *qout;      /* [np] offsets of the messages from / to each process */
    size_t nin, nout;
    char *in, *out;          /* out is a block of its own: buried with an orphaned send */
    MPI_Request *rq;         /* [2 np] receives, then sends                         */
    /* the data of the current exchange, one message each way per process */
    size_t *dsoff, *droff;   /* [np + 1] offsets per process in dsend / drecv       */
    char *dsend, *drecv;
    size_t dsend_cap, drecv_cap;
    /* the leader's verdicts on the round it finished (metadata, data), read
     * by the others */
    _Atomic uint64_t ready, dready;
    par_status st, dst;
    char what[400];
    int nmissing, *missing;  /* [p] group ranks whose metadata did not come         */
} pmeta;

static void pmeta_free(void *v)
{
    pmeta *pm = v;
    if (!pm)
        return;
    void *blocks[] = {pm->qproc, pm->qn, pm->qlead, pm->qfirst, pm->mem, pm->qi, pm->pos,
                      pm->qin, pm->qout, pm->in, pm->out, pm->rq, pm->missing, pm->dsoff,
                      pm->droff, pm->dsend, pm->drecv};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        par_free(blocks[i]);
    par_free(pm);
}

/* Members in process order; cnt[q] (members on process q) becomes q's
 * index, -1 here and for processes without members. */
static void pmeta_order(pmeta *pm, const mworld *e, const int *wr, int *cnt, int *fill)
{
    int k = 0, at = pm->nl, here = 0;
    for (int q = 0; q < e->nprocs; q++) {
        if (q == e->proc || !cnt[q]) {
            cnt[q] = -1;
            continue;
        }
        pm->qproc[k] = q;
        pm->qn[k] = cnt[q];
        pm->qfirst[k] = at;
        fill[k] = 0;
        at += cnt[q];
        cnt[q] = k++;
    }
    for (int j = 0; j < pm->p; j++) {
        int qk = cnt[wr[j] / e->R];
        pm->qi[j] = qk;
        pm->pos[j] = qk < 0 ? here++ : fill[qk]++;
        pm->mem[qk < 0 ? pm->pos[j] : pm->qfirst[qk] + pm->pos[j]] = j;
    }
    pm->lead_thr = wr[pm->mem[0]] % e->R;
    for (k = 0; k < pm->np; k++) {
        pm->qlead[k] = wr[pm->mem[pm->qfirst[k]]] % e->R;
        pm->qin[k] = pm->nin;
        pm->nin += (size_t)pm->qn[k] * META_B + (size_t)pm->qn[k] * pm->nl * PAIR_B;
        pm->qout[k] = pm->nout;
        pm->nout += (size_t)pm->nl * META_B + (size_t)pm->nl * pm->qn[k] * PAIR_B;
        pm->rq[k] = pm->rq[pm->np + k] = MPI_REQUEST_NULL;
    }
}

/* The metadata state of a group of p members (world ranks wr, group rank
 * order) on this process, which hosts at least one of them. */
static pmeta *pmeta_new(const mworld *e, int p, const int *wr)
{
    pmeta *pm = par_calloc(1, sizeof *pm, PAR_TAG_COMM);
    int *cnt = par_calloc((size_t)e->nprocs, sizeof *cnt, PAR_TAG_COMM);
    int *fill = par_calloc((size_t)e->nprocs, sizeof *fill, PAR_TAG_COMM);
    if (!pm || !cnt || !fill)
        goto fail;
    pm->p = p;
    for (int j = 0; j < p; j++)
        cnt[wr[j] / e->R]++;
    pm->nl = cnt[e->proc];
    for (int q = 0; q < e->nprocs; q++)
        pm->np += q != e->proc && cnt[q] > 0;
    size_t np = pm->np ? (size_t)pm->np : 1, n = (size_t)p;
    pm->qproc = par_malloc(np * sizeof(int), PAR_TAG_COMM);
    pm->qn = par_malloc(np * sizeof(int), PAR_TAG_COMM);
    pm->qlead = par_malloc(np * sizeof(int), PAR_TAG_COMM);
    pm->qfirst = par_malloc(np * sizeof(int), PAR_TAG_COMM);
    pm->qin = par_malloc(np * sizeof(size_t), PAR_TAG_COMM);
    pm->qout = par_malloc(np * sizeof(size_t), PAR_TAG_COMM);
    pm->rq = par_malloc(2 * np * sizeof(MPI_Request), PAR_TAG_COMM);
    pm->mem = par_malloc(n * sizeof(int), PAR_TAG_COMM);
    pm->qi = par_malloc(n * sizeof(int), PAR_TAG_COMM);
    pm->pos = par_malloc(n * sizeof(int), PAR_TAG_COMM);
    pm->missing = par_malloc(n * sizeof(int), PAR_TAG_COMM);
    pm->dsoff = par_malloc((np + 1) * sizeof(size_t), PAR_TAG_COMM);
    pm->droff = par_malloc((np + 1) * sizeof(size_t), PAR_TAG_COMM);
    pm->dsend = par_malloc(1, PAR_TAG_COMM);
    pm->dsend_cap = 1;
    if (!pm->dsoff || !pm->droff || !pm->dsend || !pm->qproc || !pm->qn || !pm->qlead || !pm->qfirst || !pm->qin || !pm->qout || !pm->rq ||
        !pm->mem || !pm->qi || !pm->pos || !pm->missing || pm->nl < 1)
        goto fail;
    pmeta_order(pm, e, wr, cnt, fill);
    pm->in = par_malloc(pm->nin ? pm->nin : 1, PAR_TAG_COMM);
    pm->out = par_malloc(pm->nout ? pm->nout : 1, PAR_TAG_COMM);
    if (!pm->in || !pm->out)
        goto fail;
    par_free(cnt);
    par_free(fill);
    return pm;
fail:
    pmeta_free(pm);
    par_free(cnt);
    par_free(fill);
    return NULL;
}

typedef struct {
    mworld *e;
    tgroup *g;            /* slots of the local members; NULL when alone here */
    pmeta *pm;            /* the group's metadata here: g's ext, or own (g NULL) */
    uint64_t gen;
    int slot;             /* my slot in g (0: this process's leader)          */
    int p, nremote, me;
    int *proc, *thr, *lslot;          /* [p] process, thread, local slot (-1) */
    par__callmeta *metas;             /* [p]                                   */
    int *missing;                     /* [p]                                   */
    unsigned char *bad;               /* [p] pairs that failed their check     */
} mcomm;

static void mcomm_free(mcomm *mc)
{
    if (!mc)
        return;
    if (!mc->g)
        pmeta_free(mc->pm);
    tsync_group_unref(mc->g);
    par_free(mc->proc);
    par_free(mc->thr);
    par_free(mc->lslot);
    par_free(mc->metas);
    par_free(mc->missing);
    par_free(mc->bad);
    par_free(mc);
}

/* A rank's handle on a group of p members (world ranks wr, me = its rank);
 * takes over one reference to g, whose ext is the group's pmeta here. */
static mcomm *mcomm_new(mworld *e, int p, const int *wr, int me, tgroup *g, int slot)
{
    mcomm *mc = par_calloc(1, sizeof *mc, PAR_TAG_COMM);
    if (!mc) {
        tsync_group_unref(g);
        return NULL;
    }
    mc->e = e;
    mc->g = g;
    mc->pm = g ? g->ext : pmeta_new(e, p, wr);
    mc->slot = slot;
    mc->p = p;
    mc->me = me;
    size_t n = (size_t)p;
    mc->proc = par_malloc(n * sizeof *mc->proc, PAR_TAG_COMM);
    mc->thr = par_malloc(n * sizeof *mc->thr, PAR_TAG_COMM);
    mc->lslot = par_malloc(n * sizeof *mc->lslot, PAR_TAG_COMM);
    mc->metas = par_malloc(n * sizeof *mc->metas, PAR_TAG_COMM);
    mc->missing = par_malloc(n * sizeof *mc->missing, PAR_TAG_COMM);
    mc->bad = par_malloc(n, PAR_TAG_COMM);
    if (!mc->pm || !mc->proc || !mc->thr || !mc->lslot || !mc->metas ||
        !mc->missing || !mc->bad) {
        mcomm_free(mc);
        return NULL;
    }
    int nl = 0;
    for (int j = 0; j < p; j++) {
        mc->proc[j] = wr[j] / e->R;
        mc->thr[j] = wr[j] % e->R;
        mc->lslot[j] = mc->proc[j] == e->proc ? nl++ : -1;
        mc->nremote += mc->proc[j] != e->proc;
    }
    return mc;
}

static int chan_tag(const mworld *e, int from_thr, int to_thr, int data)
{
    return TAG_CHAN0 + 2 * (from_thr * e->R + to_thr) + data;
}

/* ---- waiting for MPI requests --------------------------------------------- */

/* Tests q's requests, receives and sends with one MPI_Testsome each (one
 * MPI_Test per request, each a progress call, made a poll of a world
 * collective at 8 x 128 ranks quadratic), and makes engine progress;
 * returns how many are pending.  Sends to a dead process are dropped
 * (nobody will take them; receives stay for the failure path); a completed
 * receive counts as word from its process.  A fiber (fib >= 0) whose
 * requests are pending is registered for the poll hook, which wakes it once
 * they completed.  scratch: [max(nrecv, n - nrecv)]. */
static int test_reqs(mworld *e, mreqs *q, int fib, int *scratch)
{
    int left = 0, k = 0;
    e_lock(e);
    reg_clear(e, fib);
    for (int i = q->nrecv; atomic_load(&e->ndead) && i < q->n; i++) {
        if (q->rq[i] != MPI_REQUEST_NULL && e->dead[q->proc[i % q->pmod]]) {
            MPI_Cancel(&q->rq[i]);
            MPI_Request_free(&q->rq[i]);
        }
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow" /* gcc 12 sizes MPI_STATUSES_IGNORE as an array */
    if (q->nrecv > 0)
        MPI_Testsome(q->nrecv, q->rq, &k, scratch, MPI_STATUSES_IGNORE);
    double now = k > 0 && k != MPI_UNDEFINED && e->heard ? par__now() : 0;
    for (int i = 0; now > 0 && i < k; i++)
        e->heard[q->proc[scratch[i] % q->pmod]] = now;
    if (q->n > q->nrecv)
        MPI_Testsome(q->n - q->nrecv, q->rq + q->nrecv, &k, scratch, MPI_STATUSES_IGNORE);
#pragma GCC diagnostic pop
    for (int i = 0; i < q->n; i++)
        left += q->rq[i] != MPI_REQUEST_NULL;
    if (left && fib >= 0) {
        e->reg[fib] = *q;
        e->reg[fib].next = 0;
        e->nreg++;
    }
    e_progress(e, 0);
    e_check_unsent(e);
    pthread_mutex_unlock(&e->mu);
    return left;
}

/* ---- the metadata of an exchange, per process pair ------------------------- */

static size_t xb(const par__col *v, int j) { return par__col_at(v, j); }


/* The message to each other process from what the members here published
 * for this round (a lone member: m and x). */
static void meta_pack(const mcomm *mc, const par__callmeta *m, const par__xfer *x, uint64_t round)
{
    pmeta *pm = mc->pm;
    for (int s = 0; s < pm->nl; s++) {
        const par__callmeta *ms = mc->g ? &mc->g->slots[s].meta[round & 1] : m;
        const par__xfer *xs = mc->g ? mc->g->slots[s].x : x;
        for (int k = 0; k < pm->np; k++) {
            char *o = pm->out + pm->qout[k];
            memcpy(o + (size_t)s * META_B, ms, META_B);
            char *pairs = o + (size_t)pm->nl * META_B + (size_t)s * pm->qn[k] * PAIR_B;
            for (int t = 0; t < pm->qn[k]; t++) {
                int j = pm->mem[pm->qfirst[k] + t];
                uint64_t v[2] = {xb(&xs->sbytes, j), xb(&xs->rbytes, j)};
                memcpy(pairs + (size_t)t * PAIR_B, v, PAIR_B);
            }
        }
    }
}

/* Member j's (elsewhere) call meta, and v = {bytes j sends to member `me`
 * here, bytes j expects from it}. */
static void meta_of(const pmeta *pm, int j, int me, par__callmeta *m, uint64_t v[2])
{
    const char *in = pm->in + pm->qin[pm->qi[j]];
    int qn = pm->qn[pm->qi[j]];
    if (m)
        memcpy(m, in + (size_t)pm->pos[j] * META_B, META_B);
    if (v)
        memcpy(v, in + (size_t)qn * META_B + ((size_t)pm->pos[j] * pm->nl + pm->pos[me]) * PAIR_B,
               PAIR_B);
}

static void meta_post(mworld *e, pmeta *pm)
{
    e_lock(e);
    for (int k = 0; k < pm->np; k++) {
        size_t in_b = (size_t)pm->qn[k] * (META_B + (size_t)pm->nl * PAIR_B);
        size_t out_b = (size_t)pm->nl * (META_B + (size_t)pm->qn[k] * PAIR_B);
        MPI_Irecv_c(pm->in + pm->qin[k], (MPI_Count)in_b, MPI_BYTE, pm->qproc[k],
                    chan_tag(e, pm->qlead[k], pm->lead_thr, 0), e->comm, &pm->rq[k]);
        MPI_Isend_c(pm->out + pm->qout[k], (MPI_Count)out_b, MPI_BYTE, pm->qproc[k],
                    chan_tag(e, pm->lead_thr, pm->qlead[k], 0), e->comm, &pm->rq[pm->np + k]);
    }
    pthread_mutex_unlock(&e->mu);
}

/* Gives up the metadata requests of a failed wait: receives are cancelled,
 * sends still pending go to the engine with the buffer (a new one for later
 * calls). */
static void meta_withdraw(mworld *e, pmeta *pm, int fib)
{
    int orphans = 0;
    e_lock(e);
    reg_clear(e, fib);
    for (int k = 0; k < pm->np; k++) {
        if (pm->rq[k] != MPI_REQUEST_NULL)
            cancel_recv(e, &pm->rq[k], pm->qproc[k]);
        if (pm->rq[pm->np + k] != MPI_REQUEST_NULL) {
            e_orphan(e, &pm->rq[pm->np + k], pm->qproc[k]);
            orphans++;
        }
    }
    if (orphans) {
        e_bury(e, pm->out);
        pm->out = par_malloc(pm->nout ? pm->nout : 1, PAR_TAG_COMM);
        if (!pm->out)
            g_broken = 1;
    }
    pthread_mutex_unlock(&e->mu);
}

/* What a failed metadata wait names: the call, how many remote members'
 * metadata came, the members missing (pm->missing), and a process among
 * them that already returned from all its ranks. */
static void meta_failure(par_comm *c, mcomm *mc, const par__callmeta *m)
{
    pmeta *pm = mc->pm;
    int nm = 0, done_q = -1;
    e_lock(mc->e);
    for (int k = 0; k < pm->np; k++) {
        if (pm->rq[k] == MPI_REQUEST_NULL)
            continue;
        for (int t = 0; t < pm->qn[k]; t++)
            pm->missing[nm++] = pm->mem[pm->qfirst[k] + t];
        if (done_q < 0 && mc->e->proc_done[pm->qproc[k]])
            done_q = k;
    }
    pthread_mutex_unlock(&mc->e->mu);
    pm->nmissing = nm;
    par__meta_describe(m, par_comm_name(c), pm->what, sizeof pm->what);
    size_t n = strlen(pm->what);
    n += (size_t)snprintf(pm->what + n, sizeof pm->what - n,
                          ", metadata of %d of %d remote ranks arrived", mc->nremote - nm,
                          mc->nremote);
    if (done_q >= 0 && n < sizeof pm->what) /* comm knows only this process's ranks */
        snprintf(pm->what + n, sizeof pm->what - n,
                 " (MPI process %d, hosting rank %d, already returned from all its ranks)",
                 pm->qproc[done_q], pm->mem[pm->qfirst[done_q]]);
}

/* The leader's half (after the first local round: every member here
 * published its meta and transfer): one message to and from every other
 * process of the group, waited for with the world's deadline, abort-aware. */
static par_status meta_exchange(par_comm *c, mcomm *mc, const par__callmeta *m,
                                const par__xfer *x, uint64_t round)
{
    mworld *e = mc->e;
    pmeta *pm = mc->pm;
    int fib = my_fiber(e);
    if (!pm->out)
        return par_err(PAR_ENOMEM, "mpi: no memory for the metadata of group %s", c->name);
    meta_pack(mc, m, x, round);
    meta_post(e, pm);
    mreqs q = {.rq = pm->rq, .n = 2 * pm->np, .nrecv = pm->np, .pmod = pm->np, .proc = pm->qproc};
    par__waiter wt;
    par__wait_start(&wt, c->world, 0);
    par_status st;
    for (;;) {
        if (!test_reqs(e, &q, fib, pm->missing))
            return PAR_OK;
        st = par__world_failed(c->world) ? PAR_ECOMM
             : par__now() > wt.deadline  ? PAR_ETIMEOUT
                                         : PAR_OK;
        if (st != PAR_OK)
            break;
        wait_step(e, fib, &wt, wt.deadline);
    }
    meta_failure(c, mc, m);
    meta_withdraw(e, pm, fib);
    return par__wait_failed(c, st, pm->what, pm->missing, pm->nmissing);
}

/* The leader's verdict on `round` for the other members here, who wait for
 * it (the leader's wait is abort-aware and has the world's deadline, so
 * theirs ignores failures and only guards against a leader that never
 * comes).  A failed wait is raised in every member with the leader's words. */
static void meta_publish(mcomm *mc, uint64_t round, par_status st)
{
    mc->pm->st = st;
    atomic_store_explicit(&mc->pm->ready, round, memory_order_release);
    if (mc->g)
        tsync_wake_fibers(mc->g, mc->slot);
}

static par_status meta_wait_leader(par_comm *c, mcomm *mc, uint64_t round)
{
    pmeta *pm = mc->pm;
    mworld *e = mc->e;
    int fib = my_fiber(e);
    par__waiter wt;
    par__wait_start(&wt, c->world, 1);
    double deadline = wt.deadline + par__world_timeout(c->world) + 1;
    while (atomic_load_explicit(&pm->ready, memory_order_acquire) < round) {
        if (par__now() > deadline) {
            char what[300];
            int lead = pm->mem[0];
            snprintf(what, sizeof what, "the metadata of group %s from the other MPI processes, "
                     "which its rank %d exchanges for this process", par_comm_name(c), lead);
            return par__wait_failed(c, PAR_ETIMEOUT, what, &lead, 1);
        }
        if (fib >= 0)
            fsched_park(e->fs, deadline);
        else
            backoff(&wt);
    }
    if (pm->st == PAR_ETIMEOUT || pm->st == PAR_ECOMM)
        return par__wait_failed(c, pm->st, pm->what, pm->missing, pm->nmissing);
    if (pm->st != PAR_OK)
        return par_err(pm->st, "mpi: rank %d: the metadata of group %s did not go out: its rank "
                       "%d, which sends it for this process, failed (%s)", c->wrank,
                       par_comm_name(c), pm->mem[0], par_status_str(pm->st));
    return PAR_OK;
}

/* ---- the exchange ------------------------------------------------------- */

/* Every member's meta: mine, the local members' slots, the leader's
 * messages. */
static void gather_metas(mcomm *mc, const par__callmeta *m, uint64_t round)
{
    for (int j = 0; j < mc->p; j++) {
        if (j == mc->me)
            mc->metas[j] = *m;
        else if (mc->lslot[j] >= 0)
            mc->metas[j] = mc->g->slots[mc->lslot[j]].meta[round & 1];
        else
            meta_of(mc->pm, j, mc->me, &mc->metas[j], NULL);
    }
}

/* Pairs, from both sides with the same numbers: both agree to move a pair
 * or not.  Sets mc->bad; returns the first bad peer (-1: none) with its
 * error raised in *st. */
static int check_pairs(par_comm *c, mcomm *mc, const par__callmeta *m, const par__xfer *x,
                       par_status *st)
{
    int bad_peer = -1, me = mc->me;
    for (int j = 0; j < mc->p; j++) {
        size_t to_me, from_me_expected;
        if (mc->lslot[j] >= 0) {
            const par__xfer *xj = j == me ? x : mc->g->slots[mc->lslot[j]].x;
            to_me = xb(&xj->sbytes, me);
            from_me_expected = xb(&xj->rbytes, me);
        } else {
            uint64_t v[2];
            meta_of(mc->pm, j, me, NULL, v);
            to_me = (size_t)v[0];
            from_me_expected = (size_t)v[1];
        }
        size_t want = xb(&x->rbytes, j), give = xb(&x->sbytes, j);
        mc->bad[j] = to_me != want || give != from_me_expected;
        if (mc->bad[j] && bad_peer < 0) {
            bad_peer = j;
            *st = to_me != want ? par__pair_mismatch(c, m, j, me, to_me, want)
                                : par__pair_mismatch(c, m, me, j, give, from_me_expected);
        }
    }
    return bad_peer;
}

/* Local pairs: one memcpy from the sender's buffer (as the threads backend). */
static void move_local(mcomm *mc, const par__xfer *x)
{
    int p = mc->p, me = mc->me;
    for (int k = 0; k < p; k++) {
        int j = (me + k) % p; /* spread the readers over the senders */
        size_t rb = xb(&x->rbytes, j);
        if (mc->lslot[j] < 0 || mc->bad[j] || !rb)
            continue;
        const par__xfer *xj = j == me ? x : mc->g->slots[mc->lslot[j]].x;
        const char *src = xj->sbase + xb(&xj->soff, me);
        char *dst = x->rbase + xb(&x->roff, j);
        if (src != dst)
            memcpy(dst, src, rb);
    }
}

/* ---- the data of an exchange, per process pair ---------------------------- */

/* What member s here published (a lone member: x). */
static const par__xfer *slot_x(const mcomm *mc, int s, const par__xfer *x)
{
    return mc->g ? mc->g->slots[s].x : x;
}

/* Pair (member s here, member j elsewhere): the bytes s sends j and
 * receives from j; 0 both when the pair fails its check (check_pairs: the
 * same four numbers on both sides, so both sides drop it). */
static void pair_bytes(const mcomm *mc, const par__xfer *xs, int s, int j, size_t *give,
                       size_t *take)
{
    uint64_t v[2];
    meta_of(mc->pm, j, mc->pm->mem[s], NULL, v);
    size_t g = xb(&xs->sbytes, j), w = xb(&xs->rbytes, j);
    int bad = v[0] != w || g != v[1];
    *give = bad ? 0 : g;
    *take = bad ? 0 : w;
}

/* Grows *buf to at least n bytes. */
static int grow(char **buf, size_t *cap, size_t n)
{
    if (*buf && *cap >= n)
        return 1;
    char *b = par_realloc(*buf, n ? n : 1, PAR_TAG_COMM);
    if (!b)
        return 0;
    *buf = b;
    *cap = n ? n : 1;
    return 1;
}

/* Sizes and packs what the members here send each other process (members
 * here in order, each to the members there in order) and sizes what comes
 * back (the same order from the other side).  0: no memory. */
static int data_pack(mcomm *mc, const par__xfer *x)
{
    pmeta *pm = mc->pm;
    size_t ns = 0, nr = 0, give, take;
    for (int k = 0; k < pm->np; k++) {
        pm->dsoff[k] = ns;
        pm->droff[k] = nr;
        for (int s = 0; s < pm->nl; s++) {
            const par__xfer *xs = slot_x(mc, s, x);
            for (int t = 0; t < pm->qn[k]; t++) {
                pair_bytes(mc, xs, s, pm->mem[pm->qfirst[k] + t], &give, &take);
                ns += give;
                nr += take;
            }
        }
    }
    pm->dsoff[pm->np] = ns;
    pm->droff[pm->np] = nr;
    if (!pm->dsend || !grow(&pm->dsend, &pm->dsend_cap, ns) ||
        !grow(&pm->drecv, &pm->drecv_cap, nr))
        return 0;
    size_t at = 0;
    for (int k = 0; k < pm->np; k++)
        for (int s = 0; s < pm->nl; s++) {
            const par__xfer *xs = slot_x(mc, s, x);
            for (int t = 0; t < pm->qn[k]; t++) {
                int j = pm->mem[pm->qfirst[k] + t];
                pair_bytes(mc, xs, s, j, &give, &take);
                if (give)
                    memcpy(pm->dsend + at, xs->sbase + xb(&xs->soff, j), give);
                at += give;
            }
        }
    return 1;
}

/* Copies what came from each process into the members' receive buffers. */
static void data_unpack(mcomm *mc, const par__xfer *x)
{
    pmeta *pm = mc->pm;
    for (int k = 0; k < pm->np; k++) {
        size_t at = pm->droff[k], give, take;
        for (int t = 0; t < pm->qn[k]; t++) {
            int j = pm->mem[pm->qfirst[k] + t];
            for (int s = 0; s < pm->nl; s++) {
                const par__xfer *xs = slot_x(mc, s, x);
                pair_bytes(mc, xs, s, j, &give, &take);
                if (take)
                    memcpy(xs->rbase + xb(&xs->roff, j), pm->drecv + at, take);
                at += take;
            }
        }
    }
}

static void data_post(mworld *e, pmeta *pm)
{
    e_lock(e);
    for (int k = 0; k < pm->np; k++) {
        size_t rb = pm->droff[k + 1] - pm->droff[k], sb = pm->dsoff[k + 1] - pm->dsoff[k];
        if (rb)
            MPI_Irecv_c(pm->drecv + pm->droff[k], (MPI_Count)rb, MPI_BYTE, pm->qproc[k],
                        chan_tag(e, pm->qlead[k], pm->lead_thr, 1), e->comm, &pm->rq[k]);
        if (sb)
            MPI_Isend_c(pm->dsend + pm->dsoff[k], (MPI_Count)sb, MPI_BYTE, pm->qproc[k],
                        chan_tag(e, pm->lead_thr, pm->qlead[k], 1), e->comm, &pm->rq[pm->np + k]);
    }
    pthread_mutex_unlock(&e->mu);
}

/* The data failed (deadline, failed world): the members of the processes
 * whose data did not come, receives cancelled; the error raised. */
static par_status data_failed(par_comm *c, mcomm *mc, const par__callmeta *m, par_status why,
                              int fib)
{
    pmeta *pm = mc->pm;
    int nm = 0;
    for (int k = 0; k < pm->np; k++)
        if (pm->rq[k] != MPI_REQUEST_NULL)
            for (int t = 0; t < pm->qn[k]; t++)
                pm->missing[nm++] = pm->mem[pm->qfirst[k] + t];
    pm->nmissing = nm;
    size_t n = (size_t)snprintf(pm->what, sizeof pm->what, "data of ");
    par__meta_describe(m, par_comm_name(c), pm->what + n, sizeof pm->what - n);
    par_status st = par__wait_failed(c, why, pm->what, pm->missing, nm);
    e_lock(mc->e);
    reg_clear(mc->e, fib);
    for (int k = 0; k < pm->np; k++)
        if (pm->rq[k] != MPI_REQUEST_NULL)
            cancel_recv(mc->e, &pm->rq[k], pm->qproc[k]);
    pthread_mutex_unlock(&mc->e->mu);
    return st;
}

/* The leader moves the data of the members here to and from every other
 * process of the group: one message each way per process (posted receives
 * per rank pair made UCX search thousands of wildcard-queued receives at
 * every arrival: MPICH's receives are all wildcards to UCX).  Receives are
 * cancelled when the world failed or the deadline passed; sends are waited
 * for (their receivers take or drain them). */
static par_status data_exchange(par_comm *c, mcomm *mc, const par__callmeta *m,
                                const par__xfer *x)
{
    mworld *e = mc->e;
    pmeta *pm = mc->pm;
    int fib = my_fiber(e);
    if (!data_pack(mc, x))
        return par_err(PAR_ENOMEM, "mpi: no memory for the data of %s between processes (%zu "
                       "bytes out, %zu in)", par_comm_name(c), pm->dsoff[pm->np],
                       pm->droff[pm->np]);
    data_post(e, pm);
    mreqs q = {.rq = pm->rq, .n = 2 * pm->np, .nrecv = pm->np, .pmod = pm->np, .proc = pm->qproc};
    par__waiter wt;
    par__wait_start(&wt, c->world, 1);
    double deadline = wt.deadline, send_deadline = deadline;
    int cancelled = 0;
    par_status st = PAR_OK;
    for (;;) {
        int left = test_reqs(e, &q, fib, pm->missing), rl = 0;
        for (int k = 0; k < pm->np; k++)
            rl += pm->rq[k] != MPI_REQUEST_NULL;
        if (!left)
            break;
        double now = par__now();
        if (rl && !cancelled && (par__world_failed(c->world) || now > deadline)) {
            st = data_failed(c, mc, m, now > deadline ? PAR_ETIMEOUT : PAR_ECOMM, fib);
            cancelled = 1;
            send_deadline = now + par__world_timeout(c->world);
            continue;
        }
        if (left > rl && now > send_deadline) {
            char what[200], msg[400];
            par__meta_describe(m, par_comm_name(c), what, sizeof what);
            snprintf(msg, sizeof msg, "rank %d: the sends of %s did not complete within %g s "
                     "after the deadline (a peer process is stuck)", c->wrank, what,
                     par__world_timeout(c->world));
            last_resort(msg);
        }
        wait_step(e, fib, &wt, cancelled ? send_deadline : deadline);
    }
    if (st == PAR_OK)
        data_unpack(mc, x);
    return st;
}

/* A member here that is not the leader waits for the leader's data verdict
 * (the leader's wait has the world's deadline). */
static par_status data_wait_leader(par_comm *c, mcomm *mc, uint64_t round)
{
    pmeta *pm = mc->pm;
    int fib = my_fiber(mc->e);
    par__waiter wt;
    par__wait_start(&wt, c->world, 1);
    double deadline = wt.deadline + 2 * par__world_timeout(c->world) + 1;
    while (atomic_load_explicit(&pm->dready, memory_order_acquire) < round) {
        if (par__now() > deadline) {
            char what[300];
            int lead = pm->mem[0];
            snprintf(what, sizeof what, "the data of group %s from the other MPI processes, "
                     "which its rank %d moves for this process", par_comm_name(c), lead);
            return par__wait_failed(c, PAR_ETIMEOUT, what, &lead, 1);
        }
        if (fib >= 0)
            fsched_park(mc->e->fs, deadline);
        else
            backoff(&wt);
    }
    if (pm->dst == PAR_ETIMEOUT || pm->dst == PAR_ECOMM)
        return par__wait_failed(c, pm->dst, pm->what, pm->missing, pm->nmissing);
    if (pm->dst != PAR_OK)
        return par_err(pm->dst, "mpi: rank %d: the data of group %s did not move between "
                       "processes: its rank %d, which moves it for this process, failed (%s)",
                       c->wrank, par_comm_name(c), pm->mem[0], par_status_str(pm->dst));
    return PAR_OK;
}

/* A mismatch every member (or both sides of a pair) detects itself: the
 * processes outside the set (the group's, or the bad peer's) are told; the
 * others report it themselves (a notice could preempt their reports). */
static void notify_except(mworld *e, par_comm *c, const mcomm *mc, int peer)
{
    e_lock(e);
    memset(e->skip, 0, (size_t)e->nprocs);
    for (int j = 0; j < mc->p; j++)
        if (peer < 0 || j == peer)
            e->skip[mc->proc[j]] = 1;
    e_notify_locked(e, c->wrank, par_last_error(), e->skip);
    pthread_mutex_unlock(&e->mu);
}

static par_status m_exchange(par_comm *c, const par__callmeta *m, const par__xfer *x)
{
    mcomm *mc = c->bgroup;
    mworld *e = mc->e;
    par_status before = par__world_failed(c->world), st = PAR_OK;
    uint64_t round = mc->gen + 1;
    if (mc->g) { /* 1. the members here publish, and meet */
        tslot *s = &mc->g->slots[mc->slot];
        s->meta[round & 1] = *m;
        s->x = x;
        st = tsync_arrive(c, mc->g, mc->slot, &mc->gen, 0, m, e_poll_try, e);
        if (st != PAR_OK)
            goto fail_notify;
    }
    if (mc->nremote) { /* 2. the leader swaps metadata with the other processes */
        if (mc->slot == 0) {
            st = meta_exchange(c, mc, m, x, round);
            meta_publish(mc, round, st);
        } else {
            st = meta_wait_leader(c, mc, round);
        }
        if (st != PAR_OK)
            goto fail_notify;
    }
    gather_metas(mc, m, round); /* 3. the same metas everywhere, the same verdict */
    st = par__check_metas(c, mc->metas, sizeof *mc->metas);
    if (st != PAR_OK) {
        notify_except(e, c, mc, -1);
        return st;
    }
    if (par__xfer_empty(x))
        return PAR_OK;
    int bad_peer = check_pairs(c, mc, m, x, &st); /* 4. pairs */
    move_local(mc, x);                            /* 5. data here, then between processes */
    if (mc->nremote) {
        par_status st2;
        if (mc->slot == 0) {
            st2 = data_exchange(c, mc, m, x);
            mc->pm->dst = st2;
            atomic_store_explicit(&mc->pm->dready, round, memory_order_release);
            if (mc->g)
                tsync_wake_fibers(mc->g, mc->slot);
        } else {
            st2 = data_wait_leader(c, mc, round);
        }
        if (st == PAR_OK)
            st = st2;
    }
    if (mc->g) { /* 6. nobody leaves before all copies are done, even if the world failed */
        par_status st2 = tsync_arrive(c, mc->g, mc->slot, &mc->gen, 1, m, e_poll_try, e);
        if (st == PAR_OK)
            st = st2;
    }
    if (st == PAR_OK)
        return st;
    if (bad_peer >= 0 && !before) { /* the other side reports it too */
        notify_except(e, c, mc, bad_peer);
        return st;
    }

fail_notify:
    if (!before && st != PAR_ECOMM)
        e_notify(e, c->wrank, par_last_error());
    return st;
}

/* ---- groups ------------------------------------------------------------- */

/* The shared slots of a new group's nl > 1 members here (world ranks wr
 * of its p members), with its pmeta; NULL: no memory (the members see it and
 * fail). */
static tgroup *split_slots_new(mworld *e, int p, const int *wr, int nl)
{
    tgroup *ng = tsync_group_new(nl, nl, 1);
    if (ng && !(ng->ext = pmeta_new(e, p, wr))) {
        tsync_group_destroy(ng);
        return NULL;
    }
    if (!ng)
        return NULL;
    ng->ext_free = pmeta_free;
    ng->fs = e->fs;
    for (int i = 0, k = 0; i < p; i++) {
        if (wr[i] / e->R == e->proc) {
            ng->slot_fiber[k] = wr[i] % e->R;
            ng->slot_rank[k++] = i;
        }
    }
    return ng;
}

static par_status m_split(par_comm *parent, const par__splitplan *plan, void **bgroup)
{
    mcomm *pm = parent->bgroup;
    mworld *e = pm->e;
    int member = plan->color >= 0;
    int *wr = NULL, nl = 0, lead = -1, myslot = 0;
    if (member) {
        wr = par_malloc((size_t)plan->size * sizeof *wr, PAR_TAG_COMM);
        if (!wr)
            return par_err(PAR_ENOMEM, "mpi: no memory to split %s", par_comm_name(parent));
        for (int i = 0; i < plan->size; i++) {
            int pr = plan->parent_ranks[i];
            wr[i] = parent->world_ranks[pr];
            if (wr[i] / e->R != e->proc)
                continue;
            if (lead < 0 || pr < lead)
                lead = pr;
            if (i == plan->rank)
                myslot = nl;
            nl++;
        }
    }
    tgroup *ng = member && nl > 1 && lead == parent->rank ? split_slots_new(e, plan->size, wr, nl)
                                                          : NULL;
    tgroup *shared = ng;
    if (pm->g) { /* other ranks of this process are in the parent: meet them */
        pm->g->slots[pm->slot].split = ng;
        par__callmeta m = {.group_id = parent->id, .seq = parent->seq, .op = PAR__OP_SPLIT,
                           .dtype = PAR_C_I32, .count = 2, .redop = -1, .root = -1, .phase = 1,
                           .rank = parent->rank};
        par_status st = tsync_arrive(parent, pm->g, pm->slot, &pm->gen, 0, &m, e_poll_try, e);
        if (st != PAR_OK) { /* the round did not complete: nobody read ng */
            tsync_group_destroy(ng);
            par_free(wr);
            return st;
        }
        if (member && nl > 1)
            shared = pm->g->slots[pm->lslot[lead]].split;
    }
    if (!member) {
        *bgroup = NULL;
        return PAR_OK;
    }
    if (nl > 1 && !shared) {
        par_free(wr);
        return par_err(PAR_ENOMEM, "mpi: no memory for group of %d ranks split from %s",
                       plan->size, par_comm_name(parent));
    }
    mcomm *mc = mcomm_new(e, plan->size, wr, plan->rank, nl > 1 ? shared : NULL, myslot);
    par_free(wr);
    if (!mc)
        return par_err(PAR_ENOMEM, "mpi: no memory for a handle on a group of %d ranks",
                       plan->size);
    *bgroup = mc;
    return PAR_OK;
}

static void m_group_free(par_comm *c, void *bgroup)
{
    (void)c;
    mcomm_free(bgroup);
}

static par_status m_group_world(par__world *w, void *bworld, int rank, void **bgroup)
{
    mworld *e = bworld;
    int n = par__world_size(w);
    int *wr = par_malloc((size_t)n * sizeof *wr, PAR_TAG_COMM);
    if (!wr)
        return par_err(PAR_ENOMEM, "mpi: no memory for rank %d's world handle", rank);
    for (int i = 0; i < n; i++)
        wr[i] = i;
    if (e->wgroup)
        atomic_fetch_add(&e->wgroup->refs, 1);
    mcomm *mc = mcomm_new(e, n, wr, rank, e->wgroup, rank % e->R);
    par_free(wr);
    if (!mc)
        return par_err(PAR_ENOMEM, "mpi: no memory for rank %d's world handle", rank);
    *bgroup = mc;
    return PAR_OK;
}

/* ---- point to point ----------------------------------------------------- */

static mworld *req_engine(const par_request *r) { return ((mcomm *)r->comm->bgroup)->e; }

static int is_local(const mworld *e, const par_request *r)
{
    return r->peer_wrank / e->R == e->proc;
}

static void m_p2p_post(par_request *r)
{
    mworld *e = req_engine(r);
    if (is_local(e, r)) { /* comm's mailboxes; a post that matched wakes the other side */
        par__p2p_post(r);
        if (e->fs && atomic_load_explicit(&r->done, memory_order_acquire))
            fsched_wake(e->fs, r->peer_wrank - e->proc * e->R);
        return;
    }
    mop *op = par_calloc(1, sizeof *op, PAR_TAG_COMM);
    if (!op) {
        req_complete(e, r, PAR_ENOMEM, "mpi: no memory for a point-to-point request");
        return;
    }
    op->r = r;
    op->proc = r->peer_wrank / e->R;
    e_lock(e);
    r->bdata = op;
    if (r->kind == PAR__REQ_SEND) {
        op->is_send = 1;
        op->id = ++e->next_id;
        op->state = OP_WAIT_CTS;
        op->next = e->ops;
        e->ops = op;
        ctrlmsg rts = {.kind = CT_RTS, .src_wrank = r->wrank, .dst_wrank = r->peer_wrank,
                       .tag = r->tag, .dtype = (int32_t)r->dtype, .count = r->count,
                       .gid = r->gid, .id = op->id, .vclock = r->vpost};
        e_send_ctrl(e, op->proc, &rts);
    } else {
        unexp **pp = &e->unexp;
        while (*pp && !((*pp)->rts.dst_wrank == r->wrank &&
                        (*pp)->rts.src_wrank == r->peer_wrank && (*pp)->rts.gid == r->gid &&
                        (*pp)->rts.tag == r->tag))
            pp = &(*pp)->next;
        if (*pp) {
            unexp *u = *pp;
            *pp = u->next;
            e_match(e, op, &u->rts, u->proc);
            par_free(u);
        } else {
            op->state = OP_POSTED;
            op->next = NULL;
            mop **tail = &e->posted;
            while (*tail)
                tail = &(*tail)->next;
            *tail = op;
        }
    }
    e_progress(e, 0);
    pthread_mutex_unlock(&e->mu);
}

static int m_p2p_poll(par_request *r)
{
    mworld *e = req_engine(r);
    e_poll_try(e);
    return atomic_load_explicit(&r->done, memory_order_acquire);
}

static int m_p2p_cancel(par_request *r)
{
    mworld *e = req_engine(r);
    if (is_local(e, r))
        return par__p2p_cancel(r);
    int removed = 0;
    e_lock(e);
    mop *op = r->bdata;
    if (!atomic_load(&r->done) && op) {
        if (op->is_send && op->state == OP_WAIT_CTS) {
            op->r = NULL; /* the engine finishes it when the CTS comes */
            ctrlmsg cm = {.kind = CT_CANCEL, .id = op->id, .src_wrank = r->wrank,
                          .dst_wrank = r->peer_wrank};
            e_send_ctrl(e, op->proc, &cm);
            r->bdata = NULL;
            removed = 1;
        } else if (!op->is_send && op->state == OP_POSTED) {
            for (mop **pp = &e->posted; *pp; pp = &(*pp)->next) {
                if (*pp == op) {
                    *pp = op->next;
                    break;
                }
            }
            par_free(op);
            r->bdata = NULL;
            removed = 1;
        }
        /* matched transfers are committed: they complete */
    }
    pthread_mutex_unlock(&e->mu);
    return removed;
}

/* ---- worlds ------------------------------------------------------------- */

/* Polls *req to completion before the world's deadline. */
static par_status wait_start_req(MPI_Request *req, double deadline, const char *what)
{
    unsigned iter = 0;
    for (;;) {
        int flag = 0;
        MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (flag)
            return PAR_OK;
        if (par__now() > deadline) {
            g_broken = 1;
            return par_err(PAR_ETIMEOUT,
                           "mpi: timed out %s: does every process of mpiexec call "
                           "par_world_run with this world?",
                           what);
        }
        if (++iter > 100) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        } else {
            sched_yield();
        }
    }
}

static void mworld_free(mworld *e)
{
    if (!e)
        return;
    while (e->out) { /* only after a clean end: all complete */
        outmsg *o = e->out;
        e->out = o->next;
        par_free(o);
    }
    while (e->graves) {
        grave *g = e->graves;
        e->graves = g->next;
        par_free(g->block);
        par_free(g);
    }
    while (e->unexp) {
        unexp *u = e->unexp;
        e->unexp = u->next;
        par_free(u);
    }
    while (e->ops) {
        mop *op = e->ops;
        e->ops = op->next;
        par_free(op);
    }
    while (e->posted) {
        mop *op = e->posted;
        e->posted = op->next;
        par_free(op);
    }
    par_free(e->trash);
    par_free(e->proc_done);
    par_free(e->skip);
    par_free(e->rep_rank);
    par_free(e->rep_st);
    par_free(e->rep_msg);
    par_free(e->pids);
    par_free(e->same_host);
    par_free(e->hosts);
    par_free(e->heard);
    par_free(e->hb_sent);
    par_free(e->dead);
    par_free(e->gone_since);
    tsync_group_unref(e->wgroup);
    fsched_free(e->fs);
    par_free(e->reg);
    if (e->comm != MPI_COMM_NULL && !atomic_load(&g_peer_gone)) /* with a dead peer: left to exit */
        MPI_Comm_free(&e->comm);
    pthread_mutex_destroy(&e->mu);
    par_free(e);
}

/* Value of key in "key=value" lines (NULL when absent); *len its length. */
static const char *fp_value(const char *text, const char *key, size_t klen, size_t *len)
{
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n'), *end = nl ? nl : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        if (eq && (size_t)(eq - p) == klen && !memcmp(p, key, klen)) {
            *len = (size_t)(end - eq - 1);
            return eq + 1;
        }
        p = nl ? nl + 1 : NULL;
    }
    return NULL;
}

/* Appends to msg the keys whose values differ between a and b (either side). */
static size_t fp_diff(const char *a, const char *b, int pa, int pb, char *msg, size_t k, size_t cap, int *nd)
{
    for (int side = 0; side < 2; side++) {
        const char *x = side ? b : a, *y = side ? a : b;
        for (const char *p = x; p && *p && k + 8 < cap;) {
            const char *nl = strchr(p, '\n'), *end = nl ? nl : p + strlen(p);
            const char *eq = memchr(p, '=', (size_t)(end - p));
            if (eq) {
                size_t kl = (size_t)(eq - p), vl = (size_t)(end - eq - 1), ol = 0;
                const char *ov = fp_value(y, p, kl, &ol);
                if (side && ov) {
                    p = nl ? nl + 1 : NULL;
                    continue; /* seen from a's side */
                }
                if (!ov || ol != vl || memcmp(ov, eq + 1, vl)) {
                    const char *va = side ? ov : eq + 1, *vb = side ? eq + 1 : ov;
                    int la = (int)(side ? ol : vl), lb = (int)(side ? vl : ol);
                    k += (size_t)snprintf(msg + k, cap - k, "%s %.*s: process %d has %.*s, process %d has %.*s",
                                          (*nd)++ ? ";" : "", (int)kl, p, pa, va ? la : 8, va ? va : "(absent)",
                                          pb, vb ? lb : 8, vb ? vb : "(absent)");
                }
            }
            p = nl ? nl + 1 : NULL;
        }
    }
    return k;
}

/* Every process must run the same configuration (par_world_opts
 * .fingerprint): the texts are gathered, and every process reaches the same
 * verdict, naming each key that differs from process 0's. */
static par_status check_fingerprints(mworld *e, double timeout)
{
    const char *mine = par__world_fingerprint(e->w);
    int P = e->nprocs;
    int64_t len = mine ? (int64_t)strlen(mine) + 1 : 1;
    int64_t *lens = par_calloc((size_t)P, sizeof *lens, PAR_TAG_COMM);
    int *cnt = par_calloc((size_t)P * 2, sizeof *cnt, PAR_TAG_COMM);
    char *all = NULL;
    par_status st = (!lens || !cnt) ? par_err(PAR_ENOMEM, "mpi: no memory for %d fingerprints", P) : PAR_OK;
    MPI_Request req;
    if (!st) {
        MPI_Iallgather(&len, 1, MPI_INT64_T, lens, 1, MPI_INT64_T, e->comm, &req);
        st = wait_start_req(&req, par__now() + timeout, "comparing configurations (MPI_Iallgather)");
    }
    int64_t total = 0;
    for (int q = 0; !st && q < P; q++) {
        if (lens[q] < 1 || lens[q] > (1 << 24) || total > INT32_MAX - lens[q])
            st = par_err(PAR_EMISMATCH, "mpi: process %d sent a configuration of %lld bytes", q, (long long)lens[q]);
        cnt[q] = (int)lens[q];
        cnt[P + q] = (int)total;
        total += lens[q];
    }
    if (!st && !(all = par_malloc((size_t)total, PAR_TAG_COMM)))
        st = par_err(PAR_ENOMEM, "mpi: no memory for the configurations (%lld bytes)", (long long)total);
    if (!st) {
        MPI_Iallgatherv(mine ? mine : "", (int)len, MPI_CHAR, all, cnt, cnt + P, MPI_CHAR, e->comm, &req);
        st = wait_start_req(&req, par__now() + timeout, "comparing configurations (MPI_Iallgatherv)");
    }
    char msg[900];
    size_t k = 0;
    int nd = 0;
    if (!st)
        all[cnt[0] - 1] = '\0';
    for (int q = 1; !st && q < P && k + 16 < sizeof msg; q++) {
        all[cnt[P + q] + cnt[q] - 1] = '\0';
        if (strcmp(all, all + cnt[P + q]))
            k = fp_diff(all, all + cnt[P + q], 0, q, msg, k, sizeof msg, &nd);
    }
    if (!st && nd)
        st = par_err(PAR_EINVAL, "mpi: the MPI processes were started with different configurations (every process "
                     "must run the same model, training keys, layout, data, seed, precision and build):%s", msg);
    par_free(all);
    par_free(lens);
    par_free(cnt);
    return st;
}

/* The shared slots of this process's R > 1 ranks in the world, with the
 * world's pmeta. */
static par_status world_slots_new(mworld *e)
{
    e->wgroup = tsync_group_new(e->R, 1, 1);
    if (!e->wgroup)
        return par_err(PAR_ENOMEM, "mpi: no memory for %d ranks per process", e->R);
    for (int i = 0; i < e->R; i++) {
        e->wgroup->slot_rank[i] = e->proc * e->R + i;
        e->wgroup->slot_fiber[i] = i;
    }
    int *wr = par_malloc((size_t)e->n * sizeof *wr, PAR_TAG_COMM);
    for (int i = 0; wr && i < e->n; i++)
        wr[i] = i;
    e->wgroup->ext = wr ? pmeta_new(e, e->n, wr) : NULL;
    e->wgroup->ext_free = pmeta_free;
    par_free(wr);
    return e->wgroup->ext ? PAR_OK
                          : par_err(PAR_ENOMEM, "mpi: no memory for the world's metadata (%d "
                                    "ranks)", e->n);
}

static par_status m_world_init(par__world *w, void **bworld)
{
    int n = par__world_size(w), nprocs = 1, proc = 0;
    par_status st = par_mpi_procs(&nprocs, &proc);
    if (st != PAR_OK)
        return st;
    double timeout = par__world_timeout(w);
    mworld *e = par_calloc(1, sizeof *e, PAR_TAG_COMM);
    if (!e)
        return par_err(PAR_ENOMEM, "mpi: no memory for a world");
    e->w = w;
    e->n = n;
    e->nprocs = nprocs;
    e->proc = proc;
    e->comm = MPI_COMM_NULL;
    pthread_mutex_init(&e->mu, NULL);
    e->proc_done = par_calloc((size_t)nprocs, 1, PAR_TAG_COMM);
    e->skip = par_calloc((size_t)nprocs, 1, PAR_TAG_COMM);
    e->rep_rank = par_calloc((size_t)nprocs, sizeof *e->rep_rank, PAR_TAG_COMM);
    e->rep_st = par_calloc((size_t)nprocs, sizeof *e->rep_st, PAR_TAG_COMM);
    e->rep_msg = par_calloc((size_t)nprocs, sizeof *e->rep_msg, PAR_TAG_COMM);
    if (!e->proc_done || !e->skip || !e->rep_rank || !e->rep_st || !e->rep_msg) {
        st = par_err(PAR_ENOMEM, "mpi: no memory for %d processes", nprocs);
        goto fail_free_world;
    }

    MPI_Request req;
    MPI_Comm_idup(MPI_COMM_WORLD, &e->comm, &req);
    st = wait_start_req(&req, par__now() + timeout, "starting a world (MPI_Comm_idup)");
    if (st != PAR_OK) {
        e->comm = MPI_COMM_NULL; /* pending: not ours to free */
        goto fail_free_world;
    }
    /* Every process must ask the same world size: the same verdict everywhere. */
    int64_t *sizes = par_malloc((size_t)nprocs * sizeof *sizes, PAR_TAG_COMM);
    if (!sizes) {
        st = par_err(PAR_ENOMEM, "mpi: no memory for %d processes", nprocs);
        goto fail_free_world;
    }
    int64_t mine = n;
    MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes, 1, MPI_INT64_T, e->comm, &req);
    st = wait_start_req(&req, par__now() + timeout, "comparing world sizes (MPI_Iallgather)");
    for (int q = 0; q < nprocs && st == PAR_OK; q++) {
        if (sizes[q] != n) {
            st = par_err(PAR_EMISMATCH,
                         "mpi: the processes ask different world sizes: process %d asks %lld "
                         "ranks, process %d asks %lld",
                         proc, (long long)n, q, (long long)sizes[q]);
        }
    }
    par_free(sizes);
    if (st == PAR_OK)
        st = check_fingerprints(e, timeout);
    if (st != PAR_OK)
        goto fail_free_world;
    if (n % nprocs != 0) {
        st = par_err(PAR_EINVAL,
                     "mpi: a world of %d ranks does not fit the %d MPI processes mpiexec "
                     "started: the world size must be a multiple of the process count (each "
                     "process hosts world size / processes ranks), e.g. %d or %d",
                     n, nprocs, n / nprocs * nprocs > 0 ? n / nprocs * nprocs : nprocs,
                     n / nprocs * nprocs > 0 ? (n / nprocs + 1) * nprocs : 2 * nprocs);
        goto fail_free_world;
    }
    e->R = n / nprocs;
    if (e->R > 1 && g_provided < MPI_THREAD_SERIALIZED) {
        st = par_err(PAR_EUNSUPPORTED,
                     "mpi: %d ranks per process need MPI_THREAD_SERIALIZED, but MPI was "
                     "initialized with thread level %d",
                     e->R, g_provided);
        goto fail_free_world;
    }
    int *tag_ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
    e->p2p_tag0 = TAG_CHAN0 + 2 * e->R * e->R;
    if (e->R >= (int)TSYNC_CNT_MASK || (flag && (int64_t)e->p2p_tag0 + P2P_TAGS > *tag_ub)) {
        st = par_err(PAR_EUNSUPPORTED,
                     "mpi: %d ranks per process need %lld message tags, MPI offers %d", e->R,
                     (long long)e->p2p_tag0 + P2P_TAGS, flag ? *tag_ub : 0);
        goto fail_free_world;
    }
    if ((e->R > 1 && (st = world_slots_new(e))) || (st = fibers_start(e)) ||
        (st = liveness_start(e, timeout)))
        goto fail_free_world;
    *bworld = e;
    return PAR_OK;

fail_free_world:
    mworld_free(e);
    return st;
}

static void m_world_finalize(par__world *w, void *bworld)
{
    (void)w;
    liveness_stop(bworld);
    if (((mworld *)bworld)->fs)
        fibers_report(bworld);
    mworld_free(bworld);
}

/* Processes this one still waits for at the end (neither DONE nor dead),
 * as "1,3" in who; returns how many. */
static int laggards(const mworld *e, char *who, size_t n)
{
    size_t k = 0;
    int cnt = 0;
    who[0] = '\0';
    for (int q = 0; q < e->nprocs; q++)
        if (q != e->proc && !e->proc_done[q] && !e->dead[q]) {
            cnt++;
            if (k < n - 16)
                k += (size_t)snprintf(who + k, n - k, "%s%d", k ? "," : "", q);
        }
    return cnt;
}

/* DONE (with this process's failure, if any) to every live process. */
static void e_send_done(mworld *e)
{
    par_status f = par__world_failed(e->w);
    ctrlmsg m = {.kind = CT_DONE, .status = f, .src_wrank = e->proc * e->R};
    if (f) {
        if (e->fail_msg[0]) {
            m.src_wrank = e->fail_wrank;
            snprintf(m.msg, sizeof m.msg, "%s", e->fail_msg);
        } else {
            snprintf(m.msg, sizeof m.msg, "a rank of MPI process %d failed (%s); see that process's log", e->proc,
                     par_status_str(f));
        }
    }
    atomic_store(&e->notified, 1);
    e->rep_st[e->proc] = m.status;
    e->rep_rank[e->proc] = m.src_wrank;
    snprintf(e->rep_msg[e->proc], sizeof e->rep_msg[e->proc], "%s", m.msg);
    for (int q = 0; q < e->nprocs; q++)
        if (q != e->proc)
            e_send_ctrl(e, q, &m);
}

/* One first failure for the whole world: of the failures the processes
 * reported in their DONE (each the first it knew of), the one of the lowest
 * world rank.  Every live process holds the same reports, so every process
 * names the same "rank N failed first" (a mismatch that each member detects
 * itself no longer gives each process its own story). */
static void e_agree_failure(mworld *e)
{
    int best = -1;
    for (int q = 0; q < e->nprocs; q++)
        if (e->rep_st[q] && !e->dead[q] && (best < 0 || e->rep_rank[q] < e->rep_rank[best]))
            best = q;
    if (best < 0)
        return;
    if (par__world_failed(e->w))
        par__world_set_first_failure(e->w, e->rep_rank[best], e->rep_st[best], e->rep_msg[best]);
    else
        par__world_fail(e->w, e->rep_rank[best], e->rep_st[best], e->rep_msg[best]);
}

/* After this process's ranks returned: DONE to every process, then serve
 * the engine and drain until every other process said DONE or is dead (the
 * watchdog finds those).  The wait has a deadline, the world's timeout: a
 * process that is alive but never finishes fails the world with its
 * number.  A warning names the laggards meanwhile. */
static void e_finish(mworld *e)
{
    /* the others' ranks are in comm calls, which time out, or computing: give
     * them twice the timeout (a minute at least) once ours returned */
    double timeout = par__world_timeout(e->w), limit = 2 * timeout > 60 ? 2 * timeout : 60;
    double start = par__now(), warn_at = start + (timeout > 10 ? timeout / 4 : 10), deadline = start + limit;
    int sent = 0;
    unsigned iter = 0;
    char who[160];
    pthread_mutex_lock(&e->mu);
    for (;;) {
        e_progress(e, 1);
        if (!e->watchdog_on && e->dead)
            e_watch(e); /* no watchdog thread: check liveness here */
        if (!sent && !e->out) {
            e_send_done(e);
            sent = 1;
        }
        int left = laggards(e, who, sizeof who);
        if (sent && !left && !e->out) {
            e_agree_failure(e);
            break;
        }
        double now = par__now();
        if (now > deadline) {
            char msg[400];
            snprintf(msg, sizeof msg, "mpi: process %d: its ranks returned %.0f s ago, but MPI process(es) %s did not "
                     "finish the world within twice the comm timeout (%g s; they are alive: they still answer)",
                     e->proc, now - start, left ? who : "(none: sends pending)", limit);
            PAR_LOG_E("%s", msg);
            par__world_fail(e->w, e->proc * e->R, PAR_ETIMEOUT, msg);
            atomic_store(&g_peer_gone, 1); /* MPI_Finalize would wait for them */
            break;
        }
        if (now > warn_at) {
            PAR_LOG_W("mpi: process %d: its ranks returned %.0f s ago; still waiting for MPI "
                      "process(es) %s to finish the world", e->proc, now - start, who);
            warn_at = now + 2 * (warn_at - start);
        }
        pthread_mutex_unlock(&e->mu);
        if (++iter > 200) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        } else {
            sched_yield();
        }
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
}

static void run_rank(mworld *e, par__rank_main main_fn, int r)
{
    main_fn(e->w, r);
    if (!par__world_failed(e->w) || !par_last_error()[0] || atomic_load(&e->notified))
        return;
    /* This rank failed; its message is the thread's last error.  A rank that
     * returned PAR_ECOMM only saw another rank's failure: that rank (or
     * e_check_unsent) tells the other processes, with the first message. */
    char d[200];
    par__rank_describe(e->w, r, d, sizeof d);
    if (!strstr(d, par_status_str(PAR_ECOMM)))
        e_notify(e, r, par_last_error());
}

static par_status m_launch(par__world *w, void *bworld, par__rank_main main_fn)
{
    mworld *e = bworld;
    int R = e->R, base = e->proc * R;
    par_status st = PAR_OK;
    if (R == 1) {
        run_rank(e, main_fn, base);
    } else if (e->fs) {
        fiber_job j = {e, main_fn};
        st = fsched_run(e->fs, fiber_rank, &j);
    } else if (omp_get_thread_limit() < R) {
        st = par_err(PAR_EUNSUPPORTED,
                     "mpi: %d ranks per process exceed OpenMP's thread limit %d "
                     "(OMP_THREAD_LIMIT)", R, omp_get_thread_limit());
    } else {
        int dyn = omp_get_dynamic(), got = 0;
        omp_set_dynamic(0);
#pragma omp parallel num_threads(R) shared(got)
        {
#pragma omp single
            got = omp_get_num_threads();
            if (got == R)
                run_rank(e, main_fn, base + omp_get_thread_num());
        }
        omp_set_dynamic(dyn);
        if (got != R)
            st = par_err(PAR_EUNSUPPORTED,
                         "mpi: OpenMP gave %d threads for %d ranks per process (nested "
                         "parallel region?)", got, R);
    }
    if (st != PAR_OK) {
        par__world_fail(w, base, st, par_last_error());
        e_notify(e, base, par_last_error());
    }
    e_finish(e);
    return st;
}

const par_backend par_backend_mpi = {
    .name = "mpi",
    .summary = "ranks in the MPI processes of mpiexec, R = world size / processes per process "
               "(fibers, or threads, within a process share memory)",
    .max_ranks = 0,
    .world_init = m_world_init,
    .world_finalize = m_world_finalize,
    .launch = m_launch,
    .group_world = m_group_world,
    .group_split = m_split,
    .group_free = m_group_free,
    .exchange = m_exchange,
    .p2p_post = m_p2p_post,
    .p2p_poll = m_p2p_poll,
    .p2p_cancel = m_p2p_cancel,
    .rank_wait = m_rank_wait,
    .rank_wake = m_rank_wake,
};
