/* The uplink: a push arriving, whole or in chunks, through reassembly,
 * decode, the guards and the pool, up to the merge policy's verdict. */
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Ack.retry_after_ms of a push refused because the pool is full. */
#define DL_SYNC_BUSY_RETRY_MS 1000u
/* Chunked pushes arriving from learners without a merged push yet may hold
 * at most this fraction of the pool (but at least one fragment): ids that
 * start pushes and never finish them cannot take the room of learners that
 * have proven they push. */
#define DL_SYNC_UNPROVEN_POOL_DIV 4
/* A stalled chunked push is dropped after STALL_GAPS x its link's chunk
 * interval (this transfer's so far, else its learner's last complete one),
 * at least STALL_MIN_MS; before any interval is known, after the time a
 * chunk takes at STALL_FLOOR_BPS; never later than slow_reader_ms. */
#define DL_SYNC_STALL_GAPS 8
#define DL_SYNC_STALL_MIN_MS 2000
#define DL_SYNC_STALL_FLOOR_BPS (128u << 10)
/* A learner's push chunks are sized so its measured uplink carries one in
 * about this long: a heartbeat or Ack waits behind at most its push window
 * (two chunks, learner/comms_uplink.c) of them. */
#define DL_SYNC_PUSH_CHUNK_MS 50
/* ... and grow only after a push of at least this many chunks: the rate of
 * a shorter one rests on one or two intervals, and chunks that waited
 * together (in our socket while the loop was busy, or in a relay) look like
 * a fast link (the chaos scenario wan.ini's 3 Mbit/s learner measured 1e9
 * elements/s once over its two-chunk pushes). */
#define DL_SYNC_PUSH_CHUNK_GROW_MIN 4

static void push_event(const dl_registry_learner *l, const Dloco__V1__Push *ph, const char *decision,
                       const char *reason)
{
    char rb[300];
    dl_event("push", "id=%s frag=%u base=%llu steps=%llu tokens=%llu compute_s=%.6f decision=%s reason=%s", l->id,
             ph->fragment, (unsigned long long)ph->base_version, (unsigned long long)ph->steps,
             (unsigned long long)ph->tokens, ph->compute_s, decision, dl_event_str(reason, rb, sizeof rb));
}

/* Refused on arrival: the learner keeps the progress, its next push of the
 * fragment carries it on (or, with rebase, it fetches the global fragment).
 * `tokens` is what the ledger may believe of the push (at most what the
 * counter check found plausible). */
static void refuse_push(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, uint64_t tokens,
                        int rebase, dl_sm_reject kind, const char *why)
{
    int p = (int)ph->fragment;
    l->rejected++;
    s->rejected++;
    s->met.push_rejected[kind]++;
    s->met.tokens_received += tokens;
    dl_ledger_arrived(s->ledger, slot, p, ph->base_version, tokens);
    /* with rebase the learner throws the progress away (REJECTED); without,
     * the push comes back to it and its next push carries it (CARRIED) */
    if (rebase) dl_ledger_refused_rebase(s->ledger, slot, p, tokens);
    else dl_ledger_refused(s->ledger, slot, p, ph->base_version, tokens);
    dl_downlink_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, rebase);
    if (rebase) dl_downlink_serve_fragments(s, l, (const uint32_t[]){(uint32_t)p}, 1);
    push_event(l, ph, "rejected", why);
    char rb[300];
    DL_INFO("learner %s: push of fragment %d rejected (%s)", l->id, p, dl_event_str(why, rb, sizeof rb));
}

/* refuse_push for a push whose payload was already taken from the pool
 * (`delta`, fragment-sized): the room goes back first. */
static void refuse_taken(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, float *delta,
                         uint64_t tokens, int rebase, dl_sm_reject kind, const char *why)
{
    dl_pool_free(s->pool, (int)ph->fragment, delta);
    refuse_push(s, slot, l, ph, tokens, rebase, kind, why);
}

/* Refused for want of room (the pool is full): nothing of it counted, its
 * progress stays with the learner (CARRIED), which pushes again later. */
static void refuse_busy(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, const char *why,
                        uint32_t retry_ms)
{
    int p = (int)ph->fragment;
    s->busy_refused++;
    s->met.push_rejected[DL_SM_REJ_BUSY]++;
    l->rejected++; /* the learner counts the REJECTED ack (and busy) */
    dl_ledger_arrived(s->ledger, slot, p, ph->base_version, ph->tokens);
    dl_ledger_refused(s->ledger, slot, p, ph->base_version, ph->tokens);
    push_event(l, ph, "busy", why);
    dl_downlink_ack_busy(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, 0, retry_ms);
}

