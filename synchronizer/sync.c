/* dloco-sync's loop: one libev loop owns the ROUTER socket, reads every
 * message and hands it on by kind (admit.c, uplink.c, downlink.c); its
 * watchers drive the rest; open and close. synchronizer/sync_int.h lists the files. */
#include "synchronizer/sync.h"
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/defaults.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/plan.h"
#include "storage/modelfile.h"
#include "storage/tensorfile.h"
#include "synchronizer/report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

/* One drain reads at most this many messages, or this many payload bytes,
 * before timers, finished merges and sends get their turn (an ev_idle
 * watcher goes on with the rest). */
#define DL_SYNC_DRAIN_MSGS 64
#define DL_SYNC_DRAIN_BYTES (32u << 20)
/* The derived pool bound is at least this (small models never wait for room). */
#define DL_SYNC_POOL_MIN (64ull << 20)
/* A learner whose counters moved gets a new store record at most this often. */
#define DL_SYNC_PUT_EVERY_NS (5 * 1000000000LL)
/* Default chunk_bytes. */
#define DL_SYNC_CHUNK_BYTES ((uint64_t)DL_DEF_CHUNK_KB << 10)

/* ------------------------------------------------------------------------ */
/* dispatch */

static void on_message(dl_sync *s, dl_wire_msg *msg)
{
    const Dloco__V1__Envelope *env = msg->env;
    /* anything but a heartbeat sees what the heartbeats before it changed, as if each had settled */
    if (env->body_case != DLOCO__V1__ENVELOPE__BODY_HEARTBEAT) dl_admit_heartbeats_settle(s);
    const char *id = env->learner_id; /* validated: [A-Za-z0-9._-]{1,64} */
    if (s->auth && !dl_auth_user_ok(s->auth, msg->user_id, id)) {
        char owner[DL_WIRE_LEARNER_ID_MAX + 1] = "";
        dl_auth_user_id(msg->user_id, owner);
        if (!owner[0])
            dl_downlink_error(s, msg->id, msg->id_len, id, DL_EPERM, 1, "this connection has no allowed key");
        else if (!strcmp(owner, id))
            dl_downlink_error(s, msg->id, msg->id_len, id, DL_EPERM, 1,
                              "the key of learner '%s' was revoked or given to another id: reconnect with a current "
                              "key", id);
        else
            dl_downlink_error(s, msg->id, msg->id_len, id, DL_EPERM, 1,
                              "this connection's key belongs to learner '%s', not '%s'", owner, id);
        dl_event("auth_refused", "id=%s key_owner=%s body=%s", id, owner[0] ? owner : "-",
                 dl_wire_body_name(env->body_case));
        s->refused_msgs++;
        s->met.msg_refused[DL_SM_MSG_UNAUTHORIZED]++;
        return;
    }
    size_t bytes = 64;
    for (int i = 0; i < msg->npayload; i++) bytes += dl_wire_msg_payload_len(msg, i);
    s->met.bytes_in[dl_syncmet_kind(env->body_case)] += bytes;
    s->met.msgs_in[dl_syncmet_kind(env->body_case)]++;
    if (env->body_case == DLOCO__V1__ENVELOPE__BODY_HELLO) {
        dl_admit_hello(s, msg, env, env->hello);
        int slot = dl_registry_find(s->reg, id);
        if (slot >= 0) dl_registry_get(s->reg, slot)->bytes_in += bytes;
        return;
    }
    int slot = dl_registry_find(s->reg, id);
    if (slot < 0 || !registered(s, slot) || env->epoch != s->epoch ||
        !dl_registry_route_is(s->reg, slot, msg->id, msg->id_len)) {
        /* unknown, or another connection than the one this id said Hello
         * on: nothing of it is believed; a genuine learner re-hellos */
        dl_downlink_error(s, msg->id, msg->id_len, id, DL_ENOTFOUND, 0,
                          "learner '%s' is not registered on this connection in epoch %llu: send hello", id,
                          (unsigned long long)s->epoch);
        s->refused_msgs++;
        s->met.msg_refused[DL_SM_MSG_NOT_REGISTERED]++;
        return;
    }
    dl_registry_learner *l = dl_registry_get(s->reg, slot);
    int64_t now = dl_clock_ns();
    l->last_seen_ns = now;
    l->bytes_in += bytes;
    if (member(s, slot) == DL_POLICY_MEMBER_DEAD) {
        dl_policy_learner_alive(s->policy, (uint32_t)slot, now);
        l->left_ns = 0;
        DL_INFO("learner %s is alive again", l->id);
        dl_event("learner_alive", "id=%s", l->id);
    }
    switch (env->body_case) {
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT: dl_admit_heartbeat(s, slot, l, env->heartbeat, now); break;
    case DLOCO__V1__ENVELOPE__BODY_PUSH: dl_uplink_push(s, slot, l, msg, env->push); break;
    case DLOCO__V1__ENVELOPE__BODY_FETCH: dl_downlink_fetch(s, slot, l, env->fetch); break;
    case DLOCO__V1__ENVELOPE__BODY_BYE: dl_admit_bye(s, slot, l, env->bye, now); break;
    default:
        dl_downlink_error(s, msg->id, msg->id_len, id, DL_EPROTO, 0, "%s is not a learner-to-synchronizer message",
                          dl_wire_body_name(env->body_case));
        break;
    }
}

static void drain(dl_sync *s);

