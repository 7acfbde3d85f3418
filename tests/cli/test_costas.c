/* tests/cli/test_costas.c - `parity run --cost-as PRESET` through the
 * binary (docs/planning.md "--cost-as"): the numerics do not move (the dump
 * is bitwise the run's without it) while the clock charges the target; the
 * run's 1F1B bubble and EP dispatch + combine bytes per tier agree with
 * `parity plan` on the same flags within 10 %; nonsense is refused with
 * exit 2.  v4-tiny numerics, PP 2 x EP 4 on 8 ranks, nodes of 2 ranks so
 * both tiers carry EP bytes. */
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

/* Runs `parity ARGS...` (parity_exec.h); the exit status. */
static int parity(const char *log, const char *const *a, const char *const *b)
{
    return parity_exec(log, a, b);
}

static double num(const cJSON *o, const char *k)
{
    double v = NAN;
    cr_assert(par_json_num(o, k, &v), "no number '%s'", k);
    return v;
}

static cJSON *load(const char *path)
{
    cJSON *doc = NULL;
    cr_assert(par_json_read_file(path, &doc) == PAR_OK, "cannot read %s", path);
    return doc;
}

/* The run's layout flags (v4-tiny: 3 layers + MTP over 2 stages, 8 experts over EP 4). */
static const char *const RUN[] = {"run", "--preset", "v4-tiny", "--world-size", "8", "--pipeline-model-parallel-size",
                                  "2", "--pipeline-model-parallel-layout", "Et*2|tmL", "--expert-model-parallel-size",
                                  "4", "--micro-batch-size", "1", "--steps", "2", "--quiet", "--topology", "reference",
                                  "--gpus-per-node", "2", NULL};

Test(costas, numerics_unchanged_clock_charged, .timeout = 120)
{
    char dir[] = "/tmp/parity-costas-test-XXXXXX";
    cr_assert(mkdtemp(dir));
    char log[PATH_MAX], d1[PATH_MAX], d2[PATH_MAX], s1[PATH_MAX], s2[PATH_MAX];
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(d1, sizeof d1, "%s/plain", dir);
    snprintf(d2, sizeof d2, "%s/costas", dir);
    snprintf(s1, sizeof s1, "%s/plain.json", dir);
    snprintf(s2, sizeof s2, "%s/costas.json", dir);
    const char *plain[] = {"--dump", d1, "--summary", s1, NULL};
    const char *costas[] = {"--dump", d2, "--summary", s2, "--cost-as", "v4-pro", NULL};
    cr_assert_eq(parity(log, RUN, plain), 0, "the plain run failed (see %s)", log);
    cr_assert_eq(parity(log, RUN, costas), 0, "the --cost-as run failed (see %s)", log);
    const char *cmp[] = {"compare", d1, d2, "--policy", "bitwise", NULL};
    cr_assert_eq(parity(log, cmp, NULL), 0, "the dumps differ with --cost-as (see %s)", log);
    cJSON *a = load(s1), *b = load(s2);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(a, "cost_as")));
    const cJSON *ca = cJSON_GetObjectItem(b, "cost_as");
    cr_assert(cJSON_IsObject(ca), "no cost_as object in the summary");
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(ca, "preset")), "v4-pro");
    cr_assert_eq(num(ca, "tokens_per_microbatch"), 8192); /* b S_t / CP */
    /* V4-Pro's stages on an H100-class GPU take seconds; v4-tiny's counted GEMMs microseconds */
    double t1 = num(cJSON_GetObjectItem(a, "emulated"), "step_time_s"), t2 = num(ca, "step_time_s");
    cr_assert(t2 > 1.0 && t2 > 1e3 * t1, "step time %g s with --cost-as, %g s without", t2, t1);
    cr_assert_eq(t2, num(cJSON_GetObjectItem(b, "emulated"), "step_time_s"));
    cJSON_Delete(a);
    cJSON_Delete(b);
    par_remove_tree(dir);
}

static void within(double run, double plan, double tol, const char *what)
{
    cr_assert(plan > 0 && fabs(run / plan - 1) <= tol, "%s: run %.6g vs plan %.6g (%.2f %% apart, tolerance %.0f %%)",
              what, run, plan, 100 * fabs(run / plan - 1), 100 * tol);
}