/* Exactly once per (learner, fragment, base): 1, with the reason in why,
 * when this learner has a push of the fragment in the pool (waiting or being
 * merged) that this one only copies: from a newer base, or from the same base
 * with at least as many steps, or from the same base while that one is being
 * merged (it can no longer be replaced). A push from the same base with more
 * steps replaces a waiting one (the policy's rule: its counters are
 * cumulative since the base). After the commit the replay guard refuses it. */
static int duplicate(const dl_sync *s, int slot, const Dloco__V1__Push *ph, char *why, size_t cap)
{
    for (size_t i = 0; i < dl_pool_handles(s->pool); i++) {
        const dl_pool_push *q = dl_pool_get(s->pool, i);
        if (!q->used || q->learner != (uint32_t)slot || q->fragment != (int)ph->fragment) continue;
        if (q->base_version < ph->base_version) continue;
        if (q->base_version == ph->base_version && !q->merging && ph->steps > q->steps) continue;
        snprintf(why, cap,
                 "duplicate: this learner's push of fragment %u from base version %llu (%llu steps) is already %s; "
                 "counted once",
                 ph->fragment, (unsigned long long)q->base_version, (unsigned long long)q->steps,
                 q->merging ? "being merged" : "pooled");
        return 1;
    }
    return 0;
}

/* Refused as a copy of a push already pooled: counted once, as that one;
 * answered like a full pool (busy, no rebase), so a learner that re-sent
 * after a lost answer keeps whatever progress it holds. */
static void refuse_duplicate(dl_sync *s, dl_registry_learner *l, const Dloco__V1__Push *ph, const char *why)
{
    int p = (int)ph->fragment;
    s->rejected++;
    s->met.push_rejected[DL_SM_REJ_REPLAY]++;
    l->rejected++;
    push_event(l, ph, "duplicate", why);
    dl_downlink_ack_busy(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, 0,
                         DL_SYNC_BUSY_RETRY_MS);
}

/* 1 under a barrier policy (sync, sync-elastic) when fragment p's open
 * round holds pushes of other learners and none of this one: the round
 * cannot close without it, so a full pool must not refuse it. (Decoupled
 * rounds close at their grace deadline whatever comes: no exception.) */
static int round_waits_for(const dl_sync *s, int slot, int p)
{
    if (s->cfg.policy.kind == DL_POLICY_DECOUPLED) return 0;
    int others = 0;
    for (size_t i = 0; i < dl_pool_handles(s->pool); i++) {
        const dl_pool_push *q = dl_pool_get(s->pool, i);
        if (!q->used || q->fragment != p) continue;
        if (q->learner == (uint32_t)slot) return 0;
        others = 1;
    }
    return others;
}

/* Bytes counted for the chunked pushes arriving from learners without a
 * merged push. */
static uint64_t unproven_arriving(const dl_sync *s)
{
    uint64_t sum = 0;
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        const dl_registry_learner *q = dl_registry_get(s->reg, i);
        if (q->used && !q->merged && s->inb[i].active) sum += s->inb[i].counted;
    }
    return sum;
}

uint64_t dl_uplink_pool_bound(const dl_sync *s)
{
    if (!s->pool_auto) return s->cfg.pool_bytes;
    uint64_t live = (uint64_t)dl_policy_live_count(s->policy), fleet = live * s->owned_bytes;
    if (s->pool_cap && fleet > s->pool_cap) fleet = s->pool_cap;
    return fleet > s->cfg.pool_bytes ? fleet : s->cfg.pool_bytes;
}

/* 1 when `need` more bytes of a push of fragment p by learner `slot` fit in
 * the pool (a chunked push of a learner without a merged push: also in the
 * share of such pushes), else 0 with the busy reason in why. */
static int room(const dl_sync *s, int slot, const dl_registry_learner *l, int p, uint64_t need, int chunked,
                char *why, size_t cap)
{
    uint64_t used = dl_pool_used(s->pool), bound = dl_uplink_pool_bound(s);
    if (used + need > bound && !(round_waits_for(s, slot, p) && used + need <= 2 * bound)) {
        snprintf(why, cap, "pool full (%llu of %llu bytes hold pushes waiting for their rounds): push again later",
                 (unsigned long long)used, (unsigned long long)bound);
        return 0;
    }
    /* at least one fragment: a learner alone can always bring its first push in */
    uint64_t share = bound / DL_SYNC_UNPROVEN_POOL_DIV, held = 0;
    for (int f = 0; f < s->cfg.P; f++)
        if (s->numel[f] * sizeof(float) > share) share = s->numel[f] * sizeof(float);
    if (chunked && !l->merged && (held = unproven_arriving(s)) + need > share) {
        snprintf(why, cap,
                 "pool room for learners without a merged push is full (%llu of %llu bytes arriving): push again "
                 "later",
                 (unsigned long long)held, (unsigned long long)share);
        return 0;
    }
    return 1;
}

