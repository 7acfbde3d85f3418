/* parallel/train/run.h - the parallel training driver behind `parity run`
 * (untemplated header: the CLI includes it; driver.c is compiled twice and
 * defines par_run_f64 / par_run_f32).  docs/parallel.md.
 *
 * par_run resolves the layout (parallel/layout/layout.h), pre-builds the global
 * batches of every step from the same source as `parity golden`, and runs a
 * world of N ranks on the chosen backend.  Each rank:
 *   - builds its groups (parallel/layout/groups.h) and the step executor
 *     (parallel/step/exec.h), which builds the model of the rank's pipeline
 *     stages (every block with PP = 1) holding its EP rank's experts and
 *     installs the EP / CP hooks;
 *   - per step runs the executor on its attention-DP rows [dp*B/Da,
 *     (dp+1)*B/Da) (with CP the column slice [cp*S/CP, (cp+1)*S/CP) of
 *     them): the schedule's forwards and backwards, the statistics and the
 *     pipeline's shared gradients (parallel/reduce/reduce.h); then the optimizer
 *     step (parallel/dp/dpw.h: the DP gradient reduction, the global norm,
 *     the update of what it holds);
 *   - with a dump directory, rank 0 gathers the unsharded golden set
 *     (model/golden.h's writers) and commits it atomically.
 * Tensor parallelism (TP > 1, no SP) runs the attention over the TP group
 * (parallel/tp/tp_attn_hook.h; with CP parallel/cp/cptp_hook.h, with EP the TP copies
 * of parallel/moe/ep_tp.c); expert tensor parallelism (ETP > 1) the routed
 * experts over the ETP group (parallel/moe/etp_hook.h; inside EP
 * parallel/moe/ep_etp.c), with TP = 1 only.
 */
#ifndef PAR_PARALLEL_TRAIN_RUN_H
#define PAR_PARALLEL_TRAIN_RUN_H

#include <stdint.h>
#include <string.h>

#include "comm/clock.h"
#include "comm/comm.h"
#include "comm/netmodel.h"
#include "core/alloc.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/layout/layout.h"

typedef struct {
    par_config cfg;           /* validated; global_batch_size = the layout's B */
    int precision;            /* 64 or 32 */
    int64_t steps;            /* >= 1: the total (Megatron's --train-iters); loaded at step s, s..steps-1 run */
    uint64_t seed;
    const char *data_path;    /* as `parity golden` (at most one of the two) */
    const char *fixture;
    const char *fixtures_dir;
    const par_backend *backend; /* from backends/registry.h (the CLI looks it up) */
    par_layout layout;        /* given fields (par_run resolves a copy) */
    const char *dump_dir;     /* golden-format set to write, or NULL */
    int progress;             /* 1: a line per step on stderr */
    double timeout_s;         /* comm timeout per wait (0: comm's default / env) */
    const par_netmodel *netmodel; /* emulated network (comm/netmodel.h) or NULL: the run
                                   * creates the per-rank clocks (sum->net) */
    int net_spans;            /* 1: record spans for a Chrome trace */
    int moe_dispatch;         /* EP all-to-all: 0 flat, 1 hierarchical (parallel/moe/ep.h par_ep_dispatch);
                               * nodes of netmodel->gpus_per_node ranks, 8 without a network */
    /* checkpoints (parallel/ckpt/ckpt_model.h, docs/checkpoints.md "With the driver") */
    const char *save_dir;     /* --save DIR: written (atomically) every save_interval steps and at the end */
    int64_t save_interval;    /* --save-interval K (0: only at the end) */
    const par_ckpt *load;      /* --load: an open, validated checkpoint (par_ckpt_open), not owned */
    unsigned tp_faults;       /* PAR_TP_FAULT_* bits (parallel/tp/tp.h): deliberate bugs for the fault
                               * demonstrations of tests only; 0 in every real run */
    const char *fingerprint;  /* the whole configuration (comm.h par_world_opts), or NULL */
    int rank_host;            /* comm.h par_world_opts.rank_host (mpi: fibers or threads) */
    const char *cost_as;      /* --cost-as PRESET (parallel/plan/costas.h; needs netmodel) or NULL */
    const char *cost_as_layout; /* --cost-as-layout: the target's pipeline layout, or NULL */
    int private_replicas;     /* 1: every rank holds its own dense weights and optimizer state (the
                               * build before parallel/dp/replicas.h; tests compare the two); 0: the
                               * ranks of a process share one copy */
} par_run_opts;

/* precision 64, steps 1, seed 1234, layout sizes 1 (backend: set it). */
static inline void par_run_opts_init(par_run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->precision = 64;
    o->steps = 1;
    o->seed = 1234;
    par_layout_init(&o->layout);
}

typedef struct {
    double loss, loss_main, loss_mtp, loss_aux, grad_norm;
    double wall_s;            /* forward + reductions + backward + update (dump excluded) */
} par_run_step_info;

#define PAR_RUN_HIST 8

