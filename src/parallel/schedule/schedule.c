/* parallel/schedule/schedule.c - schedule generators: GPipe, 1F1B, interleaved 1F1B,
 * ZB-H1, DualPipe, DualPipeV (docs/schedules.md gives each construction and
 * its source).  Untemplated. */
#include "parallel/schedule/schedule.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

static const char *const kind_names[PAR_SCHED_COUNT] = {"gpipe", "1f1b", "interleaved",
                                                         "zb-h1", "dualpipe", "dualpipev"};
static const char *const act_names[PAR_ACT_COUNT] = {"F", "B", "W", "BW",
                                                      "send-act", "recv-act", "send-grad", "recv-grad"};

void par_schedule_params_init(par_schedule_params *p)
{
    memset(p, 0, sizeof *p);
    p->kind = PAR_SCHED_1F1B;
    p->pp = 1;
    p->n_micro = 1;
}

const char *par_schedule_kind_name(par_sched_kind k)
{
    return (k >= 0 && k < PAR_SCHED_COUNT) ? kind_names[k] : "?";
}

par_status par_schedule_kind_parse(const char *name, par_sched_kind *out)
{
    for (int k = 0; k < PAR_SCHED_COUNT; k++)
        if (name && !strcmp(name, kind_names[k])) {
            *out = (par_sched_kind)k;
            return PAR_OK;
        }
    return par_err(PAR_EINVAL,
                   "unknown pipeline schedule '%s' (known: gpipe, 1f1b, interleaved, zb-h1, dualpipe, "
                   "dualpipev)",
                   name ? name : "(null)");
}

const char *par_action_kind_name(par_act_kind k)
{
    return (k >= 0 && k < PAR_ACT_COUNT) ? act_names[k] : "?";
}

