/* parallel/plan/planrep.c - `parity plan`'s guide, memory and step-time
 * sections (see parallel/plan/planrep.h). */
#include "parallel/plan/planrep.h"

#include <string.h>

#include "parallel/plan/guide.h"

#define LL(x) ((long long)(x))
#define GB 1e9

/* A decimal unit for a table whose largest value is `max` bytes. */
static double unit_of(double max, const char **name)
{
    static const struct {
        double v;
        const char *n;
    } u[] = {{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}};
    for (int i = 0; i < 4; i++)
        if (max >= u[i].v) {
            *name = u[i].n;
            return u[i].v;
        }
    *name = "B";
    return 1;
}

/* 524288 -> "524,288" */
static const char *commas(int64_t v, char *buf, size_t n)
{
    char raw[32];
    snprintf(raw, sizeof raw, "%lld", LL(v < 0 ? -v : v));
    size_t len = strlen(raw), o = 0;
    if (v < 0 && o + 1 < n)
        buf[o++] = '-';
    for (size_t i = 0; i < len && o + 1 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0 && o + 1 < n)
            buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = '\0';
    return buf;
}

static void print_guide(FILE *f, const par_config *cfg, const par_layout *l, const par_guide_row *g)
{
    char a[32], b[32];
    par_guide_ep_row ep[3];
    int ne = par_guide_ep_table(cfg, l, ep);
    double top = 0;
    for (int i = 0; i < ne; i++)
        top = ep[i].bytes > top ? ep[i].bytes : top;
    const char *un;
    double u = unit_of(top, &un);
    fprintf(f, "guide    routed expert parameters 3hf = 3 x %lld x %lld = %s; bf16 routed weights of the fullest "
               "stage's %lld MoE layers on one rank (ETP 1, no FSDP; decimal units):\n",
            LL(cfg->dim), LL(cfg->moe_inter_dim), commas(g->expert_params, a, sizeof a), LL(g->moe_layers));
    fprintf(f, "           EP    experts/rank  De    routed weights\n");
    for (int i = 0; i < ne; i++)
        fprintf(f, "           %-5lld %-13lld %-5lld %6.2f %s%s\n", LL(ep[i].ep), LL(ep[i].experts_per_rank),
                LL(ep[i].de), ep[i].bytes / u, un, ep[i].ep == l->ep ? "  (this layout)" : "");
    fprintf(f, "         m = B/(b*Da) = %lld/(%lld*%lld) = %lld microbatches", LL(g->B), LL(g->b), LL(g->da), LL(g->m));
    if (g->pp > 1)
        fprintf(f, "; balanced 1F1B bubble (p-1)/(m+p-1) = %lld/%lld = %.1f %%", LL(g->pp - 1), LL(g->m + g->pp - 1),
                100.0 * g->bubble);
    if (g->pp < 2)
        fprintf(f, "\n         interleaved VPP: n/a (PP 1)\n");
    else
        fprintf(f, "\n         interleaved VPP: %s%s\n", g->vpp_legal ? "legal" : "refused: ", g->vpp_legal ? "" : g->vpp_why);
    fprintf(f, "         EP%lld dispatch: T_group = EP*b*S/CP = %lld*%lld*%lld/%lld = %s unique tokens; E[T_expert] = "
               "k*T_group/E = %lld*%s/%lld = %.0f assignments per expert\n",
            LL(g->ep), LL(g->ep), LL(g->b), LL(g->S), LL(g->cp), commas(g->t_group, a, sizeof a),
            LL(cfg->n_activated_experts), commas(g->t_group, b, sizeof b), LL(cfg->n_routed_experts), g->e_t_expert);
    fprintf(f, "         D_window: S/CP = %lld/%lld = %lld local rows per rank, D_window %lld: %s\n", LL(g->S), LL(g->cp),
            LL(g->local_rows), LL(g->d_window),
            g->cp == 1 ? "ok (CP 1: no boundary exchange)" : g->d_window_ok ? "ok" : "too few rows");
}

static void print_configs(FILE *f, const par_guide_row rows[3])
{
    char a[32];
    fprintf(f, "guide configs (TP 1, PP 8, EP 64, ETP 1, b 1, B 4096; the guide's table):\n");
    fprintf(f, "  config  GPUs   CP  Da     De   m    1F1B bubble  interleaved VPP               T_group     E[T_expert]\n");
    for (int i = 0; i < 3; i++) {
        const par_guide_row *g = &rows[i];
        const char *vpp = g->vpp_legal ? "legal" : "refused (below)";
        fprintf(f, "  %-7c %-6lld %-3lld %-6lld %-4lld %-4lld %5.1f %%      %-29s %-11s %.0f\n", "ABC"[i], LL(g->world),
                LL(g->cp), LL(g->da), LL(g->de), LL(g->m), 100.0 * g->bubble, vpp, commas(g->t_group, a, sizeof a),
                g->e_t_expert);
    }
    for (int i = 0; i < 3; i++)
        if (!rows[i].vpp_legal)
            fprintf(f, "  %c: interleaved VPP refused: %s\n", "ABC"[i], rows[i].vpp_why);
}

