/* core/hostlim.h - what this host lets a process start, checked before any
 * rank does (issue 34 items 2-4).
 *
 * Under an address-space limit (ulimit -v, RLIMIT_AS, as a cluster's batch
 * system sets it) every OS thread that runs ranks needs its stack and, once
 * it calls BLAS, OpenBLAS's work buffer (BUFFER_SIZE, 128 MiB on x86-64: the
 * 134221824-byte allocation seen in the hang of issue 34 item 2).  OpenBLAS
 * never gives up when that buffer cannot be mapped (blas_memory_alloc retries
 * for ever), so a world that cannot fit must be refused before it starts.
 * The backends that start threads (threads, fiber) call
 * par_hostlim_threads_fit first; under a finite limit it also caps glibc's
 * malloc arenas (each reserves 64 MiB of address space) to two.
 *
 * OpenBLAS is looked up through weak symbols (core does not link BLAS): in a
 * program without it the BLAS figures are 0 (no buffer, no thread limit).
 */
#ifndef PAR_CORE_HOSTLIM_H
#define PAR_CORE_HOSTLIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* OpenBLAS's work buffer per calling thread (0 without OpenBLAS). */
size_t par_hostlim_blas_buffer(void);

/* OS threads that may call OpenBLAS at once: the MAX_THREADS=N of
 * openblas_get_config() (its compiled NUM_THREADS; more callers overrun its
 * per-thread tables: heap corruption, issue 34 item 3), 0 when unknown. */
int par_hostlim_blas_max_threads(void);

/* Bytes of address space the process may still map under RLIMIT_AS, -1
 * when unlimited; *limit (may be NULL) receives the limit (-1: none). */
int64_t par_hostlim_as_left(int64_t *limit);

/* The stack of a new thread (OMP_STACKSIZE for OpenMP's when `omp`, else
 * the pthread default). */
size_t par_hostlim_thread_stack(int omp);

/* PAR_OK when `threads` more OS threads with `stack` bytes each, each with a
 * BLAS buffer, plus `extra` bytes mapped (fiber stacks), fit in the
 * address-space limit (always when unlimited); else PAR_ENOMEM naming the
 * limit, what is mapped and what is needed.  `who` starts the message
 * ("threads", "fiber"). */
par_status par_hostlim_threads_fit(const char *who, int threads, size_t stack, size_t extra);

/* Physical memory of the machine in bytes (0 when unknown). */
uint64_t par_hostlim_phys(void);

#endif
