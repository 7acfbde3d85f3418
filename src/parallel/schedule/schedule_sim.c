/* parallel/schedule/schedule_sim.c - the dry run of a schedule: matching, deadlock and
 * dependency checks under the executor model of schedule.h, an emulated
 * clock (bubble, makespan, peak live activations), and the timeline as text,
 * SVG and Chrome trace JSON.  Untemplated. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "parallel/schedule/schedule.h"

void par_sched_costs_init(par_sched_costs *c)
{
    memset(c, 0, sizeof *c);
    c->f = 1.0;
    c->b = 2.0;
    c->w = 1.0;
}

void par_sched_sim_free(par_sched_sim *sim)
{
    if (!sim)
        return;
    if (sim->spans)
        for (int r = 0; r < sim->pp; r++)
            par_free(sim->spans[r]);
    par_free(sim->spans);
    par_free(sim->busy);
    par_free(sim->idle);
    par_free(sim->peak_live);
    par_free(sim->peak_held);
    memset(sim, 0, sizeof *sim);
}

static int is_compute(int k) { return k == PAR_ACT_F || k == PAR_ACT_B || k == PAR_ACT_W || k == PAR_ACT_BW; }
static int is_send(int k) { return k == PAR_ACT_SEND_ACT || k == PAR_ACT_SEND_GRAD; }

static par_status check_costs(const par_schedule *s, const par_sched_costs *c)
{
    if (!(c->f > 0) || !(c->b > 0) || !(c->w >= 0) || !(c->w <= c->b) || !(c->fb >= 0) || !(c->latency >= 0) ||
        !isfinite(c->f) || !isfinite(c->b) || !isfinite(c->fb) || !isfinite(c->latency))
        return par_err(PAR_EINVAL,
                       "schedule costs: need F > 0, B > 0, 0 <= W <= B (W is part of the whole backward B), "
                       "F&B >= 0 and latency >= 0; got F %g, B %g, W %g, F&B %g, latency %g",
                       c->f, c->b, c->w, c->fb, c->latency);
    for (size_t i = 0; c->action && i < 3 * (size_t)s->params.n_micro * (size_t)s->n_stages; i++)
        if (!(c->action[i] >= 0) || !isfinite(c->action[i]))
            return par_err(PAR_EINVAL, "schedule costs: action cost %zu is %g; each must be finite and >= 0", i,
                           c->action[i]);
    for (int i = 0; i < s->n_stages; i++) {
        double f = c->f_stage ? c->f_stage[i] : c->f, b = c->b_stage ? c->b_stage[i] : c->b;
        double w = c->w_stage ? c->w_stage[i] : c->w;
        if (!(f > 0) || !(b > 0) || !(w >= 0) || !(w <= b) || !isfinite(f) || !isfinite(b))
            return par_err(PAR_EINVAL, "schedule costs of stage %d: need F > 0, B > 0, 0 <= W <= B; got %g, %g, %g", i,
                           f, b, w);
    }
    return PAR_OK;
}

static double cost_of(const par_sched_costs *c, const par_action *a, int m, int S)
{
    if (c->action) {
        size_t key = (size_t)a->mb * (size_t)S + (size_t)a->stage, n = (size_t)m * (size_t)S;
        switch (a->kind) {
        case PAR_ACT_F: return c->action[key];
        case PAR_ACT_B:
        case PAR_ACT_BW: return c->action[n + key];
        case PAR_ACT_W: return c->action[2 * n + key];
        default: return 0.0;
        }
    }
    double f = c->f_stage ? c->f_stage[a->stage] : c->f;
    double b = c->b_stage ? c->b_stage[a->stage] : c->b;
    double w = c->w_stage ? c->w_stage[a->stage] : c->w;
    switch (a->kind) {
    case PAR_ACT_F: return f;
    case PAR_ACT_B: return b - w;
    case PAR_ACT_W: return w;
    case PAR_ACT_BW: return b;
    default: return 0.0;
    }
}

/* ---- the dry run ------------------------------------------------------------ */

typedef struct {
    double time;
    int src, dst;
    int8_t posted, received;
} msg_state;

