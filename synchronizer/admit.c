/* Admission: a Hello registers a learner (or refuses it), reclaiming the
 * slot of one long gone; learner records in the store; Bye; heartbeats. */
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/hash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ------------------------------------------------------------------------ */
/* learner records */

/* Counters written to the store move this sum: the tick writes a record
 * again when it changed (DL_SYNC_PUT_EVERY_NS), so `dloco status STORE`
 * shows a live run's counters, not only the ones of learners that left. */
uint64_t dl_admit_put_sig(const dl_registry_learner *l)
{
    return l->pushes + l->merged + l->dropped + l->rejected + l->tokens_applied + l->step + l->tokens;
}

/* The store record of l's counters now; l->put_* say it was written. */
void dl_admit_record(dl_registry_learner *l, dl_store_learner *r)
{
    l->put_ns = dl_clock_ns();
    snprintf(r->id, sizeof r->id, "%s", l->id);
    r->first_seen_ns = l->first_seen_wall;
    r->last_seen_ns = dl_wallclock_ns();
    r->pushes = l->pushes;
    r->merged = l->merged;
    r->dropped = l->dropped;
    r->tokens_applied = l->tokens_applied;
    r->bytes_in = l->bytes_in;
    r->bytes_out = l->bytes_out;
    r->rejected = l->rejected;
    r->step = l->step;
    r->tokens = l->tokens;
    l->put_sig = dl_admit_put_sig(l);
    l->put_dirty = 0;
}

void dl_admit_put_now(dl_sync *s, dl_registry_learner *l)
{
    dl_job *j = dl_job_new(DL_JOB_LEARNER_PUT);
    dl_admit_record(l, &j->lrec);
    submit(s, j);
}

/* A learner this process meets for the first time: its counters go on from
 * the store's record (a restarted synchronizer keeps them), or it is a new
 * id of the run. A short read snapshot on the loop, like a Fetch. (A slot
 * reclaimed in this process and taken again before the worker wrote its
 * last record reads the record before that one: counters of at most a few
 * seconds are lost, never doubled.) */
static void restore_counters(dl_sync *s, dl_registry_learner *l)
{
    dl_store_learner r;
    int rc = dl_store_learner_get(s->store, l->id, &r);
    if (rc == DL_ENOTFOUND) s->known_learners++;
    if (rc) {
        if (rc != DL_ENOTFOUND) DL_WARN("learner %s: its stored counters cannot be read: %s", l->id, dl_errmsg());
        return;
    }
    l->first_seen_wall = r.first_seen_ns;
    l->pushes = r.pushes;
    l->merged = r.merged;
    l->dropped = r.dropped;
    l->rejected = r.rejected;
    l->tokens_applied = r.tokens_applied;
    l->bytes_in = r.bytes_in;
    l->bytes_out = r.bytes_out;
}

/* At most one registry record a second per learner: a peer repeating
 * Hellos cannot fill the worker's queue (the tick and shutdown write the
 * rest). */
static void learner_put(dl_sync *s, dl_registry_learner *l)
{
    if (l->put_ns && dl_clock_ns() - l->put_ns < 1000000000LL) {
        l->put_dirty = 1;
        return;
    }
    l->put_dirty = 0;
    dl_admit_put_now(s, l);
}

/* 1 while the learner's connection is still attached on the ROUTER: a
 * header-only heartbeat to it is accepted (or would block), not
 * EHOSTUNREACH. */
static int route_connected(dl_sync *s, dl_registry_learner *l)
{
    if (!l->route_len) return 0;
    /* at most one probe per heartbeat period: Hellos repeated from another
     * connection must not flood the real learner's queue with probes */
    int64_t now = dl_clock_ns();
    if (l->probe_ns && now - l->probe_ns < (int64_t)s->cfg.heartbeat_ms * 1000000LL) return l->probe_ok;
    l->probe_ns = now;
    Dloco__V1__Envelope env;
    Dloco__V1__Heartbeat hb;
    dloco__v1__heartbeat__init(&hb);
    dl_downlink_env(s, &env, l->id);
    dl_wire_set_heartbeat(&env, &hb);
    int rc = dl_wire_send(s->router, l->route, l->route_len, &env, NULL, NULL, 0, ZMQ_DONTWAIT);
    l->probe_ok = rc == 0 || rc == DL_EAGAIN;
    return l->probe_ok;
}

