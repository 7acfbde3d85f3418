/* The comparator on crafted pairs: equal, within and just outside the
 * tolerance, NaN/Inf, shape/dtype mismatches, missing/extra tensors,
 * integers, bitwise, listing order, coordinates decoded, golden sets. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/manifest.h"
#include "core/safetensors.h"
#include "io_test_util.h"
#include "model/compare.h"

static int64_t live0;
static void setup(void)
{
    par_err_set_quiet(1);
    live0 = par_alloc_live_total();
}
static void teardown(void)
{
    cr_expect_eq(par_alloc_live_total(), live0, "leaked %lld bytes", (long long)(par_alloc_live_total() - live0));
}
TestSuite(compare, .init = setup, .fini = teardown);

typedef struct {
    const char *name;
    par_tensor t;
} named;

static par_st_file *mkfile(const named *v, int n, const char *label)
{
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    for (int i = 0; i < n; i++)
        cr_assert_eq(par_st_writer_add(w, v[i].name, &v[i].t), PAR_OK, "%s", par_last_error());
    void *buf;
    size_t len;
    cr_assert_eq(par_st_writer_to_mem(w, &buf, &len), PAR_OK);
    par_st_writer_free(w);
    par_st_file *f;
    cr_assert_eq(par_st_read_mem(buf, len, label, &f), PAR_OK, "%s", par_last_error());
    par_free(buf);
    return f;
}

static void write_file(const char *dir, const char *fname, const named *v, int n)
{
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    for (int i = 0; i < n; i++)
        cr_assert_eq(par_st_writer_add(w, v[i].name, &v[i].t), PAR_OK);
    char *p = par_path_join(dir, fname);
    cr_assert_eq(par_st_writer_write(w, p), PAR_OK, "%s", par_last_error());
    par_free(p);
    par_st_writer_free(w);
}

/* Compares one tensor pair (same name "t") under a policy. */
static par_compare_report *cmp1(par_tensor a, par_tensor b, par_policy pol)
{
    named va = {"t", a}, vb = {"t", b};
    par_st_file *fa = mkfile(&va, 1, "a.safetensors"), *fb = mkfile(&vb, 1, "b.safetensors");
    par_compare_opts o;
    par_compare_opts_init(&o);
    o.policy = pol;
    par_compare_report *r;
    cr_assert_eq(par_compare_st(fa, fb, NULL, &o, &r), PAR_OK, "%s", par_last_error());
    par_st_close(fa);
    par_st_close(fb);
    return r;
}

#define N 16
static double A[N];
static void init_a(void)
{
    for (int i = 0; i < N; i++)
        A[i] = 1.0 + 0.1 * i;
}
static int64_t SH[1] = {N};

static double norm(const double *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i] * x[i];
    return sqrt(s);
}

Test(compare, equal)
{
    init_a();
    double B[N];
    memcpy(B, A, sizeof B);
    par_compare_report *r = cmp1(par_tensor_view(PAR_F64, 1, SH, A), par_tensor_view(PAR_F64, 1, SH, B), PAR_POLICY_AUTO);
    cr_expect(par_compare_report_ok(r));
    cr_expect_eq(par_compare_report_policy(r), PAR_POLICY_F64, "auto on bare files is f64");
    const par_cmp_entry *e = par_compare_report_entry(r, 0);
    cr_expect(e->pass);
    cr_expect_str_eq(e->mode, "f64");
    cr_expect_eq(e->max_abs, 0);
    cr_expect_eq(e->n_diff, 0);
    cr_expect_str_eq(e->file, "a.safetensors");
    par_compare_report_free(r);
}

