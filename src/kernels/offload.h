/* kernels/offload.h - the macro layer that lets one kernel source run on the
 * host (the default build: every macro here is today's code or nothing) or
 * on a GPU through OpenMP target offload (-Doffload=nvptx, PAR_OFFLOAD=1;
 * docs/gpu.md).
 *
 * A kernel written for both:
 *
 *   void k(par_real *y, const par_real *x, int64_t T, int64_t D)
 *   {
 *       PAR_DEV_BEGIN();                  // par__on: kernels run on a device
 *       PAR_DOUT(y, T * D);               // y, x: device addresses from here
 *       PAR_DIN(x, T * D);
 *       PAR_KLOOP(is_device_ptr(y, x))    // serial on the host, teams on the GPU
 *       for (int64_t t = 0; t < T; t++)
 *           ...
 *   }
 *
 * PAR_DIN / PAR_DOUT / PAR_DINOUT replace a pointer by its device address
 * (core/device.h: par_dev_in / _out / _inout; `count` elements of *p); in
 * the default build, and on the host in an offload build's CPU mode, the
 * pointer is unchanged.  Loops:
 *   PAR_KLOOP(clauses)            a loop that runs serially on the host today
 *   PAR_KLOOP_PAR(host_if, cl.)   a loop that is `#pragma omp parallel for
 *                                 schedule(static) if (host_if)` today
 *   PAR_KSERIAL(clauses)          a block that must run in order (one device
 *                                 thread): reductions whose order sets the bits
 * Functions called from device code are bracketed by PAR_DECLARE_TARGET /
 * PAR_END_DECLARE_TARGET.  Per-thread scratch of today's parallel loops is
 * addressed through PAR_SLOTS / PAR_SLOT: one slot per host thread in the
 * default build (today's layout), one per loop iteration on the device
 * (device threads have no host thread number).
 *
 * Kernels must not dereference host structures inside a device loop: copy
 * the fields (or the struct, map(to: ...)) first.
 */
#ifndef PAR_KERNELS_OFFLOAD_H
#define PAR_KERNELS_OFFLOAD_H

#include <stdint.h>

#include "core/device.h"

#define PAR_PRAGMA(x) _Pragma(#x)

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD

#define PAR_DEV_BEGIN()                                                                   \
    const int par__on = par_dev_real(), par__gpu = par_dev_gpu();                         \
    (void)par__on, (void)par__gpu
#define PAR_DIN(p, count) ((p) = par_dev_in((p), (size_t)(count) * sizeof *(p)))
#define PAR_DOUT(p, count) ((p) = par_dev_out((p), (size_t)(count) * sizeof *(p)))
#define PAR_DINOUT(p, count) ((p) = par_dev_inout((p), (size_t)(count) * sizeof *(p)))
/* the device address of p without changing p (host code keeps using p) */
#define PAR_DIN_AS(p, count) par_dev_in((p), (size_t)(count) * sizeof *(p))
#define PAR_DOUT_AS(p, count) par_dev_out((p), (size_t)(count) * sizeof *(p))
#define PAR_DINOUT_AS(p, count) par_dev_inout((p), (size_t)(count) * sizeof *(p))
#define PAR_HOST_READ(p, count) par_dev_host_read((p), (size_t)(count) * sizeof *(p))
#define PAR_HOST_WRITE(p, count) par_dev_host_write((p), (size_t)(count) * sizeof *(p))
#define PAR_HOST_SET(p, count) par_dev_host_set((p), (size_t)(count) * sizeof *(p))

#define PAR_KLOOP(...)                                                                    \
    PAR_PRAGMA(omp target teams distribute parallel for if(target: par__on)               \
               if(parallel: par__on) __VA_ARGS__)
#define PAR_KLOOP_PAR(host_if, ...)                                                       \
    PAR_PRAGMA(omp target teams distribute parallel for if(target: par__on)               \
               if(parallel: par__on || (host_if)) __VA_ARGS__)
