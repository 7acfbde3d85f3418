/* backends/host/fctx.c - stacks and context switches of the fiber backend
 * (see fctx.h). */
#include "backends/host/fctx.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "core/alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define FCTX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FCTX_ASAN 1
#endif
#endif
#ifdef FCTX_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* ---- the asm switch (x86-64, System V) ------------------------------------
 *
 * par__fctx_swap(void **save, void *load): pushes rbp, rbx, r12-r15 and a
 * 16-byte slot with the x87 control word (at 0) and MXCSR (at 8), stores
 * rsp in *save, loads rsp = load and pops the same frame.  Everything else
 * is caller-saved under the ABI, so the compiler has already spilled it.
 * A new context's stack is prepared to look like a suspended one whose
 * return address is par__fctx_boot, which calls the entry held in rbx with
 * a correctly aligned stack. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl par__fctx_swap\n"
        ".hidden par__fctx_swap\n"
        ".type par__fctx_swap,@function\n"
        "par__fctx_swap:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $16, %rsp\n"
        "    fnstcw (%rsp)\n"
        "    stmxcsr 8(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    fldcw (%rsp)\n"
        "    ldmxcsr 8(%rsp)\n"
        "    addq $16, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size par__fctx_swap, .-par__fctx_swap\n"
        ".globl par__fctx_boot\n"
        ".hidden par__fctx_boot\n"
        ".type par__fctx_boot,@function\n"
        "par__fctx_boot:\n"
        "    .cfi_startproc\n"
        "    .cfi_undefined rip\n" /* backtraces end here */
        "    callq *%rbx\n"
        "    ud2\n"
        "    .cfi_endproc\n"
        ".size par__fctx_boot, .-par__fctx_boot\n");
void par__fctx_swap(void **save, void *load);
void par__fctx_boot(void);

int fctx_asm_available(void) { return 1; }

static void asm_prepare(fctx *c, void (*entry)(void))
{
    /* hi is 16-aligned; after the pops and `ret` rsp == hi, so the call in
     * par__fctx_boot enters `entry` with rsp == hi - 8 as the ABI wants. */
    uint64_t *top = (uint64_t *)(void *)c->hi;
    top[-1] = (uint64_t)(uintptr_t)par__fctx_boot; /* ret */
    top[-2] = 0;                                   /* rbp */
    top[-3] = (uint64_t)(uintptr_t)entry;          /* rbx */
    for (int i = 4; i <= 7; i++)                   /* r12..r15 */
        top[-i] = 0;
    top[-9] = 0x037f; /* x87 control word: the Linux default of a new thread */
    top[-8] = 0x1f80; /* MXCSR: round to nearest, all exceptions masked    */
    c->sp = &top[-9];
}
#else
int fctx_asm_available(void) { return 0; }
#endif

/* ---- stacks ----------------------------------------------------------------- */

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

par_status fctx_make(fctx *c, fctx_kind kind, size_t bytes, size_t guard, void (*entry)(void))
{
    size_t pg = page_size();
    memset(c, 0, sizeof *c);
    bytes = round_up(bytes ? bytes : pg, pg);
    guard = round_up(guard, pg);
    size_t len = bytes + guard;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
        return par_err(PAR_ENOMEM, "fiber: no memory for a stack of %zu KiB (+%zu KiB guard): %s",
                       bytes >> 10, guard >> 10, strerror(errno));
    if (guard && mprotect(m, guard, PROT_NONE) != 0) {
        int e = errno;
        munmap(m, len);
        return par_err(PAR_ENOMEM, "fiber: cannot protect the guard of a stack: %s (too many "
                       "mappings? see /proc/sys/vm/max_map_count)", strerror(e));
    }
#ifdef MADV_NOHUGEPAGE
    madvise(m + guard, bytes, MADV_NOHUGEPAGE); /* commit 4 KiB pages, as touched */
#endif
    c->map = m;
    c->map_len = len;
    c->lo = m + guard;
    c->hi = m + len;
    if (kind == FCTX_UCONTEXT) {
        ucontext_t *uc = par_calloc(1, sizeof *uc, PAR_TAG_COMM);
        if (!uc || getcontext(uc) != 0) {
            par_free(uc);
            munmap(m, len);
            memset(c, 0, sizeof *c);
            return par_err(PAR_ENOMEM, "fiber: no memory for a ucontext");
        }
        uc->uc_stack.ss_sp = c->lo;
        uc->uc_stack.ss_size = bytes;
        uc->uc_link = NULL;
        makecontext(uc, entry, 0);
        c->uc = uc;
        return PAR_OK;
    }
#if defined(__x86_64__)
    asm_prepare(c, entry);
    return PAR_OK;
#else
    munmap(m, len);
    memset(c, 0, sizeof *c);
    return par_err(PAR_EUNSUPPORTED, "fiber: the asm switch exists only on x86-64 (use ucontext)");
#endif
}

