/* A comms session's uplink: pushes claimed from the mailbox, encoded, sent whole or in chunks under flow
 * control and the push window, stopped, and settled by their Acks (its side: synchronizer/uplink.c). */
#include "learner/comms_int.h"

#include <stdio.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"

/* Payload bytes of elements [0, n) of a push in the push codec (n a
 * multiple of the block for block codecs, or the whole fragment): a
 * block-aligned range of a payload is the payload of that range
 * (core/codec.h), so the bytes of [off, off + n) start at enc_bytes(off). */
static uint64_t enc_bytes(const dl_comms *c, uint64_t n) { return n ? dl_codec_bytes(&c->penc.c, n) : 0; }

/* The push window: payload bytes of ours libzmq may hold: two chunks of the
 * push leaving, as they travel (encoded), keep the link busy, and a
 * heartbeat waits behind at most that. (Counted in fp32 bytes it held about
 * 15 int4 chunks of an eighth of their bytes: with chunks sized for 50 ms of
 * the link, 750 ms.) */
static uint64_t push_window(const dl_comms *c, const ptx *t) { return 2 * enc_bytes(c, t->cn); }

/* Elements per chunk of a chunked push: as many as fill the chunk's bytes
 * (Welcome.chunk_bytes, or the latest Ack.chunk_bytes) encoded, in whole
 * blocks for block codecs (dl_codec_chunk_numel; at least one block, and
 * every chunk but the fragment's last holds whole blocks). A chunk is sized
 * in bytes on the wire whatever its codec, as the synchronizer sizes delta
 * Updates: an int4 chunk of the fp32 chunk's element count was an eighth of
 * its bytes, eight times the messages for the same push. */
static uint64_t push_chunk_numel(const dl_comms *c)
{
    const dl_codec *pc = &c->penc.c;
    uint64_t n = dl_codec_chunk_numel(pc, c->push_chunk * sizeof(float));
    if (n) return n;
    return dl_codec_is_block(pc->id) ? pc->block : 1;
}

/* Encode the claimed push of p (x: numel_p floats) into f->enc with the
 * fragment's error feedback (learner/ef.h). Stochastic rounding draws from a
 * seed that is a pure function of (learner instance, fragment, push counter). */
static int encode_push(dl_comms *c, int p, const float *x, uint64_t base_version)
{
    sfrag *f = &c->f[p];
    if (!f->enc && !(f->enc = dl_try_malloc((size_t)enc_bytes(c, c->numel[p]))))
        return dl_err(DL_ENOMEM, "encoded push of fragment %d: out of memory", p);
    dl_codec_enc e = c->penc;
    uint64_t key[3] = {c->instance, (uint64_t)p, ++f->encodes};
    e.seed = dl_hash64(key, sizeof key, 0);
    return dl_ef_encode(c->ef, &e, p, x, base_version, f->enc);
}

static void push_sent(dl_comms *c, int p, const dl_mailbox_push *h, uint64_t n)
{
    uint64_t bytes = enc_bytes(c, n);
    pthread_mutex_lock(&c->mu);
    c->st.pushes++;
    c->st.push_bytes += bytes;
    pthread_mutex_unlock(&c->mu);
    DL_DEBUG("comms: push fragment %d base %llu steps %llu tokens %llu%s", p, (unsigned long long)h->base_version,
             (unsigned long long)h->steps, (unsigned long long)h->tokens, h->final ? " (final flush)" : "");
    dl_event("push", " learner=%s epoch=%llu fragment=%d base_version=%llu steps=%llu tokens=%llu compute_s=%.6f "
             "final=%d held=%d codec=%s bytes=%llu",
             c->id, (unsigned long long)c->epoch, p, (unsigned long long)h->base_version,
             (unsigned long long)h->steps, (unsigned long long)h->tokens, h->compute_s, h->final, h->held,
             dl_codec_name(c->penc.c.id), (unsigned long long)bytes);
}

/* One Push message: elements [off, off + n) of the claimed push of p
 * (chunked when transfer != 0, else the whole fragment); payload is the
 * whole push as encoded. */