/* Token bucket of Hellos from ids the registry does not hold. */
static int new_hello_allowed(dl_sync *s, int64_t now)
{
    double rate = s->cfg.max_new_hellos_per_s, burst = s->cfg.new_hello_burst;
    s->hello_tokens += (double)(now - s->hello_refill_ns) * 1e-9 * rate;
    if (s->hello_tokens > burst) s->hello_tokens = burst;
    s->hello_refill_ns = now;
    if (s->hello_tokens < 1.0) return 0;
    s->hello_tokens -= 1.0;
    return 1;
}

/* A slot of a learner that left, or died (not under the `sync` policy,
 * whose barrier waits for the dead), more than reclaim_ms ago, with nothing
 * pooled and nothing queued: forget it everywhere so the number can be
 * reused. 1 when reclaimed. */
static int try_reclaim(dl_sync *s, int slot, int64_t now)
{
    dl_registry_learner *l = dl_registry_get(s->reg, slot);
    if (!l->used) return 0;
    int m = member(s, slot);
    if (m == DL_POLICY_MEMBER_LIVE) return 0;
    if (m == DL_POLICY_MEMBER_DEAD && s->cfg.policy.kind == DL_POLICY_SYNC) return 0;
    if (!l->left_ns || now - l->left_ns < (int64_t)s->cfg.reclaim_ms * 1000000LL) return 0;
    if (dl_wire_queue_bytes(l->outq) > 0) return 0;
    for (size_t i = 0; i < dl_pool_handles(s->pool); i++) {
        const dl_pool_push *q = dl_pool_get(s->pool, i);
        if (q->used && q->learner == (uint32_t)slot) return 0;
    }
    if (dl_policy_learner_forget(s->policy, (uint32_t)slot)) return 0;
    dl_admit_put_now(s, l); /* its counters stay in the store */
    dl_ledger_forget(s->ledger, slot);
    dl_guard_forget(s->guard, slot);
    s->reclaimed_ids[s->n_reclaimed_ids++ % DL_SYNC_RECLAIMED_IDS] = dl_hash64(l->id, strlen(l->id), 0);
    dl_event("learner_reclaimed", "id=%s slot=%d away_ms=%lld", l->id, slot, (long long)((now - l->left_ns) / 1000000));
    DL_INFO("learner %s: slot %d reclaimed after %.1f s away", l->id, slot, (double)(now - l->left_ns) * 1e-9);
    dl_uplink_drop(s, slot, "reclaimed");
    dl_downlink_reset(s, slot);
    dl_downlink_resume_clear(s, slot);
    dl_registry_remove(s->reg, slot);
    s->reclaimed++;
    return 1;
}

void dl_admit_mark_left(dl_sync *s, dl_registry_learner *l, int slot, int64_t now, dl_policy_leave why)
{
    dl_policy_learner_leave(s->policy, (uint32_t)slot, now, why);
    l->left_ns = now;
    dl_uplink_drop(s, slot, why == DL_POLICY_LEAVE_BYE ? "bye" : "dead");
}

/* A Hello where the learner or the run (or both) is described by a manifest
 * (docs/PROTOCOL.md "Manifests"). 0 when it may join: *tps its tokens-per-step
 * bound (0: a GPT-2 learner's batch x seq_len), *checked when the
 * fingerprint and P were checked here. Else the refusal's code (the caller
 * sends it as a fatal Error) with dl_errmsg() saying what differs. */
