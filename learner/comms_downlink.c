/* A comms session's downlink: Fetches and refetches, and the Updates that arrive (fp32 chunks reassembled,
 * deltas decoded onto the mirror), checked before the mailbox's update slots get them (synchronizer/downlink.c). */
#include "learner/comms_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"

/* Send one Fetch of every wanted fragment whose time has come (a fragment
 * waiting for a fetch reply is asked again only after that reply); all P of
 * them as an empty list (= all), a subset by name. c->t_fetch = the next
 * time one is due. READY only. */
void dl_comms_downlink_fetch(dl_comms *c, int64_t now)
{
    int n = 0;
    c->t_fetch = NEVER;
    for (int i = 0; i < c->n_served; i++) {
        sfrag *f = &c->f[c->served[i]];
        if (!f->fetch_want || f->fetch_pending) continue;
        if (f->fetch_at <= now) c->fetch_list[n++] = (uint32_t)c->served[i];
        else if (f->fetch_at < c->t_fetch) c->t_fetch = f->fetch_at;
    }
    if (!n) return;
    Dloco__V1__Fetch fm;
    dloco__v1__fetch__init(&fm);
    /* what arrived of a chunked Update is kept: the synchronizer goes on from
     * there while that version is still the global one */
    int resume = 0;
    for (int i = 0; i < n; i++) {
        const sfrag *f = &c->f[c->fetch_list[i]];
        c->resume_v[i] = f->rx ? f->rx_version : 0;
        c->resume_o[i] = f->rx ? f->rx_off : 0;
        resume |= f->rx && f->rx_off > 0;
    }
    if (n < c->P || resume) {
        fm.n_fragments = (size_t)n;
        fm.fragments = c->fetch_list;
    }
    if (resume) {
        fm.n_resume_versions = fm.n_resume_offsets = (size_t)n;
        fm.resume_versions = c->resume_v;
        fm.resume_offsets = c->resume_o;
    }
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_fetch(&env, &fm);
    if (dl_comms_send_env(c, &env, NULL, 0) != 0) {
        c->t_fetch = now + 10 * MS; /* no connection or a full queue: soon again */
        return;
    }
    for (int i = 0; i < n; i++) {
        sfrag *f = &c->f[c->fetch_list[i]];
        f->fetch_want = 0;
        f->fetch_pending = 1;
        f->fetch_sent = now;
    }
    COUNT(fetches);
}

/* Ask for a Fetch of p at `at` (merged with an earlier request). */
void dl_comms_downlink_want(dl_comms *c, int p, int64_t at)
{
    sfrag *f = &c->f[p];
    if (!f->fetch_want || at < f->fetch_at) f->fetch_at = at;
    f->fetch_want = 1;
    f->fetch_soft = 0; /* any other reason to fetch makes the reply a rebase */
    if (f->fetch_at < c->t_fetch) c->t_fetch = f->fetch_at;
}

/* A Fetch whose reply never came (it was dropped as malformed, or lost with
 * a connection) while no Update at all arrived for a silence limit is
 * counted as a refused reply: p is fetched again with the refusals' backoff,
 * so a learner whose synchronizer answers with bad Updates keeps asking. */
void dl_comms_downlink_timeouts(dl_comms *c, int64_t now)
{
    int64_t quiet = now - c->t_update_rx;
    if (quiet < dl_comms_silence_ms(c) * MS) return;
    for (int i = 0; i < c->n_served; i++) {
        int p = c->served[i];
        sfrag *f = &c->f[p];
        if (!f->fetch_pending || now - f->fetch_sent < dl_comms_silence_ms(c) * MS) continue;
        f->fetch_pending = f->fetch_soft = 0;
        int k = dl_mailbox_refuse_update(c->mb, p);
        DL_WARN("comms: no reply to the fetch of fragment %d for %lld ms: asked again (refusal %d in a row)", p,
                (long long)((now - f->fetch_sent) / MS), k);
        dl_event("update_refused", " learner=%s epoch=%llu fragment=%d version=0 reason=unanswered refusals=%d", c->id,
                 (unsigned long long)c->epoch, p, k);
    }
}

/* Fetches asked for through the mailbox (an update of a served fragment was
 * refused, here or by the node): the first DL_COMMS_REFETCH_FREE refusals
 * of a fragment in a row are fetched again at once, later ones after
 * hello_retry_ms doubling up to hello_retry_max_ms, so a synchronizer that
 * keeps sending garbage does not make the learner spin. */