/* ZMQ_FD is edge-triggered: read until ZMQ_EVENTS has no POLLIN, after every
 * wake-up and after every send. */
void dl_sync_drain(dl_sync *s)
{
    drain(s);
    dl_admit_heartbeats_settle(s); /* the last run of heartbeats read */
}

static void drain(dl_sync *s)
{
    /* Stopping: nothing more is read, so the ledger's last write covers every
     * push this process answered; later messages are for the next epoch. */
    if (s->stopping) return;
    size_t bytes = 0;
    for (int budget = 0;; budget++) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(s->router, ZMQ_EVENTS, &ev, &sz) != 0) {
            dl_wire_zmq_warn("zmq_getsockopt(ZMQ_EVENTS)", __FILE__, __LINE__);
            return;
        }
        if (!(ev & ZMQ_POLLIN)) return;
        if (budget >= DL_SYNC_DRAIN_MSGS || bytes >= DL_SYNC_DRAIN_BYTES) {
            /* the rest after the timers, finished merges and sends that are due */
            s->drain_yields++;
            if (!ev_is_active(&s->more)) ev_idle_start(s->loop, &s->more);
            return;
        }
        dl_wire_msg msg;
        dl_err_clear();
        int rc = dl_wire_recv(s->router, 1, &s->lim, &msg, ZMQ_DONTWAIT);
        if (rc == 0) {
            for (int i = 0; i < msg.npayload; i++) bytes += dl_wire_msg_payload_len(&msg, i);
            on_message(s, &msg);
        } else if (rc == DL_EPROTO) {
            char why[400];
            snprintf(why, sizeof why, "%s", dl_errmsg());
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_INVALID]++;
            s->met.msgs_in[0]++;
            if (msg.id_len) dl_downlink_error(s, msg.id, msg.id_len, NULL, DL_EPROTO, 0, "rejected message: %s", why);
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
    dl_sync_drain(w->data);
}

static void on_more(struct ev_loop *loop, ev_idle *w, int revents)
{
    (void)revents;
    ev_idle_stop(loop, w);
    dl_sync_drain(w->data);
}

static int live_cb(void *ctx, int slot) { return member(ctx, slot) == DL_POLICY_MEMBER_LIVE; }

/* The last store write of a run: what the ledger still holds becomes
 * OUTSTANDING (or LOST for learners that are dead now). */
static void submit_final_ledger(dl_sync *s)
{
    s->final_ledger = 1;
    dl_ledger_shutdown(s->ledger, live_cb, s);
    dl_job *j = dl_job_new(DL_JOB_LEDGER);
    if (dl_ledger_take(s->ledger, &j->ledger)) submit(s, j);
    else dl_job_free(j);
}

static void maybe_finish(dl_sync *s)
{
    if (!s->stopping || dl_worker_inflight(s->worker)) return;
    if (!s->final_ledger) submit_final_ledger(s);
    if (dl_worker_inflight(s->worker) == 0) ev_break(s->loop, EVBREAK_ALL);
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    dl_job *j;
    while ((j = dl_worker_done(s->worker))) {
        if (j->kind == DL_JOB_MERGE) {
            dl_commit_merge_done(s, j);
        } else if (j->rc) {
            DL_ERROR("store write failed: %s", j->err);
            if (j->kind == DL_JOB_LEDGER && !s->final_ledger) dl_ledger_untake(s->ledger, &j->ledger);
        }
        dl_job_free(j);
    }
    dl_eval_poll(s);
    dl_commit_schedule(s);
    dl_downlink_serve_owed(s); /* what merges made owed, and what drained queues have room for now */
    dl_sync_drain(s);
    maybe_finish(s);
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    dl_commit_schedule(s);
    dl_sync_drain(s);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    int64_t now = dl_clock_ns();
    /* The tick comes every heartbeat_ms while the loop runs; a longer gap is
     * the loop's own stall (the process stopped, swapped, or a callback ran
     * long), and learners are not charged for it: libev runs due timers
     * before the socket's watcher, so without this a synchronizer resuming
     * from SIGSTOP declared every learner dead before reading the messages
     * waiting for it. */
    int64_t period = (int64_t)s->cfg.heartbeat_ms * 1000000LL;
    int64_t stall = s->tick_ns ? now - s->tick_ns - period : 0;
    s->tick_ns = now;
    if (stall > 0) dl_admit_loop_stalled(s, stall, now);
    if (stall >= period) {
        s->loop_stalls++;
        s->loop_stall_ms += (uint64_t)(stall / 1000000);
        DL_WARN("the synchronizer's loop did not run for %.1f s (stopped, swapped or busy): learners' silence "
                "during it is not counted", (double)(stall + period) * 1e-9);
        dl_event("sync_stall", "gap_ms=%lld stall_ms=%lld", (long long)((stall + period) / 1000000),
                 (long long)(stall / 1000000));
    }
    /* the records due go in one job, one transaction: at any fleet size the
     * tick costs the worker one commit, not one per learner */
    dl_job *puts = NULL;
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (!l->used) continue;
        if ((l->put_dirty && now - l->put_ns >= 1000000000LL) ||
            (l->put_sig != dl_admit_put_sig(l) && now - l->put_ns >= DL_SYNC_PUT_EVERY_NS)) {
            if (!puts) {
                puts = dl_job_new(DL_JOB_LEARNER_PUT);
                puts->lrecs = dl_xcalloc((size_t)dl_registry_count(s->reg), sizeof *puts->lrecs);
            }
            dl_admit_record(l, &puts->lrecs[puts->nlrecs++]);
        }
        /* a chunked push whose chunks stopped holds pool room: not for ever */
        if (s->inb[i].active && now - s->inb[i].progress_ns > dl_uplink_stall_ns(s, i)) dl_uplink_drop(s, i, "stalled");
        /* slots are reclaimed only when a new learner needs one (dl_admit_hello) */
        if (member(s, i) != DL_POLICY_MEMBER_LIVE) continue;
        /* silence: no message from it and no byte for it drained (admit.c dl_admit_last_sign) */
        int64_t sign = dl_admit_last_sign(l);
        if (now - sign > dl_admit_dead_after(s, i, l)) {
            dl_admit_mark_left(s, l, i, now, DL_POLICY_LEAVE_DEAD);
            double silent = (double)(now - sign) * 1e-9;
            DL_WARN("learner %s declared dead after %.1f s of silence", l->id, silent);
            dl_event("learner_dead", "id=%s silent_ms=%lld", l->id, (long long)((now - sign) / 1000000));
            continue;
        }
        dl_downlink_check_reader(s, i, l, now);
        if (member(s, i) != DL_POLICY_MEMBER_LIVE) continue;
        /* a queue that holds payload is proof enough that we talk to it: a
         * heartbeat would only take one of its DL_WIRE_HWM message slots */
        if (dl_wire_queue_bytes(l->outq) > 0) continue;
        Dloco__V1__Envelope env;
        Dloco__V1__Heartbeat hb;
        dloco__v1__heartbeat__init(&hb);
        dl_downlink_env(s, &env, l->id);
        dl_wire_set_heartbeat(&env, &hb);
        dl_downlink_send(s, l, &env, NULL, 0);
    }
    if (puts) submit(s, puts);
    dl_downlink_serve_owed(s);
    if (s->cfg.durability == DL_STORE_PERIODIC && now - s->last_sync_ns >= (int64_t)s->cfg.sync_every_ms * 1000000LL) {
        s->last_sync_ns = now;
        submit(s, dl_job_new(DL_JOB_SYNC));
    }
    dl_commit_schedule(s);
    dl_sync_drain(s);
}

