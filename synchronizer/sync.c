/* dloco-sync: one libev loop owns the ROUTER socket, the learner registry and
 * the merge policy; one worker thread merges, steps and commits each closed
 * round (and does every other LMDB write), so no merge or fsync blocks the loop. */
#include "synchronizer/sync.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "core/plan.h"
#include "proto/wire.h"
#include "storage/store.h"

#include <assert.h>
#include <ev.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ------------------------------------------------------------------------ */
/* state */

typedef struct {
    int used;       /* slot holds a learner (registered now or earlier) */
    int registered; /* said hello and not bye */
    int live;       /* heard from within liveness * heartbeat */
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    int64_t last_seen_ns;     /* monotonic */
    int64_t first_seen_wall;  /* wallclock ns */
    uint64_t step, tokens;    /* from its heartbeats */
    double steps_per_s;
    uint64_t hellos, pushes, merged, dropped, rejected, tokens_applied, bytes_in, bytes_out;
    uint64_t last_push_tokens; /* tokens of its latest push: its expected contribution to a round */
} learner_slot;

typedef struct {
    int used;
    float *delta; /* aligned copy of the payload */
    uint32_t learner;
    int fragment;
} pending_push;

typedef struct {
    dl_merge_contrib c; /* a dropped-stale push, recorded in the next merge record of its fragment */
} aside_entry;

typedef enum { JOB_MERGE, JOB_LEARNER_PUT, JOB_LEDGER, JOB_SYNC } job_kind;

typedef struct job {
    job_kind kind;
    struct job *next;
    /* merge */
    int fragment;
    uint64_t version; /* merges onto this version; commits version + 1 */
    dl_merge_opts mopts; /* merge settings at submission (SIGHUP may change the live ones) */
    double share;        /* this round's tokens / the live fleet's tokens per push period, (0, 1] */
    int m;
    float **deltas;
    double *w;
    uint64_t *handles;
    dl_merge_record rec;
    /* learner put / ledger */
    dl_store_learner lrec;
    int ledger_state;
    uint64_t ledger_tokens;
    /* result */
    int rc;
    double norm;
    char err[320];
} job;

struct dl_sync {
    dl_sync_cfg cfg;
    char endpoint[256];
    void *zctx, *router;
    struct ev_loop *loop;
    ev_io zio;
    ev_timer tick, deadline, status;
    ev_async wake;
    ev_signal sigint, sigterm, sighup;
    dl_sync_reload_fn reload;
    void *reload_ctx;
    int stopping;

    dl_store *store;
    dl_plan *plan;
    dl_policy *policy;
    uint64_t fingerprint, epoch;
    uint64_t *numel;    /* [P] */
    float **params;     /* [P] current committed global fragment */
    float **momentum;   /* [P] */
    dl_wire_limits lim;

    learner_slot *slots; /* [max_learners] */
    int nslots;
    pending_push *pend;
    size_t npend, cappend;
    aside_entry **aside; /* [P] arrays */
    int *naside, *capaside;

    /* worker */
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *todo_head, *todo_tail, *done_head, *done_tail;
    int worker_quit;
    int inflight;
    float *scratch_merged, *scratch_params, *scratch_mom;

    /* statistics */
    uint64_t merges, merged_contribs, stale_sum, dropped_stale, rejected, fetches;
    uint64_t seq;
    int64_t started_ns;
};

/* ------------------------------------------------------------------------ */
/* worker thread: the only place that writes LMDB */

static void push_done(dl_sync *s, job *j)
{
    pthread_mutex_lock(&s->mu);
    j->next = NULL;
    if (s->done_tail) s->done_tail->next = j;
    else s->done_head = j;
    s->done_tail = j;
    pthread_mutex_unlock(&s->mu);
    ev_async_send(s->loop, &s->wake);
}

static void run_merge_job(dl_sync *s, job *j)
{
    int p = j->fragment;
    size_t n = s->numel[p];
    memcpy(s->scratch_params, s->params[p], n * sizeof(float));
    memcpy(s->scratch_mom, s->momentum[p], n * sizeof(float));
    j->norm = dl_merge_apply(s->plan, p, &j->mopts, j->deltas, j->w, j->m, j->mopts.share_scaling ? j->share : 1.0,
                             s->scratch_merged, s->scratch_params,
                             s->scratch_mom);
    j->rec.delta_norm = j->norm;
    j->rec.wallclock_ns = dl_wallclock_ns();
    if (!dl_merge_finite(s->scratch_params, n)) {
        j->rc = DL_ECORRUPT;
        snprintf(j->err, sizeof j->err, "merged fragment %d is not finite; not committed", p);
        return;
    }
    j->rc = dl_store_commit_merge(s->store, (uint32_t)p, j->version + 1, s->scratch_params, s->scratch_mom, &j->rec);
    if (j->rc) {
        snprintf(j->err, sizeof j->err, "%s", dl_errmsg());
        return;
    }
    /* committed: the in-memory global follows (the loop reads it only after
     * this job is done, and no other job of fragment p is in flight) */
    memcpy(s->params[p], s->scratch_params, n * sizeof(float));
    memcpy(s->momentum[p], s->scratch_mom, n * sizeof(float));
}

static void *worker_main(void *arg)
{
    dl_sync *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->todo_head && !s->worker_quit) pthread_cond_wait(&s->cv, &s->mu);
        job *j = s->todo_head;
        if (!j) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        s->todo_head = j->next;
        if (!s->todo_head) s->todo_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        dl_err_clear();
        switch (j->kind) {
        case JOB_MERGE: run_merge_job(s, j); break;
        case JOB_LEARNER_PUT:
            j->rc = dl_store_learner_put(s->store, &j->lrec);
            if (j->rc) snprintf(j->err, sizeof j->err, "%s", dl_errmsg());
            break;
        case JOB_LEDGER:
            j->rc = dl_store_ledger_add(s->store, j->ledger_state, j->ledger_tokens);
            if (j->rc) snprintf(j->err, sizeof j->err, "%s", dl_errmsg());
            break;
        case JOB_SYNC:
            j->rc = dl_store_sync(s->store);
            if (j->rc) snprintf(j->err, sizeof j->err, "%s", dl_errmsg());
            break;
        }
        push_done(s, j);
    }
}