static int manifest_hello(dl_sync *s, const Dloco__V1__Hello *h, uint64_t *tps, int *checked)
{
    const dl_model_config *m = &s->cfg.model;
    const dl_manifest *run = s->cfg.manifest;
    if (!h->n_manifest)
        return dl_err(DL_EMISMATCH,
                      "this learner is a GPT-2 learner (L=%u NH=%u C=%u T=%u V=%u), but this run's model is described "
                      "by a manifest (%d tensors, not a GPT-2 config): join it with a learner of that model",
                      h->n_layer, h->n_head, h->n_embd, h->seq_len, h->vocab, dl_manifest_ntensors(run));
    dl_manifest *lm = NULL;
    int rc = dl_wire_hello_manifest(h, &lm);
    if (rc) return dl_err(rc == DL_ENOMEM ? DL_ENOMEM : DL_EMISMATCH, "the learner's manifest: %s", dl_errmsg());
    if (!run) {
        /* a GPT-2 run: only a manifest of this very GPT-2 model may join
         * (then with the GPT-2 fingerprint, checked by the caller) */
        dl_model_config g;
        int same = dl_manifest_gpt(lm, &g) && g.n_layer == m->n_layer && g.n_head == m->n_head &&
                   g.n_embd == m->n_embd && g.seq_len == m->seq_len && g.vocab == m->vocab;
        int n = dl_manifest_ntensors(lm);
        dl_manifest_close(&lm);
        if (!same)
            return dl_err(DL_EMISMATCH,
                          "this learner's model is described by a manifest (%d tensors, not this run's GPT-2 config), "
                          "but this is a GPT-2 run (L=%d NH=%d C=%d T=%d V=%d): start a synchronizer for that model "
                          "(dloco-sync --manifest FILE --init_from FILE.safetensors)",
                          n, m->n_layer, m->n_head, m->n_embd, m->seq_len, m->vocab);
        return 0;
    }
    char msg[512];
    int nd = dl_manifest_diff(run, lm, "the learner's manifest", msg, sizeof msg);
    dl_manifest_close(&lm);
    if (nd)
        return dl_err(DL_EMISMATCH, "the learner's model is not this run's (%d tensor%s; 'here' is the run's): %s",
                      nd, nd == 1 ? " differs" : "s differ", msg);
    if (h->num_fragments != (uint32_t)s->cfg.P || h->fingerprint != s->fingerprint)
        return dl_err(DL_EMISMATCH,
                      "the learner's manifest is this run's, but its plan is not: P=%u fingerprint %016llx, the run's "
                      "P=%d fingerprint %016llx",
                      h->num_fragments, (unsigned long long)h->fingerprint, s->cfg.P,
                      (unsigned long long)s->fingerprint);
    *checked = 1;
    char why[256];
    if (dl_guard_tokens_bound(s->guard, h->max_tokens_per_step, tps, why, sizeof why))
        return dl_err(DL_EINVAL, "%s", why);
    return 0;
}