static const char *runtime_words(const par_memmodel_opts *o)
{
    if (o->rt == PAR_MM_PARITY)
        return o->real_bytes == 4 ? "parity's runtime, every tensor f32" : "parity's runtime, every tensor f64";
    return "GPU job: bf16 weights and activations, fp32 grads, fp32 master + optimizer state";
}

/* The heaviest rank of every stage into rows[pp] (par_malloc'd); *shared
 * (may be NULL): what rank 0's process holds once (par_memmodel_shared_of). */
static par_status stage_rows(const par_planrep_opts *o, par_memmodel_rank **rows, double *shared)
{
    par_memmodel *mm = NULL;
    par_status s = par_memmodel_create(&mm, o->cfg, o->l, &o->mm);
    if (!s && shared && (s = par_memmodel_shared_of(mm, 0, shared)))
        par_memmodel_free(mm);
    if (s)
        return s;
    *rows = par_calloc((size_t)o->l->pp, sizeof **rows, PAR_TAG_MODEL);
    if (!*rows) {
        par_memmodel_free(mm);
        return par_err(PAR_ENOMEM, "plan: out of memory for %lld stages", LL(o->l->pp));
    }
    for (int st = 0; st < (int)o->l->pp && !s; st++)
        s = par_memmodel_stage_heaviest(mm, st, &(*rows)[st]);
    par_memmodel_free(mm);
    if (s) {
        par_free(*rows);
        *rows = NULL;
    }
    return s;
}

static void print_memory(FILE *f, const par_planrep_opts *o, const par_memmodel_rank *rows, double shared)
{
    const par_layout *l = o->l;
    double peak = 0;
    int at = 0;
    for (int s = 0; s < (int)l->pp; s++)
        if (rows[s].total > peak)
            peak = rows[s].total, at = s;
    const char *un;
    double u = unit_of(peak, &un);
    fprintf(f, "memory   heaviest rank of every stage (%s; ZeRO-1 %s; %s; EP receive skew %s; in %s, decimal):\n",
            runtime_words(&o->mm), l->distributed_optimizer ? "on" : "off",
            o->mm.rt == PAR_MM_MEGATRON && o->mm.recompute ? "full recomputation" : "no recomputation",
            l->ep <= 1 ? "-" : o->mm.recv_rows ? "measured" : "assumed", un);
    fprintf(f, "  stage  rank    params      weights   grads     optimizer activations in-flight comm      "
               "workspace total\n");
    for (int s = 0; s < (int)l->pp; s++) {
        const par_memmodel_rank *r = &rows[s];
        fprintf(f, "  %-6d %-7d %-11lld %8.2f  %8.2f  %8.2f  %9.2f   %-9d %8.2f  %8.2f  %8.2f\n", s, r->rank,
                LL(r->held_floats), r->weights / u, r->grads / u, r->optim / u, r->act / u, r->inflight,
                r->comm / u, r->workspace / u, r->total / u);
    }
    fprintf(f, "  peak %.2f %s on stage %d (rank %d); EP rows received per row sent %.2f\n", peak / u, un, at,
            rows[at].rank, rows[at].recv_factor);
    if (shared > 0) /* parallel/dp/replicas.h: in no rank's row */
        fprintf(f, "  held once by the process (not in the rows): the dense weights%s of its replicas, %.2f %s\n",
                l->distributed_optimizer ? "" : " and replicated dense optimizer state", shared / u, un);
}

static void print_steptime(FILE *f, const par_planrep_opts *o, const par_steptime *t)
{
    double eff = o->st.efficiency > 0 ? o->st.efficiency : 1.0;
    fprintf(f, "time     network %s, compute at %.0f %% of %.0f TFLOP/s, no overlap: step %.4g s = pipeline %.4g s "
               "(bubble %.1f %%) + DP %.4g s\n",
            o->net->name, 100 * eff, o->net->peak_flops / 1e12, t->step_s, t->makespan_s, 100 * t->bubble, t->dp_s);
    fprintf(f, "         pipeline rank 0 per step: compute %.4g s, EP all-to-all %.4g s (nvlink %.3g GB, ib %.3g GB "
               "sent), CP %.4g s; one stage message %.3g ms; %.4g PFLOP per step\n",
            t->compute_s, t->ep_s, t->ep_bytes[PAR_TIER_NVLINK] / GB, t->ep_bytes[PAR_TIER_IB] / GB, t->cp_s,
            1e3 * t->pp_p2p_s, t->flops / 1e15);
    fprintf(f, "         all ranks per step: EP dispatch + combine bytes sent nvlink %.4g GB, ib %.4g GB (compare "
               "`parity run --cost-as`)\n",
            t->ep_bytes_world[PAR_TIER_NVLINK] / GB, t->ep_bytes_world[PAR_TIER_IB] / GB);
}