/* The checks a push passes, in order: on its header, before any of its
 * payload is kept (push_head), 1. counters, 2. replays and copies of a
 * pooled push, 3. room in the pool; once its payload is complete
 * (push_body), 4. replays and copies again, 5. values,
 * 6. the policy's verdict. Each refusal is answered where it happens.
 *
 * Steps 1-3 (any codec: its payload is decoded into fp32 as it arrives, and
 * the pool holds fp32). 0 = go on; -1 = refused (and answered). */
static int push_head(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, int64_t now)
{
    int p = (int)ph->fragment;
    char why[320];
    /* its learner's final flush, whatever this push's fate: rounds wait for that learner only in the
     * fragments it still has a push of to send (final_pending) and in this push's own until it is in (a
     * refused one: until the learner's retry or its Bye) */
    if (ph->final) {
        dl_policy_learner_final(s->policy, (uint32_t)slot, p, ph->final_pending, ph->n_final_pending, now);
        char pl[80] = ""; /* the first fragments of the list, then "..." */
        size_t o = 0, i = 0;
        for (; i < ph->n_final_pending && o + 16 < sizeof pl; i++)
            o += (size_t)snprintf(pl + o, sizeof pl - o, "%s%u", i ? "," : "", ph->final_pending[i]);
        if (i < ph->n_final_pending) snprintf(pl + o, sizeof pl - o, ",...");
        dl_event("push_final", "id=%s frag=%u base=%llu pending=%zu list=%s", l->id, ph->fragment,
                 (unsigned long long)ph->base_version, ph->n_final_pending, pl);
    }
    /* 1. counters: nothing the push claims is believed beyond what its
     * learner can have done since it got the base version */
    int found = 0;
    int64_t since = dl_registry_base_ns(s->reg, slot, p, ph->base_version, &found);
    if (!since) since = l->hello_ns - (int64_t)s->cfg.rebase_ms * 1000000LL;
    /* ... or since its previous push of p was made (after that push's base
     * reached it): adopt keep carries the steps since then onto each newer
     * base (after an outage, many steps onto a base just sent) */
    int64_t prev = l->pushed_ns[p];
    l->pushed_ns[p] = since;
    if (prev && prev < since) since = prev;
    double elapsed = (double)(now - since) * 1e-9;
    if (elapsed < 0) elapsed = 0;
    l->push_elapsed_s = elapsed;
    uint64_t batch = l->batch ? l->batch : s->cfg.guard.max_batch;
    /* tokens per step: a manifest learner's bound, else batch x seq_len */
    uint64_t per_step = l->tps ? l->tps : batch * (uint64_t)s->cfg.model.seq_len;
    uint64_t steps_max = (uint64_t)ceil(elapsed * s->cfg.guard.max_step_rate) + s->cfg.guard.step_slack;
    uint64_t plausible = ph->tokens;
    int bad = l->tps ? dl_guard_counters_tps(s->guard, l->tps, ph->steps, ph->tokens, elapsed, why, sizeof why)
                     : dl_guard_counters(s->guard, l->batch, (uint32_t)s->cfg.model.seq_len, ph->steps, ph->tokens,
                                         elapsed, why, sizeof why);
    if (bad) {
        unsigned __int128 cap = (unsigned __int128)(ph->steps < steps_max ? ph->steps : steps_max) * per_step;
        if (cap < plausible) plausible = (uint64_t)cap;
        refuse_push(s, slot, l, ph, plausible, 1, DL_SM_REJ_COUNTERS, why);
        return -1;
    }
    /* 2. replays (a push too stale to pool is dropped below either way) */
    uint64_t cur = dl_policy_version(s->policy, p);
    int poolable = ph->base_version <= cur && cur - ph->base_version <= (uint64_t)s->cfg.policy.max_staleness;
    if (poolable && dl_guard_replay(s->guard, slot, p, ph->base_version, why, sizeof why)) {
        refuse_push(s, slot, l, ph, 0, 1, DL_SM_REJ_REPLAY, why);
        return -1;
    }
    if (duplicate(s, slot, ph, why, sizeof why)) {
        refuse_duplicate(s, l, ph, why);
        return -1;
    }
    /* 3. room in the pool: for a whole push its fragment, for a chunked one
     * its first chunk (the rest is counted as it comes, chunk_room) */
    uint64_t need = (ph->chunk_numel ? ph->chunk_numel : s->numel[p]) * sizeof(float);
    if (!room(s, slot, l, p, need, ph->chunk_numel != 0, why, sizeof why)) {
        refuse_busy(s, slot, l, ph, why, DL_SYNC_BUSY_RETRY_MS);
        return -1;
    }
    /* ... and none while commits fail: nothing would be merged, so the push waits with
     * its learner until the back-off ends (commit.c) */
    uint32_t left = dl_commit_backoff_left_ms(s, now);
    if (left) {
        snprintf(why, sizeof why,
                 "commits are failing on the synchronizer (%d in a row): backing off %u ms; push again then",
                 s->commit_fails, left);
        refuse_busy(s, slot, l, ph, why, left);
        return -1;
    }
    return 0;
}

