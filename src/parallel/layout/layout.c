/* parallel/layout/layout.c - layout defaults and validation (docs/layouts.md). */
#include "parallel/layout/layout.h"

#include <stdio.h>
#include <string.h>

/* Every size and the world are at most 2^20, so products of three sizes fit
 * in int64_t. */
#define LAYOUT_MAX_WORLD (1LL << 20)
/* Batch sizes are at most 2^40 rows, so rows * Da fits too. */
#define LAYOUT_MAX_ROWS (1LL << 40)

static const char *const schedule_names[] = {"gpipe", "1f1b", "interleaved", "zb-h1",
                                             "dualpipe", "dualpipev", NULL};

const char *const *par_layout_schedule_names(void) { return schedule_names; }

void par_layout_init(par_layout *l)
{
    memset(l, 0, sizeof *l);
    l->tp = l->pp = l->cp = l->ep = l->etp = 1;
}

par_status par_layout_set_pp_layout(par_layout *l, const char *str)
{
    if (!str) {
        l->pp_layout[0] = '\0';
        return PAR_OK;
    }
    size_t n = strlen(str);
    if (n >= sizeof l->pp_layout)
        return par_err(PAR_EINVAL, "pipeline layout string is %zu characters, more than the %zu supported",
                       n, sizeof l->pp_layout - 1);
    memcpy(l->pp_layout, str, n + 1);
    return PAR_OK;
}

