/* model: packed batches, labels, packing plans, token stream, fixtures. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/status.h"
#include "model/data.h"

TestSuite(data, .init = NULL);

static void quiet(void) { par_err_set_quiet(1); }

Test(data, labels_per_model_md_section_1, .init = quiet)
{
    par_batch b;
    cr_assert_eq(par_batch_alloc(&b, 2, 6), PAR_OK);
    /* row 0: samples of length 3, 2, 1; row 1: one sample of 6 */
    const int32_t tok[12] = {10, 11, 12, 20, 21, 30, 40, 41, 42, 43, 44, 45};
    const int32_t seg[12] = {0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(par_batch_set(&b, tok, seg, 64, NULL), PAR_OK);
    const int32_t pos[12] = {0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5};
    const int32_t lab[12] = {11, 12, -1, 21, -1, -1, 41, 42, 43, 44, 45, -1};
    const int32_t mi[12] = {11, 12, 0, 21, 0, 0, 41, 42, 43, 44, 45, 0};
    const int32_t ml[12] = {12, -1, -1, -1, -1, -1, 42, 43, 44, 45, -1, -1};
    for (int t = 0; t < 12; t++) {
        cr_expect_eq(b.pos[t], pos[t], "pos[%d]", t);
        cr_expect_eq(b.labels[t], lab[t], "labels[%d]", t);
        cr_expect_eq(b.mtp_inputs[t], mi[t], "mtp_inputs[%d]", t);
        cr_expect_eq(b.mtp_labels[t], ml[t], "mtp_labels[%d]", t);
    }
    cr_expect_eq(b.n_labels, 8);
    cr_expect_eq(b.n_mtp_labels, 5);
    par_batch_free(&b);
}

Test(data, segment_and_token_checks_name_row_and_position, .init = quiet)
{
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t seg[8] = {0, 0, 1, 1, 0, 1, 1, 2};
    cr_expect_eq(par_batch_check(tok, seg, 2, 4, 16, "f.st"), PAR_OK, "%s", par_last_error());
    seg[4] = 1;
    cr_expect_eq(par_batch_check(tok, seg, 2, 4, 16, "f.st"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "f.st: row 1 position 0") && strstr(par_last_error(), "start at 0"), "%s",
              par_last_error());
    seg[4] = 0;
    seg[6] = 0;
    cr_expect_eq(par_batch_check(tok, seg, 2, 4, 16, NULL), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "row 1 position 2") && strstr(par_last_error(), "decrease"), "%s",
              par_last_error());
    seg[6] = 1;
    seg[3] = 3;
    cr_expect_eq(par_batch_check(tok, seg, 2, 4, 16, NULL), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "row 0 position 3") && strstr(par_last_error(), "contiguous"), "%s",
              par_last_error());
    seg[3] = 1;
    tok[5] = 16;
    cr_expect_eq(par_batch_check(tok, seg, 2, 4, 16, NULL), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "row 1 position 1") && strstr(par_last_error(), "token 16"), "%s",
              par_last_error());
    tok[5] = -1;
    cr_expect_eq(par_batch_check(tok, seg, 2, 4, 16, NULL), PAR_EINVAL);
}

