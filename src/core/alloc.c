#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/device.h"
#include "core/log.h"

#define HDR 64u /* header size; keeps user blocks 64-byte aligned */

typedef struct {
    size_t size;
    uint32_t tag;
    uint32_t magic;
    uint32_t scope; /* accounting scope slot + 1 (0: none) */
    uint32_t gen;   /* the slot's generation when allocated */
    uint32_t chunk; /* 1: an arena chunk (reserved view only) */
} blk_hdr;

#define MAGIC 0x50415259u /* "PARY" */

static int thp_advise; /* par_alloc_process_init: advise huge pages for big blocks */

int par_alloc_process_init(void)
{
    const char *thp = getenv("PARITY_THP");
    thp_advise = !(thp && !strcmp(thp, "0"));
#ifdef __GLIBC__
    const char *tun = getenv("GLIBC_TUNABLES");
    if (getenv("MALLOC_MMAP_THRESHOLD_") || (tun && strstr(tun, "mmap_threshold")))
        return 0;
    return mallopt(M_MMAP_THRESHOLD, (int)PAR_ALLOC_MMAP_MIN) == 1; /* fixed: no dynamic raise */
#else
    return 0;
#endif
}

static _Atomic int64_t live[PAR_TAG_COUNT];
static _Atomic int64_t peak[PAR_TAG_COUNT];

/* ---- accounting scopes (alloc.h) ---- */

typedef struct {
    _Atomic int open;
    _Atomic uint32_t gen;
    _Atomic int64_t live[PAR_TAG_COUNT], peak[PAR_TAG_COUNT];
    _Atomic int64_t res_live[PAR_TAG_COUNT], res_peak[PAR_TAG_COUNT];
} scope_slot;

static scope_slot scopes[PAR_ALLOC_SCOPES];
static _Thread_local int cur_scope; /* slot + 1, 0: none */

static void bump(_Atomic int64_t *lv, _Atomic int64_t *pk, int64_t delta)
{
    int64_t now = atomic_fetch_add(lv, delta) + delta;
    int64_t p = atomic_load(pk);
    while (now > p && !atomic_compare_exchange_weak(pk, &p, now)) {
    }
}

/* Charges delta bytes of tag to scope id (generation gen; 0: the slot's
 * current one) in the allocated and/or reserved view. */
static void scope_charge(uint32_t id, uint32_t gen, par_tag tag, int64_t delta, int alloc_view, int res_view)
{
    if (id == 0 || id > PAR_ALLOC_SCOPES)
        return;
    scope_slot *sc = &scopes[id - 1];
    if (!atomic_load(&sc->open) || (gen && atomic_load(&sc->gen) != gen))
        return;
    if (alloc_view)
        bump(&sc->live[tag], &sc->peak[tag], delta);
    if (res_view)
        bump(&sc->res_live[tag], &sc->res_peak[tag], delta);
}

int par_alloc_scope_open(void)
{
    for (int i = 0; i < PAR_ALLOC_SCOPES; i++) {
        int closed = 0;
        if (!atomic_compare_exchange_strong(&scopes[i].open, &closed, 2))
            continue;
        scope_slot *sc = &scopes[i];
        atomic_fetch_add(&sc->gen, 1);
        for (int t = 0; t < PAR_TAG_COUNT; t++) {
            atomic_store(&sc->live[t], 0);
            atomic_store(&sc->peak[t], 0);
            atomic_store(&sc->res_live[t], 0);
            atomic_store(&sc->res_peak[t], 0);
        }
        atomic_store(&sc->open, 1);
        cur_scope = i + 1;
        return i + 1;
    }
    return 0;
}

void par_alloc_scope_close(int id)
{
    if (id < 1 || id > PAR_ALLOC_SCOPES)
        return;
    if (cur_scope == id)
        cur_scope = 0;
    atomic_store(&scopes[id - 1].open, 0);
}

int par_alloc_scope_enter(int id)
{
    int prev = cur_scope;
    cur_scope = id >= 1 && id <= PAR_ALLOC_SCOPES ? id : 0;
    return prev;
}

int par_alloc_scope_current(void) { return cur_scope; }

void par_alloc_scope_reset_peaks(int id)
{
    if (id < 1 || id > PAR_ALLOC_SCOPES)
        return;
    scope_slot *sc = &scopes[id - 1];
    for (int t = 0; t < PAR_TAG_COUNT; t++) {
        atomic_store(&sc->peak[t], atomic_load(&sc->live[t]));
        atomic_store(&sc->res_peak[t], atomic_load(&sc->res_live[t]));
    }
}