static void submit(dl_sync *s, job *j)
{
    pthread_mutex_lock(&s->mu);
    j->next = NULL;
    if (s->todo_tail) s->todo_tail->next = j;
    else s->todo_head = j;
    s->todo_tail = j;
    s->inflight++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* sending */

static learner_slot *slot_of_id(dl_sync *s, const char *id, int create)
{
    int free_i = -1;
    for (int i = 0; i < s->nslots; i++) {
        if (s->slots[i].used && !strcmp(s->slots[i].id, id)) return &s->slots[i];
        if (!s->slots[i].used && free_i < 0) free_i = i;
    }
    if (!create || free_i < 0) return NULL;
    learner_slot *l = &s->slots[free_i];
    memset(l, 0, sizeof *l);
    l->used = 1;
    snprintf(l->id, sizeof l->id, "%s", id);
    l->first_seen_wall = dl_wallclock_ns();
    return l;
}

static uint32_t slot_index(dl_sync *s, const learner_slot *l) { return (uint32_t)(l - s->slots); }

static void env_to(dl_sync *s, Dloco__V1__Envelope *env, const char *learner)
{
    dl_wire_env_init(env, s->cfg.run_id, s->epoch, learner);
    env->seq = ++s->seq;
}

/* Never block the loop: a learner whose queue is full loses this message
 * (it will get the next update; a lost Ack only leaves its log incomplete). */
static int send_msg(dl_sync *s, const char *rid, learner_slot *l, Dloco__V1__Envelope *env, const void *payload,
                    size_t len)
{
    const void *pl[1] = {payload};
    size_t lens[1] = {len};
    int rc = dl_wire_send(s->router, rid, strlen(rid), env, payload ? pl : NULL, payload ? lens : NULL,
                          payload ? 1 : 0, ZMQ_DONTWAIT);
    if (rc == 0) {
        if (l) l->bytes_out += len + 64;
    } else if (rc == DL_EAGAIN) {
        DL_WARN("learner %s: send queue full, %s dropped", rid, dl_wire_body_name(env->body_case));
    } else if (rc == DL_ENOTFOUND) {
        DL_DEBUG("learner %s: not connected, %s dropped", rid, dl_wire_body_name(env->body_case));
    } else {
        DL_WARN("send %s to %s: %s", dl_wire_body_name(env->body_case), rid, dl_errmsg());
    }
    return rc;
}

static void send_error(dl_sync *s, const char *rid, int code, int fatal, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void send_error(dl_sync *s, const char *rid, int code, int fatal, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the addressee id must be a valid learner id; a malformed routing id gets an empty one */
    int valid = rid[0] != 0 && strlen(rid) <= DL_WIRE_LEARNER_ID_MAX;
    for (const char *c = rid; valid && *c; c++)
        valid = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
                *c == '_' || *c == '-';
    Dloco__V1__Envelope env;
    Dloco__V1__Error e;
    dloco__v1__error__init(&e);
    e.code = code;
    e.message = msg;
    e.fatal = fatal;
    env_to(s, &env, valid ? rid : "");
    dl_wire_set_error(&env, &e);
    const void *idp = rid;
    int rc = dl_wire_send(s->router, idp, strlen(rid), &env, NULL, NULL, 0, ZMQ_DONTWAIT);
    if (rc) DL_DEBUG("error reply to %s not sent: %s", rid, dl_errmsg());
    DL_INFO("learner %s: %s error: %s", rid, fatal ? "fatal" : "non-fatal", msg);
}

static void send_update(dl_sync *s, learner_slot *l, int p, uint64_t version, const float *params)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Update u;
    dloco__v1__update__init(&u);
    size_t bytes = s->numel[p] * sizeof(float);
    u.fragment = (uint32_t)p;
    u.version = version;
    u.codec = DLOCO__V1__CODEC__CODEC_FP32;
    u.numel = s->numel[p];
    u.checksum = dl_wire_checksum(params, bytes);
    env_to(s, &env, l->id);
    dl_wire_set_update(&env, &u);
    send_msg(s, l->id, l, &env, params, bytes);
}

static void send_ack(dl_sync *s, learner_slot *l, int p, uint64_t base, Dloco__V1__Decision d, uint64_t merged,
                     const char *reason, int rebase)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Ack a;
    dloco__v1__ack__init(&a);
    a.fragment = (uint32_t)p;
    a.base_version = base;
    a.decision = d;
    a.merged_version = merged;
    a.reason = (char *)reason;
    a.rebase = rebase;
    env_to(s, &env, l->id);
    dl_wire_set_ack(&env, &a);
    send_msg(s, l->id, l, &env, NULL, 0);
}

/* Serve fragments from an LMDB read snapshot: never waits on a merge. */
static void serve_fragments(dl_sync *s, learner_slot *l, const uint32_t *frags, size_t nf)
{
    dl_store_snap *snap = NULL;
    if (dl_store_snapshot_begin(s->store, &snap)) {
        DL_ERROR("snapshot for %s: %s", l->id, dl_errmsg());
        return;
    }
    size_t count = nf ? nf : (size_t)s->cfg.P;
    for (size_t i = 0; i < count; i++) {
        uint32_t p = nf ? frags[i] : (uint32_t)i;
        uint64_t v;
        const float *pp;
        size_t n;
        if (dl_store_snapshot_fragment(snap, p, &v, &pp, &n)) {
            DL_ERROR("snapshot fragment %u: %s", p, dl_errmsg());
            continue;
        }
        send_update(s, l, (int)p, v, pp);
    }
    dl_store_snapshot_end(&snap);
}

