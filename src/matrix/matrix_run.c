/* matrix/matrix_run.c - the matrix's runner: one producer per cell kind,
 * the comparison of a cell's set with its reference and its diagnosis
 * (root cause first, with the owning rank), the run loop (see
 * matrix/matrix.h and docs/matrix.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/netmodel.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "model/goldenset.h"
#include "model/rootcause.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/ckpt/ckpt_owner.h"
#include "parallel/train/run.h"
#include "matrix/matrix-impl.h"
#include "matrix/matrix_plan.h"
#include "matrix/rankof.h"
#include "parallel/train/run_summary.h"

const char *par_cell_verdict_name(par_cell_verdict v)
{
    switch (v) {
    case PAR_CELL_PASS: return "PASS";
    case PAR_CELL_FAIL: return "FAIL";
    case PAR_CELL_ERROR: return "ERROR";
    case PAR_CELL_WARN: return "WARN";
    default: return "-";
    }
}

/* ---- layout runs ------------------------------------------------------ */

/* The in-process backend of a layout run of `world` ranks: be_name (the
 * cell's own "backend", or a vs-backend cell's reference backend), else the
 * matrix's --backend, else the default rule (opts.pick_backend); recorded in
 * res (NULL: not recorded) with how it was chosen. */
static const par_backend *cell_backend(const par_matrix *m, const char *be_name, int64_t world,
                                       par__matrix_result *res)
{
    const par_backend *be = m->o.backend_impl;
    char why[240] = "the matrix's --backend";
    if (be_name[0]) {
        be = m->o.find_backend ? m->o.find_backend(be_name) : NULL;
        par__matrix_fmt(why, sizeof why, "the cell's own \"backend\"");
    } else if (!be && m->o.pick_backend) {
        be = m->o.pick_backend(world, why, sizeof why);
    }
    if (!res)
        return be;
    par__matrix_fmt(res->backend, sizeof res->backend, "%s", be ? par_backend_name(be) : "");
    par__matrix_fmt(res->backend_why, sizeof res->backend_why, "%s", why);
    return be;
}

par_status par_matrix_run_layout_in_process(const par_layout_job *job, void *ud, cJSON **summary)
{
    const par_backend *be = ud;
    if (!be)
        return par_err(PAR_EUNSUPPORTED, "matrix: cell %s runs a layout but no backend is available", job->cell);
    par_netmodel net;
    par_status s = par_netmodel_preset("reference", &net);
    if (!s && job->layout->gpus_per_node > 0) {
        net.gpus_per_node = (int)job->layout->gpus_per_node;
        s = par_netmodel_validate(&net);
    }
    if (s)
        return s;
    par_run_opts o;
    par_run_opts_init(&o);
    o.cfg = *job->cfg;
    o.precision = job->precision;
    o.steps = job->steps;
    o.seed = job->seed;
    o.fixture = job->fixture;
    o.data_path = job->data_path;
    o.fixtures_dir = job->fixtures_dir;
    o.backend = be;
    o.moe_dispatch = !strcmp(job->layout->moe_dispatch, "hierarchical");
    if ((s = par_cell_layout_to(job->layout, &o.layout)))
        return s;
    o.dump_dir = job->dump_dir;
    o.save_dir = job->save_dir;
    o.netmodel = &net;
    /* worlds of thousands of ranks on two cores (the scale tier): one rank's wait on rank 0's dump
     * writes or the slowest stage outlasts comm's 120 s default; PARITY_COMM_TIMEOUT still wins */
    if (o.layout.world > 1024 && !getenv("PARITY_COMM_TIMEOUT"))
        o.timeout_s = 3600;
    par_ckpt *ck = NULL;
    if (job->load_dir && (s = par_ckpt_open(job->load_dir, &ck)))
        return s;
    o.load = ck;
    par_run_summary sum;
    s = par_run(&o, &sum);
    par_ckpt_close(ck);
    if (s)
        return s;
    cJSON *doc = par_run_summary_json(&sum, job->preset, job->precision);
    if (doc) /* the planner's figures next to the run's (matrix_plan.c) */
        par__matrix_plan_attach(doc, job->cfg, job->precision, &sum, &net);
    par_run_summary_free(&sum);
    if (!doc)
        return par_err(PAR_ENOMEM, "matrix: out of memory for a run summary");
    *summary = doc;
    return PAR_OK;
}

/* The memory check of the cell's run under cl in this process. */
static par_status layout_mem_check(const par_matrix *m, const par__matrix_cell *c, const par_cell_layout *cl, int prec,
                                   int64_t steps)
{
    par_layout pl;
    if (par_cell_layout_to(cl, &pl)) { /* the run reports it */
        par_clear_error();
        return PAR_OK;
    }
    par_status s = par__matrix_mem_check(m, &c->cfg, &pl, prec, steps);
    return s ? par_err(s, "layout run: %s", par_last_error()) : PAR_OK;
}

/* Runs `steps` steps of the cell's data under cl through the runner, on
 * the backend named be_name ("": the matrix's or the default rule's) when in
 * this process, recorded in res (NULL: not); the run's summary in *out. */
