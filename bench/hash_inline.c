/* libxxhash-dev's header compiled into dloco (XXH_INLINE_ALL), so XXH3 uses
 * the vector unit this build targets (-march=native: AVX2/AVX-512) instead of
 * the shared library's baseline; a figure of bench/hash.c. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stddef.h>
#include <stdint.h>

uint64_t bench_xxh3_inline(const void *p, size_t n);
uint64_t bench_xxh64_inline(const void *p, size_t n);
uint64_t bench_xxh3_inline(const void *p, size_t n) { return XXH3_64bits(p, n); }
uint64_t bench_xxh64_inline(const void *p, size_t n) { return XXH64(p, n, 0); }
