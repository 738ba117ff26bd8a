/* Training-thread side of a networked learner: fragment bases and versions,
 * counters since adopt, pushes (delta = base - theta, deferred on a GPU), adopt modes through the
 * parameter interface, initial fetch wait, final flush; and the host parameter interface. */
#include "learner/node.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/plan.h"
#include "kernels/cpu.h"
#include "learner/ef.h"

/* ---- the host parameter interface (dl_plan_gather / dl_plan_scatter) */

typedef struct {
    dl_node_model iface; /* first: the handle is a pointer to it */
    const dl_plan *plan;
    float *params;
    float **snap; /* [P][numel_p] theta_p at the last read_begin(p), allocated on first use;
                   * not deferred: every read_end follows its read_begin at once, so all
                   * fragments share one buffer (no extra copy of the model on a CPU learner) */
    float *shared; /* that one buffer, or NULL when deferred */
    float *tmp;   /* [max numel] theta_p being updated by apply */
} host_model;

static int host_read_begin(void *ctx, int p)
{
    host_model *h = ctx;
    if (!h->snap[p])
        h->snap[p] = h->shared ? h->shared : dl_try_malloc(dl_plan_fragment_numel(h->plan, p) * sizeof(float));
    if (!h->snap[p]) return dl_err(DL_ENOMEM, "host model: snapshot of fragment %d: out of memory", p);
    dl_plan_gather(h->plan, p, h->params, h->snap[p]);
    return 0;
}

static int host_read_end(void *ctx, int p, const float **theta)
{
    host_model *h = ctx;
    assert(h->snap[p] && "read_end without read_begin");
    *theta = h->snap[p];
    return 0;
}

static int host_apply(void *ctx, int p, float a, float b, const float *in)
{
    host_model *h = ctx;
    if (a == 0.0f && b == 1.0f) { /* overwrite / rebase: a plain copy */
        dl_plan_scatter(h->plan, p, in, h->params);
        return 0;
    }
    size_t k = dl_plan_fragment_numel(h->plan, p);
    if (a != 0.0f) dl_plan_gather(h->plan, p, h->params, h->tmp);
    dl_cpu_axpby(h->tmp, a, in, b, k);
    dl_plan_scatter(h->plan, p, h->tmp, h->params);
    return 0;
}

int dl_node_host_model_open(const dl_plan *plan, float *params, int deferred, dl_node_model **out)
{
    assert(out);
    *out = NULL;
    if (!plan || !params) return dl_err(DL_EINVAL, "host model: no plan or parameter buffer");
    host_model *h = dl_try_calloc(1, sizeof *h);
    if (!h) return dl_err(DL_ENOMEM, "host model: out of memory");
    h->plan = plan;
    h->params = params;
    h->snap = dl_try_calloc((size_t)dl_plan_P(plan), sizeof *h->snap);
    h->tmp = dl_try_calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    if (!deferred) h->shared = dl_try_calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    if (!h->snap || !h->tmp || (!deferred && !h->shared)) {
        free(h->snap), free(h->tmp), free(h->shared), free(h);
        return dl_err(DL_ENOMEM, "host model: fragment buffers: out of memory");
    }
    h->iface = (dl_node_model){.ctx = h,
                               .deferred = deferred ? 1 : 0,
                               .read_begin = host_read_begin,
                               .read_end = host_read_end,
                               .apply = host_apply};
    *out = &h->iface;
    return 0;
}

void dl_node_host_model_close(dl_node_model **mp)
{
    if (!mp || !*mp) return;
    host_model *h = (host_model *)(*mp)->ctx;
    assert(&h->iface == *mp);
    if (!h->shared)
        for (int p = 0; p < dl_plan_P(h->plan); p++) free(h->snap[p]);
    free(h->shared);
    free(h->snap);
    free(h->tmp);
    free(h);
    *mp = NULL;
}

/* ---- the node */

/* One fragment's training-side state; training thread only (the node is
 * not shared: every field is read and written between training steps). */
typedef struct {
    size_t numel;
    float *base;      /* [numel] last adopted global */
    float *ref;       /* keep mode: [numel] theta at the last push, or the last global */
    uint64_t version; /* of base */
    int held;         /* base is valid */
    uint64_t steps, tokens; /* since the reference point of the next delta */
    double loss;            /* summed training loss over those steps */
    double compute_s;       /* summed wall seconds of those steps */
    uint64_t steps_ref, tokens_ref; /* keep mode: counters at the last push */
    uint64_t tokens_posted; /* tokens of the last push posted since the adopt (all modes): what the next
                             * adopt does not discard, since that push reported them */
    double loss_ref, compute_ref;
    int pending;                    /* deferred push begun (read_begin), not yet posted */
    uint64_t pend_steps, pend_tokens; /* counters at its snapshot */
    double pend_loss, pend_compute;
    int flight;          /* FLIGHT_*: the latest push of p and what the node has done with its progress */
    uint64_t flight_base; /* its base_version */
    uint64_t fl_steps, fl_tokens; /* its counters */
    double fl_loss, fl_compute;
    uint64_t claims_seen; /* dl_mailbox_claims at the hold check that let the next push go (UINT64_MAX: none) */
    int owed;       /* a scheduled push was held (previous push of p undecided): make it when decided */
    int owed_final; /* the final flush of p waits for the previous push's decision */
    int final_returns; /* final pushes of p returned and owed again */
    uint64_t journal;  /* pushes posted + adopts that threw progress away (the push journal, node.h) */
    uint64_t claims0;  /* the push journal's claim count of earlier processes (dl_mailbox_set_claims_journal) */
    dl_ef *ef;         /* the serving session's error feedback residuals (dl_node_set_ef), or NULL */
} nfrag;

/* The latest push of a fragment, until its fate is known (node.h "Push
 * fates"). Keep mode keeps ref_p - base_p = the pushed progress while it is
 * POSTED or ABSORBED. */
enum {
    FLIGHT_NONE = 0,     /* decided, or no push since the adopt */
    FLIGHT_POSTED = 1,   /* posted; its progress is still in theta_p - base_p */
    FLIGHT_ABSORBED = 2, /* a NORMAL adopt took its progress out of theta_p (keep: it is ref_p - base_p) */
    FLIGHT_GONE = 3      /* a forced adopt overwrote theta_p: a returned push's progress is lost */
};

