/* cli/planargs.c - the planning flags of `parity plan` (see cli/planargs.h). */
#include "cli/planargs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/sizearg.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/outdir.h"
#include "core/json.h"
#include "core/status.h"
#include "parallel/plan/planrep.h"
#include "parallel/plan/plan_search.h"

void par_plan_args_init(par_plan_args *a)
{
    memset(a, 0, sizeof *a);
    a->runtime = "megatron";
    a->precision = "f64";
    a->top = 10;
    a->search_seconds = 5;
    par_net_args_init(&a->net);
}

int par_plan_opts(par_opt *o, int n, int cap, par_plan_args *a)
{
    const par_opt add[] = {
        {"json", PAR_OPT_STR, &a->json, "FILE", "write the report (guide, memory, step time; --search: candidates) as JSON"},
        {"guide", PAR_OPT_FLAG, &a->guide, NULL, "also print the tuning guide's configs A, B, C"},
        {"runtime", PAR_OPT_STR, &a->runtime, "megatron|parity",
         "memory model: a GPU job (bf16/fp32, default) or parity's own run (--precision)"},
        {"precision", PAR_OPT_STR, &a->precision, "f64|f32", "working precision of --runtime parity (default f64)"},
        {"recompute-granularity", PAR_OPT_STR, &a->recompute, "none|full", "activation recomputation (megatron runtime; default none, the search tries both)"},
        {"moe-skew", PAR_OPT_DOUBLE, &a->skew, "F", "EP receive skew: heaviest rank / balanced share (default 1.5)"},
        {"measured-loads", PAR_OPT_STR, &a->measured, "RUN.json",
         "per-stage EP skews of a `parity run --cost-as` summary: receive bytes and the hottest rank's experts"},
        {"gemm-efficiency", PAR_OPT_DOUBLE, &a->efficiency, "F", "fraction of peak FLOP/s in the step time (default 1)"},
        {"search", PAR_OPT_FLAG, &a->search, NULL, "enumerate layouts for --world-size and --global-batch-size"},
        {"memory-per-gpu", PAR_OPT_STR, &a->memory, "SIZE", "memory budget of the search, e.g. 80GB (default: none)"},
        {"top", PAR_OPT_INT, &a->top, "K", "candidates the search prints (default 10)"},
        {"search-seconds", PAR_OPT_DOUBLE, &a->search_seconds, "S",
         "--search: evaluate candidates for at most S seconds, the rest reported as not evaluated (default 5)",
         PAR_CHK_POS_REAL, 86400},
        {"overwrite", PAR_OPT_FLAG, &a->overwrite, NULL, PAR_OVERWRITE_HELP " (--json)"},
    };
    for (size_t i = 0; i < sizeof add / sizeof add[0]; i++) {
        if (n >= cap)
            return -1;
        o[n++] = add[i];
    }
    return par_net_opts(o, n, cap, &a->net);
}

static int fail(const char *what)
{
    fprintf(stderr, "parity plan: %s%s%s\n", what ? what : "", what ? ": " : "", par_last_error());
    return 2;
}

/* --measured-loads: cost_as.stage_skew of a run summary into st; 0 or 2. */
static int measured_loads(const char *path, par_steptime_opts *st)
{
    cJSON *doc = NULL;
    if (par_json_read_file(path, &doc) != PAR_OK)
        return fail("--measured-loads");
    const cJSON *a = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "cost_as"), "stage_skew");
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0, bad = n < 1 || n > PAR_STEPTIME_MAX_PP;
    for (int i = 0; !bad && i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        bad = !cJSON_IsNumber(v) || !(v->valuedouble >= 1.0 && v->valuedouble < 1e6);
        if (!bad)
            st->stage_skew[i] = v->valuedouble;
    }
    cJSON_Delete(doc);
    if (bad) {
        fprintf(stderr, "parity plan: --measured-loads %s: no cost_as.stage_skew of 1 to %d skews >= 1 (a `parity run "
                        "--cost-as` summary with EP > 1)\n", path, PAR_STEPTIME_MAX_PP);
        return 2;
    }
    st->n_stage_skew = n;
    return 0;
}

