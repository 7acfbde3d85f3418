/* tests/model/test_golden.c - golden sets: the checked-in golden/v4-tiny is
 * regenerated and compared (bitwise when this machine's OpenBLAS core is the
 * one recorded in the manifest, else the f64 policy); what a set holds; atomic
 * writing; --data input; f32 against f64 through the parity binary. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "model/compare.h"
#include "model/golden.h"

static const char *src_root(void)
{
    const char *r = getenv("PARITY_SOURCE_ROOT");
    return r ? r : ".";
}

static char *tmp_dir(void)
{
    char tmpl[] = "/tmp/parity-golden-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp failed");
    return par_strdup(d, PAR_TAG_MISC);
}

static void opts_init(par_golden_opts *o)
{
    memset(o, 0, sizeof *o);
    o->precision = 64;
    o->steps = 1;
    o->seed = 1234;
}

/* The checked-in set, regenerated from its own manifest. */
Test(golden, checked_in_v4_tiny_regenerates)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/golden/v4-tiny", src_root());
    char *mpath = par_path_join(path, "manifest.json");
    cJSON *man = NULL;
    cr_assert_eq(par_json_read_file(mpath, &man), 0, "%s", par_last_error());
    par_free(mpath);
    par_golden_opts o;
    opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    cJSON *sub = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(sub, "model", (cJSON *)par_json_obj(man, "model"));
    cJSON_AddItemReferenceToObject(sub, "train", (cJSON *)par_json_obj(man, "train"));
    cr_assert_eq(par_config_from_json(&o.cfg, sub), 0, "%s", par_last_error());
    cJSON_Delete(sub);
    int64_t steps = 0, seed = 0;
    cr_assert(par_json_int(man, "steps", &steps));
    const cJSON *data = par_json_obj(man, "data");
    cr_assert(data);
    cr_assert(par_json_int(data, "seed", &seed));
    const char *fixture = par_json_str(data, "fixture");
    cr_assert(fixture, "the checked-in set comes from a fixture");
    cr_assert_str_eq(par_json_str(man, "precision"), "f64");
    /* layout.blas_core is information only: parity's GEMM and elementary
     * functions (kernels/gemm.h, core/pmath.h) give the same bits on every
     * CPU, so the set is compared bitwise wherever this runs */
    const char *core = par_json_str(par_json_obj(man, "layout"), "blas_core");
    o.steps = steps;
    o.seed = (uint64_t)seed;
    o.fixture = fixture;
    char *dir = tmp_dir();
    char *out = par_path_join(dir, "v4-tiny");
    o.out_dir = out;
    cr_assert_eq(par_golden_run_f64(&o, NULL), 0, "%s", par_last_error());

    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_BITWISE;
    fprintf(stderr, "golden/v4-tiny: made with OpenBLAS core '%s', this machine's '%s' (information only): "
            "comparing bitwise\n", core ? core : "?", par_golden_blas_core_f64());
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(path, out, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "regenerated golden/v4-tiny differs (%d failing entries)",
              par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 1000);
    par_compare_report_free(r);
    cJSON_Delete(man);
    par_remove_tree(dir);
    par_free(out);
    par_free(dir);
    cr_expect_eq(par_alloc_live_total(), 0, "%lld bytes live", (long long)par_alloc_live_total());
}

/* ------------------------------------------------------------ contents -- */

static void small_cfg(par_config *cfg)
{
    cr_assert_eq(par_config_preset(cfg, "v4-tiny"), 0);
    cfg->global_batch_size = 2;
    cfg->seq_length = 32;
}

/* defined below */
static void check_ties(const char *out, const par_golden_summary *sum);

