/* tests/cli/test_compare.c - `parity compare` on partial dumps (issue 33
 * item 4): a forward-only dump of golden/v4-tiny's step 0 (every step.0
 * tensor but the gradients and out.grad_norm, no params files) is what a GPU
 * team dumps first.  Without a selection it fails on the entries it lacks,
 * and the verdict names no "first divergence" (nothing diverged); --subset
 * judges what it holds and lists what it left out; a real divergence is
 * named even among missing entries; --only selects by glob and a pattern
 * that matches nothing fails. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/manifest.h"
#include "core/safetensors.h"
#include "parity_exec.h"

static char golden[PATH_MAX - 64];

static int compare(const char *log, const char *const *args)
{
    static const char *const cmd[] = {"compare", NULL};
    return parity_exec(log, cmd, args);
}

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

/* DIR/step.0.safetensors: golden step 0 without grad.* and out.grad_norm;
 * `bump` > 0 adds it to the first element of act.layers.1.  A manifest of
 * one step with the golden's model and train. */
static void forward_only_dump(const char *dir, double bump)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/step.0.safetensors", golden);
    par_st_file *f;
    cr_assert_eq(par_st_read(p, &f), PAR_OK, "%s", par_last_error());
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    double *copy = NULL;
    for (int i = 0; i < par_st_count(f); i++) {
        const char *name = par_st_name(f, i);
        if (!strncmp(name, "grad.", 5) || !strcmp(name, "out.grad_norm"))
            continue;
        par_tensor t = *par_st_tensor(f, i);
        if (bump > 0 && !strcmp(name, "act.layers.1")) {
            size_t nb = par_tensor_nbytes(&t);
            copy = malloc(nb);
            memcpy(copy, t.data, nb);
            copy[0] += bump;
            t.data = copy;
        }
        cr_assert_eq(par_st_writer_add(w, name, &t), PAR_OK, "%s", par_last_error());
    }
    snprintf(p, sizeof p, "%s/step.0.safetensors", dir);
    cr_assert_eq(par_st_writer_write(w, p), PAR_OK, "%s", par_last_error());
    par_st_writer_free(w);
    par_st_close(f);
    free(copy);
    par_manifest m;
    cr_assert_eq(par_manifest_read(golden, &m), PAR_OK, "%s", par_last_error());
    m.steps = 1;
    m.first_step = 0;
    cr_assert_eq(par_manifest_write(&m, dir), PAR_OK, "%s", par_last_error());
    par_manifest_free(&m);
}

static void setup(void)
{
    const char *src = getenv("PARITY_SOURCE_ROOT");
    cr_assert(src, "PARITY_SOURCE_ROOT not set");
    snprintf(golden, sizeof golden, "%s/golden/v4-tiny", src);
    par_err_set_quiet(1);
}

TestSuite(compare, .init = setup);

