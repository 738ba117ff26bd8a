/* Tests for synchronizer/pool.c: bytes counted as buffers are handed out and
 * given back, and the spare buffers reused by any fragment within their bound. */
#include "synchronizer/pool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/check.h"

static void test_spares(void)
{
    const uint64_t numel[2] = {1000, 3000}; /* 4000 and 12000 bytes */
    dl_pool *pool = NULL;
    REQUIRE(dl_pool_open(2, numel, 1, &pool) == 0, "open");
    /* no bound set: nothing is kept */
    float *a = dl_pool_alloc(pool, 0);
    CHECK(dl_pool_used(pool) == 4000, "used %llu", (unsigned long long)dl_pool_used(pool));
    dl_pool_free(pool, 0, a);
    CHECK(dl_pool_used(pool) == 0 && dl_pool_spare_bytes(pool) == 0, "without a bound the buffer goes");

    /* every buffer holds the largest fragment (12000 bytes): a bound of two
     * keeps two, a third goes */
    dl_pool_set_keep(pool, 24000);
    float *b0 = dl_pool_alloc(pool, 0), *b1 = dl_pool_alloc(pool, 1), *c1 = dl_pool_alloc(pool, 1);
    CHECK(dl_pool_used(pool) == 28000 && dl_pool_peak(pool) == 28000, "three out: %llu",
          (unsigned long long)dl_pool_used(pool));
    b0[2999] = 7.0f; /* a fragment 0 buffer holds fragment 1 too */
    dl_pool_free(pool, 1, b1);
    dl_pool_free(pool, 0, b0);
    dl_pool_free(pool, 1, c1); /* over the bound: freed */
    CHECK(dl_pool_used(pool) == 0 && dl_pool_spare_bytes(pool) == 24000, "spares %llu",
          (unsigned long long)dl_pool_spare_bytes(pool));
    uint64_t fresh = dl_pool_fresh(pool);
    /* a push of either fragment takes a spare, whichever fragment gave it back: no allocation */
    float *d1 = dl_pool_alloc(pool, 1);
    CHECK(d1 == b0 && dl_pool_fresh(pool) == fresh && dl_pool_reused(pool) == 1,
          "fragment 1 takes the spare fragment 0 gave back");
    d1[2999] = 1.0f;
    float *d0 = dl_pool_alloc_arriving(pool); /* an arriving push takes a spare as well */
    CHECK(d0 == b1 && dl_pool_spare_bytes(pool) == 0, "fragment 1's spare taken by an arriving push of fragment 0");
    float *e0 = dl_pool_alloc(pool, 0);
    CHECK(e0 != b0 && e0 != b1 && dl_pool_fresh(pool) == fresh + 1, "no spare left: a new buffer");
    /* an arriving push that stopped early gives back what was counted; its buffer is kept */
    dl_pool_count(pool, 1200);
    dl_pool_free_arriving(pool, d0, 1200);
    CHECK(dl_pool_used(pool) == 16000 && dl_pool_spare_bytes(pool) == 12000, "arriving given back: used %llu",
          (unsigned long long)dl_pool_used(pool));
    /* a lower bound frees spares down to it */
    dl_pool_free(pool, 1, d1);
    CHECK(dl_pool_spare_bytes(pool) == 24000, "both kept");
    dl_pool_set_keep(pool, 13000);
    CHECK(dl_pool_spare_bytes(pool) == 12000, "lowered bound: %llu", (unsigned long long)dl_pool_spare_bytes(pool));
    /* a pooled entry's delta goes back through release */
    uint64_t h = dl_pool_add(pool);
    dl_pool_push *pp = dl_pool_get(pool, h);
    pp->used = 1, pp->fragment = 0, pp->delta = e0;
    dl_pool_release(pool, h);
    CHECK(dl_pool_used(pool) == 0 && !dl_pool_get(pool, h)->used, "released");
    dl_pool_close(&pool); /* frees the spares (ASan: nothing leaks) */
    dl_pool_close(&pool);
    CHECK(pool == NULL, "closed");
}

int main(void)
{
    test_spares();
    return CHECK_DONE("test_pool");
}
