/* parallel/reduce/reduce_sum.c - the one cross-rank sum (untemplated part of the
 * reduction module, see parallel/reduce/reduce.h). */
#include "parallel/reduce/reduce_sum.h"

#include <string.h>

#include "core/alloc.h"
#include "core/device.h"
#include "core/racc.h"

size_t par_fields_pack(void *buf, const par_field *f, int n, par_ctype t, int unpack)
{
    size_t es = par_ctype_size(t), at = 0;
    for (int i = 0; i < n; i++) {
        if (f[i].t != t || !f[i].n)
            continue;
        char *b = buf ? (char *)buf + at * es : NULL;
        if (b && !unpack)
            f[i].p ? memcpy(b, f[i].p, f[i].n * es) : memset(b, 0, f[i].n * es);
        else if (b && f[i].p)
            memcpy(f[i].p, b, f[i].n * es);
        at += f[i].n;
    }
    return at;
}

/* The one field of type t when the type's data is a single field (summed
 * in place, no packing), else NULL. */
static const par_field *sole_field(const par_field *f, int n, par_ctype t)
{
    const par_field *one = NULL;
    for (int i = 0; i < n; i++) {
        if (f[i].t != t || !f[i].n)
            continue;
        if (one || !f[i].p)
            return NULL;
        one = &f[i];
    }
    return one;
}

/* GPU mode, ranks that copy through the residency table (par_comm_dev_copies):
 * the fields packed into a kept block and pushed to the device in one copy,
 * so that the collective's exchanges move device memory and its rank-order
 * sums run there (comm/collectives.c, core/device.h par_dev_reduce_rows);
 * the sums come back in one copy (a reduce-scatter's block: after the
 * packed fields, in the same block).  docs/gpu.md "Collectives on one
 * device". */
static par_status reduce_type_dev(par_comm *c, const par_field *f, int n, par_ctype t, void *out, size_t count)
{
    const size_t p = (size_t)par_comm_size(c), es = par_ctype_size(t);
    const size_t bytes = count * es, blk = out ? bytes / p : 0;
    char *buf = par_malloc(bytes + blk, PAR_TAG_COMM);
    if (!buf)
        return par_err(PAR_ENOMEM, "reduce over %s: out of memory for %zu elements", par_comm_name(c), count);
    par_dev_keep(buf);
    par_dev_host_set(buf, bytes);
    par_fields_pack(buf, f, n, t, 0);
    par_dev_push(buf, bytes);
    par_status s = out ? par_reduce_scatter(c, buf, buf + bytes, count / p, t, PAR_OP_SUM)
                       : par_allreduce(c, buf, buf, count, t, PAR_OP_SUM);
    if (!s && out) {
        par_dev_host_read(buf + bytes, blk);
        par_dev_host_set(out, blk);
        memcpy(out, buf + bytes, blk);
    } else if (!s) {
        par_dev_host_read(buf, bytes);
        par_fields_pack(buf, f, n, t, 1);
    }
    par_free(buf);
    return s;
}

/* One element type: pack, one collective, unpack (or scatter to out); a
 * single field is summed where it lies (GPU mode: reduce_type_dev). */
static par_status reduce_type(par_comm *c, const par_field *f, int n, par_ctype t, void *out)
{
    size_t count = par_fields_pack(NULL, f, n, t, 0), p = (size_t)par_comm_size(c);
    if (count == 0)
        return PAR_OK;
    if (out && count % p != 0)
        return par_err(PAR_EINVAL, "reduce over %s: %zu elements do not split into %zu equal blocks",
                       par_comm_name(c), count, p);
    if (par_dev_gpu() && par_comm_dev_copies(c))
        return reduce_type_dev(c, f, n, t, out, count);
    const par_field *one = sole_field(f, n, t);
    if (one)
        return out ? par_reduce_scatter(c, one->p, out, count / p, t, PAR_OP_SUM)
                   : par_allreduce(c, one->p, one->p, count, t, PAR_OP_SUM);
    void *buf = par_malloc(count * par_ctype_size(t), PAR_TAG_COMM);
    if (!buf)
        return par_err(PAR_ENOMEM, "reduce over %s: out of memory for %zu elements", par_comm_name(c), count);
    par_fields_pack(buf, f, n, t, 0);
    par_status s = out ? par_reduce_scatter(c, buf, out, count / p, t, PAR_OP_SUM)
                       : par_allreduce(c, buf, buf, count, t, PAR_OP_SUM);
    if (!s && !out)
        par_fields_pack(buf, f, n, t, 1);
    par_free(buf);
    return s;
}

