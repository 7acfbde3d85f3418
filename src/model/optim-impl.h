/* model/optim-impl.h - what model/optim.c (the host's Muon and AdamW) and
 * model/optim_gpu.c (Muon batched on a device) share, so both run the same
 * Newton-Schulz steps and the same gradient scaling (templated units only). */
#ifndef PAR_MODEL_OPTIM_IMPL_H
#define PAR_MODEL_OPTIM_IMPL_H

#include "kernels/offload.h"

/* Muon's Newton-Schulz coefficients (a, b, c): eight main steps, two tail steps */
static const double ns_main[3] = {3.4445, -4.7750, 2.0315};
static const double ns_tail[3] = {2.0, -1.5, 0.5};
#define NS_MAIN_STEPS 8
#define NS_TAIL_STEPS 2

/* a gradient times the clip factor f, rounded once (f == 1: g itself) */
PAR_DECLARE_TARGET
static inline par_real scaled(par_real g, double f) { return f == 1.0 ? g : (par_real)(f * (double)g); }
PAR_END_DECLARE_TARGET

#endif
