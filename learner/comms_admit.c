/* A comms session's admission: the Hello and its backoff, the Welcome taken or refused, re-hello,
 * heartbeats, Bye and the synchronizer's Errors (its side: synchronizer/admit.c). */
#include "learner/comms_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"

void dl_comms_admit_hello(dl_comms *c)
{
    Dloco__V1__Hello h;
    dloco__v1__hello__init(&h);
    h.fingerprint = c->fingerprint;
    h.n_layer = c->n_layer;
    h.n_head = c->n_head;
    h.n_embd = c->n_embd;
    h.seq_len = c->seq_len;
    h.vocab = c->vocab;
    h.batch = c->batch;
    h.instance = c->instance;
    h.num_fragments = (uint32_t)c->P;
    h.device = c->device;
    /* any chunk up to our largest fragment (libzmq takes nothing bigger) */
    size_t mc = c->maxmsg - DL_WIRE_MAX_HEADER_BYTES;
    h.max_chunk_bytes = mc > DL_WIRE_CHUNK_MAX ? DL_WIRE_CHUNK_MAX : mc < DL_WIRE_CHUNK_MIN ? DL_WIRE_CHUNK_MIN : (uint32_t)mc;
    dl_wire_manifest_buf mbuf = {0};
    if (c->manifest) {
        if (dl_wire_hello_set_manifest(&h, c->manifest, &mbuf)) {
            DL_WARN("comms: hello not sent: %s", dl_errmsg()); /* out of memory: tried again as an unsent one */
            c->hello_unsent = 1;
            c->t_hello = dl_clock_ns();
            return;
        }
        h.max_tokens_per_step = c->max_tokens_per_step;
    }
    /* held_versions has all P entries; the synchronizer reads those of the
     * fragments it owns, ours (a shard's are not the others' business) */
    int all = 1;
    for (int p = 0; p < c->P; p++) {
        int held = dl_mailbox_held(c->mb, p, &c->hv[p]);
        if (!held) c->hv[p] = 0;
        if (c->f[p].served) all &= held;
        if (c->f[p].served) h.carried_tokens += dl_mailbox_carried(c->mb, p);
    }
    dl_mailbox_progress(c->mb, NULL, 0, &h.step, NULL, NULL, NULL);
    /* A learner that holds only some fragments is fresh for the protocol. */
    h.n_held_versions = all ? (size_t)c->P : 0;
    h.held_versions = all ? c->hv : NULL;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_hello(&env, &h);
    int rc = dl_comms_send_env(c, &env, NULL, 0);
    dl_wire_manifest_buf_free(&mbuf);
    /* Not connected yet (ZMQ_IMMEDIATE), or no socket: try again in
     * hello_unsent_ms, not after the full retry period. */
    c->hello_unsent = rc == DL_EAGAIN;
    c->t_hello = dl_clock_ns();
    if (rc) return;
    /* backoff: each unanswered Hello doubles the wait for the next, from
     * hello_retry_ms up to hello_retry_max_ms; a Welcome resets it */
    c->hello_wait_ms = c->hello_sent_once ? (c->hello_wait_ms < c->hello_retry_max_ms / 2 ? c->hello_wait_ms * 2
                                                                                          : c->hello_retry_max_ms)
                                          : c->hello_retry_ms;
    c->hello_sent_once = 1;
    COUNT(hellos);
    DL_DEBUG("comms: hello to %s (epoch %llu, %s)", c->endpoint, (unsigned long long)c->epoch,
             all ? "with held versions" : "fresh");
}

/* A Welcome's values outside the learner's bounds, or from another shard
 * than this session's: the reason into why, else "". */
