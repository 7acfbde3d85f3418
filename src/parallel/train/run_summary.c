/* parallel/train/run_summary.c - a run's metrics as JSON (see
 * parallel/train/run_summary.h). */
#include "parallel/train/run_summary.h"

#include <math.h>
#include <stdio.h>

#include "comm/clock.h"
#include "core/json.h"
#include "core/alloc.h"
#include "parallel/layout/groups.h"

static void add_num(cJSON *o, const char *k, double v)
{
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static cJSON *layout_json(const par_layout *l)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddNumberToObject(j, "world_size", (double)l->world);
    cJSON_AddNumberToObject(j, "tensor_model_parallel_size", (double)l->tp);
    cJSON_AddNumberToObject(j, "pipeline_model_parallel_size", (double)l->pp);
    cJSON_AddNumberToObject(j, "virtual_pipeline_model_parallel_size", (double)l->vpp);
    cJSON_AddNumberToObject(j, "context_parallel_size", (double)l->cp);
    cJSON_AddNumberToObject(j, "expert_model_parallel_size", (double)l->ep);
    cJSON_AddNumberToObject(j, "expert_tensor_parallel_size", (double)l->etp);
    cJSON_AddNumberToObject(j, "data_parallel_size", (double)l->da);
    cJSON_AddNumberToObject(j, "expert_data_parallel_size", (double)l->de);
    cJSON_AddNumberToObject(j, "micro_batch_size", (double)l->micro_batch);
    cJSON_AddNumberToObject(j, "global_batch_size", (double)l->global_batch);
    cJSON_AddBoolToObject(j, "use_distributed_optimizer", l->distributed_optimizer);
    if (l->sequence_parallel) /* only when given: older summaries unchanged */
        cJSON_AddBoolToObject(j, "sequence_parallel", l->sequence_parallel);
    if (l->pp > 1) {
        char str[PAR_LAYOUT_STR_MAX];
        par_pplayout_format(&l->pipe, str, (int)sizeof str);
        cJSON_AddStringToObject(j, "pipeline_schedule", l->schedule);
        cJSON_AddStringToObject(j, "pipeline_model_parallel_layout", str);
    }
    return j;
}

static cJSON *losses_json(const par_run_summary *sum)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t k = 0; a && k < sum->steps; k++) {
        const par_run_step_info *si = &sum->step[k];
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddItemToArray(a, o);
        cJSON_AddNumberToObject(o, "step", (double)(sum->start_step + k));
        add_num(o, "loss", si->loss);
        add_num(o, "loss_main", si->loss_main);
        add_num(o, "loss_mtp", si->loss_mtp);
        add_num(o, "loss_aux", si->loss_aux);
        add_num(o, "grad_norm", si->grad_norm);
        add_num(o, "wall_s", si->wall_s);
    }
    return a;
}

/* The emulated clocks: per rank (those with a clock), and the step time and
 * exposed communication per step, the largest over them. */
static cJSON *emulated_json(const par_run_summary *sum)
{
    if (!sum->net)
        return cJSON_CreateNull();
    cJSON *j = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
    double tmax = 0, cmax = 0;
    for (int r = 0; j && ranks && r < par_netrun_nranks(sum->net); r++) {
        const par_rankstats *st = par_netrun_stats(sum->net, r);
        if (!st || st->total_s <= 0)
            continue; /* a rank another MPI process hosted */
        tmax = st->total_s > tmax ? st->total_s : tmax;
        cmax = st->comm_s > cmax ? st->comm_s : cmax;
        cJSON *o = cJSON_CreateObject(), *b = cJSON_CreateObject();
        if (!o || !b) {
            cJSON_Delete(o);
            cJSON_Delete(b);
            break;
        }
        cJSON_AddItemToArray(ranks, o);
        cJSON_AddNumberToObject(o, "rank", r);
        cJSON_AddNumberToObject(o, "total_s", st->total_s);
        cJSON_AddNumberToObject(o, "compute_s", st->compute_s);
        cJSON_AddNumberToObject(o, "comm_s", st->comm_s);
        cJSON_AddNumberToObject(o, "idle_s", st->idle_s);
        cJSON_AddNumberToObject(b, "nvlink", (double)st->bytes[PAR_TIER_NVLINK]);
        cJSON_AddNumberToObject(b, "ib", (double)st->bytes[PAR_TIER_IB]);
        cJSON_AddItemToObject(o, "bytes", b);
    }
    if (j) {
        double steps = sum->steps > 0 ? (double)sum->steps : 1;
        cJSON_AddNumberToObject(j, "step_time_s", tmax / steps);
        cJSON_AddNumberToObject(j, "exposed_comm_s", cmax / steps);
        cJSON_AddNumberToObject(j, "ranks_per_node", par_netrun_model(sum->net)->gpus_per_node);
        cJSON_AddItemToObject(j, "ranks", ranks);
    } else {
        cJSON_Delete(ranks);
    }
    return j;
}

