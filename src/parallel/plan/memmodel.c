/* parallel/plan/memmodel.c - the per-rank memory model (see parallel/plan/memmodel.h,
 * docs/planning.md "Memory"). */
#include "parallel/plan/memmodel.h"

#include <string.h>

#include "model/params.h"
#include "parallel/plan/memmodel_act.h"
#include "parallel/layout/groups.h"
#include "parallel/plan/memmodel_zero.h"
#include "parallel/schedule/schedule.h"
#include "parallel/layout/tp_split.h"
#include "parallel/layout/zero_geom.h"

/* What one pipeline rank holds, and the ZeRO geometry of its two plans. */
typedef struct {
    uint8_t *blocks;          /* [n_blocks] 1: held */
    int embed, head, final;   /* top-level parts (holders.c seg_hold) */
    int64_t floats;           /* held float parameters (dense + one EP slice) */
    int64_t dense;            /* of them dense (expert < 0): a shared copy's weights */
    int64_t n_moe;            /* MoE blocks held */
    int64_t attn_grads;       /* held gradient floats of TP's per-step sum (reduce.c tp_wanted: '.attn.';
                               * SP: every dense entry; all layers: embed / head, the TP shared expert) */
    int64_t expert_grads;     /* held routed-expert floats (ETP's per-step sum) */
    par_memmodel_zero zd, ze;       /* dense over dp-cp (CP * Da), experts over edp (De) */
    double act[2], ws_bwd[2], fixed[2]; /* cached activations for cp rank 0 / > 0 */
    int inflight[2], cached[2];
    double act_sends;         /* the step's pipeline sends (cached with act) */
} stage_info;

struct par_memmodel {
    par_config cfg;
    par_layout lay;
    par_memmodel_opts o;
    par_param_table own;      /* built by par_memmodel_create (unused when shared) */
    const par_param_table *tab;
    int pp, per;
    par_schedule sch;
    int have_sch;
    stage_info *st;           /* [pp] */
    double es_w, es_g, es_o, es_m, es_a; /* bytes: weights, grads, optimizer state, master, activations */
    int64_t first_r0;         /* shared_replicas: the process whose lowest ranks `first` holds (-1: none) */
    int64_t *first;           /* [pp * tp] lowest world rank of each dense replica group in that process */
};

void par_memmodel_opts_init(par_memmodel_opts *o)
{
    memset(o, 0, sizeof *o);
    o->rt = PAR_MM_MEGATRON;
    o->real_bytes = 8;
    o->skew = PAR_MM_DEFAULT_SKEW;
}

double par_memmodel_tag(const par_memmodel_rank *r, par_tag tag)
{
    switch (tag) {
    case PAR_TAG_PARAM:
        return r->weights;
    case PAR_TAG_GRAD:
        return r->grads;
    case PAR_TAG_OPTIM:
        return r->optim + r->ws_muon;
    case PAR_TAG_ACT:
        return r->act + r->ws_bwd;
    case PAR_TAG_COMM:
        return r->comm + r->ws_staging;
    case PAR_TAG_MODEL:
        return r->model;
    default:
        return 0;
    }
}

void par_memmodel_free(par_memmodel *mm)
{
    if (!mm)
        return;
    for (int s = 0; mm->st && s < mm->pp; s++) {
        par_free(mm->st[s].blocks);
        par_memmodel_zero_free(&mm->st[s].zd);
        par_memmodel_zero_free(&mm->st[s].ze);
    }
    par_free(mm->st);
    par_free(mm->first);
    if (mm->have_sch)
        par_schedule_free(&mm->sch);
    if (mm->tab == &mm->own)
        par_param_table_free(&mm->own);
    par_free(mm);
}

/* holders.c seg_hold: the blocks and top-level parts of segment seg. */
static void seg_hold(const par_memmodel *mm, int seg, stage_info *si)
{
    const par_pplayout *pl = &mm->lay.pipe;
    int t = par_pplayout_offset(pl, seg, PAR_BLK_LAYER), mt = par_pplayout_offset(pl, seg, PAR_BLK_MTP);
    for (int i = pl->seg_off[seg]; i < pl->seg_off[seg + 1]; i++) {
        switch (pl->items[i]) {
        case PAR_BLK_EMBED:
            si->embed = 1;
            break;
        case PAR_BLK_LAYER:
            si->blocks[t++] = 1;
            break;
        case PAR_BLK_MTP:
            si->blocks[mm->cfg.n_layers + mt++] = 1;
            si->embed = si->head = 1;
            break;
        case PAR_BLK_LOSS:
            si->head = si->final = 1;
            break;
        }
    }
}

static int holds(const par_memmodel *mm, const stage_info *si, int idx)
{
    const par_param *p = &mm->tab->p[idx];
    if (p->dtype != PAR_PDT_REAL)
        return 0;
    if (p->expert >= mm->cfg.n_routed_experts / mm->lay.ep)
        return 0; /* one EP slice: [0, E/EP) (every slice has the same shapes) */
    if (p->layer >= 0)
        return si->blocks[p->layer];
    if (idx == mm->tab->top.embed)
        return si->embed;
    if (idx == mm->tab->top.head)
        return si->head;
    return si->final;
}

