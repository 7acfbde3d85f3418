/* core/device.c - the residency state machine of core/device.h.
 *
 * Blocks are kept in an array sorted by host address (and those with a
 * device twin in a second one sorted by device address); each block holds a
 * sorted list of segments covering [0, n), each in one state.  One mutex
 * guards everything, transfers included (ranks that are threads of one
 * process share the device).  The registry's own memory comes from malloc,
 * never from par_malloc (which calls in here).
 */
#include "core/device.h"

#include <string.h>

par_status par_dev_parse(const char *name, par_device_kind *kind)
{
    if (name && strcmp(name, "cpu") == 0) {
        *kind = PAR_DEV_CPU;
        return PAR_OK;
    }
    if (name && strcmp(name, "gpu") == 0) {
        *kind = PAR_DEV_GPU;
        return PAR_OK;
    }
    return par_err(PAR_EINVAL, "--device '%s': the choices are cpu and gpu", name ? name : "");
}

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD

#include <execinfo.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/log.h"

enum { ST_HOST = 0, ST_DEV = 1, ST_BOTH = 2 };
/* OP_LEAVE_HOST: a rank leaves host mode (HOST and BOTH pieces become
 * host-owned, DEV pieces stay) */
typedef enum { OP_IN, OP_OUT, OP_INOUT, OP_HREAD, OP_HWRITE, OP_HSET, OP_ZERO, OP_LEAVE_HOST } dev_op;

typedef struct {
    size_t off, len;
    int st;
} seg;

typedef struct {
    char *host;
    size_t n;
    char *dev;      /* twin, or NULL until a kernel needs one */
    size_t dev_cap; /* bytes of the twin (>= n) */
    seg *segs;
    int nseg, cap;
    int scope;      /* the allocator scope that made it (core/alloc.h: a rank) */
    int keep;       /* par_dev_keep: mode changes leave it alone */
} blk;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_gpu;       /* GPU mode (real or emulated) */
static int g_real;      /* kernels run on a real device */
static int g_devnum;    /* the OpenMP device number (real) */
static int g_hostnum;   /* omp_get_initial_device() */
static char g_desc[128] = "cpu";
static blk **g_host;    /* [g_nh] sorted by host */
static int g_nh, g_caph;
static blk **g_dev;     /* [g_nd] sorted by dev */
static int g_nd, g_capd;
static seg *g_scratch;  /* set_range's output list */
static int g_scap;
static par_dev_stats g_st;
static int64_t g_dev_live;
/* per allocator scope: PAR_DEV_MODE_HOST or _DEVICE (par_dev_mode_set); read
 * without the lock, written only by the scope's own rank */
static unsigned char g_mode[PAR_ALLOC_SCOPES + 1];

static int host_mode(void)
{
    if (!g_gpu)
        return 0;
    int sc = par_alloc_scope_current();
    return sc >= 0 && sc <= PAR_ALLOC_SCOPES && g_mode[sc] == PAR_DEV_MODE_HOST;
}

/* ------------------------------------------------------------ failure -- */

/* A kernel operand outside every known block, or a range past a block's end:
 * a programming error of the caller (like a bad par_free), never input. */
static void die(const char *what, const void *p, size_t bytes)
{
    PAR_LOG_E("par_dev: %s: %p (+%zu bytes); docs/gpu.md \"Annotating host code\"", what, p, bytes);
    void *frames[32];
    int n = backtrace(frames, 32);
    backtrace_symbols_fd(frames, n, 2);
    abort();
}

/* ------------------------------------------------------- device memory -- */

/* The poison of a stale copy: bytes FF FF F8 7F repeated from the block's
 * start (a NaN as f32 and f64, about 2.1e9 as int32). */
static const unsigned char g_pat[64] = {
#define P4 0xFF, 0xFF, 0xF8, 0x7F
    P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, P4
#undef P4
};

