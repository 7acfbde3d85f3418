/* kernels/gemm_path.c - the run-time choice of par_gemm's micro-kernels
 * (see kernels/gemm_path.h). */
#include "kernels/gemm_path.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"

static const char *const path_names[PAR_GEMM_PATH_COUNT] = {"c", "avx2", "avx512"};

/* -1 until the first par_gemm_path(); then the path (atomics: ranks are threads) */
static int chosen = -1;

const char *par_gemm_path_name(par_gemm_path_id p)
{
    return (unsigned)p < PAR_GEMM_PATH_COUNT ? path_names[p] : "?";
}

int par_gemm_path_available(par_gemm_path_id p)
{
    switch (p) {
    case PAR_GEMM_PATH_C:
        return 1;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case PAR_GEMM_PATH_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case PAR_GEMM_PATH_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

static par_gemm_path_id best_path(void)
{
    for (int p = PAR_GEMM_PATH_COUNT - 1; p > 0; p--)
        if (par_gemm_path_available((par_gemm_path_id)p))
            return (par_gemm_path_id)p;
    return PAR_GEMM_PATH_C;
}

/* The path PARITY_GEMM_PATH asks for: *p set (the best one when unset or
 * empty); PAR_EINVAL with the reason when it names none this CPU runs. */
static par_status env_path(par_gemm_path_id *p)
{
    const char *s = getenv("PARITY_GEMM_PATH");
    if (!s || !*s) {
        *p = best_path();
        return PAR_OK;
    }
    for (int i = 0; i < PAR_GEMM_PATH_COUNT; i++) {
        if (strcmp(s, path_names[i]))
            continue;
        if (!par_gemm_path_available((par_gemm_path_id)i))
            return par_err(PAR_EINVAL,
                           "PARITY_GEMM_PATH=%s: this CPU cannot run the %s GEMM kernels (it runs: c%s%s)", s, s,
                           par_gemm_path_available(PAR_GEMM_PATH_AVX2) ? ", avx2" : "",
                           par_gemm_path_available(PAR_GEMM_PATH_AVX512) ? ", avx512" : "");
        *p = (par_gemm_path_id)i;
        return PAR_OK;
    }
    return par_err(PAR_EINVAL, "PARITY_GEMM_PATH=%s: unknown GEMM path (known: c, avx2, avx512)", s);
}

par_status par_gemm_path_check(void)
{
    par_gemm_path_id p;
    return env_path(&p);
}

par_gemm_path_id par_gemm_path(void)
{
    int c = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (c >= 0)
        return (par_gemm_path_id)c;
    par_gemm_path_id p;
    par_err_set_quiet(1);
    par_status st = env_path(&p);
    par_err_set_quiet(0);
    if (st) {
        p = best_path();
        PAR_LOG_E("par_gemm: %s; using the %s path", par_last_error(), path_names[p]);
    }
    int expect = -1;
    if (!__atomic_compare_exchange_n(&chosen, &expect, (int)p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return (par_gemm_path_id)expect; /* another thread chose first (the same path) */
    return p;
}

par_status par_gemm_path_set(par_gemm_path_id p)
{
    if ((unsigned)p >= PAR_GEMM_PATH_COUNT || !par_gemm_path_available(p))
        return par_err(PAR_EINVAL, "par_gemm_path_set: this CPU cannot run the %s GEMM kernels",
                       par_gemm_path_name(p));
    __atomic_store_n(&chosen, (int)p, __ATOMIC_RELEASE);
    return PAR_OK;
}
