/* parallel/plan/memmodel.h - the per-rank memory model (untemplated):
 *
 *   M_peak = weights + grads + optimizer + activations + communication + workspace + model
 *
 * (model: PARITY's per-rank structure, the allocator's `model` tag: the
 * model's ownership map and expert pointers, its RoPE tables and block
 * records, the executor's holders and stage lists, the plans' entry lists,
 * the EP block state, the schedule's action lists; O(the rank's share), not
 * O(table) or O(world): docs/planning.md "Model structure")
 *
 * for every rank of a resolved layout (uneven '|' layouts, embedding, head
 * and MTP placement as parallel/step/exec_hold.c holds them), with the optimizer state
 * of the ZeRO-1 plans (parallel/plan/memmodel_zero.h: the plan geometry itself, Muon's
 * whole matrices), activations from the schedule's own action lists (the
 * microbatches in flight at every moment, parallel/schedule/schedule.h) times the
 * activation table (parallel/plan/memmodel_act.h), the EP receive rows with a skew
 * factor, in bytes for a storage precision.  docs/planning.md has every
 * formula and its source.
 *
 * Two runtimes:
 *   PAR_MM_MEGATRON  what the tuning guide assumes for a GPU job: bf16
 *                    weights, fp32 main grads, fp32 master + optimizer state
 *                    (sharded by ZeRO-1), one microbatch of b rows in flight
 *                    without PP, the dispatch/combine receive buffers and the
 *                    PP p2p buffers as communication;
 *   PAR_MM_PARITY    what `parity run` allocates: every tensor in the working
 *                    precision (f64 / f32), the whole local batch in one
 *                    forward without PP, the DP plans' packed buffers and the
 *                    collectives' staging, pipeline sends kept until the end
 *                    of the step (executor.c).  Validated against the allocator's
 *                    per-rank peaks (tests/parallel/plan/test_memmodel.c).
 *
 * Each term is the peak of that kind over a step; M_peak is their sum (an
 * upper bound: the terms need not peak at the same moment).
 */
#ifndef PAR_PARALLEL_PLAN_MEMMODEL_H
#define PAR_PARALLEL_PLAN_MEMMODEL_H

#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/layout/layout.h"

typedef enum {
    PAR_MM_MEGATRON = 0,
    PAR_MM_PARITY = 1,
} par_memmodel_runtime;

/* The dispatch receive skew used without a run: the most-loaded EP rank
 * receives this many times its balanced share (docs/planning.md). */
#define PAR_MM_DEFAULT_SKEW 1.5

typedef struct {
    par_memmodel_runtime rt;
    int real_bytes;           /* PARITY: 8 (f64) or 4 (f32); MEGATRON: ignored (bf16 / fp32) */
    int recompute;            /* MEGATRON: 1 = --recompute-granularity full */
    double skew;              /* EP receive skew without measured loads (0: PAR_MM_DEFAULT_SKEW) */
    const int64_t *recv_rows; /* [world] measured EP rows each rank received in one step's forward
                               * (par_run_summary.ep_recv / steps), or NULL */
    int64_t samples;          /* PARITY: samples of the global batch (statistics); 0: one per row */
    double workspace;         /* MEGATRON: fixed per-rank runtime workspace (bytes), e.g. cuBLAS / NCCL */
    int shared_replicas;      /* PARITY: 1 = `parity run`'s default for world > 1: the dense weights and
                               * the replicated dense optimizer state of the ranks of one process held once
                               * (parallel/dp/replicas.h), in no rank's terms but par_memmodel_shared_of's */
    int64_t ranks_per_process; /* PARITY with shared_replicas: world ranks [k R, (k+1) R) share a process
                                * (MPI --ranks-per-process R); 0: the whole world is one process */
} par_memmodel_opts;

void par_memmodel_opts_init(par_memmodel_opts *o); /* MEGATRON, skew default, nothing measured */

/* One rank's estimate, bytes.  The six terms, then what they are made of. */
typedef struct {
    int rank, stage;          /* world rank, pipeline rank */
    double weights, grads, optim, act, comm, workspace, total;
    double optim_state;       /* AdamW m, v + Muon momentum this rank holds */
    double optim_master;      /* MEGATRON: fp32 master weights of its shard */
    double act_saved;         /* peak saved activations (schedule in-flight x table) */
    double act_fixed;         /* batches, statistics, per-step tables */
    double comm_dp;           /* PARITY: the DP plans' packed buffers */
    double comm_pp;           /* pipeline messages (PARITY: the step's sends; MEGATRON: p2p buffers) */
    double comm_dispatch;     /* MEGATRON: dispatch + combine receive buffers */
    double ws_bwd;            /* workspace: the backward's scratch at the peak */
    double ws_muon;           /* workspace: Muon's Newton-Schulz scratch */
    double ws_staging;        /* workspace: the collectives' staging (PARITY) */
    double model;             /* PARITY: model structure (tag `model`), in total; MEGATRON: 0 */
    int64_t held_floats;      /* parameters this rank holds */
    int inflight;             /* most (microbatch, chunk) pairs alive at once */
    double recv_factor;       /* EP rows received per row sent (skew) */
} par_memmodel_rank;

/* The tag-aligned view of parity's allocator (core/alloc.h): param =
 * weights, grad = grads, optim = optimizer + Muon scratch, act =
 * activations + backward scratch, comm = communication + staging, model =
 * the model structure. */
double par_memmodel_tag(const par_memmodel_rank *r, par_tag tag);

typedef struct par_memmodel par_memmodel;

/* Builds the model of a RESOLVED layout (par_layout_resolve) for cfg (the
 * parameter table is built inside: planning presets are fine).  *out is
 * set only on success; free it with par_memmodel_free. */
par_status par_memmodel_create(par_memmodel **out, const par_config *cfg, const par_layout *l, const par_memmodel_opts *o);
/* The same with cfg's table built once by the caller (borrowed; it must
 * outlive the model): what a search over many layouts does. */
par_status par_memmodel_create_shared(par_memmodel **out, const par_config *cfg, const par_layout *l, const par_memmodel_opts *o,
                                const par_param_table *tab);
void par_memmodel_free(par_memmodel *mm);

/* The estimate of world rank r. */
par_status par_memmodel_rank_of(par_memmodel *mm, int r, par_memmodel_rank *out);
/* PARITY with shared_replicas: the bytes of the shared copies the process
 * of world rank r holds (one per dense replica group: pipeline rank x TP
 * shard present in it), else 0. */
par_status par_memmodel_shared_of(par_memmodel *mm, int r, double *out);
/* The heaviest rank (largest total) of pipeline rank `stage`. */
par_status par_memmodel_stage_heaviest(par_memmodel *mm, int stage, par_memmodel_rank *out);

#endif