/* Per pipeline rank: the most rows one of its ranks received over their
 * mean (the routing skew of its EP groups; `parity plan --measured-loads`). */
static cJSON *stage_skew_json(const par_run_summary *sum)
{
    const par_layout *l = &sum->layout;
    int P = (int)l->pp;
    double *mx = par_calloc((size_t)P * 2, sizeof *mx, PAR_TAG_MISC);
    cJSON *a = mx && sum->ep_recv ? cJSON_CreateArray() : NULL;
    for (int64_t r = 0; a && r < l->world; r++) {
        par_rank_coords c;
        if (par_rank_coords_of(l, (int)r, &c) != PAR_OK)
            continue;
        double v = (double)sum->ep_recv[r];
        mx[c.pp] = v > mx[c.pp] ? v : mx[c.pp];
        mx[P + c.pp] += v * (double)P / (double)l->world;
    }
    for (int p = 0; a && p < P; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(mx[P + p] > 0 ? mx[p] / mx[P + p] : 1.0));
    par_free(mx);
    return a ? a : cJSON_CreateNull();
}

/* --cost-as: the target's predicted figures in one place (the emulated
 * and pipeline objects hold them too); null without --cost-as. */
static cJSON *cost_as_json(const par_run_summary *sum)
{
    if (!sum->cost_as[0] || !sum->net)
        return cJSON_CreateNull();
    double tmax = 0, cmax = 0, steps = sum->steps > 0 ? (double)sum->steps : 1;
    for (int r = 0; r < par_netrun_nranks(sum->net); r++) {
        const par_rankstats *st = par_netrun_stats(sum->net, r);
        tmax = st && st->total_s > tmax ? st->total_s : tmax;
        cmax = st && st->comm_s > cmax ? st->comm_s : cmax;
    }
    cJSON *j = cJSON_CreateObject(), *b = cJSON_CreateObject();
    if (!j || !b) {
        cJSON_Delete(j);
        cJSON_Delete(b);
        return NULL;
    }
    cJSON_AddStringToObject(j, "preset", sum->cost_as);
    cJSON_AddStringToObject(j, "pipeline_layout", sum->cost_as_layout);
    cJSON_AddNumberToObject(j, "tokens_per_microbatch", sum->cost_as_tokens);
    cJSON_AddNumberToObject(j, "step_time_s", tmax / steps);
    cJSON_AddNumberToObject(j, "exposed_comm_s", cmax / steps);
    add_num(j, "bubble", sum->layout.pp > 1 && sum->pp_net_bubble >= 0 ? sum->pp_net_bubble : NAN);
    add_num(j, "moe_skew", sum->recv_mean > 0 ? (double)sum->recv_max / sum->recv_mean : NAN);
    cJSON_AddItemToObject(j, "stage_skew", sum->layout.ep > 1 ? stage_skew_json(sum) : cJSON_CreateNull());
    cJSON_AddNumberToObject(b, "nvlink", (double)(sum->ep_bytes[0][0] + sum->ep_bytes[1][0]) / steps);
    cJSON_AddNumberToObject(b, "ib", (double)(sum->ep_bytes[0][1] + sum->ep_bytes[1][1]) / steps);
    cJSON_AddItemToObject(j, "ep_bytes_per_step", b);
    return j;
}