Test(golden, set_holds_every_name)
{
    par_golden_opts o;
    opts_init(&o);
    small_cfg(&o.cfg);
    o.steps = 2;
    char *dir = tmp_dir();
    char *out = par_path_join(dir, "g");
    o.out_dir = out;
    par_golden_summary sum;
    cr_assert_eq(par_golden_run_f64(&o, &sum), 0, "%s", par_last_error());
    cr_assert_eq(sum.steps, 2);

    par_model_f64 M; /* for the table only */
    cr_assert_eq(par_model_init_f64(&M, &o.cfg, 1), 0);
    char name[256], path[PATH_MAX];
    for (int k = 0; k <= 2; k++) {
        snprintf(path, sizeof path, "%s/params.%d.safetensors", out, k);
        par_st_file *f = NULL;
        cr_assert_eq(par_st_read(path, &f), 0, "%s", par_last_error());
        int expect = 0;
        for (int i = 0; i < M.tab.n; i++) {
            const par_param *p = &M.tab.p[i];
            const par_tensor *t = par_st_find(f, p->name);
            cr_assert(t, "params.%d lacks %s", k, p->name);
            cr_expect_eq(t->dtype, p->dtype == PAR_PDT_I32 ? PAR_I32 : PAR_F64, "%s", p->name);
            cr_expect_eq(par_tensor_numel(t), p->numel, "%s", p->name);
            expect++;
            if (k == 0)
                continue;
            if (p->opt == PAR_OPT_MUON) {
                snprintf(name, sizeof name, "opt.%s.momentum", p->name);
                cr_expect(par_st_find(f, name), "params.%d lacks %s", k, name);
                expect++;
            } else if (p->opt == PAR_OPT_ADAMW) {
                snprintf(name, sizeof name, "opt.%s.exp_avg", p->name);
                cr_expect(par_st_find(f, name), "params.%d lacks %s", k, name);
                snprintf(name, sizeof name, "opt.%s.exp_avg_sq", p->name);
                cr_expect(par_st_find(f, name), "params.%d lacks %s", k, name);
                expect += 2;
            }
        }
        cr_expect_eq(par_st_count(f), expect, "params.%d has %d tensors, expected %d", k, par_st_count(f), expect);
        par_st_close(f);
    }
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/step.%d.safetensors", out, k);
        par_st_file *f = NULL;
        cr_assert_eq(par_st_read(path, &f), 0, "%s", par_last_error());
        const par_tensor *t = par_st_find(f, "out.loss");
        cr_assert(t);
        cr_expect_eq(t->ndim, 0);
        cr_expect_eq(par_tensor_get_f64(t, 0), sum.step[k].loss);
        t = par_st_find(f, "out.grad_norm");
        cr_assert(t);
        cr_expect_eq(par_tensor_get_f64(t, 0), sum.step[k].grad_norm);
        static const char *must[] = {"input.tokens", "input.segments", "out.loss_main", "out.loss_mtp",
                                     "out.loss_aux", "out.logits", "out.mtp_logits", "act.layers.0",
                                     "act.layers.2", "act.mtp.0", "router.layers.0.idx", "router.layers.0.load",
                                     "router.mtp.0.idx", "router.mtp.0.load", "attn.layers.1.selected"};
        for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
            cr_expect(par_st_find(f, must[i]), "step.%d lacks %s", k, must[i]);
        /* only m == 4 layers have selections (v4-tiny: layer 1) */
        cr_expect(!par_st_find(f, "attn.layers.0.selected"));
        cr_expect(!par_st_find(f, "attn.layers.2.selected"));
        cr_expect(!par_st_find(f, "attn.mtp.0.selected"));
        t = par_st_find(f, "act.layers.1");
        cr_assert(t);
        cr_expect_eq(t->ndim, 4);
        cr_expect_eq(t->shape[0], 2);
        cr_expect_eq(t->shape[1], 32);
        cr_expect_eq(t->shape[2], 4);
        cr_expect_eq(t->shape[3], 32);
        t = par_st_find(f, "attn.layers.1.selected");
        cr_expect_eq(t->dtype, PAR_I32);
        cr_expect_eq(t->shape[2], 4);
        t = par_st_find(f, "router.layers.1.load");
        cr_expect_eq(t->dtype, PAR_I64);
        int64_t tot = 0;
        for (int64_t e = 0; e < t->shape[0]; e++)
            tot += ((const int64_t *)t->data)[e];
        cr_expect_eq(tot, 2 * 32 * 2, "loads sum to K*T");
        /* gradients: every parameter with one; none for gate.bias / tid2eid */
        int ngrad = 0;
        for (int i = 0; i < M.tab.n; i++) {
            const par_param *p = &M.tab.p[i];
            snprintf(name, sizeof name, "grad.%s", p->name);
            int has = par_st_find(f, name) != NULL;
            cr_expect_eq(has, p->dtype == PAR_PDT_REAL && p->has_grad, "%s", name);
            ngrad += has;
        }
        cr_expect_gt(ngrad, 100);
        cr_expect(!par_st_find(f, "grad.layers.1.ffn.gate.bias"));
        cr_expect(!par_st_find(f, "grad.layers.0.ffn.gate.tid2eid"));
        par_st_close(f);
    }
    /* the manifest lists every file with its hash */
    cJSON *man = NULL;
    snprintf(path, sizeof path, "%s/manifest.json", out);
    cr_assert_eq(par_json_read_file(path, &man), 0);
    const cJSON *files = par_json_obj(man, "files");
    cr_assert(files);
    cr_expect_eq(cJSON_GetArraySize(files), 7, "params.0..2, step.0..1, ties.0..1");
    check_ties(out, &sum);
    cr_expect_str_eq(par_json_str(par_json_obj(man, "layout"), "backend"), "self");
    cr_expect_str_eq(par_json_str(par_json_obj(man, "data"), "source"), "generator");
    cJSON_Delete(man);
    par_model_free_f64(&M);
    par_free(sum.step);
    par_remove_tree(dir);
    par_free(out);
    par_free(dir);
    cr_expect_eq(par_alloc_live_total(), 0, "%lld bytes live", (long long)par_alloc_live_total());
}

