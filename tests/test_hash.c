/* dl_hash64 (core/hash.c, libxxhash's XXH64) gives the values the
 * hand-written XXH64 gave (tests/xxh64_ref.c), so fingerprints, checkpoints
 * and data splits did not change: the published vectors, a fixed table the
 * old code printed, and every length 0..1100 at several seeds and alignments
 * against the old code itself. dl_checksum64 (XXH3, compiled in with this
 * build's vector unit) against the published vector, a fixed table, and the
 * shared libxxhash (its baseline build) on every length 0..1100 and larger. */
#include "core/hash.h"

#include "tests/check.h"
#include "tests/xxh64_ref.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* buf[i] = i*31+7; printed by dl_xxh64_ref before core/hash.c changed */
static const struct {
    size_t len;
    uint64_t seed, want;
} gold[] = {
    {1, 0x0ULL, 0xa96c7f0ce858bbb7ULL},
    {3, 0x0ULL, 0x56e6957632a487f9ULL},
    {4, 0x0ULL, 0xc60d15b1e3ff8f04ULL},
    {7, 0x0ULL, 0xafbefc3d6c6f9a8eULL},
    {8, 0x0ULL, 0x3da5c7aa269683e0ULL},
    {31, 0x0ULL, 0x4a74f3a1a39ad4a1ULL},
    {32, 0x0ULL, 0x8d57d6a4671cc43dULL},
    {33, 0x0ULL, 0x62c9fd21ed857664ULL},
    {63, 0x0ULL, 0x5c320a0d2707057fULL},
    {64, 0x0ULL, 0x7bbabbc45729d17eULL},
    {100, 0x0ULL, 0xefa0ad2d3e70c151ULL},
    {1000, 0x0ULL, 0x99594f4828043d35ULL},
    {1, 0x1ULL, 0x0766883a0a47a96aULL},
    {3, 0x1ULL, 0x598afe4fbb09d9f6ULL},
    {4, 0x1ULL, 0x5e9f99aa13de2d02ULL},
    {7, 0x1ULL, 0xbd99f1fa0de7b9a4ULL},
    {8, 0x1ULL, 0x1b4e043a4021aa18ULL},
    {31, 0x1ULL, 0xd7ac4f4bea4e460aULL},
    {32, 0x1ULL, 0x8f666909cfd00cc8ULL},
    {33, 0x1ULL, 0xb1575979b72c805aULL},
    {63, 0x1ULL, 0x61b9cb220da77a86ULL},
    {64, 0x1ULL, 0xee10eee981202ce9ULL},
    {100, 0x1ULL, 0xcd8103aecd2ed5cfULL},
    {1000, 0x1ULL, 0x31db8080bc8eb541ULL},
    {1, 0x5eedULL, 0x6a4ad036701ea97eULL},
    {3, 0x5eedULL, 0x8e411e50460b757eULL},
    {4, 0x5eedULL, 0xcf93b933fa3755caULL},
    {7, 0x5eedULL, 0xa0f28e6baf8b8414ULL},
    {8, 0x5eedULL, 0x2a717502bf36d4d3ULL},
    {31, 0x5eedULL, 0x7da31b92021d9804ULL},
    {32, 0x5eedULL, 0xef2c389ca38f515dULL},
    {33, 0x5eedULL, 0x1e41d7227ce3caedULL},
    {63, 0x5eedULL, 0xa9ebd03fbb9576abULL},
    {64, 0x5eedULL, 0x330a71d98cd53f80ULL},
    {100, 0x5eedULL, 0x270cd055bbdf5040ULL},
    {1000, 0x5eedULL, 0xb09e4b03498cb22dULL},
    {1, 0x9e3779b185ebca87ULL, 0x0c810166b30122a5ULL},
    {3, 0x9e3779b185ebca87ULL, 0x45163cdc31e15be1ULL},
    {4, 0x9e3779b185ebca87ULL, 0xb000bcf3f8bcaefeULL},
    {7, 0x9e3779b185ebca87ULL, 0xe10f33af8c4758a3ULL},
    {8, 0x9e3779b185ebca87ULL, 0xcb4a80ecc7a094c6ULL},
    {31, 0x9e3779b185ebca87ULL, 0x659ec2b1252d56f5ULL},
    {32, 0x9e3779b185ebca87ULL, 0xf113d2457128cf6dULL},
    {33, 0x9e3779b185ebca87ULL, 0x84575b860242fe41ULL},
    {63, 0x9e3779b185ebca87ULL, 0x355cc1872a486c6eULL},
    {64, 0x9e3779b185ebca87ULL, 0xea2d5e8a98bec153ULL},
    {100, 0x9e3779b185ebca87ULL, 0xe10cfef3a9a0a5c5ULL},
    {1000, 0x9e3779b185ebca87ULL, 0xd79c60b94f81cbf0ULL},
};

