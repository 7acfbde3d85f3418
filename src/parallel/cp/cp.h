/* parallel/cp/cp.h - context parallelism for the V4 hybrid attention layer on
 * packed rows (templated: see kernels/real.h).  docs/parallel.md, section
 * "Context parallelism".
 *
 * Partition.  Every packed row of S tokens is cut into CP contiguous slices
 * of L = S/CP tokens; CP rank r owns positions [r*L, (r+1)*L) of EVERY row.
 * A rank's activations are [rows, L, ...] (its slice of each row).
 *
 * One layer on a CP group (comm c, size CP, rank r):
 *  - halo: rank r > 0 receives the last D rows of x of each row from r-1,
 *    D = max(window_size, d_comp(m)), d_comp = 2m for m == 4, m for m > 4,
 *    0 for m == 0 (the layer's own term of D_window);
 *  - phase 1 (projections) on halo + local rows; phase 2 (both compressors)
 *    on the blocks whose LAST token is local (reading a/z back into the
 *    halo); the entries are all-gathered over CP, so every rank holds the
 *    whole row's entries; phases 3 (indexer top-k), 4 (core) and 5 (output)
 *    for local queries;
 *  - backward: phases 5/4 for local queries give gradients of the kv rows
 *    (halo + local) and of the entries of the whole row; entry gradients are
 *    reduce-scattered (rank order 0..CP-1) to the entries' owners; phase 2
 *    backward on owned blocks (into halo a/z too); phase 1 backward on halo
 *    + local rows; the halo rows' dx go back to r-1, which adds them after
 *    its own contribution.
 * All communication goes through src/comm (p2p for the halos, allgatherv
 * for entries, reduce_scatter for entry gradients).
 *
 * Equality with the serial layer (kernels/attention.h) on the whole rows:
 * y and selected bitwise (f64, one BLAS thread: par_gemm rows are
 * row-invariant); dx and dW to rounding (sums split across ranks).
 */
#ifndef PAR_PARALLEL_CP_CP_H
#define PAR_PARALLEL_CP_CP_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/real.h"
#include "parallel/tp/tp.h"

#ifndef PAR_CP_TRAFFIC_DEFINED
#define PAR_CP_TRAFFIC_DEFINED
/* Bytes this rank handed to src/comm, per kind (accumulated, +=).  The
 * emulated network's time per tier is src/comm's accounting; these are the
 * payload sizes for reports and tests. */
typedef struct par_cp_traffic_s {
    int64_t halo_fwd;   /* x rows sent to rank r+1                       */
    int64_t gather_fwd; /* entries contributed to the all-gather         */
    int64_t rs_bwd;     /* entry gradients put into the reduce-scatter   */
    int64_t halo_bwd;   /* halo dx rows sent back to rank r-1            */
} par_cp_traffic;
#endif

/* D of one layer: max(window, d_comp(m)) (parallel/layout/layout.h's D_window
 * restricted to this layer; the model's D_window is the max over layers). */
int64_t PAR_FN(par_cp_layer_halo)(const par_attn_dims *dm);

/* The CP rule S/CP >= D (and S % CP == 0, CP >= 1) with Megatron's wording:
 * the message names the local rows S/CP and D_window.  d_window is the
 * model's (par_layout_d_window) or one layer's (par_cp_layer_halo). */
par_status PAR_FN(par_cp_check)(int64_t S, int64_t cp, int64_t d_window);

/* What the forward keeps for the backward, sized by what this rank works
 * on (docs/parallel.md, "Context parallelism: the rank's state").  Row b's
 * working rows are [h0, l1) = halo + local (W_ = Dh + L of them, h0 =
 * r*L - Dh): every per-token array of `s` holds them, WINDOW coordinates
 * ([rows, W_, ...], window row 0 = row position h0; q, o, lse, r, sel are
 * written on the local rows only, zero / -1 on the halo).  The compressed
 * entries (cmp, icmp) are the whole row's after the all-gather and stay in
 * ROW coordinates ([rows, S, c], entry i of a sample at its block's last
 * token, as kernels/attention.h): s.cmp and s.icmp are NULL; a row's view
 * for the kernels points them at row position h0 of ecmp / eicmp, so the
 * kernels' window indices reach back to the row's start inside the array. */
typedef struct {
    int64_t rows, L, S, cp, rank;
    int64_t D;         /* layer halo (par_cp_layer_halo)                    */
    int64_t Dh;        /* halo rows this rank holds: D for rank > 0, else 0 */
    par_attn_dims dm;  /* copy (dm.rope is the caller's, must outlive this) */
    PAR_FN(par_attn_saved) s; /* [rows, W_] tokens, window coordinates      */
    par_real *ecmp;    /* [rows, S, hd] entries (m > 0, else NULL)           */
    par_real *eicmp;   /* [rows, S, ihd] indexer entries (m == 4, else NULL) */
    void *ebuf;        /* owns ecmp, eicmp                                  */
    par_real *xw;      /* [rows, Dh+L, d]: halo then local x of each row    */
    int32_t *pos;      /* [rows*S]: positions of the whole rows             */
    void *buf;         /* owns s's arrays                                   */
    /* after par_cp_attn_backward_input, for the weight half: the gradients
     * at the projections' outputs on each row's working rows (halo + local,
     * [rows, Dh+L, width]); kbuf owns them */
    void *kbuf;
    par_real *kq, *kkv, *kcmp, *kca, *kcz; /* widths H*hd, hd, hd, coff*hd, coff*hd */
    par_real *kdqr; /* the bitwise mode under TP: the complete dqr [rows, Dh+L, q_lora], or NULL */
    /* TP x CP (par_cp_attn_forward_tp): the TP group (comm NULL: none) and
     * the layer's index heads (the indexer weights' scale); dm is the shard's */
    par_tp tp;
    int64_t iH_full;
} PAR_FN(par_cp_attn_saved);

