/* parity golden --preset v4-tiny|v4-mini [--data FILE | --fixture NAME] [--steps K] [--seed N]
 *               [--precision f64|f32] [--set key=value]... [--global-batch-size B] --out DIR
 * The serial reference (world size 1) writing a golden set (GOLDEN.md, CLI.md).
 * Exit: 0 success, 2 bad usage or unreadable input, 1 the run itself failed. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/devargs.h"
#include "cli/memlimit.h"
#include "core/alloc.h"
#include "core/outdir.h"
#include "core/status.h"
#include "model/config.h"
#include "model/facade.h"

static int exit_code(par_status s)
{
    switch (s) {
    case PAR_ENOMEM:
    case PAR_EINTERNAL:
    case PAR_ERANGE:
        return 1;
    default:
        return 2;
    }
}

static void print_mib(const char *what, int64_t bytes)
{
    printf("  %-8s %10.2f MiB\n", what, (double)bytes / (1024.0 * 1024.0));
}

/* The options that need no model: one argument rule each; 2 on a broken one. */
static int check_usage(const par_positional *pos, const char *out, const char *data, const char *fixture,
                       int64_t steps, int64_t seed, const char *device)
{
    if (pos->count) {
        fprintf(stderr, "parity golden: unexpected argument '%s' (see 'parity golden --help')\n", pos->argv[0]);
        return 2;
    }
    if (!out) {
        fprintf(stderr, "parity golden: --out DIR is required\n");
        return 2;
    }
    if (data && fixture) {
        fprintf(stderr, "parity golden: give --data or --fixture, not both\n");
        return 2;
    }
    const par_cli_output outs[] = {{"--out", out, PAR_OUT_GOLDEN}};
    if (par_cli_check_outputs("golden", outs, 1))
        return 2;
    if (steps < 1) {
        fprintf(stderr, "parity golden: --steps must be >= 1 (got %lld)\n", (long long)steps);
        return 2;
    }
    if (seed < 0) {
        fprintf(stderr, "parity golden: --seed must be >= 0 (got %lld)\n", (long long)seed);
        return 2;
    }
    if (par_cli_device("golden", device))
        return 2;
    return 0;
}

/* o->precision and o->cfg: the preset, the --set overrides, the batch size,
 * validated and runnable; 2 (with the message) when not.  Leaves errors quiet
 * on success (par_err_set_quiet(1)), as the run needs. */
static int golden_config(par_golden_opts *o, const char *preset, const char *precision, const par_strlist *sets,
                         int64_t gbs)
{
    if (!strcmp(precision, "f64"))
        o->precision = 64;
    else if (!strcmp(precision, "f32"))
        o->precision = 32;
    else {
        fprintf(stderr, "parity golden: --precision expects f64 or f32, got '%s'\n", precision);
        return 2;
    }
    par_err_set_quiet(1);
    par_status s = par_config_preset(&o->cfg, preset);
    for (int i = 0; !s && i < sets->count; i++)
        s = par_config_set_arg(&o->cfg, sets->items[i]);
    if (!s && gbs) {
        if (gbs < 1) {
            fprintf(stderr, "parity golden: --global-batch-size must be >= 1 (got %lld)\n", (long long)gbs);
            par_err_set_quiet(0);
            return 2;
        }
        o->cfg.global_batch_size = gbs;
    }
    if (!s)
        s = par_config_validate(&o->cfg);
    if (!s)
        s = par_config_check_runnable(&o->cfg);
    if (s) {
        fprintf(stderr, "parity golden: %s\n", par_last_error());
        par_err_set_quiet(0);
        return 2;
    }
    return 0;
}

