/* matrix/matrix_junit.c - `parity matrix --report FILE.xml`: the run as
 * JUnit XML, the format Jenkins, GitLab CI and similar read (issue 33 item
 * 6; docs/matrix.md "CI systems: JUnit XML").  One <testsuite> of one
 * <testcase> per cell: classname parity.matrix.<preset>.<kind>, name
 * "<cell> (<data>)", time = the cell's wall seconds; FAIL is a <failure>,
 * ERROR an <error>, a cell not run <skipped>, each with the diagnosis as its
 * message; PASS and WARN (informational over policy) pass; every testcase's
 * <system-out> holds its layout, ranks, backend, policy, worst entry, the
 * emulated figures and, with --baseline, what changed.
 * tests/cli/junit.xsd is the schema it is checked against. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "matrix/matrix-impl.h"

/* s as XML character data or an attribute value: & < > " ' escaped, the
 * control characters XML 1.0 forbids as '?'. */
static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(c < 0x20 && c != '\t' && c != '\n' && c != '\r' ? '?' : c, f);
        }
    }
}

static int count(const par_matrix *m, par_cell_verdict v)
{
    int n = 0;
    for (int i = 0; i < m->n; i++)
        n += m->res[i].verdict == v;
    return n;
}

static void property(FILE *f, const char *name, const char *value)
{
    fputs("      <property name=\"", f);
    esc(f, name);
    fputs("\" value=\"", f);
    esc(f, value);
    fputs("\"/>\n", f);
}

static void suite_open(FILE *f, const par_matrix *m)
{
    char ts[32] = "", host[128] = "localhost", seed[32];
    time_t now = time(NULL);
    struct tm tmv;
    if (gmtime_r(&now, &tmv))
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tmv);
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    int nf = count(m, PAR_CELL_FAIL), ne = count(m, PAR_CELL_ERROR), ns = count(m, PAR_CELL_PENDING);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<testsuites name=\"parity matrix\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" "
               "time=\"%.3f\">\n", m->n, nf, ne, ns, m->wall_s);
    fprintf(f, "  <testsuite name=\"parity-matrix.");
    esc(f, m->preset[0] ? m->preset : "any");
    fprintf(f, ".%s\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.3f\" timestamp=\"%s\" "
               "hostname=\"", par_cell_tier_name(m->o.tier), m->n, nf, ne, ns, m->wall_s, ts);
    esc(f, host);
    fputs("\">\n    <properties>\n", f);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)m->o.seed);
    property(f, "preset", m->preset[0] ? m->preset : "any");
    property(f, "tier", par_cell_tier_name(m->o.tier));
    property(f, "backend", m->backend);
    property(f, "seed", seed);
    property(f, "blas_core", m->blas_core);
    property(f, "out_dir", m->out_dir);
    if (m->baseline_diff)
        property(f, "baseline", m->baseline_path);
    fputs("    </properties>\n", f);
}

static void num(FILE *f, const char *what, double v, const char *unit)
{
    if (isfinite(v))
        fprintf(f, "; %s %.6g%s", what, v, unit);
}

/* The testcase's <system-out>: what the cell ran and measured. */
static void case_out(FILE *f, const par_matrix *m, const par__matrix_cell *c, const par__matrix_result *r)
{
    fputs("      <system-out>", f);
    fprintf(f, "%s cell, layout ", par_cell_kind_name(c->row.kind));
    esc(f, c->layout);
    fprintf(f, ", %lld ranks", (long long)c->ranks);
    if (r->backend[0]) {
        fprintf(f, ", backend %s (", r->backend);
        esc(f, r->backend_why);
        fputc(')', f);
    }
    fprintf(f, "; policy %s, %d entries, %d failed", r->policy[0] ? r->policy : "-", r->n_entries, r->n_failed);
    if (r->worst_tensor[0]) {
        fputs("; worst ", f);
        esc(f, r->worst_file);
        fputc(' ', f);
        esc(f, r->worst_tensor);
        num(f, "rel L2", r->worst_rel_l2, "");
    }
    num(f, "emulated step", r->met.step_time_s, " s");
    num(f, "bubble", r->met.bubble, "");
    num(f, "exposed comm", r->met.exposed_comm_s, " s");
    if (r->verdict == PAR_CELL_WARN) {
        fputs("\ninformational, over its policy: ", f);
        esc(f, r->diagnosis);
    }
    char bl[1200];
    if (m->baseline_diff) {
        par__matrix_baseline_cell(m->baseline_diff, c->row.name, c->data_label, bl, sizeof bl);
        if (bl[0]) {
            fputc('\n', f);
            esc(f, bl);
        }
    }
    fputs("</system-out>\n", f);
}

static void testcase(FILE *f, const par_matrix *m, int i)
{
    const par__matrix_cell *c = &m->cells[i];
    const par__matrix_result *r = &m->res[i];
    fputs("    <testcase name=\"", f);
    esc(f, c->row.name);
    fputs(" (", f);
    esc(f, c->data_label);
    fputs(")\" classname=\"parity.matrix.", f);
    esc(f, c->row.preset);
    fprintf(f, ".%s\" time=\"%.3f\">\n", par_cell_kind_name(c->row.kind), r->wall_s);
    static const char *const tag[] = {[PAR_CELL_FAIL] = "failure", [PAR_CELL_ERROR] = "error",
                                      [PAR_CELL_PENDING] = "skipped"};
    if (r->verdict == PAR_CELL_FAIL || r->verdict == PAR_CELL_ERROR || r->verdict == PAR_CELL_PENDING) {
        const char *msg = r->diagnosis[0] ? r->diagnosis : r->verdict == PAR_CELL_PENDING ? "not run" : c->error;
        fprintf(f, "      <%s message=\"", tag[r->verdict]);
        esc(f, msg);
        if (r->verdict == PAR_CELL_PENDING) {
            fputs("\"/>\n", f);
        } else {
            fprintf(f, "\" type=\"%s\">", par_cell_verdict_name(r->verdict));
            esc(f, msg);
            if (r->report_json[0]) {
                fputs("\ncompare report: ", f);
                esc(f, r->report_json);
            }
            fprintf(f, "</%s>\n", tag[r->verdict]);
        }
    }
    case_out(f, m, c, r);
    fputs("    </testcase>\n", f);
}

par_status par__matrix_write_junit(const par_matrix *m, const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return par_err(PAR_ENOMEM, "matrix: out of memory for the JUnit report");
    suite_open(f, m);
    for (int i = 0; i < m->n; i++)
        testcase(f, m, i);
    fputs("  </testsuite>\n</testsuites>\n", f);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return par_err(PAR_ENOMEM, "matrix: out of memory for the JUnit report");
    }
    par_status s = par_file_write_atomic(path, buf, len);
    free(buf);
    return s;
}
