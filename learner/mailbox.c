/* The learner's mailbox: per-fragment push/update slots, held versions and push fates
 * shared under one mutex by the training thread and the comms sessions (learner/mailbox.h). */
#include "learner/mailbox.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/plan.h"

enum { OPEN_NONE = 0, OPEN_SENT = 1, OPEN_POOLED = 2 };

/* Everything about one fragment; all fields guarded by mailbox.mu. */
typedef struct {
    /* push slot: written by the training thread (post), emptied by a session */
    dl_mailbox_push ph;
    float *pbuf; /* [maxn] */
    int queued;
    uint64_t claims; /* pushes of p claimed by a session so far */
    uint64_t jbase;  /* claims of earlier processes (the push journal's count continues from it) */
    /* update slot: filled by a session, emptied by the training thread */
    uint64_t uversion;
    int uforced, uhave;
    float *ubuf; /* [maxn] */
    /* written by the training thread: the adopted version */
    uint64_t held;
    int held_ok;
    uint64_t discarded; /* fragment-tokens of p the node threw away (adopts), cumulative */
    uint64_t carried;   /* fragment-tokens of p restored from a saved state (Hello.carried_tokens) */
    /* written by the serving session: fate of the latest push that left.
     * The synchronizer replaces an earlier pooled push of ours with a newer
     * one of the same fragment without answering the earlier one, so only
     * the latest push is tracked. */
    int open;           /* OPEN_* */
    uint64_t open_base; /* its base_version */
    int64_t open_ns;    /* when it was sent (dl_clock_ns) */
    int need_update;    /* ACCEPTED came, its Update has not */
    uint64_t await_version; /* the version that Update brings (the Ack's merged_version), 0 = not told */
    uint64_t behind;    /* a Welcome announced this newer global version: push after adopting it; 0 = none */
    int64_t behind_ns;  /* when (dl_clock_ns) */
    int fate;           /* DL_FATE_* of the latest decided push, not yet taken by the node */
    uint64_t fate_base; /* its base_version */
    /* refused updates: written by either side, read by the serving session */
    int refusals;       /* consecutive, since the last adopt (set_held) */
    int refetch;        /* a fresh fetch of p was asked for and not yet taken */
    int flush_owed;     /* the final flush owes a push of p not yet claimed (dl_mailbox_flush_owe); a queued
                         * push is named anyway */
} frag;

typedef struct {
    int used;
    int efd;      /* the session's eventfd */
    int state;    /* DL_COMMS_* */
    char msg[640];
} link_t;

struct dl_mailbox {
    /* immutable after open */
    int P;
    size_t maxn;
    size_t *numel; /* [P] */
    /* guarded by mu */
    pthread_mutex_t mu;
    frag *f; /* [P] */
    float *recv_spare; /* [maxn] swapped into an update slot by put_update (sessions serialise on mu) */
    link_t link[DL_MAILBOX_MAX_SESSIONS];
    uint32_t h;
    int barrier; /* the last Welcome's policy is a barrier (sync, sync-elastic) */
    uint64_t prog_step, prog_tokens;
    double prog_sps;
    int refetch_n; /* fragments with refetch set: the sessions' fast path */
    int bye_req;
    char bye_reason[128];
    uint64_t bye_step;
    int64_t heard_ns; /* dl_clock_ns of the latest message any session received; 0 before any */
    int jfd;          /* the push journal (learner/node.h), or -1 */
    off_t joff;       /* where its claim counters start */
    dl_mailbox_stats st;
};

int dl_mailbox_open(const dl_plan *plan, dl_mailbox **out)
{
    assert(out);
    *out = NULL;
    if (!plan) return dl_err(DL_EINVAL, "mailbox: no fragment plan");
    dl_mailbox *m = dl_try_calloc(1, sizeof *m);
    if (!m) return dl_err(DL_ENOMEM, "mailbox: out of memory");
    pthread_mutex_init(&m->mu, NULL);
    m->P = dl_plan_P(plan);
    m->jfd = -1;
    m->maxn = dl_plan_max_fragment_numel(plan);
    m->numel = dl_try_calloc((size_t)m->P, sizeof *m->numel);
    m->f = dl_try_calloc((size_t)m->P, sizeof *m->f);
    int ok = m->numel && m->f;
    for (int p = 0; ok && p < m->P; p++) {
        m->numel[p] = dl_plan_fragment_numel(plan, p);
        ok = (m->f[p].pbuf = dl_mailbox_buf_alloc(m)) && (m->f[p].ubuf = dl_mailbox_buf_alloc(m));
    }
    if (!ok || !(m->recv_spare = dl_mailbox_buf_alloc(m))) {
        dl_mailbox_close(&m);
        return dl_err(DL_ENOMEM, "mailbox: 2 x %d fragment buffers of %zu floats: out of memory", dl_plan_P(plan),
                      dl_plan_max_fragment_numel(plan));
    }
    *out = m;
    return 0;
}