void dl_admit_hello(dl_sync *s, dl_wire_msg *msg, const Dloco__V1__Envelope *env, const Dloco__V1__Hello *h)
{
    const uint8_t *route = msg->id;
    size_t rlen = msg->id_len;
    const char *id = env->learner_id;
    if (strcmp(env->run_id, s->cfg.run_id)) {
        dl_downlink_error(s, route, rlen, id, DL_EMISMATCH, 1, "run id '%s' is not this synchronizer's run '%s'",
                          env->run_id, s->cfg.run_id);
        return;
    }
    const dl_model_config *m = &s->cfg.model;
    uint64_t tps = 0;
    int checked = 0;
    if (h->n_manifest || s->cfg.manifest) {
        int rc = manifest_hello(s, h, &tps, &checked);
        if (rc) {
            dl_downlink_error(s, route, rlen, id, rc, 1, "%s", dl_errmsg());
            return;
        }
    }
    if (!checked && (h->fingerprint != s->fingerprint || h->num_fragments != (uint32_t)s->cfg.P)) {
        dl_downlink_error(s, route, rlen, id, DL_EMISMATCH, 1,
                          "model fingerprint %016llx (L=%u NH=%u C=%u T=%u V=%u P=%u) does not match the run's %016llx "
                          "(L=%d NH=%d C=%d T=%d V=%d P=%d)",
                          (unsigned long long)h->fingerprint, h->n_layer, h->n_head, h->n_embd, h->seq_len, h->vocab,
                          h->num_fragments, (unsigned long long)s->fingerprint, m->n_layer, m->n_head, m->n_embd,
                          m->seq_len, m->vocab, s->cfg.P);
        return;
    }
    char why[256];
    if (dl_guard_batch(s->guard, h->batch, why, sizeof why)) {
        dl_downlink_error(s, route, rlen, id, DL_EINVAL, 1, "%s", why);
        return;
    }
    if (!h->max_chunk_bytes && s->max_frag_bytes + DL_WIRE_MAX_HEADER_BYTES > s->cfg.max_msg_bytes) {
        /* its whole pushes would exceed the message cap: libzmq would drop
         * its connection on each one, silently */
        dl_downlink_error(s, route, rlen, id, DL_EMISMATCH, 1,
                          "this learner sends whole fragments (no Hello.max_chunk_bytes) of up to %llu bytes, but this "
                          "synchronizer takes messages of at most %llu bytes: use a learner that chunks its pushes",
                          (unsigned long long)s->max_frag_bytes, (unsigned long long)s->cfg.max_msg_bytes);
        return;
    }
    if (h->carried_tokens) {
        /* progress a restarted learner carries from before: no more than its
         * owned fragments can have trained by its step */
        uint64_t per_step = tps ? tps : (uint64_t)(h->batch ? h->batch : s->cfg.guard.max_batch) * (uint64_t)m->seq_len;
        uint64_t owned = (uint64_t)dl_shard_count(s->cfg.P, s->cfg.shard, s->cfg.shards);
        long double bound = (long double)owned * (long double)h->step * (long double)per_step;
        if ((long double)h->carried_tokens > bound || !h->n_held_versions) {
            dl_downlink_error(s, route, rlen, id, DL_ERANGE, 1,
                              "carried_tokens %llu: %s",
                              (unsigned long long)h->carried_tokens,
                              !h->n_held_versions ? "a learner that holds no fragments carries no progress"
                                                  : "more than this learner's fragments can have trained by its step "
                                                    "(fragments x step x tokens per step): its saved state is not "
                                                    "its own; delete it");
            s->refused_msgs++;
            return;
        }
    }
    int64_t now = dl_clock_ns();
    int slot = dl_registry_find(s->reg, id);
    if (slot >= 0 && registered(s, slot) && !dl_registry_route_is(s->reg, slot, route, rlen) && h->instance) {
        /* a second live process with a registered id: refused for good
         * (below: the same process on a new connection, or a holder gone) */
        dl_registry_learner *l = dl_registry_get(s->reg, slot);
        int64_t live_ns = (int64_t)s->cfg.heartbeat_ms * s->cfg.liveness * 1000000LL;
        int other = l->instance && h->instance != l->instance;
        int64_t quiet_ms = (now - l->last_seen_ns) / 1000000;
        if (other && l->route_len && now - l->last_seen_ns <= live_ns && route_connected(s, l)) {
            dl_downlink_error(s, route, rlen, id, DL_EPROTO, 1,
                              "duplicate_id: learner id '%s' is held by another live learner process (heard from "
                              "%lld ms ago on another connection): give this one another --id",
                              id, (long long)quiet_ms);
            dl_event("learner_duplicate", "id=%s action=duplicate_id", id);
            DL_WARN("learner %s: a Hello from a second process with this id refused (duplicate_id)", id);
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_DUPLICATE]++;
            return;
        }
    }
    if (slot >= 0 && !dl_registry_route_is(s->reg, slot, route, rlen) &&
        dl_wire_queue_bytes(dl_registry_get(s->reg, slot)->outq) > 0) {
        /* what libzmq holds for the id's previous connection is bounded per
         * learner only if a new connection waits until it is gone */
        dl_downlink_error(s, route, rlen, id, DL_EAGAIN, 0,
                          "learner '%s' has %llu bytes still queued on its previous connection: retry when it "
                          "is closed",
                          id, (unsigned long long)dl_wire_queue_bytes(dl_registry_get(s->reg, slot)->outq));
        dl_event("learner_duplicate", "id=%s action=busy_previous", id);
        s->refused_msgs++;
        s->met.msg_refused[DL_SM_MSG_DUPLICATE]++;
        return;
    }
    if (slot >= 0 && registered(s, slot) && !dl_registry_route_is(s->reg, slot, route, rlen)) {
        /* the id is registered on another connection. Hello.instance tells
         * the same process on a new connection (it takes over at once) from
         * another process: refused for good while the holder is attached and
         * heard from within liveness, else it takes over (docs/PROTOCOL.md
         * "Duplicate ids") */
        dl_registry_learner *l = dl_registry_get(s->reg, slot);
        int same = h->instance && h->instance == l->instance;
        int other = h->instance && l->instance && h->instance != l->instance;
        int64_t quiet_ms = (now - l->last_seen_ns) / 1000000;
        if (same) {
            dl_event("learner_duplicate", "id=%s action=reconnected", id);
        } else if (other && l->route_len && route_connected(s, l)) {
            /* attached but silent past liveness (above): the new process
             * takes the id; the old one, should it wake up, is told */
            dl_downlink_error(s, l->route, l->route_len, id, DL_EPROTO, 1,
                              "duplicate_id: learner id '%s' was taken over by another learner process after "
                              "%lld ms of silence: this one is closed", id, (long long)quiet_ms);
            dl_event("learner_duplicate", "id=%s action=took_over_silent silent_ms=%lld", id, (long long)quiet_ms);
            DL_WARN("learner %s: another process took the id over after %.1f s of silence", id, (double)quiet_ms * 1e-3);
        } else if (other) {
            dl_event("learner_duplicate", "id=%s action=took_over_gone", id);
        } else if (l->route_len && route_connected(s, l)) {
            /* an older learner (no instance): the id alone decides */
            if (!s->auth) {
                dl_downlink_error(s, route, rlen, id, DL_EPROTO, 0,
                                  "learner id '%s' is live on another connection: refused (retry when it is gone)", id);
                dl_event("learner_duplicate", "id=%s action=refused", id);
                s->refused_msgs++;
                s->met.msg_refused[DL_SM_MSG_DUPLICATE]++;
                return;
            }
            /* with CURVE the key proves the identity: the newer connection
             * wins, the old one is told and cut off */
            dl_downlink_error(s, l->route, l->route_len, id, DL_EPROTO, 1,
                              "learner id '%s' connected again from another connection: this one is closed", id);
            dl_event("learner_duplicate", "id=%s action=replaced", id);
            DL_WARN("learner %s: a new connection with its key replaces the old one", id);
        } else if (l->route_len) {
            dl_event("learner_duplicate", "id=%s action=took_over_gone", id);
        }
    }
    if (slot < 0) {
        if (!new_hello_allowed(s, now)) {
            dl_downlink_error(s, route, rlen, id, DL_EAGAIN, 0, "too many new learners joining: retry in a second");
            dl_event("hello_limited", "id=%s", id);
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_LIMITS]++;
            return;
        }
        slot = dl_registry_add(s->reg, id, dl_wallclock_ns());
        if (slot < 0) {
            /* a slot of one long gone may be free now */
            for (int i = 0; i < dl_registry_count(s->reg) && slot < 0; i++)
                if (try_reclaim(s, i, now)) slot = dl_registry_add(s->reg, id, dl_wallclock_ns());
        }
        if (slot < 0) {
            dl_downlink_error(s, route, rlen, id, DL_ERANGE, 0, "%s; retry later", dl_errmsg());
            dl_event("hello_full", "id=%s max=%d", id, dl_registry_max(s->reg));
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_LIMITS]++;
            return;
        }
    }
    dl_registry_learner *l = dl_registry_get(s->reg, slot);
    if (!dl_registry_route_is(s->reg, slot, route, rlen)) {
        /* a new connection: nothing in flight on the old one arrives any more */
        dl_uplink_drop(s, slot, "new_connection");
        dl_downlink_reset(s, slot);
        dl_downlink_resume_clear(s, slot);
        dl_registry_set_route(s->reg, slot, route, rlen, msg->user_id);
    }
    int was = member(s, slot) == DL_POLICY_MEMBER_LIVE;
    int rc = dl_policy_learner_join(s->policy, (uint32_t)slot, now);
    if (rc) {
        dl_downlink_error(s, route, rlen, id, rc, 0, "cannot register: %s", dl_errmsg());
        return;
    }
    /* away longer than rebase_ms: its fragments are too old to push onto;
     * back after its slot was reclaimed: what was merged from it is forgotten */
    int away_long = l->hellos > 0 && now - l->last_seen_ns > (int64_t)s->cfg.rebase_ms * 1000000LL;
    if (l->hellos == 0) {
        restore_counters(s, l);
        uint64_t hid = dl_hash64(id, strlen(id), 0);
        int n = s->n_reclaimed_ids < DL_SYNC_RECLAIMED_IDS ? s->n_reclaimed_ids : DL_SYNC_RECLAIMED_IDS;
        for (int i = 0; i < n && !away_long; i++) away_long = s->reclaimed_ids[i] == hid;
    }
    /* another process of the id (a restart): the ledger ends the old one's account */
    int newproc = h->instance && l->instance && h->instance != l->instance;
    l->last_seen_ns = now;
    l->hello_ns = now;
    l->left_ns = 0;
    l->hellos++;
    l->batch = h->batch;
    l->tps = tps;
    l->instance = h->instance;
    l->max_chunk = h->max_chunk_bytes & ~3u;
    /* whatever it holds, its first Update of each fragment from now is full */
    dl_registry_given_clear(s->reg, slot, -1);
    if (s->outx[slot].delta) dl_downlink_reset(s, slot);
    /* the fragment-tokens one step adds at most: a restarted learner's carried progress the old process never
     * reported is bounded by its steps since its last report (ledger.h) */
    uint64_t step_tokens = (uint64_t)dl_shard_count(s->cfg.P, s->cfg.shard, s->cfg.shards) *
                           (tps ? tps : (uint64_t)(h->batch ? h->batch : s->cfg.guard.max_batch) *
                                            (uint64_t)s->cfg.model.seq_len);
    dl_ledger_hello(s->ledger, slot, h->step, newproc, h->carried_tokens, step_tokens);
    /* must_fetch only when what it holds is of no use: nothing, a version
     * newer than the global one (another store's timeline), or an absence
     * past rebase_ms / a reclaimed slot (its replay record is gone). Held
     * versions older than the global one by any distance are kept: the
     * Welcome's fragment_versions tell it which fragments are newer here and
     * it fetches those alone, adopting them in its own mode. A learner
     * declared dead on a thin link (its Acks and Updates late behind a
     * backlog) used to lag past max_staleness by the time its Hello came and
     * refetched every fragment at each of its rejoins. */
    int must_fetch = h->n_held_versions == 0 || away_long;
    uint64_t *vers = dl_xcalloc((size_t)s->cfg.P, sizeof(uint64_t));
    for (int p = 0; p < s->cfg.P; p++) {
        vers[p] = dl_policy_version(s->policy, p); /* 0 for another shard's: never served here */
        if (h->n_held_versions && owns(s, p) && h->held_versions[p] > vers[p]) must_fetch = 1;
    }
    /* rejoin without refetch: on this incarnation's timeline what it holds is
     * what its mirror holds (docs/PROTOCOL.md "Updates"), so a fragment it
     * lacks versions of is owed from there -- the chain of kept deltas when
     * that is smaller than the fragment, else the fp32 values -- and the
     * learner does not fetch it (learner/comms_admit.c dl_comms_admit_welcome); a mirror that
     * is not there after all misses the delta and fetches */
    if (!must_fetch && s->cfg.update.c.id && env->epoch == s->epoch)
        for (int p = 0; p < s->cfg.P; p++)
            if (owns(s, p)) {
                dl_registry_given_set(s->reg, slot, p, h->held_versions[p]);
                if (h->held_versions[p] < vers[p]) dl_downlink_owe(s, l, p);
            }
    /* the held versions: progress on them can be as old as the longest
     * absence that keeps fragments (rebase_ms) */
    for (int p = 0; !must_fetch && p < s->cfg.P; p++)
        if (owns(s, p))
            dl_registry_base_add(s->reg, slot, p, h->held_versions[p], now - (int64_t)s->cfg.rebase_ms * 1000000LL);
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
    w.chunk_bytes = (uint32_t)s->cfg.chunk_bytes;
    l->push_chunk = w.chunk_bytes; /* until its uplink is measured again (a new connection may be another link) */
    w.shard = s->cfg.shards > 1 ? (uint32_t)s->cfg.shard : 0;
    w.shards = s->cfg.shards > 1 ? (uint32_t)s->cfg.shards : 0;
    w.update_codec = (uint32_t)s->cfg.update.c.id; /* 0: full Updates only */
    /* what this process's pushes were answered (downlink.c "answers again"): a fetch forgets them anyway */
    uint64_t *ansb = dl_xcalloc((size_t)s->cfg.P, sizeof(uint64_t));
    int again = !must_fetch && dl_downlink_answered(s, slot, h->instance, ansb);
    if (again) {
        w.n_answered_bases = (size_t)s->cfg.P;
        w.answered_bases = ansb;
    }
    dl_downlink_env(s, &out, l->id);
    dl_wire_set_welcome(&out, &w);
    dl_downlink_send(s, l, &out, NULL, 0);
    if (again) dl_downlink_answers_again(s, l);
    free(ansb);
    free(vers);
    char dev[160];
    DL_INFO("learner %s %s (device %s, step %llu, %s)", id, was ? "said hello again" : "joined",
            dl_event_str(h->device[0] ? h->device : "?", dev, sizeof dev), (unsigned long long)h->step,
            must_fetch ? "will fetch the global model" : "keeps its fragments");
    dl_event("learner_join", "id=%s device=%s again=%d must_fetch=%d step=%llu batch=%u auth=%d", id,
             dl_event_str(h->device, dev, sizeof dev), was, must_fetch, (unsigned long long)h->step, h->batch,
             s->auth ? 1 : 0);
    learner_put(s, l);
    dl_commit_schedule(s);
}