struct dl_node {
    const dl_plan *plan;
    const dl_node_model *model;
    dl_node_model *own_model; /* host model over opts.params, or NULL */
    dl_mailbox *mb;
    int P;
    int adopt;
    float alpha;
    double max_ratio; /* 0 = no distance bound */
    int64_t decision_timeout_ns;
    int (*due)(void *, int64_t, int, int); /* opts.due, or NULL: dl_plan_due */
    void *due_ctx;
    nfrag *f;   /* [P] */
    float *out; /* [mailbox buf] delta being posted (swapped with the mailbox) */
    float *in;  /* [mailbox buf] update being adopted (swapped with the mailbox) */
    float *tmp; /* [max numel] keep mode: g - ref_p */
    int finishing; /* dl_node_finish runs: a returned final push is owed again */
    int jfd;       /* the push journal's file, or -1 */
    dl_node_stats st;
};

int dl_node_open(const dl_node_opts *o, dl_mailbox *mb, dl_node **out)
{
    assert(o && mb && out);
    *out = NULL;
    if (!o->plan || (!o->params && !o->model))
        return dl_err(DL_EINVAL, "node: no plan, or neither a parameter buffer nor a parameter interface");
    if (o->model && !o->params && (!o->model->read_begin || !o->model->read_end || !o->model->apply))
        return dl_err(DL_EINVAL, "node: parameter interface without read_begin/read_end/apply");
    if (o->adopt < DL_ADOPT_OVERWRITE || o->adopt > DL_ADOPT_KEEP)
        return dl_err(DL_EINVAL, "node: unknown adopt mode %d", o->adopt);
    if (!(o->alpha >= 0.0f && o->alpha <= 1.0f)) return dl_err(DL_EINVAL, "node: alpha %g outside [0, 1]", o->alpha);
    if (!(o->update_max_ratio >= 0.0 && isfinite(o->update_max_ratio)))
        return dl_err(DL_EINVAL, "node: update_max_ratio %g must be finite and >= 0", o->update_max_ratio);
    if (dl_plan_P(o->plan) != dl_mailbox_P(mb))
        return dl_err(DL_EINVAL, "node: plan has %d fragments, mailbox %d", dl_plan_P(o->plan), dl_mailbox_P(mb));
    dl_node *n = dl_try_calloc(1, sizeof *n);
    if (!n) return dl_err(DL_ENOMEM, "node: out of memory");
    n->plan = o->plan;
    if (o->params) {
        int rc = dl_node_host_model_open(o->plan, o->params, 0, &n->own_model);
        if (rc) {
            free(n);
            return rc;
        }
        n->model = n->own_model;
    } else {
        n->model = o->model;
    }
    n->mb = mb;
    n->P = dl_plan_P(o->plan);
    n->adopt = o->adopt;
    n->alpha = o->alpha;
    n->max_ratio = o->update_max_ratio;
    n->due = o->due;
    n->due_ctx = o->due_ctx;
    n->jfd = -1;
    /* < 0: a pooled push never holds the next one (the protocol tests of
     * learner/comms.c that exercise pooled pushes) */
    int ms = o->push_decision_timeout_ms;
    n->decision_timeout_ns = (int64_t)(ms > 0 ? ms : ms < 0 ? 0 : 30000) * 1000000;
    /* base copies (one model's worth), keep-mode references (another), and three fragment buffers */
    int ok = (n->f = dl_try_calloc((size_t)n->P, sizeof *n->f)) != NULL;
    for (int p = 0; ok && p < n->P; p++) {
        nfrag *f = &n->f[p];
        f->numel = dl_plan_fragment_numel(o->plan, p);
        ok = (f->base = dl_try_calloc(f->numel, sizeof(float))) &&
             (n->adopt != DL_ADOPT_KEEP || (f->ref = dl_try_calloc(f->numel, sizeof(float))));
        f->claims_seen = UINT64_MAX;
    }
    if (!ok || !(n->out = dl_mailbox_buf_alloc(mb)) || !(n->in = dl_mailbox_buf_alloc(mb)) ||
        !(n->tmp = dl_try_calloc(dl_plan_max_fragment_numel(o->plan), sizeof(float)))) {
        dl_node_close(&n);
        return dl_err(DL_ENOMEM, "node: base copies of %zu floats%s: out of memory", dl_plan_total_numel(o->plan),
                      o->adopt == DL_ADOPT_KEEP ? " and keep-mode references" : "");
    }
    *out = n;
    return 0;
}

void dl_node_close(dl_node **np)
{
    if (!np || !*np) return;
    dl_node *n = *np;
    for (int p = 0; n->f && p < n->P; p++) {
        free(n->f[p].base);
        free(n->f[p].ref);
    }
    free(n->f);
    free(n->out);
    free(n->in);
    free(n->tmp);
    dl_node_host_model_close(&n->own_model);
    free(n);
    *np = NULL;
}

/* theta_p now, through the interface (synchronously). */
static int read_now(dl_node *n, int p, const float **theta)
{
    DL_TRY(n->model->read_begin(n->model->ctx, p));
    return n->model->read_end(n->model->ctx, p, theta);
}

/* The push journal (node.h): fragment p's state changed in a way a saved
 * state must not carry across. A failed write is warned once: the next
 * restore then carries what it should not only if the kill follows. */
static void journal_bump(dl_node *n, int p)
{
    nfrag *f = &n->f[p];
    f->journal++;
    if (n->jfd < 0) return;
    if (pwrite(n->jfd, &f->journal, sizeof f->journal, (off_t)(DL_NODE_JOURNAL_HEAD + 8 * (size_t)p)) !=
        (ssize_t)sizeof f->journal) {
        DL_WARN("node: push journal not written (%s): a restart will not carry unpushed progress",
                strerror(errno));
        n->jfd = -1;
    }
}

/* Post the push of p: delta = base_p - theta (theta_p as it was after the
 * step the counters describe). Returns 1, or 0 when the mailbox refused it
 * because the push the hold check saw queued was claimed since (then it is
 * owed: made once that one is decided). */
static int post(dl_node *n, int p, const float *theta, uint64_t steps, uint64_t tokens, double loss, double compute,
                int final, int held)
{
    nfrag *f = &n->f[p];
    assert(f->held && steps >= 1);
    dl_cpu_pseudograd(n->out, f->base, theta, f->numel);
    dl_mailbox_push h = {
        .fragment = p,
        .base_version = f->version,
        .steps = steps,
        .tokens = tokens,
        .loss = loss / (double)steps,
        .compute_s = compute > 0 ? compute : 0.0,
        .final = final,
        .held = held,
    };
    uint64_t claims = f->claims_seen;
    f->claims_seen = UINT64_MAX;
    int rc = dl_mailbox_post_push_if(n->mb, &h, &n->out, claims);
    if (rc < 0) {
        if (final) f->owed_final = 1;
        else f->owed = 1;
        n->st.held++;
        return 0;
    }
    n->st.coalesced += (uint64_t)rc;
    journal_bump(n, p);
    f->tokens_posted = tokens;
    f->flight = FLIGHT_POSTED;
    f->flight_base = f->version;
    f->fl_steps = steps;
    f->fl_tokens = tokens;
    f->fl_loss = loss;
    f->fl_compute = compute;
    n->st.pushes++;
    if (final) n->st.flushed++;
    if (n->adopt == DL_ADOPT_KEEP) {
        memcpy(f->ref, theta, f->numel * sizeof(float));
        f->steps_ref = steps;
        f->tokens_ref = tokens;
        f->loss_ref = loss;
        f->compute_ref = compute;
    }
    return 1;
}