static cJSON *pipeline_json(const par_run_summary *sum)
{
    if (sum->layout.pp <= 1)
        return cJSON_CreateNull();
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "schedule", sum->pp_schedule);
    cJSON_AddNumberToObject(j, "microbatches", sum->pp_micro);
    cJSON_AddNumberToObject(j, "stages", (double)sum->layout.pipe.n_segments);
    add_num(j, "dry_run_bubble", sum->pp_dry_bubble);
    add_num(j, "emulated_bubble", sum->pp_net_bubble >= 0 ? sum->pp_net_bubble : NAN);
    add_num(j, "emulated_makespan_s", sum->pp_net_bubble >= 0 ? sum->pp_net_makespan_s : NAN);
    return j;
}

static cJSON *tiers_json(const int64_t b[2])
{
    cJSON *j = cJSON_CreateObject();
    if (j) {
        cJSON_AddNumberToObject(j, "nvlink", (double)b[0]);
        cJSON_AddNumberToObject(j, "ib", (double)b[1]);
    }
    return j;
}

static cJSON *expert_json(const par_run_summary *sum)
{
    if (sum->layout.ep <= 1)
        return cJSON_CreateNull();
    cJSON *j = cJSON_CreateObject(), *rows = cJSON_CreateObject(), *t = cJSON_CreateObject();
    if (!j || !rows || !t) {
        cJSON_Delete(j);
        cJSON_Delete(rows);
        cJSON_Delete(t);
        return NULL;
    }
    cJSON_AddStringToObject(j, "dispatch", sum->moe_dispatch ? "hierarchical" : "flat");
    cJSON_AddNumberToObject(j, "ranks_per_node", sum->ep_gpn);
    cJSON_AddNumberToObject(j, "dispatch_bytes", (double)sum->dispatch_bytes);
    cJSON_AddNumberToObject(j, "combine_bytes", (double)sum->combine_bytes);
    cJSON_AddItemToObject(t, "dispatch", tiers_json(sum->ep_bytes[0]));
    cJSON_AddItemToObject(t, "combine", tiers_json(sum->ep_bytes[1]));
    cJSON_AddItemToObject(j, "bytes_by_tier", t);
    cJSON_AddNumberToObject(rows, "min", (double)sum->recv_min);
    cJSON_AddNumberToObject(rows, "mean", sum->recv_mean);
    cJSON_AddNumberToObject(rows, "max", (double)sum->recv_max);
    cJSON_AddItemToObject(j, "rows_received", rows);
    cJSON_AddNumberToObject(j, "a2a_calls", (double)sum->a2a_calls);
    if (sum->net) {
        cJSON_AddNumberToObject(j, "emulated_dispatch_mean_s", sum->ep_time_mean[0]);
        cJSON_AddNumberToObject(j, "emulated_dispatch_max_s", sum->ep_time_max[0]);
        cJSON_AddNumberToObject(j, "emulated_combine_mean_s", sum->ep_time_mean[1]);
        cJSON_AddNumberToObject(j, "emulated_combine_max_s", sum->ep_time_max[1]);
    }
    return j;
}

static cJSON *context_json(const par_run_summary *sum)
{
    if (sum->layout.cp <= 1)
        return cJSON_CreateNull();
    cJSON *j = cJSON_CreateObject();
    if (j) {
        cJSON_AddNumberToObject(j, "halo_bytes", (double)sum->cp_halo_bytes);
        cJSON_AddNumberToObject(j, "gather_bytes", (double)sum->cp_gather_bytes);
        cJSON_AddNumberToObject(j, "reduce_scatter_bytes", (double)sum->cp_rs_bytes);
    }
    return j;
}

static cJSON *loads_json(const par_run_summary *sum)
{
    cJSON *j = cJSON_CreateObject(), *h = cJSON_CreateArray();
    if (!j || !h) {
        cJSON_Delete(j);
        cJSON_Delete(h);
        return NULL;
    }
    cJSON_AddNumberToObject(j, "min", (double)sum->load_min);
    cJSON_AddNumberToObject(j, "mean", sum->load_mean);
    cJSON_AddNumberToObject(j, "max", (double)sum->load_max);
    cJSON_AddNumberToObject(j, "hot_block", sum->load_hot_block);
    cJSON_AddNumberToObject(j, "hot_expert", (double)sum->load_hot_expert);
    cJSON_AddNumberToObject(j, "hot_tokens", (double)sum->load_hot_tokens);
    for (int i = 0; i < PAR_RUN_HIST; i++)
        cJSON_AddItemToArray(h, cJSON_CreateNumber((double)sum->hist[i]));
    cJSON_AddItemToObject(j, "histogram", h);
    return j;
}