static void poison(char *p, size_t off, size_t len)
{
    size_t i = 0;
    for (; i < len && ((off + i) & 63); i++)
        p[off + i] = (char)g_pat[(off + i) & 3];
    for (; i + 64 <= len; i += 64)
        memcpy(p + off + i, g_pat, 64);
    for (; i < len; i++)
        p[off + i] = (char)g_pat[(off + i) & 3];
}

/* The first byte of [off, off + len) of p that is not poison, or len. */
static size_t unpoisoned(const char *p, size_t off, size_t len)
{
    size_t i = 0;
    for (; i < len && ((off + i) & 63); i++)
        if ((unsigned char)p[off + i] != g_pat[(off + i) & 3])
            return i;
    for (; i + 64 <= len; i += 64)
        if (memcmp(p + off + i, g_pat, 64) != 0)
            break;
    for (; i < len; i++)
        if ((unsigned char)p[off + i] != g_pat[(off + i) & 3])
            return i;
    return len;
}

/* Twin cache of the real runtime: freed twins by power-of-two size class,
 * reused before omp_target_alloc (cuMemAlloc/cuMemFree are slow and
 * synchronising).  At most CACHE_MAX bytes parked. */
#define N_CLASS 48
#define CACHE_MAX ((size_t)1 << 30)
typedef struct cached {
    struct cached *next;
    void *dev;
} cached;
static cached *g_cache[N_CLASS];
static size_t g_cached;

static int size_class(size_t n, size_t *cap)
{
    int c = 8; /* 256 bytes */
    while (((size_t)1 << c) < n && c < N_CLASS - 1)
        c++;
    *cap = (size_t)1 << c;
    return c;
}

static char *twin_alloc(size_t n, size_t *cap)
{
    if (!g_real) {
        *cap = n ? n : 64;
        char *d = NULL;
        if (posix_memalign((void **)&d, 64, *cap) != 0)
            return NULL;
        poison(d, 0, *cap);
        return d;
    }
    int c = size_class(n, cap);
    if (g_cache[c]) {
        cached *e = g_cache[c];
        g_cache[c] = e->next;
        g_cached -= *cap;
        char *d = e->dev;
        free(e);
        return d;
    }
    return omp_target_alloc(*cap, g_devnum);
}

static void twin_free(char *d, size_t cap)
{
    if (!g_real) {
        free(d);
        return;
    }
    size_t c2;
    int c = size_class(cap, &c2);
    cached *e = c2 == cap && g_cached + cap <= CACHE_MAX ? malloc(sizeof *e) : NULL;
    if (!e) {
        omp_target_free(d, g_devnum);
        return;
    }
    e->dev = d;
    e->next = g_cache[c];
    g_cache[c] = e;
    g_cached += cap;
}

static void h2d(blk *b, size_t off, size_t len)
{
    if (g_real)
        omp_target_memcpy(b->dev, b->host, len, off, off, g_devnum, g_hostnum);
    else
        memcpy(b->dev + off, b->host + off, len);
    g_st.h2d_bytes += (int64_t)len;
    g_st.h2d_calls++;
}

static void d2h(blk *b, size_t off, size_t len)
{
    if (g_real)
        omp_target_memcpy(b->host, b->dev, len, off, off, g_hostnum, g_devnum);
    else
        memcpy(b->host + off, b->dev + off, len);
    g_st.d2h_bytes += (int64_t)len;
    g_st.d2h_calls++;
}

/* memset 0 of device bytes [d, d + len). */
static void dev_zero(char *d, size_t len)
{
    if (!g_real) {
        memset(d, 0, len);
        return;
    }
    size_t nw = len / 8, tail = len % 8;
    uint64_t *w = (uint64_t *)(void *)d;
    if ((uintptr_t)d % 8 != 0) {
        nw = 0;
        tail = len;
    }
    char *t = d + nw * 8;
#pragma omp target teams distribute parallel for is_device_ptr(w) device(g_devnum)
    for (size_t i = 0; i < nw; i++)
        w[i] = 0;
    if (tail) {
#pragma omp target teams distribute parallel for is_device_ptr(t) device(g_devnum)
        for (size_t i = 0; i < tail; i++)
            t[i] = 0;
    }
}

