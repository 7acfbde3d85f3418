/* tests/cli/test_run.c - `parity run --summary FILE.json` through the
 * binary: the run's metrics as JSON (docs/matrix.md, "Run summary") agree
 * with the run (its steps, layout, stages, ranks) and with the emulated
 * network; without a network the emulated parts are null. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/json.h"
#include "parity_exec.h"

/* Runs `parity run ARGS...` with its output into log; the exit status. */
static int run_parity(const char *log, const char *const *args)
{
    static const char *const run[] = {"run", NULL};
    return parity_exec(log, run, args);
}

static double num(const cJSON *o, const char *k)
{
    double v = NAN;
    cr_assert(par_json_num(o, k, &v), "no number '%s'", k);
    return v;
}

Test(run, summary_of_a_pipeline_with_network, .timeout = 120)
{
    char dir[] = "/tmp/parity-run-test-XXXXXX";
    cr_assert(mkdtemp(dir));
    char log[PATH_MAX], sum[PATH_MAX];
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(sum, sizeof sum, "%s/summary.json", dir);
    const char *args[] = {"--preset", "v4-tiny", "--steps", "2", "--quiet", "--pipeline-model-parallel-size", "2",
                          "--pipeline-model-parallel-layout", "Et*1|t*2mL", "--expert-model-parallel-size", "2",
                          "--world-size", "4", "--topology", "reference", "--summary", sum, NULL};
    int rc = run_parity(log, args);
    cr_assert_eq(rc, 0, "parity run exited %d", rc);
    cJSON *j = NULL;
    cr_assert_eq(par_json_read_file(sum, &j), 0, "%s", par_last_error());
    cr_expect_str_eq(par_json_str(j, "format"), "parity-run-summary");
    cr_expect_eq(num(j, "steps"), 2);
    const cJSON *losses = cJSON_GetObjectItemCaseSensitive(j, "losses");
    cr_assert_eq(cJSON_GetArraySize(losses), 2);
    double l0 = num(cJSON_GetArrayItem(losses, 0), "loss");
    cr_expect(l0 > 1 && l0 < 20, "loss %g", l0);
    const cJSON *lay = par_json_obj(j, "layout");
    cr_expect_eq(num(lay, "world_size"), 4);
    cr_expect_eq(num(lay, "data_parallel_size"), 2);
    cr_expect_str_eq(par_json_str(lay, "pipeline_model_parallel_layout"), "Et|t*2mL");
    const cJSON *em = par_json_obj(j, "emulated");
    cr_assert(em, "a network was attached: emulated metrics expected");
    cr_expect(num(em, "step_time_s") > 0 && num(em, "exposed_comm_s") >= 0);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(em, "ranks")), 4, "every rank's clock");
    const cJSON *pp = par_json_obj(j, "pipeline");
    cr_assert(pp);
    double b = num(pp, "emulated_bubble");
    cr_expect(b > 0 && b < 1, "bubble %g", b);
    cr_expect_eq(num(pp, "stages"), 2);
    cr_expect(par_json_obj(j, "expert_parallel"), "EP 2: the expert-parallel traffic");
    cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "context_parallel")));
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "memory")), 4);
    cJSON_Delete(j);

    /* without a network: no emulated metrics, no emulated bubble */
    const char *args2[] = {"--preset", "v4-tiny", "--steps", "1", "--quiet", "--summary", sum, NULL};
    cr_assert_eq(run_parity(log, args2), 0);
    cr_assert_eq(par_json_read_file(sum, &j), 0, "%s", par_last_error());
    cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "emulated")));
    cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "pipeline")));
    cJSON_Delete(j);
    par_remove_tree(dir);
}

/* The TP flags in every command that takes the layout flags (docs/cli.md:
 * the shared CLI.md lacks --sequence-parallel, --tp-all-layers and
 * --rank-host): run, plan and ckpt reshard, and no stale "TP / ETP not
 * supported" line. */
Test(run, help_lists_the_tp_flags)
{
    char dir[] = "/tmp/parity-help-test-XXXXXX";
    cr_assert(mkdtemp(dir));
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/log", dir);
    static const char *const cmds[][4] = {
        {"run", "--help", NULL}, {"plan", "--help", NULL}, {"ckpt", "reshard", "--help", NULL}};
    static const char *const want[] = {"--tensor-model-parallel-size", "--expert-tensor-parallel-size",
                                       "--sequence-parallel", "--tp-all-layers"};
    for (int c = 0; c < 3; c++) {
        cr_assert_eq(parity_exec(log, cmds[c], NULL), 0, "parity %s --help", cmds[c][0]);
        FILE *f = fopen(log, "r");
        cr_assert(f);
        static char text[1 << 16];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
            cr_expect(strstr(text, want[k]), "parity %s --help lacks %s", cmds[c][0], want[k]);
        cr_expect(!strstr(text, "not supported (sizes must be 1)") && !strstr(text, "TP = 1 with it") &&
                      !strstr(text, "no SP, no ETP"),
                  "parity %s --help: a stale TP line", cmds[c][0]);
        if (c == 0)
            cr_expect(strstr(text, "--rank-host"), "parity run --help lacks --rank-host");
    }
    par_remove_tree(dir);
}
