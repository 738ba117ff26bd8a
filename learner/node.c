/* Training-thread side of a networked learner: fragment bases and versions,
 * counters since adopt, pushes (delta = base - theta, deferred on a GPU), adopt modes through the
 * parameter interface, initial fetch wait, final flush; and the host parameter interface. */
#include "learner/node.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "core/plan.h"
#include "kernels/cpu.h"

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
        h->snap[p] = h->shared ? h->shared : dl_xmalloc(dl_plan_fragment_numel(h->plan, p) * sizeof(float));
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
    host_model *h = dl_xcalloc(1, sizeof *h);
    h->plan = plan;
    h->params = params;
    h->snap = dl_xcalloc((size_t)dl_plan_P(plan), sizeof *h->snap);
    h->tmp = dl_xcalloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    if (!deferred) h->shared = dl_xcalloc(dl_plan_max_fragment_numel(plan), sizeof(float));
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

struct dl_node {
    const dl_plan *plan;
    const dl_node_model *model;
    dl_node_model *own_model; /* host model over opts.params, or NULL */
    dl_comms *comms;
    int P;
    int adopt;
    float alpha;
    size_t *numel;     /* [P] */
    float **base;      /* [P][numel_p] last adopted global */
    float **ref;       /* keep mode: [P][numel_p] theta at the last push, or the last global */
    uint64_t *version; /* [P] */
    uint8_t *held;     /* [P] base_p is valid */
    uint64_t *steps, *tokens; /* [P] since the reference point of the next delta */
    double *loss;             /* [P] summed training loss over those steps */
    uint64_t *steps_ref, *tokens_ref; /* keep mode: counters at the last push */
    double *loss_ref;
    uint8_t *pending;                   /* [P] deferred push begun (read_begin), not yet posted */
    uint64_t *pend_steps, *pend_tokens; /* [P] counters at its snapshot */
    double *pend_loss;
    float *out;  /* [comms buf] delta being posted (swapped with the mailbox) */
    float *in;   /* [comms buf] update being adopted (swapped with the mailbox) */
    float *tmp;  /* [max numel] keep mode: g - ref_p */
    dl_node_stats st;
};

int dl_node_open(const dl_node_opts *o, dl_comms *comms, dl_node **out)
{
    assert(o && comms && out);
    *out = NULL;
    if (!o->plan || (!o->params && !o->model))
        return dl_err(DL_EINVAL, "node: no plan, or neither a parameter buffer nor a parameter interface");
    if (o->model && !o->params && (!o->model->read_begin || !o->model->read_end || !o->model->apply))
        return dl_err(DL_EINVAL, "node: parameter interface without read_begin/read_end/apply");
    if (o->adopt < DL_ADOPT_OVERWRITE || o->adopt > DL_ADOPT_KEEP)
        return dl_err(DL_EINVAL, "node: unknown adopt mode %d", o->adopt);
    if (!(o->alpha >= 0.0f && o->alpha <= 1.0f)) return dl_err(DL_EINVAL, "node: alpha %g outside [0, 1]", o->alpha);
    dl_node *n = dl_xcalloc(1, sizeof *n);
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
    n->comms = comms;
    n->P = dl_plan_P(o->plan);
    n->adopt = o->adopt;
    n->alpha = o->alpha;
    size_t P = (size_t)n->P;
    n->numel = dl_xcalloc(P, sizeof *n->numel);
    n->base = dl_xcalloc(P, sizeof *n->base);
    n->ref = dl_xcalloc(P, sizeof *n->ref);
    for (int p = 0; p < n->P; p++) {
        n->numel[p] = dl_plan_fragment_numel(o->plan, p);
        n->base[p] = dl_xcalloc(n->numel[p], sizeof(float));
        if (n->adopt == DL_ADOPT_KEEP) n->ref[p] = dl_xcalloc(n->numel[p], sizeof(float));
    }
    n->version = dl_xcalloc(P, sizeof *n->version);
    n->held = dl_xcalloc(P, 1);
    n->steps = dl_xcalloc(P, sizeof *n->steps);
    n->tokens = dl_xcalloc(P, sizeof *n->tokens);
    n->loss = dl_xcalloc(P, sizeof *n->loss);
    n->steps_ref = dl_xcalloc(P, sizeof *n->steps_ref);
    n->tokens_ref = dl_xcalloc(P, sizeof *n->tokens_ref);
    n->loss_ref = dl_xcalloc(P, sizeof *n->loss_ref);
    n->pending = dl_xcalloc(P, 1);
    n->pend_steps = dl_xcalloc(P, sizeof *n->pend_steps);
    n->pend_tokens = dl_xcalloc(P, sizeof *n->pend_tokens);
    n->pend_loss = dl_xcalloc(P, sizeof *n->pend_loss);
    n->out = dl_comms_buf_alloc(comms);
    n->in = dl_comms_buf_alloc(comms);
    n->tmp = dl_xcalloc(dl_plan_max_fragment_numel(o->plan), sizeof(float));
    *out = n;
    return 0;
}