/* ------------------------------------------------------------ registry -- */

/* Index of the last entry of arr (sorted by key) whose key <= p, or -1. */
static int find_le(blk **arr, int n, const char *p, int by_dev)
{
    int lo = 0, hi = n - 1, r = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const char *k = by_dev ? arr[mid]->dev : arr[mid]->host;
        if (k <= p) {
            r = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return r;
}

static int insert_sorted(blk ***arr, int *n, int *cap, blk *b, int by_dev)
{
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        blk **na = realloc(*arr, (size_t)nc * sizeof *na);
        if (!na)
            return -1;
        *arr = na;
        *cap = nc;
    }
    int i = find_le(*arr, *n, by_dev ? b->dev : b->host, by_dev) + 1;
    memmove(*arr + i + 1, *arr + i, (size_t)(*n - i) * sizeof **arr);
    (*arr)[i] = b;
    (*n)++;
    return 0;
}

static void remove_at(blk **arr, int *n, int i)
{
    memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof *arr);
    (*n)--;
}

/* The block holding host address p (*is_dev = 0) or device address p
 * (*is_dev = 1), or NULL. */
static blk *lookup(const void *p, int *is_dev)
{
    const char *c = p;
    int i = find_le(g_host, g_nh, c, 0);
    if (i >= 0 && c < g_host[i]->host + (g_host[i]->n ? g_host[i]->n : 1)) {
        *is_dev = 0;
        return g_host[i];
    }
    i = find_le(g_dev, g_nd, c, 1);
    if (i >= 0 && c < g_dev[i]->dev + g_dev[i]->dev_cap) {
        *is_dev = 1;
        return g_dev[i];
    }
    return NULL;
}

void par__dev_register(void *p, size_t n)
{
    if (!g_gpu || !p)
        return;
    blk *b = calloc(1, sizeof *b);
    seg *s = b ? malloc(4 * sizeof *s) : NULL;
    if (!s) {
        free(b);
        die("no memory for the residency registry", p, n);
    }
    b->host = p;
    b->n = n;
    b->segs = s;
    b->cap = 4;
    b->nseg = 1;
    b->scope = par_alloc_scope_current();
    s[0].off = 0;
    s[0].len = n;
    s[0].st = ST_HOST;
    pthread_mutex_lock(&g_mu);
    if (insert_sorted(&g_host, &g_nh, &g_caph, b, 0))
        die("no memory for the residency registry", p, n);
    pthread_mutex_unlock(&g_mu);
}

void par__dev_unregister(void *p)
{
    if (!g_gpu || !p)
        return;
    pthread_mutex_lock(&g_mu);
    int i = find_le(g_host, g_nh, p, 0);
    if (i >= 0 && g_host[i]->host == p) {
        blk *b = g_host[i];
        remove_at(g_host, &g_nh, i);
        if (b->dev) {
            int j = find_le(g_dev, g_nd, b->dev, 1);
            if (j >= 0 && g_dev[j] == b)
                remove_at(g_dev, &g_nd, j);
            twin_free(b->dev, b->dev_cap);
            g_dev_live -= (int64_t)b->dev_cap;
        }
        free(b->segs);
        free(b);
    }
    pthread_mutex_unlock(&g_mu);
}

static void ensure_twin(blk *b)
{
    if (b->dev)
        return;
    b->dev = twin_alloc(b->n, &b->dev_cap);
    if (!b->dev || insert_sorted(&g_dev, &g_nd, &g_capd, b, 1))
        die("out of device memory for a twin", b->host, b->n);
    g_st.twins++;
    g_dev_live += (int64_t)b->dev_cap;
    if (g_dev_live > g_st.twin_bytes_peak)
        g_st.twin_bytes_peak = g_dev_live;
}

/* ------------------------------------------------------------ segments -- */

