/* kernels/gemm_path.h - which instruction set par_gemm's micro-kernels use
 * (untemplated, compiled once into parity_kernels_common).
 *
 * Every path computes every element of C with the same operations in the same
 * order (kernels/gemm.h), so the choice changes speed, never bits.  The best
 * one this CPU runs is taken unless PARITY_GEMM_PATH names one (c, avx2,
 * avx512): tests and the portability check force each.  A path the CPU cannot
 * run, or an unknown name, is refused: par_gemm_path_check() says so (the CLI
 * calls it before any work) and par_gemm falls back to the best path with
 * one logged error. */
#ifndef PAR_KERNELS_GEMM_PATH_H
#define PAR_KERNELS_GEMM_PATH_H

#include "core/status.h"

typedef enum {
    PAR_GEMM_PATH_C = 0,  /* portable C, fma() */
    PAR_GEMM_PATH_AVX2,   /* AVX2 + FMA (x86-64) */
    PAR_GEMM_PATH_AVX512, /* AVX-512F (x86-64) */
    PAR_GEMM_PATH_COUNT
} par_gemm_path_id;

/* the path par_gemm uses now (PARITY_GEMM_PATH read once) */
par_gemm_path_id par_gemm_path(void);
/* PARITY_GEMM_PATH names a path this CPU runs (or is unset/empty) */
par_status par_gemm_path_check(void);
/* 1 when this CPU (and this build) can run path p */
int par_gemm_path_available(par_gemm_path_id p);
/* "c", "avx2", "avx512" */
const char *par_gemm_path_name(par_gemm_path_id p);
/* force a path (tests); PAR_EINVAL when the CPU cannot run it */
par_status par_gemm_path_set(par_gemm_path_id p);

#endif
