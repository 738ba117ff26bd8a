/* Deterministic random numbers: splitmix64-seeded xoshiro256**, uniform and
 * normal floats. State is a plain struct so checkpoints can store it. */
#ifndef DL_CORE_RNG_H
#define DL_CORE_RNG_H
#include <stdint.h>

typedef struct { uint64_t s[4]; } dl_rng;

void dl_rng_seed(dl_rng *r, uint64_t seed);
uint64_t dl_rng_u64(dl_rng *r);
uint64_t dl_rng_below(dl_rng *r, uint64_t n); /* uniform in [0, n), n > 0 */
float dl_rng_uniform(dl_rng *r);              /* [0, 1) */
float dl_rng_normal(dl_rng *r);               /* N(0, 1), Box-Muller */

#endif