static void on_status(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    dl_sync_stats st;
    dl_sync_get_stats(s, &st);
    char line[1024];
    dl_report_status(&st, line, sizeof line);
    DL_INFO("status: %s", line);
    dl_event("sync_status",
             "live=%d dead=%d left=%d merges=%llu pool_bytes=%llu pool_max_bytes=%llu busy_refused=%llu "
             "outbound_bytes=%llu jobs=%d drain_yields=%llu store_file_bytes=%llu store_live_bytes=%llu known=%llu",
             st.live, st.dead, st.left, (unsigned long long)st.merges, (unsigned long long)st.pool_bytes,
             (unsigned long long)st.pool_max, (unsigned long long)st.busy_refused,
             (unsigned long long)st.outbound_attached, st.jobs_inflight, (unsigned long long)st.drain_yields,
             (unsigned long long)st.store_file_bytes, (unsigned long long)st.store_live_bytes,
             (unsigned long long)st.known_learners);
}

static void on_stop(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    if (s->stopping) return;
    DL_INFO("signal %d: finishing %d store job(s) in flight, then stopping", w->signum,
            dl_worker_inflight(s->worker));
    s->stopping = 1;
    ev_io_stop(s->loop, &s->zio);
    /* persist the registry counters on the way out */
    for (int i = 0; i < dl_registry_count(s->reg); i++)
        if (dl_registry_get(s->reg, i)->used) dl_admit_put_now(s, dl_registry_get(s->reg, i));
    maybe_finish(s);
}

static int count_learner(const dl_store_learner *r, void *ctx)
{
    (void)r;
    ++*(uint64_t *)ctx;
    return 0;
}

/* A manifest run without an init file: only a store that holds the run
 * resumes; a new one has no version 0, since nothing here knows how to
 * initialise a model it has only a manifest of. Read before the store is
 * opened for writing, so the refusal leaves no new store behind. */
static int manifest_needs_init(dl_sync *s)
{
    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *st = NULL;
    dl_store_run have;
    int has = dl_store_open(s->cfg.store, &o, &st) == 0 && dl_store_get_run(st, &have) == 0;
    dl_store_close(&st);
    if (has) return 0;
    return dl_err(DL_EINVAL,
                  "store %s holds no run, and a new run of a model described by a manifest needs its version 0 from "
                  "a file: the synchronizer cannot invent an init for a model it does not know. Give --init_from "
                  "FILE.safetensors (the model's initial weights under the manifest's names, docs/OPERATING.md "
                  "\"Manifest runs\")",
                  s->cfg.store);
}

/* --init_from onto a store: only one without a run. */
static int init_from_refuse_run(dl_sync *s)
{
    dl_store_run have;
    if (dl_store_get_run(s->store, &have) == 0)
        return dl_err(DL_EINVAL, "--init_from %s: the store %s already holds run %s; init_from applies only to a new "
                      "(empty) store: drop --init_from to resume it, or start with another store", s->cfg.init_from,
                      s->cfg.store, have.run_id);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* lifecycle */

void dl_sync_wake(void *ctx)
{
    dl_sync *s = ctx;
    ev_async_send(s->loop, &s->wake);
}

/* A message libzmq freed (its I/O thread): the loop is woken only when an
 * Update waits for room (downlink.c room_or_wait), not for every chunk
 * that leaves. */
static void room_wake(void *ctx)
{
    dl_sync *s = ctx;
    if (atomic_exchange(&s->room_wait, 0)) ev_async_send(s->loop, &s->wake);
}

/* 1 when the endpoint only accepts connections from this host. */
static int loopback_endpoint(const char *ep)
{
    return !strncmp(ep, "tcp://127.", 10) || !strncmp(ep, "tcp://localhost:", 16) || !strncmp(ep, "tcp://[::1]:", 12) ||
           !strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9);
}