/* The memory / step-time options and the network, checked. */
static int resolve(const par_plan_args *a, par_memmodel_opts *mm, par_steptime_opts *st, par_netmodel *net)
{
    par_memmodel_opts_init(mm);
    if (!strcmp(a->runtime, "parity")) {
        mm->rt = PAR_MM_PARITY;
        mm->shared_replicas = 1; /* parity run's dense copy per process (parallel/dp/replicas.h) */
    }
    else if (strcmp(a->runtime, "megatron")) {
        fprintf(stderr, "parity plan: --runtime expects megatron or parity, got '%s'\n", a->runtime);
        return 2;
    }
    if (strcmp(a->precision, "f64") && strcmp(a->precision, "f32")) {
        fprintf(stderr, "parity plan: --precision expects f64 or f32, got '%s'\n", a->precision);
        return 2;
    }
    mm->real_bytes = strcmp(a->precision, "f32") ? 8 : 4;
    if (a->recompute && strcmp(a->recompute, "none") && strcmp(a->recompute, "full")) {
        fprintf(stderr, "parity plan: --recompute-granularity expects none or full, got '%s' (selective is not "
                        "modelled)\n", a->recompute);
        return 2;
    }
    mm->recompute = a->recompute && !strcmp(a->recompute, "full");
    if (a->skew != 0 && !(a->skew >= 1.0 && a->skew < 1e6)) {
        fprintf(stderr, "parity plan: --moe-skew %g: the heaviest rank receives at least its share (>= 1)\n", a->skew);
        return 2;
    }
    if (a->efficiency != 0 && !(a->efficiency > 0 && a->efficiency <= 1)) {
        fprintf(stderr, "parity plan: --gemm-efficiency %g must be in (0, 1]\n", a->efficiency);
        return 2;
    }
    mm->skew = a->skew;
    memset(st, 0, sizeof *st);
    st->efficiency = a->efficiency;
    st->skew = a->skew;
    if (a->measured && measured_loads(a->measured, st))
        return 2;
    if (a->net.trace) {
        fprintf(stderr, "parity plan: --trace writes a run's emulated timeline; plan runs nothing (use parity run or "
                        "parity schedule --trace)\n");
        return 2;
    }
    int on = 0;
    if (par_net_args_resolve(&a->net, net, &on) != PAR_OK)
        return fail("network");
    if (!on && par_netmodel_preset("reference", net) != PAR_OK)
        return fail("network");
    return 0;
}

int par_plan_args_check(const par_plan_args *a)
{
    par_memmodel_opts mm;
    par_steptime_opts st;
    par_netmodel net;
    int rc = resolve(a, &mm, &st, &net);
    if (!rc && a->memory) {
        double b;
        if (par_size_parse(a->memory, &b)) {
            fprintf(stderr, "parity plan: --memory-per-gpu '%s' is not a size (e.g. 80GB, 80GiB, 8e10)\n", a->memory);
            return 2;
        }
    }
    if (!rc && a->top < 1) {
        fprintf(stderr, "parity plan: --top must be >= 1 (got %lld)\n", (long long)a->top);
        return 2;
    }
    const par_cli_output outs[] = {{"--json", a->json, PAR_OUT_FILE, a->overwrite}};
    return rc ? rc : par_cli_check_outputs("plan", outs, 1);
}

static int write_json(const char *path, cJSON *root)
{
    /* the marker core/outfile.h recognises: a later --json may replace it */
    char *text = cJSON_AddStringToObject(root, "format", "parity-plan") ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "parity plan: out of memory printing the JSON report\n");
        return 2;
    }
    if (par_path_is_dir(path)) {
        free(text);
        fprintf(stderr, "parity plan: --json %s is a directory\n", path);
        return 2;
    }
    par_status s = par_file_write_atomic(path, text, strlen(text));
    free(text);
    if (s)
        return fail("--json");
    printf("plan written: %s\n", path);
    return 0;
}

int par_plan_report(const par_plan_args *a, const par_config *cfg, const par_layout *l)
{
    par_netmodel net;
    par_planrep_opts o;
    memset(&o, 0, sizeof o);
    int rc = resolve(a, &o.mm, &o.st, &net);
    if (rc)
        return rc;
    o.cfg = cfg, o.l = l, o.net = &net, o.guide = a->guide;
    if (par_planrep_print(stdout, &o) != PAR_OK)
        return fail(NULL);
    if (!a->json)
        return 0;
    cJSON *root = NULL;
    if (par_planrep_json(&o, &root) != PAR_OK)
        return fail("--json");
    return write_json(a->json, root);
}