/* Steps 4-6 of a push whose payload is complete in `delta` (fragment-sized,
 * from dl_pool_alloc: this takes it), the sums of its squares per span
 * `span_ss` gathered as it was copied in (push_decode; a clipped push
 * rescales them, a pooled one keeps them): replays again (a merge may
 * have come while it arrived), values, then the policy. */
static void push_body(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, float *delta,
                      double *span_ss, int64_t now)
{
    int p = (int)ph->fragment;
    char why[320];
    int ns = 0;
    dl_plan_fragment_spans(s->plan, p, &ns);
    double sumsq = 0.0;
    for (int k = 0; k < ns; k++) sumsq += span_ss[k];
    /* 4. replays again */
    uint64_t cur = dl_policy_version(s->policy, p);
    int poolable = ph->base_version <= cur && cur - ph->base_version <= (uint64_t)s->cfg.policy.max_staleness;
    if (poolable && dl_guard_replay(s->guard, slot, p, ph->base_version, why, sizeof why)) {
        refuse_taken(s, slot, l, ph, delta, 0, 1, DL_SM_REJ_REPLAY, why);
        return;
    }
    if (duplicate(s, slot, ph, why, sizeof why)) {
        dl_pool_free(s->pool, p, delta);
        refuse_duplicate(s, l, ph, why);
        return;
    }
    /* 5. values */
    size_t n = s->numel[p];
    double norm = sqrt(sumsq); /* finite exactly when every value is (dl_guard_sumsq) */
    if (!isfinite(norm)) {
        refuse_taken(s, slot, l, ph, delta, ph->tokens, 0, DL_SM_REJ_NONFINITE, "non-finite values in push");
        return;
    }
    double scale = 1.0;
    double elapsed = l->push_elapsed_s;
    int g = dl_guard_value(s->guard, p, norm, ph->steps, elapsed, s->param_norm[p], &scale, why, sizeof why);
    /* what the fleet pushes now, whatever this push's fate */
    dl_guard_observe(s->guard, p, slot, norm, ph->steps, elapsed);
    if (g == DL_GUARD_REJECTED) {
        refuse_taken(s, slot, l, ph, delta, ph->tokens, 1, DL_SM_REJ_NORM, why);
        return;
    }
    if (g == DL_GUARD_CLIPPED) {
        for (size_t i = 0; i < n; i++) delta[i] = (float)(delta[i] * scale);
        for (int k = 0; k < ns; k++) span_ss[k] *= scale * scale;
        s->clipped++;
        char rb[400];
        dl_event("push_clipped", "id=%s frag=%d scale=%.6g reason=%s", l->id, p, scale, dl_event_str(why, rb, sizeof rb));
    }
    /* 6. passed every check: now its numbers count, and the policy decides */
    l->last_push_tokens = ph->tokens;
    dl_ledger_arrived(s->ledger, slot, p, ph->base_version, ph->tokens);
    uint64_t h = dl_pool_add(s->pool);
    dl_policy_verdict v;
    int rc = dl_policy_push(s->policy, p, (uint32_t)slot, ph->base_version, (int64_t)ph->steps, (int64_t)ph->tokens,
                            now, h, &v);
    if (rc) DL_PANIC("merge policy: %s", dl_errmsg());
    if (v.decision == DL_POLICY_POOLED) {
        dl_pool_push *pp = dl_pool_get(s->pool, h);
        pp->used = 1;
        pp->delta = delta;
        pp->learner = (uint32_t)slot;
        pp->fragment = p;
        pp->base_version = ph->base_version;
        pp->tokens = ph->tokens;
        pp->steps = ph->steps;
        pp->compute_s = ph->compute_s;
        memcpy(pp->span_ss, span_ss, (size_t)ns * sizeof *span_ss);
        uint64_t replaced_tokens = 0;
        if (v.replaced) {
            replaced_tokens = dl_pool_get(s->pool, v.replaced_handle)->tokens;
            dl_pool_release(s->pool, v.replaced_handle);
        }
        dl_ledger_pooled(s->ledger, slot, p, ph->tokens, replaced_tokens);
        s->met.tokens_received += ph->tokens;
        dl_downlink_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0, "", 0);
        push_event(l, ph, v.replaced ? "pooled_replacing" : "pooled", g == DL_GUARD_CLIPPED ? why : "");
        dl_commit_schedule(s);
        return;
    }
    dl_pool_free(s->pool, p, delta);
    if (v.decision == DL_POLICY_DROPPED_STALE) {
        l->dropped++;
        s->dropped_stale++;
        s->met.tokens_received += ph->tokens;
        dl_ledger_dropped_stale(s->ledger, slot, p, ph->tokens);
        char reason[96];
        snprintf(reason, sizeof reason, "staleness %lld > max %lld", (long long)v.staleness,
                 (long long)s->cfg.policy.max_staleness);
        dl_downlink_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_DROPPED_STALE, 0, reason, 1);
        dl_downlink_serve_fragments(s, l, (const uint32_t[]){(uint32_t)p}, 1); /* rebase */
        dl_merge_contrib c;
        memset(&c, 0, sizeof c);
        snprintf(c.learner_id, sizeof c.learner_id, "%s", l->id);
        c.base_version = ph->base_version;
        c.staleness = (uint64_t)v.staleness;
        c.steps = ph->steps;
        c.tokens = ph->tokens;
        c.decision = DL_MERGE_DROPPED_STALE;
        snprintf(c.reason, sizeof c.reason, "%.*s", (int)sizeof c.reason - 1, reason);
        dl_commit_aside(s, p, &c);
        push_event(l, ph, "dropped_stale", reason);
        DL_INFO("learner %s: push of fragment %d dropped (%s), told to rebase", l->id, p, reason);
    } else {
        /* the policy's own refusal (a base newer than global, ...): undo the
         * arrival's settlement by refusing through the ledger as well */
        l->rejected++;
        s->rejected++;
        s->met.push_rejected[DL_SM_REJ_POLICY]++;
        s->met.tokens_received += ph->tokens;
        dl_ledger_refused(s->ledger, slot, p, ph->base_version, ph->tokens);
        const char *r = dl_policy_reason_name(v.reason);
        dl_downlink_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, r, 0);
        push_event(l, ph, "rejected", r);
        DL_INFO("learner %s: push of fragment %d rejected (%s)", l->id, p, r);
    }
}