/* Elements of entry i a rank holds: a TP shard's (parity's runtime,
 * parallel/layout/tp_split.h par_tp_storage_cut), else the whole tensor. */
static int64_t held_numel(const par_memmodel *mm, const par_param_table *t, int i)
{
    int64_t P = 1;
    if (mm->o.rt == PAR_MM_PARITY)
        par_tp_storage_cut(&mm->lay, t->p[i].name, &P);
    return t->p[i].numel / P;
}

/* Dense entry i is in the TP gradient sum (reduce.c tp_wanted, the
 * PAR_TPG_* bits executor.c sets; a held shard is not). */
static int tp_summed(const par_memmodel *mm, const par_param_table *t, int i)
{
    const par_layout *l = &mm->lay;
    if (held_numel(mm, t, i) != t->p[i].numel)
        return 0;
    const int all = l->tp > 1 && (l->tp_all_layers || l->sequence_parallel);
    if (strstr(t->p[i].name, ".attn.") || (l->tp > 1 && l->sequence_parallel))
        return 1;
    if (all && (i == t->top.embed || i == t->top.head))
        return 1;
    return par_tp_shared_expert_split(l) && strstr(t->p[i].name, ".shared_experts.") != NULL; /* any EP, ETP */
}

/* The held entries of stage si as the two plans' lists (dense: expert < 0;
 * experts: one EP slice; table order, like dp_step.c), and the held floats. */
static par_status stage_plans(par_memmodel *mm, stage_info *si)
{
    const par_param_table *t = mm->tab;
    int *lists = par_malloc((size_t)(t->n > 0 ? t->n : 1) * 2 * sizeof *lists, PAR_TAG_MODEL);
    int64_t *numel = par_malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *numel, PAR_TAG_MODEL);
    if (!lists || !numel) {
        par_free(lists);
        par_free(numel);
        return par_err(PAR_ENOMEM, "memory model: no memory for %d table entries", t->n);
    }
    int nl[2] = {0, 0};
    for (int i = 0; i < t->n; i++) {
        numel[i] = held_numel(mm, t, i);
        if (!holds(mm, si, i))
            continue;
        si->floats += numel[i];
        int k = t->p[i].expert >= 0;
        si->dense += k ? 0 : numel[i];
        if (t->p[i].has_grad && ((k && numel[i] == t->p[i].numel) || (!k && tp_summed(mm, t, i))))
            *(k ? &si->expert_grads : &si->attn_grads) += numel[i];
        lists[k * t->n + nl[k]++] = i;
    }
    for (int b = 0; b < t->n_blocks; b++)
        si->n_moe += si->blocks[b];
    const par_layout *l = &mm->lay;
    par_status s = par_memmodel_zero_build_sized(&si->zd, t, numel, lists, nl[0], (int)(l->cp * l->da));
    if (!s)
        s = par_memmodel_zero_build_sized(&si->ze, t, numel, lists + t->n, nl[1], (int)l->de);
    par_free(lists);
    par_free(numel);
    return s;
}

static par_status stages_build(par_memmodel *mm)
{
    int nb = mm->tab->n_blocks;
    mm->st = par_calloc((size_t)mm->pp, sizeof *mm->st, PAR_TAG_MODEL);
    if (!mm->st)
        return par_err(PAR_ENOMEM, "memory model: no memory for %d stages", mm->pp);
    for (int r = 0; r < mm->pp; r++) {
        stage_info *si = &mm->st[r];
        si->blocks = par_calloc((size_t)(nb > 0 ? nb : 1), 1, PAR_TAG_MODEL);
        if (!si->blocks)
            return par_err(PAR_ENOMEM, "memory model: no memory for the block map");
        if (!mm->have_sch) { /* no pipeline: the rank holds everything */
            memset(si->blocks, 1, (size_t)nb);
            si->embed = si->head = si->final = 1;
        } else {
            for (int dir = 0; dir < mm->sch.n_dirs; dir++)
                for (int s = 0; s < mm->sch.n_stages; s++)
                    if (par_schedule_stage_rank(&mm->sch, dir, s) == r)
                        seg_hold(mm, s, si);
        }
        par_status s = stage_plans(mm, si);
        if (s)
            return s;
    }
    return PAR_OK;
}

static par_status schedule_of(par_memmodel *mm)
{
    const par_layout *l = &mm->lay;
    if (l->pp <= 1)
        return PAR_OK;
    par_schedule_params sp;
    par_schedule_params_init(&sp);
    par_status s = par_schedule_kind_parse(l->schedule[0] ? l->schedule : "1f1b", &sp.kind);
    if (s)
        return s;
    sp.pp = (int)l->pp;
    sp.vpp = (int)l->vpp;
    sp.n_micro = (int)l->n_micro;
    sp.mb_group = (int)l->mb_group;
    if ((s = par_schedule_build(&sp, &mm->sch)))
        return s;
    mm->have_sch = 1;
    return PAR_OK;
}