/* ------------------------------------------------------------------------ */
/* rounds */

static void schedule(dl_sync *s);

static void free_pending(dl_sync *s, uint64_t h)
{
    assert(h < s->npend && s->pend[h].used);
    free(s->pend[h].delta);
    s->pend[h].delta = NULL;
    s->pend[h].used = 0;
}

static uint64_t alloc_pending(dl_sync *s)
{
    for (size_t i = 0; i < s->npend; i++)
        if (!s->pend[i].used) return i;
    if (s->npend == s->cappend) {
        s->cappend = s->cappend ? s->cappend * 2 : 64;
        s->pend = realloc(s->pend, s->cappend * sizeof *s->pend);
        if (!s->pend) DL_PANIC("out of memory growing the push pool");
    }
    memset(&s->pend[s->npend], 0, sizeof s->pend[0]);
    return s->npend++;
}

static void submit_round(dl_sync *s, const dl_policy_round *r)
{
    int p = r->fragment;
    job *j = dl_xcalloc(1, sizeof *j);
    j->kind = JOB_MERGE;
    j->mopts = s->cfg.merge;
    j->fragment = p;
    j->version = r->version;
    j->m = r->n;
    j->deltas = dl_xcalloc((size_t)r->n, sizeof(float *));
    j->w = dl_xcalloc((size_t)r->n, sizeof(double));
    j->handles = dl_xcalloc((size_t)r->n, sizeof(uint64_t));
    int na = s->naside[p];
    j->rec.epoch = s->epoch;
    snprintf(j->rec.staleness_fn, sizeof j->rec.staleness_fn, "%s", dl_policy_sfn_name(s->cfg.policy.sfn));
    j->rec.n_contrib = (uint32_t)(r->n + na);
    j->rec.contrib = dl_xcalloc(j->rec.n_contrib, sizeof(dl_merge_contrib));
    for (int i = 0; i < r->n; i++) {
        const dl_policy_contrib *c = &r->contribs[i];
        j->handles[i] = c->handle;
        j->deltas[i] = s->pend[c->handle].delta;
        j->w[i] = c->weight;
        dl_merge_contrib *mc = &j->rec.contrib[i];
        snprintf(mc->learner_id, sizeof mc->learner_id, "%s", s->slots[c->learner].id);
        mc->base_version = c->base_version;
        mc->staleness = (uint64_t)c->staleness;
        mc->steps = (uint64_t)c->steps;
        mc->tokens = (uint64_t)c->tokens;
        mc->weight = r->weight_sum > 0 ? c->weight / r->weight_sum : 0;
        mc->decision = DL_MERGE_MERGED;
        snprintf(mc->reason, sizeof mc->reason, "%s", c->learner_dead ? "merged (learner dead)" : "");
    }
    for (int i = 0; i < na; i++) j->rec.contrib[r->n + i] = s->aside[p][i].c;
    /* Round share: a round that merges only some of the live learners moves
     * the global fragment by that share of a full round. Without it, a fleet
     * of M learners whose pushes land in separate rounds would apply M
     * full-size outer steps per push period (each learner's delta measures
     * the same stretch of training), which the outer momentum then amplifies.
     * The expected tokens of a full round are the live learners' latest push
     * sizes, so a slow learner (fewer tokens per push) counts for less. */
    {
        double round_tokens = 0, fleet_tokens = 0;
        for (int i = 0; i < r->n; i++) round_tokens += (double)r->contribs[i].tokens;
        for (int i = 0; i < s->nslots; i++)
            if (s->slots[i].used && s->slots[i].registered && s->slots[i].live)
                fleet_tokens += (double)s->slots[i].last_push_tokens;
        j->share = fleet_tokens > round_tokens ? round_tokens / fleet_tokens : 1.0;
    }
    s->naside[p] = 0;
    char line[512];
    dl_policy_round_format(r, line, sizeof line);
    DL_DEBUG("round closed: %s", line);
    submit(s, j);
}

static void schedule(dl_sync *s)
{
    if (s->stopping) return;
    int64_t now = dl_clock_ns();
    dl_policy_round r;
    while (dl_policy_poll(s->policy, now, &r)) submit_round(s, &r);
    int64_t next = dl_policy_next_deadline(s->policy);
    ev_timer_stop(s->loop, &s->deadline);
    if (next != DL_POLICY_NEVER) {
        double after = (double)(next - now) * 1e-9;
        ev_timer_set(&s->deadline, after > 0 ? after + 1e-4 : 1e-4, 0.0);
        ev_timer_start(s->loop, &s->deadline);
    }
}