void dl_mailbox_close(dl_mailbox **mp)
{
    if (!mp || !*mp) return;
    dl_mailbox *m = *mp;
    for (int p = 0; m->f && p < m->P; p++) {
        free(m->f[p].pbuf);
        free(m->f[p].ubuf);
    }
    free(m->f);
    free(m->numel);
    free(m->recv_spare);
    pthread_mutex_destroy(&m->mu);
    free(m);
    *mp = NULL;
}

int dl_mailbox_P(const dl_mailbox *m) { return m->P; }
size_t dl_mailbox_buf_numel(const dl_mailbox *m) { return m->maxn; }
float *dl_mailbox_buf_alloc(const dl_mailbox *m) { return dl_try_calloc(m->maxn, sizeof(float)); }

static void swapf(float **a, float **b)
{
    float *t = *a;
    *a = *b;
    *b = t;
}

/* Called with mu held. EAGAIN only when a counter is saturated: that session
 * is already due to wake up, so nothing is lost. */
static void wake_all(dl_mailbox *m)
{
    uint64_t one = 1;
    for (int i = 0; i < DL_MAILBOX_MAX_SESSIONS; i++) {
        if (!m->link[i].used) continue;
        ssize_t n = write(m->link[i].efd, &one, sizeof one);
        (void)n;
    }
}

uint64_t dl_mailbox_claims(dl_mailbox *m, int p)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    uint64_t k = m->f[p].claims;
    pthread_mutex_unlock(&m->mu);
    return k;
}

int dl_mailbox_post_push(dl_mailbox *m, const dl_mailbox_push *h, float **delta)
{
    return dl_mailbox_post_push_if(m, h, delta, UINT64_MAX);
}

int dl_mailbox_post_push_if(dl_mailbox *m, const dl_mailbox_push *h, float **delta, uint64_t claims)
{
    assert(m && h && delta && *delta && h->fragment >= 0 && h->fragment < m->P);
    assert(h->steps >= 1 && h->tokens >= h->steps);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[h->fragment];
    if ((claims != UINT64_MAX && f->claims != claims && !f->queued) ||
        (f->queued && f->ph.base_version != h->base_version)) {
        /* the queued push the caller's hold check saw was claimed since: it
         * is undecided now, and this one would carry its progress again; or
         * the queued one is on another base: this one does not contain its
         * progress (the learner adopted a merge since) */
        pthread_mutex_unlock(&m->mu);
        return -1;
    }
    int replaced = f->queued;
    swapf(&f->pbuf, delta);
    f->ph = *h;
    f->queued = 1;
    if (replaced) m->st.coalesced++;
    wake_all(m);
    pthread_mutex_unlock(&m->mu);
    return replaced;
}

