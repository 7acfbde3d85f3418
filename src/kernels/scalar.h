/* kernels/scalar.h - scalar helpers (untemplated), numerically stable, in double. */
#ifndef PAR_KERNELS_SCALAR_H
#define PAR_KERNELS_SCALAR_H

#include "kernels/offload.h"

PAR_DECLARE_TARGET /* called from device loops (kernels/offload.h) */
double par_sigmoid(double x);
double par_softplus(double x); /* log(1 + e^x) */
/* par_softplus(x), and par_sigmoid(x) in *sg, the same bits as the two calls
 * with one e^-|x| between them (both take it: sigmoid's e^-x for x >= 0 and
 * e^x below are e^-|x|) */
double par_softplus_sigmoid(double x, double *sg);
double par_silu(double x);
PAR_END_DECLARE_TARGET

#endif
