/* Error feedback of a learner's encoded pushes: the committed and pending
 * residuals per fragment and the decision rules of learner/ef.h. */
#include "learner/ef.h"

#include <assert.h>
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
    for (int p = 0; p < P; p++) e->f[p].zero = 1;
    *out = e;
    return 0;
}

void dl_ef_close(dl_ef **ep)
{
    if (!ep || !*ep) return;
    dl_ef *e = *ep;
    for (int p = 0; e->f && p < e->P; p++) {
        free(e->f[p].committed);
        free(e->f[p].pending);
    }
    free(e->f);
    free(e->numel);
    free(e);
    *ep = NULL;
}

int dl_ef_encode(dl_ef *e, const dl_codec_enc *enc, int p, const float *x, uint64_t base_version, uint8_t *out)
{
    assert(e && enc && x && out && p >= 0 && p < e->P);
    eff *f = &e->f[p];
    size_t n = (size_t)e->numel[p];
    f->has_pending = 0;
    if (!e->on) return dl_codec_encode(enc, x, NULL, n, 0, out);
    if (!f->committed) {
        f->committed = dl_try_malloc(n * sizeof(float));
        f->pending = dl_try_malloc(n * sizeof(float));
        if (!f->committed || !f->pending) {
            free(f->committed), free(f->pending);
            f->committed = f->pending = NULL;
            return dl_err(DL_ENOMEM, "error feedback of fragment %d (2 x %zu floats): out of memory", p, n);
        }
    }
    if (f->zero) memset(f->pending, 0, n * sizeof(float));
    else memcpy(f->pending, f->committed, n * sizeof(float));
    DL_TRY(dl_codec_encode(enc, x, f->pending, n, 0, out));
    f->has_pending = 1;
    f->pending_base = base_version;
    return 0;
}

void dl_ef_reset(dl_ef *e, int p)
{
    assert(e && p >= 0 && p < e->P);
    e->f[p].zero = 1;
    e->f[p].has_pending = 0;
}

void dl_ef_forget(dl_ef *e, int p)
{
    assert(e && p >= 0 && p < e->P);
    e->f[p].has_pending = 0;
}

void dl_ef_decided(dl_ef *e, int p, int decision, int rebase, uint64_t base_version)
{
    assert(e && p >= 0 && p < e->P);
    eff *f = &e->f[p];
    if (decision == DL_DECIDE_PENDING) return;
    if (decision == DL_DECIDE_DROPPED || rebase) {
        dl_ef_reset(e, p);
        return;
    }
    if (decision == DL_DECIDE_ACCEPTED && f->has_pending && f->pending_base == base_version) {
        float *t = f->committed;
        f->committed = f->pending;
        f->pending = t;
        f->zero = 0;
    }
    f->has_pending = 0; /* REJECTED: committed unchanged */
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