void dl_comms_downlink_refetches(dl_comms *c, int64_t now)
{
    if (!dl_mailbox_take_refetches(c->mb, c->served, c->n_served, c->refusals)) return;
    for (int i = 0; i < c->n_served; i++) {
        int k = c->refusals[i], p = c->served[i];
        if (!k) continue;
        int64_t delay = 0;
        if (k > DL_COMMS_REFETCH_FREE) {
            delay = c->hello_retry_ms;
            for (int j = DL_COMMS_REFETCH_FREE + 1; j < k && delay < c->hello_retry_max_ms; j++) delay *= 2;
            if (delay > c->hello_retry_max_ms) delay = c->hello_retry_max_ms;
        }
        dl_comms_downlink_want(c, p, now + delay * MS);
        COUNT(refetches);
        DL_INFO("comms: fragment %d fetched again in %lld ms (refusal %d in a row)", p, (long long)delay, k);
        dl_event("refetch", " learner=%s epoch=%llu fragment=%d refusals=%d delay_ms=%lld", c->id,
                 (unsigned long long)c->epoch, p, k, (long long)delay);
    }
}

/* A chunk of p's Update arrived (`bytes` of payload); `continues`: it
 * follows an earlier chunk of the same transfer, so the synchronizer had it
 * queued behind that one and the interval is our downlink's pace
 * (dl_comms_silence_ms). */
static void rx_chunk(dl_comms *c, sfrag *f, int continues, size_t bytes)
{
    int64_t now = dl_clock_ns();
    if (continues && bytes && f->rx_t && now > f->rx_t) {
        double pace = (double)(now - f->rx_t) / (double)bytes;
        c->rx_ns_per_byte = c->rx_ns_per_byte > 0 ? 0.75 * c->rx_ns_per_byte + 0.25 * pace : pace;
    }
    f->rx_t = now;
}

/* 1 when p is ours; counts a bad message otherwise (a shard sent us another's fragment). */
int dl_comms_downlink_served(dl_comms *c, int p, const char *what)
{
    if (p >= 0 && p < c->P && c->f[p].served) return 1;
    DL_WARN("comms: %s of fragment %d ignored: not served by this session", what, p);
    COUNT(bad_msgs);
    return 0;
}

/* 1 when all n fp32 values at (possibly unaligned) data are finite. */
static int all_finite(const void *data, size_t n)
{
    const unsigned char *b = data;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, b + 4 * i, 4);
        /* exponent all ones = inf or NaN */
        acc |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return !acc;
}

static void on_update_whole(dl_comms *c, const Dloco__V1__Update *u, int p, const void *payload);

/* A delta Update of p that the mirror cannot take (it does not hold version
 * - 1: versions missed, no mirror yet, a gap in its chunks): dropped, and
 * p fetched whole (the synchronizer answers a Fetch with fp32). The push
 * an ACCEPTED announced keeps waiting: for the fetch reply. */
static void delta_missed(dl_comms *c, int p, uint64_t version, const char *why)
{
    sfrag *f = &c->f[p];
    COUNT(updates_delta_missed);
    long long held = f->mirror_ok ? (long long)f->mirror_version : -1;
    DL_INFO("comms: delta update of fragment %d version %llu dropped (%s, mirror %s %lld); fetching the fragment", p,
            (unsigned long long)version, why, f->mirror_ok ? "holds" : "empty", held);
    dl_event("update_delta_missed", " learner=%s epoch=%llu fragment=%d version=%llu held=%lld", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)version, held);
    f->stage_active = 0;
    int fresh = !f->fetch_want && !f->fetch_pending;
    if (!f->fetch_pending) dl_comms_downlink_want(c, p, dl_clock_ns());
    if (fresh) f->fetch_soft = 1; /* only the mirror is behind: the reply refreshes it, not theta */
}

/* One delta Update (or chunk of one) of p: version v = version v - 1 +
 * decode(payload), element by element in fp32 (dl_codec_decode_add onto the
 * mirror, into the stage). Its first chunk (offset 0) needs the mirror at v - 1;
 * the chunks go in order; the last one hands the stage over as a full
 * update (on_update_whole), which makes it the mirror. A payload the decoder
 * refuses is a bad message: the stage is dropped and p fetched again (with
 * the refusals' backoff). */