/* The state of piece [off, off + len) after op, moving what is stale. */
static int transit(blk *b, size_t off, size_t len, int st, dev_op op)
{
    switch (op) {
    case OP_IN:
        if (st == ST_HOST) {
            h2d(b, off, len);
            return ST_BOTH;
        }
        return st;
    case OP_OUT:
    case OP_ZERO: /* the bytes were written on the device by the caller */
        if (st != ST_DEV && !g_real)
            poison(b->host, off, len);
        return ST_DEV;
    case OP_INOUT:
        if (st == ST_HOST)
            h2d(b, off, len);
        if (st != ST_DEV && !g_real)
            poison(b->host, off, len);
        return ST_DEV;
    case OP_HREAD:
        if (st == ST_DEV) {
            d2h(b, off, len);
            return ST_BOTH;
        }
        return st;
    case OP_LEAVE_HOST:
        if (st == ST_DEV)
            return ST_DEV; /* written on the device by the comm layer: host code did not touch it */
        if (st == ST_BOTH && !g_real) /* host code may have written it */
            poison(b->dev, off, len);
        return ST_HOST;
    case OP_HWRITE:
    case OP_HSET:
        if (st == ST_DEV && op == OP_HWRITE)
            d2h(b, off, len);
        if (st != ST_HOST && !g_real)
            poison(b->dev, off, len);
        return ST_HOST;
    }
    return st;
}

/* Emulation only: the copy that is not current must still be poison, and
 * BOTH copies must agree; anything else is host code that wrote memory
 * without saying so (par_dev_host_write / _set) - found at the next use. */
static void check_piece(const blk *b, size_t off, size_t len, int st, dev_op op)
{
    /* set: whatever the host wrote is the new content; write (rmw) pulls
     * only DEV pieces, so only there an earlier host write would be lost */
    if (op == OP_HSET || ((op == OP_HWRITE || op == OP_LEAVE_HOST) && st != ST_DEV))
        return;
    /* out / zero overwrite the device copy: an earlier host write to a BOTH
     * piece is lost on a real device too (and meant nothing) */
    if ((op == OP_OUT || op == OP_ZERO) && st == ST_BOTH)
        return;
    const char *stale = st == ST_DEV ? b->host : st == ST_HOST ? b->dev : NULL;
    if (st == ST_BOTH) {
        if (memcmp(b->host + off, b->dev + off, len) != 0)
            die("host code wrote memory current on both sides without par_dev_host_write",
                b->host + off, len);
        return;
    }
    if (!stale)
        return;
    size_t i = unpoisoned(stale, off, len);
    if (i < len)
        die(st == ST_DEV ? "host code wrote device-owned memory without par_dev_host_write"
                         : "device memory of a host-owned range was written",
            b->host + off + i, len - i);
}

static void push_seg(int *n, size_t off, size_t len, int st)
{
    if (!len)
        return;
    if (*n > 0 && g_scratch[*n - 1].st == st && g_scratch[*n - 1].off + g_scratch[*n - 1].len == off) {
        g_scratch[*n - 1].len += len;
        return;
    }
    g_scratch[(*n)++] = (seg){off, len, st};
}

/* Applies op to [off, off + len) of b (0 < len, off + len <= b->n). */
static void set_range(blk *b, size_t off, size_t len, dev_op op)
{
    int need = b->nseg + 2;
    if (need > g_scap) {
        seg *ns = realloc(g_scratch, (size_t)need * 2 * sizeof *ns);
        if (!ns)
            die("no memory for the residency registry", b->host, b->n);
        g_scratch = ns;
        g_scap = need * 2;
    }
    size_t end = off + len;
    int n = 0;
    for (int i = 0; i < b->nseg; i++) {
        seg s = b->segs[i];
        size_t s_end = s.off + s.len;
        if (s_end <= off || s.off >= end) {
            push_seg(&n, s.off, s.len, s.st);
            continue;
        }
        size_t a = s.off > off ? s.off : off, z = s_end < end ? s_end : end;
        if (!g_real)
            check_piece(b, a, z - a, s.st, op);
        push_seg(&n, s.off, a - s.off, s.st);
        push_seg(&n, a, z - a, transit(b, a, z - a, s.st, op));
        push_seg(&n, z, s_end - z, s.st);
    }
    if (n > b->cap) {
        seg *ns = realloc(b->segs, (size_t)n * 2 * sizeof *ns);
        if (!ns)
            die("no memory for the residency registry", b->host, b->n);
        b->segs = ns;
        b->cap = n * 2;
    }
    memcpy(b->segs, g_scratch, (size_t)n * sizeof *g_scratch);
    b->nseg = n;
}