par_status fctx_thread(fctx *c, fctx_kind kind)
{
    memset(c, 0, sizeof *c);
    if (kind == FCTX_UCONTEXT && !(c->uc = par_calloc(1, sizeof(ucontext_t), PAR_TAG_COMM)))
        return par_err(PAR_ENOMEM, "fiber: no memory for a worker's ucontext");
    return PAR_OK;
}

void fctx_free(fctx *c)
{
    if (c->map) {
#ifdef FCTX_ASAN
        /* frames left redzones in the shadow; the range may be mapped again */
        __asan_unpoison_memory_region(c->lo, (size_t)(c->hi - c->lo));
#endif
        munmap(c->map, c->map_len);
    }
    par_free(c->uc);
    memset(c, 0, sizeof *c);
}

/* ---- switching -------------------------------------------------------------- */

#ifdef FCTX_ASAN
static void asan_leave(fctx *from, const fctx *to, int dying)
{
    const void *bottom = to->map ? (const void *)to->lo : to->asan_bottom;
    size_t size = to->map ? (size_t)(to->hi - to->lo) : to->asan_size;
    __sanitizer_start_switch_fiber(dying ? NULL : &from->asan_fake, bottom, size);
}

static void asan_back(fctx *self)
{
    const void *b;
    size_t s;
    __sanitizer_finish_switch_fiber(self->asan_fake, &b, &s);
}
#endif

void fctx_switch(fctx_kind kind, fctx *from, fctx *to, int dying)
{
#ifdef FCTX_ASAN
    asan_leave(from, to, dying);
#else
    (void)dying;
#endif
    if (kind == FCTX_UCONTEXT) {
        swapcontext(from->uc, to->uc);
    } else {
#if defined(__x86_64__)
        par__fctx_swap(&from->sp, to->sp);
#endif
    }
#ifdef FCTX_ASAN
    asan_back(from);
#endif
}

void fctx_started(fctx *from)
{
#ifdef FCTX_ASAN
    __sanitizer_finish_switch_fiber(NULL, &from->asan_bottom, &from->asan_size);
#else
    (void)from;
#endif
}

/* ---- inspection ------------------------------------------------------------- */

/* mincore over the stack from its low end: *deep = the bytes from the
 * first resident page to the top (the deepest the stack went), *res = the
 * resident bytes; 0 on success. */
static int stack_scan(const fctx *c, size_t *deep, size_t *res)
{
    *deep = *res = 0;
    if (!c->map)
        return 0;
    size_t pg = page_size(), n = (size_t)(c->hi - c->lo) / pg, first = n, cnt = 0;
    unsigned char vec[256];
    for (size_t i = 0; i < n; i += sizeof vec) {
        size_t k = n - i < sizeof vec ? n - i : sizeof vec;
        if (mincore(c->lo + i * pg, k * pg, vec) != 0)
            return -1;
        for (size_t j = 0; j < k; j++)
            if (vec[j] & 1) {
                first = first < n ? first : i + j;
                cnt++;
            }
    }
    *deep = first < n ? (size_t)(c->hi - (c->lo + first * pg)) : 0;
    *res = cnt * pg;
    return 0;
}

size_t fctx_used(const fctx *c)
{
    size_t deep, res;
    return stack_scan(c, &deep, &res) ? 0 : deep;
}

size_t fctx_resident(const fctx *c)
{
    size_t deep, res;
    return stack_scan(c, &deep, &res) ? 0 : res;
}

int fctx_in_guard(const fctx *c, const void *addr)
{
    const char *a = addr;
    return c->map && a >= c->map && a < c->lo;
}
