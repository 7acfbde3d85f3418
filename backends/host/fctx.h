/* backends/host/fctx.h - user-level contexts of the fiber backend: a stack
 * of its own (with guard pages and a canary) and a switch between contexts
 * on one thread.
 *
 * Two switches, chosen per world:
 *   - "asm" (x86-64 only, the default there): saves the callee-saved
 *     registers, the x87 control word and MXCSR on the old stack, swaps the
 *     stack pointer, restores from the new stack.  No system call: the
 *     System V ABI makes every other register the caller's to save.
 *   - "ucontext": makecontext / swapcontext (glibc), portable; every switch
 *     also saves and restores the signal mask with a system call.
 * Under AddressSanitizer every switch is announced with
 * __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber so that
 * ASan knows which stack is current.
 *
 * A stack is one anonymous mapping: `guard` bytes at its low end are
 * PROT_NONE (a stack grows down: running off the end faults there, and the
 * scheduler's fault handler names the rank), then the usable bytes.  Pages
 * are committed by the kernel only when touched, so a rank costs the stack
 * it actually uses, and mincore() tells how deep it went.
 */
#ifndef PAR_BACKENDS_HOST_FCTX_H
#define PAR_BACKENDS_HOST_FCTX_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum { FCTX_ASM = 0, FCTX_UCONTEXT = 1 } fctx_kind;

typedef struct {
    void *sp;          /* asm: the saved stack pointer                    */
    void *uc;          /* ucontext: its ucontext_t (heap)                 */
    char *map;         /* the mapping (NULL: a thread's own stack)        */
    size_t map_len;
    char *lo, *hi;     /* usable stack [lo, hi)                           */
    /* AddressSanitizer's view: the fake stack of the suspended side and the
     * bounds of the stack that is being left (learned on the switch). */
    void *asan_fake;
    const void *asan_bottom;
    size_t asan_size;
} fctx;

/* Whether this build can use the asm switch. */
int fctx_asm_available(void);

/* A stack of `bytes` usable bytes (rounded up to pages) below which
 * `guard` bytes fault; on failure returns PAR_ENOMEM with a message that
 * names the sizes.  entry() runs on it at the first switch into it and must
 * never return (it leaves with a last fctx_switch, dying = 1). */
par_status fctx_make(fctx *c, fctx_kind kind, size_t bytes, size_t guard, void (*entry)(void));
/* A thread's own context (its stack is the thread's), to switch from. */
par_status fctx_thread(fctx *c, fctx_kind kind);
void fctx_free(fctx *c);

/* Saves the running context into `from` and runs `to`.  dying: `from` will
 * never run again (ASan drops its fake stack). */
void fctx_switch(fctx_kind kind, fctx *from, fctx *to, int dying);
/* The first thing a context's entry() does: completes the switch that
 * started it (ASan bookkeeping; `from` is the context that switched). */
void fctx_started(fctx *from);

/* Bytes of the stack the kernel has committed (pages touched), from the
 * top: the stack's high-water mark to a page. */
size_t fctx_used(const fctx *c);
/* Bytes of the stack resident now (pages touched and kept), anywhere in it:
 * what the stack costs in RSS, at most fctx_used (a deep frame that touches
 * only its bottom page, e.g. an assembly GEMM kernel's aligned scratch,
 * raises the high-water mark but not this). */
size_t fctx_resident(const fctx *c);
/* Whether addr lies in c's guard (a stack overflow hit it). */
int fctx_in_guard(const fctx *c, const void *addr);

#endif