/* ---- the bitwise mode: fields backed by an order-free accumulator -------- */

/* The accumulator view of a real field, or {NULL}. */
static par_racc_view racc_of(const par_field *f)
{
    par_racc_view none = {NULL, 0};
    if (!f->p || !f->n || (f->t != PAR_C_F64 && f->t != PAR_C_F32))
        return none;
    return par_racc_lookup(f->p, f->n);
}

/* Every accumulator-backed field's elements (v[i].acc: field i's view,
 * looked up once by split_racc) merged over c, exactly and in any order: the
 * grid exponents' maximum (one all-reduce), each element moved to it, the
 * three integer folds summed (one all-reduce: integer sums are associative,
 * so the rank order of the transport cannot move a bit), and the result
 * rounded into the field.  The fields' elements, in order, are the packed
 * vector; nothing else is read. */
static par_status reduce_racc(par_comm *c, const par_field *f, const par_racc_view *views, int n, size_t count)
{
    int64_t *buf = par_malloc((count * 3 + 1) * sizeof *buf, PAR_TAG_COMM);
    if (!buf)
        return par_err(PAR_ENOMEM, "reduce over %s: out of memory for %zu accumulated elements",
                       par_comm_name(c), count);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const par_racc_view v = views[i];
        for (size_t j = 0; v.acc && j < f[i].n; j++)
            buf[at++] = v.acc->e[v.at + j];
    }
    par_status s = par_allreduce(c, buf, buf, count, PAR_C_I64, PAR_OP_MAX);
    at = 0;
    for (int i = 0; !s && i < n; i++) {
        const par_racc_view v = views[i];
        for (size_t j = 0; v.acc && j < f[i].n; j++, at++) {
            if (buf[at] != PAR_RACC_EMPTY)
                par_racc_align(v.acc, v.at + j, (int32_t)buf[at]);
            buf[count + 2 * at] = v.acc->s1[v.at + j];
            buf[count + 2 * at + 1] = v.acc->s2[v.at + j];
            buf[at] = v.acc->s0[v.at + j];
        }
    }
    if (!s)
        s = par_allreduce(c, buf, buf, 3 * count, PAR_C_I64, PAR_OP_SUM);
    at = 0;
    for (int i = 0; !s && i < n; i++) {
        const par_racc_view v = views[i];
        for (size_t j = 0; v.acc && j < f[i].n; j++, at++) {
            const size_t k = v.at + j;
            v.acc->s0[k] = buf[at], v.acc->s1[k] = buf[count + 2 * at], v.acc->s2[k] = buf[count + 2 * at + 1];
            const double x = par_racc_value(v.acc, k);
            if (f[i].t == PAR_C_F64)
                ((double *)f[i].p)[j] = x;
            else
                ((float *)f[i].p)[j] = (float)x;
        }
    }
    par_free(buf);
    return s;
}

/* The bitwise mode's part of a reduction: the accumulator-backed fields
 * merged (reduce_racc) and taken out of the list (*rest: the others, to be
 * summed as usual; *taken: how many were backed).  A reduce-scatter's fields
 * are either all backed or none. */
