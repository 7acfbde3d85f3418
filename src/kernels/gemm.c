/* kernels/gemm.c - parity's own GEMM (see kernels/gemm.h): the GotoBLAS /
 * BLIS structure, one thread.
 *
 *   for jc over N by NC:  for pc over K by KC:  pack op(B)[pc.., jc..] into
 *   NR-column panels;  for ic over M by MC:  pack op(A)[ic.., pc..] into
 *   MR-row panels;  every MR x NR tile of C from one A and one B panel (the
 *   micro-kernel, kernels/gemm-ukr.h, held in registers; one call computes
 *   the whole tiles down a column of C).
 *
 * Between K blocks a tile's accumulators are stored raw (working precision)
 * into C and loaded again, so the chain of fused multiply-adds is the one of
 * the unblocked definition; alpha (and beta) are applied once, by the last
 * block.  With beta != 0 and K > KC, C still holds the old values the last
 * block needs: the product goes to a scratch W = alpha acc first and then
 * C = W + beta C (the same two roundings as alpha acc + beta C).  Tails of M
 * and N are zero-padded in the panels; their tiles go through a small
 * scratch tile.  MR, NR and the block sizes differ between paths and change
 * no bit: a lane is one element of C.
 */
#include "kernels/gemm.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/counters.h"
#include "core/log.h"
#include "kernels/gemm_path.h"
#include "kernels/offload.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_X86 1
#include <immintrin.h>
#endif

#if PAR_REAL_BITS == 64
#define GEMM_FMA fma
#else
#define GEMM_FMA fmaf
#endif

/* how a micro-tile stores its accumulators (alpha == 1, beta == 0 stores them
 * raw: 1 * acc is acc, bit for bit, as an fma never yields a signaling NaN) */
enum { GEMM_ST_RAW, GEMM_ST_ALPHA, GEMM_ST_AB };

typedef struct {
    par_real alpha, beta;
    int load;  /* start from C's raw partial sums (not 0) */
    int store; /* GEMM_ST_* */
} gemm_epi;

/* ------------------------------------------------------- micro-kernels */

/* Each instruction set defines its macros once (UKR_ATTR, VEC, VW, V_*),
 * instantiates kernels/gemm-ukr.h once per tile (UKR_NAME, UKR_MR, UKR_NV)
 * and undefines them with kernels/gemm-isa-end.h. */

/* portable C: 4 x 4 scalars, fma() */
#define UKR_ATTR
#define VEC par_real
#define VW 1
#define V_LOAD(p) (*(p))
#define V_STORE(p, v) (*(p) = (v))
#define V_SET1(x) (x)
#define V_ZERO() ((par_real)0)
#define V_FMA(a, b, c) GEMM_FMA(a, b, c)
#define V_MUL(a, b) ((a) * (b))
#define V_ADD(a, b) ((a) + (b))
#define UKR_NAME ukr_c
#define UKR_MR 4
#define UKR_NV 4
#include "kernels/gemm-ukr.h"
#include "kernels/gemm-isa-end.h"

#ifdef GEMM_X86
#if PAR_REAL_BITS == 64
#define X86_V256 __m256d
#define X86_V512 __m512d
#define X86_S(op, w) _mm##w##_##op##_pd
#else
#define X86_V256 __m256
#define X86_V512 __m512
#define X86_S(op, w) _mm##w##_##op##_ps
#endif

/* AVX2 + FMA: 6 rows x 2 vectors (f64 6 x 8, f32 6 x 16), and narrower
 * tiles for small M or N (kerns[] below picks by shape) */
#define UKR_ATTR __attribute__((target("avx2,fma")))
#define VEC X86_V256
#define VW ((int)(32 / sizeof(par_real)))
#define V_LOAD(p) X86_S(loadu, 256)(p)
#define V_STORE(p, v) X86_S(storeu, 256)(p, v)
#define V_SET1(x) X86_S(set1, 256)(x)
#define V_ZERO() X86_S(setzero, 256)()
#define V_FMA(a, b, c) X86_S(fmadd, 256)(a, b, c)
#define V_MUL(a, b) X86_S(mul, 256)(a, b)
#define V_ADD(a, b) X86_S(add, 256)(a, b)
#define UKR_NAME ukr_avx2
#define UKR_MR 6
#define UKR_NV 2
#include "kernels/gemm-ukr.h"
#define UKR_NAME ukr_avx2_4x2
#define UKR_MR 4
#define UKR_NV 2
#include "kernels/gemm-ukr.h"
#define UKR_NAME ukr_avx2_6x1
#define UKR_MR 6
#define UKR_NV 1
#include "kernels/gemm-ukr.h"
#define UKR_NAME ukr_avx2_4x1
#define UKR_MR 4
#define UKR_NV 1
#include "kernels/gemm-ukr.h"
#include "kernels/gemm-isa-end.h"