/* ------------------------------------------------------------- the API -- */

/* Kernel operand [p, p + bytes): the device address after op. */
static void host_op(const void *p, size_t bytes, dev_op op);

/* Host mode: a kernel's operand is host memory after the host's transition
 * (in: read, out / zero: set, inout: write). */
static void *host_kernel_op(const void *p, size_t bytes, dev_op op)
{
    host_op(p, bytes, op == OP_IN ? OP_HREAD : op == OP_INOUT ? OP_HWRITE : OP_HSET);
    if (op == OP_ZERO && bytes)
        memset((void *)(uintptr_t)p, 0, bytes);
    return (void *)(uintptr_t)p;
}

static void *kernel_op(const void *p, size_t bytes, dev_op op)
{
    if (!g_gpu || !p)
        return (void *)(uintptr_t)p;
    if (host_mode())
        return host_kernel_op(p, bytes, op);
    pthread_mutex_lock(&g_mu);
    int is_dev;
    blk *b = lookup(p, &is_dev);
    if (!b)
        die("a kernel operand that is not par_malloc memory", p, bytes);
    size_t off = (size_t)((const char *)p - (is_dev ? b->dev : b->host));
    if (off + bytes > b->n)
        die("a kernel operand past the end of its block", p, bytes);
    ensure_twin(b);
    if (bytes) {
        set_range(b, off, bytes, op);
        if (op == OP_ZERO)
            dev_zero(b->dev + off, bytes);
    }
    void *d = b->dev + off;
    pthread_mutex_unlock(&g_mu);
    return d;
}

void *par_dev_in(const void *p, size_t bytes) { return kernel_op(p, bytes, OP_IN); }
void *par_dev_out(void *p, size_t bytes) { return kernel_op(p, bytes, OP_OUT); }
void *par_dev_inout(void *p, size_t bytes) { return kernel_op(p, bytes, OP_INOUT); }

/* Host access; unknown memory is plain host memory. */
static void host_op(const void *p, size_t bytes, dev_op op)
{
    if (!g_gpu || !p || !bytes)
        return;
    pthread_mutex_lock(&g_mu);
    int is_dev;
    blk *b = lookup(p, &is_dev);
    if (b && is_dev)
        die("host code given a device address", p, bytes);
    if (b && b->dev) {
        size_t off = (size_t)((const char *)p - b->host);
        if (off + bytes > b->n)
            die("a host access past the end of its block", p, bytes);
        set_range(b, off, bytes, op);
    }
    pthread_mutex_unlock(&g_mu);
}

void par_dev_host_read(const void *p, size_t bytes) { host_op(p, bytes, OP_HREAD); }
void par_dev_host_write(void *p, size_t bytes) { host_op(p, bytes, OP_HWRITE); }
void par_dev_host_set(void *p, size_t bytes) { host_op(p, bytes, OP_HSET); }

void par_dev_zero(void *p, size_t bytes)
{
    if (!bytes)
        return;
    int known = 0;
    if (g_gpu) {
        pthread_mutex_lock(&g_mu);
        int is_dev;
        blk *b = lookup(p, &is_dev);
        known = b && (b->dev || is_dev);
        pthread_mutex_unlock(&g_mu);
    }
    if (known || host_mode())
        kernel_op(p, bytes, OP_ZERO);
    else
        memset(p, 0, bytes); /* host memory, or a block no kernel has used yet */
}