par_status par_schedule_params_check(const par_schedule_params *in, par_schedule_params *out)
{
    par_schedule_params p = *in;
    const char *name = par_schedule_kind_name(p.kind);
    if (p.kind < 0 || p.kind >= PAR_SCHED_COUNT)
        return par_err(PAR_EINVAL, "pipeline schedule kind %d is not one of the %d known", (int)p.kind,
                       PAR_SCHED_COUNT);
    if (p.pp < 1)
        return par_err(PAR_EINVAL, "pipeline-model-parallel-size must be >= 1, got %d", p.pp);
    if (p.n_micro < 1)
        return par_err(PAR_EINVAL, "the number of microbatches must be >= 1, got %d", p.n_micro);
    if (p.vpp < 0)
        return par_err(PAR_EINVAL, "virtual-pipeline-model-parallel-size must be >= 1, got %d", p.vpp);
    if (p.pp > 4096 || p.n_micro > 65536 || p.vpp > 64 || (int64_t)p.pp * p.n_micro * (p.vpp ? p.vpp : 2) > 4000000)
        return par_err(PAR_EINVAL,
                       "pipeline schedule too large for the dry run: PP %d, VPP %d, m %d (limits: PP <= 4096, "
                       "VPP <= 64, m <= 65536, PP*VPP*m <= 4e6)",
                       p.pp, p.vpp, p.n_micro);
    switch (p.kind) {
    case PAR_SCHED_INTERLEAVED: {
        if (p.vpp == 0)
            p.vpp = 2;
        if (p.vpp < 2)
            return par_err(PAR_EINVAL,
                           "pipeline schedule 'interleaved' needs virtual-pipeline-model-parallel-size >= 2, "
                           "got %d",
                           p.vpp);
        if (p.pp < 2)
            return par_err(PAR_EINVAL,
                           "pipeline schedule 'interleaved' needs pipeline-model-parallel-size >= 2, got %d",
                           p.pp);
        if (p.mb_group == 0)
            p.mb_group = p.pp;
        /* Megatron-LM, schedules.py forward_backward_pipelining_with_interleaving:
         * microbatch_group_size_per_vp_stage must lie in [PP, M], and the
         * last group (M % group) must be empty or hold >= PP microbatches. */
        if (p.mb_group < p.pp || p.mb_group > p.n_micro)
            return par_err(PAR_EINVAL,
                           "interleaved schedule: the number of contiguous microbatches in a virtual pipeline "
                           "stage (microbatch group size %d) must lie in [PP=%d, M=%d]%s",
                           p.mb_group, p.pp, p.n_micro,
                           p.n_micro < p.pp ? ": M is smaller than PP, use more microbatches" : "");
        int rem = p.n_micro % p.mb_group;
        if (rem > 0 && rem < p.pp)
            return par_err(PAR_EINVAL,
                           "interleaved schedule: M %% group = %d %% %d = %d microbatches in the last group, "
                           "must be 0 or >= PP=%d (else dependency bubbles, as Megatron-LM rejects)",
                           p.n_micro, p.mb_group, rem, p.pp);
        break;
    }
    case PAR_SCHED_DUALPIPE:
        if (p.vpp == 0)
            p.vpp = 1;
        if (p.vpp != 1)
            return par_err(PAR_EINVAL,
                           "pipeline schedule 'dualpipe' holds one stage per direction on each rank: "
                           "virtual-pipeline-model-parallel-size must be 1, got %d",
                           p.vpp);
        if (p.pp < 2 || p.pp % 2)
            return par_err(PAR_EINVAL, "pipeline schedule 'dualpipe' needs an even PP >= 2, got %d", p.pp);
        if (p.n_micro % 2 || p.n_micro < 2 * p.pp)
            return par_err(PAR_EINVAL,
                           "pipeline schedule 'dualpipe' needs an even number of microbatches m >= 2*PP "
                           "(half run each direction): m = %d, PP = %d",
                           p.n_micro, p.pp);
        break;
    case PAR_SCHED_DUALPIPEV:
        if (p.vpp == 0)
            p.vpp = 2;
        if (p.vpp != 2)
            return par_err(PAR_EINVAL,
                           "pipeline schedule 'dualpipev' runs 2 chunks per rank (a V shape): "
                           "virtual-pipeline-model-parallel-size must be 2, got %d",
                           p.vpp);
        if (p.pp < 2)
            return par_err(PAR_EINVAL, "pipeline schedule 'dualpipev' needs PP >= 2, got %d", p.pp);
        if (p.n_micro < 2 * p.pp)
            return par_err(PAR_EINVAL, "pipeline schedule 'dualpipev' needs m >= 2*PP microbatches: m = %d, PP = %d",
                           p.n_micro, p.pp);
        break;
    default:
        if (p.vpp == 0)
            p.vpp = 1;
        if (p.vpp != 1)
            return par_err(PAR_EINVAL,
                           "pipeline schedule '%s' runs one chunk per rank but virtual-pipeline-model-parallel-size "
                           "is %d (use --pipeline-schedule interleaved)",
                           name, p.vpp);
        break;
    }
    if (p.kind != PAR_SCHED_INTERLEAVED && p.mb_group != 0)
        return par_err(PAR_EINVAL, "a microbatch group size (%d) applies to the interleaved schedule only, not '%s'",
                       p.mb_group, name);
    *out = p;
    return PAR_OK;
}

/* ---- stage maps and tags -------------------------------------------------- */

int par_schedule_stage_rank(const par_schedule *s, int dir, int stage)
{
    int p = s->params.pp;
    switch (s->params.kind) {
    case PAR_SCHED_INTERLEAVED:
        return stage % p;
    case PAR_SCHED_DUALPIPE:
        return dir ? p - 1 - stage : stage;
    case PAR_SCHED_DUALPIPEV:
        return stage < p ? stage : 2 * p - 1 - stage;
    default:
        return stage;
    }
}

int par_schedule_stage_chunk(const par_schedule *s, int dir, int stage)
{
    int p = s->params.pp;
    switch (s->params.kind) {
    case PAR_SCHED_INTERLEAVED:
        return stage / p;
    case PAR_SCHED_DUALPIPE:
        return dir;
    case PAR_SCHED_DUALPIPEV:
        return stage < p ? 0 : 1;
    default:
        return 0;
    }
}

int par_schedule_mb_dir(const par_schedule *s, int mb)
{
    return (s->n_dirs == 2 && mb >= s->params.n_micro / 2) ? 1 : 0;
}

int par_schedule_tag(const par_schedule *s, int mb, int stage, int grad)
{
    return 2 * (mb * s->n_stages + stage) + (grad ? 1 : 0);
}

