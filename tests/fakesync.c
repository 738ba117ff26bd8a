/* The fake synchronizer of the learner tests (tests/fakesync.h): a ROUTER on loopback, the run's wire
 * limits, and one send helper per message a synchronizer sends. */
#include "tests/fakesync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/plan.h"

static void setup_fail(const char *what, const char *why)
{
    printf("FAIL fakesync: %s: %s\n", what, why);
    exit(1);
}

void fs_open(dl_fakesync *h, const dl_plan *plan, const char *id, const dl_auth_keypair *curve)
{
    memset(h, 0, sizeof *h);
    h->run_id = "dloco";
    h->id = id;
    h->plan = plan;
    int P = dl_plan_P(plan);
    if (P > DL_FS_MAX_P) setup_fail("open", "more fragments than DL_FS_MAX_P");
    h->ctx = zmq_ctx_new();
    h->router = zmq_socket(h->ctx, ZMQ_ROUTER);
    if (!h->router) setup_fail("router", zmq_strerror(zmq_errno()));
    if (dl_wire_sock_setup(h->router, 1, 64u << 20) != 0) setup_fail("socket setup", dl_errmsg());
    if (curve) {
        int one = 1;
        if (zmq_setsockopt(h->router, ZMQ_CURVE_SERVER, &one, sizeof one) ||
            zmq_setsockopt(h->router, ZMQ_CURVE_SECRETKEY, curve->secret_z85, 40))
            setup_fail("curve", zmq_strerror(zmq_errno()));
    }
    if (zmq_bind(h->router, "tcp://127.0.0.1:*") != 0) setup_fail("bind", zmq_strerror(zmq_errno()));
    size_t len = sizeof h->ep;
    if (zmq_getsockopt(h->router, ZMQ_LAST_ENDPOINT, h->ep, &len) != 0) setup_fail("last endpoint", "");
    for (int p = 0; p < P; p++) h->numel[p] = dl_plan_fragment_numel(plan, p);
    h->lim = dl_wire_limits_default();
    h->lim.num_fragments = (uint32_t)P;
    h->lim.fragment_numel = h->numel;
}

void fs_close(dl_fakesync *h)
{
    zmq_close(h->router);
    zmq_ctx_term(h->ctx);
}

static void learn(dl_fakesync *h, const char *id, const uint8_t *rid, size_t len)
{
    snprintf(h->last_id, sizeof h->last_id, "%s", id);
    if (len != h->rid_len || memcmp(rid, h->rid, len)) {
        h->conns++;
        memcpy(h->rid, rid, len);
        h->rid_len = len;
    }
    int i = 0;
    while (i < h->npeer && strcmp(h->peer[i].id, id)) i++;
    if (i == h->npeer) {
        if (h->npeer == DL_FS_MAX_PEERS) return;
        snprintf(h->peer[h->npeer++].id, sizeof h->peer[0].id, "%s", id);
    }
    memcpy(h->peer[i].rid, rid, len);
    h->peer[i].rid_len = len;
}

/* Envelope.learner_id of a message to `id`. */
static const char *who(const dl_fakesync *h, const char *id)
{
    return id ? id : h->id ? h->id : h->last_id;
}

int fs_next(dl_fakesync *h, dl_wire_msg *m, int timeout_ms)
{
    int64_t t0 = dl_clock_ns();
    for (;;) {
        int64_t left = timeout_ms - (dl_clock_ns() - t0) / 1000000;
        if (left <= 0) return -1;
        zmq_pollitem_t it = {h->router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, (long)left) <= 0) continue;
        int rc = dl_wire_recv(h->router, 1, &h->lim, m, ZMQ_DONTWAIT);
        if (rc == DL_EAGAIN) {
            dl_wire_msg_close(m);
            continue;
        }
        if (rc) {
            h->bad++;
            printf("FAIL fakesync: the learner sent a bad message: %s\n", dl_errmsg());
            dl_wire_msg_close(m);
            return -1;
        }
        learn(h, m->env->learner_id, m->id, m->id_len);
        if (m->env->body_case == DLOCO__V1__ENVELOPE__BODY_HEARTBEAT) {
            h->heartbeats++;
            h->hb_step = m->env->heartbeat->step;
            dl_wire_msg_close(m);
            continue;
        }
        return (int)m->env->body_case;
    }
}

int fs_expect(dl_fakesync *h, int body, dl_wire_msg *m, int timeout_ms, const char *what)
{
    int got = fs_next(h, m, timeout_ms);
    if (got == body) return 1;
    printf("fakesync: expected %s, got %s\n", what,
           got < 0 ? "nothing" : dl_wire_body_name((Dloco__V1__Envelope__BodyCase)got));
    if (got >= 0) dl_wire_msg_close(m);
    return 0;
}

/* The routing id to send to: learner id's last connection, or the last heard. */
static int route(dl_fakesync *h, const char *id, const uint8_t **rid, size_t *len)
{
    if (!id) {
        *rid = h->rid;
        *len = h->rid_len;
        return h->rid_len ? 0 : -1;
    }
    for (int i = 0; i < h->npeer; i++)
        if (!strcmp(h->peer[i].id, id)) {
            *rid = h->peer[i].rid;
            *len = h->peer[i].rid_len;
            return 0;
        }
    printf("fakesync: send to %s: never heard from it\n", id);
    return -1;
}

int fs_send_frames(dl_fakesync *h, const char *id, Dloco__V1__Envelope *env, const void *const *pl,
                   const size_t *len, int n)
{
    const uint8_t *rid;
    size_t rlen;
    if (route(h, id, &rid, &rlen)) return -1;
    if (dl_wire_send(h->router, rid, rlen, env, pl, len, n, 0) != 0) {
        printf("fakesync: send %s: %s\n", dl_wire_body_name(env->body_case), dl_errmsg());
        return -1;
    }
    return 0;
}