void par_dev_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    int on_dev = 0;
    if (g_gpu) {
        pthread_mutex_lock(&g_mu);
        int di, si;
        blk *bd = lookup(dst, &di), *bs = lookup(src, &si);
        on_dev = bd && bs && (bd->dev || di) && (bs->dev || si);
        pthread_mutex_unlock(&g_mu);
    }
    if (!on_dev || host_mode()) {
        par_dev_host_read(src, bytes);
        par_dev_host_set(dst, bytes);
        memmove(dst, src, bytes);
        return;
    }
    const char *s = par_dev_in(src, bytes);
    char *d = par_dev_out(dst, bytes);
    if (g_real)
        omp_target_memcpy(d, s, bytes, 0, 0, g_devnum, g_devnum);
    else
        memmove(d, s, bytes);
    pthread_mutex_lock(&g_mu);
    g_st.d2d_bytes += (int64_t)bytes;
    pthread_mutex_unlock(&g_mu);
}

/* Under g_mu: 1 when every byte of [off, off + len) of b is current on the
 * device and trusted there: DEV, or BOTH in a kept block (host code
 * announces its writes there; a BOTH piece of another block may have been
 * written by a rank in host mode unannounced). */
static int on_device(const blk *b, size_t off, size_t len)
{
    if (!b->dev)
        return 0;
    for (int i = 0; i < b->nseg; i++) {
        const seg *s = &b->segs[i];
        if (s->off < off + len && s->off + s->len > off &&
            (s->st == ST_HOST || (s->st == ST_BOTH && !b->keep)))
            return 0;
    }
    return 1;
}

/* Under g_mu: the block holding host range [p, p + bytes), or NULL (host
 * memory this module does not know, or a device address). */
static blk *host_block(const void *p, size_t bytes)
{
    int is_dev;
    blk *b = lookup(p, &is_dev);
    if (!b || is_dev)
        return NULL;
    if ((size_t)((const char *)p - b->host) + bytes > b->n)
        die("a comm copy past the end of its block", p, bytes);
    return b;
}

void par_dev_comm_copy(void *dst, const void *src, size_t bytes)
{
    if (!g_gpu || !bytes) {
        if (bytes)
            memcpy(dst, src, bytes);
        return;
    }
    pthread_mutex_lock(&g_mu);
    blk *bs = host_block(src, bytes), *bd = host_block(dst, bytes);
    size_t so = bs ? (size_t)((const char *)src - bs->host) : 0;
    size_t dof = bd ? (size_t)((char *)dst - bd->host) : 0;
    if (bs && bd && bd->dev && on_device(bs, so, bytes)) {
        set_range(bs, so, bytes, OP_IN); /* nothing moves: it is there */
        set_range(bd, dof, bytes, OP_OUT);
        if (g_real)
            omp_target_memcpy(bd->dev + dof, bs->dev + so, bytes, 0, 0, g_devnum, g_devnum);
        else
            memcpy(bd->dev + dof, bs->dev + so, bytes);
        g_st.d2d_bytes += (int64_t)bytes;
        g_st.comm_d2d_bytes += (int64_t)bytes;
        g_st.comm_d2d_calls++;
        pthread_mutex_unlock(&g_mu);
        return;
    }
    if (bs && bs->dev)
        set_range(bs, so, bytes, OP_HREAD);
    if (bd && bd->dev)
        set_range(bd, dof, bytes, OP_HSET);
    g_st.comm_host_bytes += (int64_t)bytes;
    pthread_mutex_unlock(&g_mu);
    memcpy(dst, src, bytes); /* both ranges are this copy's alone: outside the lock */
}

void par_dev_keep(void *p)
{
    if (!g_gpu || !p)
        return;
    pthread_mutex_lock(&g_mu);
    int is_dev;
    blk *b = lookup(p, &is_dev);
    if (!b || is_dev || b->host != p)
        die("par_dev_keep of an address that does not start a par_malloc block", p, 0);
    ensure_twin(b);
    b->keep = 1;
    pthread_mutex_unlock(&g_mu);
}