/* 1 when a chunk carries the same push as the one arriving. */
static int same_push(const inbound *in, const Dloco__V1__Push *ph)
{
    return in->transfer == ph->transfer && in->fragment == ph->fragment && in->base_version == ph->base_version &&
           in->steps == ph->steps && in->tokens == ph->tokens && in->compute_s == ph->compute_s &&
           in->codec == (int)ph->codec && in->block == ph->block_size && in->topk == ph->topk &&
           in->numel == ph->numel;
}

/* Elements [first, first + n) of fragment p, in out: copied there from src
 * first (fp32, may be unaligned; NULL: out holds them already), and
 * the sum of their squares added to span_ss per span of the fragment
 * (core/plan.h: the spans tile the payload in order), each element read once. */
static void span_sumsq(const dl_sync *s, int p, uint64_t first, uint64_t n, float *out, const void *src,
                       double *span_ss)
{
    int ns = 0, k = 0;
    const dl_plan_span *sp = dl_plan_fragment_spans(s->plan, p, &ns);
    while (k + 1 < ns && sp[k + 1].offset <= first) k++;
    for (uint64_t i = 0; i < n; k++) {
        uint64_t end = k + 1 < ns ? sp[k + 1].offset - first : n;
        if (end > n) end = n;
        span_ss[k] += src ? dl_guard_copy_sumsq(out + i, (const unsigned char *)src + 4 * i, (size_t)(end - i))
                          : dl_guard_sumsq(out + i, (size_t)(end - i));
        i = end;
    }
}

/* A frame's payload, len bytes of elements [first, first + n) of the push in
 * its codec (proto/wire.c checked len, and that a block codec's frame starts
 * on a block), into out[0, n), and the sums of their squares added to
 * span_ss per span (the value guard's norm and RDA's, gathered while the
 * chunk is in cache: one pass over an fp32 chunk): fp32 is copied as it is (the value guard refuses
 * non-finite values), the others are decoded, which refuses what no
 * encoder makes (a scale not finite or negative, a non-finite value, a topk
 * index out of its block or out of order). 0, or -1 with the reason in why. */