static par_status run_layout_on(par_matrix *m, const par__matrix_cell *c, const par_cell_layout *cl, int64_t steps,
                                const char *dump, const char *save, const char *load, const char *work_dir,
                                const char *tag, const char *be_name, par__matrix_result *res, cJSON **out)
{
    const char *sets[PAR_CELL_MAX_SETS];
    int ns = 0;
    while (ns < PAR_CELL_MAX_SETS && c->row.sets[ns][0]) {
        sets[ns] = c->row.sets[ns];
        ns++;
    }
    par_layout l;
    par_status s = par_cell_layout_resolve(cl, &c->cfg, &l);
    if (s)
        return s;
    par_layout_job job = {
        .cell = c->row.name, .preset = c->row.preset, .sets = sets, .n_sets = ns, .cfg = &c->cfg,
        .precision = c->row.precision ? c->row.precision : 64, .fixture = c->fixture[0] ? c->fixture : NULL,
        .data_path = c->data_path[0] ? c->data_path : NULL, .fixtures_dir = m->fixtures_dir, .steps = steps,
        .seed = c->seed, .layout = cl, .world = l.world, .dump_dir = dump, .save_dir = save, .load_dir = load,
        .work_dir = work_dir, .tag = tag,
    };
    cJSON *doc = NULL;
    if (!m->o.runner && (s = layout_mem_check(m, c, cl, job.precision, steps))) /* an MPI job checks its own */
        return s;
    if (m->o.runner) {
        s = m->o.runner(&job, m->o.runner_ud, &doc);
    } else {
        const par_backend *be = cell_backend(m, be_name, l.world, res);
        if (!be && be_name[0])
            return par_err(PAR_EUNSUPPORTED, "matrix: cell %s runs on the %s backend, which this matrix cannot find",
                           c->row.name, be_name);
        s = par_matrix_run_layout_in_process(&job, (void *)be, &doc);
    }
    if (!s)
        *out = doc;
    return s;
}

/* run_layout_on the cell's own backend; the summary and its metrics in res. */
static par_status run_layout(par_matrix *m, const par__matrix_cell *c, const par_cell_layout *cl, int64_t steps,
                             const char *dump, const char *save, const char *load, const char *work_dir,
                             const char *tag, par__matrix_result *res)
{
    cJSON *doc = NULL;
    par_status s = run_layout_on(m, c, cl, steps, dump, save, load, work_dir, tag, c->row.backend, res, &doc);
    if (s)
        return s;
    par_run_summary_metrics(doc, &res->met.step_time_s, &res->met.bubble, &res->met.exposed_comm_s);
    cJSON_Delete(res->run);
    res->run = doc;
    return PAR_OK;
}

/* ---- producers: the cell's golden set into set_dir (or *cand: another) */

/* layout: the run under the cell's layout; a vs-backend cell first runs
 * the same layout on that backend into CELL/ref-set (its reference). */
static par_status prod_layout(par_matrix *m, const par__matrix_cell *c, const char *work_dir, const char *set_dir,
                              const char **cand, par__matrix_result *res)
{
    (void)cand;
    if (c->ref == PAR_REF_BACKEND) {
        char ref_dir[PAR_MX_PATH + 16];
        par__matrix_fmt(ref_dir, sizeof ref_dir, "%s/ref-set", work_dir);
        cJSON_Delete(res->ref_run);
        res->ref_run = NULL;
        par_status s = run_layout_on(m, c, &c->row.layout, c->steps, ref_dir, NULL, NULL, work_dir, "ref",
                                     c->row.vs_backend, NULL, &res->ref_run);
        if (s)
            return s;
    }
    return run_layout(m, c, &c->row.layout, c->steps, set_dir, NULL, NULL, work_dir, "run", res);
}

/* A chain's second and third legs: split..split2-1 loaded under load-layout
 * and saved again, the rest loaded under chain-layout; the three sets merged
 * at split and split2. */
static par_status chain_rest(par_matrix *m, const par__matrix_cell *c, const char *work_dir, const char *set_dir,
                             const char *d1, const char *ck, par__matrix_result *res)
{
    const int64_t split2 = c->split + (c->steps - c->split) / 2;
    char d2[PAR_MX_PATH], d3[PAR_MX_PATH], ck2[PAR_MX_PATH], mid[PAR_MX_PATH];
    par__matrix_fmt(d2, sizeof d2, "%s/second", work_dir);
    par__matrix_fmt(d3, sizeof d3, "%s/third", work_dir);
    par__matrix_fmt(ck2, sizeof ck2, "%s/ckpt2", work_dir);
    par__matrix_fmt(mid, sizeof mid, "%s/first-second", work_dir);
    par_status s = run_layout(m, c, &c->row.load_layout, split2, d2, ck2, ck, work_dir, "second", res);
    if (!s)
        s = run_layout(m, c, &c->row.chain_layout, c->steps, d3, NULL, ck2, work_dir, "third", res);
    if (!s)
        s = par_goldenset_merge(d1, d2, c->split, mid);
    if (!s)
        s = par_goldenset_merge(mid, d3, split2, set_dir);
    return s;
}

/* resume: split steps under layout saved to a checkpoint, the rest loaded
 * under load-layout (--steps the total: it runs split..steps-1), both dumped; the cell's set is the first run's steps
 * before the checkpoint and the resumed run's after it. */
static par_status prod_resume(par_matrix *m, const par__matrix_cell *c, const char *work_dir, const char *set_dir,
                              const char **cand, par__matrix_result *res)
{
    (void)cand;
    char d1[PAR_MX_PATH], d2[PAR_MX_PATH], ck[PAR_MX_PATH];
    par__matrix_fmt(d1, sizeof d1, "%s/first", work_dir);
    par__matrix_fmt(d2, sizeof d2, "%s/resumed", work_dir);
    par__matrix_fmt(ck, sizeof ck, "%s/ckpt", work_dir);
    par_status s = run_layout(m, c, &c->row.layout, c->split, d1, ck, NULL, work_dir, "first", res);
    if (!par_cell_layout_empty(&c->row.chain_layout))
        return s ? s : chain_rest(m, c, work_dir, set_dir, d1, ck, res);
    if (!s)
        s = run_layout(m, c, &c->row.load_layout, c->steps, d2, NULL, ck, work_dir, "resumed", res); /* the total */
    if (!s)
        s = par_goldenset_merge(d1, d2, c->split, set_dir);
    return s;
}