/* A tcp:// bind's port must be `*` or 0..65535: libzmq takes 99999 and
 * binds it modulo 65536 (34463), a typo that would otherwise run. */
static int check_bind_port(const char *ep)
{
    if (strncmp(ep, "tcp://", 6)) return 0;
    const char *colon = strrchr(ep + 6, ':');
    if (!colon || !colon[1]) return dl_err(DL_EINVAL, "bind %s: no port (tcp://HOST:PORT)", ep);
    if (!strcmp(colon + 1, "*")) return 0;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (*end || errno || port < 0 || port > 65535)
        return dl_err(DL_EINVAL, "bind %s: port '%s' is not * or 0..65535", ep, colon + 1);
    return 0;
}

static int open_router(dl_sync *s)
{
    DL_TRY(check_bind_port(s->cfg.bind));
    DL_ZMQ_PTR(s->zctx, zmq_ctx_new());
    dl_wire_seed_routing_ids(); /* before the ROUTER (and the ZAP handler's REP) draw their counters: proto/wire.h */
    if (s->cfg.auth == DL_SYNC_AUTH_CURVE) {
        /* the ZAP handler must be bound before the CURVE socket is */
        dl_auth_keypair kp;
        DL_TRY(dl_auth_load_keypair(s->cfg.key_file, &kp));
        DL_TRY(dl_auth_start(s->zctx, s->cfg.allowlist, &s->auth));
        DL_ZMQ_PTR(s->router, zmq_socket(s->zctx, ZMQ_ROUTER));
        DL_TRY(dl_auth_server_sock(s->router, &kp));
        memset(&kp, 0, sizeof kp);
        DL_TRY(dl_auth_watch(s->auth, s->zctx, s->router));
    } else {
        DL_ZMQ_PTR(s->router, zmq_socket(s->zctx, ZMQ_ROUTER));
    }
    DL_TRY(dl_wire_sock_setup(s->router, 1, (size_t)s->cfg.max_msg_bytes));
    if (zmq_bind(s->router, s->cfg.bind) != 0)
        return dl_err(DL_ENET, "bind %s: %s", s->cfg.bind, zmq_strerror(zmq_errno()));
    size_t elen = sizeof s->endpoint;
    DL_ZMQ_CALL(zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &elen));
    return 0;
}

/* A new run's global model from a model file instead of the seed, read
 * before the store is opened (a bad file leaves no store behind); the store
 * must then hold no run (init_from_refuse_run): a resumed run's model is the
 * store's. */
static int init_from_file(dl_sync *s, float *full)
{
    if (s->cfg.manifest) {
        dl_tensorfile_info ti;
        int rc = dl_tensorfile_read(s->cfg.init_from, s->cfg.manifest, full, &ti);
        if (rc) {
            char why[1024];
            snprintf(why, sizeof why, "%s", dl_errmsg());
            return dl_err(rc, "--init_from %s", why);
        }
        DL_INFO("new run %s: global model from %s (safetensors of the manifest's %d tensors, %s)", s->cfg.run_id,
                s->cfg.init_from, dl_manifest_ntensors(s->cfg.manifest), ti.dtype);
        return 0;
    }
    dl_modelfile_info info;
    int rc = dl_modelfile_read(s->cfg.init_from, &s->cfg.model, full, &info);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        return dl_err(rc, "--init_from %s", why);
    }
    DL_INFO("new run %s: global model from %s (%s, %s)", s->cfg.run_id, s->cfg.init_from, info.kind, info.dtype);
    return 0;
}

/* dl_sync_open, step 1: the per-fragment buffers (momentum only for this
 * shard's fragments, and only with an outer momentum: at 0 the step keeps
 * none; the merge worker allocates it if a reload turns it on), the
 * outbound queue and the payload pool. */
static void alloc_fragments(dl_sync *s)
{
    int P = s->cfg.P;
    s->numel = dl_xcalloc((size_t)P, sizeof(uint64_t));
    s->params = dl_xcalloc((size_t)P, sizeof(float *));
    s->momentum = dl_xcalloc((size_t)P, sizeof(float *));
    s->aside = dl_xcalloc((size_t)P, sizeof *s->aside);
    s->naside = dl_xcalloc((size_t)P, sizeof(int));
    s->capaside = dl_xcalloc((size_t)P, sizeof(int));
    s->versions = dl_xcalloc((size_t)P, sizeof(uint64_t));
    s->param_norm = dl_xcalloc((size_t)P, sizeof(double));
    s->outq = dl_wire_queue_new();
    dl_wire_queue_set_wake(s->outq, room_wake, s); /* room again: go on sending */
    /* each of the largest fragment's size: the worker swaps them with its scratch after a commit (worker.h) */
    size_t maxn = dl_plan_max_fragment_numel(s->plan);
    for (int p = 0; p < P; p++) {
        s->numel[p] = dl_plan_fragment_numel(s->plan, p);
        s->params[p] = dl_xaligned(64, maxn * sizeof(float)); /* another shard's: only until init_run */
        if (owns(s, p) && s->cfg.merge.outer_momentum != 0.0f) s->momentum[p] = dl_xaligned(64, maxn * sizeof(float));
    }
    int max_spans = 1;
    for (int p = 0; p < P; p++) {
        int ns = 0;
        dl_plan_fragment_spans(s->plan, p, &ns);
        if (ns > max_spans) max_spans = ns;
    }
    s->max_spans = max_spans;
    dl_pool_open(P, s->numel, max_spans, &s->pool);
}