static void merge_done(dl_sync *s, job *j)
{
    int p = j->fragment;
    int64_t now = dl_clock_ns();
    if (j->rc) {
        DL_ERROR("merge of fragment %d onto v%llu failed, round abandoned: %s", p, (unsigned long long)j->version,
                 j->err);
        dl_policy_abandon(s->policy, p, now);
        for (int i = 0; i < j->m; i++) {
            uint32_t li = s->pend[j->handles[i]].learner;
            learner_slot *l = &s->slots[li];
            /* no rebase: the pushed progress is still in the learner's
             * parameters (theta - base) and goes into its next push */
            send_ack(s, l, p, j->rec.contrib[i].base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0,
                     "merge failed on the synchronizer; the progress goes into your next push", 0);
            free_pending(s, j->handles[i]);
        }
        return;
    }
    uint64_t nv = j->version + 1;
    double stale = 0;
    for (int i = 0; i < j->m; i++) {
        uint32_t li = s->pend[j->handles[i]].learner;
        learner_slot *l = &s->slots[li];
        const dl_merge_contrib *mc = &j->rec.contrib[i];
        l->merged++;
        l->tokens_applied += mc->tokens;
        stale += (double)mc->staleness;
        s->stale_sum += mc->staleness;
        if (l->registered) {
            send_ack(s, l, p, mc->base_version, DLOCO__V1__DECISION__DECISION_ACCEPTED, nv, "", 0);
            send_update(s, l, p, nv, s->params[p]);
        }
        free_pending(s, j->handles[i]);
    }
    s->merges++;
    s->merged_contribs += (uint64_t)j->m;
    dl_policy_committed(s->policy, p, nv, now);
    DL_INFO("merge frag %d v%llu: %d learner(s), mean staleness %.2f, share %.2f, |delta| %.4g", p,
            (unsigned long long)nv, j->m, j->m ? stale / j->m : 0.0, j->mopts.share_scaling ? j->share : 1.0, j->norm);
}

static void free_job(job *j)
{
    free(j->deltas);
    free(j->w);
    free(j->handles);
    free(j->rec.contrib);
    free(j);
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents);

/* ------------------------------------------------------------------------ */
/* inbound messages */

static void learner_put(dl_sync *s, learner_slot *l)
{
    job *j = dl_xcalloc(1, sizeof *j);
    j->kind = JOB_LEARNER_PUT;
    dl_store_learner *r = &j->lrec;
    snprintf(r->id, sizeof r->id, "%s", l->id);
    r->first_seen_ns = l->first_seen_wall;
    r->last_seen_ns = dl_wallclock_ns();
    r->pushes = l->pushes;
    r->merged = l->merged;
    r->dropped = l->dropped;
    r->tokens_applied = l->tokens_applied;
    r->bytes_in = l->bytes_in;
    r->bytes_out = l->bytes_out;
    submit(s, j);
}

static void ledger_add(dl_sync *s, int state, uint64_t tokens)
{
    job *j = dl_xcalloc(1, sizeof *j);
    j->kind = JOB_LEDGER;
    j->ledger_state = state;
    j->ledger_tokens = tokens;
    submit(s, j);
}

static void on_hello(dl_sync *s, const char *rid, const Dloco__V1__Envelope *env, const Dloco__V1__Hello *h)
{
    if (strcmp(env->run_id, s->cfg.run_id)) {
        send_error(s, rid, DL_EMISMATCH, 1, "run id '%s' is not this synchronizer's run '%s'", env->run_id,
                   s->cfg.run_id);
        return;
    }
    const dl_gpt_config *m = &s->cfg.model;
    if (h->fingerprint != s->fingerprint || h->num_fragments != (uint32_t)s->cfg.P) {
        send_error(s, rid, DL_EMISMATCH, 1,
                   "model fingerprint %016llx (L=%u NH=%u C=%u T=%u V=%u P=%u) does not match the run's %016llx "
                   "(L=%d NH=%d C=%d T=%d V=%d P=%d)",
                   (unsigned long long)h->fingerprint, h->n_layer, h->n_head, h->n_embd, h->seq_len, h->vocab,
                   h->num_fragments, (unsigned long long)s->fingerprint, m->n_layer, m->n_head, m->n_embd,
                   m->seq_len, m->vocab, s->cfg.P);
        return;
    }
    learner_slot *l = slot_of_id(s, rid, 1);
    if (!l) {
        send_error(s, rid, DL_ERANGE, 1, "the synchronizer already serves %d learners", s->nslots);
        return;
    }
    int64_t now = dl_clock_ns();
    int rc = dl_policy_learner_join(s->policy, slot_index(s, l), now);
    if (rc) {
        send_error(s, rid, rc, 1, "cannot register: %s", dl_errmsg());
        return;
    }
    int was = l->registered && l->live;
    /* away longer than rebase_ms: its fragments are too old to push onto */
    int away_long = l->hellos > 0 && now - l->last_seen_ns > (int64_t)s->cfg.rebase_ms * 1000000LL;
    l->registered = 1;
    l->live = 1;
    l->last_seen_ns = now;
    l->hellos++;
    int must_fetch = h->n_held_versions == 0 || away_long;
    uint64_t *vers = dl_xcalloc((size_t)s->cfg.P, sizeof(uint64_t));
    for (int p = 0; p < s->cfg.P; p++) {
        vers[p] = dl_policy_version(s->policy, p);
        if (h->n_held_versions) {
            uint64_t held = h->held_versions[p];
            if (held > vers[p] || vers[p] - held > (uint64_t)s->cfg.policy.max_staleness) must_fetch = 1;
        }
    }
    Dloco__V1__Envelope out;
    Dloco__V1__Welcome w;
    dloco__v1__welcome__init(&w);
    w.num_fragments = (uint32_t)s->cfg.P;
    w.n_fragment_versions = (size_t)s->cfg.P;
    w.fragment_versions = vers;
    w.h = (uint32_t)s->cfg.H;
    w.heartbeat_ms = (uint32_t)s->cfg.heartbeat_ms;
    w.liveness = (uint32_t)s->cfg.liveness;
    w.policy = (char *)dl_policy_kind_name(s->cfg.policy.kind);
    w.must_fetch = must_fetch;
    env_to(s, &out, l->id);
    dl_wire_set_welcome(&out, &w);
    send_msg(s, rid, l, &out, NULL, 0);
    free(vers);
    DL_INFO("learner %s %s (device %s, step %llu, %s)", rid, was ? "said hello again" : "joined",
            h->device[0] ? h->device : "?", (unsigned long long)h->step,
            must_fetch ? "will fetch the global model" : "keeps its fragments");
    learner_put(s, l);
    schedule(s);
}