typedef struct {
    const par_schedule *s;
    const par_sched_costs *c;
    int p, m, S;
    int8_t *f_done, *b_done, *w_done, *b_kind, *in_act, *in_grad; /* [m*S] */
    msg_state *msgs;  /* [2*m*S] */
    int *pc;          /* [p] */
    double *clock;    /* [p] */
    int *live, *held; /* [p] */
    par_sched_sim *out;
} sim_state;

#define ACT_DESC 160

static par_status fail_at(const sim_state *z, int r, int i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static par_status fail_at(const sim_state *z, int r, int i, const char *fmt, ...)
{
    char what[256], desc[ACT_DESC];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    par_action_str(&z->s->actions[r][i], desc, sizeof desc);
    return par_err(PAR_ECHECK, "schedule %s (PP %d, m %d): rank %d action %d (%s): %s",
                   par_schedule_kind_name(z->s->params.kind), z->p, z->m, r, i, desc, what);
}

/* Fields every action must get right: mb, stage, direction, rank, chunk,
 * and for messages the peer and tag the rule gives. */
static par_status check_fields(const sim_state *z, int r, int i)
{
    const par_schedule *s = z->s;
    const par_action *a = &s->actions[r][i];
    if (a->kind < 0 || a->kind >= PAR_ACT_COUNT)
        return fail_at(z, r, i, "unknown action kind %d", a->kind);
    if (a->mb < 0 || a->mb >= z->m || a->stage < 0 || a->stage >= z->S)
        return fail_at(z, r, i, "mb must lie in [0, %d) and stage in [0, %d)", z->m, z->S);
    int dir = par_schedule_mb_dir(s, a->mb);
    if (a->dir != dir)
        return fail_at(z, r, i, "microbatch %d runs direction %d, not %d", a->mb, dir, a->dir);
    int owner = par_schedule_stage_rank(s, dir, a->stage);
    if (owner != r)
        return fail_at(z, r, i, "stage %d of direction %d belongs to rank %d", a->stage, dir, owner);
    int chunk = par_schedule_stage_chunk(s, dir, a->stage);
    if (a->chunk != chunk)
        return fail_at(z, r, i, "stage %d is chunk %d of rank %d, not chunk %d", a->stage, chunk, r, a->chunk);
    if (is_compute(a->kind)) {
        if (a->peer != -1 || a->tag != -1)
            return fail_at(z, r, i, "a compute action has peer -1 and tag -1");
        if (a->overlap && a->kind != PAR_ACT_F)
            return fail_at(z, r, i, "only an F may be flagged to overlap with the next backward");
        return PAR_OK;
    }
    int toward_next = a->kind == PAR_ACT_SEND_ACT || a->kind == PAR_ACT_RECV_GRAD;
    int other = a->stage + (toward_next ? 1 : -1);
    if (other < 0 || other >= z->S)
        return fail_at(z, r, i, "no stage %d to exchange with (the pipeline has stages 0..%d)", other, z->S - 1);
    int peer = par_schedule_stage_rank(s, dir, other);
    if (peer == r)
        return fail_at(z, r, i, "stages %d and %d are both on rank %d: the transfer is local, not a message",
                       a->stage, other, r);
    if (a->peer != peer)
        return fail_at(z, r, i, "the peer must be rank %d (stage %d)", peer, other);
    int from = is_send(a->kind) ? a->stage : other;
    int grad = a->kind == PAR_ACT_SEND_GRAD || a->kind == PAR_ACT_RECV_GRAD;
    int tag = par_schedule_tag(s, a->mb, from, grad);
    if (a->tag != tag)
        return fail_at(z, r, i, "the tag rule 2*(mb*S + sending stage) + grad gives %d", tag);
    return PAR_OK;
}

/* Runs one compute action (i) of rank r at the rank's clock, or the
 * overlapped pair (i, i+1); *adv is how many actions were consumed. */
static par_status run_compute(sim_state *z, int r, int i, int *adv)
{
    const par_schedule *s = z->s;
    const par_action *acts = s->actions[r];
    int n_here = acts[i].overlap ? 2 : 1;
    if (n_here == 2 && (i + 1 >= s->n_actions[r] || (acts[i + 1].kind != PAR_ACT_B && acts[i + 1].kind != PAR_ACT_BW)))
        return fail_at(z, r, i, "an overlapped F must be followed directly by a B or BW");
    if (n_here == 2) {
        par_status st = check_fields(z, r, i + 1);
        if (st != PAR_OK)
            return st;
    }
    double t0 = z->clock[r], dur[2] = {0, 0};
    for (int k = 0; k < n_here; k++) {
        const par_action *a = &acts[i + k];
        int key = a->mb * z->S + a->stage, dir = a->dir;
        switch (a->kind) {
        case PAR_ACT_F:
            if (z->f_done[key])
                return fail_at(z, r, i + k, "a second F of the same microbatch and stage");
            if (a->stage > 0) {
                int prev = key - 1, prank = par_schedule_stage_rank(s, dir, a->stage - 1);
                if (prank == r ? !z->f_done[prev] : !z->in_act[key])
                    return fail_at(z, r, i + k,
                                   prank == r ? "runs before F of stage %d (same rank) produced its input"
                                              : "runs before its input from stage %d arrived (no recv-act before it)",
                                   a->stage - 1);
            }
            z->f_done[key] = 1;
            if (++z->live[r] > z->out->peak_live[r])
                z->out->peak_live[r] = z->live[r];
            if (++z->held[r] > z->out->peak_held[r])
                z->out->peak_held[r] = z->held[r];
            break;
        case PAR_ACT_B:
        case PAR_ACT_BW:
            if (!z->f_done[key])
                return fail_at(z, r, i + k, "a backward before its forward");
            if (z->b_done[key])
                return fail_at(z, r, i + k, "a second backward of the same microbatch and stage");
            if (a->stage < z->S - 1) {
                int nrank = par_schedule_stage_rank(s, dir, a->stage + 1);
                if (nrank == r ? !z->b_done[key + 1] : !z->in_grad[key])
                    return fail_at(z, r, i + k,
                                   nrank == r ? "runs before B of stage %d (same rank) produced its gradient"
                                              : "runs before its gradient from stage %d arrived (no recv-grad before it)",
                                   a->stage + 1);
            }
            z->b_done[key] = 1;
            z->b_kind[key] = (int8_t)a->kind;
            z->live[r]--;
            if (a->kind == PAR_ACT_BW)
                z->held[r]--;
            break;
        case PAR_ACT_W:
            if (!z->b_done[key] || z->b_kind[key] != PAR_ACT_B)
                return fail_at(z, r, i + k,
                               z->b_done[key] ? "W after a full backward (BW already did the weight gradient)"
                                              : "W before the B of the same microbatch and stage");
            if (z->w_done[key])
                return fail_at(z, r, i + k, "a second W of the same microbatch and stage");
            z->w_done[key] = 1;
            z->held[r]--;
            break;
        default:
            return fail_at(z, r, i + k, "not a compute action");
        }
        dur[k] = cost_of(z->c, a, z->m, z->S);
    }
    double total = dur[0] + dur[1];
    if (n_here == 2 && z->c->fb > 0)
        total = z->c->fb;
    double split = n_here == 2 ? total * dur[0] / (dur[0] + dur[1]) : total;
    z->out->spans[r][i] = (par_sched_span){t0, t0 + split};
    if (n_here == 2)
        z->out->spans[r][i + 1] = (par_sched_span){t0 + split, t0 + total};
    z->clock[r] = t0 + total;
    z->out->busy[r] += total;
    *adv = n_here;
    return PAR_OK;
}

/* Advances rank r as far as it can; *progress is set when it moved. */
static par_status run_rank(sim_state *z, int r, int *progress)
{
    const par_schedule *s = z->s;
    while (z->pc[r] < s->n_actions[r]) {
        int i = z->pc[r];
        const par_action *a = &s->actions[r][i];
        par_status st = check_fields(z, r, i);
        if (st != PAR_OK)
            return st;
        int key = a->mb * z->S + a->stage;
        if (is_compute(a->kind)) {
            int adv = 1;
            if ((st = run_compute(z, r, i, &adv)) != PAR_OK)
                return st;
            z->pc[r] += adv;
        } else if (is_send(a->kind)) {
            int8_t *need = a->kind == PAR_ACT_SEND_ACT ? z->f_done : z->b_done;
            if (!need[key])
                return fail_at(z, r, i, "sends before the %s that produces the data",
                               a->kind == PAR_ACT_SEND_ACT ? "F" : "backward");
            msg_state *ms = &z->msgs[a->tag];
            if (ms->posted)
                return fail_at(z, r, i, "the message with tag %d was already sent", a->tag);
            *ms = (msg_state){.time = z->clock[r], .src = r, .dst = a->peer, .posted = 1};
            z->out->spans[r][i] = (par_sched_span){z->clock[r], z->clock[r]};
            z->out->n_messages++;
            z->pc[r]++;
        } else {
            msg_state *ms = &z->msgs[a->tag];
            if (!ms->posted)
                return PAR_OK; /* blocked */
            if (ms->received)
                return fail_at(z, r, i, "the message with tag %d was already received", a->tag);
            ms->received = 1;
            double t = ms->time + z->c->latency;
            z->out->spans[r][i] = (par_sched_span){z->clock[r], t > z->clock[r] ? t : z->clock[r]};
            z->clock[r] = z->out->spans[r][i].end;
            (a->kind == PAR_ACT_RECV_ACT ? z->in_act : z->in_grad)[key] = 1;
            z->pc[r]++;
        }
        *progress = 1;
    }
    return PAR_OK;
}

/* No rank can move: every unfinished rank waits in a receive.  Names the
 * cycle of waiting ranks, or the finished rank that never sent. */
static par_status report_stuck(const sim_state *z)
{
    const par_schedule *s = z->s;
    int start = -1;
    for (int r = 0; r < z->p && start < 0; r++)
        if (z->pc[r] < s->n_actions[r])
            start = r;
    int *seen = par_calloc((size_t)z->p, sizeof *seen, PAR_TAG_MODEL);
    if (!seen)
        return par_err(PAR_ENOMEM, "schedule dry run: out of memory reporting a deadlock");
    char buf[1536];
    size_t n = 0;
    int r = start, step = 1;
    while (r >= 0 && !seen[r] && z->pc[r] < s->n_actions[r]) {
        seen[r] = step++;
        r = s->actions[r][z->pc[r]].peer;
    }
    par_status st;
    if (z->pc[r] >= s->n_actions[r]) {
        int w = start; /* the rank waiting on r: walk again to the last before r */
        for (int q = start; q != r; q = s->actions[q][z->pc[q]].peer)
            w = q;
        char desc[ACT_DESC];
        par_action_str(&s->actions[w][z->pc[w]], desc, sizeof desc);
        st = par_err(PAR_ECHECK,
                     "schedule %s (PP %d, m %d): unmatched receive: rank %d waits at action %d (%s) but rank %d "
                     "finished its %d actions without sending it",
                     par_schedule_kind_name(s->params.kind), z->p, z->m, w, z->pc[w], desc, r, s->n_actions[r]);
    } else {
        /* r is on the cycle; print it from r around to r */
        n += (size_t)snprintf(buf + n, sizeof buf - n, "deadlock: ");
        int q = r;
        do {
            char desc[ACT_DESC];
            const par_action *a = &s->actions[q][z->pc[q]];
            par_action_str(a, desc, sizeof desc);
            if (n < sizeof buf)
                n += (size_t)snprintf(buf + n, sizeof buf - n, "rank %d waits at action %d (%s) for rank %d; ", q,
                                      z->pc[q], desc, a->peer);
            q = a->peer;
        } while (q != r);
        st = par_err(PAR_ECHECK, "schedule %s (PP %d, m %d): %sa cycle, nothing can move",
                     par_schedule_kind_name(s->params.kind), z->p, z->m, buf);
    }
    par_free(seen);
    return st;
}

/* After the run: each (mb, stage) has one F and one backward (B + W or BW),
 * and every message was received. */
static par_status check_complete(const sim_state *z)
{
    const par_schedule *s = z->s;
    for (int mb = 0; mb < z->m; mb++)
        for (int st = 0; st < z->S; st++) {
            int key = mb * z->S + st, dir = par_schedule_mb_dir(s, mb);
            int rank = par_schedule_stage_rank(s, dir, st);
            const char *miss = !z->f_done[key]                                   ? "F"
                               : !z->b_done[key]                                 ? "backward (B or BW)"
                               : z->b_kind[key] == PAR_ACT_B && !z->w_done[key] ? "W"
                                                                                 : NULL;
            if (miss)
                return par_err(PAR_ECHECK, "schedule %s (PP %d, m %d): microbatch %d stage %d has no %s (rank %d never runs it)",
                               par_schedule_kind_name(s->params.kind), z->p, z->m, mb, st, miss, rank);
        }
    for (int t = 0; t < 2 * z->m * z->S; t++)
        if (z->msgs[t].posted && !z->msgs[t].received)
            return par_err(PAR_ECHECK,
                           "schedule %s (PP %d, m %d): unmatched send: rank %d sent tag %d (microbatch %d, %s of stage %d) "
                           "to rank %d, which never receives it",
                           par_schedule_kind_name(s->params.kind), z->p, z->m, z->msgs[t].src, t,
                           t / 2 / z->S, t % 2 ? "gradient" : "activation", t / 2 % z->S, z->msgs[t].dst);
    return PAR_OK;
}

par_status par_schedule_simulate(const par_schedule *s, const par_sched_costs *c, par_sched_sim *out)
{
    par_status st = check_costs(s, c);
    if (st != PAR_OK)
        return st;
    sim_state z;
    memset(&z, 0, sizeof z);
    par_sched_sim sim;
    memset(&sim, 0, sizeof sim);
    z.s = s;
    z.c = c;
    z.p = s->params.pp;
    z.m = s->params.n_micro;
    z.S = s->n_stages;
    z.out = &sim;
    size_t keys = (size_t)z.m * (size_t)z.S;
    int8_t *flags = par_calloc(6 * keys, 1, PAR_TAG_MODEL);
    z.msgs = par_calloc(2 * keys, sizeof *z.msgs, PAR_TAG_MODEL);
    z.pc = par_calloc((size_t)z.p, sizeof *z.pc, PAR_TAG_MODEL);
    z.live = par_calloc(2 * (size_t)z.p, sizeof *z.live, PAR_TAG_MODEL);
    z.clock = par_calloc((size_t)z.p, sizeof *z.clock, PAR_TAG_MODEL);
    sim.pp = z.p;
    sim.busy = par_calloc((size_t)z.p, sizeof *sim.busy, PAR_TAG_MODEL);
    sim.idle = par_calloc((size_t)z.p, sizeof *sim.idle, PAR_TAG_MODEL);
    sim.peak_live = par_calloc((size_t)z.p, sizeof *sim.peak_live, PAR_TAG_MODEL);
    sim.peak_held = par_calloc((size_t)z.p, sizeof *sim.peak_held, PAR_TAG_MODEL);
    sim.spans = par_calloc((size_t)z.p, sizeof *sim.spans, PAR_TAG_MODEL);
    if (!flags || !z.msgs || !z.pc || !z.live || !z.clock || !sim.busy || !sim.idle || !sim.peak_live ||
        !sim.peak_held || !sim.spans) {
        st = par_err(PAR_ENOMEM, "schedule dry run: out of memory (PP %d, m %d, %d stages)", z.p, z.m, z.S);
        goto fail_free_state;
    }
    for (int r = 0; r < z.p; r++) {
        sim.spans[r] = par_calloc((size_t)s->n_actions[r] + 1, sizeof *sim.spans[r], PAR_TAG_MODEL);
        if (!sim.spans[r]) {
            st = par_err(PAR_ENOMEM, "schedule dry run: out of memory for rank %d's %d spans", r, s->n_actions[r]);
            goto fail_free_state;
        }
    }
    z.f_done = flags;
    z.b_done = flags + keys;
    z.w_done = flags + 2 * keys;
    z.b_kind = flags + 3 * keys;
    z.in_act = flags + 4 * keys;
    z.in_grad = flags + 5 * keys;
    z.held = z.live + z.p;

    for (;;) {
        int progress = 0, left = 0;
        for (int r = 0; r < z.p; r++) {
            if ((st = run_rank(&z, r, &progress)) != PAR_OK)
                goto fail_free_state;
            left += z.pc[r] < s->n_actions[r];
        }
        if (!left)
            break;
        if (!progress) {
            st = report_stuck(&z);
            goto fail_free_state;
        }
    }
    if ((st = check_complete(&z)) != PAR_OK)
        goto fail_free_state;

    double total_idle = 0;
    for (int r = 0; r < z.p; r++)
        if (z.clock[r] > sim.makespan)
            sim.makespan = z.clock[r];
    for (int r = 0; r < z.p; r++) {
        sim.idle[r] = sim.makespan - sim.busy[r];
        total_idle += sim.idle[r];
    }
    sim.bubble = sim.makespan > 0 ? total_idle / (z.p * sim.makespan) : 0.0;
    st = PAR_OK;
    *out = sim;
    memset(&sim, 0, sizeof sim);
fail_free_state:
    par_sched_sim_free(&sim);
    par_free(flags);
    par_free(z.msgs);
    par_free(z.pc);
    par_free(z.live);
    par_free(z.clock);
    return st;
}

/* ---- timelines -------------------------------------------------------------- */

static int second_colour(const par_schedule *s, const par_action *a)
{
    return (s->n_dirs == 2 ? a->dir : a->chunk) % 2;
}

void par_sched_timeline_text(const par_schedule *s, const par_sched_sim *sim, double quantum, int max_cols,
                             FILE *out)
{
    if (quantum <= 0) {
        quantum = 1.0;
        if (sim->makespan > 0)
            quantum = sim->makespan;
        for (int r = 0; r < s->params.pp; r++)
            for (int i = 0; i < s->n_actions[r]; i++) {
                double d = sim->spans[r][i].end - sim->spans[r][i].start;
                if (is_compute(s->actions[r][i].kind) && d > 1e-12 && d < quantum)
                    quantum = d;
            }
    }
    if (max_cols < 8)
        max_cols = 8;
    if (sim->makespan / quantum > max_cols)
        quantum = sim->makespan / max_cols;
    int cols = (int)ceil(sim->makespan / quantum - 1e-9);
    if (cols < 1)
        cols = 1;
    char *line = par_malloc((size_t)cols + 1, PAR_TAG_MISC);
    if (!line)
        return;
    static const char up[] = "FBWX", lo[] = "fbwx";
    for (int r = 0; r < s->params.pp; r++) {
        memset(line, '.', (size_t)cols);
        line[cols] = '\0';
        for (int i = 0; i < s->n_actions[r]; i++) {
            const par_action *a = &s->actions[r][i];
            if (!is_compute(a->kind))
                continue;
            int c0 = (int)floor(sim->spans[r][i].start / quantum + 0.5);
            int c1 = (int)floor(sim->spans[r][i].end / quantum + 0.5);
            if (c1 == c0 && sim->spans[r][i].end > sim->spans[r][i].start)
                c1 = c0 + 1;
            for (int col = c0; col < c1 && col < cols; col++)
                line[col] = (second_colour(s, a) ? lo : up)[a->kind];
        }
        fprintf(out, "rank %-3d |%s|\n", r, line);
    }
    fprintf(out, "(one column = %g time units; F B W X(=BW) for %s 0, f b w x for %s 1, . idle)\n", quantum,
             s->n_dirs == 2 ? "direction" : "chunk", s->n_dirs == 2 ? "direction" : "chunk");
    par_free(line);
}

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1)
            cap *= 2;
        char *q = par_realloc(b->p, cap, PAR_TAG_IO);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static par_status sb_write(sbuf *b, const char *path, const char *what)
{
    par_status st;
    if (b->oom)
        st = par_err(PAR_ENOMEM, "%s '%s': out of memory building the file", what, path);
    else
        st = par_file_write_atomic(path, b->p, b->n);
    par_free(b->p);
    return st;
}