Test(compare, within_and_just_outside_tolerance)
{
    init_a();
    double bound = 1e-10 * norm(A, N) + 1e-14 * sqrt((double)N);
    double B[N];
    for (int k = 0; k < 2; k++) {
        double scale = k == 0 ? 0.99 : 1.01;
        memcpy(B, A, sizeof B);
        B[3] += scale * bound;
        par_compare_report *r = cmp1(par_tensor_view(PAR_F64, 1, SH, A), par_tensor_view(PAR_F64, 1, SH, B),
                                     PAR_POLICY_F64);
        const par_cmp_entry *e = par_compare_report_entry(r, 0);
        cr_expect_eq(e->pass, k == 0, "scale %.2f: pass %d, ||d|| %g bound %g", scale, e->pass, e->diff_norm, e->bound);
        cr_expect_float_eq(e->bound, bound, 1e-20);
        cr_expect_float_eq(e->max_abs, scale * bound, 1e-3 * bound);
        cr_expect_float_eq(e->max_rel, scale * bound / A[3], 1e-3 * bound);
        cr_expect_float_eq(e->rel_l2, scale * bound / norm(A, N), 1e-3 * bound);
        cr_expect_eq(e->n_diff, 1);
        if (k == 1) {
            cr_expect(strstr(e->reason, "||B-A||"), "%s", e->reason);
            cr_assert_eq(e->nlist, 1);
            cr_expect_eq(e->list[0].index, 3);
            cr_expect_eq(e->list[0].coord[0], 3);
            cr_expect_eq(e->list[0].a, A[3]);
            cr_expect_eq(e->list[0].b, B[3]);
        } else {
            cr_expect_eq(e->nlist, 0, "passing tensors list nothing");
        }
        par_compare_report_free(r);
    }
}

Test(compare, f32_and_bf16_policies)
{
    float a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = 1.0f + 0.1f * (float)i;
        b[i] = a[i] * (1.0f + 2e-6f);
    }
    par_tensor ta = par_tensor_view(PAR_F32, 1, SH, a), tb = par_tensor_view(PAR_F32, 1, SH, b);
    par_compare_report *r = cmp1(ta, tb, PAR_POLICY_F32);
    cr_expect(par_compare_report_ok(r), "2e-6 relative is inside f32's 1e-4");
    par_compare_report_free(r);
    r = cmp1(ta, tb, PAR_POLICY_F64);
    cr_expect(!par_compare_report_ok(r), "2e-6 relative is outside f64's 1e-10");
    par_compare_report_free(r);
    uint16_t ha[N], hb[N];
    for (int i = 0; i < N; i++) {
        ha[i] = par_bf16_from_f32(a[i]);
        hb[i] = par_bf16_from_f32(a[i] * 1.01f);
    }
    r = cmp1(par_tensor_view(PAR_BF16, 1, SH, ha), par_tensor_view(PAR_BF16, 1, SH, hb), PAR_POLICY_BF16);
    cr_expect(par_compare_report_ok(r), "1%% is inside bf16's 2e-2");
    par_compare_report_free(r);
    r = cmp1(par_tensor_view(PAR_BF16, 1, SH, ha), par_tensor_view(PAR_BF16, 1, SH, hb), PAR_POLICY_F32);
    cr_expect(!par_compare_report_ok(r));
    par_compare_report_free(r);
}

Test(compare, nonfinite_values)
{
    init_a();
    double a[N], b[N];
    memcpy(a, A, sizeof a);
    a[2] = NAN;
    a[5] = INFINITY;
    a[6] = -INFINITY;
    memcpy(b, a, sizeof b);
    /* same positions and classes, different NaN payload: passes the norm policy */
    uint64_t bits;
    memcpy(&bits, &b[2], 8);
    bits ^= 1;
    memcpy(&b[2], &bits, 8);
    par_compare_report *r = cmp1(par_tensor_view(PAR_F64, 1, SH, a), par_tensor_view(PAR_F64, 1, SH, b), PAR_POLICY_F64);
    cr_expect(par_compare_report_ok(r), "%s", par_compare_report_entry(r, 0)->reason);
    par_compare_report_free(r);
    r = cmp1(par_tensor_view(PAR_F64, 1, SH, a), par_tensor_view(PAR_F64, 1, SH, b), PAR_POLICY_BITWISE);
    cr_expect(!par_compare_report_ok(r), "NaN payloads differ bitwise");
    cr_expect_eq(par_compare_report_entry(r, 0)->n_diff, 1);
    par_compare_report_free(r);

    /* NaN against a number, +Inf against -Inf */
    memcpy(b, a, sizeof b);
    b[2] = 1.0;
    b[6] = INFINITY;
    r = cmp1(par_tensor_view(PAR_F64, 1, SH, a), par_tensor_view(PAR_F64, 1, SH, b), PAR_POLICY_F64);
    const par_cmp_entry *e = par_compare_report_entry(r, 0);
    cr_expect(!e->pass);
    cr_expect_eq(e->n_nonfinite, 2);
    cr_expect(strstr(e->reason, "NaN/Inf differ at 2"), "%s", e->reason);
    cr_assert_eq(e->nlist, 2);
    cr_expect_eq(e->list[0].index, 2, "non-finite mismatches rank first, lower index first");
    cr_expect_eq(e->list[1].index, 6);
    cr_expect(isinf(e->list[0].err));
    par_compare_report_free(r);

    /* a finite tensor against one with an Inf */
    memcpy(b, A, sizeof b);
    b[0] = INFINITY;
    r = cmp1(par_tensor_view(PAR_F64, 1, SH, A), par_tensor_view(PAR_F64, 1, SH, b), PAR_POLICY_BF16);
    cr_expect(!par_compare_report_ok(r));
    par_compare_report_free(r);
}