static par_status mm_new(par_memmodel **out, const par_config *cfg, const par_layout *l, const par_memmodel_opts *o,
                         const par_param_table *shared)
{
    *out = NULL;
    if (!l->resolved)
        return par_err(PAR_EINVAL, "memory model: the layout is not resolved");
    if (l->n_micro > 1000000)
        return par_err(PAR_EINVAL, "memory model: %lld microbatches is more than the model walks (10^6)",
                       (long long)l->n_micro);
    par_memmodel *mm = par_calloc(1, sizeof *mm, PAR_TAG_MODEL);
    if (!mm)
        return par_err(PAR_ENOMEM, "memory model: out of memory");
    mm->cfg = *cfg;
    mm->lay = *l;
    par_memmodel_opts_init(&mm->o);
    if (o)
        mm->o = *o;
    if (mm->o.skew <= 0)
        mm->o.skew = PAR_MM_DEFAULT_SKEW;
    mm->pp = (int)l->pp;
    mm->per = (int)(l->world / l->pp);
    int parity = mm->o.rt == PAR_MM_PARITY;
    double rb = mm->o.real_bytes == 4 ? 4 : 8;
    mm->es_w = parity ? rb : 2;
    mm->es_g = parity ? rb : 4;
    mm->es_o = parity ? rb : 4;
    mm->es_m = parity ? 0 : 4;
    mm->es_a = parity ? rb : 2;
    par_status s = PAR_OK;
    if (shared)
        mm->tab = shared;
    else if (!(s = par_param_table_build(&mm->own, cfg)))
        mm->tab = &mm->own;
    if (s || (s = schedule_of(mm)) || (s = stages_build(mm))) {
        par_memmodel_free(mm);
        return s;
    }
    *out = mm;
    return PAR_OK;
}

par_status par_memmodel_create(par_memmodel **out, const par_config *cfg, const par_layout *l, const par_memmodel_opts *o)
{
    return mm_new(out, cfg, l, o, NULL);
}

par_status par_memmodel_create_shared(par_memmodel **out, const par_config *cfg, const par_layout *l, const par_memmodel_opts *o,
                                const par_param_table *tab)
{
    if (!tab)
        return par_err(PAR_EINVAL, "memory model: no parameter table to share");
    return mm_new(out, cfg, l, o, tab);
}

/* ---- activations ---------------------------------------------------------- */

static par_memmodel_act_ctx act_ctx(const par_memmodel *mm, int64_t rows, int cp_rank, double recv)
{
    par_memmodel_act_ctx c;
    memset(&c, 0, sizeof c);
    c.cfg = &mm->cfg;
    c.es = mm->es_a;
    c.ep = mm->lay.ep;
    c.recv_factor = recv;
    /* parity's cp.c keeps the attention state of its halo + local rows (and the rows' entries); a GPU
     * job keeps its local tokens' */
    c.cp = mm->o.rt == PAR_MM_PARITY ? mm->lay.cp : 1;
    c.cp_rank = cp_rank;
    c.rows = rows;
    /* parity's TP / ETP hooks (the shard's compute state; the held shards: held_numel); the megatron runtime's TP is
     * not modelled here (its weights count whole) */
    c.tp = mm->o.rt == PAR_MM_PARITY ? mm->lay.tp : 1;
    c.etp = mm->o.rt == PAR_MM_PARITY ? mm->lay.etp : 1;
    /* SP: the rank's tokens are 1/TP of the CP slice (both runtimes); parity's vocab-parallel head and
     * TP shared expert (executor.c tp_layer_hooks) */
    const int tp = mm->lay.tp > 1, all = tp; /* every TP layer under TP > 1 (executor.c; --tp-all-layers is a no-op) */
    c.sp = tp && mm->lay.sequence_parallel ? mm->lay.tp : 1;
    c.vocab = mm->o.rt == PAR_MM_PARITY && all;
    c.tp_mlp = c.vocab && mm->lay.ep <= 1 && mm->lay.etp <= 1;
    c.tp_shared = mm->o.rt == PAR_MM_PARITY && par_tp_shared_expert_split(&mm->lay);
    c.recompute = mm->o.rt == PAR_MM_MEGATRON && mm->o.recompute;
    c.gate_logits = mm->o.rt == PAR_MM_MEGATRON;
    return c;
}

/* No pipeline: the whole model on T tokens in one forward (step.c): saved
 * = sample ids, X[0], every block, the head, the MTP input, block and head;
 * backward = dA, dB (+ d0 with MTP) and the largest piece's scratch. */
