/* core/racc.c - reproducible accumulation and its registry (core/racc.h). */
#include "core/racc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

par_status par_racc_init(par_racc *a, size_t n)
{
    par_racc r = {.n = n};
    const size_t m = n ? n : 1;
    r.e = par_malloc(m * sizeof *r.e, PAR_TAG_GRAD);
    r.s0 = par_malloc(m * sizeof *r.s0, PAR_TAG_GRAD);
    r.s1 = par_malloc(m * sizeof *r.s1, PAR_TAG_GRAD);
    r.s2 = par_malloc(m * sizeof *r.s2, PAR_TAG_GRAD);
    if (!r.e || !r.s0 || !r.s1 || !r.s2) {
        par_racc_free(&r);
        return par_err(PAR_ENOMEM, "reproducible accumulator: out of memory for %zu elements (%zu bytes)", n,
                       n * (sizeof *r.e + 3 * sizeof *r.s0));
    }
    par_racc_zero(&r, 0, n);
    *a = r;
    return PAR_OK;
}

void par_racc_free(par_racc *a)
{
    par_free(a->e);
    par_free(a->s0);
    par_free(a->s1);
    par_free(a->s2);
    memset(a, 0, sizeof *a);
}

void par_racc_zero(par_racc *a, size_t i0, size_t n)
{
    for (size_t i = i0; i < i0 + n; i++)
        a->e[i] = PAR_RACC_EMPTY;
    memset(a->s0 + i0, 0, n * sizeof *a->s0);
    memset(a->s1 + i0, 0, n * sizeof *a->s1);
    memset(a->s2 + i0, 0, n * sizeof *a->s2);
}

/* The smallest grid exponent e with |x| < 2^(W-1+e) (x finite, nonzero). */
static int32_t grid_of(double x)
{
    int ex;
    (void)frexp(x, &ex); /* |x| < 2^ex */
    int32_t k = ex - (PAR_RACC_W - 1); /* need e >= k */
    int32_t e = k >= 0 ? (k + PAR_RACC_W - 1) / PAR_RACC_W * PAR_RACC_W : -((-k) / PAR_RACC_W * PAR_RACC_W);
    return e < PAR_RACC_EMIN ? PAR_RACC_EMIN : e;
}

/* The folds moved down by `steps` grid steps (3 or more: all gone). */
static void shift(int64_t *s, int steps)
{
    for (int k = 2; k >= 0; k--)
        s[k] = k - steps >= 0 && steps < 3 ? s[k - steps] : 0;
}

void par_racc_align(par_racc *a, size_t i, int32_t e)
{
    const int32_t have = a->e[i];
    if (have == PAR_RACC_NAN || e <= have)
        return;
    int64_t s[3] = {a->s0[i], a->s1[i], a->s2[i]};
    shift(s, have == PAR_RACC_EMPTY || e == PAR_RACC_NAN ? 3 : (e - have) / PAR_RACC_W);
    a->s0[i] = s[0], a->s1[i] = s[1], a->s2[i] = s[2];
    a->e[i] = e;
}

void par_racc__put_slow(par_racc *a, size_t i, double x)
{
    if (!isfinite(x) || fabs(x) >= par_racc__pow2(PAR_RACC_EMAX + PAR_RACC_W - 1)) {
        par_racc_align(a, i, PAR_RACC_NAN);
        return;
    }
    const int32_t want = grid_of(x);
    if (a->e[i] == PAR_RACC_EMPTY || want > a->e[i])
        par_racc_align(a, i, want);
    par_racc_put(a, i, x); /* now on the fast path */
}

double par_racc_value(const par_racc *a, size_t i)
{
    const int32_t e = a->e[i];
    if (e == PAR_RACC_NAN)
        return NAN;
    if (e == PAR_RACC_EMPTY)
        return 0.0;
    /* carry into the unique form: s2, s1 in [0, 2^W) (arithmetic shifts floor) */
    __int128 s2 = a->s2[i], s1 = (__int128)a->s1[i] + (s2 >> PAR_RACC_W), s0;
    s2 &= ((__int128)1 << PAR_RACC_W) - 1;
    s0 = (__int128)a->s0[i] + (s1 >> PAR_RACC_W);
    s1 &= ((__int128)1 << PAR_RACC_W) - 1;
    if (s0 >= ((__int128)1 << 54) || s0 <= -((__int128)1 << 54)) /* beyond 2^127 with s2: s2 is below the rounding */
        return ldexp((double)(s0 * ((__int128)1 << PAR_RACC_W) + s1), e - PAR_RACC_W);
    const __int128 v = (s0 * ((__int128)1 << PAR_RACC_W) + s1) * ((__int128)1 << PAR_RACC_W) + s2;
    return ldexp((double)v, e - 2 * PAR_RACC_W); /* one rounding (RNE), an exact scale unless subnormal */
}

