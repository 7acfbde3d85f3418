/* parallel/step/exec-impl.h - the step executor's state, shared by its
 * files: exec.c (create, the schedule interpreter, the step, bubble),
 * exec_stage.c (what one (microbatch, stage) computes), exec_setup.c (the
 * step's microbatches), exec_hold.c (which pipeline rank holds what),
 * exec_hooks.c (the hooks, from a table), exec_dump.c (the golden-format
 * dump of a step).  Not part of its interface (parallel/step/exec.h). */
#ifndef PAR_PARALLEL_STEP_EXEC_IMPL_H
#define PAR_PARALLEL_STEP_EXEC_IMPL_H

#include <stdint.h>

#include "core/alloc.h"
#include "parallel/hook/hookset.h"
#include "parallel/hook/mbstate.h"
#include "parallel/layout/groups.h"
#include "parallel/schedule/schedule.h"
#include "parallel/step/exec.h"

/* One stage of this rank: its segment's items and their block indices. */
typedef struct {
    int stage, dir, chunk;
    int n_items;
    char *items;  /* [n_items] E t m L */
    int *block;   /* [n_items] block index of t / m items, else -1 */
} lstage;

/* What (mb, stage) keeps from its forward to its backward (and from B to
 * W): one arena of activations and the weight passes' inputs.  (The hooks
 * keep theirs per (mb, block): parallel/hook/mbstate.h.) */
typedef struct {
    int n_items;          /* the stage's items (blk's length) */
    par_arena ar;
    const par_real *xin;  /* [T, n, d] the stage's input (received, or the previous local stage's output) */
    par_real *xout;       /* [T, n, d] its output (may be xin for an empty segment) */
    par_real *gout;       /* [T, n, d] gradient of xout (received / local); NULL: zero */
    par_real *dxe;        /* [T, n, d] the E item's input gradient, for its W (embed.weight) */
    int fwd_done, bwd_done, w_due;
    PAR_FN(par_block_act) *blk; /* [n_items] */
    PAR_FN(par_head_act) head, mtp_head;
    PAR_FN(par_mtp_act) mtp;
    PAR_FN(par_stats) st; /* the microbatch's aux counts (par_stats_view of the model's window, in ar) */
} mbstage;

/* A send in flight and the heap copy it sends from (reap_sends frees both
 * once it is due, wait_sends the rest at the step's end). */
typedef struct {
    par_request *req;
    par_real *buf;
} sendrec;

/* Virtual time inside compute actions, by kind (F, B or BW, W) and stage. */
enum { COST_F = 0, COST_B, COST_W, COST_KINDS };

/* Room for the hook table's entries (exec_hooks.c). */
#define PAR__EXEC_MAX_HOOKS 8

struct PAR_FN(par_exec_s) {
    const par_layout *lay;
    par_config cfg;
    par_schedule sch;
    int p, me, m, n_stages;
    par_comm *pc;             /* the PP group (peers = pipeline ranks) */
    par_comm *pair;           /* DualPipe: {r, p-1-r} of the PP group; else NULL */
    void *hooks[PAR__EXEC_MAX_HOOKS]; /* each hook set's hook (exec_hooks.c's table), NULL: not this layout's */
    /* GPU mode: the installed executors, called in host mode by M's wrappers (exec_hooks.c) */
    PAR_FN(par_attn_exec) dev_attn;
    PAR_FN(par_moe_exec) dev_moe;
    PAR_FN(par_vocab_exec) dev_vocab;
    par_comm *cpc;            /* CP > 1: the CP group */
    par_comm *tpc;            /* TP > 1: the TP group */
    int tp_rank, etp_rank;    /* this rank's TP and ETP coordinates (the shards it stores) */
    unsigned tp_faults;       /* PAR_TP_FAULT_* (0 in real runs) */
    unsigned tp_grads;        /* what par_reduce_tp_grads sums (PAR_TPG_*) */
    par_comm *etpc;           /* ETP > 1: the ETP group */
    int64_t CP;
    /* The group whose ranks hold disjoint column slices of the same rows:
     * CP's, or TP's under sequence parallelism (TP x CP is refused); NULL:
     * none.  spn: the slices per CP slice (TP under SP, else 1); the rank's
     * columns are [(cp*spn + tp) * S/(CP*spn), ...). */
    par_comm *tokc;
    int64_t spn, col;
    int n_local;              /* stages on this rank */
    lstage *ls;               /* [n_local] */
    int *stage_local;         /* [n_stages * n_dirs]: local index of (dir, stage) or -1 */
    int n_blocks, L;
    uint8_t *blocks;          /* [n_blocks] held */
    /* the lowest pipeline rank holding each block's entries, then embed,
     * head and the final norm's (par__exec_holder_pp: per entry), -1 none */
    int *holder_pp;           /* [n_blocks + 3] */
    uint8_t *norm_skip;       /* [(tab.n + 7) / 8] bits (par__exec_skip_set; the norm's mask: finalize.c) */
    int64_t n, d, nd;
    /* the step */
    int64_t B, S, Bl, mbs, Tm;
    int64_t gb_labels, gb_mtp_labels; /* the global batch's label counts (no copy of it per rank) */
    par_batch *mb;            /* [m] this rank's part of each microbatch */
    par_mbctx *mbx;           /* [m] the context each model call passes to the hooks (mbx[k].mb = k) */
    int32_t *pos_rows;        /* CP: [Bl, S] positions of the rank's whole rows */
    int32_t **msample;        /* [m][Tm] sample of each token in its microbatch (0: the window's mq0[mb]) */
    par_mbstate mbst;         /* mbstage of (mb, dir * n_stages + stage) for the rank's stages, from the
                               * microbatch's forward to its backward (parallel/hook/mbstate.h) */
    par_real **out_act, **out_grad; /* [m * n_stages] outboxes (heap copies) */
    sendrec *sends;
    int n_sends, cap_sends;
    int64_t *mq0, *mqn;       /* [m] first window sample of each microbatch, its samples */
    /* kept rows for a dump, [Bl*S*...] per held block / head (NULL: not held) */
    int keep;
    par_real **k_act;         /* [n_blocks] */
    int32_t **k_idx, **k_sel; /* [n_blocks] */
    par_real *k_logits, *k_mtp_logits;
    /* info */
    double dry_bubble;
    const par_netmodel *net;
    const par_costas *ca;     /* --cost-as: the target's costs (NULL: the counted work) */
    int net_steps;
    double net_makespan, net_busy;
    double *cost, *cost_n;    /* [COST_KINDS * n_stages] virtual seconds / actions, this rank, this step */
    double *cost_all;         /* [2, COST_KINDS * n_stages] seconds, actions summed over the PP group and the steps */
    double *acost;            /* [3, m * n_stages] this step's virtual time of each F, B or BW, W (exec.c) */
    double t_start;           /* the pipeline phase's start on the virtual clock */
    double dry_makespan, dry_busy; /* the dry run with the measured action costs, summed over the steps */
    double latency;           /* one PP message on the network */
    int64_t act_peak;
};