typedef struct {
    int64_t steps;            /* steps this run did (start_step .. start_step + steps - 1; 0: nothing left) */
    int64_t seq_length;       /* S of the run (a --data file's, not the preset's) */
    par_run_step_info *step;  /* [steps] (par_run_summary_free) */
    double wall_s;            /* the whole run (launch, dump included) */
    par_layout layout;        /* resolved */
    char backend[32];
    int64_t n_params;         /* float parameters of the model */
    int64_t max_rank_floats;  /* the largest rank's local parameter floats */
    /* tokens per expert, over every block and step (global counts) */
    int64_t load_min, load_max;
    double load_mean;
    int load_hot_block;       /* the hottest (block, expert) */
    int64_t load_hot_expert, load_hot_tokens;
    int64_t hist[PAR_RUN_HIST]; /* (block, expert) pairs by load / mean: <.25 <.5 <.75 <1 <1.25 <1.5 <2 >=2 */
    /* expert parallelism (zero with EP = 1): rows received per rank, bytes */
    int64_t recv_min, recv_max;
    double recv_mean;
    int64_t dispatch_bytes, combine_bytes; /* summed over ranks, to other ranks only */
    int64_t a2a_calls;        /* all-to-all(v) calls of one rank */
    int moe_dispatch;         /* as opts; ep_gpn: ranks per node of the tiers below */
    int ep_gpn;
    int64_t ep_bytes[2][2];   /* [dispatch, combine][nvlink, ib] bytes, all ranks, fwd+bwd */
    double ep_time_mean[2], ep_time_max[2]; /* [dispatch, combine] emulated s per rank (0: no network) */
    int64_t *ep_recv;         /* [world] rows received by each rank (EP > 1; freed with the summary) */
    /* context parallelism (zero with CP = 1): attention bytes handed to
     * src/comm, summed over ranks and steps (parallel/cp/cp.h's par_cp_traffic) */
    int64_t cp_halo_bytes;    /* halo rows forward + their gradients backward */
    int64_t cp_gather_bytes;  /* compressed entries contributed to the all-gathers */
    int64_t cp_rs_bytes;      /* entry gradients put into the reduce-scatters */
    /* the shared expert (parallel/tp/tp.h par_tp_shared_stats), summed over
     * ranks and steps: forward tokens x hidden units (TP-split: the step's
     * tokens x moe_inter_dim per MoE block; whole on every TP rank: TP times
     * that) and the bytes of its TP collectives */
    int64_t shared_units, shared_tp_bytes;
    /* pipeline parallelism (PP > 1, parallel/step/exec.h): the schedule, its
     * microbatches, the dry run's bubble (F = 1, B = 2, W = 1) and, with an
     * emulated network, the bubble of world rank 0's pipeline measured on the
     * virtual clock over every step (-1: no network) next to the dry run's
     * bubble with the executor's own per-action costs (mean virtual seconds
     * of F, B, W over the stages; the message time) */
    char pp_schedule[16];
    int pp_micro;
    double pp_dry_bubble, pp_net_bubble, pp_net_makespan_s;
    double pp_dry_bubble_measured;
    double pp_cost_f_s, pp_cost_b_s, pp_cost_w_s, pp_latency_s;
    par_netrun *net;          /* with opts.netmodel: the emulated clocks (owned; par_trace_summary) */
    /* per-rank memory accounting (parallel/dp/dpw.h par_dpw_memory), bytes:
     * mem[r*PAR_RUN_MEM + k], k = weights, grads, optim (held), optim_full
     * (unsharded), act (saved activations, max over steps), comm (DP workspace) */
    int64_t *mem;             /* [world * PAR_RUN_MEM] */
    /* the allocator's per-rank truth (core/alloc.h scopes): peak bytes per tag
     * during the steps, alloc_peak[r*PAR_TAG_COUNT + tag], allocated view
     * (blocks + arena handouts) and reserved view (arena chunks whole) */
    int64_t *alloc_peak, *alloc_res_peak; /* [world * PAR_TAG_COUNT] */
    int64_t start_step;       /* the loaded checkpoint's step (0 without --load) */
    int64_t samples0;         /* samples of the first step's global batch (memory model statistics) */
    int64_t saves;            /* checkpoints written */
    int hosts_rank0;          /* this process ran world rank 0 (under MPI one process does: it writes the
                               * dump, prints the results and `parity run --summary`) */
    /* --cost-as: the target preset ("" off), its pipeline layout (the run's when the string is empty),
     * T_t of one microbatch; the emulated figures above are then the target's */
    char cost_as[32];
    char cost_as_layout[PAR_LAYOUT_STR_MAX];
    double cost_as_tokens;
} par_run_summary;
#define PAR_RUN_MEM 6

static inline void par_run_summary_free(par_run_summary *s)
{
    if (!s)
        return;
    par_free(s->mem);
    par_free(s->alloc_peak);
    par_free(s->alloc_res_peak);
    par_free(s->ep_recv);
    par_free(s->step);
    if (s->net)
        par_netrun_free(s->net);
    memset(s, 0, sizeof *s);
}

/* Runs training steps under o->layout up to o->steps in all: from step 0,
 * or from a loaded checkpoint's step s (s..o->steps-1; a dump names its
 * files by the global step and its manifest says "first_step": s).  With s
 * >= o->steps nothing runs or is written (the layout and the checkpoint
 * still checked): PAR_OK with sum->steps 0.  Layout errors are
 * PAR_EINVAL / PAR_EUNSUPPORTED with the rule and the numbers. */
par_status par_run_f64(const par_run_opts *o, par_run_summary *sum);
par_status par_run_f32(const par_run_opts *o, par_run_summary *sum);

static inline par_status par_run(const par_run_opts *o, par_run_summary *sum)
{
    if (o->precision == 32)
        return par_run_f32(o, sum);
    if (o->precision == 64)
        return par_run_f64(o, sum);
    return par_err(PAR_EINVAL, "run: precision must be 64 or 32 bits (got %d)", o->precision);
}

#endif
