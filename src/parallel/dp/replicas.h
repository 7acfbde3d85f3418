/* parallel/dp/replicas.h - the replicated dense state a process holds once
 * (templated: see kernels/real.h).  docs/parallel.md, "Replicated state".
 *
 * The ranks of one process that replicate the same dense entries (the DP x
 * CP replicas of one pipeline rank and TP shard: the members of one dp-cp
 * group) hold bitwise-equal weights and, without ZeRO-1, bitwise-equal
 * optimizer state.  They share ONE copy of both, a par_replica of the
 * process's registry (par_replicas, one per run and process: the driver's).
 * Gradients stay per rank (they differ until the reduction).
 *
 * A copy is keyed on (the group: the world rank of its group rank 0, the TP
 * shard, the dense layout: the floats and a hash of (entry, local offset,
 * size) of every shared entry), so a rank holding another shard or another
 * set of entries never joins it.  The first rank that asks creates it,
 * fills the weights from the seed (par_model_fill_shared) and writes a
 * checkpoint's load into it (ticket.writer).  The optimizer step's updates
 * are written by the member with the lowest group rank (par_replica_updater:
 * known once every member has joined, which the step's collectives imply),
 * so that the update's scratch lands on the same rank in every run.  One
 * writer per phase; the others never write the copy.
 *
 * Writes come in phases (a checkpoint load, every optimizer step), the same
 * sequence on every member: the writer writes, then publishes the phase
 * (par_replica_publish); every other member waits for it
 * (par_replica_wait: par_comm_wait_local, no bytes, no clock) before it
 * reads the copy again.  The writer starts writing only after a collective
 * that every member entered after its last read (the optimizer step's world
 * all-reduce of the norm; a load comes before any read): see dp_step.c.
 *
 * The copies are allocated outside every rank's allocator scope: the
 * process's counters show each once, no rank's (per-rank accounts, the
 * memory model's per-rank terms and par_memmodel_shared_of follow the same rule). */
#ifndef PAR_PARALLEL_DP_REPLICAS_H
#define PAR_PARALLEL_DP_REPLICAS_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/counters.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/dp/zero.h"

typedef struct PAR_FN(par_replicas_s) PAR_FN(par_replicas);
typedef struct PAR_FN(par_replica_s) PAR_FN(par_replica);

par_status PAR_FN(par_replicas_create)(PAR_FN(par_replicas) **out);
/* Frees the registry and every copy (after every rank's model is freed). */
void PAR_FN(par_replicas_free)(PAR_FN(par_replicas) *r);
/* Copies in the registry (tests). */
int PAR_FN(par_replicas_count)(const PAR_FN(par_replicas) *r);
/* Write phases published by every copy of this process so far (tests: a
 * copy's update is written once per step, not once per member). */
int64_t PAR_FN(par_replicas_phases)(void);

/* One rank's request: filled by the driver, the model build's share hook
 * context (par_model_hold.share_ctx). */
typedef struct {
    PAR_FN(par_replicas) *reg;
    int64_t group;              /* world rank of the dp-cp group's rank 0 */
    int grank;                  /* this rank in the dp-cp group */
    int tp;                     /* the TP shard */
    PAR_FN(par_replica) *rep;   /* out: the copy joined (NULL: none, the model's own) */
    int writer;                 /* out: 1 when this rank created it (it writes a checkpoint's load) */
    int64_t gen;                /* write phases this rank has passed */
} PAR_FN(par_replica_ticket);

/* par_model_hold.share: joins (or creates) the copy of the ticket's key
 * for the model, sets M->shw. */
par_status PAR_FN(par_replica_share_hook)(void *ticket, void *model);

/* The replicated optimizer state of the copy for a dense plan
 * (par_zero_state_fn; ctx = the ticket): allocated zeroed by the first
 * member, the same sizes asked by every one (else PAR_EINTERNAL). */
par_status PAR_FN(par_replica_state)(void *ticket, size_t n_adamw_state, size_t n_muon_state,
                                     PAR_FN(par_zero_state) *out);

/* 1 when this member writes the optimizer step's updates (the lowest group
 * rank that joined); call it once every member has joined (after a
 * collective of the whole group). */
int PAR_FN(par_replica_updater)(const PAR_FN(par_replica_ticket) *t);

/* The writer ends a write phase: work = the counted work of the phase
 * (core/counters.h), charged to every other member too, so that their
 * virtual clocks are those of the run where each rank wrote its own copy. */
void PAR_FN(par_replica_publish)(PAR_FN(par_replica_ticket) *t, par_counts work);
/* A member that is not the writer: waits for the writer's phase (through
 * comm, the way the rank waits in a collective) and counts its work. */
par_status PAR_FN(par_replica_wait)(PAR_FN(par_replica_ticket) *t, par_comm *c, const char *what);

#endif