int fs_send(dl_fakesync *h, const char *id, Dloco__V1__Envelope *env, const void *payload, size_t bytes)
{
    const void *pl[1] = {payload};
    size_t len[1] = {bytes};
    return fs_send_frames(h, id, env, pl, len, payload ? 1 : 0);
}

int fs_send_unchecked(dl_fakesync *h, const char *id, Dloco__V1__Envelope *env, const void *payload, size_t bytes)
{
    const uint8_t *rid;
    size_t rlen;
    if (route(h, id, &rid, &rlen)) return -1;
    env->protocol_version = DL_WIRE_PROTOCOL_VERSION;
    size_t n = dloco__v1__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return -1;
    dloco__v1__envelope__pack(env, buf);
    int ok = zmq_send(h->router, rid, rlen, ZMQ_SNDMORE) >= 0 &&
             zmq_send(h->router, buf, n, payload ? ZMQ_SNDMORE : 0) == (int)n &&
             (!payload || zmq_send(h->router, payload, bytes, 0) == (int)bytes);
    free(buf);
    return ok ? 0 : -1;
}

int fs_welcome(dl_fakesync *h, const char *id, const fs_welcome_args *a)
{
    uint64_t v[DL_FS_MAX_P];
    int P = dl_plan_P(h->plan);
    for (int p = 0; p < P; p++) v[p] = a->version;
    Dloco__V1__Welcome w;
    dloco__v1__welcome__init(&w);
    w.num_fragments = (uint32_t)P;
    w.n_fragment_versions = (size_t)P;
    w.fragment_versions = v;
    w.h = a->h;
    w.heartbeat_ms = a->hb_ms;
    w.liveness = a->liveness;
    w.policy = (char *)(a->policy ? a->policy : "test");
    w.must_fetch = a->must_fetch;
    w.chunk_bytes = a->chunk_bytes;
    w.update_codec = a->update_codec;
    w.shard = a->shard;
    w.shards = a->shards;
    if (a->answered) {
        w.n_answered_bases = (size_t)P;
        w.answered_bases = (uint64_t *)a->answered;
    }
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, h->run_id, a->epoch, who(h, id));
    dl_wire_set_welcome(&env, &w);
    if (a->h && a->hb_ms && a->liveness) return fs_send(h, id, &env, NULL, 0);
    return fs_send_unchecked(h, id, &env, NULL, 0);
}

/* An fp32 Update of p at `version` carrying `bytes` of data: the whole fragment (n 0), or elements
 * [off, off + n) as one chunk; bytes that are not 4 x its elements are sent unchecked. */
static int update(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t version, const void *data,
                  size_t bytes, uint64_t off, uint64_t n)
{
    Dloco__V1__Update u;
    dloco__v1__update__init(&u);
    u.fragment = (uint32_t)p;
    u.version = version;
    u.codec = DLOCO__V1__CODEC__CODEC_FP32;
    u.numel = h->numel[p];
    u.chunk_offset = off;
    u.chunk_numel = n;
    u.checksum = dl_wire_checksum(data, bytes);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, h->run_id, epoch, who(h, id));
    dl_wire_set_update(&env, &u);
    if (bytes == (n ? n : h->numel[p]) * 4) return fs_send(h, id, &env, data, bytes);
    return fs_send_unchecked(h, id, &env, data, bytes);
}

int fs_update_raw(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t version, const void *g, size_t bytes)
{
    return update(h, id, epoch, p, version, g, bytes, 0, 0);
}

int fs_update_chunk(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t version, const float *g,
                    uint64_t off, uint64_t n)
{
    return update(h, id, epoch, p, version, g + off, (size_t)n * 4, off, n);
}

int fs_update(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t version, const float *g)
{
    return fs_update_raw(h, id, epoch, p, version, g, h->numel[p] * 4);
}

static int ack(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t base, int decision, uint64_t merged,
               int again)
{
    Dloco__V1__Ack a;
    dloco__v1__ack__init(&a);
    a.fragment = (uint32_t)p;
    a.base_version = base;
    a.decision = decision;
    a.merged_version = merged;
    a.again = again;
    a.rebase = decision == DLOCO__V1__DECISION__DECISION_DROPPED_STALE && !again;
    a.reason = decision == DLOCO__V1__DECISION__DECISION_REJECTED ? "test says no" : "";
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, h->run_id, epoch, who(h, id));
    dl_wire_set_ack(&env, &a);
    return fs_send(h, id, &env, NULL, 0);
}

int fs_ack(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t base, int decision, uint64_t merged)
{
    return ack(h, id, epoch, p, base, decision, merged, 0);
}

int fs_ack_again(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t base, int decision, uint64_t merged)
{
    return ack(h, id, epoch, p, base, decision, merged, 1);
}

int fs_error(dl_fakesync *h, const char *id, uint64_t epoch, int code, const char *msg, int fatal)
{
    Dloco__V1__Error e;
    dloco__v1__error__init(&e);
    e.kind = dl_wire_error_kind_of(code);
    e.message = (char *)msg;
    e.fatal = fatal;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, h->run_id, epoch, who(h, id));
    dl_wire_set_error(&env, &e);
    return fs_send(h, id, &env, NULL, 0);
}

int fs_heartbeat(dl_fakesync *h, const char *id, uint64_t epoch)
{
    Dloco__V1__Heartbeat b;
    dloco__v1__heartbeat__init(&b);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, h->run_id, epoch, who(h, id));
    dl_wire_set_heartbeat(&env, &b);
    return fs_send(h, id, &env, NULL, 0);
}