static par_status split_racc(par_comm *c, const par_field *f, int n, par_field *rest, int *n_rest, int *taken)
{
    size_t count = 0;
    *n_rest = *taken = 0;
    par_racc_view *views = par_malloc((size_t)n * sizeof *views, PAR_TAG_COMM);
    if (!views)
        return par_err(PAR_ENOMEM, "reduce: out of memory for %d fields", n);
    for (int i = 0; i < n; i++) {
        views[i] = racc_of(&f[i]);
        if (views[i].acc) {
            count += f[i].n;
            ++*taken;
        } else {
            rest[(*n_rest)++] = f[i];
        }
    }
    par_status s = *taken && c ? reduce_racc(c, f, views, n, count) : PAR_OK;
    par_free(views);
    return s;
}

static par_status reduce_plain(par_comm *c, const par_field *f, int n, void *out);

/* out = member r's block of the packed (already merged) fields. */
static par_status scatter_block(par_comm *c, const par_field *f, int n, void *out)
{
    const par_ctype t = f[0].t;
    const size_t count = par_fields_pack(NULL, f, n, t, 0), p = c ? (size_t)par_comm_size(c) : 1;
    if (count % p)
        return par_err(PAR_EINVAL, "reduce over %s: %zu elements do not split into %zu equal blocks",
                       c ? par_comm_name(c) : "one rank", count, p);
    char *buf = par_malloc(count * par_ctype_size(t) + 1, PAR_TAG_COMM);
    if (!buf)
        return par_err(PAR_ENOMEM, "reduce: out of memory for %zu elements", count);
    par_fields_pack(buf, f, n, t, 0);
    const size_t blk = count / p * par_ctype_size(t);
    memcpy(out, buf + (c ? (size_t)par_comm_rank(c) : 0) * blk, blk);
    par_free(buf);
    return PAR_OK;
}

par_status par_reduce_fields(par_comm *c, const par_field *f, int n, void *out)
{
    if (par_racc_registered() == 0 || n <= 0)
        return reduce_plain(c, f, n, out);
    par_field *rest = par_malloc((size_t)n * sizeof *rest, PAR_TAG_COMM);
    if (!rest)
        return par_err(PAR_ENOMEM, "reduce: out of memory for %d fields", n);
    int n_rest, taken;
    par_status s = split_racc(c, f, n, rest, &n_rest, &taken);
    if (!s && taken && out && n_rest)
        s = par_err(PAR_EINTERNAL, "reduce-scatter over %s: %d of %d fields are accumulated (bitwise mode), "
                    "the others not", c ? par_comm_name(c) : "one rank", taken, n);
    if (!s && taken && out) /* every field merged whole: this member's block of it */
        s = scatter_block(c, f, n, out);
    else if (!s)
        s = reduce_plain(c, rest, n_rest, out);
    par_free(rest);
    return s;
}

static par_status reduce_plain(par_comm *c, const par_field *f, int n, void *out)
{
    int ntypes = 0;
    for (int t = 0; t < PAR_C_COUNT; t++)
        ntypes += par_fields_pack(NULL, f, n, (par_ctype)t, 0) > 0;
    if (out && ntypes > 1)
        return par_err(PAR_EINVAL, "reduce-scatter over %s: the fields must have one element type",
                       c ? par_comm_name(c) : "one rank");
    for (int t = 0; t < PAR_C_COUNT; t++) {
        par_status s = PAR_OK;
        if (!c) /* no group: nothing to sum, the one block is the fields */
            (void)(out && par_fields_pack(out, f, n, (par_ctype)t, 0));
        else
            s = reduce_type(c, f, n, (par_ctype)t, out);
        if (s)
            return s;
    }
    return PAR_OK;
}

par_status par_reduce_max_f64(par_comm *c, double *buf, size_t n)
{
    if (!c || n == 0)
        return PAR_OK;
    return par_allreduce(c, buf, buf, n, PAR_C_F64, PAR_OP_MAX);
}