static void on_push(dl_sync *s, learner_slot *l, dl_wire_msg *msg, const Dloco__V1__Push *ph)
{
    int p = (int)ph->fragment;
    l->pushes++;
    l->last_push_tokens = ph->tokens;
    if (ph->codec != DLOCO__V1__CODEC__CODEC_FP32) {
        l->rejected++;
        s->rejected++;
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0,
                 "only fp32 pushes are supported by this synchronizer", 0);
        ledger_add(s, DL_LEDGER_REJECTED, ph->tokens);
        return;
    }
    size_t n = s->numel[p];
    float *delta = NULL;
    if (posix_memalign((void **)&delta, 64, n * sizeof(float))) DL_PANIC("out of memory for a push");
    memcpy(delta, dl_wire_msg_payload(msg, 0), n * sizeof(float)); /* payload may be unaligned */
    if (!dl_merge_finite(delta, n)) {
        free(delta);
        l->rejected++;
        s->rejected++;
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, "non-finite values in push",
                 0);
        ledger_add(s, DL_LEDGER_REJECTED, ph->tokens);
        return;
    }
    uint64_t h = alloc_pending(s);
    dl_policy_verdict v;
    int rc = dl_policy_push(s->policy, p, slot_index(s, l), ph->base_version, (int64_t)ph->steps,
                            (int64_t)ph->tokens, dl_clock_ns(), h, &v);
    if (rc) DL_PANIC("merge policy: %s", dl_errmsg());
    if (v.decision == DL_POLICY_POOLED) {
        s->pend[h].used = 1;
        s->pend[h].delta = delta;
        s->pend[h].learner = slot_index(s, l);
        s->pend[h].fragment = p;
        if (v.replaced) free_pending(s, v.replaced_handle);
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0, "", 0);
        schedule(s);
        return;
    }
    free(delta);
    const char *why = dl_policy_reason_name(v.reason);
    if (v.decision == DL_POLICY_DROPPED_STALE) {
        l->dropped++;
        s->dropped_stale++;
        char reason[96];
        snprintf(reason, sizeof reason, "staleness %lld > max %lld", (long long)v.staleness,
                 (long long)s->cfg.policy.max_staleness);
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_DROPPED_STALE, 0, reason, 1);
        serve_fragments(s, l, (const uint32_t[]){(uint32_t)p}, 1); /* rebase */
        if (s->naside[p] == s->capaside[p]) {
            s->capaside[p] = s->capaside[p] ? 2 * s->capaside[p] : 8;
            s->aside[p] = realloc(s->aside[p], (size_t)s->capaside[p] * sizeof(aside_entry));
            if (!s->aside[p]) DL_PANIC("out of memory");
        }
        dl_merge_contrib *c = &s->aside[p][s->naside[p]++].c;
        memset(c, 0, sizeof *c);
        snprintf(c->learner_id, sizeof c->learner_id, "%s", l->id);
        c->base_version = ph->base_version;
        c->staleness = (uint64_t)v.staleness;
        c->steps = ph->steps;
        c->tokens = ph->tokens;
        c->decision = DL_MERGE_DROPPED_STALE;
        snprintf(c->reason, sizeof c->reason, "%.*s", (int)sizeof c->reason - 1, reason);
        DL_INFO("learner %s: push of fragment %d dropped (%s), told to rebase", l->id, p, reason);
    } else {
        l->rejected++;
        s->rejected++;
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, 0);
        ledger_add(s, DL_LEDGER_REJECTED, ph->tokens);
        DL_INFO("learner %s: push of fragment %d rejected (%s)", l->id, p, why);
    }
}

static void on_message(dl_sync *s, dl_wire_msg *msg)
{
    const char *rid = (const char *)msg->id;
    const Dloco__V1__Envelope *env = msg->env;
    if (strcmp(env->learner_id, rid) != 0) {
        send_error(s, rid, DL_EPROTO, 1, "learner_id '%s' differs from the connection's routing id '%s'",
                   env->learner_id, rid);
        return;
    }
    size_t bytes = 64;
    for (int i = 0; i < msg->npayload; i++) bytes += dl_wire_msg_payload_len(msg, i);
    if (env->body_case == DLOCO__V1__ENVELOPE__BODY_HELLO) {
        on_hello(s, rid, env, env->hello);
        learner_slot *l = slot_of_id(s, rid, 0);
        if (l) l->bytes_in += bytes;
        return;
    }
    learner_slot *l = slot_of_id(s, rid, 0);
    if (!l || !l->registered || env->epoch != s->epoch) {
        send_error(s, rid, DL_ENOTFOUND, 0, "unknown learner in epoch %llu: send hello",
                   (unsigned long long)s->epoch);
        return;
    }
    int64_t now = dl_clock_ns();
    l->last_seen_ns = now;
    l->bytes_in += bytes;
    if (!l->live) {
        l->live = 1;
        dl_policy_learner_alive(s->policy, slot_index(s, l), now);
        DL_INFO("learner %s is alive again", l->id);
    }
    switch (env->body_case) {
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT:
        l->step = env->heartbeat->step;
        l->tokens = env->heartbeat->tokens;
        l->steps_per_s = env->heartbeat->steps_per_s;
        break;
    case DLOCO__V1__ENVELOPE__BODY_PUSH: on_push(s, l, msg, env->push); break;
    case DLOCO__V1__ENVELOPE__BODY_FETCH:
        s->fetches++;
        serve_fragments(s, l, env->fetch->fragments, env->fetch->n_fragments);
        break;
    case DLOCO__V1__ENVELOPE__BODY_BYE:
        l->registered = 0;
        l->live = 0;
        dl_policy_learner_leave(s->policy, slot_index(s, l), now, DL_POLICY_LEAVE_BYE);
        DL_INFO("learner %s said bye at step %llu (%s)", l->id, (unsigned long long)env->bye->step,
                env->bye->reason[0] ? env->bye->reason : "no reason");
        learner_put(s, l);
        schedule(s);
        break;
    default:
        send_error(s, rid, DL_EPROTO, 0, "%s is not a learner-to-synchronizer message",
                   dl_wire_body_name(env->body_case));
        break;
    }
}