/* ------------------------------------------------------------------------ */
/* liveness */

/* A learner's latest sign of life, monotonic ns: its last message, or the
 * last time libzmq handed bytes queued for it (Update chunks) to the kernel.
 * On a thin link its heartbeats and Acks wait behind Update chunks for
 * seconds, but chunks leaving means its TCP window moves: it reads. Bytes
 * drained without the peer reading are bounded by the kernel's buffers (our
 * send buffer plus its receive buffer, a few MiB; receive autotuning grows
 * only as it reads): a stopped learner's drain stops after buffers / link
 * rate (~10 s at 3 Mbit/s, milliseconds on a LAN), and from then its
 * silence counts. A connection that closes frees what it held once (one
 * last drain): a killed learner is declared dead one liveness later. */
int64_t dl_admit_last_sign(const dl_registry_learner *l)
{
    int64_t drained = dl_wire_queue_drained_ns(l->outq);
    return drained > l->last_seen_ns ? drained : l->last_seen_ns;
}

/* Chunks of a learner's own pushes its heartbeats may wait behind: the two
 * of its push window (learner/comms_uplink.c) and about one more in its kernel's
 * send buffer. */
#define DL_ADMIT_UPLINK_CHUNKS 3
/* The uplink rate assumed until one is measured, bytes/s (1 Mbit/s). */
#define DL_ADMIT_UPLINK_FLOOR_BPS (128u << 10)

