#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/log.h"

#define HDR 64u /* header size; keeps user blocks 64-byte aligned */

typedef struct {
    size_t size;
    uint32_t tag;
    uint32_t magic;
} blk_hdr;

#define MAGIC 0x50415259u /* "PARY" */

static _Atomic int64_t live[PAR_TAG_COUNT];
static _Atomic int64_t peak[PAR_TAG_COUNT];

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

void *par_malloc(size_t n, par_tag tag)
{
    if ((unsigned)tag >= PAR_TAG_COUNT)
        tag = PAR_TAG_MISC;
    if (n > SIZE_MAX - HDR)
        return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, HDR, HDR + n) != 0)
        return NULL;
    blk_hdr *h = raw;
    h->size = n;
    h->tag = tag;
    h->magic = MAGIC;
    account(tag, (int64_t)n);
    par__dev_register((char *)raw + HDR, n); /* GPU mode: known to core/device.h */
    return (char *)raw + HDR;
}

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
            return chunk_data(c) + off;
        }
    }
    size_t cap = a->chunk_size;
    if (n + align > cap)
        cap = n + align;
    par_arena_chunk *nc = par_malloc(CHUNK_HDR + cap, a->tag);
    if (!nc)
        return NULL;
    nc->next = c;
    nc->cap = cap;
    nc->off = n;
    a->head = nc;
    a->used += n;
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
    a->used = 0;
}

void par_arena_destroy(par_arena *a)
{
    while (a->head) {
        par_arena_chunk *next = a->head->next;
        par_free(a->head);
        a->head = next;
    }
    a->used = 0;
}