static int push_decode(const dl_sync *s, const Dloco__V1__Push *ph, const void *data, size_t len, uint64_t first,
                       uint64_t n, float *out, double *span_ss, char *why, size_t cap)
{
    if (ph->codec == DLOCO__V1__CODEC__CODEC_FP32) {
        span_sumsq(s, (int)ph->fragment, first, n, out, data, span_ss);
        return 0;
    }
    dl_codec c = {.id = (dl_codec_id)ph->codec, .block = ph->block_size, .topk = ph->topk};
    uint64_t total = dl_codec_bytes(&c, n);
    if (!total || total != len) { /* refused whole, with the codec's reason (its decode checks the same sizes) */
        if (dl_codec_decode(&c, data, len, n, out) == 0)
            dl_err(DL_EINVAL, "%zu payload bytes for %llu elements, %llu expected", len, (unsigned long long)n,
                   (unsigned long long)total);
        snprintf(why, cap, "%s payload refused (elements from %llu): %s", dl_codec_name(c.id),
                 (unsigned long long)first, dl_errmsg());
        return -1;
    }
    /* slice by slice through a scratch buffer the cache holds, then copied
     * into the pool buffer with its sums (streaming stores): the pool buffer
     * is written once and never read back here */
    uint64_t slice = c.block && c.block < DL_SYNC_DECODE_SLICE ? DL_SYNC_DECODE_SLICE / c.block * c.block
                     : c.block ? c.block : DL_SYNC_DECODE_SLICE;
    for (uint64_t a = 0; a < n; a += slice) {
        uint64_t k = n - a < slice ? n - a : slice, off = a ? dl_codec_bytes(&c, a) : 0;
        if (dl_codec_decode(&c, (const uint8_t *)data + off, (size_t)(dl_codec_bytes(&c, a + k) - off), k,
                            s->dec_scratch)) {
            snprintf(why, cap, "%s payload refused (elements from %llu): %s", dl_codec_name(c.id),
                     (unsigned long long)(first + a), dl_errmsg());
            return -1;
        }
        span_sumsq(s, (int)ph->fragment, first + a, k, out + a, s->dec_scratch, span_ss);
    }
    return 0;
}

/* A Push whose payload does not match its checksum: refused as proto/wire.c refuses a malformed message
 * (an Error, not an Ack; nothing of it changes anything here), so a chunked push it belongs to goes on
 * waiting for that chunk (its next one breaks the order and ends it). `got`: the payload's checksum. */
static void refuse_checksum(dl_sync *s, dl_wire_msg *msg, const dl_registry_learner *l, const Dloco__V1__Push *ph,
                            uint64_t got)
{
    s->refused_msgs++;
    s->met.msg_refused[DL_SM_MSG_INVALID]++;
    dl_downlink_error(s, msg->id, msg->id_len, l->id, DL_EPROTO, 0,
                      "rejected message: push: checksum 0x%016llx does not match payload (0x%016llx)",
                      (unsigned long long)ph->checksum, (unsigned long long)got);
}

/* An fp32 chunk (4 n bytes at data: proto/wire.c checked the frame's size; elements [first, first + n) of
 * fragment p) into out, its span sums
 * into s->chunk_ss (zeroed here), and its checksum computed on the way: slice by slice, each hashed and
 * then copied while the cache holds it (one read of the chunk from memory, not two). Returns the checksum. */
static uint64_t copy_hash_fp32(dl_sync *s, int p, const void *data, uint64_t first, uint64_t n, float *out)
{
    memset(s->chunk_ss, 0, (size_t)s->max_spans * sizeof *s->chunk_ss);
    dl_checksum_state *st = dl_checksum_begin();
    const unsigned char *src = data;
    for (uint64_t a = 0; a < n; a += DL_SYNC_HASH_SLICE) {
        uint64_t k = n - a < DL_SYNC_HASH_SLICE ? n - a : DL_SYNC_HASH_SLICE;
        dl_checksum_update(st, src + 4 * a, (size_t)k * 4);
        span_sumsq(s, p, first + a, k, out + a, src + 4 * a, s->chunk_ss);
    }
    return dl_checksum_end(st);
}

/* The span sums of the push arriving from `slot`, whole or chunked (sync_int.h inb_ss). */
static double *inbound_ss(const dl_sync *s, int slot) { return s->inb_ss + (size_t)slot * (size_t)s->max_spans; }

/* Start the slot's record of a chunked push from its header (nothing kept yet). */
static void inbound_header(inbound *in, const Dloco__V1__Push *ph, int64_t now)
{
    memset(in, 0, sizeof *in);
    in->fragment = ph->fragment;
    in->transfer = ph->transfer;
    in->base_version = ph->base_version;
    in->steps = ph->steps;
    in->tokens = ph->tokens;
    in->compute_s = ph->compute_s;
    in->codec = (int)ph->codec;
    in->block = ph->block_size;
    in->topk = ph->topk;
    in->numel = ph->numel;
    in->progress_ns = now;
}

/* After a chunked push of l has come in full, at `bytes_s` payload bytes per
 * second (its chunks after the first, as they came on the wire, encoded: the
 * pace its link and ours allowed; a learner fills a chunk's bytes with its
 * codec's elements, learner/comms_uplink.c):
 * the chunk size its next pushes use (Ack.chunk_bytes, sent with every Ack)
 * is chunk_bytes doubled while the double is carried in DL_SYNC_PUSH_CHUNK_MS
 * at that pace, up to push_chunk_max. It grows one doubling per push of at
 * least DL_SYNC_PUSH_CHUNK_GROW_MIN chunks (a burst of chunks that waited
 * together looks fast: one such push cannot put a thin link's chunks at the
 * maximum), and shrinks at once, but only when its current size takes more
 * than twice that long (no flapping between two sizes on a rate near a
 * boundary). Larger chunks are fewer messages for the same bytes: the
 * kernel's and libzmq's cost per message is most of what a pushed byte
 * costs this process (docs/RESULTS.md); a thin link keeps chunk_bytes, so
 * heartbeats do not queue behind its chunks. */