/* AVX-512F: 12 rows x 2 vectors (f64 12 x 16, f32 12 x 32), and narrower tiles */
#define UKR_ATTR __attribute__((target("avx512f")))
#define VEC X86_V512
#define VW ((int)(64 / sizeof(par_real)))
#define V_LOAD(p) X86_S(loadu, 512)(p)
#define V_STORE(p, v) X86_S(storeu, 512)(p, v)
#define V_SET1(x) X86_S(set1, 512)(x)
#define V_ZERO() X86_S(setzero, 512)()
#define V_FMA(a, b, c) X86_S(fmadd, 512)(a, b, c)
#define V_MUL(a, b) X86_S(mul, 512)(a, b)
#define V_ADD(a, b) X86_S(add, 512)(a, b)
#define UKR_NAME ukr_avx512
#define UKR_MR 12
#define UKR_NV 2
#include "kernels/gemm-ukr.h"
#define UKR_NAME ukr_avx512_8x2
#define UKR_MR 8
#define UKR_NV 2
#include "kernels/gemm-ukr.h"
#define UKR_NAME ukr_avx512_16x1
#define UKR_MR 16
#define UKR_NV 1
#include "kernels/gemm-ukr.h"
#define UKR_NAME ukr_avx512_12x1
#define UKR_MR 12
#define UKR_NV 1
#include "kernels/gemm-ukr.h"
#define UKR_NAME ukr_avx512_8x1
#define UKR_MR 8
#define UKR_NV 1
#include "kernels/gemm-ukr.h"
#include "kernels/gemm-isa-end.h"
#endif

/* A transposing pack by gathers (kernels/gemm.c's gemm_pack, k contiguous in
 * the operand): cnt indices, element (i, k) at s[i * si + k], into dst [kc][w],
 * lanes cnt .. w-1 zero; si * 16 must fit in an int32 (gemm_pack checks).
 * One gather loads a vector of a k row; the scalar loop moves an element. */
#ifdef GEMM_X86
__attribute__((target("avx512f"))) static void gemm_packt_avx512(const par_real *s /* [cnt, si] */, int64_t si,
                                                                 int64_t cnt, int64_t kc, int w,
                                                                 par_real *dst /* [kc, w] */)
{
    enum { VL = 64 / (int)sizeof(par_real) };
    for (int g = 0; g < w; g += VL) {
        const int nw = w - g < VL ? w - g : VL, nc = cnt <= g ? 0 : cnt - g < VL ? (int)(cnt - g) : VL;
        const unsigned mw = (1u << nw) - 1, mc = (1u << nc) - 1;
        const par_real *sg = nc ? s + g * si : s; /* no lane read when nc == 0 */
#if PAR_REAL_BITS == 64
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)si));
        for (int64_t k = 0; k < kc; k++)
            _mm512_mask_storeu_pd(dst + k * w + g, (__mmask8)mw,
                                  _mm512_mask_i32gather_pd(_mm512_setzero_pd(), (__mmask8)mc, idx, sg + k, 8));
#else
        const __m512i idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)si));
        for (int64_t k = 0; k < kc; k++)
            _mm512_mask_storeu_ps(dst + k * w + g, (__mmask16)mw,
                                  _mm512_mask_i32gather_ps(_mm512_setzero_ps(), (__mmask16)mc, idx, sg + k, 4));
#endif
    }
}
#endif

typedef void (*gemm_packt)(const par_real *s, int64_t si, int64_t cnt, int64_t kc, int w, par_real *dst);

/* nt tiles down C (kernels/gemm-ukr.h): tile t from the A panel at Ap + t * ats */
typedef void (*gemm_ukr)(int64_t nt, int64_t ats, int64_t kc, const par_real *Ap, int64_t ars, int64_t acs,
                         const par_real *Bp, int64_t bks, par_real *C, int64_t ldc, const gemm_epi *e);

