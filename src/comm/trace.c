/* comm/trace.c - Chrome trace JSON and the per-rank text summary. */
#include "comm/trace.h"

#include <stdarg.h>
#include <string.h>

#include "core/fileio.h"

/* ---- a buffered atomic writer --------------------------------------------- */

typedef struct {
    par_afile *f;
    char buf[1 << 16];
    size_t used;
    par_status st;
} wbuf;

static void flush(wbuf *w)
{
    if (w->st == PAR_OK && w->used)
        w->st = par_afile_write(w->f, w->buf, w->used);
    w->used = 0;
}

__attribute__((format(printf, 2, 3))) static void out(wbuf *w, const char *fmt, ...)
{
    if (w->st != PAR_OK)
        return;
    if (sizeof w->buf - w->used < 1024)
        flush(w);
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(w->buf + w->used, sizeof w->buf - w->used, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof w->buf - w->used) {
        w->st = par_err(PAR_EINTERNAL, "trace: an event longer than %zu bytes",
                        sizeof w->buf - w->used);
        return;
    }
    w->used += (size_t)k;
}

/* A JSON string body (quotes, backslashes and control characters escaped). */
static void json_escape(const char *s, char *dst, size_t n)
{
    size_t o = 0;
    for (; *s && o + 7 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(dst + o, n - o, "\\u%04x", ch);
        } else {
            dst[o++] = (char)ch;
        }
    }
    dst[o] = '\0';
}

static const char *const track_names[3] = {"compute", "comm", "p2p in flight"};

static int track_of(par_spankind k)
{
    switch (k) {
    case PAR_SPAN_COMPUTE: return 0;
    case PAR_SPAN_XFER: return 2;
    default: return 1;
    }
}

par_status par_trace_write_chrome(const par_netrun *r, const char *path)
{
    if (!r || !path)
        return par_err(PAR_EINVAL, "trace: a collector and a path are required");
    int n = par_netrun_nranks(r);
    size_t nspans, lost;
    wbuf *w = par_calloc(1, sizeof *w, PAR_TAG_IO);
    if (!w)
        return par_err(PAR_ENOMEM, "trace %s: no memory", path);
    par_status st = par_afile_open(path, &w->f);
    if (st != PAR_OK)
        goto fail_free_buf;

    char desc[300], esc[400];
    par_netmodel_describe(par_netrun_model(r), desc, sizeof desc);
    json_escape(desc, esc, sizeof esc);
    out(w, "{\"displayTimeUnit\": \"ns\",\n \"otherData\": {\"generator\": \"parity\", \"network\": \"%s\"},\n"
           " \"traceEvents\": [\n", esc);
    int first = 1;
#define SEP (first ? (first = 0, "  ") : ",\n  ")
    for (int rank = 0; rank < n; rank++) {
        out(w, "%s{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"name\": \"rank %d\"}}", SEP, rank, rank);
        out(w, ",\n  {\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": %d, "
               "\"tid\": 0, \"args\": {\"sort_index\": %d}}", rank, rank);
        for (int t = 0; t < 3; t++)
            out(w, ",\n  {\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, "
                   "\"args\": {\"name\": \"%s\"}}", rank, t, track_names[t]);
        const par_span *sp = par_netrun_spans(r, rank, &nspans, &lost);
        for (size_t i = 0; i < nspans; i++) {
            const par_span *s = &sp[i];
            double ts = s->t0 * 1e6, dur = (s->t1 - s->t0) * 1e6;
            int tid = track_of(s->kind);
            if (s->kind == PAR_SPAN_COMPUTE) {
                out(w, ",\n  {\"name\": \"compute\", \"cat\": \"compute\", \"ph\": \"X\", "
                       "\"ts\": %.6f, \"dur\": %.6f, \"pid\": %d, \"tid\": %d, "
                       "\"args\": {\"flops\": %llu, \"bytes\": %llu}}",
                    ts, dur, rank, tid, (unsigned long long)s->flops,
                    (unsigned long long)s->bytes);
                continue;
            }
            json_escape(s->group, esc, sizeof esc);
            out(w, ",\n  {\"name\": \"%s%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.6f, "
                   "\"dur\": %.6f, \"pid\": %d, \"tid\": %d, \"args\": {\"bytes\": %llu, "
                   "\"tier\": \"%s\", \"group\": \"%s\", \"step\": %d}}",
                s->kind == PAR_SPAN_IDLE ? "wait " : "", s->op,
                s->kind == PAR_SPAN_IDLE ? "idle" : s->kind == PAR_SPAN_XFER ? "p2p" : "comm",
                ts, dur, rank, tid, (unsigned long long)s->bytes, par_tier_name(s->tier), esc,
                s->phase);
        }
        if (lost)
            out(w, ",\n  {\"ph\": \"i\", \"name\": \"%zu spans lost (out of memory)\", "
                   "\"s\": \"p\", \"ts\": 0, \"pid\": %d, \"tid\": 0}", lost, rank);
    }
#undef SEP
    out(w, "\n]}\n");
    flush(w);
    st = w->st;
    if (st != PAR_OK) {
        par_afile_abort(w->f);
        goto fail_free_buf;
    }
    st = par_afile_commit(w->f);

fail_free_buf:
    par_free(w);
    return st;
}

/* ---- the text summary ----------------------------------------------------- */

static void row(FILE *f, const char *label, double total, double comp, double comm, double idle,
                double nv, double ib)
{
    fprintf(f, "%-8s %11.3f %11.3f %11.3f %11.3f %12.3f %12.3f\n", label, total * 1e3,
            comp * 1e3, comm * 1e3, idle * 1e3, nv / 1e6, ib / 1e6);
}

void par_trace_summary(const par_netrun *r, FILE *f, int max_rows)
{
    if (!r || !f)
        return;
    int n = par_netrun_nranks(r);
    char desc[300];
    par_netmodel_describe(par_netrun_model(r), desc, sizeof desc);
    fprintf(f, "emulated network %s\n", desc);
    fprintf(f, "%-8s %11s %11s %11s %11s %12s %12s\n", "rank", "total ms", "compute ms",
            "comm ms", "idle ms", "nvlink MB", "ib MB");
    double mn[6], mx[6], sum[6] = {0};
    for (int i = 0; i < n; i++) {
        const par_rankstats *s = par_netrun_stats(r, i);
        double v[6] = {s->total_s, s->compute_s, s->comm_s, s->idle_s,
                       (double)s->bytes[PAR_TIER_NVLINK], (double)s->bytes[PAR_TIER_IB]};
        for (int k = 0; k < 6; k++) {
            if (i == 0 || v[k] < mn[k])
                mn[k] = v[k];
            if (i == 0 || v[k] > mx[k])
                mx[k] = v[k];
            sum[k] += v[k];
        }
        int show = max_rows <= 0 || n <= max_rows || i < max_rows / 2 || i >= n - max_rows / 2;
        if (show) {
            char lab[16];
            snprintf(lab, sizeof lab, "%d", i);
            row(f, lab, v[0], v[1], v[2], v[3], v[4], v[5]);
        } else if (i == max_rows / 2) {
            fprintf(f, "... (%d ranks not shown)\n", n - 2 * (max_rows / 2));
        }
    }
    if (n > 1) {
        row(f, "min", mn[0], mn[1], mn[2], mn[3], mn[4], mn[5]);
        row(f, "mean", sum[0] / n, sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, sum[5] / n);
        row(f, "max", mx[0], mx[1], mx[2], mx[3], mx[4], mx[5]);
    }
}
