/* The payload pool: fragment-sized fp32 buffers counted in bytes, and the
 * table of pooled pushes their rounds refer to by handle. */
#include "synchronizer/pool.h"

#include "core/err.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct dl_pool {
    int max_spans;
    uint64_t *numel;      /* [P] elements per fragment */
    dl_pool_push *pend;   /* indexed by handle */
    size_t npend, cappend;
    uint64_t used, peak;  /* bytes of buffers handed out (pooled deltas + arriving chunked pushes) */
    /* buffers given back, for the next push of any fragment: no allocation
     * and no page faults per push. Every buffer holds the largest fragment
     * (the plan balances fragments: GPT-2 124M's 24 differ by 0.015%, the
     * widest seen, L=6 C=384 at P=16, 1.5x between smallest and largest, so
     * a buffer's memory can exceed the fragment bytes `used` counts by that
     * much), so a spare serves whichever fragment comes next; spares kept
     * per fragment sat unused while the fleet pushed the others (sync_load:
     * 975 MB of spares, 47 reused of 591 buffers) */
    float **spare;        /* [nspare] */
    int nspare, capspare;
    uint64_t buf_bytes;   /* each buffer's size: the largest fragment's fp32 bytes */
    uint64_t spare_bytes, keep; /* bytes of the spare buffers, and their bound */
    uint64_t reused, fresh;     /* buffers handed out from the spares, and newly allocated */
};

void dl_pool_set_keep(dl_pool *pool, uint64_t bytes)
{
    pool->keep = bytes;
    while (pool->nspare && pool->spare_bytes > pool->keep) {
        free(pool->spare[--pool->nspare]);
        pool->spare_bytes -= pool->buf_bytes;
    }
}

uint64_t dl_pool_spare_bytes(const dl_pool *pool) { return pool->spare_bytes; }
uint64_t dl_pool_reused(const dl_pool *pool) { return pool->reused; }
uint64_t dl_pool_fresh(const dl_pool *pool) { return pool->fresh; }

/* A buffer for a push of any fragment: a spare one, else a new one. */
static float *take(dl_pool *pool)
{
    if (pool->nspare) {
        pool->spare_bytes -= pool->buf_bytes;
        pool->reused++;
        return pool->spare[--pool->nspare];
    }
    pool->fresh++;
    return dl_xaligned(64, pool->buf_bytes);
}

/* A buffer back: kept as a spare while the spares stay within keep. */
static void give(dl_pool *pool, float *buf)
{
    if (pool->spare_bytes + pool->buf_bytes > pool->keep) {
        free(buf);
        return;
    }
    if (pool->nspare == pool->capspare) {
        pool->capspare = pool->capspare ? 2 * pool->capspare : 16;
        pool->spare = dl_xrealloc(pool->spare, (size_t)pool->capspare * sizeof *pool->spare);
    }
    pool->spare[pool->nspare++] = buf;
    pool->spare_bytes += pool->buf_bytes;
}

int dl_pool_open(int P, const uint64_t *numel, int max_spans, dl_pool **out)
{
    dl_pool *pool = dl_xcalloc(1, sizeof *pool);
    pool->max_spans = max_spans > 0 ? max_spans : 1;
    pool->numel = dl_xcalloc((size_t)(P > 0 ? P : 1), sizeof *pool->numel);
    if (P > 0) memcpy(pool->numel, numel, (size_t)P * sizeof *numel);
    for (int p = 0; p < P; p++)
        if (numel[p] * sizeof(float) > pool->buf_bytes) pool->buf_bytes = numel[p] * sizeof(float);
    if (!pool->buf_bytes) pool->buf_bytes = sizeof(float);
    *out = pool;
    return 0;
}

void dl_pool_close(dl_pool **pp)
{
    if (!pp || !*pp) return;
    dl_pool *pool = *pp;
    for (size_t i = 0; i < pool->npend; i++) {
        free(pool->pend[i].delta);
        free(pool->pend[i].span_ss);
    }
    for (int i = 0; i < pool->nspare; i++) free(pool->spare[i]);
    free(pool->spare);
    free(pool->pend);
    free(pool->numel);
    free(pool);
    *pp = NULL;
}

float *dl_pool_alloc(dl_pool *pool, int p)
{
    pool->used += pool->numel[p] * sizeof(float);
    if (pool->used > pool->peak) pool->peak = pool->used;
    return take(pool);
}

void dl_pool_free(dl_pool *pool, int p, float *buf)
{
    if (!buf) return;
    assert(pool->used >= pool->numel[p] * sizeof(float));
    pool->used -= pool->numel[p] * sizeof(float);
    give(pool, buf);
}

float *dl_pool_alloc_arriving(dl_pool *pool) { return take(pool); }

void dl_pool_count(dl_pool *pool, uint64_t bytes)
{
    pool->used += bytes;
    if (pool->used > pool->peak) pool->peak = pool->used;
}

void dl_pool_free_arriving(dl_pool *pool, float *buf, uint64_t counted)
{
    if (!buf) return;
    assert(pool->used >= counted);
    pool->used -= counted;
    give(pool, buf);
}

uint64_t dl_pool_add(dl_pool *pool)
{
    for (size_t i = 0; i < pool->npend; i++)
        if (!pool->pend[i].used) return i;
    if (pool->npend == pool->cappend) {
        pool->cappend = pool->cappend ? pool->cappend * 2 : 64;
        pool->pend = dl_xrealloc(pool->pend, pool->cappend * sizeof *pool->pend);
    }
    memset(&pool->pend[pool->npend], 0, sizeof pool->pend[0]);
    pool->pend[pool->npend].span_ss = dl_xcalloc((size_t)pool->max_spans, sizeof(double));
    return pool->npend++;
}

dl_pool_push *dl_pool_get(dl_pool *pool, uint64_t h)
{
    assert(h < pool->npend);
    return &pool->pend[h];
}

void dl_pool_release(dl_pool *pool, uint64_t h)
{
    assert(h < pool->npend && pool->pend[h].used);
    dl_pool_free(pool, pool->pend[h].fragment, pool->pend[h].delta);
    pool->pend[h].delta = NULL;
    pool->pend[h].used = 0;
}

size_t dl_pool_handles(const dl_pool *pool) { return pool->npend; }
uint64_t dl_pool_used(const dl_pool *pool) { return pool->used; }
uint64_t dl_pool_peak(const dl_pool *pool) { return pool->peak; }
