/* core/counters.h - per-thread counts of floating-point work and memory
 * traffic, for the emulated GPU's roofline (src/comm/clock.c).
 *
 * Kernels MAY call par_count_flops / par_count_bytes for the work they do
 * (today: the GEMM wrapper, 2*M*N*K flops and the bytes of A, B and C).  The
 * counters are thread-local, so each thread rank counts its own work; a call
 * from inside an OpenMP parallel region counts on the worker thread and is
 * lost to the rank, so count outside such regions.  The virtual clock reads
 * the counters at every communication event and charges the difference:
 * compute time = max(flops / peak FLOP/s, bytes / HBM bandwidth).  The counts
 * depend only on the shapes the kernels see, so the emulated times are
 * deterministic.
 */
#ifndef PAR_CORE_COUNTERS_H
#define PAR_CORE_COUNTERS_H

#include <stdint.h>

typedef struct {
    uint64_t flops;  /* floating-point operations (a multiply-add is 2) */
    uint64_t bytes;  /* bytes read or written in device memory (HBM)    */
} par_counts;

void par_count_flops(uint64_t n);
void par_count_bytes(uint64_t n);
/* The calling thread's totals since it started (or its last reset). */
par_counts par_counts_get(void);
void par_counts_reset(void);
/* Replaces the calling thread's totals: a backend that runs several ranks on
 * one thread (fiber) loads a rank's counts when the rank comes onto the
 * thread and saves them (par_counts_get) when it leaves. */
void par_counts_set(par_counts c);

#endif
