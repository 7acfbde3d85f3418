#include "core/rng.h"

#include <math.h>

#include "core/pmath.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void par_philox4x32_10(const uint32_t ctr[4], par_philox_key key, uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key.k[0], k1 = key.k[1];
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
        uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t par_name_hash64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

par_philox_key par_rng_key(uint64_t seed, const char *name)
{
    uint64_t k = splitmix64(seed) ^ par_name_hash64(name);
    par_philox_key key = {{(uint32_t)k, (uint32_t)(k >> 32)}};
    return key;
}

static void block(par_philox_key key, uint64_t i, uint32_t word2, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), word2, 0};
    par_philox4x32_10(ctr, key, out);
}

/* 53 bits -> (0,1): (k + 0.5) / 2^53 */
static double u53(uint32_t a, uint32_t b)
{
    uint64_t k = ((uint64_t)a << 21) ^ (uint64_t)(b >> 11);
    k &= (1ull << 53) - 1;
    return ((double)k + 0.5) * (1.0 / 9007199254740992.0);
}

double par_rng_uniform(par_philox_key key, uint64_t i, uint32_t word2)
{
    uint32_t o[4];
    block(key, i, word2, o);
    return u53(o[0], o[1]);
}

double par_rng_normal(par_philox_key key, uint64_t i, uint32_t word2)
{
    uint32_t o[4];
    block(key, i, word2, o);
    double u1 = u53(o[0], o[1]);
    double u2 = u53(o[2], o[3]);
    return sqrt(-2.0 * par_pmath_log(u1)) * par_pmath_cos(6.283185307179586476925 * u2);
}

void par_rng_normal_n(par_philox_key key, uint64_t i0, uint32_t word2, double *out, int64_t n)
{
    enum { CH = 256 };
    double u1[CH], u2[CH];
    for (int64_t b = 0; b < n; b += CH) {
        const int m = n - b < CH ? (int)(n - b) : CH;
        for (int j = 0; j < m; j++) {
            uint32_t o[4];
            block(key, i0 + (uint64_t)(b + j), word2, o);
            u1[j] = u53(o[0], o[1]);
            u2[j] = u53(o[2], o[3]);
        }
        par_pmath_box_muller(u1, u2, out + b, m);
    }
}

uint64_t par_rng_below(par_philox_key key, uint64_t i, uint32_t word2, uint64_t n)
{
    uint32_t o[4];
    block(key, i, word2, o);
    uint64_t x = ((uint64_t)o[0] << 32) | o[1];
    /* 128-bit multiply-shift: bias < n / 2^64, negligible for our n */
    return (uint64_t)(((unsigned __int128)x * n) >> 64);
}