/* Step 2: every check that needs no store, the limits that follow from the
 * model, and the bind: a typo'd bind or a bad option leaves no new store
 * directory behind. */
static int check_and_bind(dl_sync *s)
{
    char why[256];
    int P = s->cfg.P;
    DL_TRY(dl_guard_cfg_check(&s->cfg.guard));
    if (s->cfg.update.c.id && dl_codec_check(&s->cfg.update.c, why, sizeof why))
        return dl_err(DL_EINVAL, "update_codec %s: %s", dl_codec_name(s->cfg.update.c.id), why);
    /* a delta chunk must fit the frames a learner takes (the fp32 chunk): topk
     * costs 6 bytes per entry */
    if (s->cfg.update.c.id == DL_CODEC_TOPK && 2 * s->cfg.update.c.topk > s->cfg.update.c.block)
        return dl_err(DL_EINVAL, "update_topk %u is more than half of update_block %u", s->cfg.update.c.topk,
                      s->cfg.update.c.block);
    /* bounds that follow from the model (a shard: its own fragments) unless set */
    uint64_t model_bytes = 0, frag_bytes = 0;
    for (int p = 0; p < P; p++) {
        if (!owns(s, p)) continue;
        uint64_t b = s->numel[p] * sizeof(float);
        model_bytes += b;
        if (b > frag_bytes) frag_bytes = b;
    }
    s->max_frag_bytes = frag_bytes;
    if (!s->cfg.chunk_bytes) s->cfg.chunk_bytes = DL_SYNC_CHUNK_BYTES;
    if (s->cfg.chunk_bytes < DL_WIRE_CHUNK_MIN || s->cfg.chunk_bytes > DL_WIRE_CHUNK_MAX || s->cfg.chunk_bytes % 4)
        return dl_err(DL_EINVAL, "chunk_bytes %llu is not a multiple of 4 in [%u, %u]",
                      (unsigned long long)s->cfg.chunk_bytes, DL_WIRE_CHUNK_MIN, DL_WIRE_CHUNK_MAX);
    /* at least chunk_bytes (0, or below it: push chunks stay at chunk_bytes) */
    if (s->cfg.push_chunk_max < s->cfg.chunk_bytes) s->cfg.push_chunk_max = s->cfg.chunk_bytes;
    if (s->cfg.push_chunk_max > DL_WIRE_CHUNK_MAX || s->cfg.push_chunk_max % 4)
        return dl_err(DL_EINVAL, "push_chunk_max %llu is not a multiple of 4 in [%u, %u]",
                      (unsigned long long)s->cfg.push_chunk_max, DL_WIRE_CHUNK_MIN, DL_WIRE_CHUNK_MAX);
    /* chunked pushes: nothing bigger than the largest push chunk (or a small whole fragment) is a valid message */
    uint64_t unit = frag_bytes < s->cfg.push_chunk_max ? frag_bytes : s->cfg.push_chunk_max;
    if (!s->cfg.max_msg_bytes) {
        s->cfg.max_msg_bytes = unit + DL_WIRE_MAX_HEADER_BYTES;
    } else if (unit + DL_WIRE_MAX_HEADER_BYTES > s->cfg.max_msg_bytes) {
        /* a smaller message cap set by hand: push chunks grow only as far as one fits with its header cap
         * (libzmq drops the connection of a peer that sends more) */
        uint64_t fit = s->cfg.max_msg_bytes > DL_WIRE_MAX_HEADER_BYTES
                           ? (s->cfg.max_msg_bytes - DL_WIRE_MAX_HEADER_BYTES) & ~(uint64_t)3
                           : 0;
        s->cfg.push_chunk_max = fit > s->cfg.chunk_bytes ? fit : s->cfg.chunk_bytes;
    }
    /* a learner's window: two chunks in flight keep a link busy, and a
     * heartbeat or Ack waits behind at most that */
    if (!s->cfg.peer_outbound_bytes) s->cfg.peer_outbound_bytes = 2 * s->cfg.chunk_bytes;
    if (!s->cfg.pool_bytes) {
        s->pool_auto = 1; /* and it grows with the fleet: dl_uplink_pool_bound */
        uint64_t two = 2 * model_bytes, floor = 4 * frag_bytes;
        s->cfg.pool_bytes = two > floor ? two : floor;
        if (s->cfg.pool_bytes < DL_SYNC_POOL_MIN) s->cfg.pool_bytes = DL_SYNC_POOL_MIN;
    }
    if (s->cfg.pool_bytes < frag_bytes)
        return dl_err(DL_EINVAL,
                      "pool_mb holds %llu bytes, less than the largest fragment (%llu bytes): no push could wait",
                      (unsigned long long)s->cfg.pool_bytes, (unsigned long long)frag_bytes);
    if (!s->cfg.max_outbound_bytes) {
        uint64_t four = 4 * model_bytes, floor = 256ull << 20;
        s->cfg.max_outbound_bytes = four > floor ? four : floor;
    }
    /* auto: CURVE off only on a loopback bind given no keys; keys given mean
     * the operator wants them used (a loopback port behind a tunnel or a
     * proxy is reachable from elsewhere) */
    int keys_given = s->cfg.key_file[0] || s->cfg.allowlist[0];
    if (s->cfg.auth == DL_SYNC_AUTH_AUTO)
        s->cfg.auth = loopback_endpoint(s->cfg.bind) && !keys_given ? DL_SYNC_AUTH_OFF : DL_SYNC_AUTH_CURVE;
    if (s->cfg.auth == DL_SYNC_AUTH_CURVE && (!s->cfg.key_file[0] || !s->cfg.allowlist[0]))
        return dl_err(DL_EINVAL,
                      "%s, so CURVE authentication is on: set key_file (the synchronizer's key pair: dloco keygen "
                      "PREFIX) and allowlist (a file of 'learner_id public_key' lines), or auth = off to accept "
                      "anyone who can reach the port",
                      keys_given ? (s->cfg.key_file[0] ? "key_file is set" : "allowlist is set")
                                 : "the bind is not loopback");
    s->hello_tokens = s->cfg.new_hello_burst;
    s->hello_refill_ns = dl_clock_ns();
    s->lim = dl_wire_limits_default();
    s->lim.num_fragments = (uint32_t)P;
    s->lim.fragment_numel = s->numel;
    s->lim.max_frames = 2;
    /* a Push's checksum is checked by the uplink (dl_uplink_push): an fp32 chunk's while it is copied */
    s->lim.verify_checksum = false;
    s->lim.shard = (uint32_t)s->cfg.shard; /* pushes and fetches of another shard's fragments are refused */
    s->lim.shards = (uint32_t)s->cfg.shards;
    DL_TRY(open_router(s));
    return dl_stats_bind_metrics(s);
}

