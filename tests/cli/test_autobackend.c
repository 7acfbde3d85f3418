/* tests/cli/test_autobackend.c - the default backend (issue 33 item 1,
 * cli/autobackend.h): without --backend, `parity run` and `parity matrix`
 * (its --cells files too) take OS threads up to PAR_AUTOBACKEND_THREADS_PER_CORE
 * ranks per core and fibers beyond, and say which and why; --backend forces
 * one.  The test pins itself (and so the parity it runs) to one CPU, so the
 * rule's numbers do not depend on the machine. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/autobackend.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "parity_exec.h"

static void one_cpu(void)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int first = 0;
    while (first < CPU_SETSIZE && !CPU_ISSET(first, &set))
        first++;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    cr_assert_eq(sched_setaffinity(0, sizeof set, &set), 0, "pinning to CPU %d", first);
}

TestSuite(autobackend, .init = one_cpu);

static char *slurp(const char *path)
{
    void *buf;
    size_t n;
    cr_assert_eq(par_file_read(path, PAR_TAG_IO, &buf, &n), PAR_OK, "%s", par_last_error());
    char *s = malloc(n + 1);
    memcpy(s, buf, n);
    s[n] = 0;
    par_free(buf);
    return s;
}

/* `parity run` of v4-tiny on `world` DP ranks (B = world rows); its output. */
static char *run_world(const char *dir, const char *world, const char *backend)
{
    char log[PATH_MAX + 16];
    snprintf(log, sizeof log, "%s/log", dir);
    static const char *const cmd[] = {"run", NULL};
    const char *args[] = {"--preset", "v4-tiny", "--steps", "1", "--quiet", "--world-size", world,
                          "--global-batch-size", world, backend ? "--backend" : NULL, backend, NULL};
    int rc = parity_exec(log, cmd, args);
    char *out = slurp(log);
    cr_expect_eq(rc, 0, "parity run --world-size %s: exit %d\n%s", world, rc, out);
    return out;
}

Test(autobackend, run_picks_by_ranks_per_core, .timeout = 120)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    cr_assert_eq(CPU_COUNT(&set), 1, "the test pinned itself to one CPU");
    char dir[] = "/tmp/parity-autobackend-XXXXXX";
    cr_assert(mkdtemp(dir));
    char few[16], many[16];
    snprintf(few, sizeof few, "%d", PAR_AUTOBACKEND_THREADS_PER_CORE);
    snprintf(many, sizeof many, "%d", 2 * PAR_AUTOBACKEND_THREADS_PER_CORE);
    char want[200];

    char *out = run_world(dir, few, NULL);
    snprintf(want, sizeof want, "backend threads (default for %s ranks on 1 core", few);
    cr_expect(strstr(out, want), "%s", out);
    cr_expect(strstr(out, "backend threads, 1 steps"), "%s", out);
    free(out);

    out = run_world(dir, many, NULL);
    snprintf(want, sizeof want, "backend fiber (default for %s ranks on 1 core", many);
    cr_expect(strstr(out, want), "%s", out);
    cr_expect(strstr(out, "backend fiber, 1 steps"), "%s", out);
    free(out);

    out = run_world(dir, many, "threads"); /* --backend forces one, and no rule is said */
    cr_expect(!strstr(out, "(default for"), "%s", out);
    cr_expect(strstr(out, "backend threads, 1 steps"), "%s", out);
    free(out);
    par_remove_tree(dir);
}

Test(autobackend, matrix_cells_follow_the_rule, .timeout = 300)
{
    char dir[] = "/tmp/parity-autobackend-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cells[PATH_MAX + 16], out[PATH_MAX + 16], log[PATH_MAX + 16], json[PATH_MAX + 16];
    snprintf(cells, sizeof cells, "%s/cells.json", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(json, sizeof json, "%s/r.json", dir);
    char text[1024];
    int n = 2 * PAR_AUTOBACKEND_THREADS_PER_CORE;
    snprintf(text, sizeof text,
             "{\"format\": \"parity-cells\", \"version\": 1, \"cells\": ["
             "{\"name\": \"few\", \"preset\": \"v4-tiny\", \"steps\": 1, \"layout\": {\"world-size\": 2}},"
             "{\"name\": \"many\", \"preset\": \"v4-tiny\", \"steps\": 1,"
             " \"layout\": {\"world-size\": %d, \"global-batch-size\": %d}},"
             "{\"name\": \"own\", \"preset\": \"v4-tiny\", \"steps\": 1, \"backend\": \"threads\","
             " \"layout\": {\"world-size\": %d, \"global-batch-size\": %d}}]}",
             n, n, n, n);
    cr_assert_eq(par_file_write_atomic(cells, text, strlen(text)), PAR_OK);
    static const char *const cmd[] = {"matrix", NULL};
    const char *args[] = {"--cells", cells, "--fixture", "tiny-boundary-mix", "--out", out, "--report", json,
                          "--quiet", NULL};
    int rc = parity_exec(log, cmd, args);
    char *txt = slurp(log);
    cr_expect_eq(rc, 0, "exit %d\n%s", rc, txt);
    cr_expect(strstr(txt, "backend fiber: 1 layout cell (first many: default for"), "%s", txt);
    free(txt);
    cJSON *j;
    cr_assert_eq(par_json_read_file(json, &j), PAR_OK, "%s", par_last_error());
    cr_expect_str_eq(par_json_str(j, "backend"), "auto");
    static const char *const want[][2] = {{"few", "threads"}, {"many", "fiber"}, {"own", "threads"}};
    const cJSON *c;
    int seen = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "cells"))
    {
        for (int k = 0; k < 3; k++) {
            if (strcmp(par_json_str(c, "cell"), want[k][0]))
                continue;
            const char *b = par_json_str(c, "backend");
            cr_expect(b && !strcmp(b, want[k][1]), "cell %s ran on %s, expected %s", want[k][0], b ? b : "(none)",
                      want[k][1]);
            seen++;
        }
    }
    cr_expect_eq(seen, 3);
    cJSON_Delete(j);
    par_remove_tree(dir);
}