Test(compare, structure_mismatches)
{
    init_a();
    int64_t s2[2] = {4, 4}, s1[1] = {N};
    float f[N] = {0};
    int32_t i32[N] = {0};
    named a[] = {
        {"dtype", par_tensor_view(PAR_F64, 1, s1, A)},
        {"missing", par_tensor_view(PAR_F64, 1, s1, A)},
        {"same", par_tensor_view(PAR_I32, 1, s1, i32)},
        {"shape", par_tensor_view(PAR_F64, 1, s1, A)},
    };
    named b[] = {
        {"dtype", par_tensor_view(PAR_F32, 1, s1, f)},
        {"extra", par_tensor_view(PAR_F64, 1, s1, A)},
        {"same", par_tensor_view(PAR_I32, 1, s1, i32)},
        {"shape", par_tensor_view(PAR_F64, 2, s2, A)},
    };
    par_st_file *fa = mkfile(a, 4, "a"), *fb = mkfile(b, 4, "b");
    par_compare_report *r;
    cr_assert_eq(par_compare_st(fa, fb, "x.safetensors", NULL, &r), PAR_OK);
    cr_expect_eq(par_compare_report_count(r), 5, "union of names");
    cr_expect_eq(par_compare_report_failed(r), 4);
    const par_cmp_entry *e = par_compare_report_find(r, "x.safetensors", "dtype");
    cr_expect(e && !e->pass && strstr(e->reason, "dtype differs: A F64, B F32"), "%s", e ? e->reason : "");
    e = par_compare_report_find(r, NULL, "missing");
    cr_expect(e && !e->pass && strstr(e->reason, "missing in B"), "%s", e ? e->reason : "");
    e = par_compare_report_find(r, NULL, "extra");
    cr_expect(e && !e->pass && strstr(e->reason, "missing in A"), "%s", e ? e->reason : "");
    e = par_compare_report_find(r, NULL, "shape");
    cr_expect(e && !e->pass && strstr(e->reason, "shape differs: A [16], B [4,4]"), "%s", e ? e->reason : "");
    e = par_compare_report_find(r, NULL, "same");
    cr_expect(e && e->pass);
    par_compare_report_free(r);
    par_st_close(fa);
    par_st_close(fb);
}

Test(compare, integers_must_be_equal)
{
    int64_t s[2] = {2, 3};
    int64_t a[6] = {1, 2, 3, 4, 5, (int64_t)1 << 60}, b[6] = {1, 2, 3, 4, 5, ((int64_t)1 << 60) + 1};
    par_compare_report *r = cmp1(par_tensor_view(PAR_I64, 2, s, a), par_tensor_view(PAR_I64, 2, s, b), PAR_POLICY_BF16);
    const par_cmp_entry *e = par_compare_report_entry(r, 0);
    cr_expect(!e->pass, "integers are equal-or-fail under every policy");
    cr_expect_str_eq(e->mode, "integer");
    cr_expect(strstr(e->reason, "integers differ at 1 of 6"), "%s", e->reason);
    cr_assert_eq(e->nlist, 1);
    cr_expect_eq(e->list[0].ia, (int64_t)1 << 60);
    cr_expect_eq(e->list[0].ib, ((int64_t)1 << 60) + 1, "exact values kept");
    cr_expect_eq(e->list[0].coord[0], 1);
    cr_expect_eq(e->list[0].coord[1], 2);
    par_compare_report_free(r);
    int32_t c[6] = {0, 1, 2, 3, 4, 5};
    r = cmp1(par_tensor_view(PAR_I32, 2, s, c), par_tensor_view(PAR_I32, 2, s, c), PAR_POLICY_BITWISE);
    cr_expect(par_compare_report_ok(r));
    par_compare_report_free(r);
}