/* ckpt-reshard: steps under layout saved, the checkpoint resharded to
 * load-layout with the driver's ownership; PAR_ECHECK when the two differ
 * in state or in any tensor bit. */
static par_status prod_ckpt_reshard(par_matrix *m, const par__matrix_cell *c, const char *work_dir, const char *set_dir,
                                    const char **cand, par__matrix_result *res)
{
    (void)set_dir;
    (void)cand;
    char a[PAR_MX_PATH], b[PAR_MX_PATH];
    par__matrix_fmt(a, sizeof a, "%s/ckpt", work_dir);
    par__matrix_fmt(b, sizeof b, "%s/resharded", work_dir);
    par_layout to;
    par_status s = run_layout(m, c, &c->row.layout, c->steps, NULL, a, NULL, work_dir, "run", res);
    if (!s)
        s = par_cell_layout_resolve(&c->row.load_layout, &c->cfg, &to);
    if (!s)
        s = par_ckpt_reshard(a, b, &to, par_ckpt_owner_driver, NULL);
    par_ckpt_diff_result d;
    if (!s)
        s = par_ckpt_diff(a, b, NULL, &d);
    if (!s && !(d.state_equal && d.tensors_equal))
        s = par_err(PAR_ECHECK, "%s resharded to %s differs from it: %d tensors differ%s%s; first: %s", a, b,
                    d.n_tensors_diff, d.state_equal ? "" : ", training state differs", "", d.first);
    return s;
}

static par_status prod_data_file(par_matrix *m, const par__matrix_cell *c, const char *work_dir, const char *set_dir,
                                 const char **cand, par__matrix_result *res)
{
    (void)cand;
    (void)res;
    const char *ref;
    par_status s = par__matrix_serial(m, c, 64, 0, &ref);
    char data[PAR_MX_PATH];
    par__matrix_fmt(data, sizeof data, "%s/data.safetensors", work_dir);
    if (!s)
        s = par_goldenset_write_batches(ref, c->steps, data);
    if (!s)
        s = par__matrix_golden_run(m, &c->cfg, 64, NULL, data, c->steps, c->seed, set_dir);
    return s;
}

static par_status produce(par_matrix *m, const par__matrix_cell *c, const char *work_dir, const char *set_dir,
                          const char **cand, par__matrix_result *res)
{
    switch (c->row.kind) {
    case PAR_KIND_GOLDEN: return par__matrix_serial(m, c, 64, 0, cand);
    case PAR_KIND_REPEAT:
        if (c->row.rows_per_block) /* the row-blocked golden against the one-shot reference */
            return par__matrix_golden_run_rows(m, &c->cfg, 64, c->fixture, c->data_path, c->steps, c->seed,
                                               set_dir, c->row.rows_per_block);
        return par__matrix_golden_run(m, &c->cfg, 64, c->fixture, c->data_path, c->steps, c->seed, set_dir);
    case PAR_KIND_SERIAL: return par__matrix_serial(m, c, c->row.precision ? c->row.precision : 64, 0, cand);
    case PAR_KIND_DATA_FILE: return prod_data_file(m, c, work_dir, set_dir, cand, res);
    case PAR_KIND_LAYOUT: return prod_layout(m, c, work_dir, set_dir, cand, res);
    case PAR_KIND_RESUME: return prod_resume(m, c, work_dir, set_dir, cand, res);
    case PAR_KIND_CKPT_RESHARD: return prod_ckpt_reshard(m, c, work_dir, set_dir, cand, res);
    default: return par_err(PAR_EINTERNAL, "matrix: cell %s has kind %d", c->row.name, (int)c->row.kind);
    }
}

/* ---- the golden cell's own check -------------------------------------- */

/* Every float value of one file finite. */
static par_status check_finite(const par_st_file *f, const char *path)
{
    for (int i = 0; i < par_st_count(f); i++) {
        const par_tensor *t = par_st_tensor(f, i);
        if (!par_dtype_is_float(t->dtype))
            continue;
        int64_t n = par_tensor_numel(t);
        for (int64_t j = 0; j < n; j++) {
            double v = par_tensor_get_f64(t, j);
            if (!isfinite(v))
                return par_err(PAR_ECHECK, "%s: '%s' element %lld is %g (every value must be finite)", path,
                               par_st_name(f, i), (long long)j, v);
        }
    }
    return PAR_OK;
}

/* out.loss = loss_main + mtp_lambda loss_mtp + aux_alpha loss_aux. */
static par_status check_loss_sum(const par_config *cfg, const par_st_file *f, const char *path)
{
    static const char *const nm[4] = {"out.loss", "out.loss_main", "out.loss_mtp", "out.loss_aux"};
    double v[4];
    for (int q = 0; q < 4; q++) {
        const par_tensor *t = par_st_find(f, nm[q]);
        if (!t || par_tensor_numel(t) != 1 || !par_dtype_is_float(t->dtype))
            return par_err(PAR_ECHECK, "%s: no scalar '%s'", path, nm[q]);
        v[q] = par_tensor_get_f64(t, 0);
    }
    double sum = v[1] + cfg->mtp_lambda * v[2] + cfg->aux_alpha * v[3];
    double tol = (par_st_find(f, nm[0])->dtype == PAR_F64 ? 1e-12 : 1e-5) * fmax(1.0, fabs(v[0]));
    if (!(fabs(v[0] - sum) <= tol))
        return par_err(PAR_ECHECK,
                       "%s: out.loss %.17g != loss_main + %g loss_mtp + %g loss_aux = %.17g (|diff| %.3e > %.1e)",
                       path, v[0], cfg->mtp_lambda, cfg->aux_alpha, sum, fabs(v[0] - sum), tol);
    return PAR_OK;
}