static void act_whole(const par_memmodel *mm, const par_memmodel_act_ctx *c, int64_t T, double *saved, double *bwd)
{
    const par_config *g = &mm->cfg;
    int L = (int)g->n_layers, mtp = g->n_mtp_layers > 0;
    double x = par_memmodel_act_stream(c, T), blk = 0;
    double s = 4.0 * (double)T + x + par_memmodel_act_head_saved(c, T) + par_memmodel_act_head_hook_kept(c, T);
    for (int b = 0; b < L; b++) {
        s += par_memmodel_act_block_saved(c, b, T);
        double w = par_memmodel_act_block_bwd_peak(c, b, T);
        blk = w > blk ? w : blk;
    }
    double w = par_memmodel_act_head_bwd_peak(c, T);
    if (mtp) {
        s += par_memmodel_act_mtp_input_saved(c, T) + par_memmodel_act_block_saved(c, L, T) + par_memmodel_act_head_saved(c, T) +
             par_memmodel_act_head_hook_kept(c, T);
        double wm = x + par_memmodel_act_block_bwd_peak(c, L, T), wi = x + par_memmodel_act_mtp_input_bwd_peak(c, T);
        w = w > wm ? w : wm;
        w = w > wi ? w : wi;
        blk += x; /* d0 stays until the end of the backward */
    }
    *saved = s;
    *bwd = 2 * x + (w > blk ? w : blk);
}

/* One pipeline segment on T tokens (stage.c par__exec_forward /
 * par__exec_backward):
 * rel = what its slot frees at the backward, kept = what the executors keep
 * for the rest of the step, bwd = the backward's peak beyond the slot. */
static void seg_act(const par_memmodel *mm, const par_memmodel_act_ctx *c, int seg, int64_t T, double *rel, double *kept,
                    double *bwd, double *wkeep)
{
    const par_pplayout *pl = &mm->lay.pipe;
    const int L = (int)mm->cfg.n_layers;
    int t = par_pplayout_offset(pl, seg, PAR_BLK_LAYER);
    double x = par_memmodel_act_stream(c, T), r = 0, k = 0, wk = 0, acc = x, peak = x; /* dX */
    int first = pl->seg_off[seg], last = pl->seg_off[seg + 1];
    for (int i = first; i < last; i++) {
        char it = pl->items[i];
        int b = it == PAR_BLK_LAYER ? t++ : L;
        if (it == PAR_BLK_EMBED)
            r += x;
        else if (it == PAR_BLK_LOSS)
            r += par_memmodel_act_head_saved(c, T), k += par_memmodel_act_head_hook_kept(c, T), wk += par_memmodel_act_head_wkeep(c, T);
        if (it == PAR_BLK_LAYER || it == PAR_BLK_MTP) {
            double kb = par_memmodel_act_block_exec_kept(c, b, T);
            r += par_memmodel_act_block_saved(c, b, T) - kb;
            k += kb;
            wk += par_memmodel_act_block_wkeep(c, b, T);
        }
        if (it == PAR_BLK_MTP)
            r += par_memmodel_act_mtp_input_saved(c, T) + par_memmodel_act_head_saved(c, T), k += par_memmodel_act_head_hook_kept(c, T),
                wk += par_memmodel_act_mtp_input_wkeep(c, T) + par_memmodel_act_head_wkeep(c, T);
    }
    t = par_pplayout_offset(pl, seg, PAR_BLK_LAYER) + par_pplayout_count(pl, seg, PAR_BLK_LAYER);
    for (int i = last - 1; i >= first; i--) { /* the backward, in reverse */
        char it = pl->items[i];
        double w = 0;
        if (it == PAR_BLK_LOSS)
            w = par_memmodel_act_head_bwd_peak(c, T);
        else if (it == PAR_BLK_LAYER) {
            acc += x; /* dN */
            w = par_memmodel_act_block_bwd_peak(c, --t, T);
        } else if (it == PAR_BLK_MTP) {
            acc += 2 * x; /* dB, d0 */
            double wh = par_memmodel_act_head_bwd_peak(c, T), wb = par_memmodel_act_block_bwd_peak(c, L, T);
            double wi = par_memmodel_act_mtp_input_bwd_peak(c, T);
            w = wh > wb ? wh : wb;
            w = w > wi ? w : wi;
        }
        if (acc + w > peak)
            peak = acc + w;
    }
    *rel = r;
    *kept = k;
    *bwd = peak;
    *wkeep = wk;
}

typedef struct {
    double saved, ws, sends; /* saved at the peak, the backward's scratch then, the sends in flight (peak) */
    int inflight;
} walk_out;

/* Runs pipeline rank r's action list (parallel/schedule/schedule.h) and tracks the
 * bytes alive: a slot (microbatch, stage) gets its received input, its
 * saved tensors (rel + kept) at F and its received gradient; parity's split
 * B adds the inputs its W needs (wkeep, model/block.c); B, or W for a split
 * backward (parity and a GPU job keep the inputs for W), frees rel and the
 * messages; kept stays for the step.  A local hand-over (DualPipeV's turn) lands in the earlier
 * stage's slot (stage.c).  A send's heap copy lives from its post to the
 * rank's next message, where it is done (executor.c reap_sends: the peer
 * has matched it by then): two at once where two sends follow each other. */
