/* model/facade.c - untemplated entry points for the CLI (see model/facade.h). */
#include "model/facade.h"

#include <string.h>

#include "core/alloc.h"

/* The two builds of model/golden.h (declared here: templated headers are not
 * included by untemplated units). */
par_status par_golden_run_f64(const par_golden_opts *o, par_golden_summary *sum);
par_status par_golden_run_f32(const par_golden_opts *o, par_golden_summary *sum);
const char *par_golden_blas_core_f64(void);

void par_golden_opts_init(par_golden_opts *o)
{
    memset(o, 0, sizeof *o);
    o->precision = 64;
    o->steps = 1;
    o->seed = 1234;
    o->progress = 0;
}

void par_golden_summary_free(par_golden_summary *s)
{
    if (!s)
        return;
    par_free(s->step);
    memset(s, 0, sizeof *s);
}

par_status par_golden_run(const par_golden_opts *o, par_golden_summary *sum)
{
    if (o->precision == 64)
        return par_golden_run_f64(o, sum);
    if (o->precision == 32)
        return par_golden_run_f32(o, sum);
    return par_err(PAR_EINVAL, "golden: precision must be 64 or 32 bits (got %d)", o->precision);
}

const char *par_blas_core_name(void) { return par_golden_blas_core_f64(); }
