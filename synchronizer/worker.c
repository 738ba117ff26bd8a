/* Worker thread: a FIFO of jobs under one mutex; merges write the new global
 * into scratch buffers and swap them with the in-memory global (and the
 * downlink residual) only after their commit; store writes that fail for a transient cause are
 * retried. */
#include "synchronizer/worker.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/log.h"
#include "synchronizer/guard.h"

/* A store write that fails with DL_EAGAIN (the map had to grow while
 * snapshots stayed open past the store's grow_wait_ms) wrote nothing and may
 * run again: up to WRITE_RETRIES more times, RETRY_MS0 ms after the first
 * failure and twice as long after each next one, at most RETRY_MS_MAX. */
#define WRITE_RETRIES 10
#define RETRY_MS0 10
#define RETRY_MS_MAX 1000

struct dl_worker {
    dl_store *store;
    const dl_plan *plan;
    float **params, **momentum;
    void (*wake)(void *);
    void *wake_ctx;
    /* [max fragment numel], worker thread only; after a commit the new global's buffers and these swap */
    float *scratch_merged, *scratch_params, *scratch_mom;
    uint64_t *sums;       /* [blocks of the largest fragment] the store block checksums of scratch_params */
    dl_codec_enc enc;     /* downlink codec; enc.c.id 0 = off */
    float **resid;        /* [P] downlink residual e_p, [max fragment numel] each, allocated at p's first encoded
                             merge (it and scratch_resid swap) */
    float *scratch_resid; /* [max fragment numel]: e_p while its merge is not committed */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dl_job *todo_head, *todo_tail, *done_head, *done_tail; /* guarded by mu */
    int quit;     /* guarded by mu */
    int inflight; /* guarded by mu */
};

dl_job *dl_job_new(dl_job_kind kind)
{
    dl_job *j = dl_xcalloc(1, sizeof *j);
    j->kind = kind;
    return j;
}

void dl_job_free(dl_job *j)
{
    if (!j) return;
    free(j->deltas);
    free(j->span_ss);
    free(j->w);
    free(j->handles);
    free(j->rec.contrib);
    free(j->lrecs);
    free(j->update);
    free(j);
}