int par_dev_resident(const void *p, size_t bytes)
{
    if (!g_gpu || !p || !bytes)
        return 0;
    pthread_mutex_lock(&g_mu);
    const blk *b = host_block(p, bytes);
    int r = b && on_device(b, (size_t)((const char *)p - b->host), bytes);
    pthread_mutex_unlock(&g_mu);
    return r;
}

void par_dev_push(void *p, size_t bytes)
{
    if (!g_gpu || !p || !bytes)
        return;
    pthread_mutex_lock(&g_mu);
    blk *b = host_block(p, bytes);
    if (!b || !b->keep)
        die("par_dev_push of memory outside a kept block", p, bytes);
    set_range(b, (size_t)((char *)p - b->host), bytes, OP_IN);
    pthread_mutex_unlock(&g_mu);
}

/* ------------------------------------------------ rank-order row sums -- */

/* out[e] = rows[0][e] op ... op rows[p-1][e] on the twins (device dev when
 * real, else the host fallback on the emulation's twins); one thread per
 * element, its rows in order: the host loop's operations.  NAN(x): x is a
 * NaN (floats; 0 for integers); U: the type of the addition (integers wrap
 * as unsigned). */
#define ROWS_OP(NAME, T, U, NAN)                                                                    \
    static void NAME(T *o, const T *r, size_t p, size_t n, int max, int dev, int real)           \
    {                                                                                               \
        _Pragma("omp target teams distribute parallel for is_device_ptr(o, r) device(dev) if(real)") \
        for (size_t e = 0; e < n; e++) {                                                            \
            T acc = r[e];                                                                           \
            for (size_t j = 1; j < p; j++) {                                                        \
                const T x = r[j * n + e];                                                           \
                if (!max)                                                                           \
                    acc = (T)((U)acc + (U)x);                                                       \
                else if (x > acc || NAN(x))                                                         \
                    acc = x;                                                                        \
            }                                                                                       \
            o[e] = acc;                                                                             \
        }                                                                                           \
    }
#define FLOAT_NAN(x) ((x) != (x))
#define INT_NAN(x) 0
ROWS_OP(rows_f64, double, double, FLOAT_NAN)
ROWS_OP(rows_f32, float, float, FLOAT_NAN)
ROWS_OP(rows_i32, int32_t, uint32_t, INT_NAN)
ROWS_OP(rows_i64, int64_t, uint64_t, INT_NAN)
ROWS_OP(rows_u8, uint8_t, uint8_t, INT_NAN)

static size_t kind_size(int kind)
{
    static const size_t es[] = {8, 4, 4, 8, 1};
    return kind >= 0 && kind <= PAR_DEV_U8 ? es[kind] : 1;
}

static void rows_run(void *o, const void *r, size_t p, size_t n, int kind, int max)
{
    switch (kind) {
    case PAR_DEV_F64: rows_f64(o, r, p, n, max, g_devnum, g_real); break;
    case PAR_DEV_F32: rows_f32(o, r, p, n, max, g_devnum, g_real); break;
    case PAR_DEV_I32: rows_i32(o, r, p, n, max, g_devnum, g_real); break;
    case PAR_DEV_I64: rows_i64(o, r, p, n, max, g_devnum, g_real); break;
    default: rows_u8(o, r, p, n, max, g_devnum, g_real); break;
    }
}

int par_dev_reduce_rows(void *out, const void *rows, size_t p, size_t n, int kind, int max)
{
    const size_t ob = n * kind_size(kind), rb = p * ob;
    if (!g_gpu || !ob || !p)
        return 0;
    pthread_mutex_lock(&g_mu);
    blk *br = host_block(rows, rb), *bo = host_block(out, ob);
    const size_t ro = br ? (size_t)((const char *)rows - br->host) : 0;
    const size_t oo = bo ? (size_t)((char *)out - bo->host) : 0;
    const int dev = br && bo && bo->keep && on_device(br, ro, rb);
    if (dev) {
        ensure_twin(bo);
        set_range(br, ro, rb, OP_IN); /* nothing moves: it is there */
        set_range(bo, oo, ob, OP_OUT);
    } else {
        if (br && br->dev)
            set_range(br, ro, rb, OP_HREAD);
        if (bo && bo->dev)
            set_range(bo, oo, ob, OP_HSET);
    }
    char *dr = dev ? br->dev + ro : NULL, *dout = dev ? bo->dev + oo : NULL;
    pthread_mutex_unlock(&g_mu);
    if (dev) /* outside the lock: the twins' ranges are this rank's until its next exchange */
        rows_run(dout, dr, p, n, kind, max);
    return dev;
}

