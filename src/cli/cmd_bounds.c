/* parity bounds GOLDEN --variant DIR [--variant DIR]... [--exact DIR] [--factor F] --out FILE [--overwrite]
 * Derives per-tensor tolerances of GOLDEN (a recipe golden) from legal
 * variants of it and the set without the recipe (model/bounds.h,
 * docs/recipes.md "Derived bounds").  Exit: 0 written, 2 bad usage or
 * unreadable / unfit input. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/outdir.h"
#include "core/status.h"
#include "model/bounds.h"

#define DEFAULT_FACTOR 4.0

/* The summary: bounds per kind, the widest norm bounds relative to ||A||
 * and to the recipe effect, the routers' eps. */
static void print_summary(const par_bounds *b, const char *out)
{
    int cnt[5] = {0}, n = par_bounds_count(b), weak = 0;
    const par_bound *wide = NULL;
    for (int i = 0; i < n; i++) {
        const par_bound *e = par_bounds_at(b, i);
        cnt[e->kind]++;
        if (e->kind != PAR_BOUND_NORM || !(e->norm > 0))
            continue;
        if (!wide || e->bound / e->norm > wide->bound / wide->norm)
            wide = e;
        weak += e->recipe_effect >= 0 && e->bound >= e->recipe_effect && e->recipe_effect > 0;
    }
    printf("bounds written: %s (factor %g): %d tensors: %d norm, %d margin, %d load, %d rows, %d exact\n", out,
           par_bounds_factor(b), n, cnt[0], cnt[1], cnt[2], cnt[3], cnt[4]);
    if (wide)
        printf("widest norm bound relative to ||A||: %s %s: %.3e = %.3e ||A||\n", wide->file, wide->tensor,
               wide->bound, wide->bound / wide->norm);
    printf("norm bounds at or above their tensor's recipe effect ||N-A|| (cannot tell the recipe from none): %d\n",
           weak);
    for (int i = 0; i < n; i++) {
        const par_bound *e = par_bounds_at(b, i);
        if (e->kind == PAR_BOUND_MARGIN)
            printf("router %s %s: eps %.3e (max |score| %.3e)\n", e->file, e->tensor, e->bound, e->norm);
    }
}

int par_cmd_bounds(int argc, char **argv)
{
    const char *exact = NULL, *out = NULL;
    double factor = DEFAULT_FACTOR;
    int overwrite = 0;
    par_strlist vars;
    memset(&vars, 0, sizeof vars);
    const par_opt opts[] = {
        {"variant", PAR_OPT_LIST, &vars, "DIR",
         "a golden set of the same run and recipe in another working precision or summation order (--precision "
         "f32, --bitwise, ...; repeatable, at least one; --router-scores for the routing margins)"},
        {"exact", PAR_OPT_STR, &exact, "DIR", "the golden set of the same run without the recipe (the recipe effect)",
         PAR_CHK_NONEMPTY},
        {"factor", PAR_OPT_DOUBLE, &factor, "F", "bound = F x the largest deviation of a variant (default 4)",
         PAR_CHK_POS_REAL, 1e6},
        {"out", PAR_OPT_STR, &out, "FILE", "the bounds file to write (JSON; e.g. GOLDEN/bounds.json, which compare "
         "--policy derived reads by default)", PAR_CHK_NONEMPTY},
        {"overwrite", PAR_OPT_FLAG, &overwrite, NULL, PAR_OVERWRITE_HELP},
    };
    const char *synopsis = "GOLDEN --variant DIR [--variant DIR]... [--exact DIR] [--factor F] --out FILE\n\n"
                           "Derives, per tensor of the golden set GOLDEN (a recipe golden), the deviation a GPU run\n"
                           "under its recipe may have: F x the largest deviation of a variant of the same step\n"
                           "(another working precision or summation order), at least 2^-24 ||A||; routers: the\n"
                           "scores' eps for the routing margins.  parity compare GOLDEN DUMP --policy derived\n"
                           "judges by them (docs/recipes.md \"Derived bounds\").";
    par_positional pos;
    int rc = par_args_parse("bounds", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc)
        return rc == 1 ? 0 : 2;
    if (pos.count != 1 || !out || vars.count < 1) {
        fprintf(stderr, "parity bounds: expected GOLDEN, --variant DIR (at least one) and --out FILE (see 'parity "
                "bounds --help')\n");
        return 2;
    }
    const par_cli_output outs[] = {{"--out", out, PAR_OUT_FILE, overwrite}};
    if (par_cli_check_outputs("bounds", outs, 1))
        return 2;
    par_bounds *b = NULL;
    par_err_set_quiet(1);
    par_status s = par_bounds_derive(pos.argv[0], exact, vars.items, vars.count, factor, &b);
    if (!s)
        s = par_bounds_write(b, out);
    par_err_set_quiet(0);
    if (s) {
        fprintf(stderr, "parity bounds: %s\n", par_last_error());
        par_bounds_free(b);
        return s == PAR_ENOMEM ? 1 : 2;
    }
    print_summary(b, out);
    par_bounds_free(b);
    return 0;
}
