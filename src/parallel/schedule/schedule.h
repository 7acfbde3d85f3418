/* parallel/schedule/schedule.h - pipeline schedules as data, and their dry run.
 *
 * A schedule is, for every pipeline rank, the ordered list of actions that
 * rank runs in one training step: compute (F, B, W, BW) on one microbatch of
 * one model chunk, and explicit point-to-point messages (send / receive of
 * an activation or of a gradient) with peer rank and tag.  One executor runs
 * any schedule; the generators below produce GPipe, 1F1B, interleaved 1F1B
 * (Megatron-LM's VPP), ZB-H1, DualPipe and DualPipeV.  Untemplated.
 *
 * Stages.  Every microbatch travels through one pipeline of n_stages stages
 * (DualPipe has two pipelines, "directions": microbatches [0, m/2) run
 * direction 0, [m/2, m) direction 1).  par_schedule_stage_rank/_chunk map
 * (dir, stage) to the rank and its local model chunk:
 *   gpipe, 1f1b, zb-h1   stage s = rank s, chunk 0                (S = p)
 *   interleaved          stage s = rank s % p, chunk s / p        (S = p*v)
 *   dualpipe             dir 0: stage s = rank s, chunk 0;
 *                        dir 1: stage s = rank p-1-s, chunk 1     (S = p)
 *   dualpipev            stage s < p: rank s, chunk 0;
 *                        stage s >= p: rank 2p-1-s, chunk 1       (S = 2p)
 * In DualPipe both directions hold the same layers for one stage index
 * (stage s is model part s in either direction, two parameter copies).
 *
 * Executor model (what the dry run simulates, docs/schedules.md):
 *   - SEND_* posts the message and returns at once (isend; the executor waits
 *     for all its sends at the end of the step), so a send never blocks;
 *   - RECV_* blocks until the matching message (same src, dst, tag) has been
 *     posted and has travelled `latency`;
 *   - compute actions run in list order; an F flagged `overlap` and the B or
 *     BW right after it run as one overlapped unit (DualPipe's F&B).
 * Tags follow one rule: the message leaving stage s of microbatch mb has
 *   tag = 2 * (mb * n_stages + s) + (0 for an activation, 1 for a gradient),
 * and goes to the rank of stage s+1 (activation) or s-1 (gradient).  A
 * transfer between two stages on the same rank (DualPipeV's turn at the
 * last rank) is local: no message.
 *
 * Usage:
 *   par_schedule_params sp;
 *   par_schedule_params_init(&sp);
 *   sp.kind = PAR_SCHED_1F1B; sp.pp = 8; sp.n_micro = 32;
 *   par_schedule s;
 *   if (par_schedule_build(&sp, &s) != PAR_OK) puts(par_last_error());
 *   par_sched_costs c;  par_sched_costs_init(&c);      // F=1, B=2, W=1
 *   par_sched_sim sim;
 *   if (par_schedule_simulate(&s, &c, &sim) == PAR_OK)
 *       printf("bubble %.3f\n", sim.bubble);           // 7/39 here
 *   par_sched_sim_free(&sim);
 *   par_schedule_free(&s);
 */
#ifndef PAR_PARALLEL_SCHEDULE_SCHEDULE_H
#define PAR_PARALLEL_SCHEDULE_SCHEDULE_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef enum {
    PAR_SCHED_GPIPE = 0,
    PAR_SCHED_1F1B,
    PAR_SCHED_INTERLEAVED,
    PAR_SCHED_ZBH1,
    PAR_SCHED_DUALPIPE,
    PAR_SCHED_DUALPIPEV,
    PAR_SCHED_COUNT
} par_sched_kind;

