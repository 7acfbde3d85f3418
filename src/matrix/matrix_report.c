/* matrix/matrix_report.c - the matrix's output: the cell list, the
 * summary table and the Markdown / JSON reports (docs/matrix.md,
 * "Output"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "matrix/matrix-impl.h"

static void fmt_num(char *buf, size_t n, double v, const char *fmt)
{
    if (isnan(v))
        par__matrix_fmt(buf, n, "-");
    else
        par__matrix_fmt(buf, n, fmt, v);
}

static void fmt_error(const par__matrix_result *r, char *buf, size_t n)
{
    if (r->verdict == PAR_CELL_ERROR || !strcmp(r->policy, "checks") || r->verdict == PAR_CELL_PENDING)
        par__matrix_fmt(buf, n, "-");
    else if (!r->worst_tensor[0])
        par__matrix_fmt(buf, n, "%s", !strcmp(r->policy, "bitwise") ? "bitwise equal" : "exact");
    else if (!isnan(r->worst_frac))
        par__matrix_fmt(buf, n, "rel_l2 %.2e (%.3g x tol)", r->worst_rel_l2, r->worst_frac);
    else if (r->worst_ndiff > 0)
        par__matrix_fmt(buf, n, "%lld differ, max_abs %.2e", (long long)r->worst_ndiff, r->worst_max_abs);
    else
        par__matrix_fmt(buf, n, "missing/shape");
}

/* The tensor column: a failing comparison's root cause (the first
 * divergent tensor in dataflow order), else the worst entry. */
static void fmt_tensor(const par__matrix_result *r, char *buf, size_t n)
{
    if (r->root_tensor[0])
        par__matrix_fmt(buf, n, "%s %s", r->root_file, r->root_tensor);
    else if (r->worst_tensor[0])
        par__matrix_fmt(buf, n, "%s %s", r->worst_file, r->worst_tensor);
    else
        par__matrix_fmt(buf, n, "-");
}

static void fmt_ref(const par__matrix_cell *c, char *buf, size_t n)
{
    switch (c->ref) {
    case PAR_REF_SERIAL:
        par__matrix_fmt(buf, n, "serial f%d (%lld steps, seed %llu)",
                   c->row.kind == PAR_KIND_LAYOUT && c->row.precision == 32 ? 32 : 64, (long long)c->steps,
                   (unsigned long long)c->seed);
        break;
    case PAR_REF_DIR: par__matrix_fmt(buf, n, "%s", c->ref_dir); break;
    case PAR_REF_BACKEND: par__matrix_fmt(buf, n, "the same layout on %s", c->row.vs_backend); break;
    default: par__matrix_fmt(buf, n, "none (own checks)"); break;
    }
}

static const char *policy_of(const par__matrix_cell *c)
{
    return c->ref == PAR_REF_NONE ? "checks" : par_policy_name(c->policy);
}

void par_matrix_print_cells(const par_matrix *m, FILE *out)
{
    fprintf(out, "%d cells (preset %s, tier %s, seed %llu):\n", m->n, m->preset[0] ? m->preset : "any",
            par_cell_tier_name(m->o.tier), (unsigned long long)m->o.seed);
    for (int i = 0; i < m->n; i++) {
        const par__matrix_cell *c = &m->cells[i];
        char ref[PAR_MX_PATH];
        fmt_ref(c, ref, sizeof ref);
        fprintf(out, "  %2d %-18s %-8s %-24s %-44s ranks %lld, %lld steps; vs %s, policy %s\n", i + 1, c->row.name,
                c->row.preset, c->data_label, c->layout, (long long)c->ranks, (long long)c->steps, ref, policy_of(c));
    }
}

static int count_verdict(const par_matrix *m, par_cell_verdict v)
{
    int k = 0;
    for (int i = 0; i < m->n; i++)
        k += m->res[i].verdict == v;
    return k;
}

/* The table's per-cell strings. */
typedef struct {
    char err[96], tensor[260], st[32], bu[32], ec[32];
} row_text;

static void row_strings(const par__matrix_result *r, row_text *t)
{
    fmt_error(r, t->err, sizeof t->err);
    fmt_tensor(r, t->tensor, sizeof t->tensor);
    fmt_num(t->st, sizeof t->st, r->met.step_time_s, "%.4f s");
    fmt_num(t->bu, sizeof t->bu, r->met.bubble, "%.3f");
    fmt_num(t->ec, sizeof t->ec, r->met.exposed_comm_s, "%.4f s");
}