/* golden: every float tensor finite, and each step's loss the sum of its
 * terms. */
static par_status check_sane(const par__matrix_cell *c, const char *cand_dir)
{
    for (int64_t k = 0; k <= c->steps; k++) {
        for (int kind = 0; kind < 2; kind++) {
            if (kind == PAR_SETFILE_STEP && k == c->steps)
                continue;
            char fn[64], path[PAR_MX_PATH];
            par_setfile_name((par_setfile_kind)kind, k, fn, sizeof fn);
            par__matrix_fmt(path, sizeof path, "%s/%s", cand_dir, fn);
            par_st_file *f = NULL;
            par_status s = par_st_read(path, &f);
            if (!s)
                s = check_finite(f, path);
            if (!s && kind == PAR_SETFILE_STEP)
                s = check_loss_sum(&c->cfg, f, path);
            par_st_close(f);
            if (s)
                return s;
        }
    }
    return PAR_OK;
}

/* ---- comparing and diagnosing ----------------------------------------- */

static double entry_frac(const par_cmp_entry *e)
{
    if (!strcmp(e->mode, "f64") || !strcmp(e->mode, "f32") || !strcmp(e->mode, "bf16") ||
        !strcmp(e->mode, "override")) {
        if (e->bound > 0)
            return e->diff_norm / e->bound;
        return e->diff_norm > 0 ? INFINITY : 0;
    }
    return NAN;
}

/* 1 if e is worse than w. */
static int entry_worse(const par_cmp_entry *e, const par_cmp_entry *w)
{
    if (!w)
        return 1;
    if (!e->pass != !w->pass)
        return !e->pass;
    double fe = entry_frac(e), fw = entry_frac(w);
    fe = isnan(fe) ? (e->n_diff ? INFINITY : 0) : fe;
    fw = isnan(fw) ? (w->n_diff ? INFINITY : 0) : fw;
    if (fe != fw)
        return fe > fw;
    if (e->n_diff != w->n_diff)
        return e->n_diff > w->n_diff;
    return e->rel_l2 > w->rel_l2;
}

/* Base name of a file label ("dir/step.1.safetensors" -> "step.1"). */
static void short_file(const char *file, char *buf, size_t n)
{
    const char *b = strrchr(file, '/');
    b = b ? b + 1 : file;
    par__matrix_fmt(buf, n, "%s", b);
    char *dot = strstr(buf, ".safetensors");
    if (dot)
        *dot = 0;
}

static void fill_worst(par__matrix_result *res, const par_compare_report *r)
{
    const par_cmp_entry *w = NULL;
    for (int i = 0; i < res->n_entries; i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (entry_worse(e, w))
            w = e;
    }
    /* A clean comparison with nothing differing has no worst tensor. */
    if (!w || (w->pass && w->n_diff == 0 && w->diff_norm == 0))
        return;
    short_file(w->file, res->worst_file, sizeof res->worst_file);
    par__matrix_fmt(res->worst_tensor, sizeof res->worst_tensor, "%s", w->tensor[0] ? w->tensor : "(file)");
    par__matrix_fmt(res->worst_mode, sizeof res->worst_mode, "%s", w->mode);
    res->worst_rel_l2 = w->rel_l2;
    res->worst_max_abs = w->max_abs;
    res->worst_frac = entry_frac(w);
    res->worst_ndiff = w->n_diff;
}

/* The root entry's first listed element: coordinates, values, decoded
 * meaning, and the rank of each parallel side's layout that owned it. */
static void describe_root(const par_cmp_entry *e, const par_rankof *ra, const par_rankof *rb, char *buf, size_t n)
{
    buf[0] = 0;
    if (e->nlist <= 0)
        return;
    const par_cmp_elem *el = &e->list[0];
    char c[160], ranks[300] = "";
    par_shape_str(e->ndim, el->coord, c, sizeof c);
    const par_rankof *side[2] = {ra, rb};
    static const char *const lab[2] = {"A's layout", "B's layout"};
    for (int k = 0; k < 2; k++) {
        char one[200];
        size_t o = strlen(ranks);
        if (side[k] && par_rankof_describe(side[k], e->file, e->tensor, e->ndim, el->coord, one, sizeof one))
            par__matrix_fmt(ranks + o, sizeof ranks - o, "; %s (%s)", one, lab[k]);
    }
    if (par_dtype_is_float(e->dtype))
        par__matrix_fmt(buf, n, "%s %s A=%.17g B=%.17g%s%s%s", e->nlist > 1 ? "largest at" : "at", c, el->a, el->b,
                   el->where[0] ? " " : "", el->where, ranks);
    else
        par__matrix_fmt(buf, n, "first at %s A=%lld B=%lld%s%s%s", c, (long long)el->ia, (long long)el->ib,
                   el->where[0] ? " " : "", el->where, ranks);
}

/* The verdict line of a failing comparison: the first divergent tensor in
 * dataflow order (model/rootcause.h), its element and owning rank, the
 * integer mismatches it explains, and the worst entry when another. */
