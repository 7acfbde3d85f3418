/* model/init.c - deterministic initialization (templated). */
#include "model/init.h"

#define CHUNK 512
#define INIT_OMP_MIN 16384 /* elements: smaller slices stay on one thread */

void PAR_FN(par_init_params)(par_real *flat, int32_t *i32, const par_param_table *t, uint64_t seed)
{
    /* tensors in parallel (v4-mini's 11.4M values are mostly 1024-element
     * expert matrices): each is a disjoint range, each value its own draw */
#pragma omp parallel for schedule(dynamic, 16) if (t->n_float >= INIT_OMP_MIN)
    for (int idx = 0; idx < t->n; idx++) {
        const par_param *p = &t->p[idx];
        if (p->dtype == PAR_PDT_REAL)
            (void)PAR_FN(par_init_param_slice)(flat + p->offset, t, idx, seed, 0, p->numel);
        else if (i32)
            (void)PAR_FN(par_init_param_slice_i32)(i32 + p->offset, t, idx, 0, p->numel);
    }
}

static par_status check_slice(const par_param_table *t, int idx, int64_t begin, int64_t end)
{
    if (idx < 0 || idx >= t->n)
        return par_err(PAR_ERANGE, "init: parameter index %d outside [0, %d)", idx, t->n);
    const par_param *p = &t->p[idx];
    if (begin < 0 || end < begin || end > p->numel)
        return par_err(PAR_ERANGE, "init: slice [%lld, %lld) of '%s' outside [0, %lld)", (long long)begin,
                       (long long)end, p->name, (long long)p->numel);
    return PAR_OK;
}

par_status PAR_FN(par_init_param_slice)(par_real *out, const par_param_table *t, int idx, uint64_t seed,
                                        int64_t begin, int64_t end)
{
    par_status st = check_slice(t, idx, begin, end);
    if (st)
        return st;
    if (t->p[idx].dtype != PAR_PDT_REAL)
        return par_err(PAR_EINVAL, "init: '%s' is an int32 tensor", t->p[idx].name);
    /* every element is its own counter-based draw (core/rng.h): chunks in any
     * order or thread give the same bits */
#pragma omp parallel for schedule(static) if (end - begin >= INIT_OMP_MIN)
    for (int64_t i = begin; i < end; i += CHUNK) {
        double buf[CHUNK];
        int64_t e = end - i < CHUNK ? end : i + CHUNK;
        par_param_init_values(t, idx, seed, i, e, buf);
        for (int64_t k = i; k < e; k++)
            out[k - begin] = (par_real)buf[k - i];
    }
    return PAR_OK;
}

par_status PAR_FN(par_init_param_slice_i32)(int32_t *out, const par_param_table *t, int idx, int64_t begin,
                                            int64_t end)
{
    par_status st = check_slice(t, idx, begin, end);
    if (st)
        return st;
    if (t->p[idx].dtype != PAR_PDT_I32)
        return par_err(PAR_EINVAL, "init: '%s' is not an int32 tensor", t->p[idx].name);
    for (int64_t i = begin; i < end; i++)
        out[i - begin] = (int32_t)par_param_init_value(t, idx, 0, i);
    return PAR_OK;
}