/* Returns 1 when posted, 0 when it is owed after all (see post), or the
 * parameter interface's error. */
static int take_fate(dl_node *n, int p);

static int push_now(dl_node *n, int p, int final, int held)
{
    const float *theta;
    nfrag *f = &n->f[p];
    /* the previous push's fate first: this push replaces it as the latest,
     * and a returned one's progress must be in theta (and the counters) now */
    DL_TRY(take_fate(n, p));
    DL_TRY(read_now(n, p, &theta));
    return post(n, p, theta, f->steps, f->tokens, f->loss, f->compute_s, final, held);
}

/* The hold rule, as a question: HOLD_NO when p's previous push is decided
 * (and its update adopted), HOLD_YES while it is undecided (or an update of p
 * waits to be adopted), HOLD_RELEASED when it has been undecided for the
 * decision timeout; *waited_ns then says how long. Counts nothing. A keep
 * learner also holds p while a Welcome said the global p is newer than the
 * one it adopted (dl_mailbox_behind: back from an outage or a partition):
 * adopted first, that version carries what it trained meanwhile, and the
 * push on it is fresh; on its old base the outage's steps went more than
 * max_staleness versions stale and were dropped. overwrite and mix would
 * throw that progress away by adopting first: they push at once. */
enum { HOLD_NO = 0, HOLD_YES = 1, HOLD_RELEASED = 2 };

static int hold_state(dl_node *n, int p, int64_t *waited_ns)
{
    int64_t since = 0;
    *waited_ns = 0;
    int u = dl_mailbox_undecided(n->mb, p, &since);
    if (!u && n->adopt == DL_ADOPT_KEEP && dl_mailbox_behind(n->mb, p, &since)) u = 1;
    if (!u) return HOLD_NO;
    if (since <= 0) return HOLD_YES;
    *waited_ns = dl_clock_ns() - since;
    /* a merged push whose Update is late: a push on its base would carry the
     * merged progress again (the synchronizer refuses it as a replay, with a
     * rebase that throws the rest away), so only a much longer wait -- the
     * Update lost -- releases it */
    int64_t limit = u == 2 ? DL_NODE_ACCEPTED_HOLD_X * n->decision_timeout_ns : n->decision_timeout_ns;
    return *waited_ns >= limit ? HOLD_RELEASED : HOLD_YES;
}

/* The hold rule: 1 while the previous push of p is undecided (or an update
 * of p waits to be adopted), so a push made now would re-send its progress.
 * A decision that does not come within the timeout (a lost Ack) releases
 * the hold: better a rare double count than a fragment that never pushes.
 * Called only where a push follows a 0, so each release is counted once. */
static int must_hold(dl_node *n, int p)
{
    int64_t waited;
    /* read before the check: a push queued now may be claimed before the
     * next one is posted (post refuses it then) */
    n->f[p].claims_seen = dl_mailbox_claims(n->mb, p);
    int h = hold_state(n, p, &waited);
    if (h == HOLD_RELEASED) {
        n->f[p].claims_seen = UINT64_MAX;
        n->st.hold_released++;
        DL_WARN("node: push of fragment %d undecided after %lld ms; pushing again anyway", p,
                (long long)(waited / 1000000));
        dl_event("push_hold_released", " fragment=%d base_version=%llu waited_ms=%lld", p,
                 (unsigned long long)n->f[p].version, (long long)(waited / 1000000));
        return 0;
    }
    return h == HOLD_YES;
}

/* Complete the deferred push of p, if one is pending: 1 when posted. */
static int complete(dl_node *n, int p)
{
    nfrag *f = &n->f[p];
    if (!f->pending) return 0;
    int late = f->pending == 2; /* begun as a held push made late */
    f->pending = 0;
    int ret = take_fate(n, p);
    if (ret < 0) return ret;
    if (ret) { /* a push came back after the snapshot: its progress is not in it; push afresh */
        f->owed = 1;
        return 0;
    }
    const float *theta;
    DL_TRY(n->model->read_end(n->model->ctx, p, &theta));
    return post(n, p, theta, f->pend_steps, f->pend_tokens, f->pend_loss, f->pend_compute, 0, late);
}

int dl_node_complete(dl_node *n)
{
    int posted = 0;
    for (int p = 0; p < n->P; p++) {
        int rc = complete(n, p);
        if (rc < 0) return rc;
        posted += rc;
    }
    return posted;
}

int dl_node_delta(dl_node *n, int p, float *out)
{
    assert(n && out && p >= 0 && p < n->P && n->f[p].held);
    DL_TRY(complete(n, p));
    const float *theta;
    DL_TRY(read_now(n, p, &theta));
    dl_cpu_pseudograd(out, n->f[p].base, theta, n->f[p].numel);
    return 0;
}

static int poll_one(dl_node *n, int p);

/* Apply the fate of p's latest push, if the mailbox has one (node.h "Push
 * fates"). Returns 1 when a push was returned, 0, or the parameter
 * interface's error. */