static void welcome_bounds(const dl_comms *c, const Dloco__V1__Welcome *w, char *why, size_t cap)
{
    why[0] = 0;
    int ws = w->shards > 1 ? (int)w->shards : 1, wk = w->shards > 1 ? (int)w->shard : 0;
    if (ws != c->shards || wk != c->shard) {
        char a[48], b[48];
        snprintf(a, sizeof a, ws > 1 ? "shard %d of %d" : "an unsharded synchronizer", wk, ws);
        snprintf(b, sizeof b, c->shards > 1 ? "shard %d of %d" : "an unsharded synchronizer", c->shard, c->shards);
        snprintf(why, cap, "it is from %s, this session expects %s (the order of --connect is the shards' order)", a, b);
    } else if (w->h < DL_COMMS_H_MIN || w->h > DL_COMMS_H_MAX)
        snprintf(why, cap, "h %u outside [%u, %u]", w->h, DL_COMMS_H_MIN, DL_COMMS_H_MAX);
    else if (w->heartbeat_ms < DL_COMMS_HEARTBEAT_MIN_MS || w->heartbeat_ms > DL_COMMS_HEARTBEAT_MAX_MS)
        snprintf(why, cap, "heartbeat_ms %u outside [%u, %u]", w->heartbeat_ms, DL_COMMS_HEARTBEAT_MIN_MS,
                 DL_COMMS_HEARTBEAT_MAX_MS);
    else if (w->liveness < DL_COMMS_LIVENESS_MIN || w->liveness > DL_COMMS_LIVENESS_MAX)
        snprintf(why, cap, "liveness %u outside [%u, %u]", w->liveness, DL_COMMS_LIVENESS_MIN, DL_COMMS_LIVENESS_MAX);
}

/* Our undecided pushes the synchronizer never answered (Welcome.answered_bases
 * names an older base, or none): they never arrived, or arrived with a
 * connection that went before any answer, and no decision will come. Each is
 * forgotten as a push that never left (its progress stays in the learner's
 * parameters and the fragment's next push carries it), where it held that
 * push up to push_decision_timeout_ms. One answered is decided by the Acks
 * that follow the Welcome again (Ack.again). A push still leaving is not
 * one of them. */
static void unanswered(dl_comms *c, const Dloco__V1__Welcome *w)
{
    for (int i = 0; i < c->n_served; i++) {
        int p = c->served[i];
        uint64_t base, a = w->answered_bases[p];
        if (dl_mailbox_open_push(c->mb, p, &base) == 0 || (c->tx.active && c->tx.p == p)) continue;
        if (a && a - 1 >= base) continue;
        dl_comms_uplink_forget_push(c, p);
        char ans[32] = "none";
        if (a) snprintf(ans, sizeof ans, "%llu", (unsigned long long)(a - 1));
        DL_INFO("comms: push of fragment %d (base version %llu) was never answered (the synchronizer's latest "
                "answer: %s): pushing its progress again", p, (unsigned long long)base, ans);
        dl_event("push_unanswered", " learner=%s epoch=%llu fragment=%d base_version=%llu answered_base=%s", c->id,
                 (unsigned long long)c->epoch, p, (unsigned long long)base, ans);
    }
}