/* Step 3: the store (a fresh run starts from the seeded init or init_from, a
 * resumed one from LMDB), a new epoch, the policy and guard at the stored
 * versions; *total_v: the sum of this shard's fragment versions. */
static int open_state(dl_sync *s, uint64_t *total_v)
{
    int P = s->cfg.P;
    dl_store_opts so = dl_store_opts_default();
    so.durability = s->cfg.durability;
    float *full = dl_xmalloc(dl_plan_total_numel(s->plan) * sizeof(float));
    int rc = 0;
    if (s->cfg.init_from[0])
        rc = init_from_file(s, full);
    else if (s->cfg.manifest) {
        rc = manifest_needs_init(s);
        memset(full, 0, dl_plan_total_numel(s->plan) * sizeof(float)); /* unused: the store holds the run */
    } else
        rc = dl_model_init_params(&s->cfg.model, s->cfg.seed, full);
    if (!rc) rc = dl_store_open(s->cfg.store, &so, &s->store);
    if (!rc && s->cfg.init_from[0]) rc = init_from_refuse_run(s);
    if (!rc)
        for (int p = 0; p < P; p++) dl_plan_gather(s->plan, p, full, s->params[p]);
    free(full);
    if (rc) return rc;
    dl_store_run run = {.run_id = s->cfg.run_id,
                        .fingerprint = s->fingerprint,
                        .config_text = s->cfg.config_text,
                        .model = s->cfg.model,
                        .seed = s->cfg.manifest ? 0 : s->cfg.seed, /* a manifest run's init is a file */
                        .n_fragments = (uint32_t)P,
                        .numel = s->numel,
                        .manifest = s->cfg.manifest};
    dl_store_shard layout = {(uint32_t)s->cfg.shard, (uint32_t)s->cfg.shards};
    DL_TRY(dl_store_init_run_shard(s->store, &run, &layout, (const float *const *)s->params));
    for (int p = 0; p < P; p++)
        if (!owns(s, p)) {
            free(s->params[p]); /* a new store's version 0 of it is written; nothing else here needs it */
            s->params[p] = NULL;
        }
    DL_TRY(dl_store_bump_epoch(s->store, &s->epoch));
    DL_TRY(dl_policy_open(&s->cfg.policy, P, &s->policy));
    DL_TRY(dl_guard_open(&s->cfg.guard, P, s->cfg.policy.max_learners, &s->guard));
    *total_v = 0;
    for (int p = 0; p < P; p++) {
        uint64_t v;
        if (!owns(s, p)) continue; /* stays at version 0 in the policy: no round of it ever opens */
        DL_TRY(dl_store_read_fragment(s->store, (uint32_t)p, &v, s->params[p], s->momentum[p]));
        dl_policy_set_version(s->policy, p, v);
        *total_v += v;
        int fin = 0;
        s->param_norm[p] = dl_guard_norm(s->params[p], s->numel[p], &fin);
    }
    return 0;
}