/* ---- action lists ----------------------------------------------------------- */

par_status par_schedule_push(par_schedule *s, int rank, par_action a)
{
    if (rank < 0 || rank >= s->params.pp)
        return par_err(PAR_ERANGE, "schedule: rank %d outside [0, %d)", rank, s->params.pp);
    if (s->n_actions[rank] == s->cap_actions[rank]) {
        int cap = s->cap_actions[rank] ? 2 * s->cap_actions[rank] : 64;
        par_action *n = par_realloc(s->actions[rank], (size_t)cap * sizeof *n, PAR_TAG_MODEL);
        if (!n)
            return par_err(PAR_ENOMEM, "schedule: out of memory growing rank %d's list to %d actions", rank, cap);
        s->actions[rank] = n;
        s->cap_actions[rank] = cap;
    }
    s->actions[rank][s->n_actions[rank]++] = a;
    return PAR_OK;
}

int par_schedule_find(const par_schedule *s, int rank, par_act_kind kind, int mb, int stage)
{
    if (rank < 0 || rank >= s->params.pp)
        return -1;
    for (int i = 0; i < s->n_actions[rank]; i++) {
        const par_action *a = &s->actions[rank][i];
        if (a->kind == (int)kind && a->mb == mb && a->stage == stage)
            return i;
    }
    return -1;
}

par_status par_schedule_remove(par_schedule *s, int rank, int i)
{
    if (rank < 0 || rank >= s->params.pp || i < 0 || i >= s->n_actions[rank])
        return par_err(PAR_ERANGE, "schedule: no action %d on rank %d", i, rank);
    par_action *l = s->actions[rank];
    memmove(l + i, l + i + 1, (size_t)(s->n_actions[rank] - i - 1) * sizeof *l);
    s->n_actions[rank]--;
    return PAR_OK;
}

par_status par_schedule_move(par_schedule *s, int rank, int i, int j)
{
    if (rank < 0 || rank >= s->params.pp || i < 0 || i >= s->n_actions[rank] || j < 0 || j >= s->n_actions[rank])
        return par_err(PAR_ERANGE, "schedule: cannot move action %d to %d on rank %d", i, j, rank);
    par_action *l = s->actions[rank];
    par_action a = l[i];
    if (i < j)
        memmove(l + i, l + i + 1, (size_t)(j - i) * sizeof *l);
    else
        memmove(l + j + 1, l + j, (size_t)(i - j) * sizeof *l);
    l[j] = a;
    return PAR_OK;
}

void par_action_str(const par_action *a, char *buf, size_t n)
{
    const char *k = par_action_kind_name((par_act_kind)a->kind);
    switch (a->kind) {
    case PAR_ACT_SEND_ACT:
    case PAR_ACT_SEND_GRAD:
        snprintf(buf, n, "%s mb %d stage %d to rank %d tag %d", k, a->mb, a->stage, a->peer, a->tag);
        break;
    case PAR_ACT_RECV_ACT:
    case PAR_ACT_RECV_GRAD:
        snprintf(buf, n, "%s mb %d stage %d from rank %d tag %d", k, a->mb, a->stage, a->peer, a->tag);
        break;
    default:
        snprintf(buf, n, "%s mb %d stage %d (dir %d, chunk %d%s)", k, a->mb, a->stage, a->dir, a->chunk,
                 a->overlap ? ", overlapped with the next backward" : "");
    }
}

/* ---- emitters --------------------------------------------------------------- */

typedef struct {
    par_schedule *s;
    int r;
    par_status st;
} emitter;

static void emit(emitter *e, par_act_kind k, int dir, int stage, int mb, int peer, int tag, int overlap)
{
    if (e->st != PAR_OK)
        return;
    par_action a = {.kind = (int8_t)k,
                    .dir = (int8_t)dir,
                    .overlap = (int8_t)overlap,
                    .chunk = (int8_t)par_schedule_stage_chunk(e->s, dir, stage),
                    .stage = stage,
                    .mb = mb,
                    .peer = peer,
                    .tag = tag};
    e->st = par_schedule_push(e->s, e->r, a);
}

static void emit_compute(emitter *e, par_act_kind k, int dir, int stage, int mb, int overlap)
{
    emit(e, k, dir, stage, mb, -1, -1, overlap);
}