static void print_failures(const par_matrix *m, FILE *out)
{
    for (int i = 0; i < m->n; i++) {
        const par__matrix_result *r = &m->res[i];
        if (r->verdict == PAR_CELL_PASS)
            continue;
        fprintf(out, "%s %s %s: %s\n", par_cell_verdict_name(r->verdict), m->cells[i].row.name,
                m->cells[i].data_label, r->diagnosis);
        if (r->report_json[0])
            fprintf(out, "    compare report: %s\n", r->report_json);
        else if (r->dir[0])
            fprintf(out, "    kept: %s\n", r->dir);
    }
}

/* ---- per-rank memory of the scale cells -------------------------------- */

static void fmt_bytes(char *buf, size_t n, double b)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB"};
    int i = 0;
    while (b >= 1024.0 && i < 3) {
        b /= 1024.0;
        i++;
    }
    par__matrix_fmt(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

#define MEM_KINDS 5
static const char *const mem_key[MEM_KINDS] = {"weights", "gradients", "optimizer_state", "activations",
                                               "communication"};

/* One rank's accounted bytes by kind (mem_key) and their total. */
static double rank_mem(const cJSON *row, double *v)
{
    double t = 0;
    for (int k = 0; k < MEM_KINDS; k++) {
        v[k] = 0;
        par_json_num(row, mem_key[k], &v[k]);
        t += v[k];
    }
    return t;
}

/* The run's per-rank memory (`parity run --summary`'s "memory", every rank
 * in the report JSON) as one row per pipeline stage (ranks [s N/PP, (s+1)
 * N/PP), parallel/layout/groups.h): the largest of each kind over the stage's
 * ranks and the heaviest rank. */
static void print_memory(const par__matrix_cell *c, const cJSON *run, FILE *out)
{
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(run, "memory");
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(run, "layout");
    int64_t pp = 1, n = cJSON_IsArray(mem) ? cJSON_GetArraySize(mem) : 0;
    par_json_int(lay, "pipeline_model_parallel_size", &pp);
    if (n < 1 || pp < 1 || n % pp)
        return;
    fprintf(out, "\nmemory per rank, %s (world %lld, %lld stages; bytes accounted from the model and the plans, "
                 "the largest over each stage's ranks):\n", c->row.name, (long long)n, (long long)pp);
    fprintf(out, "  %-5s %-11s %11s %11s %11s %11s %11s %11s  %s\n", "stage", "ranks", "weights", "gradients",
            "optimizer", "activations", "comm", "total", "heaviest rank");
    const cJSON *row = mem->child;
    for (int64_t st = 0; st < pp; st++) {
        double hi[MEM_KINDS] = {0}, v[MEM_KINDS], top = -1;
        int64_t who = 0, r0 = st * (n / pp), r1 = r0 + n / pp;
        for (int64_t r = r0; r < r1 && row; r++, row = row->next) {
            double t = rank_mem(row, v);
            for (int k = 0; k < MEM_KINDS; k++)
                hi[k] = v[k] > hi[k] ? v[k] : hi[k];
            if (t > top) {
                top = t;
                who = r;
            }
        }
        char b[MEM_KINDS + 1][24], rg[32];
        for (int k = 0; k < MEM_KINDS; k++)
            fmt_bytes(b[k], sizeof b[k], hi[k]);
        fmt_bytes(b[MEM_KINDS], sizeof b[MEM_KINDS], top);
        par__matrix_fmt(rg, sizeof rg, "%lld-%lld", (long long)r0, (long long)(r1 - 1));
        fprintf(out, "  %-5lld %-11s %11s %11s %11s %11s %11s %11s  %lld\n", (long long)st, rg, b[0], b[1], b[2],
                b[3], b[4], b[5], (long long)who);
    }
}

/* Which backend the layout cells ran on, and why (the first cell's reason
 * per backend: the cell's own, --backend, or the default rule's). */
static void print_backends(const par_matrix *m, FILE *out)
{
    for (int i = 0; i < m->n; i++) {
        const char *b = m->res[i].backend;
        int first = b[0] != 0, cnt = 0;
        for (int j = 0; j < i && first; j++)
            first = strcmp(m->res[j].backend, b) != 0;
        if (!first)
            continue;
        for (int j = i; j < m->n; j++)
            cnt += !strcmp(m->res[j].backend, b);
        fprintf(out, "backend %s: %d layout cell%s (first %s: %s)\n", b, cnt, cnt == 1 ? "" : "s", m->cells[i].row.name,
                m->res[i].backend_why);
    }
}

void par_matrix_print_table(const par_matrix *m, FILE *out)
{
    fprintf(out, "\nparity matrix: preset %s, tier %s, backend %s, seed %llu, BLAS core %s\n",
            m->preset[0] ? m->preset : "any", par_cell_tier_name(m->o.tier), m->backend, (unsigned long long)m->o.seed,
            m->blas_core);
    fprintf(out, "%-18s %-22s %-36s %5s %-6s %-8s %-52s %-28s %9s %6s %8s %8s\n", "cell", "data", "layout", "ranks",
            "result", "policy", "tensor (root cause / worst)", "error", "step(emu)", "bubble", "exp.comm", "wall");
    for (int i = 0; i < m->n; i++) {
        const par__matrix_cell *c = &m->cells[i];
        const par__matrix_result *r = &m->res[i];
        row_text t;
        row_strings(r, &t);
        fprintf(out, "%-18s %-22s %-36s %5lld %-6s %-8s %-52s %-28s %9s %6s %8s %6.2f s\n", c->row.name,
                c->data_label, c->layout, (long long)c->ranks, par_cell_verdict_name(r->verdict),
                r->policy[0] ? r->policy : "-", t.tensor, t.err, t.st, t.bu, t.ec, r->wall_s);
    }
    int np = count_verdict(m, PAR_CELL_PASS), nw = count_verdict(m, PAR_CELL_WARN);
    fprintf(out, "%d cells: %d passed, %d failed", m->n, np, m->n - np - nw);
    if (nw)
        fprintf(out, ", %d informational over policy", nw);
    fprintf(out, " (%.1f s); results in %s\n", m->wall_s, m->out_dir);
    print_backends(m, out);
    if (m->baseline_diff)
        par__matrix_baseline_print(m->baseline_diff, out);
    for (int i = 0; i < m->n; i++)
        if (m->cells[i].row.tier == PAR_CELL_TIER_SCALE && m->res[i].run)
            print_memory(&m->cells[i], m->res[i].run, out);
    print_failures(m, out);
}

/* ---- Markdown ---------------------------------------------------------- */

/* A growing text buffer. */
typedef struct {
    char *buf;
    size_t cap, len;
} mdbuf;

static void emit(mdbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(mdbuf *b, const char *fmt, ...)
{
    if (!b->buf || b->len + 1 >= b->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (k > 0)
        b->len += (size_t)k < b->cap - b->len ? (size_t)k : b->cap - b->len - 1;
}

/* Markdown table cells must not contain '|'. */
static void md_safe(char *s)
{
    for (; *s; s++)
        if (*s == '|')
            *s = '/';
}

static void md_table(const par_matrix *m, mdbuf *b)
{
    emit(b, "| cell | data | layout | ranks | result | policy | tensor (root cause / worst) | error | emulated step | "
            "bubble | exposed comm | wall |\n");
    emit(b, "|---|---|---|---:|---|---|---|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < m->n; i++) {
        const par__matrix_cell *c = &m->cells[i];
        const par__matrix_result *r = &m->res[i];
        row_text t;
        row_strings(r, &t);
        char lay[sizeof c->layout];
        par__matrix_fmt(lay, sizeof lay, "%s", c->layout);
        md_safe(t.tensor);
        md_safe(lay);
        emit(b, "| %s | %s | %s | %lld | %s | %s | `%s` | %s | %s | %s | %s | %.2f s |\n", c->row.name, c->data_label,
             lay, (long long)c->ranks, par_cell_verdict_name(r->verdict), r->policy[0] ? r->policy : "-", t.tensor,
             t.err, t.st, t.bu, t.ec, r->wall_s);
    }
}

static par_status write_md(const par_matrix *m, const char *path)
{
    mdbuf b = {par_malloc(4096 + (size_t)m->n * 3072, PAR_TAG_IO), 4096 + (size_t)m->n * 3072, 0};
    if (!b.buf)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    int np = count_verdict(m, PAR_CELL_PASS), nw = count_verdict(m, PAR_CELL_WARN);
    emit(&b, "# parity matrix\n\n");
    emit(&b, "preset `%s`%s, tier `%s`, backend `%s`, seed %llu, BLAS core `%s`; results in `%s`.\n\n",
         m->preset[0] ? m->preset : "any", m->o.quick ? " (--quick)" : "", par_cell_tier_name(m->o.tier), m->backend,
         (unsigned long long)m->o.seed, m->blas_core, m->out_dir);
    emit(&b, "**%d cells: %d passed, %d failed", m->n, np, m->n - np - nw);
    if (nw)
        emit(&b, ", %d informational over policy", nw);
    emit(&b, "** (%.1f s)\n\n", m->wall_s);
    md_table(m, &b);
    if (np < m->n) {
        emit(&b, "\n## Failing and informational cells\n\n");
        for (int i = 0; i < m->n; i++) {
            const par__matrix_result *r = &m->res[i];
            if (r->verdict == PAR_CELL_PASS)
                continue;
            emit(&b, "- **%s %s** (%s): %s", m->cells[i].row.name, m->cells[i].data_label,
                 par_cell_verdict_name(r->verdict), r->diagnosis);
            if (r->report_json[0])
                emit(&b, " Compare report: `%s`.", r->report_json);
            emit(&b, "\n");
        }
    }
    emit(&b, "\n## Cells\n\n");
    for (int i = 0; i < m->n; i++) {
        const par__matrix_cell *c = &m->cells[i];
        char ref[PAR_MX_PATH];
        fmt_ref(c, ref, sizeof ref);
        emit(&b, "- `%s` (%s, %s) on `%s`: %lld steps, seed %llu, vs %s; %s\n", c->row.name, c->row.preset,
             par_cell_tier_name(c->row.tier), c->data_label, (long long)c->steps, (unsigned long long)c->seed, ref,
             c->note);
    }
    par_status s = par_file_write_atomic(path, b.buf, b.len);
    par_free(b.buf);
    return s;
}

/* ---- JSON -------------------------------------------------------------- */

static cJSON *num_or_null(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static void json_worst(cJSON *o, const par__matrix_result *r)
{
    if (!r->worst_tensor[0]) {
        cJSON_AddNullToObject(o, "worst");
        return;
    }
    cJSON *w = cJSON_AddObjectToObject(o, "worst");
    if (!w)
        return;
    cJSON_AddStringToObject(w, "file", r->worst_file);
    cJSON_AddStringToObject(w, "tensor", r->worst_tensor);
    cJSON_AddStringToObject(w, "mode", r->worst_mode);
    cJSON_AddItemToObject(w, "rel_l2", num_or_null(r->worst_rel_l2));
    cJSON_AddItemToObject(w, "max_abs", num_or_null(r->worst_max_abs));
    cJSON_AddItemToObject(w, "fraction_of_tolerance", num_or_null(r->worst_frac));
    cJSON_AddNumberToObject(w, "n_diff", (double)r->worst_ndiff);
}

static void json_root(cJSON *o, const par__matrix_result *r)
{
    if (!r->root_tensor[0]) {
        cJSON_AddNullToObject(o, "root_cause");
        return;
    }
    cJSON *w = cJSON_AddObjectToObject(o, "root_cause");
    if (!w)
        return;
    cJSON_AddStringToObject(w, "file", r->root_file);
    cJSON_AddStringToObject(w, "tensor", r->root_tensor);
    cJSON_AddStringToObject(w, "where", r->root_where);
    cJSON_AddNumberToObject(w, "integer_consequences", r->n_consequences);
}

static void json_ref(cJSON *o, const par__matrix_cell *c)
{
    cJSON_AddStringToObject(o, "reference",
                            c->ref == PAR_REF_SERIAL ? (c->row.kind == PAR_KIND_LAYOUT && c->row.precision == 32
                                                            ? "serial-f32"
                                                            : "serial-f64")
                            : c->ref == PAR_REF_DIR     ? c->ref_dir
                            : c->ref == PAR_REF_BACKEND ? c->row.vs_backend
                                                        : "none");
}

static cJSON *cell_json(const par__matrix_cell *c, const par__matrix_result *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "cell", c->row.name);
    cJSON_AddStringToObject(o, "preset", c->row.preset);
    cJSON_AddStringToObject(o, "kind", par_cell_kind_name(c->row.kind));
    cJSON_AddStringToObject(o, "tier", par_cell_tier_name(c->row.tier));
    cJSON_AddStringToObject(o, "fixture", c->fixture[0] ? c->fixture : "");
    cJSON_AddStringToObject(o, "data", c->data_label);
    cJSON_AddStringToObject(o, "layout", c->layout);
    cJSON_AddStringToObject(o, "cell_backend", c->row.backend); /* "": the matrix's */
    if (r->backend[0]) { /* the backend its layout run ran on, and why that one */
        cJSON_AddStringToObject(o, "backend", r->backend);
        cJSON_AddStringToObject(o, "backend_why", r->backend_why);
    } else {
        cJSON_AddNullToObject(o, "backend");
    }
    cJSON_AddNumberToObject(o, "ranks", (double)c->ranks);
    cJSON_AddNumberToObject(o, "steps", (double)c->steps);
    cJSON_AddNumberToObject(o, "seed", (double)c->seed);
    json_ref(o, c);
    cJSON_AddStringToObject(o, "policy", r->policy[0] ? r->policy : "-");
    cJSON_AddStringToObject(o, "note", c->note);
    cJSON_AddStringToObject(o, "result", par_cell_verdict_name(r->verdict));
    cJSON_AddBoolToObject(o, "informational", c->row.informational);
    cJSON_AddNumberToObject(o, "entries", r->n_entries);
    cJSON_AddNumberToObject(o, "failed_entries", r->n_failed);
    json_worst(o, r);
    json_root(o, r);
    cJSON_AddStringToObject(o, "diagnosis", r->diagnosis);
    cJSON_AddItemToObject(o, "emulated_step_s", num_or_null(r->met.step_time_s));
    cJSON_AddItemToObject(o, "bubble", num_or_null(r->met.bubble));
    cJSON_AddItemToObject(o, "exposed_comm_s", num_or_null(r->met.exposed_comm_s));
    cJSON_AddItemToObject(o, "run", r->run ? cJSON_Duplicate(r->run, 1) : cJSON_CreateNull());
    cJSON_AddNumberToObject(o, "wall_s", r->wall_s);
    if (r->report_json[0])
        cJSON_AddStringToObject(o, "compare_report", r->report_json);
    else
        cJSON_AddNullToObject(o, "compare_report");
    if (r->dir[0])
        cJSON_AddStringToObject(o, "kept", r->dir);
    return o;
}

cJSON *par__matrix_report_json(const par_matrix *m)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    int np = count_verdict(m, PAR_CELL_PASS), nw = count_verdict(m, PAR_CELL_WARN);
    cJSON_AddStringToObject(root, "format", "parity-matrix");
    cJSON_AddNumberToObject(root, "version", 2);
    cJSON_AddStringToObject(root, "preset", m->preset[0] ? m->preset : "any");
    cJSON_AddStringToObject(root, "tier", par_cell_tier_name(m->o.tier));
    cJSON_AddBoolToObject(root, "quick", m->o.quick);
    cJSON_AddStringToObject(root, "backend", m->backend);
    cJSON_AddNumberToObject(root, "seed", (double)m->o.seed);
    if (m->o.bitwise) /* the tolerance mode's report stays as it was */
        cJSON_AddBoolToObject(root, "bitwise", 1);
    cJSON_AddStringToObject(root, "blas_core", m->blas_core);
    cJSON_AddStringToObject(root, "out_dir", m->out_dir);
    cJSON_AddNumberToObject(root, "wall_s", m->wall_s);
    cJSON_AddNumberToObject(root, "cells_total", m->n);
    cJSON_AddNumberToObject(root, "passed", np);
    cJSON_AddNumberToObject(root, "failed", m->n - np - nw);
    cJSON_AddNumberToObject(root, "informational_over_policy", nw);
    cJSON_AddBoolToObject(root, "ok", np + nw == m->n && m->ran);
    cJSON *cells = cJSON_AddArrayToObject(root, "cells");
    for (int i = 0; cells && i < m->n; i++) {
        cJSON *o = cell_json(&m->cells[i], &m->res[i]);
        if (!o)
            break;
        cJSON_AddItemToArray(cells, o);
    }
    if (m->baseline_diff)
        cJSON_AddItemToObject(root, "baseline", cJSON_Duplicate(m->baseline_diff, 1));
    return root;
}

static par_status write_json(const par_matrix *m, const char *path)
{
    cJSON *root = par__matrix_report_json(m);
    if (!root)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    par_status s = par_json_write_file(path, root);
    cJSON_Delete(root);
    return s;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

par_status par_matrix_write_report(const par_matrix *m, const char *path)
{
    if (has_suffix(path, ".json"))
        return write_json(m, path);
    if (has_suffix(path, ".md"))
        return write_md(m, path);
    if (has_suffix(path, ".xml"))
        return par__matrix_write_junit(m, path);
    return par_err(PAR_EINVAL, "matrix: report '%s' must end in .md (Markdown), .json or .xml (JUnit)", path);
}