/* Frees what a forward allocated (a zeroed or freed struct is fine). */
void PAR_FN(par_cp_attn_saved_free)(PAR_FN(par_cp_attn_saved) *sv);

/* y_local = this rank's slice of Attention(x) over whole rows.  Collective
 * over cp (NULL: one rank, no communication).  pos_rows holds the positions
 * within samples of the WHOLE rows (from the global segments; every rank
 * passes the same array): halo positions, sample starts inside the halo or at
 * a split, and the owners of entries come from it.  `saved` must be zeroed or
 * freed; it is filled (allocated) on success and released with
 * par_cp_attn_saved_free.  selected_local (m == 4, may be NULL): the indexer
 * picks of the local queries, as par_attn_forward's `selected`.  traffic may
 * be NULL. */
par_status PAR_FN(par_cp_attn_forward)(par_real *y_local,            /* [rows, L, d] */
                                       PAR_FN(par_cp_attn_saved) *saved,
                                       int32_t *selected_local,      /* [rows, L, topk] or NULL */
                                       const par_real *x_local,      /* [rows, L, d] */
                                       const int32_t *pos_rows,      /* [rows, S], S = L*CP */
                                       const PAR_FN(par_attn_weights) *W,
                                       const par_attn_dims *dm, int64_t rows, int64_t L,
                                       par_comm *cp, par_cp_traffic *traffic);

/* TP x CP: the same on one TP rank's shard of the heads (parallel/tp/tp_attn.h
 * par_tp_attn_dims dl and par_tp_attn_shard Wl), every TP rank of the CP
 * group's coordinate on the same tokens: the indexer's head sums chained
 * over TP in head order for the local queries (picks from the last TP rank,
 * broadcast), the indexer weights scaled by the layer's iH (iH_full), the
 * row-parallel output summed over TP.  The backward (par_cp_attn_backward_
 * input with this saved state) sums dx over TP; dsink is the shard's [H/TP];
 * the weight half gives the shard's gradients (replicated weights: this TP
 * rank's share, summed over TP by the caller).  Collective over cp and tp. */
par_status PAR_FN(par_cp_attn_forward_tp)(par_real *y_local, PAR_FN(par_cp_attn_saved) *saved,
                                          int32_t *selected_local, const par_real *x_local,
                                          const int32_t *pos_rows, const PAR_FN(par_attn_weights) *Wl,
                                          const par_attn_dims *dl, int64_t iH_full, int64_t rows, int64_t L,
                                          par_comm *cp, const par_tp *tp, par_cp_traffic *traffic);

/* dx_local += (this rank's share of) d(sum y dy)/dx, then the halo
 * gradients received from rank r+1 added to the last D rows;
 * dW += this rank's share of every non-indexer weight gradient (the caller
 * sums dW over CP and DP).  Collective over cp; every rank passes dx_local
 * NULL or every rank non-NULL.  traffic may be NULL.  This is the input
 * half then the weight half below. */
par_status PAR_FN(par_cp_attn_backward)(par_real *dx_local,          /* [rows, L, d] or NULL */
                                        PAR_FN(par_attn_weights) *dW, /* or NULL */
                                        const par_real *dy_local,    /* [rows, L, d] */
                                        PAR_FN(par_cp_attn_saved) *saved,
                                        const PAR_FN(par_attn_weights) *W,
                                        par_comm *cp, par_cp_traffic *traffic);

/* The input half (B; every communication of the backward): dx_local as
 * above, dsink += (the sink's gradient, a by-product of the softmax
 * backward), and saved->kbuf filled for the weight half. */
par_status PAR_FN(par_cp_attn_backward_input)(par_real *dx_local,       /* [rows, L, d] or NULL */
                                              par_real *dsink,          /* [H] += or NULL */
                                              const par_real *dy_local, /* [rows, L, d] */
                                              PAR_FN(par_cp_attn_saved) *saved,
                                              const PAR_FN(par_attn_weights) *W,
                                              par_comm *cp, par_cp_traffic *traffic);
/* The weight half (W; no communication): dW += every non-indexer weight but
 * attn_sink, from what the input half kept (consumed, then freed).  The same
 * GEMMs and sums on the same inputs as one pass: the bits of
 * par_cp_attn_backward. */
par_status PAR_FN(par_cp_attn_backward_weights)(PAR_FN(par_attn_weights) *dW,
                                                const par_real *dy_local, /* [rows, L, d] */
                                                PAR_FN(par_cp_attn_saved) *saved,
                                                const PAR_FN(par_attn_weights) *W);

#endif