/* A Welcome answering our Hello (state HELLO). */
void dl_comms_admit_welcome(dl_comms *c, uint64_t epoch, const Dloco__V1__Welcome *w)
{
    char why[200];
    welcome_bounds(c, w, why, sizeof why);
    if (why[0]) {
        /* as if the Hello had not been answered: its retry (with backoff) comes */
        COUNT(welcomes_refused);
        DL_WARN("comms: welcome from %s (epoch %llu) refused: %s; hello again in %d ms", c->endpoint,
                (unsigned long long)epoch, why, c->hello_wait_ms);
        char ev[300];
        dl_event("welcome_refused", " learner=%s epoch=%llu reason=%s", c->id, (unsigned long long)epoch,
                 dl_event_str(why, ev, sizeof ev));
        snprintf(c->conn_err, sizeof c->conn_err, "welcome refused: %s", why); /* for the connect timeout */
        return;
    }
    if (c->epoch && epoch != c->epoch) {
        dl_comms_uplink_forget(c); /* another incarnation: what the old one pooled is gone */
        if (epoch < c->epoch)
            DL_WARN("comms: epoch goes back from %llu to %llu on a new connection (a new store?)",
                    (unsigned long long)c->epoch, (unsigned long long)epoch);
    }
    c->epoch = epoch;
    c->any_epoch = 0;
    if (!c->rebuild_bad) c->rebuilds_row = 0;
    c->chunk = w->chunk_bytes / sizeof(float);
    c->push_chunk = c->chunk; /* until an Ack says otherwise */
    /* delta Updates: a mirror per fragment from its next full Update on; none without them */
    /* a new epoch (a restarted synchronizer, perhaps on another store) gives
     * version numbers a new meaning: every mirror waits for a full Update */
    int new_epoch = c->update_codec && epoch != c->epoch_mirrors;
    c->epoch_mirrors = epoch;
    c->update_codec = w->update_codec;
    if (new_epoch)
        for (int p = 0; p < c->P; p++) c->f[p].mirror_ok = c->f[p].stage_active = 0;
    if (!c->update_codec)
        for (int p = 0; p < c->P; p++) {
            sfrag *f = &c->f[p];
            free(f->mirror);
            free(f->stage);
            f->mirror = f->stage = NULL;
            f->mirror_ok = f->stage_active = 0;
        }
    if (c->tx.active && (w->must_fetch || c->chunk == 0)) dl_comms_uplink_abort(c, !w->must_fetch, 0, "welcome");
    c->conn_err[0] = 0;
    c->hello_sent_once = 0; /* backoff starts over at the next re-hello */
    int64_t now = dl_clock_ns();
    int n = 0;
    for (int i = 0; i < c->n_served; i++) {
        int p = c->served[i];
        sfrag *f = &c->f[p];
        uint64_t v;
        int held = dl_mailbox_held(c->mb, p, &v);
        f->known = w->fragment_versions[p] > (held ? v : 0) ? w->fragment_versions[p] : (held ? v : 0);
        /* behind the global (an outage, a partition): a keep learner pushes what it
         * trained meanwhile once it has adopted that version, not on its old base */
        dl_mailbox_set_behind(c->mb, p, w->must_fetch ? 0 : w->fragment_versions[p], now);
        f->fetch_pending = f->rebase_pending = 0;
        f->busy_until = 0;
        if (!(c->tx.active && c->tx.p == p)) f->unacked = 0; /* a push still leaving keeps its slot */
        if (w->must_fetch || !held) {
            /* a queued push is relative to a base the synchronizer will not accept */
            if (w->must_fetch) dl_mailbox_discard_queued(c->mb, p);
            dl_comms_downlink_want(c, p, now);
            n++;
        } else if (w->fragment_versions[p] > v && !f->fetch_want && w->update_codec && f->mirror_ok &&
                   f->mirror_version >= v) {
            /* the synchronizer sends what p lacks from v, as deltas where it keeps them
             * (synchronizer/admit.c): nothing to fetch */
        } else if (w->fragment_versions[p] > v && !f->fetch_want) {
            /* the synchronizer holds a newer version than we do (merges whose
             * Updates a restart or a lost connection swallowed, perhaps the
             * merge of our own push): fetch it to adopt in the learner's mode,
             * so our next push is not on a base that merged progress of ours */
            dl_comms_downlink_want(c, p, now);
            f->fetch_soft = 1;
            n++;
        }
        /* a fetch still wanted after a refused update keeps its time */
    }
    if (w->n_answered_bases == (size_t)c->P && !w->must_fetch) unanswered(c, w);
    pthread_mutex_lock(&c->mu);
    c->st.h = w->h;
    c->st.heartbeat_ms = w->heartbeat_ms;
    c->st.epoch = epoch;
    c->st.state = DL_COMMS_READY;
    c->msg[0] = 0;
    pthread_mutex_unlock(&c->mu);
    c->state = DL_COMMS_READY;
    /* before READY: a barrier policy holds the training thread from the first step */
    dl_mailbox_set_policy(c->mb, w->policy);
    dl_mailbox_set_link(c->mb, c->link, DL_COMMS_READY, w->h, "");
    c->hb_ms = w->heartbeat_ms;
    c->liveness = w->liveness;
    c->t_hb = now;
    c->t_recv = now;
    c->ever_welcomed = 1;
    c->hs_failed = 0;
    char pol[NET_STR_CAP];
    DL_INFO("comms: welcome from %s: epoch %llu, H %u, heartbeat %u ms x %u, policy %s, must_fetch %d (fetching %d)",
            c->endpoint, (unsigned long long)c->epoch, w->h, w->heartbeat_ms, w->liveness,
            dl_comms_net_str(w->policy, pol, sizeof pol), (int)w->must_fetch, n);
    dl_event("welcome",
             " learner=%s epoch=%llu h=%u heartbeat_ms=%u liveness=%u policy=%s must_fetch=%d fetching=%d shard=%d "
             "shards=%d",
             c->id, (unsigned long long)c->epoch, w->h, w->heartbeat_ms, w->liveness,
             dl_event_str(w->policy ? w->policy : "", pol, 300), (int)w->must_fetch, n, c->shard, c->shards);
    dl_comms_downlink_fetch(c, now);
}