static void progress(int done, int total, double seconds, void *ud)
{
    (void)ud;
    fprintf(stderr, "parity plan: --search: %d of %d candidates evaluated (%.1f s; all would take about %.0f s)\n",
            done, total, seconds, done > 0 ? seconds * total / done : 0.0);
}

/* A budget below every layout's weights: said at once, nothing enumerated. */
static int nothing_fits(const par_plan_args *a, const par_config *cfg, const par_search_opts *o, double floor)
{
    printf("search   %lld GPUs, B %lld, budget %.0f bytes per GPU (%.4g GB): nothing fits: every layout needs at "
           "least %.0f bytes per GPU for its weights alone (%.0f parameters x 2 bytes / %lld GPUs); nothing was "
           "searched\n",
           (long long)o->world, (long long)o->global_batch, o->memory, o->memory / 1e9, floor,
           floor * (double)o->world / 2.0, (long long)o->world);
    (void)cfg;
    if (!a->json)
        return 0;
    cJSON *root = cJSON_CreateObject();
    if (!root || !cJSON_AddArrayToObject(root, "candidates") ||
        !cJSON_AddNumberToObject(root, "world", (double)o->world) ||
        !cJSON_AddNumberToObject(root, "memory_per_gpu", o->memory) ||
        !cJSON_AddNumberToObject(root, "weights_floor_per_gpu", floor) ||
        !cJSON_AddBoolToObject(root, "nothing_fits", 1)) {
        cJSON_Delete(root);
        fprintf(stderr, "parity plan: out of memory building the JSON report\n");
        return 2;
    }
    return write_json(a->json, root);
}

int par_plan_search_cmd(const par_plan_args *a, const par_config *cfg, const par_layout *given)
{
    par_netmodel net;
    par_search_opts o;
    memset(&o, 0, sizeof o);
    int rc = resolve(a, &o.mm, &o.st, &net);
    if (rc)
        return rc;
    o.net = &net;
    o.world = given->world;
    o.global_batch = given->global_batch > 0 ? given->global_batch : cfg->global_batch_size;
    o.distributed_optimizer = given->distributed_optimizer;
    o.recompute_both = !a->recompute; /* not given: try both */
    if (o.world < 1) {
        fprintf(stderr, "parity plan: --search needs --world-size N (the GPU count)\n");
        return 2;
    }
    if (a->memory && par_size_parse(a->memory, &o.memory)) {
        fprintf(stderr, "parity plan: --memory-per-gpu '%s' is not a size (e.g. 80GB, 80GiB, 8e10)\n", a->memory);
        return 2;
    }
    if (a->top < 1) {
        fprintf(stderr, "parity plan: --top must be >= 1 (got %lld)\n", (long long)a->top);
        return 2;
    }
    double floor = par_plan_search_floor(cfg, o.world);
    if (o.memory > 0 && floor > o.memory)
        return nothing_fits(a, cfg, &o, floor);
    o.max_seconds = a->search_seconds;
    o.progress = progress;
    par_search_cand *c = NULL;
    int n = 0;
    if (par_plan_search(cfg, &o, &c, &n) != PAR_OK)
        return fail("--search");
    par_plan_search_print(stdout, c, n, (int)a->top, &o);
    rc = 0;
    if (a->json) {
        cJSON *root = cJSON_CreateObject(), *arr = par_plan_search_json(c, n);
        if (!root || !arr || !cJSON_AddItemToObject(root, "candidates", arr) ||
            !cJSON_AddNumberToObject(root, "world", (double)o.world) ||
            !cJSON_AddNumberToObject(root, "global_batch", (double)o.global_batch) ||
            !cJSON_AddNumberToObject(root, "memory_per_gpu", o.memory) ||
            !cJSON_AddStringToObject(root, "network", net.name)) {
            cJSON_Delete(root);
            par_free(c);
            fprintf(stderr, "parity plan: out of memory building the JSON report\n");
            return 2;
        }
        rc = write_json(a->json, root);
    }
    par_free(c);
    return rc;
}