static void push_chunk_resize(dl_sync *s, dl_registry_learner *l, double bytes_s, int chunks)
{
    double want = bytes_s * DL_SYNC_PUSH_CHUNK_MS / 1000.0;
    uint64_t c = s->cfg.chunk_bytes, cur = l->push_chunk ? l->push_chunk : s->cfg.chunk_bytes;
    while (c * 2 <= s->cfg.push_chunk_max && (double)(c * 2) <= want) c *= 2;
    if (c > 2 * cur) c = 2 * cur;
    if (c > cur && chunks < DL_SYNC_PUSH_CHUNK_GROW_MIN) return;
    if (c < cur && (double)cur <= 2 * want) return; /* a little too big: kept */
    if (c == cur) return;
    dl_event("push_chunk", "id=%s bytes=%llu was=%llu up_bytes_s=%.0f", l->id, (unsigned long long)c,
             (unsigned long long)cur, bytes_s);
    DL_DEBUG("learner %s: push chunks of %llu bytes from now (were %llu; its uplink carried %.0f bytes/s)", l->id,
             (unsigned long long)c, (unsigned long long)cur, bytes_s);
    l->push_chunk = (uint32_t)c;
}

/* A Push message: a whole push, or one chunk of one (docs/PROTOCOL.md
 * "Chunked transfers"). The header checks run on the first chunk, before
 * any room is taken; values and the policy once the last has come. */
