/* parallel/ckpt/ckpt_tools.c - the tools on a checkpoint: export, reshard, diff (see ckpt.h, ckpt-
 * impl.h, docs/checkpoints.md). */
#include "parallel/ckpt/ckpt.h"
#include "parallel/ckpt/ckpt-impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/sha256.h"

/* ---- tools ----------------------------------------------------------------------- */

par_status par_ckpt_export(const char *src_dir, const char *file)
{
    par_ckpt *ck;
    par_status st = par_ckpt_open(src_dir, &ck);
    if (st)
        return st;
    par_tensor *x = par_calloc((size_t)(ck->nt > 0 ? ck->nt : 1), sizeof *x, PAR_TAG_IO);
    par_st_writer *w = NULL;
    if (!x) {
        st = par_err(PAR_ENOMEM, "export %s: out of memory", src_dir);
        goto fail_close;
    }
    if ((st = par_st_writer_new(&w)))
        goto fail_free_x;
    char buf[32];
    if ((st = par_st_writer_meta(w, "format", "parity-ckpt-export")))
        goto fail_free_w;
    snprintf(buf, sizeof buf, "%lld", (long long)ck->state.step);
    if ((st = par_st_writer_meta(w, "step", buf)))
        goto fail_free_w;
    snprintf(buf, sizeof buf, "%lld", (long long)ck->state.cursor);
    if ((st = par_st_writer_meta(w, "data_cursor", buf)))
        goto fail_free_w;
    if ((st = par_st_writer_meta(w, "seed", par__ckpt_seed_str(ck->state.seed, buf, sizeof buf))) ||
        (st = par_st_writer_meta(w, "precision", ck->state.precision)))
        goto fail_free_w;
    for (int i = 0; i < ck->nt; i++) {
        if ((st = par_ckpt_read_tensor(ck, ck->t[i].name, PAR_TAG_IO, &x[i])))
            goto fail_free_w;
        if ((st = par_st_writer_add(w, ck->t[i].name, &x[i])))
            goto fail_free_w;
    }
    st = par_st_writer_write(w, file);
fail_free_w:
    par_st_writer_free(w);
fail_free_x:
    for (int i = 0; x && i < ck->nt; i++)
        par_tensor_free(&x[i]);
    par_free(x);
fail_close:
    par_ckpt_close(ck);
    return st;
}

par_status par_ckpt_reshard_open(const par_ckpt *ck, const char *dst_dir, const par_layout *layout,
                                 par_ckpt_owner_fn fn, void *ud)
{
    int64_t world = par_ckpt_layout_world(layout);
    char ctx[ERRMSG_MAX];
    snprintf(ctx, sizeof ctx, "reshard %s -> %s", ck->dir, dst_dir);
    if (!fn)
        return par_err(PAR_EINVAL, "%s: needs an ownership rule (parallel/ckpt/ckpt_owner.h: par_ckpt_owner_driver for "
                       "the training driver's layouts)", ctx);
    if (world < 1 || world > (1 << 20))
        return par_err(PAR_EINVAL, "%s: world size %lld outside 1..%d", ctx, (long long)world, 1 << 20);
    par_status st = PAR_OK;
    char *tmp = NULL;
    shard_desc *d = par_calloc((size_t)world, sizeof *d, PAR_TAG_IO);
    if (!d)
        return par_err(PAR_ENOMEM, "%s: out of memory", ctx);
    if ((st = par_adir_begin(dst_dir, &tmp)))
        goto fail_free_d;
    for (int r = 0; r < world && !st; r++) {
        par_ckpt_slice *sl = NULL;
        int n = 0;
        if ((st = fn(layout, (int)world, r, ck->t, ck->nt, &sl, &n, ud)))
            break;
        par_ckpt_item *it = par_calloc((size_t)(n > 0 ? n : 1), sizeof *it, PAR_TAG_IO);
        if (!it)
            st = par_err(PAR_ENOMEM, "%s: out of memory", ctx);
        for (int i = 0; !st && i < n; i++) {
            int ti;
            char w[ERRMSG_MAX + 32];
            snprintf(w, sizeof w, "%s: owner of rank %d", ctx, r);
            if ((st = par__ckpt_check_slice(&ck->ix, &sl[i], w, &ti)))
                break;
            it[i].s = sl[i];
            size_t bytes = (size_t)(sl[i].end - sl[i].begin) * par_dtype_size(ck->t[ti].dtype);
            if (bytes && !(it[i].data = par_malloc(bytes, PAR_TAG_IO)))
                st = par_err(PAR_ENOMEM, "%s: out of memory", ctx);
        }
        if (!st)
            st = par_ckpt_read(ck, it, n);
        if (!st)
            st = par__ckpt_write_shard(tmp, r, &ck->ix, it, n, &d[r]);
        for (int i = 0; it && i < n; i++)
            par_free(it[i].data);
        par_free(it);
        par_free(sl);
    }
    if (st) {
        par_adir_abort(tmp);
        goto fail_free_d;
    }
    par_ckpt_info info = {.state = ck->state, .tensors = ck->t, .ntensors = ck->nt, .layout = layout,
                          .model = ck->model};
    st = par__ckpt_finalize(tmp, dst_dir, &info, &ck->ix, world, d, (int)world);
fail_free_d:
    for (int r = 0; d && r < world; r++)
        par__ckpt_desc_free(&d[r]);
    par_free(d);
    return st;
}