/* ZMQ_FD is edge-triggered: read until ZMQ_EVENTS has no POLLIN, after every
 * wake-up and after every send. */
static void drain(dl_sync *s)
{
    for (int budget = 0; budget < 100000; budget++) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(s->router, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN)) return;
        dl_wire_msg msg;
        dl_err_clear();
        int rc = dl_wire_recv(s->router, 1, &s->lim, &msg, ZMQ_DONTWAIT);
        if (rc == 0) {
            on_message(s, &msg);
        } else if (rc == DL_EPROTO) {
            char why[400];
            snprintf(why, sizeof why, "%s", dl_errmsg());
            if (msg.id_len) send_error(s, (const char *)msg.id, DL_EPROTO, 0, "rejected message: %s", why);
            else DL_WARN("rejected message: %s", why);
        } else if (rc != DL_EAGAIN) {
            DL_ERROR("receive: %s", dl_errmsg());
        }
        dl_wire_msg_close(&msg);
    }
}

/* ------------------------------------------------------------------------ */
/* watchers */

static void on_zmq(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    drain(w->data);
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        job *j = s->done_head;
        if (j) {
            s->done_head = j->next;
            if (!s->done_head) s->done_tail = NULL;
            s->inflight--;
        }
        pthread_mutex_unlock(&s->mu);
        if (!j) break;
        if (j->kind == JOB_MERGE) merge_done(s, j);
        else if (j->rc) DL_ERROR("store write failed: %s", j->err);
        free_job(j);
    }
    schedule(s);
    drain(s);
    if (s->stopping && s->inflight == 0) ev_break(s->loop, EVBREAK_ALL);
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    schedule(s);
    drain(s);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    int64_t now = dl_clock_ns();
    int64_t dead_after = (int64_t)s->cfg.liveness * s->cfg.heartbeat_ms * 1000000LL;
    for (int i = 0; i < s->nslots; i++) {
        learner_slot *l = &s->slots[i];
        if (!l->used || !l->registered) continue;
        if (l->live && now - l->last_seen_ns > dead_after) {
            l->live = 0;
            dl_policy_learner_leave(s->policy, (uint32_t)i, now, DL_POLICY_LEAVE_DEAD);
            DL_WARN("learner %s declared dead after %.1f s of silence", l->id, (double)(now - l->last_seen_ns) * 1e-9);
            continue;
        }
        if (l->live) {
            Dloco__V1__Envelope env;
            Dloco__V1__Heartbeat hb;
            dloco__v1__heartbeat__init(&hb);
            env_to(s, &env, l->id);
            dl_wire_set_heartbeat(&env, &hb);
            send_msg(s, l->id, l, &env, NULL, 0);
        }
    }
    if (s->cfg.durability == DL_STORE_PERIODIC) {
        static int64_t last_sync;
        if (now - last_sync >= (int64_t)s->cfg.sync_every_ms * 1000000LL) {
            last_sync = now;
            job *j = dl_xcalloc(1, sizeof *j);
            j->kind = JOB_SYNC;
            submit(s, j);
        }
    }
    schedule(s);
    drain(s);
}

static void on_status(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    int live = 0, reg = 0;
    for (int i = 0; i < s->nslots; i++) {
        live += s->slots[i].used && s->slots[i].live;
        reg += s->slots[i].used && s->slots[i].registered;
    }
    char vers[256];
    size_t o = 0;
    for (int p = 0; p < s->cfg.P && o < sizeof vers - 24; p++)
        o += (size_t)snprintf(vers + o, sizeof vers - o, "%s%llu", p ? "," : "",
                              (unsigned long long)dl_policy_version(s->policy, p));
    DL_INFO("status: epoch %llu | learners %d live / %d registered | merges %llu | mean staleness %.2f | "
            "versions [%s] | dropped %llu rejected %llu",
            (unsigned long long)s->epoch, live, reg, (unsigned long long)s->merges,
            s->merged_contribs ? (double)s->stale_sum / (double)s->merged_contribs : 0.0, vers,
            (unsigned long long)s->dropped_stale, (unsigned long long)s->rejected);
}

static void on_stop(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)revents;
    dl_sync *s = w->data;
    if (s->stopping) return;
    DL_INFO("signal %d: finishing %d store job(s) in flight, then stopping", w->signum, s->inflight);
    s->stopping = 1;
    /* persist the registry counters on the way out */
    for (int i = 0; i < s->nslots; i++)
        if (s->slots[i].used) learner_put(s, &s->slots[i]);
    if (s->inflight == 0) ev_break(loop, EVBREAK_ALL);
}