static par_status act_walk(const par_memmodel *mm, int r, const double *rel, const double *kept, const double *bwd,
                           const double *wkeep, double x, walk_out *o)
{
    const par_schedule *s = &mm->sch;
    int S = s->n_stages, m = s->params.n_micro;
    memset(o, 0, sizeof *o);
    double *slot = par_calloc((size_t)S * (size_t)m, sizeof *slot, PAR_TAG_MODEL);
    if (!slot)
        return par_err(PAR_ENOMEM, "memory model: no memory for %d x %d slots", m, S);
    const int at_w = s->split_bw; /* parity runs real W actions too (docs/parallel.md "The backward in two passes") */
    double live = 0, best = -1, top = 0, held = 0;
    int alive = 0;
    for (int i = 0; i < s->n_actions[r]; i++) {
        const par_action *a = &s->actions[r][i];
        size_t k = (size_t)a->mb * (size_t)S + (size_t)a->stage;
        switch (a->kind) {
        case PAR_ACT_RECV_ACT:
        case PAR_ACT_RECV_GRAD:
            slot[k] += x, live += x;
            held = 0;
            break;
        case PAR_ACT_SEND_ACT:
        case PAR_ACT_SEND_GRAD:
            held += x;
            if (held > o->sends)
                o->sends = held;
            held = x;
            break;
        case PAR_ACT_F:
            slot[k] += rel[a->stage], live += rel[a->stage] + kept[a->stage];
            if (++alive > o->inflight)
                o->inflight = alive;
            break;
        case PAR_ACT_B:
        case PAR_ACT_BW:
        case PAR_ACT_W:
            if (a->kind == PAR_ACT_B && at_w && mm->o.rt == PAR_MM_PARITY) /* W's inputs, in the slot until W */
                slot[k] += wkeep[a->stage], live += wkeep[a->stage];
            if (a->kind != PAR_ACT_W) {
                if (live + bwd[a->stage] > best)
                    best = live + bwd[a->stage], o->saved = live, o->ws = bwd[a->stage];
                if (a->stage > 0 && par_schedule_stage_rank(s, par_schedule_mb_dir(s, a->mb), a->stage - 1) == r)
                    slot[k - 1] += x, live += x; /* the gradient handed to the local earlier stage */
            }
            if ((a->kind == PAR_ACT_W) == at_w || a->kind == PAR_ACT_BW) {
                live -= slot[k], slot[k] = 0;
                alive--;
            }
            break;
        default:
            break;
        }
        if (live > top)
            top = live;
    }
    if (top > best)
        o->saved = top, o->ws = 0;
    par_free(slot);
    return PAR_OK;
}

/* Activations of pipeline rank r: saved at the peak, the backward scratch
 * then, the per-step fixed buffers (batches, statistics), the pipeline
 * sends in flight and the microbatches in flight. */
typedef struct {
    double saved, ws, fixed, sends;
    int inflight;
} act_out;

static par_status stage_act(const par_memmodel *mm, int r, int cp_rank, double recv, act_out *o)
{
    const par_layout *l = &mm->lay;
    const int parity = mm->o.rt == PAR_MM_PARITY;
    const int64_t S = mm->cfg.seq_length, B = l->global_batch, mbs = l->micro_batch > 0 ? l->micro_batch : 1;
    const int64_t local = B / l->da; /* rows of this rank's attention-DP share */
    int64_t rows = !mm->have_sch && parity ? local : mbs;
    par_memmodel_act_ctx c = act_ctx(mm, rows, cp_rank, recv);
    const int64_t T = rows * S / (l->cp * c.sp); /* SP: the TP rank's slice of the CP slice */
    const int tok = l->cp > 1 || c.sp > 1;     /* microbatch.c: rows derived whole, then sliced */
    memset(o, 0, sizeof *o);
    int64_t ns = mm->o.samples > 0 ? (mm->o.samples * local + B - 1) / B : local;
    const int64_t nrow = mm->have_sch ? mm->st[r].n_moe : -1; /* rows: the rank's stages' blocks */
    if (parity) /* the window's terms; the aux counts are per microbatch in its slot (stage.c) */
        o->fixed = par_memmodel_act_stats_terms(&c, ns, nrow);
    if (!mm->have_sch) {
        act_whole(mm, &c, T, &o->saved, &o->ws);
        o->inflight = 1;
        if (parity)
            o->fixed += par_memmodel_act_batch(T) + (tok ? par_memmodel_act_batch(rows * S) + 4.0 * rows * S + 4.0 * T : 0) +
                        par_memmodel_act_stats_rows(&c, ns, nrow);
        return PAR_OK;
    }
    const int64_t nm = l->n_micro > 0 ? l->n_micro : 1, ns_mb = (ns + nm - 1) / nm;
    int ns_seg = mm->sch.n_stages;
    double *v = par_calloc((size_t)ns_seg * 4, sizeof *v, PAR_TAG_MODEL);
    if (!v)
        return par_err(PAR_ENOMEM, "memory model: no memory for %d stages", ns_seg);
    for (int s = 0; s < ns_seg; s++) {
        seg_act(mm, &c, s, T, &v[s], &v[ns_seg + s], &v[2 * ns_seg + s], &v[3 * ns_seg + s]);
        if (!parity) /* a GPU job frees every hook's state with the microbatch (parity's ep.c and
                      * cp_hook.c do too; its TP / ETP hooks keep theirs for the step) */
            v[s] += v[ns_seg + s], v[ns_seg + s] = 0;
        else /* the slot's aux counts (par_stats_view) */
            v[s] += par_memmodel_act_stats_rows(&c, ns_mb, nrow);
    }
    walk_out w;
    par_status st = act_walk(mm, r, v, v + ns_seg, v + 2 * ns_seg, v + 3 * ns_seg, par_memmodel_act_stream(&c, T), &w);
    par_free(v);
    if (st)
        return st;
    o->saved = w.saved;
    o->ws = w.ws;
    o->sends = w.sends;
    o->inflight = w.inflight;
    if (parity) /* microbatch.c par__exec_setup: every microbatch's batch and sample ids; CP: one executor each */
        o->fixed += (double)l->n_micro * (par_memmodel_act_batch(T) + 4.0 * T + (tok ? 4.0 * rows * S + 4.0 * T : 0));
    return PAR_OK;
}