/* Start a new session: the synchronizer restarted, forgot us, went silent,
 * said bye, or the connection was rebuilt. With `forget` the pushes sent are
 * forgotten (dl_comms_uplink_forget). Queued pushes wait in their slots either way.
 * While already waiting for a Welcome nothing more is sent: the Hello
 * retries (with their backoff) go on. */
void dl_comms_admit_rehello(dl_comms *c, const char *why, int forget)
{
    if (forget) dl_comms_uplink_forget(c);
    if (c->state == DL_COMMS_HELLO) return;
    DL_WARN("comms: %s; sending hello again", why);
    char ev[1400];
    dl_event("rehello", " learner=%s epoch=%llu reason=%s", c->id, (unsigned long long)c->epoch,
             dl_event_str(why, ev, sizeof ev));
    dl_comms_set_state(c, DL_COMMS_HELLO, NULL);
    COUNT(rehellos);
    int64_t now = dl_clock_ns();
    /* how far the global versions moved meanwhile (a partition, an outage) is
     * unknown until the Welcome: a keep learner holds its pushes till then
     * (dl_mailbox_set_behind; the Welcome replaces this with what it says) */
    for (int i = 0; i < c->n_served; i++) dl_mailbox_set_behind(c->mb, c->served[i], UINT64_MAX, now);
    for (int p = 0; p < c->P; p++) {
        /* a fetch reply that may never come on the new session is asked for again after its Welcome */
        if (c->f[p].fetch_pending) dl_comms_downlink_want(c, p, now);
        c->f[p].fetch_pending = c->f[p].rebase_pending = 0;
    }
    c->t_warn = now;
    dl_comms_admit_hello(c);
}

void dl_comms_admit_heartbeat(dl_comms *c)
{
    Dloco__V1__Heartbeat hb;
    dloco__v1__heartbeat__init(&hb);
    dl_mailbox_progress(c->mb, c->served, c->n_served, &hb.step, &hb.tokens, &hb.steps_per_s, &hb.discarded_tokens);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    hb.received_seq = c->sync_seq;
    dl_wire_set_heartbeat(&env, &hb);
    c->t_hb = dl_clock_ns();
    if (dl_comms_send_env(c, &env, NULL, 0) == 0) COUNT(heartbeats_sent);
}

/* Returns 1 when the thread must stop (fatal error). */
int dl_comms_admit_error(dl_comms *c, const Dloco__V1__Error *e)
{
    COUNT(errors_recv);
    char text[NET_STR_CAP];
    dl_comms_net_str(e->message, text, sizeof text);
    Dloco__V1__ErrorKind k = dl_wire_error_kind(e);
    const char *kind = dl_wire_error_kind_name(k);
    if (e->fatal) {
        dl_comms_refuse(c, kind, text, e->message ? e->message : "");
        return 1;
    }
    if (k == DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER) {
        char why[NET_STR_CAP + 64];
        snprintf(why, sizeof why, "synchronizer does not know this learner (%s)", text);
        dl_comms_admit_rehello(c, why, 1);
    } else {
        DL_WARN("comms: error from synchronizer (%s): %s", kind, text);
    }
    return 0;
}

void dl_comms_admit_bye(dl_comms *c, const char *reason, uint64_t step)
{
    Dloco__V1__Bye b;
    dloco__v1__bye__init(&b);
    b.reason = (char *)reason;
    b.step = step;
    /* the final counts: the ledger closes this learner's account with them */
    dl_mailbox_progress(c->mb, c->served, c->n_served, NULL, &b.tokens, NULL, &b.discarded_tokens);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_bye(&env, &b);
    dl_comms_send_env(c, &env, NULL, 0);
    /* Give the Bye a bounded chance to leave when the socket closes. */
    int linger = c->bye_linger_ms;
    if (c->sock) DL_ZMQ_LOG(zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger));
}