static void on_update_delta(dl_comms *c, const Dloco__V1__Update *u, int p, const void *payload, size_t len)
{
    sfrag *f = &c->f[p];
    uint64_t off = u->chunk_numel ? u->chunk_offset : 0, n = u->chunk_numel ? u->chunk_numel : u->numel;
    if (off == 0) {
        /* a version the mirror holds already (a rejoin's chain starts at the adopted
         * version; an Update after it may have come and wait to be adopted): skip it */
        if (f->mirror_ok && u->version <= f->mirror_version) {
            COUNT(chunks_dropped);
            return;
        }
        f->stage_active = 0;
        if (!c->update_codec) {
            delta_missed(c, p, u->version, "no update_codec in the Welcome");
            return;
        }
        if (!f->mirror_ok || f->mirror_version != u->version - 1) {
            delta_missed(c, p, u->version, "version - 1 not held");
            return;
        }
        if (!f->stage && !(f->stage = dl_try_malloc((size_t)u->numel * sizeof(float)))) {
            delta_missed(c, p, u->version, "out of memory for the staging copy");
            return;
        }
        f->stage_active = 1;
        f->stage_version = u->version;
        f->stage_off = 0;
    } else if (!f->stage_active || f->stage_version != u->version || off + n <= f->stage_off) {
        COUNT(chunks_dropped); /* the rest of a delta missed, replaced or finished, or a repeat */
        return;
    } else if (off != f->stage_off) {
        COUNT(chunks_dropped);
        delta_missed(c, p, u->version, "a gap in its chunks");
        return;
    }
    dl_codec dc = {.id = (dl_codec_id)u->codec, .block = u->block_size, .topk = u->topk};
    if (dl_codec_decode_add(&dc, payload, len, n, f->mirror + off, f->stage + off)) {
        f->stage_active = 0;
        COUNT(bad_msgs);
        int k = dl_mailbox_refuse_update(c->mb, p);
        DL_WARN("comms: delta update of fragment %d version %llu refused: %s (refusal %d in a row)", p,
                (unsigned long long)u->version, dl_errmsg(), k);
        dl_event("update_refused", " learner=%s epoch=%llu fragment=%d version=%llu reason=decode refusals=%d", c->id,
                 (unsigned long long)c->epoch, p, (unsigned long long)u->version, k);
        return;
    }
    f->stage_off = off + n;
    if (u->chunk_numel) {
        COUNT(chunks_recv);
        rx_chunk(c, f, off > 0, len);
    }
    if (f->stage_off < u->numel) return;
    f->stage_active = 0;
    on_update_whole(c, u, p, f->stage);
}

void dl_comms_downlink_update(dl_comms *c, const Dloco__V1__Update *u, dl_wire_msg *m)
{
    int p = (int)u->fragment;
    c->t_update_rx = dl_clock_ns();
    if (u->delta) {
        if (dl_comms_downlink_served(c, p, "update"))
            on_update_delta(c, u, p, dl_wire_msg_payload(m, 0), dl_wire_msg_payload_len(m, 0));
        return;
    }
    if (u->codec != DLOCO__V1__CODEC__CODEC_FP32) {
        DL_WARN("comms: update of fragment %d in codec %s ignored: this learner only reads fp32", p,
                dl_wire_codec_name(u->codec));
        COUNT(bad_msgs);
        return;
    }
    if (!dl_comms_downlink_served(c, p, "update")) return;
    sfrag *f = &c->f[p];
    const void *payload = dl_wire_msg_payload(m, 0);
    if (u->chunk_numel) {
        /* one chunk. Of the version being assembled: what we hold already is
         * skipped (the synchronizer started it again, e.g. on a new
         * connection, before our resume point reached it), the rest
         * appended; a gap asks for the rest (once per point). Of another
         * version: offset 0 starts it, anything else is a leftover of a
         * transfer replaced or finished, dropped. */
        uint64_t off = u->chunk_offset, end = off + u->chunk_numel;
        if (f->rx && u->version == f->rx_version) {
            if (end <= f->rx_off) {
                COUNT(chunks_dropped);
                return;
            }
            if (off > f->rx_off) {
                COUNT(chunks_dropped);
                DL_DEBUG("comms: chunk of fragment %d v%llu at %llu: a gap after %llu", p,
                         (unsigned long long)u->version, (unsigned long long)off, (unsigned long long)f->rx_off);
                if (f->gap_at != f->rx_off + 1) {
                    f->gap_at = f->rx_off + 1;
                    /* the reply it waited for has a hole: asked again (dl_comms_downlink_fetch sets it) */
                    f->fetch_pending = 0;
                    dl_comms_downlink_want(c, p, dl_clock_ns());
                }
                return;
            }
        } else if (off == 0) {
            if (!f->rx && !(f->rx = dl_try_malloc((size_t)u->numel * sizeof(float)))) {
                COUNT(chunks_dropped); /* out of memory: the fetch of the fragment comes later */
                return;
            }
            f->rx_version = u->version;
            f->rx_off = 0;
        } else {
            COUNT(chunks_dropped);
            return;
        }
        const char *from = (const char *)payload + (f->rx_off - off) * sizeof(float);
        memcpy(f->rx + f->rx_off, from, (size_t)(end - f->rx_off) * sizeof(float));
        rx_chunk(c, f, f->rx_off > 0, dl_wire_msg_payload_len(m, 0));
        f->rx_off = end;
        f->gap_at = 0;
        COUNT(chunks_recv);
        if (f->rx_off < u->numel) return;
        payload = f->rx; /* complete: checked and handed over below, then freed */
    }
    on_update_whole(c, u, p, payload);
    if (payload == f->rx) {
        free(f->rx);
        f->rx = NULL;
        f->rx_off = f->rx_version = 0;
    }
}