par_status par_sched_write_svg(const par_schedule *s, const par_sched_sim *sim, const char *path)
{
    static const char *const fill[2][4] = {{"#4e79a7", "#59a14f", "#f28e2b", "#76b7b2"},
                                           {"#a0bfe0", "#a8d5a0", "#f8c58f", "#bfe0dd"}};
    static const char *const label[4] = {"F", "B", "W", "BW"};
    int p = s->params.pp;
    double span = sim->makespan > 0 ? sim->makespan : 1.0;
    double unit = 1600.0 / span;
    if (unit > 40)
        unit = 40;
    if (unit < 2)
        unit = 2;
    double left = 70, top = 40, row = 26;
    double width = left + span * unit + 20, height = top + p * row + 50;
    sbuf b = {0};
    sb_printf(&b,
              "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
              "font-family=\"sans-serif\" font-size=\"11\">\n"
              "<!-- parity schedule -->\n" /* how a later --svg knows it may replace it (core/outfile.h) */
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
              "<text x=\"%.0f\" y=\"20\" font-size=\"14\">%s: PP %d, VPP %d, m %d; makespan %g, bubble %.2f %%</text>\n",
              width, height, left, par_schedule_kind_name(s->params.kind), p, s->params.vpp, s->params.n_micro,
              sim->makespan, 100.0 * sim->bubble);
    for (int r = 0; r < p; r++) {
        double y = top + r * row;
        sb_printf(&b, "<text x=\"8\" y=\"%.1f\">rank %d</text>\n", y + row * 0.65, r);
        sb_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4f4f4\"/>\n", left, y + 2,
                  span * unit, row - 4);
        for (int i = 0; i < s->n_actions[r]; i++) {
            const par_action *a = &s->actions[r][i];
            if (!is_compute(a->kind))
                continue;
            double x = left + sim->spans[r][i].start * unit, w = (sim->spans[r][i].end - sim->spans[r][i].start) * unit;
            sb_printf(&b,
                      "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                      "stroke-width=\"0.5\"><title>%s mb %d stage %d chunk %d dir %d [%g, %g)</title></rect>\n",
                      x, y + 2, w, row - 4, fill[second_colour(s, a)][a->kind], label[a->kind], a->mb, a->stage,
                      a->chunk, a->dir, sim->spans[r][i].start, sim->spans[r][i].end);
            if (w >= 12)
                sb_printf(&b, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"black\">%d</text>\n",
                          x + w / 2, y + row * 0.65, a->mb);
        }
    }
    double ly = top + p * row + 25;
    for (int k = 0; k < 4; k++)
        sb_printf(&b,
                  "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
                  "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                  left + k * 70, ly - 11, fill[0][k], left + k * 70 + 18, ly, label[k]);
    sb_printf(&b, "<text x=\"%.0f\" y=\"%.0f\">(lighter: %s 1; box label: microbatch)</text>\n", left + 280, ly,
              s->n_dirs == 2 ? "direction" : "odd chunk");
    sb_printf(&b, "</svg>\n");
    return sb_write(&b, path, "schedule SVG");
}