Test(compare, bitwise_policy)
{
    init_a();
    double b[N];
    memcpy(b, A, sizeof b);
    double z0[N] = {0}, z1[N] = {0};
    z1[7] = -0.0;
    par_compare_report *r = cmp1(par_tensor_view(PAR_F64, 1, SH, z0), par_tensor_view(PAR_F64, 1, SH, z1), PAR_POLICY_F64);
    cr_expect(par_compare_report_ok(r), "-0 == +0 in value");
    par_compare_report_free(r);
    r = cmp1(par_tensor_view(PAR_F64, 1, SH, z0), par_tensor_view(PAR_F64, 1, SH, z1), PAR_POLICY_BITWISE);
    const par_cmp_entry *e = par_compare_report_entry(r, 0);
    cr_expect(!e->pass, "-0 and +0 differ in bits");
    cr_expect_str_eq(e->mode, "bitwise");
    cr_expect(strstr(e->reason, "bits differ at 1 of 16"), "%s", e->reason);
    cr_assert_eq(e->nlist, 1);
    cr_expect_eq(e->list[0].index, 7);
    par_compare_report_free(r);
    b[9] = nextafter(b[9], 10.0); /* one ulp: inside f64, not bitwise */
    r = cmp1(par_tensor_view(PAR_F64, 1, SH, A), par_tensor_view(PAR_F64, 1, SH, b), PAR_POLICY_F64);
    cr_expect(par_compare_report_ok(r));
    par_compare_report_free(r);
    r = cmp1(par_tensor_view(PAR_F64, 1, SH, A), par_tensor_view(PAR_F64, 1, SH, b), PAR_POLICY_BITWISE);
    cr_expect(!par_compare_report_ok(r));
    par_compare_report_free(r);
    r = cmp1(par_tensor_view(PAR_F64, 1, SH, A), par_tensor_view(PAR_F64, 1, SH, A), PAR_POLICY_BITWISE);
    cr_expect(par_compare_report_ok(r));
    par_compare_report_free(r);
}

Test(compare, listing_is_largest_error_first)
{
    init_a();
    double b[N];
    memcpy(b, A, sizeof b);
    b[1] += 1e-3;
    b[4] += 5e-3;
    b[9] += 2e-3;
    b[12] += 5e-3; /* ties with 4: lower index first */
    b[15] += 1e-6;
    named va = {"t", par_tensor_view(PAR_F64, 1, SH, A)}, vb = {"t", par_tensor_view(PAR_F64, 1, SH, b)};
    par_st_file *fa = mkfile(&va, 1, "a"), *fb = mkfile(&vb, 1, "b");
    par_compare_opts o;
    par_compare_opts_init(&o);
    o.max_list = 3;
    par_compare_report *r;
    cr_assert_eq(par_compare_st(fa, fb, NULL, &o, &r), PAR_OK);
    const par_cmp_entry *e = par_compare_report_entry(r, 0);
    cr_assert_eq(e->nlist, 3);
    cr_expect_eq(e->list[0].index, 4);
    cr_expect_eq(e->list[1].index, 12);
    cr_expect_eq(e->list[2].index, 9);
    cr_expect_eq(e->n_diff, 5);
    par_compare_report_free(r);
    par_st_close(fa);
    par_st_close(fb);
}

/* ---- golden-set directories ------------------------------------------ */

static void write_manifest(const char *dir, const char *precision, int cp, int with_override)
{
    par_manifest m;
    par_manifest_init(&m);
    par_manifest_set_generator(&m, "test", "0");
    par_manifest_set_precision(&m, precision);
    m.steps = 1;
    m.model = cJSON_CreateObject();
    m.train = cJSON_CreateObject();
    m.data = cJSON_CreateObject();
    m.layout = cJSON_CreateObject();
    cJSON_AddNumberToObject(m.layout, "context_parallel_size", cp);
    if (with_override)
        cr_assert_eq(par_manifest_add_tolerance(&m, "out.loss", 1e-3, 0, "test: loss summed in another order"),
                     PAR_OK);
    cr_assert_eq(par_manifest_write(&m, dir), PAR_OK, "%s", par_last_error());
    par_manifest_free(&m);
}

#define B_ 2
#define S_ 8
#define NS 2
#define D_ 3