static int take_fate(dl_node *n, int p)
{
    nfrag *f = &n->f[p];
    uint64_t base;
    int fate = dl_mailbox_take_fate(n->mb, p, &base);
    if (fate == DL_FATE_NONE || f->flight == FLIGHT_NONE || base != f->flight_base) return 0;
    int was = f->flight;
    f->flight = FLIGHT_NONE;
    if (fate == DL_FATE_ACCEPTED) {
        /* merged: an adopt that took it out of theta was right; the next
         * adopt counts from the global held now */
        if (was == FLIGHT_ABSORBED && n->adopt == DL_ADOPT_KEEP) memcpy(f->ref, f->base, f->numel * sizeof(float));
        return 0;
    }
    n->st.returned++;
    uint64_t lost = 0;
    if (was == FLIGHT_POSTED) {
        /* still in theta - base: the next delta carries it, and an adopt
         * before it keeps it (keep) or counts it discarded (overwrite, mix) */
        f->tokens_posted = 0;
        if (n->adopt == DL_ADOPT_KEEP) {
            memcpy(f->ref, f->base, f->numel * sizeof(float));
            f->steps_ref = f->tokens_ref = 0;
            f->loss_ref = f->compute_ref = 0.0;
        }
    } else if (was == FLIGHT_ABSORBED && n->adopt == DL_ADOPT_KEEP) {
        /* an adopt took it out of theta: put it back (ref - base), with its counters */
        for (size_t i = 0; i < f->numel; i++) n->tmp[i] = f->ref[i] - f->base[i];
        DL_TRY(n->model->apply(n->model->ctx, p, 1.0f, 1.0f, n->tmp));
        memcpy(f->ref, f->base, f->numel * sizeof(float));
        f->steps += f->fl_steps;
        f->tokens += f->fl_tokens;
        f->loss += f->fl_loss;
        f->compute_s += f->fl_compute;
    } else {
        /* overwritten by an adopt (overwrite, mix, or a rebase): thrown away */
        lost = f->fl_tokens;
        n->st.discarded_tokens += lost;
        dl_mailbox_add_discarded(n->mb, p, lost);
    }
    /* the final flush sends what came back again, a few times at most (a
     * busy pool frees up; values refused stay refused) */
    if (n->finishing && f->steps > 0 && f->final_returns < DL_NODE_FLUSH_RETRIES) {
        f->final_returns++;
        f->owed_final = 1;
    }
    dl_event("push_returned", " fragment=%d base_version=%llu steps=%llu tokens=%llu discarded_tokens=%llu", p,
             (unsigned long long)base, (unsigned long long)f->fl_steps, (unsigned long long)f->fl_tokens,
             (unsigned long long)lost);
    return 1;
}

static int take_fates(dl_node *n)
{
    int k = 0;
    for (int p = 0; p < n->P; p++) {
        int rc = take_fate(n, p);
        if (rc < 0) return rc;
        k += rc;
    }
    return k;
}

int dl_node_after_step(dl_node *n, int64_t step, int H, uint64_t tokens, double loss, double compute_s)
{
    assert(n && step >= 1 && H >= 1 && tokens >= 1);
    DL_TRY(take_fates(n));
    /* the snapshots begun after the previous step were copied while this
     * step trained */
    DL_TRY(dl_node_complete(n));
    for (int p = 0; p < n->P; p++) {
        nfrag *f = &n->f[p];
        if (!f->held) continue;
        f->steps++;
        f->tokens += tokens;
        f->loss += loss;
        if (compute_s > 0 && compute_s < 1e300) f->compute_s += compute_s;
    }
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        nfrag *f = &n->f[p];
        if (!f->held) continue;
        int due = n->due ? n->due(n->due_ctx, step, p, H) : dl_plan_due(step, p, H, n->P);
        if (!(due || f->owed)) continue;
        /* an update of p waiting in the mailbox would hold the push (it may be
         * the merge of p's previous push): adopt it first, as the next poll
         * would, so a fleet that merges p more often than this learner steps
         * never starves its pushes */
        int ad = poll_one(n, p);
        if (ad < 0) return ad;
        if (f->steps == 0) { /* an overwrite or mix (or a rebase) took all of it: nothing to send */
            f->owed = 0;
            continue;
        }
        if (must_hold(n, p)) {
            if (!f->owed) n->st.held++;
            if (due) n->st.held_due++;
            f->owed = 1;
            continue;
        }
        int late = f->owed;
        f->owed = 0;
        if (n->model->deferred) {
            DL_TRY(n->model->read_begin(n->model->ctx, p));
            f->pending = late ? 2 : 1;
            f->pend_steps = f->steps;
            f->pend_tokens = f->tokens;
            f->pend_loss = f->loss;
            f->pend_compute = f->compute_s;
            pushed++;
        } else {
            int rc = push_now(n, p, 0, late);
            if (rc < 0) return rc;
            pushed += rc;
        }
    }
    return pushed;
}

/* ---- the barrier policies (node.h "Barrier") */

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int dl_node_barrier_blocked(dl_node *n)
{
    assert(n);
    if (!dl_mailbox_barrier(n->mb)) return -1;
    for (int p = 0; p < n->P; p++) {
        int64_t waited;
        if (n->f[p].owed && hold_state(n, p, &waited) == HOLD_YES) return p;
    }
    return -1;
}

/* Make every owed push whose predecessor is now decided (or released), at
 * once rather than after the next step. An owed fragment whose adopt took
 * all its progress (overwrite and mix reset the counters) has nothing left
 * to send: the debt goes, and p pushes again on its schedule. Returns the
 * number of pushes made. */
static int push_owed(dl_node *n)
{
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        nfrag *f = &n->f[p];
        if (!f->owed || !f->held || must_hold(n, p)) continue;
        f->owed = 0;
        if (f->steps == 0) continue;
        int rc = push_now(n, p, 0, 1);
        if (rc < 0) return rc;
        pushed += rc;
    }
    return pushed;
}

int dl_node_barrier_wait(dl_node *n, const volatile sig_atomic_t *stop, dl_node_barrier *out)
{
    assert(n && out);
    out->fragment = -1;
    out->waited_s = 0.0;
    out->end = NULL;
    if (!dl_mailbox_barrier(n->mb)) return 0;
    /* a debt whose predecessor was decided since the step goes now, as one
     * decided during a wait does, not after the next step */
    DL_TRY(push_owed(n));
    out->fragment = dl_node_barrier_blocked(n);
    if (out->fragment < 0) return 0;
    /* written as the wait begins (barrier_wait when it ends): a learner in a wait has one more
     * barrier_enter than barrier_wait, which tells it from a slow one */
    dl_event("barrier_enter", " fragment=%d", out->fragment);
    int64_t t0 = dl_clock_ns();
    uint64_t released = n->st.hold_released;
    /* the deferred pushes of the last step go now, not after the next one:
     * another learner's barrier may be waiting for them */
    DL_TRY(dl_node_complete(n));
    const char *end = "decided";
    for (;;) {
        DL_TRY(dl_node_poll(n));
        DL_TRY(push_owed(n));
        if (dl_node_barrier_blocked(n) < 0) break;
        if (stop && *stop) {
            end = "signal";
            break;
        }
        int s = dl_mailbox_state(n->mb, NULL, 0); /* the training loop reports these */
        if (s == DL_COMMS_REFUSED || s == DL_COMMS_FAILED) {
            end = "comms";
            break;
        }
        nap_ms(2);
    }
    if (!strcmp(end, "decided") && n->st.hold_released > released) end = "released";
    out->waited_s = (double)(dl_clock_ns() - t0) * 1e-9;
    out->end = end;
    n->st.barrier_waits++;
    n->st.barrier_wait_s += out->waited_s;
    return 1;
}

/* Final pushes of the fragments whose previous push is decided (all of them
 * with `force`): returns the number pushed; the others stay owed_final. */