static int send_push_msg(dl_comms *c, int p, const dl_mailbox_claim *cl, const uint8_t *payload, uint64_t transfer,
                         uint64_t off, uint64_t n)
{
    const dl_mailbox_push *h = &cl->h;
    const dl_codec *pc = &c->penc.c;
    Dloco__V1__Push m;
    dloco__v1__push__init(&m);
    m.fragment = (uint32_t)p;
    m.base_version = h->base_version;
    m.steps = h->steps;
    m.tokens = h->tokens;
    m.codec = (Dloco__V1__Codec)pc->id;
    m.numel = c->numel[p];
    m.block_size = pc->block;
    m.topk = pc->topk;
    m.chunk_offset = transfer ? off : 0;
    m.chunk_numel = transfer ? n : 0;
    m.transfer = transfer;
    const uint8_t *from = payload + enc_bytes(c, off);
    size_t len = (size_t)enc_bytes(c, n);
    m.checksum = dl_wire_checksum(from, len);
    m.loss = h->loss;
    m.compute_s = h->compute_s;
    m.final = h->final != 0;
    if (m.final && off == 0) { /* the synchronizer reads it from a push's first frame */
        m.n_final_pending = (size_t)cl->n_pending;
        m.final_pending = cl->pending;
    }
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_push(&env, &m);
    return dl_comms_send_env(c, &env, from, len);
}

/* Go on with the chunked push leaving, as far as the window allows.
 * Returns 1 when the socket is full (retry soon), 0 otherwise. */
static int tx_continue(dl_comms *c)
{
    ptx *t = &c->tx;
    uint64_t n = c->numel[t->p], chunk = t->cn;
    while (t->active && t->off < n) {
        uint64_t cn = n - t->off < chunk ? n - t->off : chunk;
        /* the first chunk always goes; later ones while the window has room
         * (the queue's drain wakes the thread) */
        if (t->off && dl_wire_queue_bytes(c->outq) + enc_bytes(c, cn) > push_window(c, t)) return 0;
        int rc = send_push_msg(c, t->p, &t->cl, t->payload, t->transfer, t->off, cn);
        if (rc == DL_EAGAIN) {
            if (t->off == 0) { /* nothing left yet: back to its slot, sent again later */
                dl_comms_uplink_abort(c, 1, 0, "queue_full");
                return 1;
            }
            return 1;
        }
        if (rc < 0) {
            dl_comms_uplink_abort(c, 0, 0, "send_failed");
            return 0;
        }
        t->off += cn;
        COUNT(chunks_sent);
    }
    if (t->active) {
        t->active = 0;
        int64_t now = dl_clock_ns();
        c->f[t->p].unacked_ns = now; /* its Ack is due from now, */
        dl_mailbox_push_left(c->mb, t->p, t->cl.h.base_version, now); /* and the node's hold counts from now */
        push_sent(c, t->p, &t->cl.h, n);
    }
    return 0;
}

/* Send queued pushes allowed by flow control: at most one chunked push
 * leaves at a time (its chunks interleave with heartbeats and fetches), a
 * fragment waits for the Ack of its previous push, and one refused busy
 * waits its retry_after. Returns 1 when the socket is full (retry soon), 0
 * otherwise. */
int dl_comms_uplink_send(dl_comms *c, int64_t now)
{
    if (c->tx.active) {
        int blocked = tx_continue(c);
        if (blocked || c->tx.active) return blocked;
    }
    int64_t expiry = (int64_t)c->liveness * c->hb_ms;
    if (expiry < c->ack_expiry_min_ms) expiry = c->ack_expiry_min_ms;
    int hb_first = 0;
    for (int k = 0; k < c->n_served && !c->tx.active; k++) {
        int p = c->served[(c->rr + k) % c->n_served];
        sfrag *f = &c->f[p];
        if (f->fetch_pending || f->fetch_want) continue; /* the base is being replaced */
        if (f->unacked && now - f->unacked_ns < expiry * MS) continue;
        if (f->busy_until > now) continue;
        dl_mailbox_claim cl;
        if (!dl_mailbox_claim_push(c->mb, p, now, c->final_pending, &cl, &c->send_spare)) continue;
        const dl_mailbox_push *h = &cl.h;
        /* A Heartbeat first, so the synchronizer's record of the tokens this
         * learner processed covers every token the push reports (the
         * ledger's balance holds even if the learner dies right after). */
        if (!hb_first) {
            dl_comms_admit_heartbeat(c);
            hb_first = 1;
        }

        size_t n = (size_t)c->numel[p];
        const float *x = c->send_spare;
        if (c->byzantine) {
            /* benchmarks only: corrupt what leaves, on a copy (the slot's
             * buffer may go back to the mailbox unsent and be sent again) */
            for (size_t i = 0; i < n; i++) c->byz_buf[i] = c->send_spare[i] * c->byz_scale;
            x = c->byz_buf;
        }
        /* encoded here, once per claim: the mailbox keeps fp32 deltas (and
         * coalesces them); every chunk is a block-aligned slice of this one encoding */
        const uint8_t *payload = (const uint8_t *)x;
        if (c->penc.c.id != DL_CODEC_FP32) {
            if (encode_push(c, p, x, h->base_version)) {
                DL_ERROR("comms: push of fragment %d not sent: encoding it as %s failed: %s", p,
                         dl_codec_name(c->penc.c.id), dl_errmsg());
                dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 0);
                continue; /* dropped like a push refused locally; its progress stays in theta */
            }
            payload = c->f[p].enc;
        }
        f->unacked = 1;
        f->unacked_ns = now;
        if (c->chunk && n > push_chunk_numel(c)) {
            c->tx = (ptx){.active = 1, .p = p, .cl = cl, .transfer = ++c->transfers, .off = 0,
                          .cn = push_chunk_numel(c), .payload = payload};
            int blocked = tx_continue(c);
            if (blocked) return 1;
            continue; /* leaving (or refused locally): the next one after it */
        }
        int rc = send_push_msg(c, p, &cl, payload, 0, 0, n);
        if (rc == DL_EAGAIN) {
            /* put it back unless a newer push of p arrived meanwhile */
            f->unacked = 0;
            dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 1);
            dl_ef_forget(c->ef, p);
            return 1;
        }
        if (rc < 0) {
            f->unacked = 0;
            dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 0);
            dl_ef_forget(c->ef, p);
            if (rc == DL_ENET) return 0;
            continue; /* refused locally (e.g. a NaN loss): dropped, logged by dl_comms_send_env */
        }
        push_sent(c, p, h, n);
    }
    c->rr = (c->rr + 1) % c->n_served;
    return 0;
}