/* A path's micro-kernel and blocking (reals): MC x KC of A stays in L2, a
 * KC x NR panel of B in L1, KC x NC of B in L3. */
typedef struct {
    int mr, nr, nv; /* the tile: mr rows x nr columns, nv vectors a row */
    int64_t mc, kc, nc;
    gemm_ukr ukr;
    gemm_packt packt; /* the transposing pack, NULL: gemm_pack's loops */
} gemm_kern;

#define GEMM_F (8 / (int)sizeof(par_real)) /* 1 in f64, 2 in f32 */
#define GEMM_KC (256 + 128 * (GEMM_F - 1))
#define GEMM_TILES 5 /* the most micro-tiles of one path */
/* Each path's micro-tiles, the widest first; gemm_pick takes one per call by
 * its shape.  Which tile computes an element never changes its bits (each
 * lane is one element's fma chain), only the time: a v4-mini expert's N = 16
 * would leave half of a 12 x 32 f32 AVX-512 tile empty. */
static const gemm_kern kerns[PAR_GEMM_PATH_COUNT][GEMM_TILES] = {
    [PAR_GEMM_PATH_C] = {{4, 4, 4, 64, 256, 2048, ukr_c}},
#ifdef GEMM_X86
    [PAR_GEMM_PATH_AVX2] = {{6, 8 * GEMM_F, 2, 120, GEMM_KC, 2048, ukr_avx2},
                            {4, 8 * GEMM_F, 2, 120, GEMM_KC, 2048, ukr_avx2_4x2},
                            {6, 4 * GEMM_F, 1, 120, GEMM_KC, 2048, ukr_avx2_6x1},
                            {4, 4 * GEMM_F, 1, 120, GEMM_KC, 2048, ukr_avx2_4x1}},
    [PAR_GEMM_PATH_AVX512] = {{12, 16 * GEMM_F, 2, 144, GEMM_KC, 2048, ukr_avx512, gemm_packt_avx512},
                              {8, 16 * GEMM_F, 2, 144, GEMM_KC, 2048, ukr_avx512_8x2, gemm_packt_avx512},
                              {16, 8 * GEMM_F, 1, 144, GEMM_KC, 2048, ukr_avx512_16x1, gemm_packt_avx512},
                              {12, 8 * GEMM_F, 1, 144, GEMM_KC, 2048, ukr_avx512_12x1, gemm_packt_avx512},
                              {8, 8 * GEMM_F, 1, 144, GEMM_KC, 2048, ukr_avx512_8x1, gemm_packt_avx512}},
#endif
};
#define GEMM_MAX_TILE (12 * 32) /* the largest MR x NR */

/* ------------------------------------------------------------- packing */

/* One operand as a matrix of (index, k): a row of op(A) or a column of
 * op(B) is an index; element (i, k) is at p[i * si + k * sk]. */
typedef struct {
    const par_real *p;
    int64_t si, sk;
} gemm_opnd;

/* Indices [i0, i0 + n) x k [k0, k0 + kc) into panels of w indices:
 * dst[panel][k][w], the tail panel padded with zeros; packt: the path's
 * transposing pack (or NULL). */
static void gemm_pack(gemm_opnd o, int64_t i0, int64_t k0, int64_t n, int64_t kc, int w, gemm_packt packt,
                      par_real *dst)
{
    if (o.sk != 1 || o.si >= (1 << 26)) /* the gathers' int32 indices reach 31 si */
        packt = NULL;
    for (int64_t p = 0; p < n; p += w, dst += (int64_t)w * kc) {
        const int64_t cnt = n - p < w ? n - p : w;
        const par_real *s = o.p + (i0 + p) * o.si + k0 * o.sk;
        if (packt) {
            packt(s, o.si, cnt, kc, w, dst);
            continue;
        }
        if (o.sk == 1) { /* k contiguous */
            for (int64_t i = 0; i < cnt; i++)
                for (int64_t k = 0; k < kc; k++)
                    dst[k * w + i] = s[i * o.si + k];
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int64_t i = 0; i < cnt; i++)
                    dst[k * w + i] = s[k * o.sk + i * o.si];
        }
        if (cnt < w)
            for (int64_t k = 0; k < kc; k++)
                for (int64_t i = cnt; i < w; i++)
                    dst[k * w + i] = 0;
    }
}