/* How long learner `slot` may be silent before it is dead, ns: liveness x
 * heartbeat_ms plus the time its heartbeat may wait behind its own push
 * chunks (a 1 MiB chunk takes 2.8 s at 3 Mbit/s: a busy thin learner
 * looked dead, at once with 200 ms x 6) at its uplink's measured rate, or
 * at 1 Mbit/s until one is measured (on a LAN a chunked push measures it
 * at once, and the addition vanishes); while one of its chunked pushes
 * arrives, at least as long as that push may stall (dl_uplink_stall_ns):
 * its chunks arriving are its bytes moving. At most slow_reader_ms past
 * liveness. */
int64_t dl_admit_dead_after(const dl_sync *s, int slot, const dl_registry_learner *l)
{
    int64_t d = (int64_t)s->cfg.liveness * s->cfg.heartbeat_ms * 1000000LL;
    int64_t cap = d + (int64_t)s->cfg.slow_reader_ms * 1000000LL;
    /* a push travels in chunks of the size it was told last, or whole when its fragment is smaller */
    uint64_t told = l->push_chunk ? l->push_chunk : s->cfg.chunk_bytes;
    uint64_t chunk = told < s->max_frag_bytes ? told : s->max_frag_bytes;
    double rate = l->up_bytes_s > 0 ? l->up_bytes_s : DL_ADMIT_UPLINK_FLOOR_BPS;
    double w = DL_ADMIT_UPLINK_CHUNKS * (double)chunk / rate * 1e9;
    d += w < (double)cap ? (int64_t)w : cap;
    if (s->inb[slot].active) {
        int64_t st = dl_uplink_stall_ns(s, slot);
        if (st > d) d = st;
    }
    return d < cap ? d : cap;
}

