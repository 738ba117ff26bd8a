/* The payload pool: pushes that passed the guards wait here, as fp32 deltas,
 * for their round; arriving chunked pushes take their room from it too. */
#ifndef DL_SYNCHRONIZER_POOL_H
#define DL_SYNCHRONIZER_POOL_H

#include <stddef.h>
#include <stdint.h>

/* A pooled push: its payload waits for its round. Handles index these
 * entries; a handle stays valid until dl_pool_release. */
typedef struct {
    int used;
    float *delta;      /* aligned copy of the payload */
    uint32_t learner;  /* registry slot */
    int fragment;
    uint64_t base_version, tokens;
    uint64_t steps;    /* Push.steps: a copy of the push (same base, no more steps) is refused */
    int merging;       /* its round was handed to the merge worker (it can no longer be replaced) */
    double compute_s;  /* the learner's training seconds behind the delta (Push.compute_s) */
    double *span_ss;   /* [the fragment's spans] sums of the delta's squares per span (core/plan.h), gathered as it
                        * arrived: RDA's norms without another pass over the delta; the pool's, kept with the entry */
} dl_pool_push;

typedef struct dl_pool dl_pool;

/* A pool for P fragments of numel[p] elements (copied), whose pushes carry
 * at most max_spans span sums (dl_pool_push.span_ss). 0. */
int dl_pool_open(int P, const uint64_t *numel, int max_spans, dl_pool **out);
/* Frees every pooled delta and spare buffer (not the buffers handed out and
 * not pooled: their owner frees them); safe twice. */
void dl_pool_close(dl_pool **pp);

/* Pool memory: a delta buffer of fragment p's size, counted in the bytes
 * used (the caller checked the room against its bound). */
float *dl_pool_alloc(dl_pool *pool, int p);
/* Gives back a buffer of dl_pool_alloc for fragment p (NULL: nothing). */
void dl_pool_free(dl_pool *pool, int p, float *buf);
/* A buffer for a chunked push arriving (any fragment's) that counts only
 * what has arrived (dl_pool_count), so a push that stops early holds the
 * room of its chunks, not of its fragment. Once all of it is counted it is an
 * ordinary buffer of dl_pool_alloc. */
float *dl_pool_alloc_arriving(dl_pool *pool);
/* `bytes` more of an arriving push came (fp32 bytes, as it is kept). */
void dl_pool_count(dl_pool *pool, uint64_t bytes);
/* Gives back an arriving buffer of which `counted` bytes were counted (NULL: nothing). */
void dl_pool_free_arriving(dl_pool *pool, float *buf, uint64_t counted);

/* Buffers given back are kept for the next pushes of any fragment (each
 * buffer holds the largest fragment; no allocation, no page faults per
 * push), at most `bytes` of them in all (the pool's bound: the spares and the
 * buffers in use then stay within twice it); 0 (the default) keeps none.
 * Setting a lower bound frees spares. */
void dl_pool_set_keep(dl_pool *pool, uint64_t bytes);
/* Bytes of spare buffers now; buffers handed out from the spares, and newly allocated, so far. */
uint64_t dl_pool_spare_bytes(const dl_pool *pool);
uint64_t dl_pool_reused(const dl_pool *pool);
uint64_t dl_pool_fresh(const dl_pool *pool);

/* A free handle: its entry is zeroed and unused until the caller fills it
 * and sets used (an entry left unused is handed out again). */
uint64_t dl_pool_add(dl_pool *pool);
/* The entry of handle h (h < dl_pool_handles). */
dl_pool_push *dl_pool_get(dl_pool *pool, uint64_t h);
/* Frees a used entry's delta (dl_pool_free) and marks it unused. */
void dl_pool_release(dl_pool *pool, uint64_t h);
/* Handles handed out so far: entries [0, n) may be used. */
size_t dl_pool_handles(const dl_pool *pool);

/* Bytes of pooled deltas and arriving chunked pushes now, and their peak. */
uint64_t dl_pool_used(const dl_pool *pool);
uint64_t dl_pool_peak(const dl_pool *pool);

#endif