par_status par_planrep_print(FILE *f, const par_planrep_opts *o)
{
    par_guide_row g;
    par_status s = par_guide_row_of(o->cfg, o->l, &g);
    if (s)
        return s;
    print_guide(f, o->cfg, o->l, &g);
    par_memmodel_rank *rows = NULL;
    double shared = 0;
    if ((s = stage_rows(o, &rows, &shared)))
        return s;
    print_memory(f, o, rows, shared);
    par_free(rows);
    if (o->net) {
        par_steptime t;
        if ((s = par_steptime_estimate(o->cfg, o->l, o->net, &o->st, &t)))
            return s;
        print_steptime(f, o, &t);
    }
    if (o->guide) {
        par_guide_row rs[3];
        if ((s = par_guide_configs(o->cfg, rs)))
            return s;
        print_configs(f, rs);
    }
    return PAR_OK;
}

/* ---- JSON ------------------------------------------------------------------- */

#define NUM(obj, key, v) ok = ok && cJSON_AddNumberToObject((obj), (key), (double)(v))

static cJSON *guide_json(const par_config *cfg, const par_layout *l, const par_guide_row *g)
{
    cJSON *o = cJSON_CreateObject(), *ep = o ? cJSON_AddArrayToObject(o, "routed_weights") : NULL;
    int ok = ep != NULL;
    par_guide_ep_row rows[3];
    int n = l ? par_guide_ep_table(cfg, l, rows) : 0;
    for (int i = 0; ok && i < n; i++) {
        cJSON *r = cJSON_CreateObject();
        ok = r && cJSON_AddItemToArray(ep, r);
        NUM(r, "ep", rows[i].ep);
        NUM(r, "experts_per_rank", rows[i].experts_per_rank);
        NUM(r, "de", rows[i].de);
        NUM(r, "moe_layers", rows[i].moe_layers);
        NUM(r, "bytes", rows[i].bytes);
    }
    NUM(o, "world", g->world), NUM(o, "pp", g->pp), NUM(o, "cp", g->cp), NUM(o, "ep", g->ep);
    NUM(o, "da", g->da), NUM(o, "de", g->de), NUM(o, "micro_batch", g->b), NUM(o, "global_batch", g->B);
    NUM(o, "seq_length", g->S), NUM(o, "n_micro", g->m), NUM(o, "bubble_1f1b", g->bubble);
    ok = ok && cJSON_AddBoolToObject(o, "interleaved_vpp_legal", g->vpp_legal);
    ok = ok && cJSON_AddStringToObject(o, "interleaved_vpp_refusal", g->vpp_why);
    NUM(o, "t_group", g->t_group), NUM(o, "e_t_expert", g->e_t_expert), NUM(o, "local_rows", g->local_rows);
    NUM(o, "d_window", g->d_window);
    ok = ok && cJSON_AddBoolToObject(o, "d_window_ok", g->d_window_ok);
    NUM(o, "expert_params", g->expert_params), NUM(o, "moe_layers_fullest_stage", g->moe_layers);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *rank_json(const par_memmodel_rank *r)
{
    cJSON *o = cJSON_CreateObject();
    int ok = o != NULL;
    NUM(o, "stage", r->stage), NUM(o, "rank", r->rank), NUM(o, "held_params", r->held_floats);
    NUM(o, "weights", r->weights), NUM(o, "grads", r->grads), NUM(o, "optimizer", r->optim);
    NUM(o, "activations", r->act), NUM(o, "communication", r->comm), NUM(o, "workspace", r->workspace);
    NUM(o, "total", r->total), NUM(o, "inflight_microbatches", r->inflight);
    NUM(o, "optimizer_state", r->optim_state), NUM(o, "optimizer_master", r->optim_master);
    NUM(o, "activations_saved", r->act_saved), NUM(o, "activations_fixed", r->act_fixed);
    NUM(o, "comm_dp", r->comm_dp), NUM(o, "comm_pp", r->comm_pp), NUM(o, "comm_dispatch", r->comm_dispatch);
    NUM(o, "workspace_backward", r->ws_bwd), NUM(o, "workspace_muon", r->ws_muon);
    NUM(o, "workspace_staging", r->ws_staging), NUM(o, "ep_recv_factor", r->recv_factor);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *memory_json(const par_planrep_opts *o, const par_memmodel_rank *rows)
{
    cJSON *m = cJSON_CreateObject(), *st = m ? cJSON_AddArrayToObject(m, "stages") : NULL;
    int ok = st != NULL;
    ok = ok && cJSON_AddStringToObject(m, "runtime", o->mm.rt == PAR_MM_PARITY ? "parity" : "megatron");
    ok = ok && cJSON_AddStringToObject(m, "precision", runtime_words(&o->mm));
    ok = ok && cJSON_AddBoolToObject(m, "recompute_full", o->mm.rt == PAR_MM_MEGATRON && o->mm.recompute);
    NUM(m, "skew", o->mm.skew > 0 ? o->mm.skew : PAR_MM_DEFAULT_SKEW);
    double peak = 0;
    for (int s = 0; ok && s < (int)o->l->pp; s++) {
        cJSON *r = rank_json(&rows[s]);
        ok = r && cJSON_AddItemToArray(st, r);
        peak = rows[s].total > peak ? rows[s].total : peak;
    }
    NUM(m, "peak", peak);
    if (!ok) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static cJSON *steptime_json(const par_planrep_opts *o, const par_steptime *t)
{
    cJSON *j = cJSON_CreateObject();
    int ok = j && cJSON_AddStringToObject(j, "network", o->net->name);
    NUM(j, "peak_flops", o->net->peak_flops), NUM(j, "efficiency", o->st.efficiency > 0 ? o->st.efficiency : 1.0);
    NUM(j, "step_s", t->step_s), NUM(j, "makespan_s", t->makespan_s), NUM(j, "bubble", t->bubble);
    NUM(j, "dp_s", t->dp_s), NUM(j, "compute_s", t->compute_s), NUM(j, "ep_s", t->ep_s), NUM(j, "cp_s", t->cp_s);
    NUM(j, "pp_message_s", t->pp_p2p_s), NUM(j, "flops", t->flops);
    NUM(j, "ep_bytes_nvlink", t->ep_bytes[PAR_TIER_NVLINK]), NUM(j, "ep_bytes_ib", t->ep_bytes[PAR_TIER_IB]);
    NUM(j, "ep_bytes_world_nvlink", t->ep_bytes_world[PAR_TIER_NVLINK]);
    NUM(j, "ep_bytes_world_ib", t->ep_bytes_world[PAR_TIER_IB]);
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static cJSON *configs_json(const par_config *cfg)
{
    par_guide_row rs[3];
    if (par_guide_configs(cfg, rs) != PAR_OK)
        return NULL;
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < 3; i++) {
        cJSON *r = guide_json(cfg, NULL, &rs[i]);
        char name[2] = {"ABC"[i], 0};
        if (!r || !cJSON_AddStringToObject(r, "config", name) || !cJSON_AddItemToArray(a, r)) {
            cJSON_Delete(r);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

par_status par_planrep_json(const par_planrep_opts *o, cJSON **out)
{
    *out = NULL;
    par_guide_row g;
    par_status s = par_guide_row_of(o->cfg, o->l, &g);
    par_memmodel_rank *rows = NULL;
    if (s || (s = stage_rows(o, &rows, NULL)))
        return s;
    cJSON *root = cJSON_CreateObject();
    int ok = root && cJSON_AddStringToObject(root, "preset", o->cfg->preset);
    ok = ok && cJSON_AddStringToObject(root, "schedule", o->l->pp > 1 ? o->l->schedule : "none");
    char str[PAR_LAYOUT_STR_MAX + 64];
    par_pplayout_format(&o->l->pipe, str, (int)sizeof str);
    ok = ok && cJSON_AddStringToObject(root, "pipeline_layout", str);
    ok = ok && cJSON_AddBoolToObject(root, "distributed_optimizer", o->l->distributed_optimizer);
    cJSON *x = ok ? guide_json(o->cfg, o->l, &g) : NULL;
    ok = x && cJSON_AddItemToObject(root, "guide", x);
    x = ok ? memory_json(o, rows) : NULL;
    ok = x && cJSON_AddItemToObject(root, "memory", x);
    par_free(rows);
    if (ok && o->net) {
        par_steptime t;
        if ((s = par_steptime_estimate(o->cfg, o->l, o->net, &o->st, &t))) {
            cJSON_Delete(root);
            return s;
        }
        x = steptime_json(o, &t);
        ok = x && cJSON_AddItemToObject(root, "step_time", x);
    }
    if (ok && o->guide) {
        x = configs_json(o->cfg);
        ok = x && cJSON_AddItemToObject(root, "guide_configs", x);
    }
    if (!ok) {
        cJSON_Delete(root);
        return par_err(PAR_ENOMEM, "plan: out of memory building the JSON report");
    }
    *out = root;
    return PAR_OK;
}
