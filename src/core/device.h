/* core/device.h - where a rank's memory lives: host only (the default), or
 * on a GPU through OpenMP target offload (the build option -Doffload=nvptx,
 * docs/gpu.md).
 *
 * In GPU mode every block of the tagged allocator (core/alloc.h) is known
 * here and gets a device twin the first time a kernel uses it.  Each byte
 * range of a block is in one of three states: HOST (only the host copy is
 * current), DEV (only the device copy) or BOTH.  Kernels translate their
 * operands (par_dev_in / _out / _inout return the device address and move
 * what is stale there); host code that touches memory a kernel may have
 * written says so (par_dev_host_read / _write / _set), which moves what is
 * stale on the host.  Data therefore moves only when its owner changes side:
 * parameters, gradients and activations stay on the device for the whole
 * step, and a transfer is made once per change, never per kernel.
 *
 * Two device runtimes behind the same state machine:
 *   real      libgomp's nvptx plugin: omp_target_alloc / omp_target_memcpy
 *             on the process's device (MPI: local rank mod the device count);
 *   emulated  (PARITY_GPU_EMULATE=1, for machines without a GPU) the device
 *             copy is a separate host buffer, the kernels run as OpenMP host
 *             fallback on it, and every stale copy is poisoned (NaN for
 *             floats, a huge value for integers), so a missing annotation
 *             shows as a wrong or non-finite result on any machine.
 * The emulation moves exactly the bytes the real runtime would move: a run
 * that is right emulated is right on the device, up to the device's
 * arithmetic (docs/gpu.md).
 *
 * In the default build (no PAR_OFFLOAD) everything here is an inline no-op,
 * par_dev_zero / par_dev_copy are memset / memcpy, and par_dev_init refuses
 * GPU mode.  Process-wide: one mode and one device per process; call
 * par_dev_init before allocating anything that kernels will see.
 */
#ifndef PAR_CORE_DEVICE_H
#define PAR_CORE_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/status.h"

typedef enum { PAR_DEV_CPU = 0, PAR_DEV_GPU = 1 } par_device_kind;

/* Transfer accounting of the process (bytes and calls since init). */
typedef struct {
    int64_t h2d_bytes, d2h_bytes, d2d_bytes;
    int64_t h2d_calls, d2h_calls;
    /* of d2d: the comm layer's copies between ranks' buffers (par_dev_comm_copy) */
    int64_t comm_d2d_bytes, comm_d2d_calls;
    int64_t comm_host_bytes; /* the comm layer's copies on the host */
    int64_t twins, twin_bytes_peak; /* device twins created, most device bytes live */
} par_dev_stats;

/* Element kinds of par_dev_reduce_rows (core does not know comm's types). */
enum { PAR_DEV_F64 = 0, PAR_DEV_F32, PAR_DEV_I32, PAR_DEV_I64, PAR_DEV_U8 };

/* A rank's mode (par_dev_mode_set). */
enum { PAR_DEV_MODE_DEVICE = 0, PAR_DEV_MODE_HOST = 1 };

/* "cpu" or "gpu" -> *kind; anything else PAR_EINVAL naming the choices. */
par_status par_dev_parse(const char *name, par_device_kind *kind);

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD

/* Selects the process's mode.  GPU: a real device when libgomp sees one
 * (device local_rank mod count), else emulated when PARITY_GPU_EMULATE=1,
 * else PAR_EUNSUPPORTED naming both.  Idempotent for the same kind. */
par_status par_dev_init(par_device_kind kind, int local_rank);
int par_dev_gpu(void);  /* 1 in GPU mode (real or emulated) */
int par_dev_real(void); /* 1 when kernels run on a real device */
/* 1 when kernels use device memory: GPU mode (real or emulated) outside host mode */
int par_dev_device_mode(void);
/* One line: "cpu", "gpu: nvptx device 0 of 1 (OpenMP offload)" or
 * "gpu: emulated on the host (PARITY_GPU_EMULATE=1)". */
const char *par_dev_describe(void);
void par_dev_get_stats(par_dev_stats *out);

/* Kernel operands: the device address of [p, p + bytes) after making it
 * current there.  in: read; out: every byte will be written (nothing is
 * copied); inout: read and written.  NULL stays NULL; an address that is
 * already a device address is returned as is.  Outside GPU mode: p. */
void *par_dev_in(const void *p, size_t bytes);
void *par_dev_out(void *p, size_t bytes);
void *par_dev_inout(void *p, size_t bytes);

/* Host access to [p, p + bytes): read (pull what is stale), write (pull,
 * then the host copy is the only current one), set (the host overwrites
 * every byte: nothing is pulled).  Memory this module does not know is host
 * memory: nothing to do. */
void par_dev_host_read(const void *p, size_t bytes);
void par_dev_host_write(void *p, size_t bytes);
void par_dev_host_set(void *p, size_t bytes);
/* memset(p, 0, bytes) / memcpy(dst, src, bytes) on whichever side holds the
 * data (device to device when both are there). */
void par_dev_zero(void *p, size_t bytes);
void par_dev_copy(void *dst, const void *src, size_t bytes);
/* The comm layer's copy of one rank's buffer into another's (the in-process
 * backends' exchanges and point-to-point messages; the ranks share this
 * process's device).  Device to device when every byte of the source is
 * current on the device (DEV, or BOTH in a par_dev_keep block) and the
 * destination's block has a twin: the
 * destination becomes device-owned (its rank's host code reads it only
 * through par_dev_host_read, or a kernel); otherwise on the host, as
 * host code that says so (the source pulled, the destination set). */