Test(compare, forward_only_dump_names_no_divergence_without_a_selection, .timeout = 120)
{
    char dir[] = "/tmp/parity-compare-test-XXXXXX", dump[PATH_MAX], log[PATH_MAX];
    cr_assert(mkdtemp(dir));
    snprintf(dump, sizeof dump, "%s/dump", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    cr_assert_eq(mkdir(dump, 0755), 0);
    forward_only_dump(dump, 0);
    const char *args[] = {golden, dump, NULL};
    cr_expect_eq(compare(log, args), 1, "entries missing in B still fail without a selection");
    char *out = slurp(log);
    cr_expect(!strstr(out, "first divergence"), "nothing diverged, yet:\n%s", out);
    cr_expect(strstr(out, "no value diverged"), "%s", out);
    free(out);
    par_remove_tree(dir);
}

Test(compare, subset_judges_what_the_dump_holds, .timeout = 120)
{
    char dir[] = "/tmp/parity-compare-test-XXXXXX", dump[PATH_MAX], log[PATH_MAX], js[PATH_MAX];
    cr_assert(mkdtemp(dir));
    snprintf(dump, sizeof dump, "%s/dump", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(js, sizeof js, "%s/r.json", dir);
    cr_assert_eq(mkdir(dump, 0755), 0);
    forward_only_dump(dump, 0);
    const char *args[] = {golden, dump, "--subset", "--json", js, NULL};
    int rc = compare(log, args);
    char *out = slurp(log);
    cr_expect_eq(rc, 0, "the forward entries are the golden's:\n%s", out);
    cr_expect(strstr(out, "left out (--subset)"), "%s", out);
    cr_expect(strstr(out, "params.1.safetensors: "), "a whole file left out is listed: %s", out);
    cr_expect(strstr(out, "grad."), "the gradients left out are listed: %s", out);
    free(out);
    cJSON *j;
    cr_assert_eq(par_json_read_file(js, &j), PAR_OK, "%s", par_last_error());
    double lo = 0, failed = -1;
    cr_expect(par_json_num(j, "left_out", &lo) && lo > 200, "left out %g", lo);
    cr_expect(par_json_num(j, "failed", &failed) && failed == 0);
    cJSON_Delete(j);

    /* a real divergence among the missing entries: named, with the left-out ones not failing */
    forward_only_dump(dump, 1e-3);
    const char *args2[] = {golden, dump, NULL};
    cr_expect_eq(compare(log, args2), 1);
    out = slurp(log);
    cr_expect(strstr(out, "first divergence (dataflow order): step.0.safetensors act.layers.1"), "%s", out);
    free(out);
    const char *args3[] = {golden, dump, "--subset", NULL};
    cr_expect_eq(compare(log, args3), 1);
    out = slurp(log);
    cr_expect(strstr(out, "first divergence (dataflow order): step.0.safetensors act.layers.1"), "%s", out);
    cr_expect(strstr(out, "MISMATCH"), "%s", out);
    free(out);
    par_remove_tree(dir);
}

Test(compare, only_selects_by_glob, .timeout = 120)
{
    char dir[] = "/tmp/parity-compare-test-XXXXXX", dump[PATH_MAX], log[PATH_MAX];
    cr_assert(mkdtemp(dir));
    snprintf(dump, sizeof dump, "%s/dump", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    cr_assert_eq(mkdir(dump, 0755), 0);
    forward_only_dump(dump, 0);
    const char *args[] = {golden, dump, "--only", "act.*", "--only", "step.*:out.loss*", NULL};
    int rc = compare(log, args);
    char *out = slurp(log);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "--only act.*: 4 entries"), "3 layers + MTP:\n%s", out);
    cr_expect(strstr(out, "--only step.*:out.loss*: 4 entries"), "%s", out);
    free(out);

    /* the gradients selected: B lacks them, they fail (no --subset), nothing diverged */
    const char *args2[] = {golden, dump, "--only", "grad.layers.0.*", NULL};
    cr_expect_eq(compare(log, args2), 1);
    out = slurp(log);
    cr_expect(strstr(out, "missing in B"), "%s", out);
    cr_expect(!strstr(out, "first divergence"), "%s", out);
    free(out);

    /* a typo matches nothing: it fails, not an empty pass */
    const char *args3[] = {golden, dump, "--only", "act.layer.*", "--subset", NULL};
    cr_expect_eq(compare(log, args3), 1);
    out = slurp(log);
    cr_expect(strstr(out, "matches no tensor of A or B"), "%s", out);
    free(out);
    par_remove_tree(dir);
}

/* ---- exact ties (issue 33 item 3) -------------------------------------- */

static void copy_file(const char *from, const char *to)
{
    void *buf;
    size_t n;
    cr_assert_eq(par_file_read(from, PAR_TAG_IO, &buf, &n), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_file_write_atomic(to, buf, n), PAR_OK, "%s", par_last_error());
    par_free(buf);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A copy of the golden's params and step files in dir with one row of
 * step.0's attn.layers.1.selected changed: tied = 1: a pick swapped for an
 * entry scored exactly the same at the top-k boundary (a row ties.0 marks);
 * tied = 0: a pick swapped for an entry that is not tied with it.  The row
 * is returned. */
static int64_t golden_with_changed_pick(const char *dir, int tied)
{
    char p[PATH_MAX + 32], q[PATH_MAX + 32];
    for (int k = 0; k <= 3; k++)
        for (int kind = 0; kind < 2; kind++) {
            if (kind == 1 && k == 3)
                continue;
            snprintf(p, sizeof p, "%s/%s.%d.safetensors", golden, kind ? "step" : "params", k);
            snprintf(q, sizeof q, "%s/%s.%d.safetensors", dir, kind ? "step" : "params", k);
            if (!(kind == 1 && k == 0))
                copy_file(p, q);
        }
    snprintf(p, sizeof p, "%s/ties.0.safetensors", golden);
    par_st_file *tf;
    cr_assert_eq(par_st_read(p, &tf), PAR_OK, "%s: %s (regenerate golden/v4-tiny)", p, par_last_error());
    const par_tensor *tie = par_st_find(tf, "attn.layers.1.ties");
    cr_assert(tie && tie->ndim == 3);
    snprintf(p, sizeof p, "%s/step.0.safetensors", golden);
    par_st_file *f;
    cr_assert_eq(par_st_read(p, &f), PAR_OK, "%s", par_last_error());
    const par_tensor *sel = par_st_find(f, "attn.layers.1.selected");
    cr_assert(sel && sel->ndim == 3);
    const int64_t rows = sel->shape[0] * sel->shape[1], k = sel->shape[2], ne = tie->shape[2];
    int32_t *copy = malloc((size_t)(rows * k) * sizeof(int32_t));
    memcpy(copy, sel->data, (size_t)(rows * k) * sizeof(int32_t));
    const int32_t *tv = tie->data;
    int64_t row = -1;
    for (int64_t r = 0; r < rows && row < 0; r++) {
        int32_t *s = copy + r * k;
        const int32_t *t = tv + r * ne;
        int in = -1, out = -1; /* a picked entry and an entry not picked, both tied or (tied = 0) neither */
        for (int64_t i = 0; i < k; i++)
            if (s[i] >= 0 && t[s[i]] == tied)
                in = (int)i;
        for (int32_t e = 0; e < ne && in >= 0; e++) {
            int picked = 0;
            for (int64_t i = 0; i < k; i++)
                picked |= s[i] == e;
            if (!picked && (tied ? t[e] == 1 : (t[e] == 0 && e <= s[k - 1])))
                out = e;
        }
        if (in >= 0 && out >= 0) {
            s[in] = out;
            qsort(s, (size_t)k, sizeof *s, cmp_i32);
            row = r;
        }
    }
    cr_assert_geq(row, 0, "no row of the kind in golden/v4-tiny's step 0 (tied = %d)", tied);
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    for (int i = 0; i < par_st_count(f); i++) {
        par_tensor t = *par_st_tensor(f, i);
        if (!strcmp(par_st_name(f, i), "attn.layers.1.selected"))
            t.data = copy;
        cr_assert_eq(par_st_writer_add(w, par_st_name(f, i), &t), PAR_OK);
    }
    snprintf(q, sizeof q, "%s/step.0.safetensors", dir);
    cr_assert_eq(par_st_writer_write(w, q), PAR_OK, "%s", par_last_error());
    par_st_writer_free(w);
    par_st_close(f);
    par_st_close(tf);
    free(copy);
    par_manifest m;
    cr_assert_eq(par_manifest_read(golden, &m), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_manifest_write(&m, dir), PAR_OK, "%s", par_last_error());
    par_manifest_free(&m);
    return row;
}

Test(compare, tie_order_at_an_exact_tie_is_told_from_a_real_difference, .timeout = 120)
{
    char dir[] = "/tmp/parity-compare-test-XXXXXX", dump[PATH_MAX], log[PATH_MAX], one[PATH_MAX + 32],
         gone[PATH_MAX + 32];
    cr_assert(mkdtemp(dir));
    snprintf(dump, sizeof dump, "%s/dump", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    cr_assert_eq(mkdir(dump, 0755), 0);
    golden_with_changed_pick(dump, 1);
    const char *args[] = {golden, dump, NULL};
    int rc = compare(log, args);
    char *out = slurp(log);
    cr_expect_eq(rc, 0, "a tie-order difference passes by default:\n%s", out);
    cr_expect(strstr(out, "TIE  step.0.safetensors attn.layers.1.selected"), "%s", out);
    cr_expect(strstr(out, "tie order: step.0.safetensors attn.layers.1.selected: 1 row pick"), "%s", out);
    free(out);
    const char *strict[] = {golden, dump, "--strict-ties", NULL};
    cr_expect_eq(compare(log, strict), 1, "--strict-ties fails it");
    out = slurp(log);
    cr_expect(strstr(out, "1 only among exact ties of A (tie order, failed under --strict-ties), 0 elsewhere"),
              "%s", out);
    free(out);
    /* the step file alone, A's ties.0 found next to it */
    snprintf(one, sizeof one, "%s/step.0.safetensors", golden);
    snprintf(gone, sizeof gone, "%s/step.0.safetensors", dump);
    const char *files[] = {one, gone, NULL};
    cr_expect_eq(compare(log, files), 0);

    /* a pick that is no tie: a real difference */
    golden_with_changed_pick(dump, 0);
    cr_expect_eq(compare(log, args), 1);
    out = slurp(log);
    cr_expect(strstr(out, "FAIL step.0.safetensors attn.layers.1.selected"), "%s", out);
    cr_expect(strstr(out, "integers differ in 1 of 512 rows, none of them only among exact ties of A"), "%s", out);
    cr_expect(!strstr(out, "tie order:"), "%s", out);
    free(out);
    par_remove_tree(dir);
}

/* The rollout setting without exact ties (docs/gpu-rollout.md, "Exact
 * ties"): v4-tiny's indexer with 2 heads ties at the top-k boundary on some
 * rows (relu of both heads 0); with --set index_n_heads=16 on none, and the
 * golden says how many. */
Test(compare, rollout_setting_without_exact_ties, .timeout = 120)
{
    char dir[] = "/tmp/parity-compare-test-XXXXXX", out[PATH_MAX], log[PATH_MAX];
    cr_assert(mkdtemp(dir));
    snprintf(log, sizeof log, "%s/log", dir);
    static const char *const golden_cmd[] = {"golden", NULL};
    for (int v = 0; v < 2; v++) {
        snprintf(out, sizeof out, "%s/g%d", dir, v);
        const char *args[] = {"--preset", "v4-tiny", "--fixture", "tiny-boundary-mix", "--steps", "1", "--out", out,
                              "--set", v ? "index_n_heads=16" : "index_n_heads=2", NULL};
        cr_assert_eq(parity_exec(log, golden_cmd, args), 0);
        char *txt = slurp(log);
        long tied = -1, rows = -1;
        const char *p = strstr(txt, "indexer: ");
        cr_assert(p && sscanf(p, "indexer: %ld of %ld", &tied, &rows) == 2, "%s", txt);
        cr_expect_gt(rows, 200, "%s", txt);
        if (v)
            cr_expect_eq(tied, 0, "index_n_heads=16: %s", p);
        else
            cr_expect_gt(tied, 10, "the preset's 2 heads: %s", p);
        free(txt);
    }
    par_remove_tree(dir);
}

/* ---- router ties (issue 33: score-routed top-K with exact ties) ------- */

/* dir/<name>: what `parity golden` writes for v4-tiny on tiny-boundary-mix,
 * 2 steps, with bias_update_rate 1e17: after step 0 every gate.bias is 0 or
 * +-1e17, s + bias rounds to the bias (ulp 16 > s), and every score-routed
 * row of step 1 ties among the experts of its top bias class. */
static void router_tie_golden(const char *dir, const char *name, char *out, size_t n)
{
    char log[PATH_MAX];
    snprintf(out, n, "%s/%s", dir, name);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    static const char *const golden_cmd[] = {"golden", NULL};
    const char *args[] = {"--preset", "v4-tiny", "--fixture", "tiny-boundary-mix", "--steps", "2", "--out", out,
                          "--set", "bias_update_rate=1e17", NULL};
    cr_assert_eq(parity_exec(log, golden_cmd, args), 0);
    char *txt = slurp(log);
    cr_expect(strstr(txt, "router: 1536 of 3072 score-routed rows have an exact tie at the top-K boundary"), "%s",
              txt);
    free(txt);
    /* MODEL.md: ties go to the lower e -- the picks among a row's tied experts are its lowest tied indices */
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/ties.1.safetensors", out);
    par_st_file *tf, *f;
    cr_assert_eq(par_st_read(p, &tf), PAR_OK, "%s", par_last_error());
    snprintf(p, sizeof p, "%s/step.1.safetensors", out);
    cr_assert_eq(par_st_read(p, &f), PAR_OK, "%s", par_last_error());
    const par_tensor *tie = par_st_find(tf, "router.layers.1.ties"), *idx = par_st_find(f, "router.layers.1.idx");
    cr_assert(tie && idx);
    const int64_t rows = idx->shape[0] * idx->shape[1], k = idx->shape[2], E = tie->shape[2];
    const int32_t *iv = idx->data, *tv = tie->data;
    for (int64_t r = 0; r < rows; r++) {
        int64_t nt = 0, seen = 0;
        for (int64_t i = 0; i < k; i++)
            nt += tv[r * E + iv[r * k + i]];
        for (int32_t e = 0; e < E && seen < nt; e++)
            if (tv[r * E + e]) {
                int picked = 0;
                for (int64_t i = 0; i < k; i++)
                    picked |= iv[r * k + i] == e;
                cr_assert(picked, "row %lld: tied expert %d not picked though %lld tied picks are lower-index", (long long)r,
                          e, (long long)nt);
                seen++;
            }
    }
    par_st_close(f);
    par_st_close(tf);
}

/* Rewrites step.1 of the set in dir: router.layers.1.idx re-picked on every
 * row by `order` (1: the highest tied indices, as a top-k that breaks ties
 * the other way; 2: row 0's first pick replaced by an expert that is not
 * tied, a real difference), router.layers.1.load recounted from it. */
static void repick_router(const char *dir, int order)
{
    char p[PATH_MAX + 32];
    par_manifest m;
    cr_assert_eq(par_manifest_read(dir, &m), PAR_OK, "%s", par_last_error());
    snprintf(p, sizeof p, "%s/ties.1.safetensors", dir);
    par_st_file *tf, *f;
    cr_assert_eq(par_st_read(p, &tf), PAR_OK, "%s", par_last_error());
    const par_tensor *tie = par_st_find(tf, "router.layers.1.ties");
    cr_assert(tie && tie->ndim == 3, "no router.layers.1.ties in %s", p);
    snprintf(p, sizeof p, "%s/step.1.safetensors", dir);
    cr_assert_eq(par_st_read(p, &f), PAR_OK, "%s", par_last_error());
    const par_tensor *idx = par_st_find(f, "router.layers.1.idx");
    const int64_t rows = idx->shape[0] * idx->shape[1], k = idx->shape[2], E = tie->shape[2];
    int32_t *pick = malloc((size_t)(rows * k) * sizeof *pick);
    int64_t *load = calloc((size_t)E, sizeof *load);
    memcpy(pick, idx->data, (size_t)(rows * k) * sizeof *pick);
    const int32_t *tv = tie->data;
    for (int64_t r = 0; r < rows; r++) {
        int32_t *s = pick + r * k;
        const int32_t *t = tv + r * E;
        if (order == 1) { /* keep the untied picks, fill the rest from the top tied index down */
            int64_t nt = 0;
            for (int64_t i = 0; i < k; i++)
                nt += t[s[i]];
            int64_t j = 0;
            for (int64_t i = 0; i < k; i++)
                if (!t[s[i]])
                    s[j++] = s[i];
            for (int32_t e = (int32_t)E - 1; e >= 0 && nt > 0; e--)
                if (t[e])
                    s[j++] = e, nt--;
            qsort(s, (size_t)k, sizeof *s, cmp_i32);
        } else if (r == 0) {
            for (int32_t e = 0; e < E; e++) {
                int picked = 0;
                for (int64_t i = 0; i < k; i++)
                    picked |= s[i] == e;
                if (!picked && !t[e]) {
                    s[0] = e;
                    break;
                }
            }
            qsort(s, (size_t)k, sizeof *s, cmp_i32);
        }
        for (int64_t i = 0; i < k; i++)
            load[s[i]]++;
    }
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    for (int i = 0; i < par_st_count(f); i++) {
        par_tensor t = *par_st_tensor(f, i);
        if (!strcmp(par_st_name(f, i), "router.layers.1.idx"))
            t.data = pick;
        if (!strcmp(par_st_name(f, i), "router.layers.1.load"))
            t.data = load;
        cr_assert_eq(par_st_writer_add(w, par_st_name(f, i), &t), PAR_OK);
    }
    cr_assert_eq(par_st_writer_write(w, p), PAR_OK, "%s", par_last_error());
    par_st_writer_free(w);
    par_st_close(f);
    par_st_close(tf);
    free(pick);
    free(load);
    cr_assert_eq(par_manifest_write(&m, dir), PAR_OK, "%s", par_last_error()); /* the files' hashes again */
    par_manifest_free(&m);
}

Test(compare, router_tie_order_is_told_from_a_real_difference, .timeout = 120)
{
    char dir[] = "/tmp/parity-compare-test-XXXXXX", a[PATH_MAX], b[PATH_MAX], log[PATH_MAX];
    cr_assert(mkdtemp(dir));
    snprintf(log, sizeof log, "%s/log", dir);
    router_tie_golden(dir, "a", a, sizeof a);
    router_tie_golden(dir, "b", b, sizeof b);
    const char *args[] = {a, b, NULL};
    cr_expect_eq(compare(log, args), 0, "the same run twice");
    repick_router(b, 1);
    int rc = compare(log, args);
    char *out = slurp(log);
    cr_expect_eq(rc, 0, "a router tie-order difference passes by default:\n%s", out);
    cr_expect(strstr(out, "TIE  step.1.safetensors router.layers.1.idx"), "%s", out);
    cr_expect(strstr(out, "TIE  step.1.safetensors router.layers.1.load"), "%s", out);
    cr_expect(strstr(out, "exactly those of the 512 rows of router.layers.1.idx that differ only among A's exact ties"),
              "%s", out);
    free(out);
    const char *strict[] = {a, b, "--strict-ties", NULL};
    cr_expect_eq(compare(log, strict), 1, "--strict-ties fails it");
    out = slurp(log);
    cr_expect(strstr(out, "512 only among exact ties of A (tie order, failed under --strict-ties), 0 elsewhere"), "%s",
              out);
    free(out);
    /* one pick moved to an expert that is not tied: a real difference, idx and load both fail */
    par_remove_tree(b);
    router_tie_golden(dir, "b", b, sizeof b);
    repick_router(b, 2);
    cr_expect_eq(compare(log, args), 1);
    out = slurp(log);
    cr_expect(strstr(out, "FAIL step.1.safetensors router.layers.1.idx"), "%s", out);
    cr_expect(strstr(out, "integers differ in 1 of 512 rows, none of them only among exact ties of A"), "%s", out);
    cr_expect(strstr(out, "FAIL step.1.safetensors router.layers.1.load"), "%s", out);
    free(out);
    par_remove_tree(dir);
}
