/* The payload pool: fragment-sized fp32 buffers counted in bytes, and the
 * table of pooled pushes their rounds refer to by handle. */
#include "synchronizer/pool.h"

#include "core/err.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct dl_pool {
    int P;
    uint64_t *numel;      /* [P] elements per fragment */
    dl_pool_push *pend;   /* indexed by handle */
    size_t npend, cappend;
    uint64_t used, peak;  /* bytes of buffers handed out (pooled deltas + arriving chunked pushes) */
};

int dl_pool_open(int P, const uint64_t *numel, dl_pool **out)
{
    dl_pool *pool = dl_xcalloc(1, sizeof *pool);
    pool->P = P;
    pool->numel = dl_xcalloc((size_t)(P > 0 ? P : 1), sizeof *pool->numel);
    if (P > 0) memcpy(pool->numel, numel, (size_t)P * sizeof *numel);
    *out = pool;
    return 0;
}

void dl_pool_close(dl_pool **pp)
{
    if (!pp || !*pp) return;
    dl_pool *pool = *pp;
    for (size_t i = 0; i < pool->npend; i++) free(pool->pend[i].delta);
    free(pool->pend);
    free(pool->numel);
    free(pool);
    *pp = NULL;
}

float *dl_pool_alloc(dl_pool *pool, int p)
{
    pool->used += pool->numel[p] * sizeof(float);
    if (pool->used > pool->peak) pool->peak = pool->used;
    return dl_xaligned(64, pool->numel[p] * sizeof(float));
}

void dl_pool_free(dl_pool *pool, int p, float *buf)
{
    if (!buf) return;
    assert(pool->used >= pool->numel[p] * sizeof(float));
    pool->used -= pool->numel[p] * sizeof(float);
    free(buf);
}

float *dl_pool_alloc_arriving(dl_pool *pool, int p)
{
    return dl_xaligned(64, pool->numel[p] * sizeof(float));
}

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
    free(buf);
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