/* ties.K (issue 33): attn.layers.1.ties [B, S, S/4] of v4-tiny's one
 * ratio-4 layer; on a marked row the tie class spans the top-k boundary:
 * some marked entries picked, some not, every pick outside it. */
static void check_ties(const char *out, const par_golden_summary *sum)
{
    char path[PATH_MAX];
    int64_t tied_rows = 0;
    for (int k = 0; k < 2; k++) {
        par_st_file *tf = NULL, *sf = NULL;
        snprintf(path, sizeof path, "%s/ties.%d.safetensors", out, k);
        cr_assert_eq(par_st_read(path, &tf), 0, "%s", par_last_error());
        snprintf(path, sizeof path, "%s/step.%d.safetensors", out, k);
        cr_assert_eq(par_st_read(path, &sf), 0, "%s", par_last_error());
        const par_tensor *t = par_st_find(tf, "attn.layers.1.ties"), *sel = par_st_find(sf, "attn.layers.1.selected");
        cr_assert(t && sel && par_st_count(tf) == 1);
        cr_assert(t->dtype == PAR_I32 && t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 32 && t->shape[2] == 8);
        const int32_t *tv = t->data, *sv = sel->data;
        int64_t rows_tied = 0;
        for (int64_t r = 0; r < 2 * 32; r++) {
            int marked = 0, picked_marked = 0;
            for (int e = 0; e < 8; e++)
                marked += tv[r * 8 + e];
            for (int i = 0; i < 4; i++)
                picked_marked += sv[r * 4 + i] >= 0 && tv[r * 8 + sv[r * 4 + i]];
            if (!marked)
                continue;
            rows_tied++;
            cr_expect(picked_marked > 0 && picked_marked < marked, "row %lld: %d marked, %d of them picked",
                      (long long)r, marked, picked_marked);
        }
        cr_expect_eq(rows_tied, sum->step[k].index_rows[1]);
        tied_rows += rows_tied;
        par_st_close(tf);
        par_st_close(sf);
    }
    cr_expect_gt(tied_rows, 0, "the small config has exact ties (relu zeros of both heads)");
}

/* A failing run leaves nothing behind and an existing set untouched. */
Test(golden, atomic_on_failure)
{
    char *dir = tmp_dir();
    char *out = par_path_join(dir, "g");
    par_golden_opts o;
    opts_init(&o);
    small_cfg(&o.cfg);
    o.out_dir = out;
    cr_assert_eq(par_golden_run_f64(&o, NULL), 0, "%s", par_last_error());
    char *m = par_path_join(out, "manifest.json");
    void *before = NULL;
    size_t nb = 0;
    cr_assert_eq(par_file_read(m, PAR_TAG_MISC, &before, &nb), 0);
    /* a run that fails (unreadable --data) must not touch the existing set */
    o.data_path = "/nonexistent/parity-data.safetensors";
    par_err_set_quiet(1);
    cr_expect_neq(par_golden_run_f64(&o, NULL), 0);
    o.data_path = NULL;
    o.fixture = "no-such-fixture";
    cr_expect_neq(par_golden_run_f64(&o, NULL), 0);
    par_err_set_quiet(0);
    void *after = NULL;
    size_t na = 0;
    cr_assert_eq(par_file_read(m, PAR_TAG_MISC, &after, &na), 0);
    cr_expect(na == nb && !memcmp(before, after, nb), "manifest changed by a failed run");
    /* nothing but the set itself in the parent (no temporary left over) */
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
    cr_expect_eq(system(cmd), 0, "temporary directory left in %s", dir);
    par_free(before);
    par_free(after);
    par_free(m);
    par_remove_tree(dir);
    par_free(out);
    par_free(dir);
}