static int flush_some(dl_node *n, int force)
{
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        nfrag *f = &n->f[p];
        if (!f->owed_final) continue;
        if (!f->held || f->steps == 0) { /* e.g. an overwrite adopted meanwhile: nothing left to send */
            f->owed_final = 0;
            continue;
        }
        if (!force && must_hold(n, p)) continue;
        if (force) {
            n->st.hold_released++;
            DL_WARN("node: final flush of fragment %d sent before its previous push was decided", p);
            dl_event("push_hold_released", " fragment=%d base_version=%llu final=1", p,
                     (unsigned long long)f->version);
        }
        f->owed_final = 0;
        f->owed = 0;
        if (force) f->claims_seen = UINT64_MAX;
        int rc = push_now(n, p, 1, 1);
        if (rc < 0) return rc;
        pushed += rc;
    }
    return pushed;
}

int dl_node_flush(dl_node *n)
{
    DL_TRY(dl_node_complete(n));
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        nfrag *f = &n->f[p];
        if (!f->held || f->steps == 0) continue;
        if (must_hold(n, p)) {
            f->owed_final = 1;
            continue;
        }
        f->owed = 0;
        int rc = push_now(n, p, 1, 0);
        if (rc < 0) return rc;
        pushed += rc;
    }
    return pushed;
}

int dl_node_flush_owed(dl_node *n)
{
    int k = 0;
    for (int p = 0; p < n->P; p++) k += n->f[p].owed_final;
    return k;
}

/* The trust check of an update before it is adopted (node.h "Trust"):
 * 0 when g may be adopted, else 1 with the reason (and the measures) in
 * *why / *dist / *bound. Reads theta_p only for a fragment not held yet. */
static int untrusted(dl_node *n, int p, const float *g, const char **why, double *dist, double *bound)
{
    nfrag *f = &n->f[p];
    const float *own = f->base;
    *dist = *bound = 0.0;
    if (n->max_ratio > 0 && !f->held) {
        int rc = read_now(n, p, &own);
        if (rc < 0) return rc;
    }
    double d2 = 0.0, o2 = 0.0;
    int finite = 1;
    for (size_t i = 0; i < f->numel; i++) {
        finite &= isfinite(g[i]) != 0;
        double d = (double)g[i] - (double)own[i];
        d2 += d * d;
        o2 += (double)own[i] * (double)own[i];
    }
    if (!finite) {
        *why = "nonfinite";
        return 1;
    }
    if (n->max_ratio <= 0) return 0;
    *dist = sqrt(d2);
    *bound = n->max_ratio * (sqrt(o2) + DL_NODE_RATIO_FLOOR_RMS * sqrt((double)f->numel));
    if (!(*dist <= *bound)) {
        *why = "ratio";
        return 1;
    }
    return 0;
}

int dl_node_adopt(dl_node *n, int p, uint64_t version, int forced, const float *g)
{
    assert(n && g && p >= 0 && p < n->P);
    nfrag *f = &n->f[p];
    if (f->held && !forced && version <= f->version) {
        n->st.ignored++;
        DL_DEBUG("node: update of fragment %d version %llu ignored (holding %llu)", p, (unsigned long long)version,
                 (unsigned long long)f->version);
        return 0;
    }
    const char *why = NULL;
    double dist, bound;
    int bad = untrusted(n, p, g, &why, &dist, &bound);
    if (bad < 0) return bad;
    if (bad) {
        n->st.refused++;
        int k = dl_mailbox_refuse_update(n->mb, p);
        if (!strcmp(why, "ratio"))
            DL_WARN("node: update of fragment %d version %llu refused: ||new - own|| = %.3g > %.3g "
                    "(update_max_ratio %g); fetching it again (refusal %d in a row)",
                    p, (unsigned long long)version, dist, bound, n->max_ratio, k);
        else
            DL_WARN("node: update of fragment %d version %llu refused: it holds non-finite values; fetching it "
                    "again (refusal %d in a row)", p, (unsigned long long)version, k);
        dl_event("update_refused", " fragment=%d version=%llu reason=%s distance=%.6g bound=%.6g refusals=%d", p,
                 (unsigned long long)version, why, dist, bound, k);
        return 0;
    }
    if (f->pending && forced != DL_UPDATE_NORMAL) {
        /* relative to a base the synchronizer told us to abandon */
        f->pending = 0;
        n->st.dropped++;
    }
    DL_TRY(complete(n, p));
    size_t k = f->numel;
    /* a fetch reply and the rebase after a dropped push (Ack.rebase) both
     * abandon the local base: theta_p = g whatever the adopt mode, except
     * the rebase after a push dropped stale in keep mode: what was trained
     * after that push is carried onto g as a keep adopt carries it (the
     * dropped push's own progress goes: the synchronizer counted it
     * DROPPED_STALE); it was thrown away before, so a learner whose
     * in-flight push crossed a partition lost the whole outage's work */
    int stale_keep = forced == DL_UPDATE_STALE && f->held && n->adopt == DL_ADOPT_KEEP;
    int mode = stale_keep ? DL_ADOPT_KEEP : forced != DL_UPDATE_NORMAL || !f->held ? -1 : n->adopt;
    void *ctx = n->model->ctx;
    switch (mode) {
    case DL_ADOPT_MIX: DL_TRY(n->model->apply(ctx, p, n->alpha, 1.0f - n->alpha, g)); break;
    case DL_ADOPT_KEEP: {
        /* an absorbed push's progress is out of theta already (ref - base holds it) */
        const float *sub = f->flight == FLIGHT_ABSORBED ? f->base : f->ref;
        for (size_t i = 0; i < k; i++) n->tmp[i] = g[i] - sub[i];
        DL_TRY(n->model->apply(ctx, p, 1.0f, 1.0f, n->tmp));
        break;
    }
    default: DL_TRY(n->model->apply(ctx, p, 0.0f, 1.0f, g)); break; /* rebase, overwrite: theta_p = g */
    }
    /* Progress not pushed and not kept is thrown away: the ledger counts it
     * DISCARDED from the learner's own report (Heartbeat / Bye). Keep mode
     * keeps it; a rebase, overwrite or mix drops what came after the last push. */
    if (mode != DL_ADOPT_KEEP && f->tokens > f->tokens_posted) {
        n->st.discarded_tokens += f->tokens - f->tokens_posted;
        dl_mailbox_add_discarded(n->mb, p, f->tokens - f->tokens_posted);
        journal_bump(n, p);
    }
    f->tokens_posted = 0;
    if (mode == DL_ADOPT_KEEP) {
        f->steps -= f->steps_ref;
        f->tokens -= f->tokens_ref;
        f->loss -= f->loss_ref;
        f->compute_s -= f->compute_ref;
    } else {
        f->steps = f->tokens = 0;
        f->loss = f->compute_s = 0.0;
    }
    int undecided = f->flight == FLIGHT_POSTED || f->flight == FLIGHT_ABSORBED;
    if (stale_keep && undecided) { /* decided: dropped; not to be put back by a later fate */
        undecided = 0;
        f->flight = FLIGHT_GONE;
    }
    if (n->adopt == DL_ADOPT_KEEP) {
        if (mode == DL_ADOPT_KEEP && undecided) /* ref - base stays the undecided push's progress */
            for (size_t i = 0; i < k; i++) f->ref[i] = g[i] + (f->ref[i] - f->base[i]);
        else memcpy(f->ref, g, k * sizeof(float));
        f->steps_ref = f->tokens_ref = 0;
        f->loss_ref = f->compute_ref = 0.0;
    }
    if (undecided) f->flight = mode == -1 || n->adopt != DL_ADOPT_KEEP ? FLIGHT_GONE : FLIGHT_ABSORBED;
    if (g != f->base) memcpy(f->base, g, k * sizeof(float));
    f->version = version;
    f->held = 1;
    n->st.adopted++;
    if (mode == -1 || stale_keep) n->st.rebased++;
    dl_mailbox_set_held(n->mb, p, version);
    static const char *const names[] = {"overwrite", "mix", "keep"};
    dl_event("adopt", " fragment=%d version=%llu mode=%s", p, (unsigned long long)version,
             stale_keep ? "rebase_keep" : mode < 0 ? "rebase" : names[mode]);
    return 1;
}

