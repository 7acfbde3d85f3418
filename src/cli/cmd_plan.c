/* parity plan [layout flags] [--preset NAME] [--config FILE] [--set k=v] [--rank R]
 * Checks a parallel layout against a model config and prints its summary.
 * Exit: 0 valid, 2 bad usage or an invalid layout. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/planargs.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"
#include "parallel/plan/plan.h"

static int fail(const char *what)
{
    fprintf(stderr, "parity plan: %s%s%s\n", what ? what : "", what ? ": " : "", par_last_error());
    par_err_set_quiet(0);
    return 2;
}

static par_status resize_ratios(par_config *cfg, const par_config *base)
{
    int64_t nb = cfg->n_layers + cfg->n_mtp_layers;
    if (nb == cfg->n_compress_ratios)
        return PAR_OK;
    if (cfg->n_layers < 1 || cfg->n_mtp_layers < 0 || nb > PAR_MAX_BLOCKS)
        return par_err(PAR_EINVAL, "n_layers %lld + n_mtp_layers %lld: outside 1..%d blocks",
                       (long long)cfg->n_layers, (long long)cfg->n_mtp_layers, PAR_MAX_BLOCKS);
    int64_t bl = base->n_layers;
    int64_t mtp_ratio = base->n_compress_ratios > bl ? base->compress_ratios[bl] : 0;
    for (int64_t b = 0; b < nb; b++)
        cfg->compress_ratios[b] = b < cfg->n_layers ? base->compress_ratios[b % bl] : mtp_ratio;
    cfg->n_compress_ratios = nb;
    return PAR_OK;
}

/* The model config: the preset, --config, --set, the shorthands (with
 * compress_ratios resized to the blocks), validated.  0 or exit code 2. */
typedef struct {
    const char *preset, *config;
    par_strlist sets;
    int64_t n_layers, n_mtp, n_experts, seq;
} model_args;

static int build_config(par_config *cfg, const model_args *a)
{
    if (par_config_preset(cfg, a->preset) != PAR_OK)
        return fail("--preset");
    if (a->config && par_config_load_file(cfg, a->config) != PAR_OK)
        return fail("--config");
    for (int i = 0; i < a->sets.count; i++)
        if (par_config_set_arg(cfg, a->sets.items[i]) != PAR_OK)
            return fail("--set");
    par_config base = *cfg;
    struct {
        const char *key;
        int64_t v;
    } shorthands[] = {{"n_layers", a->n_layers}, {"n_mtp_layers", a->n_mtp}, {"n_routed_experts", a->n_experts},
                      {"seq_length", a->seq}};
    for (size_t i = 0; i < sizeof shorthands / sizeof shorthands[0]; i++) {
        if (shorthands[i].v < 0)
            continue;
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)shorthands[i].v);
        if (par_config_set(cfg, shorthands[i].key, v) != PAR_OK)
            return fail(NULL);
    }
    /* --n-layers / --mtp-num-layers without compress_ratios: repeat the
     * preset's pattern of main-layer ratios, MTP blocks keep the preset's
     * MTP ratio, so that n_compress_ratios matches. */
    int ratios_set = 0;
    for (int i = 0; i < a->sets.count; i++)
        ratios_set |= !strncmp(a->sets.items[i], "compress_ratios=", 16);
    if (!ratios_set && (a->n_layers >= 0 || a->n_mtp >= 0) && resize_ratios(cfg, &base) != PAR_OK)
        return fail(NULL);
    if (par_config_validate(cfg) != PAR_OK)
        return fail("model config");
    return 0;
}

/* The layout the flags give (not yet resolved).  0 or exit code 2. */
static int layout_of(par_layout *l, const par_layout_args *la, int64_t mb_group)
{
    par_layout_init(l);
    l->tp = la->tp;
    l->pp = la->pp;
    l->vpp = la->vpp;
    l->cp = la->cp;
    l->ep = la->ep;
    l->etp = la->etp;
    l->world = la->world_size;
    l->micro_batch = la->micro_batch;
    l->global_batch = la->global_batch;
    l->mb_group = mb_group;
    l->distributed_optimizer = la->distributed_optimizer;
    l->sequence_parallel = la->sequence_parallel;
    l->tp_all_layers = la->tp_all_layers || la->sequence_parallel;
    if ((la->sequence_parallel || la->tp_all_layers) && l->tp <= 1) { /* par_layout_run_rules' first rule */
        fprintf(stderr, "parity plan: --%s needs tensor-model-parallel-size > 1 (got %lld)\n",
                la->sequence_parallel ? "sequence-parallel" : "tp-all-layers", (long long)l->tp);
        return 2;
    }
    if (par_layout_set_pp_layout(l, la->pp_layout) != PAR_OK || par_layout_set_schedule(l, la->pp_schedule) != PAR_OK)
        return fail("invalid layout");
    return 0;
}

