/* Training-thread side of a networked learner: fragment bases and versions,
 * counters since adopt, pushes (delta = base - theta), adopt modes, initial fetch wait, final flush. */
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

struct dl_node {
    const dl_plan *plan;
    float *params;
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
    float *out;  /* [comms buf] delta being posted (swapped with the mailbox) */
    float *in;   /* [comms buf] update being adopted (swapped with the mailbox) */
    float *tmp;  /* [max numel] theta_p gathered */
    dl_node_stats st;
};

int dl_node_open(const dl_node_opts *o, dl_comms *comms, dl_node **out)
{
    assert(o && comms && out);
    *out = NULL;
    if (!o->plan || !o->params) return dl_err(DL_EINVAL, "node: no plan or parameter buffer");
    if (o->adopt < DL_ADOPT_OVERWRITE || o->adopt > DL_ADOPT_KEEP)
        return dl_err(DL_EINVAL, "node: unknown adopt mode %d", o->adopt);
    if (!(o->alpha >= 0.0f && o->alpha <= 1.0f)) return dl_err(DL_EINVAL, "node: alpha %g outside [0, 1]", o->alpha);
    dl_node *n = dl_xcalloc(1, sizeof *n);
    n->plan = o->plan;
    n->params = o->params;
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
    free(n->out);
    free(n->in);
    free(n->tmp);
    free(n);
    *np = NULL;
}

void dl_node_delta(dl_node *n, int p, float *out)
{
    assert(n && out && p >= 0 && p < n->P && n->held[p]);
    dl_plan_gather(n->plan, p, n->params, n->tmp);
    dl_cpu_pseudograd(out, n->base[p], n->tmp, n->numel[p]);
}

static void push(dl_node *n, int p, int final)
{
    assert(n->held[p] && n->steps[p] >= 1);
    dl_node_delta(n, p, n->out); /* leaves theta_p in n->tmp */
    dl_comms_push h = {
        .fragment = p,
        .base_version = n->version[p],
        .steps = n->steps[p],
        .tokens = n->tokens[p],
        .loss = n->loss[p] / (double)n->steps[p],
        .final = final,
    };
    n->st.coalesced += (uint64_t)dl_comms_post_push(n->comms, &h, &n->out);
    n->st.pushes++;
    if (final) n->st.flushed++;
    if (n->adopt == DL_ADOPT_KEEP) {
        memcpy(n->ref[p], n->tmp, n->numel[p] * sizeof(float));
        n->steps_ref[p] = n->steps[p];
        n->tokens_ref[p] = n->tokens[p];
        n->loss_ref[p] = n->loss[p];
    }
}

int dl_node_after_step(dl_node *n, int64_t step, int H, uint64_t tokens, double loss)
{
    assert(n && step >= 1 && H >= 1 && tokens >= 1);
    for (int p = 0; p < n->P; p++) {
        if (!n->held[p]) continue;
        n->steps[p]++;
        n->tokens[p] += tokens;
        n->loss[p] += loss;
    }
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        if (!n->held[p] || !dl_plan_due(step, p, H, n->P)) continue;
        push(n, p, 0);
        pushed++;
    }
    return pushed;
}

int dl_node_flush(dl_node *n)
{
    int pushed = 0;
    for (int p = 0; p < n->P; p++) {
        if (!n->held[p] || n->steps[p] == 0) continue;
        push(n, p, 1);
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
    size_t k = n->numel[p];
    int mode = forced || !n->held[p] ? -1 : n->adopt;
    const float *theta = g; /* new theta_p */
    switch (mode) {
    case DL_ADOPT_MIX: {
        float a = n->alpha, b = 1.0f - n->alpha;
        dl_plan_gather(n->plan, p, n->params, n->tmp);
        for (size_t i = 0; i < k; i++) n->tmp[i] = a * n->tmp[i] + b * g[i];
        theta = n->tmp;
        break;
    }
    case DL_ADOPT_KEEP:
        dl_plan_gather(n->plan, p, n->params, n->tmp);
        for (size_t i = 0; i < k; i++) n->tmp[i] = g[i] + (n->tmp[i] - n->ref[p][i]);
        theta = n->tmp;
        break;
    default: break; /* rebase, overwrite: theta_p = g */
    }
    dl_plan_scatter(n->plan, p, theta, n->params);
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
        if (dl_comms_take_update(n->comms, p, &n->in, &u)) adopted += dl_node_adopt(n, p, u.version, u.forced, n->in);
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
        dl_node_poll(n);
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
    dl_node_poll(n);
    int flushed = dl_node_flush(n);
    int64_t t0 = dl_clock_ns();
    int left = dl_comms_flush_pending(n->comms);
    while (left > 0) {
        int s = dl_comms_state(n->comms, NULL, 0);
        if (s != DL_COMMS_READY && s != DL_COMMS_HELLO) break;
        if (dl_clock_ns() - t0 >= (int64_t)flush_timeout_ms * 1000000) break;
        nap_ms(2);
        dl_node_poll(n);
        left = dl_comms_flush_pending(n->comms);
    }
    dl_node_poll(n);
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