/* Messages: none at a pipeline end or between two stages of one rank. */
static void emit_recv_act(emitter *e, int dir, int stage, int mb)
{
    if (stage == 0)
        return;
    int peer = par_schedule_stage_rank(e->s, dir, stage - 1);
    if (peer != e->r)
        emit(e, PAR_ACT_RECV_ACT, dir, stage, mb, peer, par_schedule_tag(e->s, mb, stage - 1, 0), 0);
}

static void emit_send_act(emitter *e, int dir, int stage, int mb)
{
    if (stage == e->s->n_stages - 1)
        return;
    int peer = par_schedule_stage_rank(e->s, dir, stage + 1);
    if (peer != e->r)
        emit(e, PAR_ACT_SEND_ACT, dir, stage, mb, peer, par_schedule_tag(e->s, mb, stage, 0), 0);
}

static void emit_recv_grad(emitter *e, int dir, int stage, int mb)
{
    if (stage == e->s->n_stages - 1)
        return;
    int peer = par_schedule_stage_rank(e->s, dir, stage + 1);
    if (peer != e->r)
        emit(e, PAR_ACT_RECV_GRAD, dir, stage, mb, peer, par_schedule_tag(e->s, mb, stage + 1, 1), 0);
}

static void emit_send_grad(emitter *e, int dir, int stage, int mb)
{
    if (stage == 0)
        return;
    int peer = par_schedule_stage_rank(e->s, dir, stage - 1);
    if (peer != e->r)
        emit(e, PAR_ACT_SEND_GRAD, dir, stage, mb, peer, par_schedule_tag(e->s, mb, stage, 1), 0);
}

/* recv, F, send */
static void f_unit(emitter *e, int stage, int mb)
{
    emit_recv_act(e, 0, stage, mb);
    emit_compute(e, PAR_ACT_F, 0, stage, mb, 0);
    emit_send_act(e, 0, stage, mb);
}

/* recv, B or BW, send */
static void b_unit(emitter *e, int stage, int mb, par_act_kind k)
{
    emit_recv_grad(e, 0, stage, mb);
    emit_compute(e, k, 0, stage, mb, 0);
    emit_send_grad(e, 0, stage, mb);
}

static int imin(int a, int b) { return a < b ? a : b; }

/* GPipe (Huang et al. 2019): all forwards, then all backwards, in mb order. */
static void gen_gpipe(emitter *e)
{
    int m = e->s->params.n_micro;
    for (int i = 0; i < m; i++)
        f_unit(e, e->r, i);
    for (int i = 0; i < m; i++)
        b_unit(e, e->r, i, PAR_ACT_BW);
}

/* 1F1B (PipeDream-Flush; Megatron-LM forward_backward_pipelining_without_
 * interleaving): p-r-1 warmup forwards, then F(w+i) B(i) pairs, then the
 * remaining backwards. */
static void gen_1f1b(emitter *e)
{
    int p = e->s->params.pp, m = e->s->params.n_micro, r = e->r;
    int w = imin(p - r - 1, m);
    for (int i = 0; i < w; i++)
        f_unit(e, r, i);
    for (int i = 0; i < m - w; i++) {
        f_unit(e, r, w + i);
        b_unit(e, r, i, PAR_ACT_BW);
    }
    for (int i = m - w; i < m; i++)
        b_unit(e, r, i, PAR_ACT_BW);
}

/* ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", sec. 3.1):
 * 1F1B with the backward split into B and W; rank r runs the W of
 * microbatch i - r after B(i), i.e. its first r W's are deferred, and runs
 * the r W's still due after its last B.  Every rank holds at most p
 * microbatches' saved inputs (p - r until B plus r waiting for W), as 1F1B's
 * rank 0. */
static void gen_zbh1(emitter *e)
{
    int p = e->s->params.pp, m = e->s->params.n_micro, r = e->r;
    int w = imin(p - r - 1, m);
    int next_w = 0;
    for (int i = 0; i < w; i++)
        f_unit(e, r, i);
    for (int i = 0; i < m; i++) {
        if (i < m - w)
            f_unit(e, r, w + i);
        b_unit(e, r, i, PAR_ACT_B);
        if (i - r >= 0)
            emit_compute(e, PAR_ACT_W, 0, r, next_w++, 0);
    }
    while (next_w < m)
        emit_compute(e, PAR_ACT_W, 0, r, next_w++, 0);
}