Test(data, random_plans_are_deterministic_and_valid, .init = quiet)
{
    par_pack_plan a, b, c;
    cr_assert_eq(par_pack_plan_random(&a, 8, 64, 5, 0), PAR_OK);
    cr_assert_eq(par_pack_plan_random(&b, 8, 64, 5, 0), PAR_OK);
    cr_assert_eq(par_pack_plan_random(&c, 4, 64, 5, 4), PAR_OK);
    cr_expect_eq(a.n_samples, b.n_samples);
    cr_expect_eq(memcmp(a.lengths, b.lengths, (size_t)a.n_samples * sizeof(int64_t)), 0);
    int64_t maxlen = 0;
    for (int64_t r = 0; r < 8; r++) {
        int64_t s = 0;
        for (int64_t k = a.row_off[r]; k < a.row_off[r + 1]; k++) {
            cr_expect(a.lengths[k] >= 1 && a.lengths[k] <= 64);
            if (a.lengths[k] > maxlen)
                maxlen = a.lengths[k];
            s += a.lengths[k];
        }
        cr_expect_eq(s, 64, "row %lld sums to %lld", (long long)r, (long long)s);
    }
    cr_expect_gt(a.n_samples, 8, "rows hold more than one sample");
    /* rows 4..7 of the 8-row plan are the global rows 4..7 of a plan starting at row 4 */
    int64_t off = a.row_off[4];
    cr_expect_eq(c.n_samples, a.n_samples - off);
    cr_expect_eq(memcmp(c.lengths, a.lengths + off, (size_t)c.n_samples * sizeof(int64_t)), 0);
    par_pack_plan d;
    par_pack_plan_random(&d, 8, 64, 6, 0);
    cr_expect(d.n_samples != a.n_samples || memcmp(d.lengths, a.lengths, (size_t)a.n_samples * 8),
              "another seed, another plan");
    par_pack_plan_free(&a);
    par_pack_plan_free(&b);
    par_pack_plan_free(&c);
    par_pack_plan_free(&d);
}

Test(data, token_stream_resumes_at_a_cursor, .init = quiet)
{
    par_pack_plan p;
    cr_assert_eq(par_pack_plan_random(&p, 4, 32, 9, 0), PAR_OK);
    par_batch b1, b2;
    par_batch_alloc(&b1, 4, 32);
    par_batch_alloc(&b2, 4, 32);
    int64_t next = -1, next2 = -1;
    cr_assert_eq(par_batch_fill(&b1, &p, 77, 0, 128, &next), PAR_OK);
    cr_expect_eq(next, p.n_samples);
    cr_assert_eq(par_batch_fill(&b2, &p, 77, next, 128, &next2), PAR_OK);
    cr_expect_eq(next2, 2 * p.n_samples);
    /* every token is the pure function of (seed, global sample, index) */
    int64_t g = next;
    for (int64_t r = 0; r < 4; r++) {
        int64_t s = 0;
        for (int64_t k = p.row_off[r]; k < p.row_off[r + 1]; k++, g++)
            for (int64_t j = 0; j < p.lengths[k]; j++, s++) {
                cr_expect_eq(b2.tokens[r * 32 + s], par_data_token(77, g, j, 128));
                cr_expect_eq(b2.segments[r * 32 + s], k - p.row_off[r]);
                cr_expect_eq(b2.pos[r * 32 + s], j);
            }
    }
    /* resuming: filling at the same cursor again reproduces the batch */
    par_batch b3;
    par_batch_alloc(&b3, 4, 32);
    par_batch_fill(&b3, &p, 77, next, 128, NULL);
    cr_expect_eq(memcmp(b3.tokens, b2.tokens, 4 * 32 * sizeof(int32_t)), 0);
    cr_expect_neq(memcmp(b1.tokens, b2.tokens, 4 * 32 * sizeof(int32_t)), 0);
    for (int i = 0; i < 128; i++)
        cr_expect(b1.tokens[i] >= 0 && b1.tokens[i] < 128);
    cr_expect_eq(par_batch_check(b1.tokens, b1.segments, 4, 32, 128, NULL), PAR_OK);
    par_batch bad;
    par_batch_alloc(&bad, 4, 16);
    cr_expect_eq(par_batch_fill(&bad, &p, 77, 0, 128, NULL), PAR_EMISMATCH);
    par_batch_free(&bad);
    par_batch_free(&b1);
    par_batch_free(&b2);
    par_batch_free(&b3);
    par_pack_plan_free(&p);
}