void par_dev_comm_copy(void *dst, const void *src, size_t bytes);
/* Keeps the block at p (the start of a par_malloc block) on the device: it
 * gets its twin now and no mode change of its rank moves or disowns it, so
 * host code must announce every access to it (a send buffer that kernels
 * fill and the comm layer reads: docs/gpu.md "Collectives on one device"). */
void par_dev_keep(void *p);
/* 1 when every byte of [p, p + bytes) is current and trusted on the device
 * (par_dev_comm_copy's test: DEV, or BOTH in a kept block); else 0, and 0
 * outside GPU mode. */
int par_dev_resident(const void *p, size_t bytes);
/* Makes [p, p + bytes) of a kept block current on the device now (what is
 * stale there moves up), whatever the rank's mode: a comm buffer that host
 * code packed (after par_dev_host_set) and the exchanges then read. */
void par_dev_push(void *p, size_t bytes);
/* The comm layer's rank-order reduction of p rows of n elements of `kind`
 * (rows[j * n + e]): out[e] = rows[0][e] op rows[1][e] op ... in row order
 * 0..p-1 (op: + , integers wrapping; max: a NaN wins), the host loop's
 * additions in the host loop's order, so the same bits.  On the device when
 * every byte of rows is resident there (par_dev_resident) and out lies in a
 * kept block: returns 1, out device-owned.  Otherwise returns 0 after making
 * rows current on the host and out host-owned, for the caller's host loop.
 * Outside GPU mode: 0, nothing done. */
int par_dev_reduce_rows(void *out, const void *rows, size_t p, size_t n, int kind, int max);
/* Barriers for code outside the step (writers, checkpoints): every known
 * byte current on the host (sync_host: BOTH) / owned by the host from now on
 * (host_all: the next kernel moves what it uses). */
void par_dev_sync_host(void);
void par_dev_host_all(void);
/* The mode of this thread's allocator scope (core/alloc.h: a layout's rank;
 * scope 0 for code outside a rank), set, returning the one before.  HOST: the
 * rank runs the parallel layer's host code (docs/gpu.md "The parallel layer
 * on the device path"); its kernels run on the host on host memory
 * (par_dev_real() is 0, the operand calls return p after the host's
 * transition) and host code may touch any byte of the rank's blocks.
 * DEVICE (the default): kernels on the device, host code annotated.
 * DEVICE -> HOST pulls every byte of the scope's blocks that is current only
 * on the device; HOST -> DEVICE makes the scope's blocks host-owned (the next
 * kernel moves what it reads), except the bytes that are current only on the
 * device (in host mode only par_dev_comm_copy makes such bytes).  Blocks
 * under par_dev_keep are left alone both ways. */
int par_dev_mode_set(int mode);

/* core/alloc.c's hooks: a block is born (HOST), resized, or freed. */
void par__dev_register(void *p, size_t n);
void par__dev_unregister(void *p);

#else /* the default build: host memory only */

static inline par_status par_dev_init(par_device_kind kind, int local_rank)
{
    (void)local_rank;
    if (kind == PAR_DEV_GPU)
        return par_err(PAR_EUNSUPPORTED,
                       "--device gpu: this build has no GPU offload (configure with "
                       "-Doffload=nvptx, docs/gpu.md)");
    return PAR_OK;
}
static inline int par_dev_gpu(void) { return 0; }
static inline int par_dev_real(void) { return 0; }
static inline const char *par_dev_describe(void) { return "cpu"; }
static inline void par_dev_get_stats(par_dev_stats *out) { memset(out, 0, sizeof *out); }
static inline void *par_dev_in(const void *p, size_t bytes) { (void)bytes; return (void *)(uintptr_t)p; }
static inline void *par_dev_out(void *p, size_t bytes) { (void)bytes; return p; }
static inline void *par_dev_inout(void *p, size_t bytes) { (void)bytes; return p; }
static inline void par_dev_host_read(const void *p, size_t bytes) { (void)p; (void)bytes; }
static inline void par_dev_host_write(void *p, size_t bytes) { (void)p; (void)bytes; }
static inline void par_dev_host_set(void *p, size_t bytes) { (void)p; (void)bytes; }
static inline void par_dev_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static inline void par_dev_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void par_dev_comm_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void par_dev_keep(void *p) { (void)p; }
static inline int par_dev_resident(const void *p, size_t bytes) { (void)p; (void)bytes; return 0; }
static inline void par_dev_push(void *p, size_t bytes) { (void)p; (void)bytes; }
static inline int par_dev_reduce_rows(void *out, const void *rows, size_t p, size_t n, int kind, int max)
{
    (void)out; (void)rows; (void)p; (void)n; (void)kind; (void)max;
    return 0;
}
static inline void par_dev_sync_host(void) {}
static inline void par_dev_host_all(void) {}
static inline int par_dev_mode_set(int mode) { (void)mode; return 0; }
static inline void par__dev_register(void *p, size_t n) { (void)p; (void)n; }
static inline void par__dev_unregister(void *p) { (void)p; }

#endif

#endif