void par_racc_copy(par_racc *dst, size_t di, const par_racc *src, size_t si, size_t n)
{
    memcpy(dst->e + di, src->e + si, n * sizeof *dst->e);
    memcpy(dst->s0 + di, src->s0 + si, n * sizeof *dst->s0);
    memcpy(dst->s1 + di, src->s1 + si, n * sizeof *dst->s1);
    memcpy(dst->s2 + di, src->s2 + si, n * sizeof *dst->s2);
}

void par_racc_merge(par_racc *dst, const par_racc *src, size_t i0, size_t n)
{
    par_racc_merge_at(dst, i0, src, i0, n);
}

void par_racc_merge_at(par_racc *dst, size_t di, const par_racc *src, size_t si, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        const size_t i = di + j, k = si + j;
        int32_t es = src->e[k];
        if (es == PAR_RACC_EMPTY)
            continue;
        int64_t s[3] = {src->s0[k], src->s1[k], src->s2[k]};
        if (es == PAR_RACC_NAN || dst->e[i] == PAR_RACC_NAN) {
            par_racc_align(dst, i, PAR_RACC_NAN);
            continue;
        }
        if (dst->e[i] != PAR_RACC_EMPTY && dst->e[i] > es) { /* src's copy up to dst's grid */
            shift(s, (dst->e[i] - es) / PAR_RACC_W);
            es = dst->e[i];
        }
        par_racc_align(dst, i, es);
        dst->s0[i] += s[0];
        dst->s1[i] += s[1];
        dst->s2[i] += s[2];
    }
}

/* ---- the registry ------------------------------------------------------ */

typedef struct {
    uintptr_t lo, hi; /* [lo, hi) bytes */
    size_t elsize;
    par_racc *acc;
} reg_entry;

/* sorted by lo; grows by doubling (a world of 8,192 fiber ranks registers
 * three buffers per rank) */
static reg_entry *reg;
static int reg_n, reg_cap;
static pthread_rwlock_t reg_lock = PTHREAD_RWLOCK_INITIALIZER;

/* Twice the table (the write lock held). */
static par_status grow(void)
{
    const int cap = reg_cap ? 2 * reg_cap : 64;
    reg_entry *r = realloc(reg, (size_t)cap * sizeof *r); /* not par_malloc: a process-wide table, never freed */
    if (!r)
        return par_err(PAR_ENOMEM, "racc register: out of memory for %d registered buffers", cap);
    reg = r;
    reg_cap = cap;
    return PAR_OK;
}

par_status par_racc_register(void *base, size_t n, size_t elsize, par_racc *a)
{
    if ((elsize != 8 && elsize != 4) || !a || a->n < n)
        return par_err(PAR_EINVAL, "racc register: element size %zu (8 or 4), %zu elements, accumulator of %zu",
                       elsize, n, a ? a->n : 0);
    const uintptr_t lo = (uintptr_t)base, hi = lo + n * elsize;
    par_status s = PAR_OK;
    pthread_rwlock_wrlock(&reg_lock);
    int at = 0;
    while (at < reg_n && reg[at].lo < lo)
        at++;
    if (reg_n == reg_cap)
        s = grow();
    if (!s && ((at < reg_n && reg[at].lo < hi) || (at > 0 && reg[at - 1].hi > lo)))
        s = par_err(PAR_EINVAL, "racc register: buffer %p of %zu elements overlaps a registered one", base, n);
    if (!s) {
        memmove(reg + at + 1, reg + at, (size_t)(reg_n - at) * sizeof *reg);
        reg[at] = (reg_entry){lo, hi, elsize, a};
        __atomic_store_n(&reg_n, reg_n + 1, __ATOMIC_RELEASE);
    }
    pthread_rwlock_unlock(&reg_lock);
    return s;
}

void par_racc_unregister(const void *base)
{
    pthread_rwlock_wrlock(&reg_lock);
    for (int i = 0; i < reg_n; i++)
        if (reg[i].lo == (uintptr_t)base) {
            memmove(reg + i, reg + i + 1, (size_t)(reg_n - i - 1) * sizeof *reg);
            __atomic_store_n(&reg_n, reg_n - 1, __ATOMIC_RELEASE);
            break;
        }
    pthread_rwlock_unlock(&reg_lock);
}

int par_racc_registered(void) { return __atomic_load_n(&reg_n, __ATOMIC_ACQUIRE); }

par_racc_view par_racc_lookup(const void *p, size_t n)
{
    par_racc_view v = {NULL, 0};
    if (!p || par_racc_registered() == 0)
        return v;
    const uintptr_t a = (uintptr_t)p;
    pthread_rwlock_rdlock(&reg_lock);
    int lo = 0, hi = reg_n; /* the last entry with reg.lo <= a */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (reg[mid].lo <= a)
            lo = mid;
        else
            hi = mid;
    }
    if (reg_n > 0 && reg[lo].lo <= a && a < reg[lo].hi && a + n * reg[lo].elsize <= reg[lo].hi &&
        (a - reg[lo].lo) % reg[lo].elsize == 0)
        v = (par_racc_view){reg[lo].acc, (a - reg[lo].lo) / reg[lo].elsize};
    pthread_rwlock_unlock(&reg_lock);
    return v;
}