Test(data, plan_from_rows_checks_sums, .init = quiet)
{
    const int64_t r0[] = {3, 5}, r1[] = {8}, r2[] = {4, 5};
    const int64_t *rows[] = {r0, r1, r2};
    const int64_t counts[] = {2, 1, 2};
    par_pack_plan p;
    cr_expect_eq(par_pack_plan_from_rows(&p, 2, 8, rows, counts), PAR_OK);
    cr_expect_eq(p.n_samples, 3);
    par_pack_plan_free(&p);
    cr_expect_eq(par_pack_plan_from_rows(&p, 3, 8, rows, counts), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "row 2 lengths sum to 9"), "%s", par_last_error());
}

/* ---- fixtures ---- */

static const char *root(void)
{
    const char *r = getenv("PARITY_SOURCE_ROOT");
    return r ? r : ".";
}

static int64_t min_len(const par_fixture *f)
{
    int64_t m = f->seq_length;
    for (int64_t k = 0; k < f->row_off[f->n_rows]; k++)
        if (f->lengths[k] < m)
            m = f->lengths[k];
    return m;
}

/* 1 if some row has a sample boundary exactly at position `at`. */
static int boundary_at(const par_fixture *f, int64_t at)
{
    for (int64_t r = 0; r < f->n_rows; r++) {
        int64_t s = 0;
        for (int64_t k = f->row_off[r]; k < f->row_off[r + 1]; k++) {
            s += f->lengths[k];
            if (s == at && k + 1 < f->row_off[r + 1])
                return 1;
        }
    }
    return 0;
}

static int has_len(const par_fixture *f, int (*pred)(int64_t, int64_t), int64_t arg)
{
    for (int64_t k = 0; k < f->row_off[f->n_rows]; k++)
        if (pred(f->lengths[k], arg))
            return 1;
    return 0;
}
static int eq(int64_t l, int64_t a) { return l == a; }
static int not_mult(int64_t l, int64_t a) { return l % a != 0; }
static int mult4_not16(int64_t l, int64_t a) { return l % 4 == 0 && l % 16 != 0 && a; }
static int le2(int64_t l, int64_t a) { return l <= 2 && a; }

Test(data, fixtures_load_and_cover_their_case, .init = quiet)
{
    const char *tags[2] = {"tiny", "mini"};
    const int64_t S[2] = {64, 128}, W[2] = {8, 16}, B[2] = {8, 32};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/fixtures", root());
    for (int v = 0; v < 2; v++) {
        char nm[128];
        par_fixture f;
#define LOAD(kind)                                                                                          \
    snprintf(nm, sizeof nm, "%s-%s", tags[v], kind);                                                        \
    cr_assert_eq(par_fixture_load_named(&f, nm, dir), PAR_OK, "%s: %s", nm, par_last_error());             \
    cr_expect_str_eq(f.name, nm);                                                                           \
    cr_expect_eq(f.seq_length, S[v]);                                                                       \
    cr_expect_eq(f.window_size, W[v]);                                                                      \
    cr_expect(f.description[0])
        LOAD("short-sample");
        cr_expect_lt(min_len(&f), W[v]);
        par_fixture_free(&f);
        LOAD("odd-lengths");
        cr_expect(has_len(&f, not_mult, 4) && has_len(&f, mult4_not16, 1));
        par_fixture_free(&f);
        LOAD("half-boundary");
        cr_expect(boundary_at(&f, S[v] / 2));
        par_fixture_free(&f);
        LOAD("quarter-boundary");
        cr_expect(boundary_at(&f, S[v] / 4));
        par_fixture_free(&f);
        LOAD("full-row");
        cr_expect(has_len(&f, eq, S[v]));
        par_fixture_free(&f);
        LOAD("tiny-runs");
        cr_expect(has_len(&f, eq, 1) && has_len(&f, eq, 2));
        par_fixture_free(&f);
        LOAD("window-exact");
        cr_expect(has_len(&f, eq, W[v]));
        par_fixture_free(&f);
        LOAD("mult16");
        cr_expect(has_len(&f, eq, S[v]));
        par_fixture_free(&f);
        LOAD("boundary-mix");
        cr_expect_eq(f.n_rows, B[v]);
        cr_expect(min_len(&f) < W[v] && boundary_at(&f, S[v] / 2) && boundary_at(&f, S[v] / 4) &&
                  has_len(&f, eq, S[v]) && has_len(&f, le2, 1) && has_len(&f, eq, W[v]) &&
                  has_len(&f, not_mult, 4));
        par_pack_plan p;
        cr_assert_eq(par_fixture_plan(&f, B[v], S[v], &p), PAR_OK);
        cr_expect_eq(p.n_samples, f.row_off[f.n_rows]);
        par_pack_plan_free(&p);
        par_fixture_free(&f);
#undef LOAD
    }
    /* tiny-one-token (issue 33): every sample one token, so no token has a target in its sample */
    par_fixture f;
    cr_assert_eq(par_fixture_load_named(&f, "tiny-one-token", dir), PAR_OK, "%s", par_last_error());
    cr_expect(f.description[0]);
    cr_expect_eq(f.seq_length, 64);
    for (int64_t i = 0; i < f.row_off[f.n_rows]; i++)
        cr_expect_eq(f.lengths[i], 1, "sample %lld", (long long)i);
    cr_expect_eq(f.row_off[f.n_rows], 64);
    par_fixture_free(&f);
}