static void all_blocks(dev_op op)
{
    if (!g_gpu)
        return;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nh; i++)
        if (g_host[i]->dev && g_host[i]->n)
            set_range(g_host[i], 0, g_host[i]->n, op);
    pthread_mutex_unlock(&g_mu);
}

void par_dev_sync_host(void) { all_blocks(OP_HREAD); }
void par_dev_host_all(void) { all_blocks(OP_HWRITE); }

/* ---------------------------------------------------------------- mode -- */

int par_dev_gpu(void) { return g_gpu; }
int par_dev_real(void) { return g_real && !host_mode(); }
int par_dev_device_mode(void) { return g_gpu && !host_mode(); }

int par_dev_mode_set(int mode)
{
    int sc = par_alloc_scope_current();
    if (!g_gpu || sc < 0 || sc > PAR_ALLOC_SCOPES)
        return PAR_DEV_MODE_DEVICE;
    int prev = g_mode[sc];
    mode = mode == PAR_DEV_MODE_HOST ? PAR_DEV_MODE_HOST : PAR_DEV_MODE_DEVICE;
    if (mode == prev)
        return prev;
    /* both ways the scope's blocks end host-owned: entering host mode pulls
     * what is current only on the device (host code may then write any byte:
     * a BOTH piece would go stale on the device unseen); entering device
     * mode finds them so (and makes sure of it), but for the bytes the comm
     * layer wrote on the device meanwhile (par_dev_comm_copy: still DEV, and
     * the emulation checks that host code left them alone) */
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nh; i++) {
        blk *b = g_host[i];
        if (b->scope == sc && b->dev && b->n && !b->keep)
            set_range(b, 0, b->n, mode == PAR_DEV_MODE_HOST ? OP_HWRITE : OP_LEAVE_HOST);
    }
    pthread_mutex_unlock(&g_mu);
    g_mode[sc] = (unsigned char)mode;
    return prev;
}
const char *par_dev_describe(void) { return g_desc; }

void par_dev_get_stats(par_dev_stats *out)
{
    pthread_mutex_lock(&g_mu);
    *out = g_st;
    pthread_mutex_unlock(&g_mu);
}

par_status par_dev_init(par_device_kind kind, int local_rank)
{
    if (kind == PAR_DEV_CPU) {
        if (g_gpu)
            return par_err(PAR_EINVAL, "--device cpu: this process is already in GPU mode");
        return PAR_OK;
    }
    if (g_gpu)
        return PAR_OK;
    const char *emu = getenv("PARITY_GPU_EMULATE");
    int ndev = omp_get_num_devices();
    g_hostnum = omp_get_initial_device();
    if (emu && strcmp(emu, "1") == 0) {
        g_real = 0;
        snprintf(g_desc, sizeof g_desc, "gpu: emulated on the host (PARITY_GPU_EMULATE=1)");
    } else if (ndev > 0) {
        g_real = 1;
        g_devnum = (local_rank > 0 ? local_rank : 0) % ndev;
        snprintf(g_desc, sizeof g_desc, "gpu: nvptx device %d of %d (OpenMP offload)", g_devnum, ndev);
    } else {
        return par_err(PAR_EUNSUPPORTED,
                       "--device gpu: OpenMP sees no offload device (omp_get_num_devices() = 0: "
                       "no GPU, or libgomp's nvptx plugin or libcuda.so.1 not found); set "
                       "PARITY_GPU_EMULATE=1 to emulate one on the host (docs/gpu.md)");
    }
    g_gpu = 1;
    return PAR_OK;
}

#endif
