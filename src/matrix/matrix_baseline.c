/* matrix/matrix_baseline.c - a run against an earlier one (`parity matrix
 * --baseline OLD/report.json`, issue 33 item 6): both sides as the report's
 * JSON (matrix_report.c builds this run's), cells matched by (cell, data):
 *   verdict_changed  "result" differs;
 *   numbers_changed  the comparison's figures are not the same bits: the
 *                    entry counts, or the worst entry's tensor, rel L2, max
 *                    abs or differing elements (a bitwise-equal cell stays
 *                    bitwise equal only if none moved);
 *   figures_moved    emulated step time, bubble, exposed communication or
 *                    the largest rank's memory (the run summary's per-rank
 *                    kinds summed) moved by more than the margin (relative);
 *   new_cells, gone_cells  on one side only.
 * Informational: a changed verdict already fails the run by itself. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "matrix/matrix-impl.h"

static const cJSON *cells_of(const cJSON *report) { return cJSON_GetObjectItemCaseSensitive(report, "cells"); }

static const char *str_of(const cJSON *o, const char *k)
{
    const char *s = par_json_str(o, k);
    return s ? s : "";
}

/* The cell of `cells` with the same (cell, data) as c, or NULL. */
static const cJSON *find_cell(const cJSON *cells, const cJSON *c)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, cells)
    {
        if (!strcmp(str_of(x, "cell"), str_of(c, "cell")) && !strcmp(str_of(x, "data"), str_of(c, "data")))
            return x;
    }
    return NULL;
}

/* A number of o (NAN when absent or null). */
static double num_of(const cJSON *o, const char *k)
{
    double v = NAN;
    return o && par_json_num(o, k, &v) ? v : NAN;
}

/* The largest rank's memory in bytes (the run summary's kinds summed; NAN without a run). */
static double rank_memory(const cJSON *c)
{
    static const char *const kind[] = {"weights", "gradients", "optimizer_state", "activations", "communication"};
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(c, "run");
    const cJSON *mem = run ? cJSON_GetObjectItemCaseSensitive(run, "memory") : NULL, *r;
    double best = NAN;
    cJSON_ArrayForEach(r, mem)
    {
        double t = 0;
        for (int k = 0; k < 5; k++)
            t += isnan(num_of(r, kind[k])) ? 0 : num_of(r, kind[k]);
        best = isnan(best) || t > best ? t : best;
    }
    return best;
}

static int same_num(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* What moved in the comparison's figures, "" when nothing (its bits agree). */
static void numbers_moved(const cJSON *o, const cJSON *n, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = 0;
    static const char *const top[] = {"entries", "failed_entries"};
    for (int i = 0; i < 2; i++)
        if (!same_num(num_of(o, top[i]), num_of(n, top[i])))
            k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%s%s %g -> %g", k ? "; " : "", top[i],
                                  num_of(o, top[i]), num_of(n, top[i]));
    const cJSON *wo = cJSON_GetObjectItemCaseSensitive(o, "worst"), *wn = cJSON_GetObjectItemCaseSensitive(n, "worst");
    if (k < len && strcmp(str_of(wo, "tensor"), str_of(wn, "tensor")))
        k += (size_t)snprintf(buf + k, len - k, "%sworst tensor %s -> %s", k ? "; " : "", str_of(wo, "tensor"),
                              str_of(wn, "tensor"));
    static const char *const w[] = {"rel_l2", "max_abs", "n_diff"};
    for (int i = 0; i < 3 && k < len; i++)
        if (!same_num(num_of(wo, w[i]), num_of(wn, w[i])))
            k += (size_t)snprintf(buf + k, len - k, "%sworst %s %.6g -> %.6g", k ? "; " : "", w[i], num_of(wo, w[i]),
                                  num_of(wn, w[i]));
}

static cJSON *named(const cJSON *c)
{
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddStringToObject(o, "cell", str_of(c, "cell"));
        cJSON_AddStringToObject(o, "data", str_of(c, "data"));
    }
    return o;
}

/* The figures of one matched cell beyond the margin into `moved`. */
static void figures_moved(const cJSON *o, const cJSON *n, double margin, cJSON *moved)
{
    static const char *const fig[] = {"emulated_step_s", "bubble", "exposed_comm_s", "rank_memory_bytes"};
    for (int i = 0; i < 4; i++) {
        double a = i < 3 ? num_of(o, fig[i]) : rank_memory(o), b = i < 3 ? num_of(n, fig[i]) : rank_memory(n);
        if (isnan(a) || isnan(b) || a == b)
            continue;
        double rel = a != 0 ? (b - a) / fabs(a) : INFINITY;
        if (fabs(rel) <= margin)
            continue;
        cJSON *x = named(n);
        if (!x)
            return;
        cJSON_AddStringToObject(x, "figure", fig[i]);
        cJSON_AddNumberToObject(x, "old", a);
        cJSON_AddNumberToObject(x, "new", b);
        if (isfinite(rel))
            cJSON_AddNumberToObject(x, "change_pct", 100 * rel);
        else
            cJSON_AddNullToObject(x, "change_pct");
        cJSON_AddItemToArray(moved, x);
    }
}

/* One matched cell into the diff's arrays. */
static void diff_cell(const cJSON *o, const cJSON *n, double margin, cJSON *d)
{
    if (strcmp(str_of(o, "result"), str_of(n, "result"))) {
        cJSON *x = named(n);
        if (x) {
            cJSON_AddStringToObject(x, "old", str_of(o, "result"));
            cJSON_AddStringToObject(x, "new", str_of(n, "result"));
            cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(d, "verdict_changed"), x);
        }
    }
    char what[600];
    numbers_moved(o, n, what, sizeof what);
    if (what[0]) {
        cJSON *x = named(n);
        if (x) {
            cJSON_AddStringToObject(x, "what", what);
            cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(d, "numbers_changed"), x);
        }
    }
    figures_moved(o, n, margin, cJSON_GetObjectItemCaseSensitive(d, "figures_moved"));
}