/* Step 4: the per-learner tables, sized by max_learners. */
static void alloc_learners(dl_sync *s)
{
    int P = s->cfg.P;
    dl_registry_open(s->cfg.policy.max_learners, P, &s->reg);
    dl_ledger_open(s->cfg.policy.max_learners, P, &s->ledger);
    dl_ledger_set_fragments(s->ledger, dl_shard_count(P, s->cfg.shard, s->cfg.shards));
    s->lstats = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->lstats);
    s->inb = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->inb);
    s->inb_ss = dl_xcalloc((size_t)s->cfg.policy.max_learners * (size_t)s->max_spans, sizeof *s->inb_ss);
    s->chunk_ss = dl_xcalloc((size_t)s->max_spans, sizeof *s->chunk_ss);
    s->dec_scratch = dl_xaligned(64, (DL_SYNC_DECODE_SLICE > DL_CODEC_BLOCK_MAX ? DL_SYNC_DECODE_SLICE : DL_CODEC_BLOCK_MAX) *
                                         sizeof(float));
    s->outx = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->outx);
    for (int i = 0; i < s->cfg.policy.max_learners; i++) s->outx[i].p = s->outx[i].last_p = -1;
    s->resume_v = dl_xcalloc((size_t)s->cfg.policy.max_learners * (size_t)P, sizeof(uint64_t));
    s->resume_o = dl_xcalloc((size_t)s->cfg.policy.max_learners * (size_t)P, sizeof(uint64_t));
    s->ans = dl_xcalloc((size_t)s->cfg.policy.max_learners * (size_t)P, sizeof *s->ans);
    s->ans_instance = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->ans_instance);
    s->owed_order = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->owed_order);
}

/* Step 5: the loop, the worker and the watchers (not yet running). */
static int start_watchers(dl_sync *s)
{
    int P = s->cfg.P;
    s->loop = ev_loop_new(EVFLAG_AUTO);
    dl_worker_open(s->store, s->plan, s->params, s->momentum, dl_sync_wake, s, &s->worker);
    dl_worker_set_update_codec(s->worker, &s->cfg.update);
    s->kept = dl_xcalloc((size_t)P * DL_SYNC_KEPT_DELTAS, sizeof *s->kept);
    s->fullc = dl_xcalloc((size_t)P, sizeof *s->fullc);
    dl_pool_set_keep(s->pool, s->cfg.pool_bytes); /* spare buffers for the next pushes, within the bound */
    /* shared Update chunks (downlink.c): one fp32 version of every fragment, or two of the largest */
    s->shared_max = 2 * s->max_frag_bytes;
    uint64_t model = 0;
    for (int p = 0; p < P; p++) model += s->numel[p] * sizeof(float);
    if (model > s->shared_max) s->shared_max = model;
    for (int p = 0; p < P; p++)
        if (owns(s, p)) s->owned_bytes += s->numel[p] * sizeof(float);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    s->pool_cap = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / DL_SYNC_POOL_MEM_DIV : 0;
    int fd;
    size_t fl = sizeof fd;
    if (zmq_getsockopt(s->router, ZMQ_FD, &fd, &fl) != 0)
        return dl_wire_zmq_fail("zmq_getsockopt(ZMQ_FD)", __FILE__, __LINE__);
    ev_io_init(&s->zio, on_zmq, fd, EV_READ);
    s->zio.data = s;
    ev_io_start(s->loop, &s->zio);
    ev_async_init(&s->wake, on_wake);
    s->wake.data = s;
    ev_async_start(s->loop, &s->wake);
    ev_idle_init(&s->more, on_more);
    s->more.data = s;
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
    ev_signal_init(&s->sighup, dl_reload_on_hup, SIGHUP);
    s->sighup.data = s;
    ev_signal_start(s->loop, &s->sighup);
    return 0;
}

/* Step 6: what this process is, in the log and as sync_start. */
static void announce(const dl_sync *s, uint64_t total_v)
{
    int P = s->cfg.P, owned = dl_shard_count(P, s->cfg.shard, s->cfg.shards);
    DL_INFO("run '%s' epoch %llu: %s (%d fragments, %zu params, fingerprint %016llx), listening on %s",
            s->cfg.run_id, (unsigned long long)s->epoch, total_v ? "resumed" : "new run", P,
            dl_plan_total_numel(s->plan), (unsigned long long)s->fingerprint, s->endpoint);
    if (s->cfg.shards > 1)
        DL_INFO("shard %d of %d: the %d fragments p with p %% %d == %d are merged, stored and served here", s->cfg.shard,
                s->cfg.shards, owned, s->cfg.shards, s->cfg.shard);
    DL_INFO("limits: messages <= %llu bytes, chunks of %llu bytes (a learner's pushes: up to %llu as its uplink "
            "allows), pool <= %llu bytes, outbound queue <= %llu bytes (%llu per learner), %s",
            (unsigned long long)s->cfg.max_msg_bytes, (unsigned long long)s->cfg.chunk_bytes,
            (unsigned long long)s->cfg.push_chunk_max,
            (unsigned long long)s->cfg.pool_bytes, (unsigned long long)s->cfg.max_outbound_bytes,
            (unsigned long long)s->cfg.peer_outbound_bytes,
            s->auth ? "CURVE: only allowlisted keys connect" : "no authentication (loopback or auth = off)");
    if (!s->auth && !loopback_endpoint(s->cfg.bind))
        DL_WARN("bind %s is not loopback and auth = off: anyone who reaches the port can join and push", s->cfg.bind);
    dl_event("sync_start",
             "epoch=%llu resumed=%d fragments=%d params=%zu fingerprint=%016llx endpoint=%s auth=%s max_msg_bytes=%llu "
             "max_outbound_bytes=%llu chunk_bytes=%llu push_chunk_max=%llu pool_bytes=%llu peer_outbound_bytes=%llu "
             "shard=%d shards=%d owned=%d update_codec=%s update_block=%u update_topk=%u",
             (unsigned long long)s->epoch, total_v ? 1 : 0, P, dl_plan_total_numel(s->plan),
             (unsigned long long)s->fingerprint, s->endpoint, s->auth ? "curve" : "off",
             (unsigned long long)s->cfg.max_msg_bytes, (unsigned long long)s->cfg.max_outbound_bytes,
             (unsigned long long)s->cfg.chunk_bytes, (unsigned long long)s->cfg.push_chunk_max,
             (unsigned long long)s->cfg.pool_bytes, (unsigned long long)s->cfg.peer_outbound_bytes, s->cfg.shard,
             s->cfg.shards, owned,
             s->cfg.update.c.id ? dl_codec_name(s->cfg.update.c.id) : "off", s->cfg.update.c.block,
             s->cfg.update.c.topk);
}