/* Take p's fate and waiting update, if any, and adopt it: 1 when adopted. */
static int poll_one(dl_node *n, int p)
{
    DL_TRY(take_fate(n, p));
    dl_mailbox_update u;
    if (!dl_mailbox_take_update(n->mb, p, &n->in, &u)) return 0;
    return dl_node_adopt(n, p, u.version, u.forced, n->in);
}

int dl_node_poll(dl_node *n)
{
    int adopted = 0;
    for (int p = 0; p < n->P; p++) {
        int rc = poll_one(n, p);
        if (rc < 0) return rc;
        adopted += rc;
    }
    return adopted;
}

int dl_node_wait_ready(dl_node *n, int timeout_ms, const volatile sig_atomic_t *stop)
{
    int64_t t0 = dl_clock_ns();
    for (;;) {
        DL_TRY(dl_node_poll(n));
        if (dl_node_holds_all(n)) return 0;
        char msg[640];
        int s = dl_mailbox_state(n->mb, msg, sizeof msg);
        if (s == DL_COMMS_REFUSED) return dl_err(DL_EPROTO, "%s", msg);
        if (s == DL_COMMS_FAILED || s == DL_COMMS_DONE || s == DL_COMMS_IDLE)
            return dl_err(DL_ENET, "%s", msg[0] ? msg : "comms thread not running");
        if (stop && *stop) return dl_err(DL_EAGAIN, "stopped while waiting for the initial fetch");
        int64_t heard = dl_mailbox_heard_ns(n->mb), since = heard > t0 ? heard : t0;
        if (timeout_ms >= 0 && dl_clock_ns() - since >= (int64_t)timeout_ms * 1000000) {
            int held = 0;
            for (int p = 0; p < n->P; p++) held += n->f[p].held;
            return dl_err(DL_ETIMEDOUT, "%s: nothing heard for %d ms, holding %d of %d fragments%s%s%s",
                          s == DL_COMMS_HELLO ? "no Welcome from the synchronizer" : "initial fetch incomplete",
                          timeout_ms, held, n->P, msg[0] ? " (" : "", msg, msg[0] ? ")" : "");
        }
        nap_ms(2);
    }
}

int dl_node_finish(dl_node *n, int flush_timeout_ms, uint64_t step, const char *reason)
{
    n->finishing = 1;
    int rc = dl_node_poll(n);
    int flushed = rc < 0 ? rc : dl_node_flush(n);
    if (flushed < 0) {
        dl_mailbox_bye(n->mb, "failed", step);
        return flushed;
    }
    int64_t t0 = dl_clock_ns();
    /* held final pushes go as soon as their previous push is decided and its
     * update adopted; then every push sent waits for its own decision */
    int left = dl_mailbox_flush_pending(n->mb) + dl_node_flush_owed(n);
    while (left > 0 && rc >= 0) {
        int s = dl_mailbox_state(n->mb, NULL, 0);
        if (s != DL_COMMS_READY && s != DL_COMMS_HELLO) break;
        if (dl_clock_ns() - t0 >= (int64_t)flush_timeout_ms * 1000000) break;
        nap_ms(2);
        rc = dl_node_poll(n);
        if (rc >= 0) {
            int k = flush_some(n, 0);
            if (k < 0) rc = k;
            else flushed += k;
        }
        left = dl_mailbox_flush_pending(n->mb) + dl_node_flush_owed(n);
    }
    if (rc >= 0) rc = dl_node_poll(n);
    /* out of time: the remaining progress still goes, once (it may be
     * counted twice if the undecided push was merged after all) */
    if (rc >= 0 && dl_node_flush_owed(n)) {
        int k = flush_some(n, 1);
        if (k < 0) rc = k;
        else flushed += k;
    }
    if (rc < 0) {
        dl_mailbox_bye(n->mb, "failed", step);
        return rc;
    }
    if (left)
        DL_WARN("node: final flush of %d fragments: %d fragments still have unanswered pushes after %d ms", flushed,
                left, flush_timeout_ms);
    else DL_INFO("node: final flush of %d fragments complete", flushed);
    dl_mailbox_bye(n->mb, reason, step);
    return left;
}

int dl_node_P(const dl_node *n) { return n->P; }

int dl_node_holds_all(const dl_node *n)
{
    for (int p = 0; p < n->P; p++)
        if (!n->f[p].held) return 0;
    return 1;
}

int dl_node_held(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->f[p].held;
}

uint64_t dl_node_version(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->f[p].version;
}

uint64_t dl_node_steps(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->f[p].steps;
}

uint64_t dl_node_tokens(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->f[p].tokens;
}

double dl_node_compute_s(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->f[p].compute_s;
}

int dl_node_owes(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->f[p].owed || n->f[p].owed_final;
}

const float *dl_node_base(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->f[p].base;
}

void dl_node_get_stats(const dl_node *n, dl_node_stats *out)
{
    *out = n->st;
    out->steps_behind_max = 0;
    for (int p = 0; p < n->P; p++)
        if (n->f[p].held && n->f[p].steps > out->steps_behind_max) out->steps_behind_max = n->f[p].steps;
}

/* ---- the node's state across a restart (node.h) */