#define PAR_KSERIAL(...) PAR_PRAGMA(omp target if(par__on) __VA_ARGS__)
#define PAR_DECLARE_TARGET PAR_PRAGMA(omp declare target)
#define PAR_END_DECLARE_TARGET PAR_PRAGMA(omp end declare target)
#define PAR_SLOTS(nthreads, niter) ((void)sizeof(nthreads), (size_t)(niter))
#define PAR_SLOT(tid, iter) ((void)sizeof(tid), (size_t)(iter))
/* 1 inside a kernel (after PAR_DEV_BEGIN) in GPU mode, real or emulated:
 * for the few loops whose host form (cache blocking) does not suit a GPU;
 * the emulation runs the device form on the host, so tests cover it */
#define PAR_ON_DEVICE() (par__gpu)
/* GPU mode (real or emulated): the device GEMM of kernels/gemm_device.c */
#define PAR_GEMM_ON_DEVICE(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)            \
    (par_dev_gpu() &&                                                                     \
     (PAR_FN(par__gemm_device)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), 1))

#else /* the default build: today's code */

#define PAR_DEV_BEGIN() ((void)0)
#define PAR_DIN(p, count) ((void)sizeof(count))
#define PAR_DOUT(p, count) ((void)sizeof(count))
#define PAR_DINOUT(p, count) ((void)sizeof(count))
#define PAR_DIN_AS(p, count) (p)
#define PAR_DOUT_AS(p, count) (p)
#define PAR_DINOUT_AS(p, count) (p)
#define PAR_HOST_READ(p, count) ((void)sizeof(count))
#define PAR_HOST_WRITE(p, count) ((void)sizeof(count))
#define PAR_HOST_SET(p, count) ((void)sizeof(count))
#define PAR_KLOOP(...)
#define PAR_KLOOP_PAR(host_if, ...) PAR_PRAGMA(omp parallel for schedule(static) if (host_if))
#define PAR_KSERIAL(...)
#define PAR_DECLARE_TARGET
#define PAR_END_DECLARE_TARGET
#define PAR_SLOTS(nthreads, niter) ((size_t)(nthreads))
#define PAR_SLOT(tid, iter) ((size_t)(tid))
#define PAR_ON_DEVICE() 0
#define PAR_GEMM_ON_DEVICE(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) 0

#endif

#ifdef PAR_REAL_BITS /* templated units */
#include "kernels/real.h"
/* kernels/gemm_device.c (offload builds): C = alpha op(A) op(B) + beta C on
 * the device, as par_gemm (kernels/ops.h) */
void PAR_FN(par__gemm_device)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                              const par_real *A, int64_t lda, const par_real *B, int64_t ldb,
                              par_real beta, par_real *C, int64_t ldc);
/* nb products of one shape at element strides sa / sb / sc in one launch; each the
 * bits of its own par__gemm_device call */
void PAR_FN(par__gemm_device_batch)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                                    const par_real *A, int64_t lda, int64_t sa, /* nb x [M, K] */
                                    const par_real *B, int64_t ldb, int64_t sb, /* nb x [K, N] */
                                    par_real beta, par_real *C, int64_t ldc,    /* nb x [M, N] */
                                    int64_t sc, int64_t nb);
/* G products of their own shapes (M[i], N[i], K[i]) and operands (host addresses;
 * C[i] NULL: none) in one launch: a grouped GEMM (the MoE experts of a layer);
 * each the bits of its own par__gemm_device call */
void PAR_FN(par__gemm_device_group)(int ta, int tb, int64_t G, const int64_t *M, const int64_t *N,
                                    const int64_t *K, par_real alpha,
                                    const par_real *const *A, int64_t lda, /* G x [M, K] */
                                    const par_real *const *B, int64_t ldb, /* G x [K, N] */
                                    par_real beta, par_real *const *C,     /* G x [M, N]; NULL: none */
                                    int64_t ldc);
#endif

#endif