/* --data: rows are taken in order, global_batch_size rows per step. */
Test(golden, data_file_rows_in_order)
{
    char *dir = tmp_dir();
    char *dpath = par_path_join(dir, "data.safetensors");
    int64_t R = 4, S = 32;
    int32_t tok[4 * 32], seg[4 * 32];
    for (int64_t r = 0; r < R; r++)
        for (int64_t s = 0; s < S; s++) {
            tok[r * S + s] = (int32_t)((r * 31 + s * 7) % 128);
            seg[r * S + s] = (int32_t)(s < 10 + r ? 0 : 1);
        }
    int64_t shape[2] = {R, S};
    par_st_writer *w = NULL;
    cr_assert_eq(par_st_writer_new(&w), 0);
    par_tensor tt = par_tensor_view(PAR_I32, 2, shape, tok), ts = par_tensor_view(PAR_I32, 2, shape, seg);
    cr_assert_eq(par_st_writer_add(w, "input.tokens", &tt), 0);
    cr_assert_eq(par_st_writer_add(w, "input.segments", &ts), 0);
    cr_assert_eq(par_st_writer_write(w, dpath), 0);
    par_st_writer_free(w);

    par_golden_opts o;
    opts_init(&o);
    small_cfg(&o.cfg);
    o.steps = 2;
    o.data_path = dpath;
    char *out = par_path_join(dir, "g");
    o.out_dir = out;
    cr_assert_eq(par_golden_run_f64(&o, NULL), 0, "%s", par_last_error());
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/step.1.safetensors", out);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(path, &f), 0);
    const par_tensor *t = par_st_find(f, "input.tokens");
    cr_assert(t);
    cr_expect(!memcmp(t->data, tok + 2 * S, (size_t)(2 * S) * sizeof(int32_t)), "step 1 is not rows 2..3");
    t = par_st_find(f, "input.segments");
    cr_expect(!memcmp(t->data, seg + 2 * S, (size_t)(2 * S) * sizeof(int32_t)));
    par_st_close(f);
    /* three steps need 6 rows: refused */
    o.steps = 3;
    par_err_set_quiet(1);
    cr_expect_eq(par_golden_run_f64(&o, NULL), PAR_EINVAL);
    par_err_set_quiet(0);
    cr_expect(strstr(par_last_error(), "rows") != NULL, "%s", par_last_error());
    par_remove_tree(dir);
    par_free(out);
    par_free(dpath);
    par_free(dir);
}

/* ------------------------------------------------- through the binary -- */

