/* Training-thread side of a networked learner: fragment bases and versions,
 * counters since adopt, pushes (delta = base - theta, deferred on a GPU), adopt modes through the
 * parameter interface, initial fetch wait, final flush; and the host parameter interface. Its saved
 * state and push journal: node_state.c; the struct both share: node_int.h. */
#include "learner/node.h"
#include "learner/node_int.h"

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
int dl_node_read_now(dl_node *n, int p, const float **theta)
{
    DL_TRY(n->model->read_begin(n->model->ctx, p));
    return n->model->read_end(n->model->ctx, p, theta);
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
        if (final) f->owed_final = 1, dl_mailbox_flush_owe(n->mb, p, 1);
        else f->owed = 1;
        n->st.held++;
        return 0;
    }
    n->st.coalesced += (uint64_t)rc;
    dl_node_journal_bump(n, p);
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
    DL_TRY(dl_node_read_now(n, p, &theta));
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
    DL_TRY(dl_node_read_now(n, p, &theta));
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
        dl_mailbox_flush_owe(n->mb, p, 1);
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
            dl_mailbox_flush_owe(n->mb, p, 0);
            continue;
        }
        if (!force && must_hold(n, p)) continue;
        if (force) {
            n->st.hold_released++;
            DL_WARN("node: final flush of fragment %d sent before its previous push was decided", p);
            dl_event("push_hold_released", " fragment=%d base_version=%llu final=1", p,
                     (unsigned long long)f->version);
        }
        f->owed_final = 0; /* its mailbox mark stays: the push posted now is owed until a session claims it */
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
    /* every fragment the flush pushes is owed before the first of them leaves: each final push names the
     * others still to come (Push.final_pending), and the synchronizer's rounds of those wait for them */
    for (int p = 0; p < n->P; p++)
        if (n->f[p].held && n->f[p].steps > 0) dl_mailbox_flush_owe(n->mb, p, 1);
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
        int rc = dl_node_read_now(n, p, &own);
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
        dl_node_journal_bump(n, p);
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
