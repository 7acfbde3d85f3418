/* kernels/real.h - the working precision of templated code.
 *
 * kernels/, model/ and parallel/ sources are compiled twice, once with
 * -DPAR_REAL_BITS=64 and once with -DPAR_REAL_BITS=32 (see the layer's
 * meson.build).  Inside them `par_real` is the working float type and every
 * externally visible function is named through PAR_FN(name), which appends
 * _f64 or _f32.  Headers of templated code are included only by templated
 * translation units; untemplated code (cli) reaches them through facades that
 * declare both precisions explicitly.
 */
#ifndef PAR_KERNELS_REAL_H
#define PAR_KERNELS_REAL_H

#include "core/tensor.h"

#if !defined(PAR_REAL_BITS)
#error "templated code: compile with -DPAR_REAL_BITS=64 or -DPAR_REAL_BITS=32"
#elif PAR_REAL_BITS == 64
typedef double par_real;
#define PAR_FN(name) name##_f64
#define PAR_REAL_DTYPE PAR_F64
#define PAR_REAL_EPS 2.220446049250313e-16
#elif PAR_REAL_BITS == 32
typedef float par_real;
#define PAR_FN(name) name##_f32
#define PAR_REAL_DTYPE PAR_F32
#define PAR_REAL_EPS 1.1920929e-07f
#else
#error "PAR_REAL_BITS must be 64 or 32"
#endif

#endif