static const char *job_name(dl_job_kind k)
{
    switch (k) {
    case DL_JOB_MERGE: return "merge commit";
    case DL_JOB_LEARNER_PUT: return "registry write";
    case DL_JOB_LEDGER: return "ledger write";
    case DL_JOB_SYNC: return "sync";
    case DL_JOB_EVAL: return "evaluation record";
    }
    return "?";
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

static float *aligned_floats(size_t n) { return dl_xaligned(64, n * sizeof(float)); }

/* A merge keeps an outer momentum only when its step has one: at momentum 0
 * none is read, written or stored (kernels/outer.h, storage/store.h). */
static int with_momentum(const dl_job *j) { return j->mopts.outer_momentum != 0.0f; }

static void swap(float **a, float **b)
{
    float *t = *a;
    *a = *b;
    *b = t;
}

/* One store write of job j, retried while it fails for a transient cause. */
static int store_write_retried(dl_worker *w, dl_job *j)
{
    for (int ms = RETRY_MS0;; ms = ms * 2 < RETRY_MS_MAX ? ms * 2 : RETRY_MS_MAX) {
        dl_err_clear();
        int rc = 0;
        switch (j->kind) {
        case DL_JOB_MERGE:
            rc = dl_store_commit_merge_sums(w->store, (uint32_t)j->fragment, j->version + 1, w->scratch_params,
                                            w->sums, with_momentum(j) ? w->scratch_mom : NULL, &j->rec, &j->ledger);
            break;
        case DL_JOB_LEARNER_PUT:
            rc = j->nlrecs ? dl_store_learner_put_many(w->store, j->lrecs, j->nlrecs)
                           : dl_store_learner_put(w->store, &j->lrec);
            break;
        case DL_JOB_LEDGER: rc = dl_store_ledger_add(w->store, &j->ledger); break;
        case DL_JOB_SYNC: rc = dl_store_sync(w->store); break;
        case DL_JOB_EVAL: rc = dl_store_put_eval(w->store, &j->erec); break;
        }
        if (rc != DL_EAGAIN || j->retries >= WRITE_RETRIES) return rc;
        j->retries++;
        if (j->kind == DL_JOB_MERGE)
            DL_WARN("%s of fragment %d onto v%llu: %s; retry %d of %d in %d ms", job_name(j->kind), j->fragment,
                    (unsigned long long)j->version, dl_errmsg(), j->retries, WRITE_RETRIES, ms);
        else
            DL_WARN("%s: %s; retry %d of %d in %d ms", job_name(j->kind), dl_errmsg(), j->retries, WRITE_RETRIES, ms);
        nap_ms(ms);
    }
}

/* ... and its time, retries included: the LMDB commit latency of a merge */
static int store_write(dl_worker *w, dl_job *j)
{
    int64_t t0 = dl_clock_ns();
    int rc = store_write_retried(w, j);
    j->store_s = (double)(dl_clock_ns() - t0) * 1e-9;
    return rc;
}

/* The downlink: scratch_params holds the outer step's G' of fragment p; the
 * delta x = G' - G (G = params[p], the committed global) is encoded with
 * fragment p's residual (the new residual into scratch_resid: e_p changes
 * only with the commit), and scratch_params becomes G_new = G + decode(payload),
 * one fp32 add per element, exactly what a learner applying the payload onto G
 * computes: dl_codec_encode_step, tile by tile, each array read from memory
 * once. 0, or -1 with j->rc / j->err set (nothing to commit). */
static int encode_update(dl_worker *w, dl_job *j, int p, size_t n)
{
    const float *g = w->params[p];
    uint64_t bytes = dl_codec_bytes(&w->enc.c, n);
    if (!bytes) DL_PANIC("downlink codec %s: no payload size for %zu elements", dl_codec_name(w->enc.c.id), n);
    uint8_t *out = dl_xmalloc((size_t)bytes);
    /* stochastic rounding: a fresh stream per fragment and version */
    dl_codec_enc e = w->enc;
    uint64_t key[2] = {(uint64_t)p, j->version + 1};
    e.seed = dl_hash64(key, sizeof key, w->enc.seed);
    if (dl_codec_encode_step(&e, w->scratch_params, g, w->resid[p], w->scratch_resid, n, out)) {
        free(out);
        j->rc = DL_ECORRUPT;
        snprintf(j->err, sizeof j->err, "merged delta not encodable as %s (%s); not committed",
                 dl_codec_name(w->enc.c.id), dl_errmsg());
        return -1;
    }
    j->update = out;
    j->update_bytes = (size_t)bytes;
    j->update_codec = w->enc.c;
    return 0;
}

/* A merge that is not committed sends nothing: its payload goes. */
static void drop_update(dl_job *j)
{
    free(j->update);
    j->update = NULL;
    j->update_bytes = 0;
}

static void run_merge(dl_worker *w, dl_job *j)
{
    int p = j->fragment;
    size_t n = dl_plan_fragment_numel(w->plan, p);
    int mom = with_momentum(j);
    if (mom) {
        size_t maxn = dl_plan_max_fragment_numel(w->plan);
        if (!w->momentum[p]) { /* turned on by a reload (or none was loaded): it starts at zero */
            w->momentum[p] = aligned_floats(maxn);
            memset(w->momentum[p], 0, maxn * sizeof(float));
        }
        if (!w->scratch_mom) w->scratch_mom = aligned_floats(maxn);
    }
    /* the step from the committed global into the scratch buffers (out of place: no copy in) */
    j->norm = dl_merge_apply_to(w->plan, p, &j->mopts, j->deltas, j->w, (const double *const *)j->span_ss, j->m,
                                j->mopts.share_scaling ? j->share : 1.0, w->scratch_merged, w->params[p],
                                mom ? w->momentum[p] : NULL, w->scratch_params, mom ? w->scratch_mom : NULL);
    j->rec.delta_norm = j->norm;
    j->rec.wallclock_ns = dl_wallclock_ns();
    if (w->enc.c.id && encode_update(w, j, p, n)) return;
    /* the last guard: a poisoned global is never persisted; in the same pass
     * its norm, its checksum (the merge event's hash) and the store's block
     * checksums, each block read once */
    char why[200];
    uint64_t hash = 0;
    if (dl_guard_params_scan(j->param_abs_max, p, w->scratch_params, n, DL_STORE_BLOCK_FLOATS, &j->param_norm, &hash,
                             w->sums, why, sizeof why)) {
        j->rc = DL_ECORRUPT;
        snprintf(j->err, sizeof j->err, "merged %s; not committed", why);
        drop_update(j);
        return;
    }
    j->rc = store_write(w, j);
    if (j->rc) {
        j->store_failed = 1;
        snprintf(j->err, sizeof j->err, "%s", dl_errmsg());
        drop_update(j);
        return;
    }
    /* committed: the in-memory global follows (the loop reads it only after
     * this job is back, and no other job of fragment p is in flight), and so
     * does the residual: the buffers swap (each holds the largest fragment),
     * no copy back */
    swap(&w->params[p], &w->scratch_params);
    if (mom) {
        swap(&w->momentum[p], &w->scratch_mom);
    } else { /* committed without it (turned off by a reload): its memory goes */
        free(w->momentum[p]);
        w->momentum[p] = NULL;
    }
    j->hash = hash;
    if (j->update) {
        if (!w->resid[p]) w->resid[p] = aligned_floats(dl_plan_max_fragment_numel(w->plan));
        swap(&w->resid[p], &w->scratch_resid);
    }
}

static void run(dl_worker *w, dl_job *j)
{
    dl_err_clear();
    if (j->kind == DL_JOB_MERGE) {
        run_merge(w, j);
        return;
    }
    j->rc = store_write(w, j);
    if (j->rc) snprintf(j->err, sizeof j->err, "%s", dl_errmsg());
}

static void *worker_main(void *arg)
{
    dl_worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->todo_head && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        dl_job *j = w->todo_head;
        if (!j) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        w->todo_head = j->next;
        if (!w->todo_head) w->todo_tail = NULL;
        pthread_mutex_unlock(&w->mu);
        int64_t t0 = dl_clock_ns();
        run(w, j);
        j->work_s = (double)(dl_clock_ns() - t0) * 1e-9;
        pthread_mutex_lock(&w->mu);
        j->next = NULL;
        if (w->done_tail) w->done_tail->next = j;
        else w->done_head = j;
        w->done_tail = j;
        pthread_mutex_unlock(&w->mu);
        w->wake(w->wake_ctx);
    }
}

