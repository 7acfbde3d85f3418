/* core/rng.h - counter-based random numbers (Philox4x32-10).
 *
 * Random values are pure functions of (seed, stream name, element index), so
 * any rank can produce exactly the slice of a tensor it owns, in any order.
 *   key     = par_rng_key(seed, name)  (64 bits from seed and a stable name hash)
 *   element i uses the Philox block with counter (lo32(i), hi32(i), word2, 0)
 * See docs/formats.md ("Initialization") for the distributions.
 */
#ifndef PAR_CORE_RNG_H
#define PAR_CORE_RNG_H

#include <stdint.h>

typedef struct {
    uint32_t k[2];
} par_philox_key;

/* One Philox4x32-10 block: out = philox(ctr, key). */
void par_philox4x32_10(const uint32_t ctr[4], par_philox_key key, uint32_t out[4]);

/* Stable 64-bit FNV-1a hash of a NUL-terminated string. */
uint64_t par_name_hash64(const char *s);

/* Key of the stream named `name` under `seed`. */
par_philox_key par_rng_key(uint64_t seed, const char *name);

/* Uniform double in (0, 1) (never 0 or 1), 53 random bits, for element i. */
double par_rng_uniform(par_philox_key key, uint64_t i, uint32_t word2);
/* Standard normal for element i (Box-Muller on the block's four words). */
double par_rng_normal(par_philox_key key, uint64_t i, uint32_t word2);
/* out[j] = par_rng_normal(key, i0 + j, word2) for j < n, the same bits
 * (its Box-Muller four lanes at a time: core/pmath.h par_pmath_box_muller). */
void par_rng_normal_n(par_philox_key key, uint64_t i0, uint32_t word2, double *out, int64_t n);
/* Uniform integer in [0, n) for element i (n >= 1). */
uint64_t par_rng_below(par_philox_key key, uint64_t i, uint32_t word2, uint64_t n);

#endif