/* Stop the chunked push leaving. With requeue the push goes back to its
 * slot (unless a newer one of the fragment came meanwhile) to be sent again
 * whole; without, its claim is undone and it is gone (its progress stays in
 * the parameters: the next push of the fragment carries it). decided: an
 * Ack already settled it (nothing to undo). */
void dl_comms_uplink_abort(dl_comms *c, int requeue, int decided, const char *why)
{
    ptx *t = &c->tx;
    if (!t->active) return;
    DL_DEBUG("comms: push of fragment %d stopped after %llu of %llu elements: %s", t->p, (unsigned long long)t->off,
             (unsigned long long)c->numel[t->p], why);
    dl_event("push_stopped", " learner=%s epoch=%llu fragment=%d sent=%llu numel=%llu requeue=%d reason=%s", c->id,
             (unsigned long long)c->epoch, t->p, (unsigned long long)t->off, (unsigned long long)c->numel[t->p],
             requeue, why);
    if (!decided) {
        dl_mailbox_unclaim_push(c->mb, t->p, &t->cl, &c->send_spare, requeue);
        dl_ef_forget(c->ef, t->p); /* it did not leave: encoded again from the committed residual */
    }
    c->f[t->p].unacked = 0;
    t->active = 0;
    COUNT(pushes_stopped);
}

/* The answer to fragment p's undecided push will never come (Welcome.answered_bases says it was never answered). */
void dl_comms_uplink_forget_push(dl_comms *c, int p)
{
    dl_mailbox_forget_sent(c->mb, &p, 1);
    c->f[p].unacked = 0;
    dl_ef_forget(c->ef, p); /* no decision will come: the committed residual stays */
}

/* The answers to pushes already sent will never come (another incarnation
 * of the synchronizer, or DL_ENOTFOUND: our recent pushes got Errors instead
 * of Acks): they stop holding their fragments and the final flush. */
void dl_comms_uplink_forget(dl_comms *c)
{
    dl_comms_uplink_abort(c, 1, 0, "session_forgotten");
    dl_mailbox_forget_sent(c->mb, c->served, c->n_served);
    for (int p = 0; p < c->P; p++) {
        c->f[p].unacked = 0;
        dl_ef_forget(c->ef, p); /* no decision will come: the committed residual stays */
    }
}

static const char *decision_name(Dloco__V1__Decision d)
{
    switch (d) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING: return "merged_pending";
    case DLOCO__V1__DECISION__DECISION_ACCEPTED: return "accepted";
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE: return "dropped_stale";
    case DLOCO__V1__DECISION__DECISION_REJECTED: return "rejected";
    default: return "unknown";
    }
}