par_status par_sched_write_trace(const par_schedule *s, const par_sched_sim *sim, const char *path)
{
    static const char *const label[4] = {"F", "B", "W", "BW"};
    sbuf b = {0};
    sb_printf(&b, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"generator\": \"parity\"}, \"traceEvents\": [\n");
    int first = 1;
    for (int r = 0; r < s->params.pp; r++) {
        sb_printf(&b,
                  "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
                  "\"rank %d\"}}",
                  first ? "" : ",\n", r, r, r);
        first = 0;
        for (int i = 0; i < s->n_actions[r]; i++) {
            const par_action *a = &s->actions[r][i];
            if (!is_compute(a->kind))
                continue;
            /* 1 time unit = 1 ms = 1000 us (trace timestamps are in us) */
            sb_printf(&b,
                      ",\n{\"name\": \"%s mb%d\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, "
                      "\"pid\": %d, \"tid\": %d, \"args\": {\"mb\": %d, \"stage\": %d, \"chunk\": %d, \"dir\": %d}}",
                      label[a->kind], a->mb, label[a->kind], 1000.0 * sim->spans[r][i].start,
                      1000.0 * (sim->spans[r][i].end - sim->spans[r][i].start), r, r, a->mb, a->stage, a->chunk,
                      a->dir);
        }
    }
    sb_printf(&b, "\n]}\n");
    return sb_write(&b, path, "schedule trace");
}
