/* Error feedback of a learner's encoded pushes: the committed and pending
 * residuals per fragment and the decision rules of learner/ef.h. */
#include "learner/ef.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "learner/mailbox.h"

typedef struct {
    float *committed;  /* [numel] NULL until the first push */
    float *pending;    /* [numel] */
    int zero;          /* committed is all zeros (not read, not written until the next encode) */
    int has_pending;
    uint64_t pending_base;
} eff;

struct dl_ef {
    int P, on;
    /* the session thread moves the residuals, the training thread snapshots them for a save */
    pthread_mutex_t mu;
    uint64_t *numel; /* [P] */
    eff *f;          /* [P] */
};

int dl_ef_open(int P, const uint64_t *numel, int on, dl_ef **out)
{
    assert(out);
    *out = NULL;
    if (P < 1 || !numel) return dl_err(DL_EINVAL, "ef: %d fragments", P);
    dl_ef *e = dl_try_calloc(1, sizeof *e);
    if (!e) return dl_err(DL_ENOMEM, "ef: out of memory");
    e->P = P;
    e->on = on != 0;
    e->numel = dl_try_calloc((size_t)P, sizeof *e->numel);
    e->f = dl_try_calloc((size_t)P, sizeof *e->f);
    if (!e->numel || !e->f) {
        dl_ef_close(&e);
        return dl_err(DL_ENOMEM, "ef: out of memory");
    }
    memcpy(e->numel, numel, (size_t)P * sizeof *numel);
    pthread_mutex_init(&e->mu, NULL);
    for (int p = 0; p < P; p++) e->f[p].zero = 1;
    *out = e;
    return 0;
}

void dl_ef_close(dl_ef **ep)
{
    if (!ep || !*ep) return;
    dl_ef *e = *ep;
    if (e->numel && e->f) pthread_mutex_destroy(&e->mu);
    for (int p = 0; e->f && p < e->P; p++) {
        free(e->f[p].committed);
        free(e->f[p].pending);
    }
    free(e->f);
    free(e->numel);
    free(e);
    *ep = NULL;
}

/* The two residuals of p, allocated at its first use. Under the lock. */
static int alloc_frag(dl_ef *e, int p)
{
    eff *f = &e->f[p];
    size_t n = (size_t)e->numel[p];
    if (f->committed) return 0;
    f->committed = dl_try_malloc(n * sizeof(float));
    f->pending = dl_try_malloc(n * sizeof(float));
    if (!f->committed || !f->pending) {
        free(f->committed), free(f->pending);
        f->committed = f->pending = NULL;
        return dl_err(DL_ENOMEM, "error feedback of fragment %d (2 x %zu floats): out of memory", p, n);
    }
    return 0;
}

int dl_ef_encode(dl_ef *e, const dl_codec_enc *enc, int p, const float *x, uint64_t base_version, uint8_t *out)
{
    assert(e && enc && x && out && p >= 0 && p < e->P);
    eff *f = &e->f[p];
    size_t n = (size_t)e->numel[p];
    pthread_mutex_lock(&e->mu);
    f->has_pending = 0;
    int rc = e->on ? alloc_frag(e, p) : dl_codec_encode(enc, x, NULL, n, 0, out);
    if (e->on && !rc) {
        if (f->zero) memset(f->pending, 0, n * sizeof(float));
        else memcpy(f->pending, f->committed, n * sizeof(float));
        rc = dl_codec_encode(enc, x, f->pending, n, 0, out);
        if (!rc) {
            f->has_pending = 1;
            f->pending_base = base_version;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static void reset_locked(dl_ef *e, int p)
{
    e->f[p].zero = 1;
    e->f[p].has_pending = 0;
}

void dl_ef_reset(dl_ef *e, int p)
{
    assert(e && p >= 0 && p < e->P);
    pthread_mutex_lock(&e->mu);
    reset_locked(e, p);
    pthread_mutex_unlock(&e->mu);
}

void dl_ef_forget(dl_ef *e, int p)
{
    assert(e && p >= 0 && p < e->P);
    pthread_mutex_lock(&e->mu);
    e->f[p].has_pending = 0;
    pthread_mutex_unlock(&e->mu);
}

void dl_ef_decided(dl_ef *e, int p, int decision, int rebase, uint64_t base_version)
{
    assert(e && p >= 0 && p < e->P);
    eff *f = &e->f[p];
    if (decision == DL_DECIDE_PENDING) return;
    pthread_mutex_lock(&e->mu);
    if (decision == DL_DECIDE_DROPPED || rebase) {
        reset_locked(e, p);
    } else {
        if (decision == DL_DECIDE_ACCEPTED && f->has_pending && f->pending_base == base_version) {
            float *t = f->committed;
            f->committed = f->pending;
            f->pending = t;
            f->zero = 0;
        }
        f->has_pending = 0; /* REJECTED: committed unchanged */
    }
    pthread_mutex_unlock(&e->mu);
}

int dl_ef_snapshot(dl_ef *e, int p, float *out)
{
    assert(e && out && p >= 0 && p < e->P);
    eff *f = &e->f[p];
    pthread_mutex_lock(&e->mu);
    const float *r = !e->on ? NULL : f->has_pending ? f->pending : f->zero ? NULL : f->committed;
    if (r) memcpy(out, r, (size_t)e->numel[p] * sizeof(float));
    pthread_mutex_unlock(&e->mu);
    return r != NULL;
}

int dl_ef_restore(dl_ef *e, int p, const float *r)
{
    assert(e && r && p >= 0 && p < e->P);
    if (!e->on) return 0;
    pthread_mutex_lock(&e->mu);
    int rc = alloc_frag(e, p);
    if (!rc) {
        memcpy(e->f[p].committed, r, (size_t)e->numel[p] * sizeof(float));
        e->f[p].zero = 0;
        e->f[p].has_pending = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return rc ? rc : 1;
}

const float *dl_ef_committed(const dl_ef *e, int p)
{
    assert(e && p >= 0 && p < e->P);
    return e->on && !e->f[p].zero ? e->f[p].committed : NULL;
}

const float *dl_ef_pending(const dl_ef *e, int p, uint64_t *base)
{
    assert(e && p >= 0 && p < e->P);
    if (base) *base = e->f[p].pending_base;
    return e->on && e->f[p].has_pending ? e->f[p].pending : NULL;
}

int dl_ef_on(const dl_ef *e) { return e->on; }