void dl_node_close(dl_node **np)
{
    if (!np || !*np) return;
    dl_node *n = *np;
    for (int p = 0; p < n->P; p++) {
        free(n->base[p]);
        free(n->ref[p]);
    }
    free(n->base);
    free(n->ref);
    free(n->numel);
    free(n->version);
    free(n->held);
    free(n->steps);
    free(n->tokens);
    free(n->loss);
    free(n->steps_ref);
    free(n->tokens_ref);
    free(n->loss_ref);
    free(n->pending);
    free(n->pend_steps);
    free(n->pend_tokens);
    free(n->pend_loss);
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

/* Post the push of p: delta = base_p - theta (theta_p as it was after the
 * step the counters describe). */
static void post(dl_node *n, int p, const float *theta, uint64_t steps, uint64_t tokens, double loss, int final)
{
    assert(n->held[p] && steps >= 1);
    dl_cpu_pseudograd(n->out, n->base[p], theta, n->numel[p]);
    dl_comms_push h = {
        .fragment = p,
        .base_version = n->version[p],
        .steps = steps,
        .tokens = tokens,
        .loss = loss / (double)steps,
        .final = final,
    };
    n->st.coalesced += (uint64_t)dl_comms_post_push(n->comms, &h, &n->out);
    n->st.pushes++;
    if (final) n->st.flushed++;
    if (n->adopt == DL_ADOPT_KEEP) {
        memcpy(n->ref[p], theta, n->numel[p] * sizeof(float));
        n->steps_ref[p] = steps;
        n->tokens_ref[p] = tokens;
        n->loss_ref[p] = loss;
    }
}

static int push_now(dl_node *n, int p, int final)
{
    const float *theta;
    DL_TRY(read_now(n, p, &theta));
    post(n, p, theta, n->steps[p], n->tokens[p], n->loss[p], final);
    return 0;
}

/* Complete the deferred push of p, if one is pending: 1 when posted. */
static int complete(dl_node *n, int p)
{
    if (!n->pending[p]) return 0;
    n->pending[p] = 0;
    const float *theta;
    DL_TRY(n->model->read_end(n->model->ctx, p, &theta));
    post(n, p, theta, n->pend_steps[p], n->pend_tokens[p], n->pend_loss[p], 0);
    return 1;
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
    assert(n && out && p >= 0 && p < n->P && n->held[p]);
    DL_TRY(complete(n, p));
    const float *theta;
    DL_TRY(read_now(n, p, &theta));
    dl_cpu_pseudograd(out, n->base[p], theta, n->numel[p]);
    return 0;
}

int dl_node_after_step(dl_node *n, int64_t step, int H, uint64_t tokens, double loss)
{
    assert(n && step >= 1 && H >= 1 && tokens >= 1);
    /* the snapshots begun after the previous step were copied while this
     * step trained */
    DL_TRY(dl_node_complete(n));
    for (int p = 0; p < n->P; p++) {
        if (!n->held[p]) continue;
        n->steps[p]++;
        n->tokens[p] += tokens;
        n->loss[p] += loss;
    }
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        if (!n->held[p] || !dl_plan_due(step, p, H, n->P)) continue;
        if (n->model->deferred) {
            DL_TRY(n->model->read_begin(n->model->ctx, p));
            n->pending[p] = 1;
            n->pend_steps[p] = n->steps[p];
            n->pend_tokens[p] = n->tokens[p];
            n->pend_loss[p] = n->loss[p];
        } else {
            DL_TRY(push_now(n, p, 0));
        }
        pushed++;
    }
    return pushed;
}

int dl_node_flush(dl_node *n)
{
    DL_TRY(dl_node_complete(n));
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        if (!n->held[p] || n->steps[p] == 0) continue;
        DL_TRY(push_now(n, p, 1));
        pushed++;
    }
    return pushed;
}