int dl_mailbox_take_push(dl_mailbox *m, int p, dl_mailbox_push *h, float **delta)
{
    assert(m && h && delta && *delta && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    int got = f->queued;
    if (got) {
        swapf(&f->pbuf, delta);
        *h = f->ph;
        f->queued = 0;
        if (h->final) f->flush_owed = 0;
    }
    pthread_mutex_unlock(&m->mu);
    return got;
}

int dl_mailbox_claim_push(dl_mailbox *m, int p, int64_t now_ns, uint32_t *pending, dl_mailbox_claim *c,
                          float **delta)
{
    assert(m && c && delta && *delta && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    int go = f->queued && !(f->uhave && f->uforced);
    if (go) {
        swapf(&f->pbuf, delta);
        c->h = f->ph;
        f->queued = 0;
        c->prev_open = f->open;
        c->prev_base = f->open_base;
        c->prev_ns = f->open_ns;
        f->open = OPEN_SENT;
        f->open_base = c->h.base_version;
        f->open_ns = now_ns;
        f->claims++;
        c->pending = pending;
        c->n_pending = 0;
        if (c->h.final) {
            f->flush_owed = 0;
            for (int q = 0; c->pending && q < m->P; q++)
                if (m->f[q].flush_owed || m->f[q].queued) c->pending[c->n_pending++] = (uint32_t)q;
        }
        /* a push that leaves after a saved state is the synchronizer's: a restart must not carry it again */
        uint64_t k = f->jbase + f->claims;
        if (m->jfd >= 0 && pwrite(m->jfd, &k, sizeof k, m->joff + 8 * (off_t)p) != (ssize_t)sizeof k) m->jfd = -1;
    }
    pthread_mutex_unlock(&m->mu);
    return go;
}

void dl_mailbox_push_left(dl_mailbox *m, int p, uint64_t base_version, int64_t now_ns)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    if (f->open == OPEN_SENT && f->open_base == base_version) f->open_ns = now_ns;
    pthread_mutex_unlock(&m->mu);
}

/* The latest push of f (base) is decided with `fate`: the node reads it. */
static void set_fate(dl_mailbox *m, frag *f, int fate, uint64_t base)
{
    f->fate = fate;
    f->fate_base = base;
    if (fate == DL_FATE_RETURNED) m->st.returned++;
}

int dl_mailbox_take_fate(dl_mailbox *m, int p, uint64_t *base)
{
    assert(m && base && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    int fate = f->fate;
    *base = f->fate_base;
    f->fate = DL_FATE_NONE;
    pthread_mutex_unlock(&m->mu);
    return fate;
}

void dl_mailbox_unclaim_push(dl_mailbox *m, int p, const dl_mailbox_claim *c, float **delta, int requeue)
{
    assert(m && c && delta && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    f->open = c->prev_open;
    f->open_base = c->prev_base;
    f->open_ns = c->prev_ns;
    if (!requeue && !f->queued) set_fate(m, f, DL_FATE_RETURNED, c->h.base_version);
    if (requeue) {
        if (!f->queued) {
            swapf(&f->pbuf, delta);
            f->ph = c->h;
            f->queued = 1;
        } else {
            m->st.coalesced++;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void dl_mailbox_await_version(dl_mailbox *m, int p, uint64_t version)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    if (m->f[p].need_update) m->f[p].await_version = version;
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_decide(dl_mailbox *m, int p, int decision, uint64_t base_version, int update_follows)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    int same = base_version == f->open_base, decides = 0;
    switch (decision) {
    case DL_DECIDE_PENDING:
        if (f->open == OPEN_SENT) f->open = OPEN_POOLED;
        break;
    case DL_DECIDE_ACCEPTED: decides = f->open == OPEN_POOLED && same; break;
    case DL_DECIDE_DROPPED: decides = f->open == OPEN_SENT && same; break;
    case DL_DECIDE_REJECTED: decides = f->open != OPEN_NONE && same; break;
    default: break;
    }
    if (decides) f->open = OPEN_NONE;
    if (decides && update_follows) f->need_update = 1, f->await_version = 0; /* the Update follows */
    /* a newer push queued meanwhile (a hold released) is the node's latest:
     * this one's fate is no longer the node's to apply */
    if (decides && !f->queued && decision == DL_DECIDE_ACCEPTED) set_fate(m, f, DL_FATE_ACCEPTED, base_version);
    if (decides && !f->queued && decision == DL_DECIDE_REJECTED && !update_follows)
        set_fate(m, f, DL_FATE_RETURNED, base_version);
    pthread_mutex_unlock(&m->mu);
    return decides;
}

int dl_mailbox_put_update(dl_mailbox *m, int p, uint64_t version, int kind, const void *data, size_t numel)
{
    assert(m && data && p >= 0 && p < m->P && numel == m->numel[p]);
    pthread_mutex_lock(&m->mu);
    /* The copy runs under the lock: recv_spare is shared by all sessions.
     * It is one fragment (the payload may be unaligned inside libzmq's
     * buffer), and the training thread only ever waits on this lock for swaps. */
    frag *f = &m->f[p];
    /* an older Update (a broadcast that crossed the Ack) is not the one the
     * ACCEPTED announced: a push made now would carry the merged progress again */
    if (version >= f->await_version) f->need_update = 0;
    int store = !f->uhave || kind != DL_UPDATE_NORMAL || version > f->uversion;
    if (!store) m->st.superseded++; /* the waiting one is newer */
    if (store) {
        memcpy(m->recv_spare, data, numel * sizeof(float));
        if (f->uhave) m->st.superseded++;
        swapf(&f->ubuf, &m->recv_spare);
        /* A forced update stays forced even when a newer merge replaces it:
         * the learner still has to rebase, now onto the newer global. */
        int prev = f->uhave ? f->uforced : DL_UPDATE_NORMAL;
        f->uforced = kind == DL_UPDATE_FETCHED || prev == DL_UPDATE_FETCHED ? DL_UPDATE_FETCHED
                     : kind == DL_UPDATE_REBASE || prev == DL_UPDATE_REBASE ? DL_UPDATE_REBASE
                     : kind == DL_UPDATE_STALE || prev == DL_UPDATE_STALE   ? DL_UPDATE_STALE
                                                                            : DL_UPDATE_NORMAL;
        f->uversion = version;
        f->uhave = 1;
    }
    pthread_mutex_unlock(&m->mu);
    return store;
}

int dl_mailbox_take_update(dl_mailbox *m, int p, float **buf, dl_mailbox_update *u)
{
    assert(m && buf && *buf && u && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    int got = f->uhave;
    if (got) {
        swapf(&f->ubuf, buf);
        u->fragment = p;
        u->version = f->uversion;
        u->forced = f->uforced;
        if (f->uforced != DL_UPDATE_NORMAL && f->queued) {
            f->queued = 0; /* queued relative to a base the rebase throws away */
            m->st.discarded++;
        }
        f->uhave = 0;
        f->uforced = 0;
    }
    pthread_mutex_unlock(&m->mu);
    return got;
}

void dl_mailbox_set_held(dl_mailbox *m, int p, uint64_t version)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    m->f[p].held = version;
    m->f[p].held_ok = 1;
    if (version >= m->f[p].behind) m->f[p].behind = 0;
    m->f[p].refusals = 0; /* an adopt ends a run of refusals */
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_held(dl_mailbox *m, int p, uint64_t *v)
{
    assert(m && v && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    int ok = m->f[p].held_ok;
    *v = m->f[p].held;
    pthread_mutex_unlock(&m->mu);
    return ok;
}

void dl_mailbox_set_progress(dl_mailbox *m, uint64_t step, uint64_t tokens, double steps_per_s)
{
    pthread_mutex_lock(&m->mu);
    m->prog_step = step;
    m->prog_tokens = tokens;
    m->prog_sps = steps_per_s >= 0 && steps_per_s < 1e300 ? steps_per_s : 0.0;
    pthread_mutex_unlock(&m->mu);
}

void dl_mailbox_set_claims_journal(dl_mailbox *m, int fd, int64_t offset, const uint64_t *base)
{
    pthread_mutex_lock(&m->mu);
    m->jfd = fd;
    m->joff = (off_t)offset;
    for (int p = 0; p < m->P; p++) {
        m->f[p].jbase = base ? base[p] : 0;
        uint64_t k = m->f[p].jbase + m->f[p].claims;
        if (fd >= 0 && pwrite(fd, &k, sizeof k, m->joff + 8 * (off_t)p) != (ssize_t)sizeof k) m->jfd = -1;
    }
    pthread_mutex_unlock(&m->mu);
}

uint64_t dl_mailbox_claims_total(dl_mailbox *m, int p)
{
    pthread_mutex_lock(&m->mu);
    uint64_t k = m->f[p].jbase + m->f[p].claims;
    pthread_mutex_unlock(&m->mu);
    return k;
}

int dl_mailbox_queued(dl_mailbox *m, int p)
{
    pthread_mutex_lock(&m->mu);
    int q = m->f[p].queued;
    pthread_mutex_unlock(&m->mu);
    return q;
}

void dl_mailbox_set_carried(dl_mailbox *m, int p, uint64_t tokens)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    m->f[p].carried = tokens;
    pthread_mutex_unlock(&m->mu);
}

uint64_t dl_mailbox_carried(dl_mailbox *m, int p)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    uint64_t t = m->f[p].carried;
    pthread_mutex_unlock(&m->mu);
    return t;
}

void dl_mailbox_add_discarded(dl_mailbox *m, int p, uint64_t tokens)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    m->f[p].discarded += tokens;
    pthread_mutex_unlock(&m->mu);
}

void dl_mailbox_progress(dl_mailbox *m, const int *frags, int n, uint64_t *step, uint64_t *tokens,
                         double *steps_per_s, uint64_t *discarded_tokens)
{
    pthread_mutex_lock(&m->mu);
    if (discarded_tokens) {
        uint64_t d = 0;
        for (int i = 0; i < (frags ? n : m->P); i++) d += m->f[frags ? frags[i] : i].discarded;
        *discarded_tokens = d;
    }
    if (step) *step = m->prog_step;
    if (tokens) *tokens = m->prog_tokens;
    if (steps_per_s) *steps_per_s = m->prog_sps;
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_undecided(dl_mailbox *m, int p, int64_t *since_ns)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    int pushed = f->open != OPEN_NONE || f->need_update;
    /* 2: merged, only its Update (or an update to adopt) is awaited */
    int u = f->open == OPEN_NONE && f->need_update ? 2 : pushed || f->uhave;
    if (since_ns) *since_ns = pushed ? f->open_ns : 0;
    pthread_mutex_unlock(&m->mu);
    return u;
}

void dl_mailbox_set_behind(dl_mailbox *m, int p, uint64_t version, int64_t now_ns)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    f->behind = f->held_ok && version > f->held ? version : 0;
    f->behind_ns = now_ns;
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_behind(dl_mailbox *m, int p, int64_t *since_ns)
{
    assert(m && since_ns && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    int b = m->f[p].behind != 0;
    *since_ns = b ? m->f[p].behind_ns : 0;
    pthread_mutex_unlock(&m->mu);
    return b;
}

void dl_mailbox_flush_owe(dl_mailbox *m, int p, int owed)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    f->flush_owed = owed;
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_flush_pending(dl_mailbox *m)
{
    int n = 0;
    pthread_mutex_lock(&m->mu);
    for (int p = 0; p < m->P; p++) n += m->f[p].queued || m->f[p].open || m->f[p].need_update;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void dl_mailbox_forget_sent(dl_mailbox *m, const int *frags, int n)
{
    pthread_mutex_lock(&m->mu);
    int k = frags ? n : m->P;
    for (int i = 0; i < k; i++) {
        frag *f = &m->f[frags ? frags[i] : i];
        if (f->open != OPEN_NONE && !f->queued) set_fate(m, f, DL_FATE_RETURNED, f->open_base);
        f->open = OPEN_NONE;
        /* an ACCEPTED push's Update is still awaited: its merge is in the
         * store, and the next Welcome has the session fetch it (a push made
         * before would carry the merged progress again) */
    }
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_open_push(dl_mailbox *m, int p, uint64_t *base)
{
    assert(m && base && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    int o = m->f[p].open;
    *base = o != OPEN_NONE ? m->f[p].open_base : 0;
    pthread_mutex_unlock(&m->mu);
    return o;
}

int dl_mailbox_discard_queued(dl_mailbox *m, int p)
{
    pthread_mutex_lock(&m->mu);
    int q = m->f[p].queued;
    if (q) {
        m->f[p].queued = 0;
        m->st.discarded++;
    }
    pthread_mutex_unlock(&m->mu);
    return q;
}

void dl_mailbox_update_seen(dl_mailbox *m, int p)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    m->f[p].need_update = 0;
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_refuse_update(dl_mailbox *m, int p)
{
    assert(m && p >= 0 && p < m->P);
    pthread_mutex_lock(&m->mu);
    frag *f = &m->f[p];
    if (f->refusals < 1000000) f->refusals++; /* saturates: only the backoff reads it */
    if (!f->refetch) m->refetch_n++;
    f->refetch = 1;
    int k = f->refusals;
    wake_all(m);
    pthread_mutex_unlock(&m->mu);
    return k;
}

int dl_mailbox_take_refetches(dl_mailbox *m, const int *frags, int n, int *refusals)
{
    assert(m && frags && refusals);
    pthread_mutex_lock(&m->mu);
    int asked = 0;
    for (int i = 0; i < n; i++) {
        frag *f = &m->f[frags[i]];
        refusals[i] = 0;
        if (!m->refetch_n || !f->refetch) continue;
        f->refetch = 0;
        m->refetch_n--;
        refusals[i] = f->refusals > 0 ? f->refusals : 1;
        asked++;
    }
    pthread_mutex_unlock(&m->mu);
    return asked;
}

void dl_mailbox_bye(dl_mailbox *m, const char *reason, uint64_t step)
{
    pthread_mutex_lock(&m->mu);
    m->bye_req = 1;
    snprintf(m->bye_reason, sizeof m->bye_reason, "%s", reason ? reason : "done");
    m->bye_step = step;
    wake_all(m);
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_bye_asked(dl_mailbox *m, char *reason, size_t cap, uint64_t *step)
{
    pthread_mutex_lock(&m->mu);
    int b = m->bye_req;
    if (b && reason && cap) snprintf(reason, cap, "%s", m->bye_reason);
    if (b && step) *step = m->bye_step;
    pthread_mutex_unlock(&m->mu);
    return b;
}

int dl_mailbox_attach(dl_mailbox *m, int wake_fd)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < DL_MAILBOX_MAX_SESSIONS && m->link[i].used) i++;
    if (i < DL_MAILBOX_MAX_SESSIONS) m->link[i] = (link_t){.used = 1, .efd = wake_fd, .state = DL_COMMS_IDLE};
    pthread_mutex_unlock(&m->mu);
    if (i == DL_MAILBOX_MAX_SESSIONS)
        return dl_err(DL_EINVAL, "mailbox: %d sessions attached already", DL_MAILBOX_MAX_SESSIONS);
    return i;
}

void dl_mailbox_detach(dl_mailbox *m, int link)
{
    if (link < 0 || link >= DL_MAILBOX_MAX_SESSIONS) return;
    pthread_mutex_lock(&m->mu);
    m->link[link].used = 0;
    pthread_mutex_unlock(&m->mu);
}

void dl_mailbox_set_link(dl_mailbox *m, int link, int state, uint32_t h, const char *msg)
{
    assert(link >= 0 && link < DL_MAILBOX_MAX_SESSIONS);
    pthread_mutex_lock(&m->mu);
    m->link[link].state = state;
    if (msg) snprintf(m->link[link].msg, sizeof m->link[link].msg, "%s", msg);
    if (h) m->h = h;
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_state(dl_mailbox *m, char *msg, size_t cap)
{
    /* the order in which one session's state speaks for all */
    static const int rank[] = {[DL_COMMS_REFUSED] = 0, [DL_COMMS_FAILED] = 1, [DL_COMMS_IDLE] = 2,
                               [DL_COMMS_HELLO] = 3,   [DL_COMMS_DONE] = 4,   [DL_COMMS_READY] = 5};
    pthread_mutex_lock(&m->mu);
    int best = -1;
    for (int i = 0; i < DL_MAILBOX_MAX_SESSIONS; i++) {
        if (!m->link[i].used) continue;
        if (best < 0 || rank[m->link[i].state] < rank[m->link[best].state]) best = i;
    }
    int s = best < 0 ? DL_COMMS_IDLE : m->link[best].state;
    if (msg && cap) snprintf(msg, cap, "%s", best < 0 ? "" : m->link[best].msg);
    pthread_mutex_unlock(&m->mu);
    return s;
}

uint32_t dl_mailbox_h(dl_mailbox *m)
{
    pthread_mutex_lock(&m->mu);
    uint32_t h = m->h;
    pthread_mutex_unlock(&m->mu);
    return h;
}

void dl_mailbox_heard(dl_mailbox *m)
{
    int64_t now = dl_clock_ns();
    pthread_mutex_lock(&m->mu);
    if (now > m->heard_ns) m->heard_ns = now;
    pthread_mutex_unlock(&m->mu);
}

int64_t dl_mailbox_heard_ns(dl_mailbox *m)
{
    pthread_mutex_lock(&m->mu);
    int64_t t = m->heard_ns;
    pthread_mutex_unlock(&m->mu);
    return t;
}

void dl_mailbox_set_policy(dl_mailbox *m, const char *policy)
{
    int b = policy && (!strcmp(policy, "sync") || !strcmp(policy, "sync-elastic"));
    pthread_mutex_lock(&m->mu);
    m->barrier = b;
    pthread_mutex_unlock(&m->mu);
}

int dl_mailbox_barrier(dl_mailbox *m)
{
    pthread_mutex_lock(&m->mu);
    int b = m->barrier;
    pthread_mutex_unlock(&m->mu);
    return b;
}

void dl_mailbox_get_stats(dl_mailbox *m, dl_mailbox_stats *out)
{
    pthread_mutex_lock(&m->mu);
    *out = m->st;
    pthread_mutex_unlock(&m->mu);
}