void dl_uplink_push(dl_sync *s, int slot, dl_registry_learner *l, dl_wire_msg *msg, const Dloco__V1__Push *ph)
{
    int p = (int)ph->fragment;
    int64_t now = dl_clock_ns();
    inbound *in = &s->inb[slot];
    const void *data = dl_wire_msg_payload(msg, 0); /* may be unaligned */
    size_t len = dl_wire_msg_payload_len(msg, 0);
    char why[400];
    /* the checksum (proto/wire.c leaves it to us: sync.c): an fp32 chunk that continues a push has it checked
     * while it is copied (copy_hash_fp32); any other Push here, before anything of it counts */
    int fused = ph->chunk_numel && ph->chunk_offset && ph->codec == DLOCO__V1__CODEC__CODEC_FP32;
    if (!fused) {
        uint64_t got = dl_wire_checksum(data, len);
        if (got != ph->checksum) {
            refuse_checksum(s, msg, l, ph, got);
            return;
        }
    }
    l->train_loss = ph->loss; /* finite (proto/wire.c); for the status view only */
    if (!ph->chunk_numel) {
        if (in->active) dl_uplink_drop(s, slot, "whole_push_before_end");
        l->pushes++;
        if (push_head(s, slot, l, ph, now)) return;
        float *delta = dl_pool_alloc(s->pool, p);
        double *ss = inbound_ss(s, slot); /* free: no chunked push arrives from the slot now */
        memset(ss, 0, (size_t)s->max_spans * sizeof *ss);
        if (push_decode(s, ph, data, len, 0, s->numel[p], delta, ss, why, sizeof why)) {
            refuse_taken(s, slot, l, ph, delta, ph->tokens, 0, DL_SM_REJ_CODEC, why);
            return;
        }
        push_body(s, slot, l, ph, delta, ss, now);
        return;
    }
    s->chunks_in++;
    if (ph->chunk_offset == 0) {
        if (in->active) dl_uplink_drop(s, slot, "new_push_before_end");
        l->pushes++;
        inbound_header(in, ph, now);
        if (push_head(s, slot, l, ph, now)) {
            in->refused = 1; /* its other chunks are dropped unread */
            return;
        }
        in->active = 1;
        in->first_ns = now;
        in->buf = dl_pool_alloc_arriving(s->pool);
        memset(inbound_ss(s, slot), 0, (size_t)s->max_spans * sizeof(double));
    } else if (!in->active && in->refused && same_push(in, ph)) {
        return; /* the rest of a refused push: answered at its first chunk */
    } else if (!in->active || !same_push(in, ph) || ph->chunk_offset != in->received) {
        if (!in->active)
            snprintf(why, sizeof why, "chunk at %llu of fragment %d without its first chunk",
                     (unsigned long long)ph->chunk_offset, p);
        else if (!same_push(in, ph))
            snprintf(why, sizeof why, "chunk of another push (fragment %d transfer %llu) before push %llu ended", p,
                     (unsigned long long)ph->transfer, (unsigned long long)in->transfer);
        else
            snprintf(why, sizeof why, "chunk at %llu, expected %llu: chunks must come in order",
                     (unsigned long long)ph->chunk_offset, (unsigned long long)in->received);
        dl_uplink_drop(s, slot, "chunk_out_of_order");
        /* nothing of it was counted: the learner keeps its progress */
        dl_downlink_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, 0);
        push_event(l, ph, "rejected", why);
        s->refused_msgs++;
        l->rejected++; /* answered REJECTED: the learner counts it */
        s->rejected++;
        s->met.push_rejected[DL_SM_REJ_CHUNK_ORDER]++;
        inbound_header(in, ph, now);
        in->refused = 1; /* the rest of this transfer is dropped unread */
        return;
    }
    /* same_push: the codec of its first chunk; proto/wire.c checked the frame's size and alignment */
    uint64_t bytes = ph->chunk_numel * sizeof(float);
    if (fused) { /* into its place in the buffer, counted below once the checksum holds */
        uint64_t got = copy_hash_fp32(s, p, data, ph->chunk_offset, ph->chunk_numel, in->buf + ph->chunk_offset);
        if (got != ph->checksum) {
            refuse_checksum(s, msg, l, ph, got);
            return;
        }
    }
    if (ph->chunk_offset && !room(s, slot, l, p, bytes, 1, why, sizeof why)) {
        /* no room for the rest: the push is refused busy, its chunks so far go */
        dl_pool_free_arriving(s->pool, in->buf, in->counted);
        refuse_busy(s, slot, l, ph, why, DL_SYNC_BUSY_RETRY_MS);
        inbound_header(in, ph, now);
        in->refused = 1;
        return;
    }
    in->progress_ns = now;
    if (ph->chunk_offset) in->wire += len;
    if (fused) {
        double *ss = inbound_ss(s, slot);
        for (int k = 0; k < s->max_spans; k++) ss[k] += s->chunk_ss[k];
    } else if (push_decode(s, ph, data, len, ph->chunk_offset, ph->chunk_numel, in->buf + ph->chunk_offset,
                           inbound_ss(s, slot), why, sizeof why)) {
        /* refused whole: nothing of it was counted yet; the rest of its chunks are dropped unread */
        dl_pool_free_arriving(s->pool, in->buf, in->counted);
        refuse_push(s, slot, l, ph, ph->tokens, 0, DL_SM_REJ_CODEC, why);
        inbound_header(in, ph, now);
        in->refused = 1;
        return;
    }
    dl_pool_count(s->pool, bytes);
    in->counted += bytes;
    in->chunks++;
    in->received += ph->chunk_numel;
    if (in->received < in->numel) return;
    if (in->chunks > 1) l->chunk_gap_ns = (now - in->first_ns) / (in->chunks - 1);
    if (in->chunks > 1 && now > in->first_ns) {
        double dt = (double)(now - in->first_ns) / 1e9;
        l->up_bytes_s = (double)in->wire / dt;
        push_chunk_resize(s, l, l->up_bytes_s, in->chunks);
    }
    float *delta = in->buf; /* all of it counted now: an ordinary pool buffer */
    memset(in, 0, sizeof *in);
    push_body(s, slot, l, ph, delta, inbound_ss(s, slot), now);
}

/* Drop the chunked push arriving from a slot, if any (its learner left,
 * changed connection, or broke the chunk order). */
void dl_uplink_drop(dl_sync *s, int slot, const char *why)
{
    inbound *in = &s->inb[slot];
    if (in->active) {
        s->abandoned_in++;
        dl_event("push_abandoned", "id=%s frag=%u base=%llu received=%llu numel=%llu reason=%s",
                 dl_registry_get(s->reg, slot)->id, in->fragment, (unsigned long long)in->base_version,
                 (unsigned long long)in->received, (unsigned long long)in->numel, why);
        dl_pool_free_arriving(s->pool, in->buf, in->counted);
    }
    memset(in, 0, sizeof *in);
}

int64_t dl_uplink_stall_ns(const dl_sync *s, int slot)
{
    const inbound *in = &s->inb[slot];
    const dl_registry_learner *l = dl_registry_get(s->reg, slot);
    int64_t cap = (int64_t)s->cfg.slow_reader_ms * 1000000LL, gap;
    if (in->chunks > 1) gap = (in->progress_ns - in->first_ns) / (in->chunks - 1);
    else if (l->chunk_gap_ns > 0) gap = l->chunk_gap_ns;
    else gap = (int64_t)((double)in->counted / DL_SYNC_STALL_FLOOR_BPS * 1e9) / DL_SYNC_STALL_GAPS;
    int64_t d = gap * DL_SYNC_STALL_GAPS;
    if (d < DL_SYNC_STALL_MIN_MS * 1000000LL) d = DL_SYNC_STALL_MIN_MS * 1000000LL;
    return d < cap ? d : cap;
}