par_status par_ckpt_reshard(const char *src_dir, const char *dst_dir, const par_layout *layout,
                            par_ckpt_owner_fn fn, void *ud)
{
    par_ckpt *ck;
    par_status st = par_ckpt_open(src_dir, &ck);
    if (st)
        return st;
    st = par_ckpt_reshard_open(ck, dst_dir, layout, fn, ud);
    par_ckpt_close(ck);
    return st;
}

/* A tensor's role in words, e.g. "exp_avg of 'layers.0.ffn.experts.3.w1.weight'
 * (expert 3, layers.0)"; comparable across checkpoints (no list indices). */
static const char *role_str(const par_ckpt *ck, const par_ckpt_tensor *x, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s", par_ckpt_slot_name(x->slot));
    if (x->slot != PAR_CKPT_PARAM && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " of '%s'", ck->t[x->param].name);
    if (k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, " (expert %d, layer %d, mtp %d)", x->expert, x->layer, x->mtp);
    return buf;
}

static int state_equal(const par_ckpt_state *a, const par_ckpt_state *b)
{
    return a->step == b->step && a->cursor == b->cursor && a->seed == b->seed && !strcmp(a->precision, b->precision);
}

static void note(par_ckpt_diff_result *res, FILE *out, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(par_ckpt_diff_result *res, FILE *out, const char *fmt, ...)
{
    char line[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!res->first[0])
        snprintf(res->first, sizeof res->first, "%s", line);
    if (out)
        fprintf(out, "%s\n", line);
}

/* Tensor ta of A against the tensor of its name in B (tb, or NULL): one
 * noted line when they differ (presence, dtype or shape, role, values). */
static par_status diff_tensor(const par_ckpt *a, const par_ckpt *b, const par_ckpt_tensor *ta, FILE *out,
                              par_ckpt_diff_result *r)
{
    const par_ckpt_tensor *tb = par_ckpt_find(b, ta->name);
    char s1[2 * PAR_CKPT_NAME_MAX], s2[2 * PAR_CKPT_NAME_MAX];
    if (!tb) {
        r->n_tensors_diff++;
        note(r, out, "%s: only in A", ta->name);
        return PAR_OK;
    }
    if (ta->dtype != tb->dtype || ta->ndim != tb->ndim ||
        memcmp(ta->shape, tb->shape, (size_t)ta->ndim * sizeof ta->shape[0])) {
        r->n_tensors_diff++;
        note(r, out, "%s: A %s %s, B %s %s", ta->name, par_dtype_name(ta->dtype),
             par_shape_str(ta->ndim, ta->shape, s1, sizeof s1), par_dtype_name(tb->dtype),
             par_shape_str(tb->ndim, tb->shape, s2, sizeof s2));
        return PAR_OK;
    }
    if (strcmp(role_str(a, ta, s1, sizeof s1), role_str(b, tb, s2, sizeof s2))) {
        r->n_tensors_diff++;
        note(r, out, "%s: A %s, B %s", ta->name, s1, s2);
        return PAR_OK;
    }
    par_tensor xa, xb;
    par_status st = par_ckpt_read_tensor(a, ta->name, PAR_TAG_IO, &xa);
    if (st)
        return st;
    if ((st = par_ckpt_read_tensor(b, ta->name, PAR_TAG_IO, &xb))) {
        par_tensor_free(&xa);
        return st;
    }
    int64_t n = par_tensor_numel(&xa), ndiff = 0, first = -1;
    size_t es = par_dtype_size(xa.dtype);
    double maxabs = 0;
    for (int64_t k = 0; k < n; k++)
        if (memcmp((char *)xa.data + (size_t)k * es, (char *)xb.data + (size_t)k * es, es)) {
            if (first < 0)
                first = k;
            ndiff++;
            double d = fabs(par_tensor_get_f64(&xa, k) - par_tensor_get_f64(&xb, k));
            if (d > maxabs || isnan(d))
                maxabs = d;
        }
    if (ndiff) {
        r->n_tensors_diff++;
        note(r, out, "%s: %lld of %lld elements differ (first at %lld: A %.17g, B %.17g; max |A-B| %.3g)", ta->name,
             (long long)ndiff, (long long)n, (long long)first, par_tensor_get_f64(&xa, first),
             par_tensor_get_f64(&xb, first), maxabs);
    }
    par_tensor_free(&xa);
    par_tensor_free(&xb);
    return PAR_OK;
}

par_status par_ckpt_diff(const char *a_dir, const char *b_dir, FILE *out, par_ckpt_diff_result *res)
{
    par_ckpt *a, *b;
    par_status st = par_ckpt_open(a_dir, &a);
    if (st)
        return st;
    if ((st = par_ckpt_open(b_dir, &b))) {
        par_ckpt_close(a);
        return st;
    }
    par_ckpt_diff_result r = {0};
    r.state_equal = state_equal(&a->state, &b->state);
    if (!r.state_equal)
        note(&r, out, "state: A step %lld cursor %lld seed %" PRIu64 " %s; B step %lld cursor %lld seed %" PRIu64
                      " %s",
             (long long)a->state.step, (long long)a->state.cursor, a->state.seed, a->state.precision,
             (long long)b->state.step, (long long)b->state.cursor, b->state.seed, b->state.precision);
    for (int i = 0; i < b->nt; i++)
        if (par__ckpt_index_find(&a->ix, b->t[i].name) < 0) {
            r.n_tensors_diff++;
            note(&r, out, "%s: only in B", b->t[i].name);
        }
    for (int i = 0; i < a->nt && !st; i++)
        st = diff_tensor(a, b, &a->t[i], out, &r);
    r.tensors_equal = r.n_tensors_diff == 0;
    par_ckpt_close(a);
    par_ckpt_close(b);
    if (!st && res)
        *res = r;
    return st;
}