/* Interleaved 1F1B (Narayanan et al. 2021; Megatron-LM
 * forward_backward_pipelining_with_interleaving and get_schedule_table):
 * virtual microbatch k runs (mb, chunk) from the table of groups of
 * `mb_group` microbatches, chunk-major within a group; forward k uses chunk
 * c, backward k chunk v-1-c.  Warmup (p-r-1)*2 + (v-1)*group forwards. */
static void gen_interleaved(emitter *e)
{
    const par_schedule_params *sp = &e->s->params;
    int p = sp->pp, v = sp->vpp, m = sp->n_micro, g = sp->mb_group, r = e->r;
    int total = m * v;
    int *tmb = par_malloc((size_t)total * 2 * sizeof *tmb, PAR_TAG_MODEL);
    if (!tmb) {
        e->st = par_err(PAR_ENOMEM, "interleaved schedule: out of memory for a %d-entry table", total);
        return;
    }
    int *tch = tmb + total, n = 0;
    for (int lo = 0; lo < m; lo += g) {
        int hi = lo + g >= m ? m : lo + g; /* the last group takes the rest */
        for (int c = 0; c < v; c++)
            for (int i = lo; i < hi; i++) {
                tmb[n] = i;
                tch[n] = c;
                n++;
            }
        if (hi == m)
            break;
    }
    int w = imin((p - r - 1) * 2 + (v - 1) * g, total);
    for (int k = 0; k < w; k++)
        f_unit(e, tch[k] * p + r, tmb[k]);
    for (int i = 0; i < total - w; i++) {
        f_unit(e, tch[w + i] * p + r, tmb[w + i]);
        b_unit(e, (v - 1 - tch[i]) * p + r, tmb[i], PAR_ACT_BW);
    }
    for (int i = total - w; i < total; i++)
        b_unit(e, (v - 1 - tch[i]) * p + r, tmb[i], PAR_ACT_BW);
    par_free(tmb);
}

/* ---- DualPipe / DualPipeV ---------------------------------------------------
 * The step structure of deepseek-ai/DualPipe (dualpipe.py, dualpipev.py),
 * re-expressed as actions.  Their p2p ops are queued and issued at the next
 * commit (before each compute and at the end); here a commit emits the queued
 * sends first, then the queued receives (a batch posts all, then waits). */

#define DP_QMAX 16

typedef struct {
    emitter e;
    int v_shape;            /* DualPipeV                                   */
    int second_half;        /* DualPipe: rank >= p/2 swaps the two phases  */
    int f[2], b[2];         /* next compute counters per phase             */
    int sf[2], sb[2], rf[2], rb[2]; /* next message counters per phase     */
    par_action q[DP_QMAX];  /* queued p2p ops                             */
    int nq;
    int *wq;                /* FIFO of split backwards waiting for W:      */
    int wq_head, wq_tail;   /* (phase, mb) pairs                           */
} dp_state;

/* The (dir, stage, mb) of the counter-th microbatch of a phase. */
static void dp_where(const dp_state *d, int phase, int counter, int *dir, int *stage, int *mb)
{
    const par_schedule *s = d->e.s;
    int p = s->params.pp, r = d->e.r;
    if (d->v_shape) {
        *dir = 0;
        *stage = phase == 0 ? r : 2 * p - 1 - r;
        *mb = counter;
    } else {
        *dir = phase;
        *stage = phase == 0 ? r : p - 1 - r;
        *mb = phase * (s->params.n_micro / 2) + counter;
    }
}

static int dp_phase(const dp_state *d, int phase) { return d->v_shape ? phase : phase ^ d->second_half; }

static void dp_queue(dp_state *d, par_act_kind k, int dir, int stage, int mb, int peer, int tag)
{
    if (d->e.st != PAR_OK)
        return;
    if (d->nq == DP_QMAX) {
        d->e.st = par_err(PAR_EINTERNAL, "dualpipe generator: more than %d queued p2p ops", DP_QMAX);
        return;
    }
    d->q[d->nq++] = (par_action){.kind = (int8_t)k,
                                  .dir = (int8_t)dir,
                                  .chunk = (int8_t)par_schedule_stage_chunk(d->e.s, dir, stage),
                                  .stage = stage,
                                  .mb = mb,
                                  .peer = peer,
                                  .tag = tag};
}

