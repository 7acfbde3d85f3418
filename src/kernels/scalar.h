/* kernels/scalar.h - scalar helpers (untemplated), numerically stable, in double. */
#ifndef PAR_KERNELS_SCALAR_H
#define PAR_KERNELS_SCALAR_H

#include "kernels/offload.h"

PAR_DECLARE_TARGET /* called from device loops (kernels/offload.h) */
double par_sigmoid(double x);
double par_softplus(double x); /* log(1 + e^x) */
double par_silu(double x);
PAR_END_DECLARE_TARGET

#endif