void par_alloc_scope_stats(int id, par_alloc_stats *out)
{
    memset(out, 0, sizeof *out);
    if (id < 1 || id > PAR_ALLOC_SCOPES || atomic_load(&scopes[id - 1].open) != 1)
        return;
    scope_slot *sc = &scopes[id - 1];
    for (int t = 0; t < PAR_TAG_COUNT; t++) {
        out->live[t] = atomic_load(&sc->live[t]);
        out->peak[t] = atomic_load(&sc->peak[t]);
        out->res_live[t] = atomic_load(&sc->res_live[t]);
        out->res_peak[t] = atomic_load(&sc->res_peak[t]);
    }
}

static const char *tag_names[PAR_TAG_COUNT] = {
    "misc", "tensor", "io", "param", "grad", "optim", "act", "comm", "model", "arena",
};

const char *par_tag_name(par_tag tag)
{
    return (unsigned)tag < PAR_TAG_COUNT ? tag_names[tag] : "?";
}

static void account(par_tag tag, int64_t delta)
{
    int64_t now = atomic_fetch_add(&live[tag], delta) + delta;
    int64_t p = atomic_load(&peak[tag]);
    while (now > p && !atomic_compare_exchange_weak(&peak[tag], &p, now)) {
    }
}

int par_alloc_thp(void) { return thp_advise; }

/* Asks the kernel for transparent huge pages on the whole pages inside a
 * block of PAR_ALLOC_THP_MIN bytes or more (only where THP is "madvise";
 * "always" needs no advice, "never" ignores it).  Failure is harmless. */
static void advise_huge(void *raw, size_t n)
{
#ifdef MADV_HUGEPAGE
    if (!thp_advise || n < PAR_ALLOC_THP_MIN)
        return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)raw + pg - 1) & ~(pg - 1), hi = ((uintptr_t)raw + n) & ~(pg - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)raw;
    (void)n;
#endif
}

static void *alloc_block(size_t n, par_tag tag, int chunk)
{
    if ((unsigned)tag >= PAR_TAG_COUNT)
        tag = PAR_TAG_MISC;
    if (n > SIZE_MAX - HDR)
        return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, HDR, HDR + n) != 0)
        return NULL;
    advise_huge(raw, HDR + n);
    blk_hdr *h = raw;
    h->size = n;
    h->tag = tag;
    h->magic = MAGIC;
    h->chunk = (uint32_t)chunk;
    h->scope = (uint32_t)cur_scope;
    h->gen = cur_scope ? atomic_load(&scopes[cur_scope - 1].gen) : 0;
    account(tag, (int64_t)n);
    par__dev_register((char *)raw + HDR, n); /* GPU mode: known to core/device.h */
    scope_charge(h->scope, h->gen, tag, (int64_t)n, !chunk, 1);
    return (char *)raw + HDR;
}

void *par_malloc(size_t n, par_tag tag) { return alloc_block(n, tag, 0); }

void *par_calloc(size_t count, size_t size, par_tag tag)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = par_malloc(count * size, tag);
    if (p)
        memset(p, 0, count * size);
    return p;
}

static blk_hdr *hdr_of(void *p)
{
    blk_hdr *h = (blk_hdr *)((char *)p - HDR);
    if (h->magic != MAGIC) {
        PAR_LOG_E("par_free/realloc: %p was not allocated by par_malloc (or freed twice)", p);
        abort();
    }
    return h;
}

void par_free(void *p)
{
    if (!p)
        return;
    blk_hdr *h = hdr_of(p);
    par__dev_unregister(p);
    account((par_tag)h->tag, -(int64_t)h->size);
    scope_charge(h->scope, h->gen, (par_tag)h->tag, -(int64_t)h->size, !h->chunk, 1);
    h->magic = 0;
    free(h);
}

void *par_realloc(void *p, size_t n, par_tag tag)
{
    if (!p)
        return par_malloc(n, tag);
    blk_hdr *h = hdr_of(p);
    void *q = par_malloc(n, (par_tag)h->tag);
    if (!q)
        return NULL;
    par_dev_host_read(p, h->size < n ? h->size : n);
    memcpy(q, p, h->size < n ? h->size : n);
    par_free(p);
    return q;
}