/* {tag name: bytes} of one rank's allocator peaks. */
static cJSON *tag_bytes_json(const int64_t *peak /* [PAR_TAG_COUNT] */)
{
    cJSON *o = cJSON_CreateObject();
    for (int t = 0; o && t < PAR_TAG_COUNT; t++)
        cJSON_AddNumberToObject(o, par_tag_name((par_tag)t), (double)peak[t]);
    return o;
}

static cJSON *memory_json(const par_run_summary *sum)
{
    static const char *const kind[PAR_RUN_MEM] = {"weights", "gradients", "optimizer_state",
                                                   "optimizer_state_unsharded", "activations", "communication"};
    if (!sum->mem)
        return cJSON_CreateNull();
    cJSON *a = cJSON_CreateArray();
    for (int64_t r = 0; a && r < sum->layout.world; r++) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddItemToArray(a, o);
        cJSON_AddNumberToObject(o, "rank", (double)r);
        for (int k = 0; k < PAR_RUN_MEM; k++)
            cJSON_AddNumberToObject(o, kind[k], (double)sum->mem[r * PAR_RUN_MEM + k]);
        if (sum->alloc_peak) /* the rank's model structure (tag model; memmodel.h counts it) */
            cJSON_AddNumberToObject(o, "model_structure", (double)sum->alloc_peak[r * PAR_TAG_COUNT + PAR_TAG_MODEL]);
        if (sum->alloc_res_peak) /* the allocator's measured truth (core/alloc.h scope), reserved view */
            cJSON_AddItemToObject(o, "allocator_reserved_peak", tag_bytes_json(sum->alloc_res_peak + r * PAR_TAG_COUNT));
    }
    return a;
}

cJSON *par_run_summary_json(const par_run_summary *sum, const char *preset, int precision)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "format", "parity-run-summary");
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddStringToObject(j, "preset", preset ? preset : "");
    cJSON_AddStringToObject(j, "precision", precision == 32 ? "f32" : "f64");
    cJSON_AddStringToObject(j, "backend", sum->backend);
    cJSON_AddNumberToObject(j, "steps", (double)sum->steps);
    cJSON_AddNumberToObject(j, "start_step", (double)sum->start_step);
    cJSON_AddItemToObject(j, "layout", layout_json(&sum->layout));
    cJSON_AddItemToObject(j, "losses", losses_json(sum));
    cJSON_AddItemToObject(j, "emulated", emulated_json(sum));
    cJSON_AddItemToObject(j, "cost_as", cost_as_json(sum));
    cJSON_AddItemToObject(j, "pipeline", pipeline_json(sum));
    cJSON_AddItemToObject(j, "expert_parallel", expert_json(sum));
    cJSON_AddItemToObject(j, "context_parallel", context_json(sum));
    cJSON_AddItemToObject(j, "loads", loads_json(sum));
    cJSON_AddItemToObject(j, "memory", memory_json(sum));
    cJSON_AddNumberToObject(j, "n_params", (double)sum->n_params);
    cJSON_AddNumberToObject(j, "max_rank_floats", (double)sum->max_rank_floats);
    cJSON_AddNumberToObject(j, "saves", (double)sum->saves);
    cJSON_AddNumberToObject(j, "wall_s", sum->wall_s);
    return j;
}

void par_run_summary_metrics(const cJSON *doc, double *step_time_s, double *bubble, double *exposed_comm_s)
{
    *step_time_s = *bubble = *exposed_comm_s = NAN;
    const cJSON *em = par_json_obj(doc, "emulated"), *pp = par_json_obj(doc, "pipeline");
    if (em) {
        par_json_num(em, "step_time_s", step_time_s);
        par_json_num(em, "exposed_comm_s", exposed_comm_s);
    }
    if (pp)
        par_json_num(pp, "emulated_bubble", bubble);
}