int dl_sync_open(const dl_sync_cfg *cfg, dl_sync **out)
{
    *out = NULL;
    char why[256];
    if (dl_policy_cfg_check(&cfg->policy, why, sizeof why)) return DL_EINVAL;
    dl_sync *s = dl_xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    dl_syncmet_init(&s->met, cfg->P > 0 ? cfg->P : 1);
    int rc = 0;
    uint64_t total_v = 0;
    if (s->cfg.manifest) {
        /* the run's model is the manifest's: no GPT-2 fields anywhere */
        memset(&s->cfg.model, 0, sizeof s->cfg.model);
        if ((rc = dl_manifest_plan_open(s->cfg.manifest, s->cfg.P, &s->plan))) goto fail;
        s->fingerprint = dl_manifest_fingerprint(s->cfg.manifest, s->plan);
    } else {
        if ((rc = dl_model_config_check(&s->cfg.model))) goto fail;
        if ((rc = dl_model_plan_open(&s->cfg.model, s->cfg.P, &s->plan))) goto fail;
        s->fingerprint = dl_model_fingerprint(&s->cfg.model, s->plan);
    }
    if ((rc = dl_shard_check(s->cfg.P, s->cfg.shard, s->cfg.shards))) goto fail;
    if (s->cfg.shards <= 1) s->cfg.shard = 0, s->cfg.shards = 1;
    alloc_fragments(s);
    if ((rc = check_and_bind(s)) || (rc = open_state(s, &total_v))) goto fail;
    alloc_learners(s);
    if ((rc = start_watchers(s))) goto fail;
    s->started_ns = s->last_sync_ns = dl_clock_ns();
    dl_store_foreach_learner(s->store, count_learner, &s->known_learners);
    dl_eval_open(s);
    dl_stats_start_metrics(s);
    announce(s, total_v);
    *out = s;
    return 0;
fail:
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
    dl_sync_drain(s);
    ev_run(s->loop, 0);
    return 0;
}

void dl_sync_close(dl_sync **sp)
{
    if (!sp || !*sp) return;
    dl_sync *s = *sp;
    dl_evalthread_close(&s->evalt); /* before the store and the loop it reads and wakes */
    dl_httpd_close(&s->httpd); /* its thread reads only the pages */
    dl_httpd_pages_free(&s->pages);
    dl_syncmet_free(&s->met);
    if (s->outq) dl_wire_queue_set_wake(s->outq, NULL, NULL); /* libzmq frees what it holds below */
    dl_worker_close(&s->worker); /* before the loop it wakes */
    if (s->router) DL_ZMQ_LOG(zmq_close(s->router));
    dl_auth_stop(&s->auth);
    if (s->zctx) DL_ZMQ_LOG(zmq_ctx_term(s->zctx));
    /* after libzmq's threads: a free callback in flight may still wake the loop */
    if (s->loop) ev_loop_destroy(s->loop);
    /* libzmq has freed every queued message now: the counters can go */
    dl_wire_queue_release(&s->outq);
    dl_guard_close(&s->guard);
    free(s->param_norm);
    free(s->rate_buf);
    dl_policy_close(&s->policy);
    dl_registry_close(&s->reg);
    dl_ledger_close(&s->ledger);
    for (int i = 0; s->outx && i < s->cfg.policy.max_learners; i++) dl_downlink_reset(s, i); /* pinned snapshots */
    dl_store_close(&s->store);
    dl_plan_close(&s->plan);
    for (int p = 0; s->params && p < s->cfg.P; p++) {
        free(s->params[p]);
        free(s->momentum[p]);
        free(s->aside[p]);
    }
    dl_pool_close(&s->pool);
    for (int i = 0; s->inb && i < s->cfg.policy.max_learners; i++) free(s->inb[i].buf);
    free(s->inb);
    free(s->inb_ss);
    free(s->chunk_ss);
    free(s->dec_scratch);
    free(s->outx);
    dl_downlink_close(s);
    free(s->fullc);
    for (int k = 0; s->kept && k < s->cfg.P * DL_SYNC_KEPT_DELTAS; k++) free(s->kept[k].buf);
    free(s->kept);
    free(s->resume_v);
    free(s->resume_o);
    free(s->ans);
    free(s->ans_instance);
    free(s->params);
    free(s->momentum);
    free(s->aside);
    free(s->naside);
    free(s->capaside);
    free(s->numel);
    free(s->versions);
    free(s->lstats);
    free(s->owed_order);
    free(s);
    *sp = NULL;
}