static void dp_commit(dp_state *d)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < d->nq; i++) {
            int is_send = d->q[i].kind == PAR_ACT_SEND_ACT || d->q[i].kind == PAR_ACT_SEND_GRAD;
            if (is_send == (pass == 0) && d->e.st == PAR_OK)
                d->e.st = par_schedule_push(d->e.s, d->e.r, d->q[i]);
        }
    d->nq = 0;
}

static void dp_recv_forward(dp_state *d, int phase)
{
    const par_schedule *s = d->e.s;
    int ph = dp_phase(d, phase), dir, stage, mb;
    dp_where(d, ph, d->rf[ph], &dir, &stage, &mb);
    if (stage == 0)
        return;
    int peer = par_schedule_stage_rank(s, dir, stage - 1);
    if (peer == d->e.r)
        return;
    d->rf[ph]++;
    dp_queue(d, PAR_ACT_RECV_ACT, dir, stage, mb, peer, par_schedule_tag(s, mb, stage - 1, 0));
}

static void dp_send_forward(dp_state *d, int phase)
{
    const par_schedule *s = d->e.s;
    int ph = dp_phase(d, phase), dir, stage, mb;
    dp_where(d, ph, d->sf[ph], &dir, &stage, &mb);
    if (stage == s->n_stages - 1)
        return;
    int peer = par_schedule_stage_rank(s, dir, stage + 1);
    if (peer == d->e.r)
        return;
    d->sf[ph]++;
    dp_queue(d, PAR_ACT_SEND_ACT, dir, stage, mb, peer, par_schedule_tag(s, mb, stage, 0));
}

static void dp_recv_backward(dp_state *d, int phase)
{
    const par_schedule *s = d->e.s;
    int ph = dp_phase(d, phase), dir, stage, mb;
    dp_where(d, ph, d->rb[ph], &dir, &stage, &mb);
    if (stage == s->n_stages - 1)
        return;
    int peer = par_schedule_stage_rank(s, dir, stage + 1);
    if (peer == d->e.r)
        return;
    d->rb[ph]++;
    dp_queue(d, PAR_ACT_RECV_GRAD, dir, stage, mb, peer, par_schedule_tag(s, mb, stage + 1, 1));
}

static void dp_send_backward(dp_state *d, int phase)
{
    const par_schedule *s = d->e.s;
    int ph = dp_phase(d, phase), dir, stage, mb;
    dp_where(d, ph, d->sb[ph], &dir, &stage, &mb);
    if (stage == 0)
        return;
    int peer = par_schedule_stage_rank(s, dir, stage - 1);
    if (peer == d->e.r)
        return;
    d->sb[ph]++;
    dp_queue(d, PAR_ACT_SEND_GRAD, dir, stage, mb, peer, par_schedule_tag(s, mb, stage, 1));
}

static void dp_f_compute(dp_state *d, int phase, int overlap)
{
    int ph = dp_phase(d, phase), dir, stage, mb;
    dp_where(d, ph, d->f[ph]++, &dir, &stage, &mb);
    emit_compute(&d->e, PAR_ACT_F, dir, stage, mb, overlap);
}

static void dp_b_compute(dp_state *d, int phase, int zb)
{
    int ph = dp_phase(d, phase), dir, stage, mb;
    dp_where(d, ph, d->b[ph]++, &dir, &stage, &mb);
    emit_compute(&d->e, zb ? PAR_ACT_B : PAR_ACT_BW, dir, stage, mb, 0);
    if (zb) {
        d->wq[2 * d->wq_tail] = ph;
        d->wq[2 * d->wq_tail + 1] = mb;
        d->wq_tail++;
    }
}

static void dp_forward_chunk(dp_state *d, int phase, int recv, int send)
{
    if (recv)
        dp_recv_forward(d, phase);
    dp_commit(d);
    dp_f_compute(d, phase, 0);
    if (send)
        dp_send_forward(d, phase);
}

