/* The payload pool: fragment-sized fp32 buffers counted in bytes, and the
 * table of pooled pushes their rounds refer to by handle. */
#include "synchronizer/pool.h"

#include "core/err.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct dl_pool {
    int P, max_spans;
    uint64_t *numel;      /* [P] elements per fragment */
    dl_pool_push *pend;   /* indexed by handle */
    size_t npend, cappend;
    uint64_t used, peak;  /* bytes of buffers handed out (pooled deltas + arriving chunked pushes) */
    /* buffers given back, per fragment, for the next push of that fragment: no
     * allocation and no page faults per push (a fragment-sized allocation is
     * an mmap the allocator gives back to the kernel when freed) */
    float ***spare;       /* [P][nspare[p]] */
    int *nspare, *capspare;
    uint64_t spare_bytes, keep; /* bytes of the spare buffers, and their bound */
    uint64_t reused, fresh;     /* buffers handed out from the spares, and newly allocated */
};

void dl_pool_set_keep(dl_pool *pool, uint64_t bytes)
{
    pool->keep = bytes;
    for (int p = 0; p < pool->P && pool->spare_bytes > pool->keep; p++)
        while (pool->nspare[p] && pool->spare_bytes > pool->keep) {
            free(pool->spare[p][--pool->nspare[p]]);
            pool->spare_bytes -= pool->numel[p] * sizeof(float);
        }
}

uint64_t dl_pool_spare_bytes(const dl_pool *pool) { return pool->spare_bytes; }
uint64_t dl_pool_reused(const dl_pool *pool) { return pool->reused; }
uint64_t dl_pool_fresh(const dl_pool *pool) { return pool->fresh; }

/* A fragment-sized buffer: a spare one, else a new one. */
static float *take(dl_pool *pool, int p)
{
    if (pool->nspare[p]) {
        pool->spare_bytes -= pool->numel[p] * sizeof(float);
        pool->reused++;
        return pool->spare[p][--pool->nspare[p]];
    }
    pool->fresh++;
    return dl_xaligned(64, pool->numel[p] * sizeof(float));
}

/* A buffer of fragment p back: kept as a spare while the spares stay within keep. */
static void give(dl_pool *pool, int p, float *buf)
{
    uint64_t b = pool->numel[p] * sizeof(float);
    if (pool->spare_bytes + b > pool->keep) {
        free(buf);
        return;
    }
    if (pool->nspare[p] == pool->capspare[p]) {
        pool->capspare[p] = pool->capspare[p] ? 2 * pool->capspare[p] : 4;
        pool->spare[p] = dl_xrealloc(pool->spare[p], (size_t)pool->capspare[p] * sizeof **pool->spare);
    }
    pool->spare[p][pool->nspare[p]++] = buf;
    pool->spare_bytes += b;
}

int dl_pool_open(int P, const uint64_t *numel, int max_spans, dl_pool **out)
{
    dl_pool *pool = dl_xcalloc(1, sizeof *pool);
    pool->P = P;
    pool->max_spans = max_spans > 0 ? max_spans : 1;
    pool->numel = dl_xcalloc((size_t)(P > 0 ? P : 1), sizeof *pool->numel);
    if (P > 0) memcpy(pool->numel, numel, (size_t)P * sizeof *numel);
    pool->spare = dl_xcalloc((size_t)(P > 0 ? P : 1), sizeof *pool->spare);
    pool->nspare = dl_xcalloc((size_t)(P > 0 ? P : 1), sizeof *pool->nspare);
    pool->capspare = dl_xcalloc((size_t)(P > 0 ? P : 1), sizeof *pool->capspare);
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
    for (int p = 0; p < pool->P; p++) {
        for (int i = 0; i < pool->nspare[p]; i++) free(pool->spare[p][i]);
        free(pool->spare[p]);
    }
    free(pool->spare);
    free(pool->nspare);
    free(pool->capspare);
    free(pool->pend);
    free(pool->numel);
    free(pool);
    *pp = NULL;
}

float *dl_pool_alloc(dl_pool *pool, int p)
{
    pool->used += pool->numel[p] * sizeof(float);
    if (pool->used > pool->peak) pool->peak = pool->used;
    return take(pool, p);
}

void dl_pool_free(dl_pool *pool, int p, float *buf)
{
    if (!buf) return;
    assert(pool->used >= pool->numel[p] * sizeof(float));
    pool->used -= pool->numel[p] * sizeof(float);
    give(pool, p, buf);
}

float *dl_pool_alloc_arriving(dl_pool *pool, int p) { return take(pool, p); }

void dl_pool_count(dl_pool *pool, uint64_t bytes)
{
    pool->used += bytes;
    if (pool->used > pool->peak) pool->peak = pool->used;
}

void dl_pool_free_arriving(dl_pool *pool, int p, float *buf, uint64_t counted)
{
    if (!buf) return;
    assert(pool->used >= counted);
    pool->used -= counted;
    give(pool, p, buf);
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
