/* comm/clock.h - the virtual clock of every rank on the emulated network.
 *
 * Attach a par_netrun to a world (par_world_opts.net) and every rank gets a
 * clock that starts at 0 and advances, deterministically, by
 *   - compute: at every comm event the work counted since the last one
 *     (core/counters.h) costs max(flops / peak, bytes / HBM bandwidth);
 *   - collectives: each exchange step ends on every member at
 *     max(members' arrival clocks) + the step's algorithm cost (the clocks
 *     travel in the call metadata every backend already exchanges);
 *   - point to point: a send completes at its post clock + alpha + bytes/beta;
 *     a receive at max(its post clock, the send's post clock + alpha +
 *     bytes/beta); isend/irecv overlap the compute until par_wait, which
 *     advances the clock to max(now, completion).
 * The same run gives the same emulated times on every backend and every
 * thread timing.  See docs/network.md.
 *
 * After the run, par_netrun_stats gives per rank: total emulated time,
 * compute, exposed communication, idle (waiting for other ranks), bytes and
 * messages per tier; comm/trace.h writes the summary and a Chrome trace.
 */
#ifndef PAR_COMM_CLOCK_H
#define PAR_COMM_CLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/netmodel.h"
#include "core/status.h"

typedef struct par_netrun par_netrun;

typedef struct {
    double total_s;                  /* the clock when the rank function returned */
    double compute_s;                /* roofline time of the counted work         */
    double comm_s;                   /* exposed communication: blocked while bytes move */
    double idle_s;                   /* blocked waiting for other ranks to arrive  */
    uint64_t flops, hbm_bytes;       /* counted work                               */
    uint64_t bytes[PAR_TIER_COUNT];  /* bytes sent, by tier (algorithm's traffic)  */
    uint64_t msgs[PAR_TIER_COUNT];   /* messages sent, by tier                     */
    uint64_t steps;                  /* collective exchange steps                  */
    uint64_t p2p;                    /* point-to-point messages completed          */
} par_rankstats;

typedef enum {
    PAR_SPAN_COMPUTE = 0, /* counted work                                  */
    PAR_SPAN_COMM,        /* a collective step or the blocked part of a wait */
    PAR_SPAN_IDLE,        /* blocked waiting for other ranks                */
    PAR_SPAN_XFER,        /* a point-to-point transfer in flight (overlaps) */
} par_spankind;

typedef struct {
    double t0, t1;        /* emulated seconds                               */
    uint64_t bytes;       /* bytes this rank sends (recv: receives)         */
    uint64_t flops;       /* compute spans                                  */
    const char *op;       /* "compute", "allreduce", "send", ... (static)   */
    par_spankind kind;
    par_tier tier;
    int phase;            /* exchange step of the collective                */
    char group[40];
} par_span;

/* A collector for one par_world_run of nranks ranks on model m (copied).
 * record_spans: keep every span for the trace (memory grows with the run). */
par_status par_netrun_create(const par_netmodel *m, int nranks, int record_spans,
                             par_netrun **out);
void par_netrun_free(par_netrun *r);
int par_netrun_nranks(const par_netrun *r);
const par_netmodel *par_netrun_model(const par_netrun *r);
/* Valid after the world returned (NULL for a rank out of range).  Each
 * par_world_run with this collector starts the clocks again at 0. */
const par_rankstats *par_netrun_stats(const par_netrun *r, int rank);
/* The rank's spans in time order (NULL, 0 when not recorded).  *lost > 0
 * when some could not be stored (out of memory). */
const par_span *par_netrun_spans(const par_netrun *r, int rank, size_t *n, size_t *lost);

/* In a rank function: the calling rank's clock now, after charging the work
 * counted so far (0 when the world has no network). */
double par_comm_vclock(par_comm *c);

/* ---- charging a target's sizes (`parity run --cost-as`, docs/planning.md) ----
 * Numerics never change: these only change what the clock charges.  Each
 * acts on the calling rank's clock (no-ops without a network).
 *
 * par_comm_cost_explicit: from now on the work counted by the kernels
 * (core/counters.h) is not charged; compute is what par_comm_charge says.
 * par_comm_charge: advances the clock by flops / peak FLOP/s as compute.
 * par_comm_cost_scale: every later point-to-point message of c costs its
 * bytes times p2p, every later collective of c (other than the
 * all-to-alls) its step bytes times coll (1, 1: as moved; at most 8 comms
 * per rank, PAR_ERANGE past that).
 * par_comm_cost_next: the next all-to-all(v) of c costs bytes_to[j] /
 * bytes_from[j] (c's size entries, copied) `repeat` times over instead of
 * its buffers (NULL arrays: nothing; 0 bytes to every peer costs no
 * time but still synchronizes). */
void par_comm_cost_explicit(par_comm *c);
void par_comm_charge(par_comm *c, double flops);
par_status par_comm_cost_scale(par_comm *c, double p2p, double coll);
par_status par_comm_cost_next(par_comm *c, const size_t *bytes_to, const size_t *bytes_from, double repeat);

#endif