static void diagnose(par__matrix_result *res, const par_compare_report *r, const char *ref_dir, const char *cand_dir)
{
    par_root_cause rc;
    par_compare_root_cause(r, &rc);
    if (rc.root < 0 && rc.n_missing > 0) { /* an entry on one side only is no divergence (model/rootcause.h) */
        const par_cmp_entry *q = par_compare_report_entry(r, rc.first_missing);
        char qf[64];
        short_file(q->file, qf, sizeof qf);
        par__matrix_fmt(res->diagnosis, sizeof res->diagnosis, "%d of %d entries fail (%s policy), no value "
                        "diverged: each is on one side only (first %s %s: %s)", res->n_failed, res->n_entries,
                        res->policy, qf, q->tensor[0] ? q->tensor : "(file)", q->reason);
        return;
    }
    if (rc.root < 0)
        return;
    const par_cmp_entry *e = par_compare_report_entry(r, rc.root);
    par_rankof ra, rb;
    int ha = par_rankof_from_set(ref_dir, &ra) == PAR_OK, hb = par_rankof_from_set(cand_dir, &rb) == PAR_OK;
    short_file(e->file, res->root_file, sizeof res->root_file);
    par__matrix_fmt(res->root_tensor, sizeof res->root_tensor, "%s", e->tensor[0] ? e->tensor : "(file)");
    describe_root(e, ha ? &ra : NULL, hb ? &rb : NULL, res->root_where, sizeof res->root_where);
    res->n_consequences = rc.n_consequences;
    int k = par__matrix_fmt(res->diagnosis, sizeof res->diagnosis,
                       "%d of %d entries fail (%s policy); first divergence %s %s: %s%s%s", res->n_failed,
                       res->n_entries, res->policy, res->root_file, res->root_tensor, e->reason,
                       res->root_where[0] ? "; " : "", res->root_where);
    if (k > 0 && (size_t)k < sizeof res->diagnosis && rc.n_consequences > 0) {
        const par_cmp_entry *q = par_compare_report_entry(r, rc.first_consequence);
        char qf[64];
        short_file(q->file, qf, sizeof qf);
        k += par__matrix_fmt(res->diagnosis + k, sizeof res->diagnosis - (size_t)k,
                        "; consequences: %d integer mismatch%s downstream (first %s %s)", rc.n_consequences,
                        rc.n_consequences > 1 ? "es" : "", qf, q->tensor);
    }
    if (k > 0 && (size_t)k < sizeof res->diagnosis && res->worst_tensor[0] &&
        (strcmp(res->worst_file, res->root_file) || strcmp(res->worst_tensor, res->root_tensor)))
        par__matrix_fmt(res->diagnosis + k, sizeof res->diagnosis - (size_t)k, "; worst %s %s", res->worst_file,
                   res->worst_tensor);
}

static int pick_files(par_setfile_kind kind, int64_t k, void *ud)
{
    par_cell_files f = *(const par_cell_files *)ud;
    if (f == PAR_FILES_STEPS_AND_INIT)
        return kind == PAR_SETFILE_STEP || k == 0;
    if (f == PAR_FILES_UPDATED)
        return kind == PAR_SETFILE_PARAMS && k > 0;
    return 1;
}

static void write_reports(par__matrix_result *res, const par_compare_report *r)
{
    par__matrix_fmt(res->report_json, sizeof res->report_json, "%s/compare.json", res->dir);
    if (par_compare_report_write_json(r, res->report_json) != PAR_OK) {
        par_log(PAR_LOG_WARN, "matrix: %s", par_last_error());
        res->report_json[0] = 0;
    }
    char txt[PAR_MX_PATH + 16];
    par__matrix_fmt(txt, sizeof txt, "%s/compare.txt", res->dir);
    FILE *f = fopen(txt, "w");
    if (f) {
        par_compare_report_print(r, f, 0);
        fclose(f);
    }
}

/* Compares the cell's set with its reference; the verdict. */
static par_status compare_cell(const par__matrix_cell *c, par__matrix_result *res, const char *ref, const char *cand)
{
    char sel_a[PAR_MX_PATH + 8], sel_b[PAR_MX_PATH + 8];
    par_status s = PAR_OK;
    if (c->row.files != PAR_FILES_ALL) {
        par_cell_files f = c->row.files;
        par__matrix_fmt(sel_a, sizeof sel_a, "%s/cmp-ref", res->dir);
        par__matrix_fmt(sel_b, sizeof sel_b, "%s/cmp-cand", res->dir);
        if ((s = par_goldenset_select(ref, sel_a, pick_files, &f)) ||
            (s = par_goldenset_select(cand, sel_b, pick_files, &f)))
            return par__matrix_last_error(res->diagnosis, sizeof res->diagnosis, "selecting files: "), s;
        ref = sel_a;
        cand = sel_b;
    }
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = c->policy;
    /* Both sets were written (and hashed) by this run a moment ago; a checked-in
     * set (a golden cell's reference) is hashed as any user's input. */
    co.trust_hashes = c->ref != PAR_REF_DIR;
    par_compare_report *r = NULL;
    if ((s = par_compare_paths(ref, cand, &co, &r)))
        return par__matrix_last_error(res->diagnosis, sizeof res->diagnosis, "compare: "), s;
    res->n_entries = par_compare_report_count(r);
    res->n_failed = par_compare_report_failed(r);
    par__matrix_fmt(res->policy, sizeof res->policy, "%s", par_policy_name(par_compare_report_policy(r)));
    fill_worst(res, r);
    res->verdict = par_compare_report_ok(r) ? PAR_CELL_PASS : c->row.informational ? PAR_CELL_WARN : PAR_CELL_FAIL;
    if (res->verdict != PAR_CELL_PASS) {
        diagnose(res, r, ref, cand);
        write_reports(res, r);
    }
    par_compare_report_free(r);
    return PAR_OK;
}

/* ---- the run's figures: the other backend's, the pinned clock ---------- */

/* 1 if two numbers print the same in a JSON document (cJSON: 15
 * significant digits where they give the double back within an ulp, else
 * 17): what a run summary file says of a figure, and so what a pin holds. */
static int same_printed(const cJSON *a, const cJSON *b)
{
    char *pa = cJSON_PrintUnformatted(a), *pb = cJSON_PrintUnformatted(b);
    int same = pa && pb && !strcmp(pa, pb);
    cJSON_free(pa);
    cJSON_free(pb);
    return same;
}