static int parity_bin(char *buf, size_t n)
{
    char self[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        return 0;
    self[k] = 0;
    /* BUILD/tests/model/test_model_golden -> BUILD/parity */
    for (int i = 0; i < 3; i++) {
        char *s = strrchr(self, '/');
        if (!s)
            return 0;
        *s = 0;
    }
    snprintf(buf, n, "%s/parity", self);
    return access(buf, X_OK) == 0;
}

static double read_scalar(const char *dir, const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/step.0.safetensors", dir);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(path, &f), 0, "%s", par_last_error());
    const par_tensor *t = par_st_find(f, name);
    cr_assert(t, "%s lacks %s", path, name);
    double v = par_tensor_get_f64(t, 0);
    par_st_close(f);
    return v;
}

Test(golden, f32_agrees_with_f64_on_the_loss)
{
    char bin[PATH_MAX + 16];
    if (!parity_bin(bin, sizeof bin))
        cr_skip_test("parity binary not found next to the test build");
    char *dir = tmp_dir();
    char cmd[3 * PATH_MAX];
    const char *prec[2] = {"f64", "f32"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "'%s' golden --preset v4-tiny --fixture tiny-boundary-mix --steps 1 --precision %s "
                 "--out '%s/%s' --quiet > /dev/null",
                 bin, prec[i], dir, prec[i]);
        cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    }
    char d64[PATH_MAX], d32[PATH_MAX];
    snprintf(d64, sizeof d64, "%s/f64", dir);
    snprintf(d32, sizeof d32, "%s/f32", dir);
    static const char *names[] = {"out.loss", "out.loss_main", "out.loss_mtp", "out.loss_aux", "out.grad_norm"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        double a = read_scalar(d64, names[i]), b = read_scalar(d32, names[i]);
        double rel = fabs(a - b) / fabs(a);
        fprintf(stderr, "%s: f64 %.12g f32 %.9g rel %.2e\n", names[i], a, b, rel);
        cr_expect_lt(rel, names[i][4] == 'g' ? 1e-3 : 1e-4, "%s: f64 %.12g vs f32 %.9g (rel %.2e)", names[i], a,
                     b, rel);
    }
    /* the CLI's refusals exit 2 */
    snprintf(cmd, sizeof cmd, "'%s' golden --preset v4-nope --out '%s/x' 2>/dev/null", bin, dir);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "'%s' golden --preset v4-pro --out '%s/x' 2>/dev/null", bin, dir);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "'%s' golden --preset v4-tiny --set no_such_key=1 --out '%s/x' 2>/dev/null", bin, dir);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "'%s' golden --preset v4-tiny --data /nonexistent --out '%s/x' 2>/dev/null", bin, dir);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "test ! -e '%s/x'", dir);
    cr_expect_eq(system(cmd), 0, "a refused run created its output");
    par_remove_tree(dir);
    par_free(dir);
}

/* The matrix's shortcuts (issue 29 item 4): a set written with durability
 * off is the same set, and a compare with trust_hashes skips the sha256 of the
 * files (a manifest whose listed hash no longer matches: refused when
 * verified, compared when trusted). */
Test(golden, scratch_writes_and_trusted_hashes)
{
    char *dir = tmp_dir();
    char *a = par_path_join(dir, "a"), *b = par_path_join(dir, "b");
    par_golden_opts o;
    opts_init(&o);
    small_cfg(&o.cfg);
    o.out_dir = a;
    cr_assert_eq(par_golden_run_f64(&o, NULL), 0, "%s", par_last_error());
    cr_assert_eq(par_file_set_durable(0), 1, "durable by default");
    o.out_dir = b;
    cr_assert_eq(par_golden_run_f64(&o, NULL), 0, "%s", par_last_error());
    cr_assert_eq(par_file_set_durable(1), 0);
    par_compare_opts co;
    par_compare_opts_init(&co);
    cr_expect_eq(co.trust_hashes, 0);
    co.policy = PAR_POLICY_BITWISE;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(a, b, &co, &r), 0, "%s", par_last_error());
    cr_expect(par_compare_report_ok(r), "a set written without fsync differs");
    par_compare_report_free(r);
    /* B's manifest lists another hash for params.0 */
    char *m = par_path_join(b, "manifest.json");
    char *text = NULL;
    size_t n = 0;
    cr_assert_eq(par_file_read(m, PAR_TAG_MISC, (void **)&text, &n), 0);
    char *at = strstr(text, "\"params.0.safetensors\"");
    cr_assert(at);
    at = strchr(at + 22, '"');
    cr_assert(at);
    at[1] = at[1] == '0' ? '1' : '0';
    cr_assert_eq(par_file_write_atomic(m, text, n), 0);
    par_err_set_quiet(1);
    cr_expect_eq(par_compare_paths(a, b, &co, &r), PAR_EMISMATCH, "verified: the hash is checked");
    par_err_set_quiet(0);
    co.trust_hashes = 1;
    cr_assert_eq(par_compare_paths(a, b, &co, &r), 0, "%s", par_last_error());
    cr_expect(par_compare_report_ok(r));
    par_compare_report_free(r);
    par_free(text);
    par_free(m);
    par_remove_tree(dir);
    par_free(a);
    par_free(b);
    par_free(dir);
}
