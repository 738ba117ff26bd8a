/* 64-bit non-cryptographic hashes: dl_hash64 (XXH64) for the model
 * fingerprint, checkpoints, hash tables and seeds; dl_checksum64 (XXH3) for
 * the bulk checksums of parameter blobs on the wire and in stores. */
#ifndef DL_CORE_HASH_H
#define DL_CORE_HASH_H
#include <stddef.h>
#include <stdint.h>

/* XXH64 with a seed (chain calls through the seed to hash several pieces). */
uint64_t dl_hash64(const void *data, size_t len, uint64_t seed);
/* XXH3_64bits, no seed: the Push/Update payload checksum (protocol version
 * 2) and the store's block checksums (schema 4). About 1.5x XXH64 on a
 * 150 MB buffer here, 3.4x in cache (bench/hash). Changing it is a wire and
 * a store format change. */
uint64_t dl_checksum64(const void *data, size_t len);

/* dl_checksum64 of data given piece by piece (the same value as one call
 * over the pieces in order), so a pass over a buffer that does other work
 * on it block by block hashes it while each block is in cache. */
typedef struct dl_checksum_state dl_checksum_state;
dl_checksum_state *dl_checksum_begin(void); /* aborts when out of memory (a few hundred bytes) */
void dl_checksum_update(dl_checksum_state *st, const void *data, size_t len);
/* The checksum of everything given so far; frees st. */
uint64_t dl_checksum_end(dl_checksum_state *st);

#endif