/* The first difference of two JSON values under path (exact: numbers by
 * ==, or as printed when printed is set; null for NaN), into buf; the
 * number of differing leaves. */
static int json_diff(const cJSON *a, const cJSON *b, const char *path, int printed, char *buf, size_t n)
{
    char sub[256];
    if (!a || !b || (a->type & 0xFF) != (b->type & 0xFF)) {
        if (!buf[0])
            par__matrix_fmt(buf, n, "%s: %s vs %s", path, a ? "present" : "absent", b ? "present" : "absent");
        return 1;
    }
    if (cJSON_IsNumber(a) || cJSON_IsString(a) || cJSON_IsBool(a)) {
        int same = cJSON_IsNumber(a) ? (printed ? same_printed(a, b) : a->valuedouble == b->valuedouble)
                   : cJSON_IsString(a) ? !strcmp(a->valuestring, b->valuestring) : 1;
        if (!same && !buf[0] && cJSON_IsNumber(a))
            par__matrix_fmt(buf, n, "%s: %.17g vs %.17g", path, a->valuedouble, b->valuedouble);
        else if (!same && !buf[0])
            par__matrix_fmt(buf, n, "%s: '%s' vs '%s'", path, a->valuestring, b->valuestring);
        return !same;
    }
    int d = 0;
    if (cJSON_IsArray(a)) {
        int na = cJSON_GetArraySize(a), nb = cJSON_GetArraySize(b);
        for (int i = 0; i < (na > nb ? na : nb); i++) {
            par__matrix_fmt(sub, sizeof sub, "%s[%d]", path, i);
            d += json_diff(cJSON_GetArrayItem(a, i), cJSON_GetArrayItem(b, i), sub, printed, buf, n);
        }
        return d;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        par__matrix_fmt(sub, sizeof sub, "%s.%s", path, e->string);
        d += json_diff(e, cJSON_GetObjectItemCaseSensitive(b, e->string), sub, printed, buf, n);
    }
    cJSON_ArrayForEach(e, b) if (!cJSON_GetObjectItemCaseSensitive(a, e->string)) {
        par__matrix_fmt(sub, sizeof sub, "%s.%s", path, e->string);
        d += json_diff(NULL, e, sub, printed, buf, n);
    }
    return d;
}

/* What a run's summary says of the emulated clock and its traffic: the
 * pinned figures (docs/matrix.md "The emulated clock, pinned"). */
static const char *const CLOCK_KEYS[] = {"emulated", "pipeline", "expert_parallel", "context_parallel"};
/* ... and what a run on another backend must repeat exactly besides them
 * (and the per-rank memory table, backend_diff: the accounted bytes and the
 * allocator's peaks, counters a fiber rank carries across switches). */
static const char *const RUN_KEYS[] = {"emulated", "pipeline", "expert_parallel", "context_parallel", "loads",
                                       "n_params", "max_rank_floats"};

static int summary_diff(const cJSON *a, const cJSON *b, const char *const *keys, int nk, int printed, char *buf,
                        size_t n)
{
    int d = 0;
    buf[0] = 0;
    for (int k = 0; k < nk; k++)
        d += json_diff(cJSON_GetObjectItemCaseSensitive(a, keys[k]), cJSON_GetObjectItemCaseSensitive(b, keys[k]),
                       keys[k], printed, buf, n);
    return d;
}

/* The allocator tags whose reserved peaks hold the backend's own structures
 * (its group records: comm; the dump's manifest names the backend: io):
 * within BACKEND_TAG_BOUND of each other, every other figure exactly. */
static const char *const BACKEND_TAGS[] = {"comm", "io"};
#define BACKEND_TAG_BOUND 0.02

/* Takes the BACKEND_TAGS out of copies of two memory tables (a[] and b[]),
 * checking them within the bound; the rest is left to json_diff. */
static int memory_backend_tags(cJSON *a, cJSON *b, char *buf, size_t n)
{
    int d = 0;
    for (int r = 0; r < cJSON_GetArraySize(a) && r < cJSON_GetArraySize(b); r++) {
        cJSON *pa = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(a, r), "allocator_reserved_peak");
        cJSON *pb = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(b, r), "allocator_reserved_peak");
        for (int t = 0; pa && pb && t < (int)(sizeof BACKEND_TAGS / sizeof BACKEND_TAGS[0]); t++) {
            double x = 0, y = 0;
            par_json_num(pa, BACKEND_TAGS[t], &x);
            par_json_num(pb, BACKEND_TAGS[t], &y);
            if (fabs(x - y) > BACKEND_TAG_BOUND * fmax(fabs(x), fabs(y))) {
                if (!d && !buf[0])
                    par__matrix_fmt(buf, n, "memory[%d].allocator_reserved_peak.%s: %.17g vs %.17g (over %g %%)", r,
                                    BACKEND_TAGS[t], x, y, 100 * BACKEND_TAG_BOUND);
                d++;
            }
            cJSON_DeleteItemFromObjectCaseSensitive(pa, BACKEND_TAGS[t]);
            cJSON_DeleteItemFromObjectCaseSensitive(pb, BACKEND_TAGS[t]);
        }
    }
    return d;
}

/* summary_diff of two runs on different backends (memory_backend_tags). */
static int backend_diff(const cJSON *a, const cJSON *b, char *buf, size_t n)
{
    int d = summary_diff(a, b, RUN_KEYS, (int)(sizeof RUN_KEYS / sizeof RUN_KEYS[0]), 0, buf, n);
    cJSON *ma = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(a, "memory"), 1);
    cJSON *mb = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(b, "memory"), 1);
    if (ma && mb)
        d += memory_backend_tags(ma, mb, buf, n);
    d += json_diff(ma, mb, "memory", 0, buf, n);
    cJSON_Delete(ma);
    cJSON_Delete(mb);
    return d;
}