void dl_comms_uplink_ack(dl_comms *c, const Dloco__V1__Ack *a)
{
    int p = (int)a->fragment;
    if (!dl_comms_downlink_served(c, p, "ack")) return;
    int d = 0;
    switch (a->decision) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING: d = DL_DECIDE_PENDING; break;
    case DLOCO__V1__DECISION__DECISION_ACCEPTED: d = DL_DECIDE_ACCEPTED; break;
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE: d = DL_DECIDE_DROPPED; break;
    case DLOCO__V1__DECISION__DECISION_REJECTED: d = DL_DECIDE_REJECTED; break;
    default: return; /* unknown decisions never pass dl_wire_validate */
    }
    /* an answer sent again after a Welcome (its first may have been lost with a connection): it decides the
     * push it names if that one is still undecided, and is nothing else (counted, busy, chunk size) */
    if (a->again) {
        uint64_t base;
        int open = dl_mailbox_open_push(c->mb, p, &base);
        if (!open || base != a->base_version) return;
        if (d == DL_DECIDE_PENDING) {
            dl_mailbox_decide(c->mb, p, d, a->base_version, 0);
            c->f[p].unacked = 0;
            return;
        }
        if (d == DL_DECIDE_ACCEPTED && open != 2) return; /* its MERGED_PENDING comes first */
    }
    /* refused at its first chunk: the rest of it need not go */
    if (c->tx.active && c->tx.p == p && c->tx.cl.h.base_version == a->base_version && d != DL_DECIDE_PENDING &&
        d != DL_DECIDE_ACCEPTED)
        dl_comms_uplink_abort(c, 0, 1, a->busy ? "busy" : "refused");
    /* rebase (docs/PROTOCOL.md section 5, "Errors"): after a DROPPED_STALE, or a REJECTED whose base is
     * unusable, the synchronizer sends the global fragment, and the learner rebases onto it */
    int rebase = a->rebase && (d == DL_DECIDE_DROPPED || d == DL_DECIDE_REJECTED);
    int decided = dl_mailbox_decide(c->mb, p, d, a->base_version, d == DL_DECIDE_ACCEPTED || rebase);
    if (decided && d == DL_DECIDE_ACCEPTED) dl_mailbox_await_version(c->mb, p, a->merged_version);
    /* error feedback follows the decision of the push it encoded (learner/ef.h) */
    if (decided && d == DL_DECIDE_DROPPED && c->adopt_keep) dl_ef_forget(c->ef, p); /* theta is not overwritten */
    else if (decided) dl_ef_decided(c->ef, p, d, rebase, a->base_version);
    if (a->busy) {
        /* the pool was full: nothing counted, the progress stays here; the
         * fragment's next push (coalesced meanwhile) waits at least this */
        c->f[p].busy_until = dl_clock_ns() + (int64_t)a->retry_after_ms * MS;
        COUNT(busy);
    }
    if (decided && rebase) c->f[p].rebase_pending = d == DL_DECIDE_DROPPED ? 2 : 1;
    /* any immediate answer frees the fragment for flow control */
    if (d != DL_DECIDE_ACCEPTED) c->f[p].unacked = 0;
    /* the chunk size of our next pushes (a multiple of 4 in the protocol's range: dl_wire_validate), when this
     * synchronizer chunks pushes at all; 0 = keep ours */
    uint64_t pc = a->chunk_bytes / sizeof(float);
    if (pc && c->chunk && pc != c->push_chunk) {
        dl_event("push_chunk", " learner=%s epoch=%llu bytes=%llu was=%llu", c->id, (unsigned long long)c->epoch,
                 (unsigned long long)a->chunk_bytes, (unsigned long long)(c->push_chunk * sizeof(float)));
        c->push_chunk = pc;
    }
    pthread_mutex_lock(&c->mu);
    /* the fleet's step rate for --dynamic_h (finite, in [0, 1e9]: dl_wire_validate); 0 = the synchronizer
     * does not know one (or is older): keep the last one */
    if (a->fleet_steps_per_s > 0) c->st.fleet_steps_per_s = a->fleet_steps_per_s;
    switch (d) {
    case DL_DECIDE_PENDING: c->st.acks_pending++; break;
    case DL_DECIDE_ACCEPTED:
        c->st.accepted++;
        /* an absurd merged_version never reaches the staleness mean */
        if (a->merged_version > a->base_version && a->merged_version - a->base_version <= c->max_jump) {
            c->st.staleness_sum += a->merged_version - 1 - a->base_version;
            c->st.staleness_n++;
        }
        break;
    case DL_DECIDE_DROPPED: c->st.dropped_stale++; break;
    default: c->st.rejected++; break;
    }
    pthread_mutex_unlock(&c->mu);
    if (d == DL_DECIDE_REJECTED && !a->busy) {
        char r[NET_STR_CAP];
        DL_WARN("comms: push of fragment %d (base version %llu) rejected: %s", p, (unsigned long long)a->base_version,
                dl_comms_net_str(a->reason, r, sizeof r));
    }
    dl_event("ack", " learner=%s epoch=%llu fragment=%d base_version=%llu decision=%s merged_version=%llu", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)a->base_version, decision_name(a->decision),
             (unsigned long long)a->merged_version);
}