static void dp_backward_chunk(dp_state *d, int phase, int zb, int send)
{
    dp_recv_backward(d, phase);
    dp_commit(d);
    dp_b_compute(d, phase, zb);
    if (send)
        dp_send_backward(d, phase);
}

static void dp_forward_backward_chunk(dp_state *d, int phase0, int phase1, int recv0)
{
    if (recv0)
        dp_recv_forward(d, phase0);
    dp_recv_backward(d, phase1);
    dp_commit(d);
    dp_f_compute(d, phase0, 1);
    dp_b_compute(d, phase1, 0);
    dp_send_forward(d, phase0);
    dp_send_backward(d, phase1);
}

static void dp_weight_chunk(dp_state *d)
{
    dp_commit(d);
    if (d->e.st != PAR_OK)
        return;
    if (d->wq_head == d->wq_tail) {
        d->e.st = par_err(PAR_EINTERNAL, "dualpipe generator: W with no deferred backward on rank %d", d->e.r);
        return;
    }
    int ph = d->wq[2 * d->wq_head], mb = d->wq[2 * d->wq_head + 1], dir, stage, unused;
    d->wq_head++;
    dp_where(d, ph, 0, &dir, &stage, &unused);
    emit_compute(&d->e, PAR_ACT_W, dir, stage, mb, 0);
}

/* One rank of DualPipe (v_shape 0) or DualPipeV (v_shape 1): steps 1-8 of
 * DualPipe.step.  In DualPipe, n = p/2 "half ranks", hr = min(r, p-1-r),
 * chunks = m/2 per direction; in DualPipeV n = p, hr = r, chunks = m. */
static void gen_dualpipe(emitter *e, int v_shape)
{
    const par_schedule_params *sp = &e->s->params;
    int p = sp->pp, m = sp->n_micro, r = e->r;
    dp_state d;
    memset(&d, 0, sizeof d);
    d.e = *e;
    d.v_shape = v_shape;
    d.second_half = !v_shape && r >= p / 2;
    d.wq = par_malloc((size_t)(2 * m + 2) * 2 * sizeof *d.wq, PAR_TAG_MODEL);
    if (!d.wq) {
        e->st = par_err(PAR_ENOMEM, "dualpipe generator: out of memory");
        return;
    }
    int n = v_shape ? p : p / 2;
    int hr = v_shape ? r : imin(r, p - 1 - r);
    int chunks = v_shape ? m : m / 2;
    /* The rank where the two phases meet: DualPipe's two middle ranks,
     * DualPipeV's last rank. */
    int middle = v_shape ? (r == p - 1) : (r == p / 2 - 1 || r == p / 2);

    /* Step 1: nF0 */
    for (int i = 0; i < (n - hr - 1) * 2; i++)
        dp_forward_chunk(&d, 0, 1, 1);
    /* Step 2: nF0F1 */
    int step2 = hr + 1;
    dp_recv_forward(&d, 0);
    for (int i = 0; i < step2; i++) {
        dp_forward_chunk(&d, 0, 0, v_shape ? 0 : middle);
        dp_recv_forward(&d, 0);
        dp_forward_chunk(&d, 1, 1, !middle || i < step2 - 1);
        if (v_shape || !middle)
            dp_send_forward(&d, 0);
    }
    /* Step 3: nB1W1F1 (zero bubble) */
    for (int i = 0; i < n - hr - 1; i++) {
        dp_backward_chunk(&d, 1, 1, 1);
        dp_recv_forward(&d, 1);
        dp_weight_chunk(&d);
        dp_forward_chunk(&d, 1, 0, 1);
    }
    /* Step 4 (main): nF0B1F1B0 */
    int step4 = chunks - 2 * n + hr + 1;
    for (int i = 0; i < step4; i++) {
        if (i == 0) {
            if (middle) {
                /* DualPipe does not overlap these two, to shorten the bubble */
                dp_forward_chunk(&d, 0, 0, 0);
                dp_send_forward(&d, 1);
                dp_backward_chunk(&d, 1, 0, 0);
                dp_send_forward(&d, 0);
                dp_send_backward(&d, 1);
            } else {
                dp_forward_backward_chunk(&d, 0, 1, 0);
            }
        } else {
            dp_forward_backward_chunk(&d, 0, 1, 1);
        }
        dp_forward_backward_chunk(&d, 1, 0, 1);
    }
    /* Step 5: nB1F1B0 */
    for (int i = 0; i < n - hr - 1; i++) {
        dp_backward_chunk(&d, 1, 0, 1);
        dp_forward_backward_chunk(&d, 1, 0, 1);
    }
    /* Step 6: nB1B0 (the second half of these use zero bubble) */
    int step6 = hr + 1, zb = 0;
    for (int i = 0; i < step6; i++) {
        if (i == step6 / 2 && hr % 2 == 1)
            zb = 1;
        dp_backward_chunk(&d, 1, zb, 1);
        if (i == step6 / 2 && hr % 2 == 0)
            zb = 1;
        dp_backward_chunk(&d, 0, zb, 1);
    }
    /* Step 7: nWB0 (zero bubble) */
    for (int i = 0; i < n - hr - 1; i++) {
        dp_weight_chunk(&d);
        dp_backward_chunk(&d, 0, 1, 1);
    }
    /* Step 8: nW */
    for (int i = 0; i < hr + 1; i++)
        dp_weight_chunk(&d);
    dp_commit(&d);
    if (d.e.st == PAR_OK && d.wq_head != d.wq_tail)
        d.e.st = par_err(PAR_EINTERNAL, "dualpipe generator: %d W left on rank %d", d.wq_tail - d.wq_head, r);
    par_free(d.wq);
    e->st = d.e.st;
}