static void fail_figures(par__matrix_result *res, const char *what, int d, const char *first)
{
    res->verdict = PAR_CELL_FAIL;
    par__matrix_fmt(res->diagnosis, sizeof res->diagnosis, "%s: %d figure%s differ, first %s", what, d,
                    d == 1 ? "" : "s", first);
}

/* 1 if r is the built-in row of its (name, preset) as it is: the pins
 * belong to the built-in cells, not to a user's cell of the same name. */
static int builtin_row(const par_cell_spec *r)
{
    int n;
    const par_cell_spec *b = par_cells_builtin(&n);
    for (int i = 0; i < n; i++)
        if (!memcmp(&b[i], r, sizeof *r))
            return 1;
    return 0;
}

/* After a passing comparison: a vs-backend cell's two summaries agree, and
 * the run's clock figures are the pinned ones (in this process only: an
 * MPI process knows only its own ranks' clocks). */
static void check_figures(const par_matrix *m, const par__matrix_cell *c, par__matrix_result *res)
{
    char first[700];
    if (c->ref == PAR_REF_BACKEND && res->ref_run && res->run) {
        int d = backend_diff(res->ref_run, res->run, first, sizeof first);
        char what[96];
        par__matrix_fmt(what, sizeof what, "run summary (%s vs %s)", c->row.vs_backend,
                        c->row.backend[0] ? c->row.backend : m->backend);
        if (d)
            return fail_figures(res, what, d, first);
    }
    /* the pins are the tolerance mode's clock without a recipe (the bitwise mode's reductions move
     * 4x the bytes; a recipe routes other tokens and exchanges tile amaxes) */
    if (!m->pins || !res->run || m->o.runner || !builtin_row(&c->row) || c->cfg.bitwise || c->cfg.recipe)
        return;
    char key[256];
    par__matrix_fmt(key, sizeof key, "%s %s %s", c->row.preset, c->row.name, c->data_label);
    const cJSON *pin = cJSON_GetObjectItemCaseSensitive(par_json_obj(m->pins, "cells"), key);
    int64_t steps = -1, seed = -1;
    if (!pin || !par_json_int(pin, "steps", &steps) || !par_json_int(pin, "seed", &seed) || steps != c->steps ||
        (uint64_t)seed != c->seed)
        return; /* not pinned (or pinned for other steps or another seed): reported only */
    int d = summary_diff(pin, res->run, CLOCK_KEYS, (int)(sizeof CLOCK_KEYS / sizeof CLOCK_KEYS[0]), 1, first,
                         sizeof first);
    if (d) {
        char what[PAR_MX_PATH + 96];
        par__matrix_fmt(what, sizeof what, "emulated clock vs %s (pinned vs run; a meant change: "
                        "tools/pin-emulated.sh)", m->pins_path);
        fail_figures(res, what, d, first);
    }
}

/* ---- one cell --------------------------------------------------------- */

static void cell_label(const par__matrix_cell *c, char *buf, size_t n)
{
    par__matrix_fmt(buf, n, "%s %s", c->row.name, c->data_label);
}

/* Produces, checks and compares; the verdict and diagnosis in res. */
static void evaluate(par_matrix *m, const par__matrix_cell *c, par__matrix_result *res)
{
    char set_dir[PAR_MX_PATH + 8];
    par__matrix_fmt(set_dir, sizeof set_dir, "%s/set", res->dir);
    const char *cand = set_dir, *ref = NULL;
    par_status s = c->error[0] ? par_err(PAR_EFORMAT, "%s", c->error) : par__matrix_mkdir_p(res->dir);
    int prec = c->row.precision ? c->row.precision : 64;
    if (!s && c->row.kind == PAR_KIND_LAYOUT && !m->o.runner) /* before its reference: a run that cannot fit */
        s = layout_mem_check(m, c, &c->row.layout, prec, c->steps);
    char ref_set[PAR_MX_PATH + 16];
    double t0 = par__matrix_now(), t1 = t0, t2 = t0; /* the phases' walls: --log debug */
    if (!s && c->ref == PAR_REF_SERIAL)
        s = par__matrix_serial(m, c, c->row.kind == PAR_KIND_LAYOUT ? prec : 64, 1, &ref);
    else if (c->ref == PAR_REF_DIR)
        ref = c->ref_dir;
    else if (c->ref == PAR_REF_BACKEND) /* prod_layout makes it */
        ref = (par__matrix_fmt(ref_set, sizeof ref_set, "%s/ref-set", res->dir), ref_set);
    t1 = par__matrix_now();
    if (!s)
        s = produce(m, c, res->dir, set_dir, &cand, res);
    t2 = par__matrix_now();
    if (s) { /* a check inside the producer (ckpt-reshard) fails the cell; anything else is an error */
        res->verdict = s == PAR_ECHECK ? PAR_CELL_FAIL : PAR_CELL_ERROR;
        par__matrix_last_error(res->diagnosis, sizeof res->diagnosis, s == PAR_ECHECK ? "check: " : "");
        if (s == PAR_ECHECK)
            par__matrix_fmt(res->policy, sizeof res->policy, "checks");
        return;
    }
    if (c->ref == PAR_REF_NONE && c->row.kind == PAR_KIND_CKPT_RESHARD) {
        par__matrix_fmt(res->policy, sizeof res->policy, "bitwise");
        res->verdict = PAR_CELL_PASS;
        return;
    }
    if (c->row.kind == PAR_KIND_GOLDEN && (s = check_sane(c, cand))) {
        res->verdict = s == PAR_ECHECK ? PAR_CELL_FAIL : PAR_CELL_ERROR;
        par__matrix_last_error(res->diagnosis, sizeof res->diagnosis, "check: ");
        par__matrix_fmt(res->policy, sizeof res->policy, "checks");
        return;
    }
    if (c->ref == PAR_REF_NONE) {
        par__matrix_fmt(res->policy, sizeof res->policy, "checks");
        res->verdict = PAR_CELL_PASS;
        return;
    }
    int ce = compare_cell(c, res, ref, cand) != PAR_OK;
    PAR_LOG_D("matrix: %s: reference %.2f s, run %.2f s, compare %.2f s", c->row.name, t1 - t0, t2 - t1,
              par__matrix_now() - t2);
    if (ce)
        res->verdict = PAR_CELL_ERROR;
    else if (res->verdict == PAR_CELL_PASS)
        check_figures(m, c, res);
    /* the memory model is the tolerance mode's without a recipe (the accumulator adds 28 B per
     * gradient; a recipe's TP/ETP run keeps its own dense weights and casts into scratch) */
    if (!c->cfg.bitwise && !c->cfg.recipe)
        par__matrix_plan_check(res); /* a passing cell only (matrix_plan.c) */
}