typedef PAR_FN(par_exec) exec_t;

/* exec_hold.c: this rank's stages, its model, the holder of every entry. */
par_status PAR_FN(par__exec_hold)(exec_t *ex, PAR_FN(par_model) *M, uint64_t seed, int64_t e0, int64_t e1,
                                  const par_exec_opts *o);
void PAR_FN(par__exec_hold_free)(exec_t *ex);
/* The lowest pipeline rank holding float entry idx of table t (-1: none). */
int PAR_FN(par__exec_holder_pp)(const exec_t *ex, const par_param_table *t, int idx);
/* Sets entry idx's norm-skip bit to v. */
static inline void par__exec_skip_set(uint8_t *bits, int idx, int v)
{
    bits[idx >> 3] = (uint8_t)((bits[idx >> 3] & ~(1u << (idx & 7))) | ((unsigned)(v != 0) << (idx & 7)));
}

/* exec_stage.c: the state and the compute of one (mb, stage). */
par_status PAR_FN(par__exec_mbstage)(exec_t *ex, int mb, int stage, mbstage **out, lstage **lso);
/* The table of the (mb, stage) states (once, at the first step). */
par_status PAR_FN(par__exec_mbstage_init)(exec_t *ex);
int PAR_FN(par__exec_local_of)(const exec_t *ex, int mb, int stage);
void PAR_FN(par__exec_release_all)(exec_t *ex);
par_status PAR_FN(par__exec_forward)(exec_t *ex, PAR_FN(par_model) *M, int mb, int stage);
/* kind: PAR_ACT_B (input passes), PAR_ACT_W (weight passes), PAR_ACT_BW
 * (both, item by item) */
par_status PAR_FN(par__exec_backward)(exec_t *ex, PAR_FN(par_model) *M, int mb, int stage, int kind);

/* exec_setup.c: the step's microbatches, sample numbers and counts. */
par_status PAR_FN(par__exec_setup)(exec_t *ex, const par_pctx *P, PAR_FN(par_model) *M, const int32_t *tok,
                                   const int32_t *seg);
void PAR_FN(par__exec_setup_free)(exec_t *ex);

/* exec_dump.c: the rows kept for a dump. */
par_status PAR_FN(par__exec_keep_alloc)(exec_t *ex, const PAR_FN(par_model) *M);
void PAR_FN(par__exec_keep_free)(exec_t *ex);

/* exec_hooks.c: the hooks of the layout, from the table (parallel/hook/hookset.h). */
par_status PAR_FN(par__exec_hooks_create)(exec_t *ex, const par_hook_env *e, PAR_FN(par_model) *M);
void PAR_FN(par__exec_hooks_step)(exec_t *ex, PAR_FN(par_model) *M, int keep); /* before each step */
void PAR_FN(par__exec_hooks_report)(const exec_t *ex, const par_hook_report *r);
void PAR_FN(par__exec_hooks_free)(exec_t *ex);

#endif