int dl_worker_open(dl_store *store, const dl_plan *plan, float **params, float **momentum,
                   void (*wake)(void *ctx), void *wake_ctx, dl_worker **out)
{
    dl_worker *w = dl_xcalloc(1, sizeof *w);
    w->store = store;
    w->plan = plan;
    w->params = params;
    w->momentum = momentum;
    w->wake = wake;
    w->wake_ctx = wake_ctx;
    size_t maxn = dl_plan_max_fragment_numel(plan);
    w->scratch_merged = aligned_floats(maxn);
    w->scratch_params = aligned_floats(maxn);
    w->scratch_mom = NULL; /* at the first merge with an outer momentum */
    w->sums = dl_xcalloc(dl_store_blocks(maxn) ? dl_store_blocks(maxn) : 1, sizeof *w->sums);
    w->resid = dl_xcalloc((size_t)dl_plan_P(plan), sizeof *w->resid);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) DL_PANIC("cannot start the merge worker");
    *out = w;
    return 0;
}

void dl_worker_close(dl_worker **wp)
{
    if (!wp || !*wp) return;
    dl_worker *w = *wp;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    while (w->done_head) { /* jobs the worker finished but the loop never took back */
        dl_job *j = w->done_head;
        w->done_head = j->next;
        dl_job_free(j);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->scratch_merged);
    free(w->scratch_params);
    free(w->scratch_mom);
    free(w->scratch_resid);
    free(w->sums);
    for (int p = 0; p < dl_plan_P(w->plan); p++) free(w->resid[p]);
    free(w->resid);
    free(w);
    *wp = NULL;
}

void dl_worker_set_update_codec(dl_worker *w, const dl_codec_enc *e)
{
    assert(!w->inflight && (!e->c.id || dl_codec_check(&e->c, NULL, 0) == 0));
    w->enc = *e;
    if (e->c.id && !w->scratch_resid) w->scratch_resid = aligned_floats(dl_plan_max_fragment_numel(w->plan));
}

const float *dl_worker_residual(const dl_worker *w, int p)
{
    assert(p >= 0 && p < dl_plan_P(w->plan));
    return w->resid[p];
}

void dl_worker_submit(dl_worker *w, dl_job *j)
{
    pthread_mutex_lock(&w->mu);
    j->next = NULL;
    if (w->todo_tail) w->todo_tail->next = j;
    else w->todo_head = j;
    w->todo_tail = j;
    w->inflight++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

dl_job *dl_worker_done(dl_worker *w)
{
    pthread_mutex_lock(&w->mu);
    dl_job *j = w->done_head;
    if (j) {
        w->done_head = j->next;
        if (!w->done_head) w->done_tail = NULL;
        w->inflight--;
    }
    pthread_mutex_unlock(&w->mu);
    return j;
}

int dl_worker_inflight(dl_worker *w)
{
    pthread_mutex_lock(&w->mu);
    int n = w->inflight;
    pthread_mutex_unlock(&w->mu);
    return n;
}