typedef enum {
    PAR_ACT_F = 0,      /* forward                                          */
    PAR_ACT_B,          /* backward for the input gradient only (W later)   */
    PAR_ACT_W,          /* backward for the weight gradient of an earlier B */
    PAR_ACT_BW,         /* the whole backward (B and W at once)             */
    PAR_ACT_SEND_ACT,   /* send F's output to the next stage                */
    PAR_ACT_RECV_ACT,   /* receive F's input from the previous stage        */
    PAR_ACT_SEND_GRAD,  /* send B's input gradient to the previous stage    */
    PAR_ACT_RECV_GRAD,  /* receive B's output gradient from the next stage  */
    PAR_ACT_COUNT
} par_act_kind;

typedef struct {
    int8_t kind;     /* par_act_kind                                        */
    int8_t dir;      /* pipeline: DualPipe's direction (0, 1); else 0       */
    int8_t overlap;  /* F only: runs overlapped with the B/BW right after   */
    int8_t chunk;    /* local model chunk on this rank                      */
    int32_t stage;   /* stage in its pipeline, 0..n_stages-1: for compute
                      * the stage computed; for a send the stage whose output
                      * leaves; for a receive the stage that consumes it     */
    int32_t mb;      /* microbatch, 0..m-1                                  */
    int32_t peer;    /* messages: the other rank; compute: -1               */
    int32_t tag;     /* messages: the tag rule above; compute: -1           */
} par_action;

typedef struct {
    par_sched_kind kind;
    int pp;        /* pipeline ranks p                                      */
    int vpp;       /* interleaved: chunks per rank v; 0: the kind's default */
    int n_micro;   /* microbatches m                                        */
    int mb_group;  /* interleaved: microbatches per virtual-stage group; 0: p */
} par_schedule_params;

typedef struct {
    par_schedule_params params;  /* resolved (vpp, mb_group filled in)     */
    int n_dirs;       /* 1, or 2 for DualPipe                               */
    int n_stages;     /* stages of one pipeline                             */
    int n_chunks;     /* model chunks per rank                              */
    int split_bw;     /* 1: backward is B then W (zb-h1, dualpipe(v))       */
    int *n_actions;   /* [pp]                                               */
    int *cap_actions; /* [pp] (room in actions[r], for par_schedule_push)   */
    par_action **actions; /* [pp][n_actions[r]]                             */
} par_schedule;

void par_schedule_params_init(par_schedule_params *p);

/* "gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe", "dualpipev". */
const char *par_schedule_kind_name(par_sched_kind k);
par_status par_schedule_kind_parse(const char *name, par_sched_kind *out);
/* "F", "B", "W", "BW", "send-act", "recv-act", "send-grad", "recv-grad". */
const char *par_action_kind_name(par_act_kind k);

/* Checks the combination (PAR_EINVAL naming the rule and the numbers):
 * p >= 1 (>= 2 for interleaved and dualpipe(v)), m >= 1; interleaved:
 * v >= 2 and PP <= group <= m, and m % group is 0 or >= PP (Megatron-LM);
 * dualpipe: p even, m even, m >= 2p; dualpipev: v == 2, m >= 2p; others
 * v == 1.  On success *out is p with vpp and mb_group resolved. */
par_status par_schedule_params_check(const par_schedule_params *p, par_schedule_params *out);

/* Generates the schedule.  *out is set only on success; free it with
 * par_schedule_free. */
par_status par_schedule_build(const par_schedule_params *p, par_schedule *out);
void par_schedule_free(par_schedule *s);

/* The rank and local chunk of (dir, stage); the direction of a microbatch. */
int par_schedule_stage_rank(const par_schedule *s, int dir, int stage);
int par_schedule_stage_chunk(const par_schedule *s, int dir, int stage);
int par_schedule_mb_dir(const par_schedule *s, int mb);
/* The tag of the message leaving `stage` of `mb` (grad: 0 activation, 1). */
int par_schedule_tag(const par_schedule *s, int mb, int stage, int grad);

/* Appends an action to rank r (grows the list). */
par_status par_schedule_push(par_schedule *s, int rank, par_action a);
/* Index of the first action of rank r with this kind, mb and stage, or -1. */
int par_schedule_find(const par_schedule *s, int rank, par_act_kind kind, int mb, int stage);
/* Removes action i of rank r / moves action i of rank r to position j
 * (for tests that break schedules on purpose). */