/* XXH3_64bits of the same buf, printed by the shared libxxhash 0.8.1 */
static const struct {
    size_t len;
    uint64_t want;
} gold3[] = {
    {1, 0x4c5cca45d0f4811fULL},   {3, 0x15f7093b173d005cULL},   {4, 0xdca012f95811b6b9ULL},
    {8, 0xdec6a9a43575982eULL},   {16, 0x7e484c18d74895d0ULL},  {17, 0x208bde5ee2bed407ULL},
    {128, 0xf92b70eaa21a6288ULL}, {129, 0xf8f76713f2bb60faULL}, {240, 0xccc7375172c41f03ULL},
    {241, 0x0b3b630948ce4a00ULL}, {1000, 0x989765d0ea7a5ecdULL},
};

static void test_checksum64(const unsigned char *buf, const unsigned char *big, size_t nbig)
{
    CHECK(dl_checksum64("", 0) == 0x2d06800538d394c2ULL, "XXH3 of the empty string (published)");
    CHECK(dl_checksum64("abc", 3) == 0x78af5f94892f3950ULL, "XXH3 of \"abc\"");
    for (size_t i = 0; i < sizeof gold3 / sizeof gold3[0]; i++)
        CHECK(dl_checksum64(buf, gold3[i].len) == gold3[i].want, "XXH3 len %zu", gold3[i].len);
    int bad = 0;
    for (size_t off = 0; off < 8; off += 3)
        for (size_t len = 0; len + off <= nbig; len++) bad += dl_checksum64(big + off, len) != XXH3_64bits(big + off, len);
    CHECK(bad == 0, "%d lengths/alignments differ from the shared libxxhash", bad);
    /* a fragment-sized buffer: the long-input path with many stripes */
    size_t n = (size_t)5 << 20;
    unsigned char *x = malloc(n);
    REQUIRE(x, "malloc");
    for (size_t i = 0; i < n; i++) x[i] = (unsigned char)(i * 2654435761u >> 9);
    CHECK(dl_checksum64(x, n) == XXH3_64bits(x, n), "5 MiB agrees with the shared libxxhash");
    CHECK(dl_checksum64(x, n - 13) == XXH3_64bits(x, n - 13), "5 MiB - 13 agrees");
    /* piece by piece (the worker's fused pass over a fragment): the same value, whatever the pieces */
    static const size_t pieces[] = {1, 7, 64, 240, 65536, 1048576};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        dl_checksum_state *st = dl_checksum_begin();
        for (size_t off = 0; off < n - 13; off += pieces[k])
            dl_checksum_update(st, x + off, off + pieces[k] <= n - 13 ? pieces[k] : n - 13 - off);
        CHECK(dl_checksum_end(st) == dl_checksum64(x, n - 13), "pieces of %zu bytes: the one-call value", pieces[k]);
    }
    dl_checksum_state *st = dl_checksum_begin();
    CHECK(dl_checksum_end(st) == dl_checksum64("", 0), "no piece: the empty input's value");
    free(x);
}

int main(void)
{
    static unsigned char buf[1000], big[1100 + 8];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 31 + 7);
    CHECK(dl_hash64("", 0, 0) == 0xef46db3751d8e999ULL, "XXH64 of the empty string (published)");
    CHECK(dl_hash64("abc", 3, 0) == 0x44bc2cf5ad770999ULL, "XXH64 of \"abc\" (published)");
    for (size_t i = 0; i < sizeof gold / sizeof gold[0]; i++) {
        uint64_t h = dl_hash64(buf, gold[i].len, gold[i].seed);
        CHECK(h == gold[i].want, "len %zu seed %llx: %016llx, was %016llx", gold[i].len,
              (unsigned long long)gold[i].seed, (unsigned long long)h, (unsigned long long)gold[i].want);
        CHECK(dl_xxh64_ref(buf, gold[i].len, gold[i].seed) == gold[i].want, "the reference reproduces its table");
    }
    for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 2654435761u >> 11);
    static const uint64_t seeds[] = {0, 1, 0x63686173ULL, ~0ULL};
    int bad = 0;
    for (int s = 0; s < 4; s++)
        for (size_t off = 0; off < 8; off += 3)
            for (size_t len = 0; len <= 1100; len++)
                bad += dl_hash64(big + off, len, seeds[s]) != dl_xxh64_ref(big + off, len, seeds[s]);
    CHECK(bad == 0, "%d of %d (length, seed, alignment) cases differ from the old code", bad, 4 * 3 * 1101);
    test_checksum64(buf, big, sizeof big);
    /* chained through the seed, as the fingerprint and checkpoints use it */
    uint64_t a = dl_hash64(buf, 500, 1), b = dl_xxh64_ref(buf, 500, 1);
    CHECK(dl_hash64(buf + 500, 500, a) == dl_xxh64_ref(buf + 500, 500, b), "chained hashes agree");
    printf("test_hash: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