/* Small operands are read in place (packing would cost as much as the
 * product): op(A) always can be, op(B) when its columns are contiguous.
 * Only a tail panel (fewer than MR rows, NR columns) is packed then. */
#define GEMM_DIRECT_MAX 16384 /* reals of the operand's block */

/* One K block's operand: packed panels at buf, or in place at o (then
 * only the tail panel is packed, at buf). */
typedef struct {
    gemm_opnd o;
    const par_real *buf;
    int direct;
    int64_t i0, k0, n, kc; /* the block: indices [i0, i0 + n), k [k0, k0 + kc) */
    int w;                 /* MR or NR */
} gemm_block;

static gemm_block gemm_block_make(gemm_opnd o, int direct, int64_t i0, int64_t k0, int64_t n, int64_t kc, int w,
                                  gemm_packt packt, par_real *buf)
{
    gemm_block b = {o, buf, direct, i0, k0, n, kc, w};
    if (!direct)
        gemm_pack(o, i0, k0, n, kc, w, packt, buf);
    else if (n % w)
        gemm_pack(o, i0 + n - n % w, k0, n % w, kc, w, packt, buf);
    return b;
}

/* The panel from index i of block b: its start, index stride and k stride. */
static const par_real *gemm_panel(const gemm_block *b, int64_t i, int64_t *si, int64_t *sk)
{
    if (b->direct && i + b->w <= b->n) {
        *si = b->o.si;
        *sk = b->o.sk;
        return b->o.p + (b->i0 + i) * b->o.si + b->k0 * b->o.sk;
    }
    *si = 1;
    *sk = b->w;
    return b->direct ? b->buf : b->buf + i * b->kc;
}

/* ------------------------------------------------------------- driver */

/* A tile of rows x cols < MR x NR: through the scratch tile t. */
static void gemm_edge(const gemm_kern *kp, int64_t kc, const par_real *a, int64_t ars, int64_t acs,
                      const par_real *b, int64_t bks, par_real *C, int64_t ldc, int64_t rows, int64_t cols,
                      const gemm_epi *e)
{
    par_real t[GEMM_MAX_TILE];
    memset(t, 0, sizeof(par_real) * (size_t)(kp->mr * kp->nr));
    if (e->load || e->store == GEMM_ST_AB)
        for (int64_t r = 0; r < rows; r++)
            memcpy(t + r * kp->nr, C + r * ldc, sizeof(par_real) * (size_t)cols);
    kp->ukr(1, 0, kc, a, ars, acs, b, bks, t, kp->nr, e);
    for (int64_t r = 0; r < rows; r++)
        memcpy(C + r * ldc, t + r * kp->nr, sizeof(par_real) * (size_t)cols);
}

/* C [mc, nc] from the A block (mc x kc) and the B block (nc x kc). */
static void gemm_macro(const gemm_kern *kp, const gemm_block *ab, const gemm_block *bb, par_real *C, int64_t ldc,
                       const gemm_epi *e)
{
    for (int64_t jr = 0; jr < bb->n; jr += kp->nr) {
        const int64_t cols = bb->n - jr < kp->nr ? bb->n - jr : kp->nr;
        const int64_t full = cols == kp->nr ? ab->n / kp->mr : 0; /* whole tiles down this column */
        int64_t one, bks, ars, acs;
        const par_real *b = gemm_panel(bb, jr, &one, &bks);
        if (full) { /* A's whole panels are evenly spaced, in place or packed */
            const par_real *a = gemm_panel(ab, 0, &ars, &acs);
            kp->ukr(full, kp->mr * (ab->direct ? ab->o.si : ab->kc), ab->kc, a, ars, acs, b, bks, C + jr, ldc, e);
        }
        for (int64_t ir = full * kp->mr; ir < ab->n; ir += kp->mr) {
            const int64_t rows = ab->n - ir < kp->mr ? ab->n - ir : kp->mr;
            const par_real *a = gemm_panel(ab, ir, &ars, &acs);
            gemm_edge(kp, ab->kc, a, ars, acs, b, bks, C + ir * ldc + jr, ldc, rows, cols, e);
        }
    }
}

