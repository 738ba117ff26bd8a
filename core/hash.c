/* dl_hash64 is XXH64 from libxxhash (Debian's libxxhash-dev), compiled in
 * from its header so no shared library is needed at run time. Its output is
 * the published XXH64's, bit for bit the hand-written code it replaced
 * (tests/xxh64_ref.c, checked by tests/test_hash.c): stores, the wire,
 * fingerprints and checkpoints keep their values. XXH3 would be ~1.5x
 * faster here but changes every checksum (bench/hash.c says by how much and
 * what it would take). */
#include "core/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t dl_hash64(const void *data, size_t len, uint64_t seed) { return XXH64(data, len, seed); }