/* ---- one rank --------------------------------------------------------------- */

/* EP rows received per row sent by world rank r: measured, or the skew. */
static double recv_factor(const par_memmodel *mm, const stage_info *si, int r)
{
    const par_layout *l = &mm->lay;
    if (l->ep <= 1)
        return 1.0;
    if (!mm->o.recv_rows)
        return mm->o.skew;
    const double sp = l->tp > 1 && l->sequence_parallel ? (double)l->tp : 1; /* SP: the rank's tokens only */
    double sent = (double)si->n_moe * (double)(l->global_batch / l->da) * (double)mm->cfg.seq_length /
                  ((double)l->cp * sp) * (double)mm->cfg.n_activated_experts;
    return sent > 0 ? (double)mm->o.recv_rows[r] / sent : 1.0;
}

/* reduce_sum.c's pack of n floats of es bytes and comm/collectives.c
 * par_allreduce's rows over a group of P (par_allreduce_rows: P x the
 * largest block, in chunks past 16 KiB). */
static double sum_staging(int64_t n, int64_t P, double es)
{
    return (double)n + (double)par_allreduce_rows((size_t)n, (int)P, (size_t)es);
}

/* 1 when the ranks of a process share the dense copy (replicas.h). */
static int sharing(const par_memmodel *mm)
{
    return mm->o.rt == PAR_MM_PARITY && mm->o.shared_replicas && mm->lay.world > 1;
}

/* The replicated dense state of stage si's dense plan (zero.c: m, v of dp * shard, Muon momentum). */
static double dense_state(const stage_info *si)
{
    return 2.0 * (double)si->zd.dp * (double)si->zd.shard + (double)si->zd.n_muon;
}

/* mm->first for the process of world rank r (kept while the caller walks
 * the ranks of one process). */
static par_status process_firsts(par_memmodel *mm, int r)
{
    const int64_t N = mm->lay.world, R = mm->o.ranks_per_process > 0 ? mm->o.ranks_per_process : N;
    const int64_t r0 = (int64_t)r / R * R, r1 = r0 + R < N ? r0 + R : N, tp = mm->lay.tp;
    if (mm->first && mm->first_r0 == r0)
        return PAR_OK;
    if (!mm->first && !(mm->first = par_malloc((size_t)(mm->pp * tp) * sizeof *mm->first, PAR_TAG_MODEL)))
        return par_err(PAR_ENOMEM, "memory model: no memory for %lld replica groups", (long long)(mm->pp * tp));
    for (int64_t i = 0; i < mm->pp * tp; i++)
        mm->first[i] = -1;
    for (int64_t q = r0; q < r1; q++) {
        par_rank_coords c;
        par_status s = par_rank_coords_of(&mm->lay, (int)q, &c);
        if (s)
            return s;
        if (mm->first[c.pp * tp + c.tp] < 0)
            mm->first[c.pp * tp + c.tp] = q;
    }
    mm->first_r0 = r0;
    return PAR_OK;
}

/* *out = 1 when world rank r, at coordinates rc, writes its process's
 * shared copy (replicas.h par_replica_updater: the lowest rank of its dense
 * replica group, pipeline rank x TP shard, in the process) or there is none. */
static par_status updates_copy(par_memmodel *mm, int r, const par_rank_coords *rc, int *out)
{
    *out = 1;
    if (!sharing(mm))
        return PAR_OK;
    par_status s = process_firsts(mm, r);
    if (!s)
        *out = mm->first[rc->pp * mm->lay.tp + rc->tp] == r;
    return s;
}