static void make_sets(char *da, char *db)
{
    static int32_t tok[B_ * S_], seg[B_ * S_] = {0, 0, 0, 0, 0, 1, 1, 1, /* row 1: */ 0, 0, 0, 1, 1, 1, 1, 1};
    static double act_a[B_ * S_ * NS * D_], act_b[B_ * S_ * NS * D_];
    static double w_a[6], w_b[6], loss_a = 2.5, loss_b = 2.5 * (1 + 1e-5);
    for (int i = 0; i < B_ * S_; i++)
        tok[i] = i % 5;
    for (int i = 0; i < B_ * S_ * NS * D_; i++)
        act_a[i] = act_b[i] = 0.5 + 0.01 * i;
    /* element [1,5,1,2]: row 1, position 5 */
    act_b[((1 * S_ + 5) * NS + 1) * D_ + 2] += 1e-3;
    for (int i = 0; i < 6; i++)
        w_a[i] = w_b[i] = 1.0 + i;
    w_b[4] += 0.5;
    int64_t sbs[2] = {B_, S_}, sact[4] = {B_, S_, NS, D_}, sw[2] = {2, 3};
    named step[] = {
        {"input.tokens", par_tensor_view(PAR_I32, 2, sbs, tok)},
        {"input.segments", par_tensor_view(PAR_I32, 2, sbs, seg)},
        {"act.layers.1", par_tensor_view(PAR_F64, 4, sact, act_a)},
        {"grad.layers.1.ffn.experts.3.w1.weight", par_tensor_view(PAR_F64, 2, sw, w_a)},
        {"out.loss", par_tensor_view(PAR_F64, 0, sw, &loss_a)},
    };
    named params[] = {{"layers.1.ffn.experts.3.w1.weight", par_tensor_view(PAR_F64, 2, sw, w_a)}};
    write_file(da, "params.0.safetensors", params, 1);
    write_file(da, "step.0.safetensors", step, 5);
    write_file(da, "params.1.safetensors", params, 1);
    write_manifest(da, "f64", 1, 1);
    step[2].t.data = act_b;
    step[3].t.data = w_b;
    step[4].t.data = &loss_b;
    write_file(db, "params.0.safetensors", params, 1);
    write_file(db, "step.0.safetensors", step, 5);
    write_manifest(db, "f64", 2, 0);
}

