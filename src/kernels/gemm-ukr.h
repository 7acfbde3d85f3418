/* kernels/gemm-ukr.h - the micro-kernel of kernels/gemm.c, instantiated once
 * per tile: gemm.c defines the names below and includes this file.  It
 * undefines the tile's three (UKR_NAME, UKR_MR, UKR_NV); the instruction
 * set's stay for its next tile until kernels/gemm-isa-end.h.
 *
 *   UKR_NAME, UKR_ATTR         the function and its target attribute
 *   UKR_MR, UKR_NV             rows of the tile; vectors per tile row
 *   VEC, VW                    the vector type and its lanes (scalar: 1)
 *   V_LOAD(p), V_STORE(p, v), V_SET1(x), V_ZERO(), V_FMA(a, b, c) = a b + c
 *   fused, V_MUL(a, b), V_ADD(a, b)
 *
 * C [UKR_MR, UKR_NV * VW] (ld ldc) from a panel of A, element (r, k) at
 * Ap[r * ars + k * acs], and one of B, row k at Bp + k * bks (UKR_NV * VW
 * contiguous reals): packed panels or the operands in place.  Each lane is
 * one element of C, its accumulator
 * taken up through k = 0 .. kc-1 in order by one fused multiply-add each
 * (kernels/gemm.h); e says where the accumulator starts (0 or C's raw
 * partial sum) and how it is stored.  UKR_NAME computes nt such tiles down
 * C from one B panel (a call per column of tiles); UKR_NAME_one is one. */
#ifndef UKR_KLOOP
/* acc += the tile's kc rank-1 updates, k in order; rs: A's row stride */
#define UKR_KLOOP(rs)                                                                                              \
    for (int64_t k = 0; k < kc; k++, Ap += acs, Bp += bks) {                                                       \
        VEC b[UKR_NV];                                                                                             \
        _Pragma("GCC unroll 8") for (int v = 0; v < UKR_NV; v++) b[v] = V_LOAD(Bp + v * VW);                       \
        _Pragma("GCC unroll 16") for (int r = 0; r < UKR_MR; r++)                                                  \
        {                                                                                                          \
            VEC a = V_SET1(Ap[r * (rs)]);                                                                          \
            _Pragma("GCC unroll 8") for (int v = 0; v < UKR_NV; v++) acc[r][v] = V_FMA(a, b[v], acc[r][v]);         \
        }                                                                                                          \
    }
#endif
#ifndef UKR_CAT
#define UKR_CAT2(a, b) a##b
#define UKR_CAT(a, b) UKR_CAT2(a, b)
#endif
/* one tile (inlined into UKR_NAME below) */
UKR_ATTR __attribute__((always_inline)) static inline void UKR_CAT(UKR_NAME, _one)(
    int64_t kc, const par_real *Ap, int64_t ars, int64_t acs, /* A panel: (r, k) at Ap[r * ars + k * acs] */
    const par_real *Bp, int64_t bks,                          /* B panel: row k at Bp + k * bks */
    par_real *C, int64_t ldc,                                 /* C [UKR_MR, UKR_NV * VW] */
    const gemm_epi *e)
{
    VEC acc[UKR_MR][UKR_NV];
    par_real *c = C; /* row r of the tile (a pointer bumped by ldc: no row addresses kept in registers) */
#pragma GCC unroll 16
    for (int r = 0; r < UKR_MR; r++, c += ldc)
#pragma GCC unroll 8
        for (int v = 0; v < UKR_NV; v++)
            acc[r][v] = e->load ? V_LOAD(c + v * VW) : V_ZERO();
    if (ars == 1) { /* rows adjacent (a packed panel, op(A) = A^T in place): constant offsets */
        UKR_KLOOP(1);
    } else {
        UKR_KLOOP(ars);
    }
    const VEC va = V_SET1(e->alpha), vb = V_SET1(e->beta);
    c = C;
#pragma GCC unroll 16
    for (int r = 0; r < UKR_MR; r++, c += ldc)
#pragma GCC unroll 8
        for (int v = 0; v < UKR_NV; v++) {
            if (e->store == GEMM_ST_RAW)
                V_STORE(c + v * VW, acc[r][v]);
            else if (e->store == GEMM_ST_ALPHA)
                V_STORE(c + v * VW, V_MUL(va, acc[r][v]));
            else
                V_STORE(c + v * VW, V_ADD(V_MUL(va, acc[r][v]), V_MUL(vb, V_LOAD(c + v * VW))));
        }
}

/* nt tiles down C from one B panel: tile t's A panel at Ap + t * ats, its
 * C at C + t * UKR_MR * ldc (one call per column of tiles, not per tile) */
UKR_ATTR static void UKR_NAME(int64_t nt, int64_t ats, int64_t kc,
                              const par_real *Ap, int64_t ars, int64_t acs, /* tile t's (r, k): Ap[t ats + r ars + k acs] */
                              const par_real *Bp, int64_t bks,              /* row k at Bp + k * bks */
                              par_real *C, int64_t ldc,                     /* C [nt * UKR_MR, UKR_NV * VW] */
                              const gemm_epi *e)
{
    for (int64_t t = 0; t < nt; t++, Ap += ats, C += UKR_MR * ldc)
        UKR_CAT(UKR_NAME, _one)(kc, Ap, ars, acs, Bp, bks, C, ldc, e);
}

#undef UKR_NAME
#undef UKR_MR
#undef UKR_NV