Test(costas, agrees_with_the_plan, .timeout = 120)
{
    char dir[] = "/tmp/parity-costas-test-XXXXXX";
    cr_assert(mkdtemp(dir));
    char log[PATH_MAX], s[PATH_MAX], p[PATH_MAX];
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(s, sizeof s, "%s/run.json", dir);
    snprintf(p, sizeof p, "%s/plan.json", dir);
    const char *extra[] = {"--summary", s, "--cost-as", "v4-pro", NULL};
    cr_assert_eq(parity(log, RUN, extra), 0, "the --cost-as run failed (see %s)", log);
    cJSON *run = load(s);
    const cJSON *ca = cJSON_GetObjectItem(run, "cost_as");
    const cJSON *sk = cJSON_GetObjectItem(ca, "stage_skew");
    cr_assert(cJSON_IsArray(sk) && cJSON_GetArraySize(sk) == 2, "stage_skew: one per pipeline rank");
    for (int i = 0; i < 2; i++)
        cr_assert(cJSON_GetArrayItem(sk, i)->valuedouble >= 1.0);
    const char *lay = cJSON_GetStringValue(cJSON_GetObjectItem(ca, "pipeline_layout"));
    cr_assert(lay && strcmp(lay, "Et*31|t*30mL") == 0, "target layout %s", lay ? lay : "(none)");
    const char *plan[] = {"plan", "--preset", "v4-pro", "--world-size", "8", "--pipeline-model-parallel-size", "2",
                          "--pipeline-model-parallel-layout", lay, "--expert-model-parallel-size", "4",
                          "--micro-batch-size", "1", "--global-batch-size", "8", "--topology", "reference",
                          "--gpus-per-node", "2", "--measured-loads", s, "--json", p, NULL};
    cr_assert_eq(parity(log, plan, NULL), 0, "parity plan failed (see %s)", log);
    cJSON *pl = load(p);
    const cJSON *st = cJSON_GetObjectItem(pl, "step_time");
    const cJSON *eb = cJSON_GetObjectItem(ca, "ep_bytes_per_step");
    within(num(ca, "bubble"), num(st, "bubble"), 0.10, "1F1B bubble");
    within(num(eb, "nvlink"), num(st, "ep_bytes_world_nvlink"), 0.10, "EP bytes over NVLink per step");
    within(num(eb, "ib"), num(st, "ep_bytes_world_ib"), 0.10, "EP bytes over IB per step");
    cJSON_Delete(run);
    cJSON_Delete(pl);
    par_remove_tree(dir);
}

Test(costas, refusals, .timeout = 60)
{
    char dir[] = "/tmp/parity-costas-test-XXXXXX";
    cr_assert(mkdtemp(dir));
    char log[PATH_MAX], d[PATH_MAX];
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(d, sizeof d, "%s/dump", dir);
    const char *unknown[] = {"--cost-as", "v4-huge", "--dump", d, NULL};
    cr_assert_eq(parity(log, RUN, unknown), 2, "an unknown preset");
    cr_assert(access(d, F_OK) != 0, "a refused run wrote %s", d);
    const char *segs[] = {"--cost-as", "v4-pro", "--cost-as-layout", "Et*61mL", NULL}; /* 1 segment, PP 2 */
    cr_assert_eq(parity(log, RUN, segs), 2, "a target layout of the wrong stage count");
    /* the run's stage 1 holds only the head: nothing to stand for the target's 31 MoE blocks there */
    const char *empty[] = {"run", "--preset", "v4-tiny", "--world-size", "8", "--pipeline-model-parallel-size", "2",
                           "--pipeline-model-parallel-layout", "Et*3m|L", "--expert-model-parallel-size", "4",
                           "--quiet", "--cost-as", "v4-pro", NULL};
    cr_assert_eq(parity(log, empty, NULL), 2, "a target stage without a run block to stand for it");
    /* the target's layout rules: EP 16 does not divide v4-tiny's 8 experts (refused before anything runs) */
    const char *rules[] = {"run", "--preset", "v4-mini", "--world-size", "16", "--expert-model-parallel-size", "16",
                           "--quiet", "--cost-as", "v4-tiny", NULL};
    cr_assert_eq(parity(log, rules, NULL), 2, "a target whose layout rules fail");
    const char *alone[] = {"--cost-as-layout", "Et*31|t*30mL", NULL};
    cr_assert_eq(parity(log, RUN, alone), 2, "--cost-as-layout without --cost-as");
    const char *hier[] = {"--cost-as", "v4-pro", "--moe-dispatch", "hierarchical", NULL};
    cr_assert_eq(parity(log, RUN, hier), 2, "the hierarchical dispatch is not costed");
    par_remove_tree(dir);
}