int par_cmd_plan(int argc, char **argv)
{
    const char *preset = "v4-tiny", *config = NULL;
    par_strlist sets = {{0}, 0};
    int64_t rank = -1, mb_group = 0;
    int64_t n_layers = -1, n_mtp = -1, n_experts = -1, seq = -1;
    par_layout_args la;
    par_layout_args_init(&la);
    par_plan_args pa;
    par_plan_args_init(&pa);
    par_opt opts[64] = {
        {"preset", PAR_OPT_STR, &preset, "NAME", "model preset: v4-tiny (default), v4-mini, v4-pro, v4-flash"},
        {"config", PAR_OPT_STR, &config, "FILE", "JSON config applied over the preset"},
        {"set", PAR_OPT_LIST, &sets, "KEY=VALUE", "override a model key (MODEL.md names), repeatable"},
        {"n-layers", PAR_OPT_INT, &n_layers, "N", "shorthand for --set n_layers=N (compress_ratios repeat the preset's)"},
        {"mtp-num-layers", PAR_OPT_INT, &n_mtp, "N", "shorthand for --set n_mtp_layers=N"},
        {"num-experts", PAR_OPT_INT, &n_experts, "E", "shorthand for --set n_routed_experts=E"},
        {"seq-length", PAR_OPT_INT, &seq, "S", "shorthand for --set seq_length=S"},
        {"rank", PAR_OPT_INT, &rank, "R", "show the coordinates and groups of rank R only", PAR_CHK_NONNEG},
        {"microbatch-group-size-per-virtual-pipeline-stage", PAR_OPT_INT, &mb_group, "G",
         "interleaved schedule: microbatches per virtual stage (default PP)", PAR_CHK_POS},
    };
    int n = 9;
    n = par_layout_opts(opts, n, (int)(sizeof opts / sizeof opts[0]), &la);
    if (n >= 0)
        n = par_plan_opts(opts, n, (int)(sizeof opts / sizeof opts[0]), &pa);
    if (n < 0) {
        fprintf(stderr, "parity plan: internal error: option table too small\n");
        return 2;
    }
    const char *synopsis =
        "[layout flags] [--preset NAME] [--config FILE] [--set key=value] [--rank R]\n\n"
        "Checks a parallel layout against the model (planning presets v4-pro and v4-flash\n"
        "included) and prints N, Da, De, the microbatches, the blocks of every pipeline\n"
        "segment and the coordinates and process groups of a few ranks (or of --rank R); then\n"
        "the tuning guide's numbers (routed weights per EP, microbatches and 1F1B bubble, VPP,\n"
        "tokens per dispatch, D_window), the memory of the heaviest rank of every stage and an\n"
        "analytical step time (docs/planning.md).  --search ranks every legal layout of\n"
        "--world-size GPUs and --global-batch-size rows that fits --memory-per-gpu.\n"
        "Exit 0: valid; 2: bad usage or an invalid layout (the message names the rule).";
    par_positional pos;
    int rc = par_args_parse("plan", synopsis, opts, n, argc, argv, &pos);
    if (rc == 1)
        return 0;
    if (rc)
        return 2;
    if (pos.count) {
        fprintf(stderr, "parity plan: unexpected argument '%s' (see 'parity plan --help')\n", pos.argv[0]);
        return 2;
    }
    if (par_plan_args_check(&pa))
        return 2;
    par_err_set_quiet(1);
    const model_args ma = {preset, config, sets, n_layers, n_mtp, n_experts, seq};
    par_config cfg;
    if ((rc = build_config(&cfg, &ma)))
        return rc;
    par_layout l;
    if ((rc = layout_of(&l, &la, mb_group)))
        return rc;
    int rc_extra;
    if (pa.search) {
        rc_extra = par_plan_search_cmd(&pa, &cfg, &l);
        par_err_set_quiet(0);
        return rc_extra;
    }
    if (par_plan_resolve(&l, &cfg) != PAR_OK)
        return fail("invalid layout");
    if (rank < -1 || rank >= l.world) {
        fprintf(stderr, "parity plan: --rank %lld is outside the world of %lld ranks\n", (long long)rank,
                (long long)l.world);
        par_err_set_quiet(0);
        return 2;
    }
    par_plan_print(stdout, &l, &cfg, (int)rank);
    rc_extra = par_plan_report(&pa, &cfg, &l);
    par_err_set_quiet(0);
    return rc_extra;
}