char *par_strdup(const char *s, par_tag tag)
{
    size_t n = strlen(s) + 1;
    char *d = par_malloc(n, tag);
    if (d)
        memcpy(d, s, n);
    return d;
}

int64_t par_alloc_live(par_tag tag) { return atomic_load(&live[tag]); }
int64_t par_alloc_peak(par_tag tag) { return atomic_load(&peak[tag]); }

int64_t par_alloc_live_total(void)
{
    int64_t t = 0;
    for (int i = 0; i < PAR_TAG_COUNT; i++)
        t += atomic_load(&live[i]);
    return t;
}

void par_alloc_reset_peaks(void)
{
    for (int i = 0; i < PAR_TAG_COUNT; i++)
        atomic_store(&peak[i], atomic_load(&live[i]));
}

void par_alloc_report(int level)
{
    for (int i = 0; i < PAR_TAG_COUNT; i++)
        par_log((par_log_level)level, "alloc %-6s live %lld bytes, peak %lld bytes", tag_names[i],
                (long long)atomic_load(&live[i]), (long long)atomic_load(&peak[i]));
}

/* ---- arenas ---- */

struct par_arena_chunk {
    par_arena_chunk *next; /* older chunk */
    size_t cap;
    size_t off;
    /* data follows, 64-byte aligned by par_malloc + header rounding */
};

#define CHUNK_HDR ((sizeof(par_arena_chunk) + 63u) & ~(size_t)63u)

static char *chunk_data(par_arena_chunk *c) { return (char *)c + CHUNK_HDR; }

void par_arena_init(par_arena *a, size_t chunk_size, par_tag tag)
{
    a->head = NULL;
    a->chunk_size = chunk_size ? chunk_size : (1u << 20);
    a->tag = tag;
    a->used = 0;
}

void *par_arena_alloc(par_arena *a, size_t n, size_t align)
{
    if (!align)
        align = 16;
    par_arena_chunk *c = a->head;
    if (c) {
        size_t off = (c->off + align - 1) & ~(align - 1);
        if (off <= c->cap && n <= c->cap - off) {
            c->off = off + n;
            a->used += n;
            scope_charge((uint32_t)cur_scope, 0, a->tag, (int64_t)n, 1, 0);
            return chunk_data(c) + off;
        }
    }
    size_t cap = a->chunk_size;
    if (n + align > cap)
        cap = n + align;
    if (cap > SIZE_MAX - CHUNK_HDR)
        return NULL;
    par_arena_chunk *nc = alloc_block(CHUNK_HDR + cap, a->tag, 1);
    if (!nc)
        return NULL;
    nc->next = c;
    nc->cap = cap;
    nc->off = n;
    a->head = nc;
    a->used += n;
    scope_charge((uint32_t)cur_scope, 0, a->tag, (int64_t)n, 1, 0);
    return chunk_data(nc);
}

void *par_arena_calloc(par_arena *a, size_t n, size_t align)
{
    void *p = par_arena_alloc(a, n, align);
    if (p)
        par_dev_zero(p, n); /* memset, on the device when the chunk lives there */
    return p;
}

par_arena_mark par_arena_get_mark(const par_arena *a)
{
    par_arena_mark m = {a->head, a->head ? a->head->off : 0, a->used};
    return m;
}

void par_arena_rewind(par_arena *a, par_arena_mark m)
{
    while (a->head && a->head != m.chunk) {
        par_arena_chunk *next = a->head->next;
        par_free(a->head);
        a->head = next;
    }
    if (a->head)
        a->head->off = m.off;
    scope_charge((uint32_t)cur_scope, 0, a->tag, (int64_t)m.used - (int64_t)a->used, 1, 0);
    a->used = m.used;
}

void par_arena_reset(par_arena *a)
{
    while (a->head && a->head->next) {
        par_arena_chunk *next = a->head->next;
        par_free(a->head);
        a->head = next;
    }
    if (a->head)
        a->head->off = 0;
    scope_charge((uint32_t)cur_scope, 0, a->tag, -(int64_t)a->used, 1, 0);
    a->used = 0;
}

void par_arena_destroy(par_arena *a)
{
    while (a->head) {
        par_arena_chunk *next = a->head->next;
        par_free(a->head);
        a->head = next;
    }
    scope_charge((uint32_t)cur_scope, 0, a->tag, -(int64_t)a->used, 1, 0);
    a->used = 0;
}