static void on_hup(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    if (!s->reload) {
        DL_WARN("SIGHUP: no config file to reload");
        return;
    }
    dl_sync_tunables cur = {.policy = *dl_policy_get_cfg(s->policy), .merge = s->cfg.merge}, nt = cur;
    dl_err_clear();
    if (s->reload(s->reload_ctx, &cur, &nt) || dl_policy_reconfigure(s->policy, &nt.policy)) {
        DL_ERROR("reload refused, running values unchanged: %s", dl_errmsg());
        return;
    }
    char log[1024];
    size_t o = 0;
#define CHANGED(name, fmt, a, b)                                                                                  \
    if ((a) != (b) && o < sizeof log - 128) o += (size_t)snprintf(log + o, sizeof log - o, " " name " " fmt " -> " fmt ",", a, b)
    CHANGED("quorum", "%d", cur.policy.quorum, nt.policy.quorum);
    CHANGED("grace_cap_ms", "%lld", (long long)(cur.policy.grace_cap_ns / 1000000), (long long)(nt.policy.grace_cap_ns / 1000000));
    CHANGED("gamma", "%g", cur.policy.gamma, nt.policy.gamma);
    CHANGED("mad_k", "%g", cur.policy.mad_k, nt.policy.mad_k);
    CHANGED("max_staleness", "%lld", (long long)cur.policy.max_staleness, (long long)nt.policy.max_staleness);
    if (cur.policy.sfn != nt.policy.sfn && o < sizeof log - 128)
        o += (size_t)snprintf(log + o, sizeof log - o, " staleness %s -> %s,", dl_policy_sfn_name(cur.policy.sfn),
                              dl_policy_sfn_name(nt.policy.sfn));
    CHANGED("staleness_a", "%g", cur.policy.sfn_a, nt.policy.sfn_a);
    CHANGED("staleness_b", "%g", cur.policy.sfn_b, nt.policy.sfn_b);
    CHANGED("outer_lr", "%g", (double)cur.merge.outer_lr, (double)nt.merge.outer_lr);
    CHANGED("outer_momentum", "%g", (double)cur.merge.outer_momentum, (double)nt.merge.outer_momentum);
    CHANGED("clip_norm", "%g", cur.merge.clip_norm, nt.merge.clip_norm);
    CHANGED("share_scaling", "%d", cur.merge.share_scaling, nt.merge.share_scaling);
#undef CHANGED
    if (o && log[o - 1] == ',') log[o - 1] = 0;
    s->cfg.merge = nt.merge;
    s->cfg.policy = nt.policy;
    DL_INFO("reload:%s", o ? log : " no reloadable value changed");
    schedule(s);
    drain(s);
}

void dl_sync_set_reload(dl_sync *s, dl_sync_reload_fn fn, void *ctx)
{
    s->reload = fn;
    s->reload_ctx = ctx;
}

/* ------------------------------------------------------------------------ */
/* lifecycle */

int dl_sync_open(const dl_sync_cfg *cfg, dl_sync **out)
{
    *out = NULL;
    char why[256];
    if (dl_policy_cfg_check(&cfg->policy, why, sizeof why)) return DL_EINVAL;
    dl_sync *s = dl_xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    int rc = 0;
    float *full = NULL;
    if ((rc = dl_gpt_config_check(&s->cfg.model))) goto fail;
    if ((rc = dl_gpt_plan_open(&s->cfg.model, s->cfg.P, &s->plan))) goto fail;
    s->fingerprint = dl_gpt_fingerprint(&s->cfg.model, s->plan);
    int P = s->cfg.P;
    s->numel = dl_xcalloc((size_t)P, sizeof(uint64_t));
    s->params = dl_xcalloc((size_t)P, sizeof(float *));
    s->momentum = dl_xcalloc((size_t)P, sizeof(float *));
    s->aside = dl_xcalloc((size_t)P, sizeof(aside_entry *));
    s->naside = dl_xcalloc((size_t)P, sizeof(int));
    s->capaside = dl_xcalloc((size_t)P, sizeof(int));
    size_t maxn = dl_plan_max_fragment_numel(s->plan);
    for (int p = 0; p < P; p++) {
        s->numel[p] = dl_plan_fragment_numel(s->plan, p);
        if (posix_memalign((void **)&s->params[p], 64, s->numel[p] * sizeof(float)) ||
            posix_memalign((void **)&s->momentum[p], 64, s->numel[p] * sizeof(float)))
            DL_PANIC("out of memory for the global model");
    }
    if (posix_memalign((void **)&s->scratch_merged, 64, maxn * sizeof(float)) ||
        posix_memalign((void **)&s->scratch_params, 64, maxn * sizeof(float)) ||
        posix_memalign((void **)&s->scratch_mom, 64, maxn * sizeof(float)))
        DL_PANIC("out of memory for merge buffers");

    /* the store: a fresh run starts from the seeded init, a resumed one from LMDB */
    dl_store_opts so = dl_store_opts_default();
    so.durability = s->cfg.durability;
    if ((rc = dl_store_open(s->cfg.store, &so, &s->store))) goto fail;
    full = dl_xmalloc(dl_plan_total_numel(s->plan) * sizeof(float));
    if ((rc = dl_gpt_init_params(&s->cfg.model, s->cfg.seed, full))) goto fail;
    for (int p = 0; p < P; p++) dl_plan_gather(s->plan, p, full, s->params[p]);
    dl_store_run run = {.run_id = s->cfg.run_id,
                        .fingerprint = s->fingerprint,
                        .config_text = s->cfg.config_text,
                        .n_fragments = (uint32_t)P,
                        .numel = s->numel};
    if ((rc = dl_store_init_run(s->store, &run, (const float *const *)s->params))) goto fail;
    if ((rc = dl_store_bump_epoch(s->store, &s->epoch))) goto fail;
    if ((rc = dl_policy_open(&s->cfg.policy, P, &s->policy))) goto fail;
    uint64_t total_v = 0;
    for (int p = 0; p < P; p++) {
        uint64_t v;
        if ((rc = dl_store_read_fragment(s->store, (uint32_t)p, &v, s->params[p], s->momentum[p]))) goto fail;
        dl_policy_set_version(s->policy, p, v);
        total_v += v;
    }
    s->nslots = s->cfg.policy.max_learners;
    s->slots = dl_xcalloc((size_t)s->nslots, sizeof(learner_slot));

    s->lim = dl_wire_limits_default();
    s->lim.num_fragments = (uint32_t)P;
    s->lim.fragment_numel = s->numel;
    s->lim.max_frames = 2;

    s->zctx = zmq_ctx_new();
    s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
    if (!s->router || dl_wire_sock_setup(s->router, 1, (size_t)s->cfg.max_msg_bytes)) {
        rc = dl_err(DL_ENET, "router socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (zmq_bind(s->router, s->cfg.bind) != 0) {
        rc = dl_err(DL_ENET, "bind %s: %s", s->cfg.bind, zmq_strerror(zmq_errno()));
        goto fail;
    }
    size_t elen = sizeof s->endpoint;
    zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &elen);

    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) DL_PANIC("cannot start the merge worker");

    s->loop = ev_loop_new(EVFLAG_AUTO);
    int fd;
    size_t fl = sizeof fd;
    zmq_getsockopt(s->router, ZMQ_FD, &fd, &fl);
    ev_io_init(&s->zio, on_zmq, fd, EV_READ);
    s->zio.data = s;
    ev_io_start(s->loop, &s->zio);
    ev_async_init(&s->wake, on_wake);
    s->wake.data = s;
    ev_async_start(s->loop, &s->wake);
    ev_timer_init(&s->deadline, on_deadline, 1.0, 0.0);
    s->deadline.data = s;
    double hb = s->cfg.heartbeat_ms * 1e-3;
    ev_timer_init(&s->tick, on_tick, hb, hb);
    s->tick.data = s;
    ev_timer_start(s->loop, &s->tick);
    if (s->cfg.status_every_ms > 0) {
        double st = s->cfg.status_every_ms * 1e-3;
        ev_timer_init(&s->status, on_status, st, st);
        s->status.data = s;
        ev_timer_start(s->loop, &s->status);
    }
    ev_signal_init(&s->sigint, on_stop, SIGINT);
    s->sigint.data = s;
    ev_signal_start(s->loop, &s->sigint);
    ev_signal_init(&s->sigterm, on_stop, SIGTERM);
    s->sigterm.data = s;
    ev_signal_start(s->loop, &s->sigterm);
    ev_signal_init(&s->sighup, on_hup, SIGHUP);
    s->sighup.data = s;
    ev_signal_start(s->loop, &s->sighup);

    s->started_ns = dl_clock_ns();
    DL_INFO("run '%s' epoch %llu: %s (%d fragments, %zu params, fingerprint %016llx), listening on %s",
            s->cfg.run_id, (unsigned long long)s->epoch, total_v ? "resumed" : "new run", P,
            dl_plan_total_numel(s->plan), (unsigned long long)s->fingerprint, s->endpoint);
    free(full);
    *out = s;
    return 0;