par_status par_layout_set_schedule(par_layout *l, const char *name)
{
    if (!name) {
        l->schedule[0] = '\0';
        return PAR_OK;
    }
    size_t n = strlen(name);
    if (n >= sizeof l->schedule)
        return par_err(PAR_EINVAL, "pipeline schedule name '%s' is too long (see --pipeline-schedule)", name);
    memcpy(l->schedule, name, n + 1);
    return PAR_OK;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int64_t par_layout_default_world(int64_t tp, int64_t pp, int64_t cp, int64_t ep, int64_t etp)
{
    if (tp < 1 || pp < 1 || cp < 1 || ep < 1 || etp < 1)
        return 0;
    if (tp > LAYOUT_MAX_WORLD || cp > LAYOUT_MAX_WORLD || ep > LAYOUT_MAX_WORLD ||
        etp > LAYOUT_MAX_WORLD || pp > LAYOUT_MAX_WORLD)
        return 0;
    int64_t a = tp * cp, b = etp * ep;
    if (a > LAYOUT_MAX_WORLD || b > LAYOUT_MAX_WORLD)
        return 0;
    int64_t lcm = a / gcd64(a, b) * b;
    if (lcm > LAYOUT_MAX_WORLD || lcm * pp > LAYOUT_MAX_WORLD)
        return 0;
    return lcm * pp;
}

static int64_t d_comp(int64_t ratio)
{
    if (ratio <= 0)
        return 0;
    return ratio == 4 ? 2 * ratio : ratio;
}

int64_t par_layout_d_window(const par_layout_model *m)
{
    int64_t d = m->window_size > 0 ? m->window_size : 0;
    for (int64_t b = 0; b < m->n_ratios; b++)
        if (d_comp(m->compress_ratios[b]) > d)
            d = d_comp(m->compress_ratios[b]);
    return d;
}

/* The D_window message: which term is the maximum. */
static void d_window_reason(const par_layout_model *m, char *buf, size_t n)
{
    int64_t best = -1, dc = 0;
    for (int64_t b = 0; b < m->n_ratios; b++)
        if (d_comp(m->compress_ratios[b]) > dc) {
            dc = d_comp(m->compress_ratios[b]);
            best = b;
        }
    if (best >= 0 && dc > m->window_size)
        snprintf(buf, n, "max(window_size %lld, d_comp %lld of block %lld with compress ratio %lld)",
                 (long long)m->window_size, (long long)dc, (long long)best,
                 (long long)m->compress_ratios[best]);
    else
        snprintf(buf, n, "max(window_size %lld, largest d_comp %lld)", (long long)m->window_size,
                 (long long)dc);
}

static int schedule_known(const char *s)
{
    for (int i = 0; schedule_names[i]; i++)
        if (!strcmp(s, schedule_names[i]))
            return 1;
    return 0;
}

static int is_dualpipev(const par_layout *l) { return !strcmp(l->schedule, "dualpipev"); }

int par_layout_segment_rank(const par_layout *l, int s)
{
    int pp = (int)l->pp;
    if (is_dualpipev(l) && s >= pp)
        return 2 * pp - 1 - s;
    return par_pplayout_segment_rank(s, pp);
}

int par_layout_segment_chunk(const par_layout *l, int s) { return par_pplayout_segment_chunk(s, (int)l->pp); }

int par_layout_segment_of(const par_layout *l, int pp_rank, int chunk)
{
    int pp = (int)l->pp;
    if (is_dualpipev(l) && chunk == 1)
        return 2 * pp - 1 - pp_rank;
    return par_pplayout_segment_of(pp_rank, chunk, pp);
}

int par_layout_stage_has(const par_layout *l, int pp_rank, par_block_kind k)
{
    for (int s = 0; s < l->pipe.n_segments; s++)
        if (par_layout_segment_rank(l, s) == pp_rank && par_pplayout_count(&l->pipe, s, k) > 0)
            return 1;
    return 0;
}

#define LL(x) ((long long)(x))

static par_status check_size(const char *flag, int64_t v, int64_t min)
{
    if (v < min)
        return par_err(PAR_EINVAL, "%s must be at least %lld, got %lld", flag, LL(min), LL(v));
    return PAR_OK;
}

/* Sizes, TP/ETP, folding, experts, CP, batch: everything but the pipeline. */
static par_status resolve_sizes(par_layout *l, const par_layout_model *m)
{
    par_status st;
    if ((st = check_size("tensor-model-parallel-size", l->tp, 1)) != PAR_OK ||
        (st = check_size("pipeline-model-parallel-size", l->pp, 1)) != PAR_OK ||
        (st = check_size("virtual-pipeline-model-parallel-size", l->vpp, 0)) != PAR_OK ||
        (st = check_size("context-parallel-size", l->cp, 1)) != PAR_OK ||
        (st = check_size("expert-model-parallel-size", l->ep, 1)) != PAR_OK ||
        (st = check_size("expert-tensor-parallel-size", l->etp, 1)) != PAR_OK ||
        (st = check_size("world size", l->world, 0)) != PAR_OK ||
        (st = check_size("micro-batch-size", l->micro_batch, 0)) != PAR_OK ||
        (st = check_size("global-batch-size", l->global_batch, 0)) != PAR_OK ||
        (st = check_size("microbatch group size", l->mb_group, 0)) != PAR_OK)
        return st;
    const struct {
        const char *flag;
        int64_t v;
    } big[] = {{"tensor-model-parallel-size", l->tp}, {"pipeline-model-parallel-size", l->pp},
               {"virtual-pipeline-model-parallel-size", l->vpp}, {"context-parallel-size", l->cp},
               {"expert-model-parallel-size", l->ep}, {"expert-tensor-parallel-size", l->etp},
               {"world size", l->world}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        if (big[i].v > LAYOUT_MAX_WORLD)
            return par_err(PAR_EINVAL, "%s %lld exceeds %lld, the largest world parity lays out", big[i].flag,
                           LL(big[i].v), LL(LAYOUT_MAX_WORLD));
    const struct {
        const char *flag;
        int64_t v;
    } rows[] = {{"micro-batch-size", l->micro_batch}, {"global-batch-size", l->global_batch},
                {"microbatch group size", l->mb_group}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].v > LAYOUT_MAX_ROWS)
            return par_err(PAR_EINVAL, "%s %lld exceeds %lld", rows[i].flag, LL(rows[i].v), LL(LAYOUT_MAX_ROWS));
    int64_t n = l->world;
    if (n == 0) {
        n = par_layout_default_world(l->tp, l->pp, l->cp, l->ep, l->etp);
        if (n == 0)
            return par_err(PAR_EINVAL,
                           "the default world size PP * lcm(TP*CP, ETP*EP) = %lld * lcm(%lld*%lld, "
                           "%lld*%lld) exceeds %lld ranks",
                           LL(l->pp), LL(l->tp), LL(l->cp), LL(l->etp), LL(l->ep), LL(LAYOUT_MAX_WORLD));
    }
    if (n % (l->pp * l->tp * l->cp) != 0)
        return par_err(PAR_EINVAL,
                       "world size %lld is not divisible by PP*TP*CP = %lld*%lld*%lld = %lld "
                       "(folding rule N/PP = TP*CP*Da)",
                       LL(n), LL(l->pp), LL(l->tp), LL(l->cp), LL(l->pp * l->tp * l->cp));
    int64_t per_stage = n / l->pp;
    if (l->ep > per_stage)
        return par_err(PAR_EINVAL,
                       "expert-model-parallel-size %lld is larger than the ranks of one pipeline stage, "
                       "N/PP = %lld/%lld = %lld",
                       LL(l->ep), LL(n), LL(l->pp), LL(per_stage));
    if (per_stage % (l->etp * l->ep) != 0)
        return par_err(PAR_EINVAL,
                       "world size %lld is not divisible by PP*ETP*EP = %lld*%lld*%lld = %lld "
                       "(folding rule N/PP = ETP*EP*De)",
                       LL(n), LL(l->pp), LL(l->etp), LL(l->ep), LL(l->pp * l->etp * l->ep));
    if (m->n_routed_experts < 1 || m->n_routed_experts % l->ep != 0)
        return par_err(PAR_EINVAL, "expert-model-parallel-size %lld does not divide n_routed_experts %lld",
                       LL(l->ep), LL(m->n_routed_experts));
    if (m->seq_length < 1 || m->seq_length % l->cp != 0)
        return par_err(PAR_EINVAL,
                       "context-parallel-size %lld does not divide seq_length %lld (each CP rank holds "
                       "a contiguous S/CP slice of every row)",
                       LL(l->cp), LL(m->seq_length));
    int64_t dwin = par_layout_d_window(m);
    if (l->cp > 1 && m->seq_length / l->cp < dwin) {
        char why[160];
        d_window_reason(m, why, sizeof why);
        return par_err(PAR_EINVAL,
                       "context-parallel-size %lld: each CP rank's local rows S/CP = %lld/%lld = %lld "
                       "are fewer than D_window = %lld = %s; the CP boundary exchange needs "
                       "S/CP >= D_window",
                       LL(l->cp), LL(m->seq_length), LL(l->cp), LL(m->seq_length / l->cp), LL(dwin), why);
    }
    int64_t da = per_stage / (l->tp * l->cp);
    int64_t de = per_stage / (l->etp * l->ep);
    int64_t mbs = l->micro_batch ? l->micro_batch : 1;
    int64_t gb = l->global_batch ? l->global_batch : m->global_batch_size;
    if (gb < 1)
        return par_err(PAR_EINVAL, "global batch size is %lld: give --global-batch-size or a model "
                                   "global_batch_size >= 1",
                       LL(gb));
    if (gb % (da * mbs) != 0)
        return par_err(PAR_EINVAL,
                       "global batch size %lld is not divisible by micro-batch-size * Da = %lld * %lld = "
                       "%lld (microbatches m = B / (micro-batch-size * Da))",
                       LL(gb), LL(mbs), LL(da), LL(da * mbs));
    l->world = n;
    l->micro_batch = mbs;
    l->global_batch = gb;
    l->da = da;
    l->de = de;
    l->n_micro = gb / (da * mbs);
    l->d_window = dwin;
    return PAR_OK;
}

/* VPP, schedule, the pipeline layout and the schedule's rules. */
static par_status resolve_pipeline(par_layout *l, const par_layout_model *m)
{
    if (l->schedule[0] && !schedule_known(l->schedule))
        return par_err(PAR_EINVAL,
                       "unknown pipeline schedule '%s' (known: gpipe, 1f1b, interleaved, zb-h1, "
                       "dualpipe, dualpipev)",
                       l->schedule);
    int64_t vpp = l->vpp;
    if (l->pp_layout[0]) {
        par_status st = par_pplayout_parse(l->pp_layout, &l->pipe);
        if (st != PAR_OK)
            return st;
        int segs = l->pipe.n_segments;
        if (segs % l->pp != 0)
            return par_err(PAR_EINVAL,
                           "pipeline layout has %d segments ('|'-separated stages), not a multiple of "
                           "pipeline-model-parallel-size %lld",
                           segs, LL(l->pp));
        if (vpp == 0)
            vpp = segs / l->pp;
        else if (vpp * l->pp != segs)
            return par_err(PAR_EINVAL,
                           "virtual-pipeline-model-parallel-size %lld conflicts with the pipeline "
                           "layout: it has %d segments, so VPP = %d / PP %lld = %lld",
                           LL(vpp), segs, segs, LL(l->pp), LL(segs / l->pp));
    } else if (vpp == 0) {
        vpp = !strcmp(l->schedule, "dualpipev") ? 2 : 1;
    }
    if (!l->schedule[0])
        snprintf(l->schedule, sizeof l->schedule, "%s", vpp > 1 ? "interleaved" : "1f1b");
    if (vpp > 1 && l->pp < 2)
        return par_err(PAR_EINVAL,
                       "virtual-pipeline-model-parallel-size %lld needs pipeline-model-parallel-size > "
                       "1, got %lld",
                       LL(vpp), LL(l->pp));
    if (l->pp * vpp > PAR_PPL_MAX_SEGMENTS)
        return par_err(PAR_EINVAL, "PP * VPP = %lld * %lld segments, more than the %d supported", LL(l->pp),
                       LL(vpp), PAR_PPL_MAX_SEGMENTS);

    /* Schedule rules. */
    if (!strcmp(l->schedule, "interleaved")) {
        if (vpp < 2)
            return par_err(PAR_EINVAL,
                           "pipeline schedule 'interleaved' needs virtual-pipeline-model-parallel-size "
                           ">= 2, got %lld",
                           LL(vpp));
        int64_t g = l->mb_group ? l->mb_group : l->pp;
        if (g < l->pp || g > l->n_micro)
            return par_err(PAR_EINVAL,
                           "interleaved schedule: the microbatch group size %lld (microbatches run per "
                           "virtual stage, default PP) must lie in [PP, m] = [%lld, %lld] with m = "
                           "B/(micro-batch-size*Da) = %lld/(%lld*%lld)",
                           LL(g), LL(l->pp), LL(l->n_micro), LL(l->global_batch), LL(l->micro_batch),
                           LL(l->da));
        int64_t rem = l->n_micro % g;
        if (rem != 0 && rem < l->pp)
            return par_err(PAR_EINVAL,
                           "interleaved schedule: the last microbatch group has m %% g = %lld %% %lld = "
                           "%lld microbatches, fewer than PP = %lld (must be 0 or >= PP)",
                           LL(l->n_micro), LL(g), LL(rem), LL(l->pp));
        l->mb_group = g;
    } else if (!strcmp(l->schedule, "dualpipev")) {
        if (vpp != 2)
            return par_err(PAR_EINVAL,
                           "pipeline schedule 'dualpipev' runs 2 chunks per rank (a V shape): "
                           "virtual-pipeline-model-parallel-size must be 2, got %lld",
                           LL(vpp));
    } else if (vpp != 1) {
        return par_err(PAR_EINVAL,
                       "pipeline schedule '%s' runs one chunk per rank but "
                       "virtual-pipeline-model-parallel-size is %lld (use --pipeline-schedule "
                       "interleaved)",
                       l->schedule, LL(vpp));
    }

    if (l->pp_layout[0]) {
        par_status st = par_pplayout_check(&l->pipe, l->pp, vpp, m->n_layers, m->n_mtp_layers);
        if (st != PAR_OK)
            return st;
    } else {
        par_status st = par_pplayout_default(&l->pipe, l->pp, vpp, m->n_layers, m->n_mtp_layers);
        if (st != PAR_OK)
            return st;
    }
    l->vpp = vpp;
    return PAR_OK;
}

par_status par_layout_resolve(par_layout *l, const par_layout_model *m)
{
    par_layout given = *l;
    l->resolved = 0;
    par_status st = resolve_sizes(l, m);
    if (st == PAR_OK)
        st = resolve_pipeline(l, m);
    if (st != PAR_OK) {
        *l = given; /* the given fields only */
        l->resolved = 0;
        return st;
    }
    l->resolved = 1;
    return PAR_OK;
}

/* The run rules of the TP flags (parity run, exit 2 with the numbers):
 * --sequence-parallel and --tp-all-layers need tensor-model-parallel-size
 * > 1 (PAR_EINVAL); TP > 1 with ETP > 1 needs --sequence-parallel unless
 * ETP = TP (PAR_EUNSUPPORTED, the numbers and Megatron-LM's rule named: MoE
 * under TP > 1 trains only with SP there; parity runs ETP = 1 and ETP = TP
 * without it too).  SP composes with CP, EP and ETP.  docs/parallel.md,
 * "Tensor parallelism in the step" and "MoE under TP without SP". */
static par_status tp_rules(const par_layout *l)
{
    if ((l->sequence_parallel || l->tp_all_layers) && l->tp <= 1)
        return par_err(PAR_EINVAL, "--%s needs tensor-model-parallel-size > 1 (got %lld)",
                       l->sequence_parallel ? "sequence-parallel" : "tp-all-layers", LL(l->tp));
    /* MoE under TP > 1 without SP.  Megatron-LM trains it only with SP
     * (MoELayer.forward raises during training when the attention's TP group
     * is larger than 1 without sequence parallelism; yaml_arguments.py
     * asserts it; ModelParallelConfig warns for EP > 1 and TP > 1).  parity
     * also runs TP without SP where every expert group counts each token once:
     * ETP = 1 (EP's TP copies left out of the weight pass, ep_tp.c) and ETP =
     * TP (the ETP group is the TP group, etp and tp both the fastest
     * coordinate, groups.c).  Any other ETP would put a TP group's duplicated
     * tokens into one ETP group: refused, with Megatron's rule named. */
    if (l->tp > 1 && l->etp > 1 && !l->sequence_parallel && l->etp != l->tp)
        return par_err(PAR_EUNSUPPORTED, "expert-tensor-parallel-size %lld with tensor-model-parallel-size %lld "
                       "needs --sequence-parallel (Megatron-LM's rule: MoE with tensor-model-parallel-size > 1 "
                       "trains only with sequence parallelism; parity also runs without it when "
                       "expert-tensor-parallel-size is 1 or %lld = tensor-model-parallel-size, where no expert "
                       "group holds a token twice)", LL(l->etp), LL(l->tp), LL(l->tp));
    return PAR_OK;
}

par_status par_layout_run_rules(const par_layout *l)
{
    return tp_rules(l);
}

void par_layout_model_from_config(par_layout_model *m, const par_config *cfg)
{
    memset(m, 0, sizeof *m);
    m->n_layers = cfg->n_layers;
    m->n_mtp_layers = cfg->n_mtp_layers;
    m->n_routed_experts = cfg->n_routed_experts;
    m->seq_length = cfg->seq_length;
    m->global_batch_size = cfg->global_batch_size;
    m->window_size = cfg->window_size;
    m->n_ratios = cfg->n_compress_ratios;
    m->compress_ratios = cfg->compress_ratios;
}
