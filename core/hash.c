/* dl_hash64 is XXH64 and dl_checksum64 XXH3_64bits, both from libxxhash
 * (Debian's libxxhash-dev) compiled in from its header: no shared library at
 * run time, and XXH3 uses the vector unit this build targets (-march=native:
 * AVX2/AVX-512), which the shared library's baseline build does not.
 * dl_hash64's output is the published XXH64's, bit for bit the hand-written
 * code it replaced (tests/xxh64_ref.c, checked by tests/test_hash.c):
 * fingerprints, checkpoints and data splits keep their values. The bulk
 * checksums moved to XXH3 (bench/hash.c has the figures), a format change:
 * wire protocol version 2, store schema 4. */
#include "core/hash.h"

#include "core/err.h"

#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t dl_hash64(const void *data, size_t len, uint64_t seed) { return XXH64(data, len, seed); }
uint64_t dl_checksum64(const void *data, size_t len) { return XXH3_64bits(data, len); }

struct dl_checksum_state {
    XXH3_state_t x; /* 64-byte aligned */
};

dl_checksum_state *dl_checksum_begin(void)
{
    dl_checksum_state *st = dl_xaligned(64, sizeof *st);
    XXH3_64bits_reset(&st->x);
    return st;
}

void dl_checksum_update(dl_checksum_state *st, const void *data, size_t len) { XXH3_64bits_update(&st->x, data, len); }

uint64_t dl_checksum_end(dl_checksum_state *st)
{
    uint64_t h = XXH3_64bits_digest(&st->x);
    free(st);
    return h;
}