/* How gemm_blocked starts and ends an element's chain: par_gemm's (from 0,
 * alpha and beta by the last K block), or par_gemm_part's (raw accumulators
 * stored; from 0, or continuing C's raw ones). */
enum { GEMM_WHOLE, GEMM_PART_NEW, GEMM_PART_MORE };

/* C = alpha op(A) op(B) (+ beta C when K <= KC), K > 0; pa, pb: the packing
 * buffers (gemm_run).  part: GEMM_WHOLE or par_gemm_part's chain. */
static void gemm_blocked(const gemm_kern *kp, gemm_opnd A, gemm_opnd B, int64_t M, int64_t N, int64_t K,
                         par_real alpha, par_real beta, par_real *C, int64_t ldc, par_real *pa, par_real *pb,
                         int part)
{
    const int da = M * K <= GEMM_DIRECT_MAX, db = B.si == 1 && K * N <= GEMM_DIRECT_MAX;
    for (int64_t jc = 0; jc < N; jc += kp->nc) {
        const int64_t nc = N - jc < kp->nc ? N - jc : kp->nc;
        for (int64_t pc = 0; pc < K; pc += kp->kc) {
            const int64_t kc = K - pc < kp->kc ? K - pc : kp->kc;
            const int last = pc + kc == K;
            const gemm_epi e = {alpha, beta, pc > 0 || part == GEMM_PART_MORE,
                                !last || part != GEMM_WHOLE || (alpha == 1 && beta == 0) ? GEMM_ST_RAW
                                : beta == 0                                             ? GEMM_ST_ALPHA
                                                           : GEMM_ST_AB};
            const gemm_block bb = gemm_block_make(B, db, jc, pc, nc, kc, kp->nr, kp->packt, pb);
            for (int64_t ic = 0; ic < M; ic += kp->mc) {
                const int64_t mc = M - ic < kp->mc ? M - ic : kp->mc;
                const gemm_block ab = gemm_block_make(A, da, ic, pc, mc, kc, kp->mr, kp->packt, pa);
                gemm_macro(kp, &ab, &bb, C + ic * ldc + jc, ldc, &e);
            }
        }
    }
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* ceil(x / d), x >= 0, d > 0: in 32 bits when x fits (a shorter divide) */
static int64_t ceil_div(int64_t x, int d)
{
    if (x < INT32_MAX - 64)
        return (int64_t)(((uint32_t)x + (uint32_t)d - 1) / (uint32_t)d);
    return (x + d - 1) / d;
}

/* The index of the current path's tile for C [M, N]: the least time by a
 * simple model, ties to the wider.  Per k a tile loads mr + nv operands and
 * does mr nv vector FMAs (two of either per cycle): tiles over M x N times
 * the larger count.  Integers (no division but the tile counts): par_gemm
 * picks on every call. */
static int gemm_pick_index(int64_t M, int64_t N)
{
    const gemm_kern *ks = kerns[par_gemm_path()];
    int best = 0;
    int64_t best_cost = 0;
    for (int i = 0; i < GEMM_TILES && ks[i].ukr; i++) {
        const int fma = ks[i].mr * ks[i].nv, ld = ks[i].mr + ks[i].nv;
        const int64_t cost = ceil_div(M, ks[i].mr) * ceil_div(N, ks[i].nr) * (fma > ld ? fma : ld);
        if (i == 0 || cost < best_cost)
            best = i, best_cost = cost;
    }
    return best;
}

/* gemm_pick's last answers on this thread, by a hash of (path, M, N): a
 * training step repeats a few shapes, and the pick costs ten divisions.  A
 * cache only (a fiber sharing the thread finds the same answers): scratch
 * in tools/check-layers.sh's fiber rule. */
typedef struct {
    int64_t M, N; /* M == 0: empty (no pick is made for M <= 0) */
    int path, idx;
} gemm_memo;
#define GEMM_MEMO 16

static const gemm_kern *gemm_pick(int64_t M, int64_t N)
{
    static _Thread_local gemm_memo memo[GEMM_MEMO];
    const int path = (int)par_gemm_path();
    gemm_memo *m = &memo[(uint64_t)(M * 31 + N * 7 + path) % GEMM_MEMO];
    if (m->M != M || m->N != N || m->path != path)
        *m = (gemm_memo){M, N, path, gemm_pick_index(M, N)};
    return &kerns[path][m->idx];
}

int PAR_FN(par_gemm_tile)(int64_t M, int64_t N, int *mr, int *nr)
{
    const int i = gemm_pick_index(M, N);
    *mr = kerns[par_gemm_path()][i].mr;
    *nr = kerns[par_gemm_path()][i].nr;
    return i;
}

int PAR_FN(par_gemm_tiles)(void)
{
    int n = 0;
    while (n < GEMM_TILES && kerns[par_gemm_path()][n].ukr)
        n++;
    return n;
}

/* The packing buffers, kept per thread between calls: at up to (MC + NC) KC
 * reals (4.2 MB for avx2 f64) they are above malloc's mmap threshold
 * (core/alloc.h), so a buffer per call was a fresh mapping every call, a page
 * fault and a cleared page per 4 KiB of it every time.  Freed when the thread
 * ends (a pthread key); plain aligned_alloc, outside the tagged accounting
 * (like a thread's stack).  A fiber (backends/fiber) shares its OS thread's:
 * a GEMM never yields. */
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static int pack_key_ok;

typedef struct {
    size_t n; /* reals */
    par_real *p;
} gemm_packbuf;

static void pack_free(void *v)
{
    gemm_packbuf *b = v;
    free(b->p);
    free(b);
}

static void pack_key_make(void) { pack_key_ok = pthread_key_create(&pack_key, pack_free) == 0; }

/* This thread's buffer of at least n reals (64-byte aligned), NULL when none. */
static par_real *pack_get(size_t n)
{
    pthread_once(&pack_once, pack_key_make);
    if (!pack_key_ok)
        return NULL;
    gemm_packbuf *b = pthread_getspecific(pack_key);
    if (!b) {
        if (!(b = calloc(1, sizeof *b)))
            return NULL;
        if (pthread_setspecific(pack_key, b)) {
            free(b);
            return NULL;
        }
    }
    if (b->n < n) {
        size_t bytes = (sizeof(par_real) * n + 63) / 64 * 64;
        par_real *p = aligned_alloc(64, bytes);
        if (!p)
            return NULL;
        free(b->p);
        b->p = p;
        b->n = n;
    }
    return b->p;
}

/* C = alpha op(A) op(B) + beta C (K > 0, alpha != 0); PAR_ENOMEM when a
 * buffer cannot be had (nothing written then). */
static par_status gemm_run(const gemm_kern *kp, gemm_opnd A, gemm_opnd B, int64_t M, int64_t N, int64_t K,
                           par_real alpha, par_real beta, par_real *C, int64_t ldc, int part)
{
    const int64_t kc = K < kp->kc ? K : kp->kc;
    const int64_t na = round_up(M < kp->mc ? M : kp->mc, kp->mr) * kc;
    const int64_t nb = round_up(N < kp->nc ? N : kp->nc, kp->nr) * kc;
    const int scratch = part == GEMM_WHOLE && beta != 0 && K > kp->kc; /* C's old values outlive the first K block */
    par_real *buf = pack_get((size_t)(na + nb));
    if (!buf)
        return PAR_ENOMEM;
    if (!scratch) {
        gemm_blocked(kp, A, B, M, N, K, alpha, beta, C, ldc, buf, buf + na, part);
        return PAR_OK;
    }
    par_real *W = par_malloc(sizeof(par_real) * (size_t)(M * N), PAR_TAG_ACT);
    if (!W)
        return PAR_ENOMEM;
    gemm_blocked(kp, A, B, M, N, K, alpha, 0, W, N, buf, buf + na, GEMM_WHOLE);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            C[i * ldc + j] = W[i * N + j] + beta * C[i * ldc + j];
    par_free(W);
    return PAR_OK;
}

/* K == 0 or alpha == 0: C = beta C (beta == 0 writes zeros, ignoring old C) */
static void gemm_scale(int64_t M, int64_t N, par_real beta, par_real *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            C[i * ldc + j] = beta == 0 ? (par_real)0 : beta * C[i * ldc + j];
}

void PAR_FN(par_gemm_reference)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                                const par_real *A, int64_t lda, const par_real *B, int64_t ldb,
                                par_real beta, par_real *C, int64_t ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0 || alpha == 0) {
        gemm_scale(M, N, beta, C, ldc);
        return;
    }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            par_real acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc = GEMM_FMA(ta ? A[k * lda + i] : A[i * lda + k], tb ? B[j * ldb + k] : B[k * ldb + j], acc);
            par_real *c = C + i * ldc + j;
            *c = beta == 0 ? alpha * acc : alpha * acc + beta * *c;
        }
}