/* ---- build ------------------------------------------------------------------ */

void par_schedule_free(par_schedule *s)
{
    if (!s)
        return;
    if (s->actions)
        for (int r = 0; r < s->params.pp; r++)
            par_free(s->actions[r]);
    par_free(s->actions);
    par_free(s->n_actions);
    par_free(s->cap_actions);
    memset(s, 0, sizeof *s);
}

par_status par_schedule_build(const par_schedule_params *params, par_schedule *out)
{
    par_schedule s;
    memset(&s, 0, sizeof s);
    par_status st = par_schedule_params_check(params, &s.params);
    if (st != PAR_OK)
        return st;
    int p = s.params.pp;
    s.n_dirs = s.params.kind == PAR_SCHED_DUALPIPE ? 2 : 1;
    s.n_chunks = s.params.kind == PAR_SCHED_DUALPIPE ? 2 : s.params.vpp;
    s.n_stages = s.params.kind == PAR_SCHED_INTERLEAVED ? p * s.params.vpp
                 : s.params.kind == PAR_SCHED_DUALPIPEV ? 2 * p
                                                        : p;
    s.split_bw = s.params.kind == PAR_SCHED_ZBH1 || s.params.kind == PAR_SCHED_DUALPIPE ||
                 s.params.kind == PAR_SCHED_DUALPIPEV;
    s.n_actions = par_calloc((size_t)p, sizeof *s.n_actions, PAR_TAG_MODEL);
    s.cap_actions = par_calloc((size_t)p, sizeof *s.cap_actions, PAR_TAG_MODEL);
    s.actions = par_calloc((size_t)p, sizeof *s.actions, PAR_TAG_MODEL);
    if (!s.n_actions || !s.cap_actions || !s.actions) {
        par_schedule_free(&s);
        return par_err(PAR_ENOMEM, "schedule: out of memory for %d ranks", p);
    }
    for (int r = 0; r < p && st == PAR_OK; r++) {
        emitter e = {.s = &s, .r = r, .st = PAR_OK};
        switch (s.params.kind) {
        case PAR_SCHED_GPIPE: gen_gpipe(&e); break;
        case PAR_SCHED_1F1B: gen_1f1b(&e); break;
        case PAR_SCHED_INTERLEAVED: gen_interleaved(&e); break;
        case PAR_SCHED_ZBH1: gen_zbh1(&e); break;
        case PAR_SCHED_DUALPIPE: gen_dualpipe(&e, 0); break;
        case PAR_SCHED_DUALPIPEV: gen_dualpipe(&e, 1); break;
        default: e.st = par_err(PAR_EINTERNAL, "schedule kind %d has no generator", (int)s.params.kind);
        }
        st = e.st;
    }
    if (st != PAR_OK) {
        par_schedule_free(&s);
        return st;
    }
    *out = s;
    return PAR_OK;
}
