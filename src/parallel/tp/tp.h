/* parallel/tp/tp.h - the group context of the tensor-parallel layers (TP, SP
 * and ETP: tp_attn.h, tp_mlp.h, tp_vocab.h, etp.h, tp_muon.h).  Plain data,
 * no precision.  docs/parallel.md, "Tensor parallelism".
 *
 * One par_tp names the group a layer runs on and how the group's ranks hold
 * tokens:
 *   sp == 0   every rank holds the same T tokens (TP without sequence
 *             parallelism): column-parallel inputs are used as they are,
 *             row-parallel outputs are all-reduced;
 *   sp == 1   rank r holds tokens [r*T/P, (r+1)*T/P) of the T tokens
 *             (Megatron's --sequence-parallel; for the ETP group: the ranks
 *             hold disjoint rows, as MoE parallel folding gives them): inputs
 *             are all-gathered before the layer, outputs reduce-scattered
 *             after it.
 * comm == NULL is a group of one rank (no communication; the serial
 * layer's numbers).
 */
#ifndef PAR_PARALLEL_TP_TP_H
#define PAR_PARALLEL_TP_TP_H

#include <stdint.h>

#include "comm/comm.h"

/* Bytes this rank handed to src/comm, per kind (accumulated, +=). */
typedef struct {
    int64_t allreduce;      /* row-parallel outputs, input gradients, CE sums, grads */
    int64_t allgather;      /* SP / ETP token (row) all-gathers                      */
    int64_t reduce_scatter; /* SP / ETP output reduce-scatters                       */
    int64_t chain;          /* indexer score chain (point to point, rank r -> r+1)  */
    int64_t bcast;          /* indexer picks from the last rank                      */
    int64_t muon;           /* Muon gather to the owner and scatter back            */
} par_tp_traffic;

/* The shared expert's work on one rank (accumulated over blocks, steps):
 * units = tokens x hidden units of its forward (T x I/TP when it runs
 * TP-split, T x I when whole), bytes = what its TP collectives handed to
 * src/comm (forward and backward).  Summed over the ranks of a step, the
 * split gives units = tokens x I per block, whatever the layout. */
typedef struct par_tp_shared_stats_s {
    int64_t units;
    int64_t bytes;
} par_tp_shared_stats;

/* Deliberate bugs, for the fault demonstrations of tests and matrix cells
 * only (never set in a real run).  Each is the known bug class named. */
enum {
    /* vocab-parallel CE: the softmax denominator all-reduced twice (a second
     * reduction of an already reduced tensor): the loss gains log(TP) */
    PAR_TP_FAULT_CE_LOG_TP = 1u << 0,
    /* par_tp_attn_reduce_grads skips wkv: each rank keeps the gradient of
     * its own heads only */
    PAR_TP_FAULT_WKV_NO_REDUCE = 1u << 1,
    /* par_tp_muon_update orthogonalizes each rank's shard instead of the
     * whole logical matrix */
    PAR_TP_FAULT_MUON_SHARD = 1u << 2,
    /* the TP shared expert's partial output is not summed over TP (each
     * rank keeps its hidden units' share of y) */
    PAR_TP_FAULT_SHARED_NO_REDUCE = 1u << 3,
};

/* A -Dfault=NAME build (tools/fault-demo.sh, docs/matrix.md) compiles one
 * of the bits into every run of the executor: the matrix's TP cells must
 * then fail with the fault's diagnosis.  0 in every normal build. */
#if defined(PAR_FAULT_TP_CE_LOG_TP)
#define PAR_TP_BUILD_FAULTS ((unsigned)PAR_TP_FAULT_CE_LOG_TP)
#elif defined(PAR_FAULT_TP_WKV_NO_REDUCE)
#define PAR_TP_BUILD_FAULTS ((unsigned)PAR_TP_FAULT_WKV_NO_REDUCE)
#elif defined(PAR_FAULT_TP_MUON_SHARD)
#define PAR_TP_BUILD_FAULTS ((unsigned)PAR_TP_FAULT_MUON_SHARD)
#elif defined(PAR_FAULT_TP_SHARED_NO_REDUCE)
#define PAR_TP_BUILD_FAULTS ((unsigned)PAR_TP_FAULT_SHARED_NO_REDUCE)
#else
#define PAR_TP_BUILD_FAULTS 0u
#endif

typedef struct {
    par_comm *comm;          /* the group (groups.h "tp" or "etp"); NULL: one rank */
    int sp;                  /* 1: the ranks hold disjoint token slices (above)     */
    unsigned faults;         /* PAR_TP_FAULT_* bits; 0 in real runs                 */
    par_tp_traffic *traffic; /* may be NULL                                         */
    int bitwise;             /* the bitwise mode: split sums as chains in rank order
                                (docs/bitwise.md "Tensor parallelism")               */
} par_tp;

static inline int par_tp_rank(const par_tp *tp) { return tp && tp->comm ? par_comm_rank(tp->comm) : 0; }
static inline int par_tp_size(const par_tp *tp) { return tp && tp->comm ? par_comm_size(tp->comm) : 1; }

#endif
