/* The hand-written XXH64 that core/hash.c held before it called libxxhash:
 * kept as the reference that the library's output is checked against
 * (tests/test_hash.c) and as one of bench/hash.c's figures. */
#ifndef DL_TESTS_XXH64_REF_H
#define DL_TESTS_XXH64_REF_H
#include <stddef.h>
#include <stdint.h>

uint64_t dl_xxh64_ref(const void *data, size_t len, uint64_t seed);

#endif