void par__matrix_run_cell(par_matrix *m, int idx)
{
    const par__matrix_cell *c = &m->cells[idx];
    par__matrix_result *res = &m->res[idx];
    memset(res, 0, sizeof *res);
    res->met.step_time_s = res->met.bubble = res->met.exposed_comm_s = NAN;
    res->worst_frac = NAN;
    double t0 = par__matrix_now();
    char label[160];
    cell_label(c, label, sizeof label);
    if (m->o.progress) {
        fprintf(m->o.progress, "[%2d/%d] %-44s running\n", idx + 1, m->n, label);
        fflush(m->o.progress);
    }
    char data[96]; /* the fixture, a data file's base name, or "generator" */
    par__matrix_fmt(data, sizeof data, "%s", c->fixture[0] ? c->fixture : c->data_path[0] && !c->error[0] ? c->data_label
                                                                                                    : "generator");
    char *dot = strstr(data, ".safetensors");
    if (dot)
        *dot = 0;
    par__matrix_fmt(res->dir, sizeof res->dir, "%s/cells/%02d-%s-%s", m->out_dir, idx + 1, c->row.name, data);
    evaluate(m, c, res);
    res->wall_s = par__matrix_now() - t0;
    if (res->verdict == PAR_CELL_FAIL || res->verdict == PAR_CELL_ERROR) {
        for (int k = 0; k < m->nref; k++) { /* keep what the failing cell used */
            par__matrix_ref *re = &m->refs[k];
            if (!strcmp(re->cfgkey, c->cfgkey) && !strcmp(re->fixture, c->fixture) &&
                !strcmp(re->data_path, c->data_path) && re->steps == c->steps && re->seed == c->seed)
                re->pinned = 1;
        }
    } else if (!m->o.keep && res->verdict == PAR_CELL_PASS) {
        par__matrix_remove_quiet(res->dir);
        res->dir[0] = 0;
    }
    if (m->o.progress) {
        fprintf(m->o.progress, "[%2d/%d] %-44s %s (%.2f s)\n", idx + 1, m->n, label,
                par_cell_verdict_name(res->verdict), res->wall_s);
        if (res->verdict != PAR_CELL_PASS)
            fprintf(m->o.progress, "        %s\n", res->diagnosis);
        fflush(m->o.progress);
    }
}

/* ---- the run loop ----------------------------------------------------- */

/* A reference after its last cell (f64), every other run at the end. */
static void release_refs(par_matrix *m, int i)
{
    for (int k = 0; k < m->nref; k++) {
        par__matrix_ref *r = &m->refs[k];
        int last = r->precision == 64 ? r->last_use : m->n - 1;
        if (last == i && r->produced && !r->pinned && !m->o.keep && !r->removed) {
            par__matrix_remove_quiet(r->dir);
            if (r->precision == 32 && par_path_exists(r->raw))
                par__matrix_remove_quiet(r->raw);
            r->removed = 1;
        }
    }
}

par_status par_matrix_run(par_matrix *m, int *n_failed)
{
    double t0 = par__matrix_now();
    par_status s = par__matrix_prepare_out_dir(m);
    if (s)
        return s;
    /* Every cell is taken to use the f64 serial run of its config, data,
     * steps and seed; a reference is removed after its last such cell. */
    for (int i = 0; i < m->n; i++) {
        par__matrix_ref *r = par__matrix_ref_get(m, &m->cells[i], 64);
        if (!r)
            return par_err(PAR_ENOMEM, "matrix: out of memory");
        r->last_use = i;
    }
    /* The references and cell sets are scratch (removed once used unless
     * --keep or a cell fails): written atomically, not fsync'ed. */
    int durable = par_file_set_durable(0);
    int nf = 0;
    for (int i = 0; i < m->n; i++) {
        par__matrix_run_cell(m, i);
        nf += m->res[i].verdict == PAR_CELL_FAIL || m->res[i].verdict == PAR_CELL_ERROR;
        release_refs(m, i);
    }
    par_file_set_durable(durable);
    if (!m->o.keep) {
        char d[PAR_MX_PATH + 8];
        par__matrix_fmt(d, sizeof d, "%s/ref", m->out_dir);
        if (par_path_is_dir(d) && par__matrix_dir_is_empty(d))
            par__matrix_remove_quiet(d);
        par__matrix_fmt(d, sizeof d, "%s/cells", m->out_dir);
        if (par_path_is_dir(d) && par__matrix_dir_is_empty(d))
            par__matrix_remove_quiet(d);
    }
    m->wall_s = par__matrix_now() - t0;
    m->ran = 1;
    *n_failed = nf;
    return PAR_OK;
}