/* A saved state, host byte order (it is read back on the machine that
 * wrote it): head, P fragment records, the bases in fragment order, the
 * error feedback residuals of the fragments whose record says so (format 2;
 * format 1 has none), and the XXH64 of all that. */
#define STATE_MAGIC 0x534e4c44u /* "DLNS" */
#define STATE_FORMAT 2u
#define JOURNAL_MAGIC 0x4a4e4c44u /* "DLNJ" */

typedef struct {
    uint32_t magic, format;
    uint64_t fingerprint, tag, step, total_numel;
    uint32_t P, adopt;
} state_head;

typedef struct {
    uint32_t carry;      /* theta_p - base_p is unpushed progress (0: a push since the adopt, not keep) */
    uint32_t pushed;     /* a push on this version left since its adopt (it may have merged) */
    uint32_t queued;     /* a push posted and still queued (not left): carried with it, unless claimed after */
    uint32_t residual;   /* format 2: p's error feedback residual follows the bases (format 1: always 0) */
    uint64_t claims;     /* pushes of p claimed so far (the journal's claim counter) */
    uint64_t version, steps, tokens, journal;
    double loss, compute_s;
} state_frag;

void dl_node_set_ef(dl_node *n, int p, struct dl_ef *ef)
{
    assert(n && p >= 0 && p < n->P);
    n->f[p].ef = ef;
}

/* The fixed part: everything but the residuals and the checksum. */
static size_t state_fixed(const dl_node *n)
{
    return sizeof(state_head) + (size_t)n->P * sizeof(state_frag) + dl_plan_total_numel(n->plan) * sizeof(float);
}

size_t dl_node_state_bytes(const dl_node *n)
{
    size_t r = 0;
    for (int p = 0; p < n->P; p++) r += n->f[p].ef ? n->f[p].numel * sizeof(float) : 0;
    return state_fixed(n) + r + sizeof(uint64_t);
}

size_t dl_node_state_max_bytes(const dl_node *n)
{
    return state_fixed(n) + dl_plan_total_numel(n->plan) * sizeof(float) + sizeof(uint64_t);
}

int dl_node_state_copy(const dl_node *n, uint64_t fingerprint, uint64_t tag, uint64_t step, void *buf, size_t *len)
{
    uint8_t *b = buf;
    state_head h = {.magic = STATE_MAGIC, .format = STATE_FORMAT, .fingerprint = fingerprint, .tag = tag,
                    .step = step, .total_numel = dl_plan_total_numel(n->plan), .P = (uint32_t)n->P,
                    .adopt = (uint32_t)n->adopt};
    memcpy(b, &h, sizeof h);
    state_frag *sf = (state_frag *)(b + sizeof h);
    float *bases = (float *)(b + sizeof h + (size_t)n->P * sizeof(state_frag));
    uint8_t *res = b + state_fixed(n);
    for (int p = 0; p < n->P; p++) {
        const nfrag *f = &n->f[p];
        /* a push still queued never left: its progress is the learner's, carried with the rest unless the
         * journal's claim counter says it left after the save */
        int queued = f->flight == FLIGHT_POSTED && dl_mailbox_queued(n->mb, p);
        state_frag r = {.version = f->version, .journal = f->journal, .queued = (uint32_t)queued,
                        .claims = dl_mailbox_claims_total(n->mb, p),
                        .pushed = !queued && (f->tokens_posted > 0 || f->flight == FLIGHT_POSTED)};
        /* keep: the progress since the push (ref_p) is unpushed, the push
         * itself the synchronizer's; an absorbed push is ref_p - base_p, out of theta */
        const float *from = f->base;
        if (f->held && queued) {
            r.carry = 1;
            r.steps = f->steps;
            r.tokens = f->tokens;
            r.loss = f->loss;
            r.compute_s = f->compute_s;
        } else if (f->held && n->adopt == DL_ADOPT_KEEP) {
            if (f->flight != FLIGHT_ABSORBED) from = f->ref;
            r.carry = 1;
            r.steps = f->steps - f->steps_ref;
            r.tokens = f->tokens - f->tokens_ref;
            r.loss = f->loss - f->loss_ref;
            r.compute_s = f->compute_s - f->compute_ref;
        } else if (f->held && f->tokens_posted == 0) {
            r.carry = 1;
            r.steps = f->steps;
            r.tokens = f->tokens;
            r.loss = f->loss;
            r.compute_s = f->compute_s;
        }
        if (!f->held) r.carry = 0, r.version = UINT64_MAX;
        /* the residual the session would start from now (learner/ef.h): what the accepted pushes owe */
        if (f->held && f->ef && dl_ef_snapshot(f->ef, p, (float *)res)) {
            r.residual = 1;
            res += f->numel * sizeof(float);
        }
        memcpy(&sf[p], &r, sizeof r);
        memcpy(bases, from, f->numel * sizeof(float));
        bases += f->numel;
    }
    size_t body = (size_t)(res - b);
    uint64_t sum = dl_hash64(b, body, 0);
    memcpy(b + body, &sum, sizeof sum);
    *len = body + sizeof sum;
    return 0;
}