Test(compare, golden_sets_decode_coordinates)
{
    char *root = io_tmpdir();
    char *da = par_path_join(root, "a"), *db = par_path_join(root, "b");
    cr_assert_eq(mkdir(da, 0755), 0);
    cr_assert_eq(mkdir(db, 0755), 0);
    make_sets(da, db);
    par_compare_report *r;
    cr_assert_eq(par_compare_paths(da, db, NULL, &r), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_compare_report_policy(r), PAR_POLICY_F64);
    cr_expect(!par_compare_report_ok(r));

    const par_cmp_entry *e = par_compare_report_find(r, "params.1.safetensors", "");
    cr_expect(e && !e->pass && strstr(e->reason, "file missing in B"), "%s", e ? e->reason : "no entry");
    e = par_compare_report_find(r, "params.0.safetensors", "layers.1.ffn.experts.3.w1.weight");
    cr_expect(e && e->pass);

    e = par_compare_report_find(r, "step.0.safetensors", "act.layers.1");
    cr_assert(e);
    cr_expect(!e->pass);
    cr_assert_geq(e->nlist, 1);
    const par_cmp_elem *el = &e->list[0];
    cr_expect(el->coord[0] == 1 && el->coord[1] == 5 && el->coord[2] == 1 && el->coord[3] == 2);
    cr_expect(strstr(el->where, "layer 1"), "%s", el->where);
    cr_expect(strstr(el->where, "row 1, pos 5 (sample 1, pos 2 in sample)"), "%s", el->where);
    cr_expect(strstr(el->where, "cp rank 1 of 2 (B's layout)"), "%s", el->where);
    cr_expect(strstr(el->where, "stream 1"), "%s", el->where);

    e = par_compare_report_find(r, "step.0.safetensors", "grad.layers.1.ffn.experts.3.w1.weight");
    cr_assert(e && !e->pass && e->nlist == 1);
    cr_expect(strstr(e->list[0].where, "layer 1, expert 3"), "%s", e->list[0].where);
    cr_expect(!strstr(e->list[0].where, "row"), "grad tensors are not [B,S]: %s", e->list[0].where);
    cr_expect(e->list[0].coord[0] == 1 && e->list[0].coord[1] == 1);

    /* A's manifest overrides out.loss with a reason; 1e-5 relative passes it */
    e = par_compare_report_find(r, "step.0.safetensors", "out.loss");
    cr_assert(e);
    cr_expect(e->pass, "%s", e->reason);
    cr_expect_str_eq(e->mode, "override");
    cr_expect(e->override_reason && strstr(e->override_reason, "another order"));
    e = par_compare_report_find(r, "step.0.safetensors", "input.segments");
    cr_expect(e && e->pass);
    cr_expect_eq(par_compare_report_failed(r), 3);

    /* printing and the JSON report */
    char *txt = par_path_join(root, "out.txt"), *js = par_path_join(root, "r.json");
    FILE *f = fopen(txt, "w");
    par_compare_report_print(r, f, 1);
    fclose(f);
    void *buf;
    size_t n;
    cr_assert_eq(par_file_read(txt, PAR_TAG_IO, &buf, &n), PAR_OK);
    cr_expect(strstr(buf, "FAIL step.0.safetensors act.layers.1"), "%s", (char *)buf);
    cr_expect(strstr(buf, "PASS step.0.safetensors input.tokens"), "verbose prints passing entries");
    cr_expect(strstr(buf, "MISMATCH: 3 files"), "%s", (char *)buf);
    par_free(buf);
    cr_assert_eq(par_compare_report_write_json(r, js), PAR_OK, "%s", par_last_error());
    cJSON *j;
    cr_assert_eq(par_json_read_file(js, &j), PAR_OK);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "pass")));
    cr_expect_str_eq(par_json_str(j, "policy"), "f64");
    cJSON *arr = cJSON_GetObjectItem(j, "tensors");
    cr_expect_eq(cJSON_GetArraySize(arr), par_compare_report_count(r));
    int found = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        const char *tn = par_json_str(it, "tensor");
        if (tn && !strcmp(tn, "act.layers.1")) {
            cJSON *ml = cJSON_GetObjectItem(it, "mismatches");
            cr_expect(cJSON_GetArraySize(ml) >= 1);
            cr_expect(strstr(par_json_str(cJSON_GetArrayItem(ml, 0), "where"), "cp rank 1"));
            found = 1;
        }
    }
    cr_expect(found);
    cJSON_Delete(j);
    par_compare_report_free(r);

    /* bitwise: the override still applies to out.loss; everything else bitwise */
    par_compare_opts o;
    par_compare_opts_init(&o);
    o.policy = PAR_POLICY_BITWISE;
    cr_assert_eq(par_compare_paths(da, db, &o, &r), PAR_OK);
    cr_expect(par_compare_report_find(r, NULL, "out.loss")->pass);
    par_compare_report_free(r);

    /* the same set against itself passes */
    cr_assert_eq(par_compare_paths(da, da, &o, &r), PAR_OK);
    cr_expect(par_compare_report_ok(r));
    par_compare_report_free(r);

    /* auto policy: the looser precision of the two manifests */
    write_manifest(db, "f32", 2, 0);
    cr_assert_eq(par_compare_paths(da, db, NULL, &r), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_compare_report_policy(r), PAR_POLICY_F32);
    par_compare_report_free(r);
    write_manifest(db, "fp8", 2, 0);
    cr_expect_eq(par_compare_paths(da, db, NULL, &r), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "fp8"), "%s", par_last_error());

    /* unreadable inputs are errors, not verdicts */
    char *sa = par_path_join(da, "step.0.safetensors");
    cr_expect_eq(par_compare_paths(da, sa, NULL, &r), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "is a directory but"), "%s", par_last_error());
    cr_expect_eq(par_compare_paths(da, "/nonexistent/parity", NULL, &r), PAR_ENOTFOUND);
    write_manifest(db, "f64", 2, 0);
    io_write_bytes(sa, "x", 1); /* corrupt A after its manifest was written */
    cr_expect_eq(par_compare_paths(da, db, NULL, &r), PAR_EMISMATCH);
    cr_expect(strstr(par_last_error(), "step.0.safetensors"), "%s", par_last_error());
    char *sb = par_path_join(root, "b.safetensors");
    io_write_bytes(sb, "\x02\0\0\0\0\0\0\0{}", 10);
    cr_expect_eq(par_compare_paths(sb, sa, NULL, &r), PAR_EFORMAT);

    par_free(sa);
    par_free(sb);
    par_free(txt);
    par_free(js);
    par_free(da);
    par_free(db);
    io_rmtree(root);
}