/* The loop did not run for stall_ns beyond its tick period (SIGSTOP, swap,
 * a long callback): nothing was read meanwhile, so a learner's silence did
 * not grow then. Its clocks move on by the stall (not past now), and the
 * messages waiting in the socket are read before anyone is judged again. */
void dl_admit_loop_stalled(dl_sync *s, int64_t stall_ns, int64_t now)
{
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (!l->used) continue;
        l->last_seen_ns = l->last_seen_ns + stall_ns < now ? l->last_seen_ns + stall_ns : now;
        if (l->outq_busy_ns) l->outq_busy_ns = l->outq_busy_ns + stall_ns < now ? l->outq_busy_ns + stall_ns : now;
        if (s->inb[i].active)
            s->inb[i].progress_ns = s->inb[i].progress_ns + stall_ns < now ? s->inb[i].progress_ns + stall_ns : now;
    }
}

void dl_admit_bye(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Bye *b, int64_t now)
{
    dl_admit_mark_left(s, l, slot, now, DL_POLICY_LEAVE_BYE);
    l->step = b->step > l->step ? b->step : l->step;
    l->tokens = b->tokens > l->tokens ? b->tokens : l->tokens; /* a Bye from before Bye.tokens reports 0 */
    dl_ledger_bye(s->ledger, slot, l->step, l->tokens, b->discarded_tokens);
    char rb[300];
    DL_INFO("learner %s said bye at step %llu (%s)", l->id, (unsigned long long)b->step,
            dl_event_str(b->reason[0] ? b->reason : "no reason", rb, sizeof rb));
    dl_event("learner_bye", "id=%s reason=%s step=%llu", l->id, dl_event_str(b->reason, rb, sizeof rb),
             (unsigned long long)b->step);
    dl_admit_put_now(s, l);
    dl_commit_schedule(s);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* s->fleet_sps = the median step rate of the live learners that reported a
 * finite one in (0, DL_WIRE_FLEET_SPS_MAX] (the mean of the two middle ones
 * for an even count); 0 when none has, or when the buffer cannot grow (then
 * Acks say "unknown" and dynamic-H learners keep their H). */
static void update_fleet_rate(dl_sync *s)
{
    int n = dl_registry_count(s->reg), k = 0;
    if (n > s->rate_cap) {
        double *b = realloc(s->rate_buf, (size_t)n * sizeof *b);
        if (!b) {
            s->fleet_sps = 0;
            return;
        }
        s->rate_buf = b;
        s->rate_cap = n;
    }
    for (int i = 0; i < n; i++) {
        const dl_registry_learner *l = dl_registry_cget(s->reg, i);
        double r = l->steps_per_s;
        if (l->used && member(s, i) == DL_POLICY_MEMBER_LIVE && isfinite(r) && r > 0 && r <= DL_WIRE_FLEET_SPS_MAX)
            s->rate_buf[k++] = r;
    }
    if (!k) {
        s->fleet_sps = 0;
        return;
    }
    qsort(s->rate_buf, (size_t)k, sizeof *s->rate_buf, cmp_double);
    s->fleet_sps = k % 2 ? s->rate_buf[k / 2] : 0.5 * (s->rate_buf[k / 2 - 1] + s->rate_buf[k / 2]);
}

/* Heartbeat counters: a learner cannot have stepped faster than
 * max_step_rate since its Hello; a claim beyond is ignored (not stored). */
void dl_admit_heartbeat(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Heartbeat *hb, int64_t now)
{
    dl_downlink_received(s, slot, l, hb->received_seq); /* the path's bound (downlink.c) */
    double since = (double)(now - l->hello_ns) * 1e-9 + (double)s->cfg.rebase_ms * 1e-3;
    uint64_t cap = l->step + (uint64_t)ceil(since * s->cfg.guard.max_step_rate) + s->cfg.guard.step_slack;
    uint64_t batch = l->batch ? l->batch : s->cfg.guard.max_batch;
    uint64_t per_step = l->tps ? l->tps : batch * (uint64_t)s->cfg.model.seq_len;
    unsigned __int128 tok_cap = (unsigned __int128)(hb->step + 1) * per_step;
    if ((hb->step > cap && hb->step > l->step) || (unsigned __int128)hb->tokens > tok_cap) {
        dl_event("heartbeat_ignored", "id=%s step=%llu tokens=%llu plausible=%llu", l->id,
                 (unsigned long long)hb->step, (unsigned long long)hb->tokens, (unsigned long long)cap);
        return;
    }
    l->step = hb->step;
    l->tokens = hb->tokens;
    l->steps_per_s = hb->steps_per_s;
    dl_ledger_progress(s->ledger, slot, l->step, l->tokens, hb->discarded_tokens);
    /* the schedule prediction and the share's tokens per step (policy.h) */
    dl_policy_learner_progress(s->policy, (uint32_t)slot, l->step, l->tokens, l->steps_per_s, now);
    /* the fleet's rate and the rounds' deadlines follow once per run of heartbeats (dl_admit_heartbeats_settle) */
    s->hb_pending = 1;
}

void dl_admit_heartbeats_settle(dl_sync *s)
{
    if (!s->hb_pending) return;
    s->hb_pending = 0;
    update_fleet_rate(s);
    dl_commit_schedule(s);
}