cJSON *par__matrix_baseline_diff(const cJSON *old, const cJSON *cur, const char *path, double margin)
{
    cJSON *d = cJSON_CreateObject();
    if (!d)
        return NULL;
    cJSON_AddStringToObject(d, "baseline", path);
    cJSON_AddNumberToObject(d, "margin_pct", 100 * margin);
    static const char *const arr[] = {"verdict_changed", "numbers_changed", "figures_moved", "new_cells", "gone_cells"};
    for (int i = 0; i < 5; i++)
        cJSON_AddArrayToObject(d, arr[i]);
    int matched = 0;
    const cJSON *c, *oc = cells_of(old), *nc = cells_of(cur);
    cJSON_ArrayForEach(c, nc)
    {
        const cJSON *o = find_cell(oc, c);
        if (o)
            diff_cell(o, c, margin, d), matched++;
        else
            cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(d, "new_cells"), named(c));
    }
    cJSON_ArrayForEach(c, oc)
    {
        if (!find_cell(nc, c))
            cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(d, "gone_cells"), named(c));
    }
    cJSON_AddNumberToObject(d, "cells_compared", matched);
    return d;
}

/* "cell (data)" lines of one array of the diff, each with its detail. */
static void print_list(FILE *out, const cJSON *d, const char *key, const char *title)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(d, key), *x;
    int n = cJSON_GetArraySize(a);
    fprintf(out, "  %s: %d\n", title, n);
    cJSON_ArrayForEach(x, a)
    {
        fprintf(out, "    %s (%s)", str_of(x, "cell"), str_of(x, "data"));
        if (!strcmp(key, "verdict_changed"))
            fprintf(out, ": %s -> %s", str_of(x, "old"), str_of(x, "new"));
        else if (!strcmp(key, "numbers_changed"))
            fprintf(out, ": %s", str_of(x, "what"));
        else if (!strcmp(key, "figures_moved"))
            fprintf(out, ": %s %.6g -> %.6g (%+.1f %%)", str_of(x, "figure"), num_of(x, "old"), num_of(x, "new"),
                    num_of(x, "change_pct"));
        fputc('\n', out);
    }
}

void par__matrix_baseline_print(const cJSON *d, FILE *out)
{
    fprintf(out, "baseline %s: %g cells compared (margin %g %%)\n", str_of(d, "baseline"), num_of(d, "cells_compared"),
            num_of(d, "margin_pct"));
    print_list(out, d, "verdict_changed", "verdict changed");
    print_list(out, d, "numbers_changed", "comparison figures changed (not the same bits)");
    print_list(out, d, "figures_moved", "emulated step / bubble / exposed comm / rank memory beyond the margin");
    print_list(out, d, "new_cells", "cells not in the baseline");
    print_list(out, d, "gone_cells", "baseline cells not run now");
}

/* The line of one cell for a JUnit testcase's output ("" when nothing changed). */
void par__matrix_baseline_cell(const cJSON *d, const char *cell, const char *data, char *buf, size_t n)
{
    static const char *const key[] = {"verdict_changed", "numbers_changed", "figures_moved"};
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < 3 && k < n; i++) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(d, key[i]))
        {
            if (k >= n || strcmp(str_of(x, "cell"), cell) || strcmp(str_of(x, "data"), data))
                continue;
            if (i == 0)
                k += (size_t)snprintf(buf + k, n - k, "baseline: verdict %s -> %s\n", str_of(x, "old"), str_of(x, "new"));
            else if (i == 1)
                k += (size_t)snprintf(buf + k, n - k, "baseline: %s\n", str_of(x, "what"));
            else
                k += (size_t)snprintf(buf + k, n - k, "baseline: %s %.6g -> %.6g (%+.1f %%)\n", str_of(x, "figure"),
                                      num_of(x, "old"), num_of(x, "new"), num_of(x, "change_pct"));
        }
    }
}

par_status par_matrix_set_baseline(par_matrix *m, const char *path, double margin_pct)
{
    if (!(margin_pct >= 0) || !isfinite(margin_pct))
        return par_err(PAR_EINVAL, "--baseline-margin %g: expected a percentage >= 0", margin_pct);
    cJSON *j = NULL;
    par_status s = par_json_read_file(path, &j);
    if (s)
        return s;
    const char *fmt = par_json_str(j, "format");
    if (!fmt || strcmp(fmt, "parity-matrix") || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "cells"))) {
        cJSON_Delete(j);
        return par_err(PAR_EFORMAT, "--baseline %s: not a matrix report (\"format\": \"parity-matrix\" with "
                       "\"cells\"; a run's OUT/report.json or --report FILE.json)", path);
    }
    cJSON_Delete(m->baseline_old);
    m->baseline_old = j;
    m->baseline_margin = margin_pct / 100;
    par__matrix_fmt(m->baseline_path, sizeof m->baseline_path, "%s", path);
    return PAR_OK;
}

par_status par_matrix_compare_baseline(par_matrix *m)
{
    if (!m->baseline_old)
        return PAR_OK;
    cJSON *cur = par__matrix_report_json(m);
    cJSON *d = cur ? par__matrix_baseline_diff(m->baseline_old, cur, m->baseline_path, m->baseline_margin) : NULL;
    cJSON_Delete(cur);
    if (!d)
        return par_err(PAR_ENOMEM, "matrix: out of memory comparing with the baseline");
    cJSON_Delete(m->baseline_diff);
    m->baseline_diff = d;
    return PAR_OK;
}