fail:
    free(full);
    {
        /* keep the failing call's message across cleanup */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        dl_sync_close(&s);
        dl_err(rc, "%s", msg);
    }
    return rc;
}

int dl_sync_run(dl_sync *s)
{
    drain(s);
    ev_run(s->loop, 0);
    return 0;
}

const char *dl_sync_endpoint(const dl_sync *s) { return s->endpoint; }

void dl_sync_summary(dl_sync *s, FILE *f)
{
    double wall = (double)(dl_clock_ns() - s->started_ns) * 1e-9;
    fprintf(f, "sync-summary: epoch=%llu merges=%llu contributions=%llu mean_staleness=%.3f dropped_stale=%llu "
               "rejected=%llu fetches=%llu wall_s=%.1f\n",
            (unsigned long long)s->epoch, (unsigned long long)s->merges, (unsigned long long)s->merged_contribs,
            s->merged_contribs ? (double)s->stale_sum / (double)s->merged_contribs : 0.0,
            (unsigned long long)s->dropped_stale, (unsigned long long)s->rejected, (unsigned long long)s->fetches,
            wall);
    for (int i = 0; i < s->nslots; i++) {
        learner_slot *l = &s->slots[i];
        if (!l->used) continue;
        fprintf(f, "sync-learner: id=%s pushes=%llu merged=%llu dropped=%llu rejected=%llu tokens_applied=%llu "
                   "bytes_in=%llu bytes_out=%llu\n",
                l->id, (unsigned long long)l->pushes, (unsigned long long)l->merged, (unsigned long long)l->dropped,
                (unsigned long long)l->rejected, (unsigned long long)l->tokens_applied,
                (unsigned long long)l->bytes_in, (unsigned long long)l->bytes_out);
    }
}

void dl_sync_close(dl_sync **sp)
{
    if (!sp || !*sp) return;
    dl_sync *s = *sp;
    if (s->loop) {
        pthread_mutex_lock(&s->mu);
        s->worker_quit = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->worker, NULL);
        /* jobs the worker finished but the loop never saw */
        while (s->done_head) {
            job *j = s->done_head;
            s->done_head = j->next;
            free_job(j);
        }
        ev_loop_destroy(s->loop);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    if (s->router) zmq_close(s->router);
    if (s->zctx) zmq_ctx_term(s->zctx);
    dl_policy_close(&s->policy);
    dl_store_close(&s->store);
    dl_plan_close(&s->plan);
    for (int p = 0; s->params && p < s->cfg.P; p++) {
        free(s->params[p]);
        free(s->momentum[p]);
        free(s->aside[p]);
    }
    for (size_t i = 0; i < s->npend; i++) free(s->pend[i].delta);
    free(s->pend);
    free(s->params);
    free(s->momentum);
    free(s->aside);
    free(s->naside);
    free(s->capaside);
    free(s->numel);
    free(s->slots);
    free(s->scratch_merged);
    free(s->scratch_params);
    free(s->scratch_mom);
    free(s);
    *sp = NULL;
}
