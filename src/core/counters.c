/* core/counters.c - per-thread work counters (see counters.h). */
#include "core/counters.h"

static _Thread_local par_counts tl_counts;

void par_count_flops(uint64_t n) { tl_counts.flops += n; }
void par_count_bytes(uint64_t n) { tl_counts.bytes += n; }
par_counts par_counts_get(void) { return tl_counts; }
void par_counts_reset(void) { tl_counts = (par_counts){0, 0}; }
void par_counts_set(par_counts c) { tl_counts = c; }
