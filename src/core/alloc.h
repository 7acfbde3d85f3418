/* core/alloc.h - tagged allocation and arenas.
 *
 * Every allocation of parity names what it is for.  Live and peak bytes are
 * counted per tag (atomically, so thread ranks may allocate concurrently);
 * tests assert that nothing is live at exit, and runs print the per-tag peak
 * as their memory accounting.  Blocks are 64-byte aligned.
 */
#ifndef PAR_CORE_ALLOC_H
#define PAR_CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PAR_TAG_MISC = 0,
    PAR_TAG_TENSOR,   /* tensors of files and tools            */
    PAR_TAG_IO,       /* file buffers, headers, JSON           */
    PAR_TAG_PARAM,    /* model weights                         */
    PAR_TAG_GRAD,     /* gradients                             */
    PAR_TAG_OPTIM,    /* optimizer state                       */
    PAR_TAG_ACT,      /* saved activations and workspaces      */
    PAR_TAG_COMM,     /* communication buffers                 */
    PAR_TAG_MODEL,    /* model structure, tables, configs      */
    PAR_TAG_ARENA,    /* arena chunks                          */
    PAR_TAG_COUNT
} par_tag;

void *par_malloc(size_t n, par_tag tag);
void *par_calloc(size_t count, size_t size, par_tag tag); /* checks overflow */
void *par_realloc(void *p, size_t n, par_tag tag);        /* tag of a NULL p */
void par_free(void *p);                                   /* NULL is fine   */
char *par_strdup(const char *s, par_tag tag);

const char *par_tag_name(par_tag tag);
int64_t par_alloc_live(par_tag tag);   /* bytes live now                 */
int64_t par_alloc_peak(par_tag tag);   /* highest live bytes since reset */
int64_t par_alloc_live_total(void);
void par_alloc_reset_peaks(void);
/* Logs (at `level` of core/log.h) one line per tag with live bytes. */
void par_alloc_report(int level);

/* The process's malloc policy for many ranks in one process (called once
 * by the CLI before any rank runs).  glibc maps a block of the mmap
 * threshold or more on its own and unmaps it when freed, but by default it
 * raises that threshold to the largest block freed so far (up to 32 MiB):
 * after the first step the ranks' activation chunks and exchange buffers
 * land in shared heaps, where the holes left between other ranks' live
 * blocks stay resident.  This fixes the threshold at PAR_ALLOC_MMAP_MIN
 * (the fixing measured: v4-mini B=128 EP128, peak RSS 7.60 -> 6.95 GiB on
 * threads, 7.68 -> 6.93 GiB on fiber; docs/planning.md).  A user's own
 * MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES is left to glibc.  Returns 1 when
 * it set the threshold.
 *
 * It also turns on, unless PARITY_THP=0, the advice of transparent huge
 * pages (madvise MADV_HUGEPAGE) for every block of PAR_ALLOC_THP_MIN bytes or
 * more: a fresh block is then faulted in 2 MiB at a time instead of 4 KiB.
 * The threshold is that size, so a block is mapped on its own only when huge
 * pages can back it; smaller blocks are reused from the heaps without new
 * page faults (it was 128 KiB until 2026-12-05).  Measured on a 2-core AMD
 * EPYC VM, where a page fault costs a hypercall (docs/planning.md "Page
 * faults"): the serial v4-mini step 15.5-17.2 -> 7.3-9.1 s wall, the EP128
 * run above 48.6 -> 25.6 s (threads) with peak RSS 4.47 -> 4.75 GiB.  Bits
 * do not move. */
#define PAR_ALLOC_THP_MIN (2u << 20)
#define PAR_ALLOC_MMAP_MIN PAR_ALLOC_THP_MIN
int par_alloc_process_init(void);
/* 1 when big blocks get the huge-page advice (par_alloc_process_init) */
int par_alloc_thp(void);

/* Accounting scopes: per-thread counters on top of the global ones, so that
 * the ranks of a thread world (one thread each) can each measure their own
 * memory.  A thread enters a scope; every block it allocates is charged to
 * that scope (and uncharged when freed, by any thread); arena handouts are
 * charged by the thread that makes them.  Two views per tag:
 *   allocated  bytes handed to callers: blocks outside arenas plus arena
 *              handouts (what the code asked for, like a GPU allocator's
 *              "allocated");
 *   reserved   every block, arena chunks whole ("reserved").
 * A block freed after its scope was closed is ignored (slots carry a
 * generation).  At most PAR_ALLOC_SCOPES scopes are open at once. */
#define PAR_ALLOC_SCOPES 8192 /* config B and C of the tuning guide: 8,192 ranks, one scope each */

typedef struct {
    int64_t live[PAR_TAG_COUNT], peak[PAR_TAG_COUNT];          /* allocated view */
    int64_t res_live[PAR_TAG_COUNT], res_peak[PAR_TAG_COUNT];  /* reserved view  */
} par_alloc_stats;

/* Opens a zeroed scope and makes it this thread's current one; returns its
 * id (>= 1), or 0 when every slot is taken (nothing is then charged). */
int par_alloc_scope_open(void);
/* Closes scope id (and leaves it if this thread is in it); 0 is fine. */
void par_alloc_scope_close(int id);
/* Makes scope id (0: none) this thread's current one; returns the previous. */
int par_alloc_scope_enter(int id);
/* This thread's current scope (0: none). */
int par_alloc_scope_current(void);
/* Peaks := live bytes now (a measurement window starts). */
void par_alloc_scope_reset_peaks(int id);
/* Copies the counters of scope id (zeros for 0 or a closed scope). */
void par_alloc_scope_stats(int id, par_alloc_stats *out);

/* Arena: bump allocation from chunks; freed all at once. */
typedef struct par_arena_chunk par_arena_chunk;
typedef struct {
    par_arena_chunk *head;
    size_t chunk_size;
    par_tag tag;
    size_t used;  /* bytes handed out since init/reset */
} par_arena;

typedef struct {
    par_arena_chunk *chunk;
    size_t off;
    size_t used;
} par_arena_mark;

void par_arena_init(par_arena *a, size_t chunk_size, par_tag tag);
/* align must be a power of two (0 means 16). Returns NULL on failure. */
void *par_arena_alloc(par_arena *a, size_t n, size_t align);
void *par_arena_calloc(par_arena *a, size_t n, size_t align);
par_arena_mark par_arena_get_mark(const par_arena *a);
void par_arena_rewind(par_arena *a, par_arena_mark m);
void par_arena_reset(par_arena *a);    /* keeps the first chunk */
void par_arena_destroy(par_arena *a);

#endif
