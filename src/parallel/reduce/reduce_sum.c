/* parallel/reduce/reduce_sum.c - the one cross-rank sum (untemplated part of the
 * reduction module, see parallel/reduce/reduce.h). */
#include "parallel/reduce/reduce_sum.h"

#include <string.h>

#include "core/alloc.h"

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

/* One element type: pack, one collective, unpack (or scatter to out); a
 * single field is summed where it lies. */
static par_status reduce_type(par_comm *c, const par_field *f, int n, par_ctype t, void *out)
{
    size_t count = par_fields_pack(NULL, f, n, t, 0), p = (size_t)par_comm_size(c);
    if (count == 0)
        return PAR_OK;
    if (out && count % p != 0)
        return par_err(PAR_EINVAL, "reduce over %s: %zu elements do not split into %zu equal blocks",
                       par_comm_name(c), count, p);
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

par_status par_reduce_fields(par_comm *c, const par_field *f, int n, void *out)
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
