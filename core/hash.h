/* 64-bit non-cryptographic hash (XXH64 algorithm) for checksums of stored and
 * transmitted parameter blobs and for the model fingerprint. */
#ifndef DL_CORE_HASH_H
#define DL_CORE_HASH_H
#include <stddef.h>
#include <stdint.h>

uint64_t dl_hash64(const void *data, size_t len, uint64_t seed);

#endif