/* The summary line, the per-step table, wall time and the tagged peaks. */
static void print_summary(const par_golden_opts *o, const par_golden_summary *sum, const char *preset,
                          const char *precision)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("golden set written: %s (preset %s, %s, %lld steps, B=%lld S=%lld, %lld parameters, BLAS core %s)\n",
           o->out_dir, preset, precision, (long long)o->steps, (long long)o->cfg.global_batch_size,
           (long long)sum->seq_length, (long long)sum->n_params, sum->blas_core);
    if (o->rows_per_block > 0 && o->rows_per_block < o->cfg.global_batch_size)
        printf("gradients accumulated over row blocks of %lld rows (%lld blocks per step, in row order)\n",
               (long long)o->rows_per_block,
               (long long)((o->cfg.global_batch_size + o->rows_per_block - 1) / o->rows_per_block));
    printf("%-5s %-20s %-20s %-20s %-14s %-14s %s\n", "step", "loss", "loss_main", "loss_mtp", "loss_aux",
           "grad_norm", "wall_s");
    for (int64_t k = 0; k < sum->steps; k++) {
        const par_golden_step_info *si = &sum->step[k];
        printf("%-5lld %-20.14g %-20.14g %-20.14g %-14.8g %-14.8g %.3f\n", (long long)k, si->loss,
               si->loss_main, si->loss_mtp, si->loss_aux, si->grad_norm, si->wall_s);
    }
    int64_t rows[2] = {0, 0};
    for (int64_t k = 0; k < sum->steps; k++)
        rows[0] += sum->step[k].index_rows[0], rows[1] += sum->step[k].index_rows[1];
    int64_t rr[2] = {0, 0};
    for (int64_t k = 0; k < sum->steps; k++)
        rr[0] += sum->step[k].router_rows[0], rr[1] += sum->step[k].router_rows[1];
    if (rr[1] > 0) /* the presets' continuous scores never tie: a line only when some router did */
        printf("router: %lld of %lld score-routed rows have an exact tie at the top-K boundary (%.1f %%; "
               "ties.K.safetensors)\n", (long long)rr[1], (long long)rr[0], 100.0 * (double)rr[1] / (double)rr[0]);
    if (rows[0] > 0)
        printf("indexer: %lld of %lld query rows with a choice have an exact tie at the top-k boundary (%.1f %%; "
               "ties.K.safetensors)\n", (long long)rows[1], (long long)rows[0], 100.0 * (double)rows[1] / (double)rows[0]);
    printf("wall time %.3f s (writing included); peak RSS %.1f MiB; tagged peaks:\n", sum->wall_s,
           (double)ru.ru_maxrss / 1024.0);
    print_mib("param", par_alloc_peak(PAR_TAG_PARAM));
    print_mib("grad", par_alloc_peak(PAR_TAG_GRAD));
    print_mib("optim", par_alloc_peak(PAR_TAG_OPTIM));
    print_mib("act", par_alloc_peak(PAR_TAG_ACT));
    print_mib("io", par_alloc_peak(PAR_TAG_IO));
    par_cli_device_report(stdout);
}