static void optim_of(const par_memmodel *mm, const stage_info *si, int writes, const par_rank_coords *rc, par_memmodel_rank *o)
{
    const int skip_dense_ws = !writes; /* replicated: the writer alone runs Muon on the copy */
    const par_memmodel_zero *z[2] = {&si->zd, &si->ze};
    const int q[2] = {rc->cp + (int)mm->lay.cp * rc->dp, rc->edp};
    const int zero1 = mm->lay.distributed_optimizer;
    double state = 0, master = 0, ws = 0, buf = 0, stage = 0;
    for (int k = 0; k < 2; k++) {
        const par_memmodel_zero *g = z[k];
        double dpseg = (double)g->dp * (double)g->seg;
        if (zero1) {
            state += 2.0 * (double)g->shard + (double)g->load[q[k]];
            master += (double)g->shard + (double)g->load[q[k]];
            ws = (double)g->muon_ws[q[k]] > ws ? (double)g->muon_ws[q[k]] : ws;
        } else {
            if (!(k == 0 && sharing(mm))) /* the dense plan's state: the process's copy */
                state += 2.0 * (double)g->dp * (double)g->shard + (double)g->n_muon; /* zero.c: m, v of dp * shard */
            master += (double)(g->n_adamw + g->n_muon);
            if (!(k == 0 && skip_dense_ws))
                ws = (double)g->muon_ws_all > ws ? (double)g->muon_ws_all : ws;
        }
        if (zero1) {
            buf += dpseg + (double)g->seg; /* zero.c: buf [dp * seg], red [seg] */
            stage = dpseg > stage ? dpseg : stage; /* reduce-scatter rows */
        } else { /* zero.c reduce_in_place, per chunk: the fields packed (more than one) + the all-reduce rows */
            int64_t n = g->n_adamw + g->n_muon, ch = n < PAR_ZERO_REDUCE_CHUNK ? n : PAR_ZERO_REDUCE_CHUNK;
            int64_t rows = (int64_t)par_allreduce_rows((size_t)ch, (int)g->dp, (size_t)mm->es_o);
            double st = (double)((g->n_ent > 1 ? ch : 0) + rows);
            stage = st > stage ? st : stage;
        }
    }
    o->optim_state = state * mm->es_o;
    o->optim_master = master * mm->es_m;
    o->optim = o->optim_state + o->optim_master;
    o->ws_muon = ws * mm->es_o;
    if (mm->o.rt == PAR_MM_PARITY) { /* the TP / ETP gradient sums: packed fields + the all-reduce's rows */
        double tp = mm->lay.tp > 1 ? sum_staging(si->attn_grads, mm->lay.tp, mm->es_o) : 0;
        double etp = mm->lay.etp > 1 ? sum_staging(si->expert_grads, mm->lay.etp, mm->es_o) : 0;
        stage = tp > stage ? tp : stage;
        stage = etp > stage ? etp : stage;
        o->comm_dp = buf * mm->es_o;
        o->ws_staging = stage * mm->es_o;
    }
}

static par_status act_of(par_memmodel *mm, stage_info *si, int stage, int cp_rank, double recv, act_out *a)
{
    int c = cp_rank > 0;
    if (mm->o.recv_rows || !si->cached[c]) {
        par_status s = stage_act(mm, stage, cp_rank, recv, a);
        if (s || mm->o.recv_rows)
            return s;
        si->act[c] = a->saved, si->ws_bwd[c] = a->ws, si->fixed[c] = a->fixed;
        si->inflight[c] = a->inflight;
        si->cached[c] = 1;
        si->act_sends = a->sends;
        return PAR_OK;
    }
    a->saved = si->act[c], a->ws = si->ws_bwd[c], a->fixed = si->fixed[c], a->inflight = si->inflight[c];
    a->sends = si->act_sends;
    return PAR_OK;
}

/* Bytes of the structures parity's runtime builds per rank (model/model.c,
 * parallel/step/exec_hold.c, executor.c, ep.c, zero_plan.c, schedule.c), the
 * templated records at their x86-64 sizes (a block record 760 B, the
 * executor 3,192 B, a RoPE table 4,104 B; f32 alike: pointers): what the
 * allocator's `model` tag holds for the rank.  The EP and CP hooks' states
 * (560 and 496 B) are allocated per microbatch in flight (tag act); their
 * tables are a pointer per slot and held block. */
#define MM_BLOCK_ACT 760.0
#define MM_EXEC 3192.0
#define MM_ROPE 4104.0
#define MM_ATTN_DIMS 112.0
#define MM_COST_KINDS 3 /* executor-impl.h COST_KINDS (F, B, W) */
static double model_struct(const par_memmodel *mm, const stage_info *si)
{
    const par_param_table *t = mm->tab;
    const par_layout *l = &mm->lay;
    const double nb = t->n_blocks, E = (double)mm->cfg.n_routed_experts, El = E / (double)l->ep;
    const double n_dense = t->n - nb * 3 * E, ntab = t->n;
    double b = 8 * (n_dense + nb * 3 * El + 1) + 2 * 8 * nb * 3 * El; /* loc, ew, egw */
    b += 2 * MM_ROPE + nb * (MM_ATTN_DIMS + MM_BLOCK_ACT) + 8.0 * (double)(mm->cfg.n_layers + 1);
    if (l->tp > 1 || l->etp > 1)
        b += 6 * ntab; /* the shard map */
    b += 4 * (nb + 3) + 2 * (ntab / 8 + 1) + nb; /* holders, two norm-skip bitsets, the block map */
    const par_memmodel_zero *z[2] = {&si->zd, &si->ze};
    for (int k = 0; k < 2; k++) /* each plan: its entries, the owned lists, three [dp + 1] tables */
        b += 40.0 * z[k]->n_ent + 4.0 * z[k]->n_ent + 3 * 8.0 * (z[k]->dp + 1);
    const double m = l->n_micro > 0 ? (double)l->n_micro : 1;
    if (l->ep > 1) /* a state pointer per microbatch slot and held MoE block; the node tables */
        b += m * (double)si->n_moe * 8 + 8 * nb + 36.0 * (double)l->ep;
    if (l->cp > 1 && l->tp <= 1) /* cp_hook.c: a saved-state pointer per slot and held block, the block map */
        b += m * (double)si->n_moe * 8 + 4 * nb + 64;
    if (mm->have_sch) { /* every pipeline rank's action list (par_action: 20 B); the executor's costs */
        for (int r = 0; r < mm->sch.params.pp; r++)
            b += 20.0 * (double)mm->sch.cap_actions[r] + 12;
        b += 8.0 * (4 * MM_COST_KINDS + 3 * m) * (double)mm->sch.n_stages;
    }
    return b + MM_EXEC;
}