par_status par_schedule_remove(par_schedule *s, int rank, int i);
par_status par_schedule_move(par_schedule *s, int rank, int i, int j);

/* "F mb 3 stage 5 (dir 0, chunk 1)", "recv-act mb 3 stage 5 from rank 0 tag 70". */
void par_action_str(const par_action *a, char *buf, size_t n);

/* ---- dry run -------------------------------------------------------------- */

/* Costs of the emulated clock, in abstract time units.  b is the WHOLE
 * backward of one stage (BW costs b); when the backward is split, B costs
 * b - w and W costs w (so B + W = b).  fb is one overlapped F&B unit
 * (DualPipe); 0 means f + the cost of its backward (no overlap gain).
 * f_stage/b_stage/w_stage, when not NULL, give per-stage costs
 * ([n_stages] of the schedule) instead of f/b/w. */
typedef struct {
    double f, b, w, fb;
    double latency;    /* time from a send's post to its arrival            */
    const double *f_stage, *b_stage, *w_stage;
    /* when not NULL: the time of every compute action as an executor ran
     * it, [3][m * n_stages] at index mb * n_stages + stage: [0] its F, [1]
     * its B or BW, [2] its W (each >= 0); replaces f / b / w (and their
     * stage arrays) for that action (parallel/step/exec.c compares its
     * timeline with this dry run) */
    const double *action;
} par_sched_costs;

/* f = 1, b = 2, w = 1, fb = 0 (no overlap gain), latency 0, no arrays. */
void par_sched_costs_init(par_sched_costs *c);

typedef struct {
    double start, end;  /* compute: running; send: post time (start=end);
                         * recv: from reaching it to completion              */
} par_sched_span;

typedef struct {
    int pp;
    double makespan;     /* last end over all ranks                         */
    double bubble;       /* sum of idle / (p * makespan)                    */
    double *busy;        /* [pp] compute time per rank                      */
    double *idle;        /* [pp] makespan - busy                            */
    int *peak_live;      /* [pp] most (mb, stage) with F done, B not yet    */
    int *peak_held;      /* [pp] most (mb, stage) with F done, W not yet
                          * (saved inputs kept for W; = peak_live unsplit)  */
    int64_t n_messages;  /* messages sent (and matched)                     */
    par_sched_span **spans; /* [pp][n_actions[r]]                           */
} par_sched_sim;

/* The dry run: runs every rank's list under the executor model above and
 * checks that each action's peer, tag, rank and chunk follow the rules;
 * that every receive gets its message and every message is received; that
 * nothing deadlocks (else PAR_ECHECK naming the cycle of waiting ranks);
 * F(mb, s) after F(mb, s-1) (its input arrived), B after F and after B of
 * stage s+1, W after B; and that each (mb, stage) has exactly one F and one
 * B+W or BW.  Failures are PAR_ECHECK (schedule broken) or PAR_EINVAL (bad
 * costs).  *out is set only on success; free it with par_sched_sim_free. */
par_status par_schedule_simulate(const par_schedule *s, const par_sched_costs *c, par_sched_sim *out);
void par_sched_sim_free(par_sched_sim *sim);

/* One line per rank, one column per `quantum` of time (0: the smallest
 * nonzero uniform cost; grown so at most max_cols columns): F B W X (=BW)
 * for direction/chunk 0 and f b w x for the other, '.' idle. */
void par_sched_timeline_text(const par_schedule *s, const par_sched_sim *sim, double quantum, int max_cols,
                             FILE *out);

/* Timeline as SVG (one row per rank, a coloured box per compute action with
 * its mb) and as Chrome trace JSON ({"traceEvents": [...]}, ph "X", pid =
 * tid = rank, 1 time unit = 1 ms), each written atomically. */
par_status par_sched_write_svg(const par_schedule *s, const par_sched_sim *sim, const char *path);
par_status par_sched_write_trace(const par_schedule *s, const par_sched_sim *sim, const char *path);

#endif