int par_cmd_golden(int argc, char **argv)
{
    const char *preset = "v4-tiny", *data = NULL, *fixture = NULL, *precision = "f64", *out = NULL;
    const char *device = NULL;
    const char *max_memory = NULL, *recipe = "none";
    int64_t steps = 1, seed = 1234, gbs = 0, rows = 0;
    int quiet = 0, bitwise = 0, router_scores = 0;
    par_strlist sets;
    memset(&sets, 0, sizeof sets);
    const par_opt opts[] = {
        {"preset", PAR_OPT_STR, &preset, "NAME", "model preset: v4-tiny (default) or v4-mini"},
        {"data", PAR_OPT_STR, &data, "FILE",
         "safetensors with input.tokens, input.segments (I32 [R,S]); rows taken in order", PAR_CHK_NONEMPTY},
        {"fixture", PAR_OPT_STR, &fixture, "NAME",
         "packing fixture fixtures/NAME.json (synthetic tokens from --seed)", PAR_CHK_NONEMPTY},
        {"steps", PAR_OPT_INT, &steps, "K", "training steps (default 1)", PAR_CHK_POS, 1e8},
        {"seed", PAR_OPT_INT, &seed, "N", "seed of the init, the packing plan and the tokens (default 1234)", PAR_CHK_NONNEG},
        {"precision", PAR_OPT_STR, &precision, "f64|f32", "working precision (default f64)"},
        {"out", PAR_OPT_STR, &out, "DIR", "golden set directory to write (replaced atomically)", PAR_CHK_NONEMPTY},
        {"set", PAR_OPT_LIST, &sets, "key=value", "override a model/train key (repeatable)"},
        {"global-batch-size", PAR_OPT_INT, &gbs, "B", "rows per step (default: the preset's)", PAR_CHK_POS},
        {"rows-per-block", PAR_OPT_INT, &rows, "R",
         "accumulate gradients over blocks of R rows (R >= B: one shot; default: one shot unless it would not "
         "fit the memory limit)", PAR_CHK_POS},
        {"quiet", PAR_OPT_FLAG, &quiet, NULL, "no per-step progress lines"},
        {"bitwise", PAR_OPT_FLAG, &bitwise, NULL, PAR_BITWISE_HELP},
        {"recipe", PAR_OPT_STR, &recipe, "NAME", PAR_RECIPE_HELP},
        {"router-scores", PAR_OPT_FLAG, &router_scores, NULL,
         "also write scores.K.safetensors: the router's selection values per token and expert, for the routing "
         "margins of derived bounds (parity bounds; docs/recipes.md)"},
        {"device", PAR_OPT_STR, &device, "cpu|gpu", PAR_DEVICE_HELP},
        {"max-memory", PAR_OPT_STR, &max_memory, "SIZE", PAR_MEMLIMIT_HELP},
    };
    const char *synopsis =
        "--preset v4-tiny|v4-mini [--data FILE | --fixture NAME] [--steps K] [--seed N]\n"
        "       [--precision f64|f32] [--set key=value]... [--global-batch-size B] [--rows-per-block R]\n"
        "       [--device cpu|gpu] [--max-memory SIZE] [--bitwise] [--recipe none|bf16|fp8|v4] [--router-scores]\n"
        "       --out DIR\n\n"
        "Runs the serial reference (world size 1) and writes a golden set (GOLDEN.md): params.K,\n"
        "step.K safetensors and manifest.json.  Without --data/--fixture the batches come from the\n"
        "synthetic generator with a random packing plan drawn from --seed.";
    par_positional pos;
    int rc = par_args_parse("golden", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc == 1)
        return 0;
    if (rc || check_usage(&pos, out, data, fixture, steps, seed, device) ||
        par_cli_bitwise_device("golden", bitwise, device))
        return 2;
    par_golden_opts o;
    par_golden_opts_init(&o);
    if (golden_config(&o, preset, precision, &sets, gbs))
        return 2;
    o.cfg.bitwise = bitwise;
    if (par_cli_recipe("golden", recipe, device, &o.cfg)) {
        par_err_set_quiet(0);
        return 2;
    }
    o.steps = steps;
    o.seed = (uint64_t)seed;
    o.out_dir = out;
    o.data_path = data;
    o.fixture = fixture;
    o.progress = !quiet;
    o.router_scores = router_scores;

    /* the memory estimate before anything big is allocated (issue 13) */
    if ((rc = par_memlimit_golden_rows("golden", max_memory, &o.cfg, o.precision, steps, &rows))) {
        par_err_set_quiet(0);
        return rc;
    }
    o.rows_per_block = rows;
    par_alloc_reset_peaks();
    par_golden_summary sum;
    par_status s = par_golden_run(&o, &sum);
    par_err_set_quiet(0);
    if (s) {
        fprintf(stderr, "parity golden: %s\n", par_last_error());
        return exit_code(s);
    }
    print_summary(&o, &sum, preset, precision);
    par_golden_summary_free(&sum);
    return 0;
}