int dl_node_adopt(dl_node *n, int p, uint64_t version, int forced, const float *g)
{
    assert(n && g && p >= 0 && p < n->P);
    if (n->held[p] && !forced && version <= n->version[p]) {
        n->st.ignored++;
        DL_DEBUG("node: update of fragment %d version %llu ignored (holding %llu)", p, (unsigned long long)version,
                 (unsigned long long)n->version[p]);
        return 0;
    }
    if (n->pending[p] && forced) {
        /* relative to a base the synchronizer told us to abandon */
        n->pending[p] = 0;
        n->st.dropped++;
    }
    DL_TRY(complete(n, p));
    size_t k = n->numel[p];
    int mode = forced || !n->held[p] ? -1 : n->adopt;
    void *ctx = n->model->ctx;
    switch (mode) {
    case DL_ADOPT_MIX: DL_TRY(n->model->apply(ctx, p, n->alpha, 1.0f - n->alpha, g)); break;
    case DL_ADOPT_KEEP:
        for (size_t i = 0; i < k; i++) n->tmp[i] = g[i] - n->ref[p][i];
        DL_TRY(n->model->apply(ctx, p, 1.0f, 1.0f, n->tmp));
        break;
    default: DL_TRY(n->model->apply(ctx, p, 0.0f, 1.0f, g)); break; /* rebase, overwrite: theta_p = g */
    }
    if (mode == DL_ADOPT_KEEP) {
        n->steps[p] -= n->steps_ref[p];
        n->tokens[p] -= n->tokens_ref[p];
        n->loss[p] -= n->loss_ref[p];
    } else {
        n->steps[p] = n->tokens[p] = 0;
        n->loss[p] = 0.0;
    }
    if (n->adopt == DL_ADOPT_KEEP) {
        memcpy(n->ref[p], g, k * sizeof(float));
        n->steps_ref[p] = n->tokens_ref[p] = 0;
        n->loss_ref[p] = 0.0;
    }
    if (g != n->base[p]) memcpy(n->base[p], g, k * sizeof(float));
    n->version[p] = version;
    n->held[p] = 1;
    n->st.adopted++;
    if (mode == -1) n->st.rebased++;
    dl_comms_set_held(n->comms, p, version);
    return 1;
}

int dl_node_poll(dl_node *n)
{
    int adopted = 0;
    for (int p = 0; p < n->P; p++) {
        dl_comms_update u;
        if (!dl_comms_take_update(n->comms, p, &n->in, &u)) continue;
        int rc = dl_node_adopt(n, p, u.version, u.forced, n->in);
        if (rc < 0) return rc;
        adopted += rc;
    }
    return adopted;
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int dl_node_wait_ready(dl_node *n, int timeout_ms, const volatile sig_atomic_t *stop)
{
    int64_t t0 = dl_clock_ns();
    for (;;) {
        DL_TRY(dl_node_poll(n));
        if (dl_node_holds_all(n)) return 0;
        char msg[640];
        int s = dl_comms_state(n->comms, msg, sizeof msg);
        if (s == DL_COMMS_REFUSED) return dl_err(DL_EPROTO, "%s", msg);
        if (s == DL_COMMS_FAILED || s == DL_COMMS_DONE || s == DL_COMMS_IDLE)
            return dl_err(DL_ENET, "%s", msg[0] ? msg : "comms thread not running");
        if (stop && *stop) return dl_err(DL_EAGAIN, "stopped while waiting for the initial fetch");
        if (dl_clock_ns() - t0 >= (int64_t)timeout_ms * 1000000) {
            int held = 0;
            for (int p = 0; p < n->P; p++) held += n->held[p];
            return dl_err(DL_ETIMEDOUT, "%s after %d ms: holding %d of %d fragments",
                          s == DL_COMMS_HELLO ? "no Welcome from the synchronizer" : "initial fetch incomplete",
                          timeout_ms, held, n->P);
        }
        nap_ms(2);
    }
}

int dl_node_finish(dl_node *n, int flush_timeout_ms, uint64_t step, const char *reason)
{
    int rc = dl_node_poll(n);
    int flushed = rc < 0 ? rc : dl_node_flush(n);
    if (flushed < 0) {
        dl_comms_bye(n->comms, "failed", step);
        return flushed;
    }
    int64_t t0 = dl_clock_ns();
    int left = dl_comms_flush_pending(n->comms);
    while (left > 0 && rc >= 0) {
        int s = dl_comms_state(n->comms, NULL, 0);
        if (s != DL_COMMS_READY && s != DL_COMMS_HELLO) break;
        if (dl_clock_ns() - t0 >= (int64_t)flush_timeout_ms * 1000000) break;
        nap_ms(2);
        rc = dl_node_poll(n);
        left = dl_comms_flush_pending(n->comms);
    }
    if (rc >= 0) rc = dl_node_poll(n);
    if (rc < 0) {
        dl_comms_bye(n->comms, "failed", step);
        return rc;
    }
    if (left)
        DL_WARN("node: final flush of %d fragments: %d fragments still have unanswered pushes after %d ms", flushed,
                left, flush_timeout_ms);
    else DL_INFO("node: final flush of %d fragments complete", flushed);
    dl_comms_bye(n->comms, reason, step);
    return left;
}

int dl_node_P(const dl_node *n) { return n->P; }

int dl_node_holds_all(const dl_node *n)
{
    for (int p = 0; p < n->P; p++)
        if (!n->held[p]) return 0;
    return 1;
}

int dl_node_held(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->held[p];
}

uint64_t dl_node_version(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->version[p];
}

uint64_t dl_node_steps(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->steps[p];
}

uint64_t dl_node_tokens(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->tokens[p];
}

const float *dl_node_base(const dl_node *n, int p)
{
    assert(p >= 0 && p < n->P);
    return n->base[p];
}

void dl_node_get_stats(const dl_node *n, dl_node_stats *out) { *out = n->st; }