Test(data, fixture_rows_repeat_cyclically, .init = quiet)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/fixtures", root());
    par_fixture f;
    cr_assert_eq(par_fixture_load_named(&f, "tiny-half-boundary", dir), PAR_OK, "%s", par_last_error());
    cr_assert_eq(f.n_rows, 3);
    par_pack_plan p;
    cr_assert_eq(par_fixture_plan(&f, 8, 64, &p), PAR_OK);
    for (int64_t r = 0; r < 8; r++) {
        int64_t fr = r % 3;
        int64_t n = f.row_off[fr + 1] - f.row_off[fr];
        cr_expect_eq(p.row_off[r + 1] - p.row_off[r], n, "row %lld", (long long)r);
        cr_expect_eq(memcmp(p.lengths + p.row_off[r], f.lengths + f.row_off[fr], (size_t)n * sizeof(int64_t)), 0);
    }
    par_pack_plan_free(&p);
    cr_assert_eq(par_fixture_plan(&f, 2, 64, &p), PAR_OK, "fewer rows than the fixture: the first B");
    cr_expect_eq(p.row_off[2], f.row_off[2]);
    par_pack_plan_free(&p);
    cr_expect_eq(par_fixture_plan(&f, 8, 128, &p), PAR_EMISMATCH);
    cr_expect(strstr(par_last_error(), "seq_length = 64") && strstr(par_last_error(), "128"));
    par_fixture_free(&f);
    cr_expect_eq(par_fixture_load_named(&f, "no-such-fixture", dir), PAR_ENOTFOUND);
}

Test(data, malformed_fixture_is_rejected, .init = quiet)
{
    char path[] = "/tmp/parity-fx-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    fputs("{\"name\": \"bad\", \"description\": \"x\", \"seq_length\": 8, \"window_size\": 4, \"rows\": [[4, 4], [3, 4]]}", fp);
    fclose(fp);
    par_fixture f;
    cr_expect_eq(par_fixture_load(&f, path), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), "row 1 lengths sum to 7"), "%s", par_last_error());
    unlink(path);
}

/* every file in fixtures/ parses and its rows sum to seq_length */
Test(data, every_fixture_file_is_valid, .init = quiet)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/fixtures", root());
    DIR *d = opendir(dir);
    cr_assert(d, "no %s", dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json"))
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        par_fixture f;
        cr_expect_eq(par_fixture_load(&f, path), PAR_OK, "%s: %s", path, par_last_error());
        cr_expect_eq(strncmp(f.name, e->d_name, l - 5), 0, "%s: name '%s' matches the file", path, f.name);
        par_fixture_free(&f);
        n++;
    }
    closedir(d);
    cr_expect_geq(n, 18);
}