/* A complete Update of p (payload: numel floats, possibly unaligned). */
static void on_update_whole(dl_comms *c, const Dloco__V1__Update *u, int p, const void *payload)
{
    sfrag *f = &c->f[p];
    int forced = f->fetch_pending && !f->fetch_soft ? DL_UPDATE_FETCHED
                 : f->rebase_pending == 2            ? DL_UPDATE_STALE
                 : f->rebase_pending                 ? DL_UPDATE_REBASE
                                                     : DL_UPDATE_NORMAL;
    uint64_t held;
    int is_held = dl_mailbox_held(c->mb, p, &held);
    if (forced == DL_UPDATE_NORMAL && is_held && u->version < held) {
        /* out of date: the learner already holds a newer global */
        COUNT(updates_old);
        dl_mailbox_update_seen(c->mb, p);
        DL_DEBUG("comms: update of fragment %d version %llu ignored: holding %llu", p, (unsigned long long)u->version,
                 (unsigned long long)held);
        return;
    }
    const char *reason = NULL;
    char why[160];
    if (u->version > f->known && u->version - f->known > c->max_jump) {
        reason = "version_jump";
        snprintf(why, sizeof why, "version %llu is more than %llu above the newest known %llu",
                 (unsigned long long)u->version, (unsigned long long)c->max_jump, (unsigned long long)f->known);
    } else if (!all_finite(payload, (size_t)u->numel)) { /* a decoded delta too: a sum may overflow */
        reason = "nonfinite";
        snprintf(why, sizeof why, "it holds non-finite values");
    }
    f->rebase_pending = 0;
    f->fetch_pending = f->fetch_soft = 0;
    if (reason) {
        /* never adopted; a fresh fetch of p is asked for (dl_comms_downlink_refetches backs off) */
        COUNT(updates_refused);
        int k = dl_mailbox_refuse_update(c->mb, p);
        DL_WARN("comms: update of fragment %d version %llu refused: %s (refusal %d in a row)", p,
                (unsigned long long)u->version, why, k);
        dl_event("update_refused", " learner=%s epoch=%llu fragment=%d version=%llu reason=%s refusals=%d", c->id,
                 (unsigned long long)c->epoch, p, (unsigned long long)u->version, reason, k);
        return;
    }
    if (u->version > f->known) f->known = u->version;
    c->rebuilds_row = c->rebuild_bad = 0; /* the connection serves: a later rebuild starts its backoff over */
    /* a good one came: a fetch still waiting for its backoff after a refused
     * update is not needed any more (the node asks again if it refuses this one) */
    f->fetch_want = 0;
    /* a forced adopt overwrites theta_p: the progress the residual was owed to is gone (learner/ef.h) */
    if (forced != DL_UPDATE_NORMAL && !(forced == DL_UPDATE_STALE && c->adopt_keep)) dl_ef_reset(c->ef, p);
    size_t bytes = (size_t)u->numel * sizeof(float);
    int stored = dl_mailbox_put_update(c->mb, p, u->version, forced, payload, (size_t)u->numel);
    if (stored && c->update_codec) {
        /* what the slot got is the mirror now: the next delta applies to it */
        if (payload == f->stage) {
            float *t = f->mirror;
            f->mirror = f->stage;
            f->stage = t;
        } else {
            if (!f->mirror) f->mirror = dl_try_malloc(bytes);
            if (f->mirror) memcpy(f->mirror, payload, bytes);
        }
        f->mirror_version = u->version;
        f->mirror_ok = f->mirror != NULL; /* out of memory: no mirror, the next delta is missed and fetched */
        /* a delta half assembled goes on only when it is the next version of this one */
        if (f->stage_active && f->stage_version != u->version + 1) f->stage_active = 0;
    }
    COUNT(updates);
    if (u->delta) COUNT(updates_delta);
    dl_event("update", " learner=%s epoch=%llu fragment=%d version=%llu forced=%d", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)u->version, forced);
    /* the synchronizer's merge event carries the same hash of what it committed */
    if (stored)
        dl_event("update_base", " learner=%s epoch=%llu fragment=%d version=%llu delta=%d hash=%016llx", c->id,
                 (unsigned long long)c->epoch, p, (unsigned long long)u->version, (int)u->delta,
                 (unsigned long long)dl_checksum64(payload, bytes));
}