int dl_node_state_restore(dl_node *n, const void *buf, size_t len, uint64_t fingerprint, uint64_t tag, uint64_t step,
                          const uint64_t *journal, int journal_n, dl_node_restored *out)
{
    const uint8_t *b = buf;
    memset(out, 0, sizeof *out);
    size_t fixed = state_fixed(n);
    state_head h;
    if (len < sizeof h) return dl_err(DL_ETRUNC, "learner state: %zu bytes, shorter than its head", len);
    memcpy(&h, b, sizeof h);
    if (h.magic != STATE_MAGIC) return dl_err(DL_EFORMAT, "learner state: not a dloco learner state (bad magic)");
    if (h.format < 1 || h.format > STATE_FORMAT)
        return dl_err(DL_EFORMAT, "learner state: format %u, this learner reads 1 to %u (written by a newer dloco? "
                                  "start this learner without it)", h.format, STATE_FORMAT);
    if (h.fingerprint != fingerprint || h.P != (uint32_t)n->P || h.total_numel != dl_plan_total_numel(n->plan))
        return dl_err(DL_EMISMATCH, "learner state: of another model (fingerprint %016llx, P=%u) than this one "
                                    "(%016llx, P=%d)", (unsigned long long)h.fingerprint, h.P,
                      (unsigned long long)fingerprint, n->P);
    if (len < fixed + sizeof(uint64_t))
        return dl_err(DL_ETRUNC, "learner state: %zu bytes, this model's has at least %zu", len,
                      fixed + sizeof(uint64_t));
    /* the residuals' length follows from the records: read them before the checksum, bounded by the file */
    const state_frag *sf0 = (const state_frag *)(b + sizeof h);
    size_t want = fixed + sizeof(uint64_t);
    for (int p = 0; p < n->P; p++) {
        state_frag r;
        memcpy(&r, &sf0[p], sizeof r);
        if (r.residual > 1 || (h.format < 2 && r.residual))
            return dl_err(DL_ERANGE, "learner state: fragment %d: residual flag %u", p, r.residual);
        if (r.residual) want += n->f[p].numel * sizeof(float);
    }
    if (len != want) return dl_err(DL_ETRUNC, "learner state: %zu bytes, its records say %zu", len, want);
    uint64_t sum;
    memcpy(&sum, b + want - sizeof sum, sizeof sum);
    if (dl_hash64(b, want - sizeof sum, 0) != sum) return dl_err(DL_ECORRUPT, "learner state: checksum mismatch");
    if (h.tag != tag) return dl_err(DL_EMISMATCH, "learner state: of another run or learner id");
    if (h.step != step)
        return dl_err(DL_EMISMATCH, "learner state: saved at step %llu, but the learner resumes at step %llu (its "
                                    "parameters were saved at another step)",
                      (unsigned long long)h.step, (unsigned long long)step);
    const float *bases = (const float *)(b + sizeof h + (size_t)n->P * sizeof(state_frag));
    for (int p = 0; p < n->P; p++) {
        state_frag r;
        memcpy(&r, &sf0[p], sizeof r);
        if (r.version == UINT64_MAX) return dl_err(DL_ERANGE, "learner state: fragment %d was never held", p);
        if (r.carry > 1 || r.pushed > 1 || r.queued > 1 || r.steps > step || r.tokens < r.steps || (r.steps == 0 && r.tokens) ||
            !isfinite(r.loss) || !(r.compute_s >= 0 && isfinite(r.compute_s)))
            return dl_err(DL_ERANGE, "learner state: fragment %d: counters no learner at step %llu can hold", p,
                          (unsigned long long)step);
    }
    /* bases and residuals are contiguous floats up to the checksum */
    size_t nf = (want - sizeof(uint64_t) - sizeof h - (size_t)n->P * sizeof(state_frag)) / sizeof(float);
    for (size_t i = 0; i < nf; i++) {
        float v;
        memcpy(&v, (const uint8_t *)bases + i * sizeof v, sizeof v);
        if (!isfinite(v)) return dl_err(DL_ERANGE, "learner state: a base or residual value is not finite");
    }
    out->format = (int)h.format;
    const uint8_t *res = b + fixed;
    for (int p = 0; p < n->P; p++) {
        nfrag *f = &n->f[p];
        state_frag r;
        memcpy(&r, &sf0[p], sizeof r);
        /* journal: [P] node counters, then [P] claim counters */
        int same = journal && p < journal_n && journal[p] == r.journal;
        int nc = n->P + p;
        if (r.queued) same &= journal && nc < journal_n && journal[nc] == r.claims;
        f->journal = journal && p < journal_n && journal[p] > r.journal ? journal[p] : r.journal;
        f->claims0 = journal && nc < journal_n && journal[nc] > r.claims ? journal[nc] : r.claims;
        if (r.carry && same) {
            memcpy(f->base, bases, f->numel * sizeof(float));
            f->steps = r.steps;
            f->tokens = r.tokens;
            f->loss = r.loss;
            f->compute_s = r.compute_s;
            out->carried += r.tokens;
            dl_mailbox_set_carried(n->mb, p, r.tokens);
        } else {
            /* pushed or thrown away since the save (or not separable): its
             * progress is the synchronizer's account; measure from theta now */
            const float *theta;
            DL_TRY(read_now(n, p, &theta));
            memcpy(f->base, theta, f->numel * sizeof(float));
            f->steps = f->tokens = 0;
            f->loss = f->compute_s = 0.0;
        }
        /* the residual as saved while nothing moved it since (the journal agrees); a push after the save
         * carried it on (what that push's residual was, the file does not know): it starts at zero then */
        if (r.residual) {
            int kept = 0;
            if (same && f->ef) {
                int rc = dl_ef_restore(f->ef, p, (const float *)res);
                if (rc < 0) return rc;
                kept = rc;
            }
            if (kept) out->residuals++;
            else out->residuals_dropped++;
            res += f->numel * sizeof(float);
        }
        bases += f->numel;
        if (f->ref) memcpy(f->ref, f->base, f->numel * sizeof(float));
        f->steps_ref = f->tokens_ref = f->tokens_posted = 0;
        f->loss_ref = f->compute_ref = 0.0;
        f->flight = FLIGHT_NONE;
        f->owed = f->owed_final = f->pending = 0;
        f->version = r.version;
        f->held = 1;
        dl_mailbox_set_held(n->mb, p, r.version);
    }
    return 0;
}

int dl_node_set_journal(dl_node *n, int fd, uint64_t tag)
{
    n->jfd = -1;
    if (fd < 0) return 0;
    size_t len = DL_NODE_JOURNAL_HEAD + 8 * (size_t)n->P;
    uint8_t *b = dl_try_calloc(1, len);
    if (!b) return dl_err(DL_ENOMEM, "push journal: out of memory");
    uint32_t head[2] = {JOURNAL_MAGIC, (uint32_t)n->P};
    memcpy(b, head, sizeof head);
    memcpy(b + 8, &tag, sizeof tag);
    for (int p = 0; p < n->P; p++) memcpy(b + DL_NODE_JOURNAL_HEAD + 8 * (size_t)p, &n->f[p].journal, 8);
    ssize_t w = pwrite(fd, b, len, 0);
    free(b);
    if (w != (ssize_t)len) return dl_err(DL_EIO, "push journal: cannot write: %s", strerror(errno));
    n->jfd = fd;
    uint64_t *base = dl_try_calloc((size_t)n->P, sizeof *base);
    if (!base) return dl_err(DL_ENOMEM, "push journal: out of memory");
    for (int p = 0; p < n->P; p++) base[p] = n->f[p].claims0;
    dl_mailbox_set_claims_journal(n->mb, fd, (int64_t)len, base);
    free(base);
    return 0;
}

int dl_node_journal_read(const char *path, uint64_t tag, uint64_t *out, int P)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    uint8_t head[DL_NODE_JOURNAL_HEAD];
    int k = 0;
    uint32_t magic, p32;
    uint64_t t;
    if (pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head) {
        memcpy(&magic, head, 4);
        memcpy(&p32, head + 4, 4);
        memcpy(&t, head + 8, 8);
        if (magic == JOURNAL_MAGIC && p32 == (uint32_t)P && t == tag)
            while (k < 2 * P && pread(fd, &out[k], 8, (off_t)(DL_NODE_JOURNAL_HEAD + 8 * (size_t)k)) == 8) k++;
    }
    close(fd);
    return k;
}