par_status par_memmodel_rank_of(par_memmodel *mm, int r, par_memmodel_rank *o)
{
    par_rank_coords rc;
    par_status s = par_rank_coords_of(&mm->lay, r, &rc);
    if (s)
        return s;
    stage_info *si = &mm->st[rc.pp];
    const par_config *g = &mm->cfg;
    par_memmodel_rank out;
    memset(&out, 0, sizeof out);
    out.rank = r;
    out.stage = rc.pp;
    out.held_floats = si->floats;
    out.weights = (double)(si->floats - (sharing(mm) ? si->dense : 0)) * mm->es_w + (double)mm->tab->n_i32 * 4.0;
    out.grads = (double)si->floats * mm->es_g;
    int writes;
    if ((s = updates_copy(mm, r, &rc, &writes)))
        return s;
    optim_of(mm, si, writes, &rc, &out);
    out.recv_factor = recv_factor(mm, si, r);
    act_out a;
    if ((s = act_of(mm, si, rc.pp, rc.cp, out.recv_factor, &a)))
        return s;
    out.act_saved = a.saved;
    out.act_fixed = a.fixed;
    out.act = a.saved + a.fixed;
    out.ws_bwd = a.ws;
    out.inflight = a.inflight;
    if (mm->o.rt == PAR_MM_PARITY) {
        out.comm_pp = a.sends;
        out.ws_staging = out.ws_staging > a.sends ? out.ws_staging - a.sends : 0; /* never at once */
    } else {
        int64_t mbs = mm->lay.micro_batch > 0 ? mm->lay.micro_batch : 1, T = mbs * g->seq_length / mm->lay.cp;
        double x = 2.0 * (double)T * (double)(g->hc_mult * g->dim);
        out.comm_pp = mm->have_sch ? 2 * x : 0; /* one send and one receive buffer, bf16 */
        if (mm->lay.ep > 1)                     /* dispatch + combine buffers of one MoE layer, bf16 rows */
            out.comm_dispatch = 2.0 * (double)T * (double)g->n_activated_experts * out.recv_factor * (double)g->dim * 2.0;
    }
    out.comm = out.comm_dp + out.comm_pp + out.comm_dispatch;
    out.workspace = out.ws_bwd + out.ws_muon + out.ws_staging + (mm->o.rt == PAR_MM_MEGATRON ? mm->o.workspace : 0);
    out.model = mm->o.rt == PAR_MM_PARITY ? model_struct(mm, si) : 0;
    out.total = out.weights + out.grads + out.optim + out.act + out.comm + out.workspace + out.model;
    *o = out;
    return PAR_OK;
}

par_status par_memmodel_shared_of(par_memmodel *mm, int r, double *out)
{
    *out = 0;
    if (!sharing(mm))
        return PAR_OK;
    par_status s = process_firsts(mm, r);
    for (int64_t i = 0; !s && i < mm->pp * mm->lay.tp; i++)
        if (mm->first[i] >= 0) { /* one copy per group present in the process */
            const stage_info *si = &mm->st[i / mm->lay.tp];
            *out += (double)si->dense * mm->es_w + (mm->lay.distributed_optimizer ? 0 : dense_state(si) * mm->es_o);
        }
    return s;
}

par_status par_memmodel_stage_heaviest(par_memmodel *mm, int stage, par_memmodel_rank *out)
{
    if (stage < 0 || stage >= mm->pp)
        return par_err(PAR_ERANGE, "memory model: stage %d outside [0, %d)", stage, mm->pp);
    par_memmodel_rank best;
    memset(&best, 0, sizeof best);
    best.total = -1;
    for (int64_t r = 0; r < mm->lay.world; r++) {
        par_rank_coords rc;
        par_status s = par_rank_coords_of(&mm->lay, (int)r, &rc);
        if (s)
            return s;
        if (rc.pp != stage)
            continue;
        par_memmodel_rank x;
        if ((s = par_memmodel_rank_of(mm, (int)r, &x)))
            return s;
        if (x.total > best.total)
            best = x;
    }
    *out = best;
    return PAR_OK;
}