void PAR_FN(par_gemm)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                      const par_real *A, int64_t lda, const par_real *B, int64_t ldb, par_real beta,
                      par_real *C, int64_t ldc)
{
    if (M <= 0 || N <= 0)
        return;
    /* the emulated GPU's roofline (core/counters.h): 2MNK flops; A, B read, C written
     * (and read when beta != 0) */
    const uint64_t k = (uint64_t)(K > 0 ? K : 0);
    par_count_flops(2u * (uint64_t)M * (uint64_t)N * k);
    par_count_bytes(sizeof(par_real) *
                    ((uint64_t)M * k + k * (uint64_t)N + (uint64_t)M * (uint64_t)N * (beta != 0 ? 2u : 1u)));
    if (PAR_GEMM_ON_DEVICE(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return; /* GPU mode: the offload build's device GEMM (kernels/gemm_device.c) */
    if (K <= 0 || alpha == 0) {
        gemm_scale(M, N, beta, C, ldc);
        return;
    }
    const gemm_opnd a = ta ? (gemm_opnd){A, 1, lda} : (gemm_opnd){A, lda, 1};
    const gemm_opnd b = tb ? (gemm_opnd){B, ldb, 1} : (gemm_opnd){B, 1, ldb};
    if (gemm_run(gemm_pick(M, N), a, b, M, N, K, alpha, beta, C, ldc, GEMM_WHOLE)) {
        PAR_LOG_W("par_gemm: no memory for the packing buffers (M %lld, N %lld, K %lld); computing it "
                  "with the plain loops (the same bits, slower)", (long long)M, (long long)N, (long long)K);
        PAR_FN(par_gemm_reference)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

/* The reference loops of par_gemm_part (the fallback without packing buffers). */
static void gemm_part_reference(int ta, int tb, int64_t M, int64_t N, int64_t K, const par_real *A, int64_t lda,
                                const par_real *B, int64_t ldb, int load, par_real *P, int64_t ldp)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            par_real acc = load ? P[i * ldp + j] : 0;
            for (int64_t k = 0; k < K; k++)
                acc = GEMM_FMA(ta ? A[k * lda + i] : A[i * lda + k], tb ? B[j * ldb + k] : B[k * ldb + j], acc);
            P[i * ldp + j] = acc;
        }
}

void PAR_FN(par_gemm_part)(int ta, int tb, int64_t M, int64_t N, int64_t K, const par_real *A, int64_t lda,
                           const par_real *B, int64_t ldb, int load, par_real *P, int64_t ldp)
{
    if (M <= 0 || N <= 0)
        return;
    const uint64_t k = (uint64_t)(K > 0 ? K : 0);
    par_count_flops(2u * (uint64_t)M * (uint64_t)N * k);
    par_count_bytes(sizeof(par_real) * ((uint64_t)M * k + k * (uint64_t)N + (uint64_t)M * (uint64_t)N * 2u));
    if (K <= 0) {
        if (!load)
            gemm_scale(M, N, 0, P, ldp);
        return;
    }
    const gemm_opnd a = ta ? (gemm_opnd){A, 1, lda} : (gemm_opnd){A, lda, 1};
    const gemm_opnd b = tb ? (gemm_opnd){B, ldb, 1} : (gemm_opnd){B, 1, ldb};
    if (gemm_run(gemm_pick(M, N), a, b, M, N, K, 1, 0, P, ldp, load ? GEMM_PART_MORE : GEMM_PART_NEW))
        gemm_part_reference(ta, tb, M, N, K, A, lda, B, ldb, load, P, ldp);
}

void PAR_FN(par_gemm_finish)(int64_t M, int64_t N, par_real alpha, const par_real *P, int64_t ldp, par_real beta,
                             par_real *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            par_real *c = C + i * ldc + j;
            *c = beta == 0 ? alpha * P[i * ldp + j] : alpha * P[i * ldp + j] + beta * *c;
        }
}
