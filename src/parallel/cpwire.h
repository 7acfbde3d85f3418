/* parallel/cpwire.h - context parallelism in the training driver
 * (templated: see kernels/real.h).  docs/parallel.md, "Context parallelism
 * in the driver".
 *
 * A rank of a CP layout holds, of each of its attention-DP rows, the column
 * slice [cp*L, (cp+1)*L), L = S/CP.  Everything per token (positions,
 * labels, MTP inputs and targets) is derived on the WHOLE rows and then
 * sliced, so a sample that crosses a slice border keeps its positions and
 * its targets (the last token of a slice is labelled with the first token of
 * the next slice).  Samples are numbered per attention-DP window (the samples
 * of the rank's rows, as without CP), so every CP rank of a DP group has the
 * same statistics window and the per-sample statistics combine by plain sums
 * over the CP group (parallel/reduce.c).
 *
 * The attention layer of every block runs through the model's attention
 * executor (model/model.h's M->attn), which calls par_cp_attn_forward /
 * _backward (parallel/cp.h) over the CP group: the halo exchange, the entry
 * all-gather and the entry-gradient reduce-scatter go through src/comm, so
 * an attached emulated network charges them per tier.
 */
#ifndef PAR_PARALLEL_CPWIRE_H
#define PAR_PARALLEL_CPWIRE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/data.h"
#include "model/model.h"
#include "parallel/cp.h"
#include "parallel/layout.h"

typedef struct PAR_FN(par_cpw_s) PAR_FN(par_cpw);

/* An executor for model M (its block count and attention sizes) over the CP
 * group `cp` (size CP, not owned) for `rows` local rows of S tokens. */
par_status PAR_FN(par_cpw_create)(PAR_FN(par_cpw) **out, par_comm *cp, const PAR_FN(par_model) *M,
                                  int64_t rows, int64_t S);
/* M->attn = this executor; M->sample_in / Ns_in = its numbering of the
 * local tokens (set by par_cpw_batch). */
void PAR_FN(par_cpw_install)(PAR_FN(par_cpw) *w, PAR_FN(par_model) *M);
void PAR_FN(par_cpw_free)(PAR_FN(par_cpw) *w); /* NULL is fine */

/* One step's local batch: `full` holds the rank's rows [rows, S] (tokens and
 * segments set, derived: par_batch_set); local ([rows, L]) gets the slice
 * of every per-token array and its own label counts; the executor keeps the
 * whole rows' positions (the halos' and the entry owners') and numbers the
 * local tokens' samples in the window of `full`'s rows. */
par_status PAR_FN(par_cpw_batch)(PAR_FN(par_cpw) *w, par_batch *local, const par_batch *full);

/* Bytes this rank handed to src/comm for CP attention since creation. */
void PAR_FN(par_cpw_traffic)(const PAR_FN(par_cpw) *w, par_cp_traffic *out);

/* Untemplated helper (defined in both precisions, identical): pieces of
 * [Bl, L, w] elements (esz bytes each; n = Bl*L*w per piece) received from
 * the world's ranks in rank order at `in` are placed at rows dp*Bl.. and
 * columns cp*L.. of `out` [Da*Bl, CP*L, w] (coordinates from the layout). */
par_status PAR_FN(par_cpw_place)(void *out, const void *in, size_t n, size_t esz, const par_layout *l,
                                 int64_t Bl);

#endif
