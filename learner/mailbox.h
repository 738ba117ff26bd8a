/* The mailbox between a learner's training thread (learner/node.c) and its comms
 * sessions (learner/comms.c): per-fragment push and update slots, held versions, push fates, progress, bye.
 *
 * One mutex guards everything and is only ever held for a few pointer swaps
 * and counter updates (never across a zmq call or a copy of tensor data):
 *
 *   push slot p   (training -> session)  one queued push of fragment p; a
 *                 newer push of p on the same base replaces an unsent older
 *                 one (it contains the older progress), so at most P pushes
 *                 are ever queued; the node's posts never replace one on
 *                 another base (dl_mailbox_post_push_if).
 *   update slot p (session -> training)  the newest global fragment p
 *                 received and not yet adopted; an older version never
 *                 replaces a newer.
 *   fate of p     (session writes, training reads) whether the latest push of
 *                 p that left is still undecided: sent / pooled awaiting its
 *                 final Ack, or ACCEPTED with its Update not yet received.
 *                 The node holds p's next push while it is (the hold rule,
 *                 learner/node.h), so no progress is sent twice.
 *   fate of p for the node (session writes, training reads and clears) what
 *                 became of the latest push of p once it is decided:
 *                 ACCEPTED (merged: its Update follows) or RETURNED (its
 *                 progress is the learner's again: REJECTED without rebase,
 *                 never sent, or forgotten by a new epoch) -- the node keeps
 *                 a returned push's progress in its next delta (node.h
 *                 "Push fates"). A DROPPED_STALE or a REJECTED with rebase
 *                 leaves no fate: the forced Update that follows settles it.
 *   refusals of p (either side writes, the serving session reads) updates
 *                 of p refused since p's last adopt (non-finite, too far from
 *                 the learner's own parameters, an impossible version): each
 *                 one asks the serving session for a fresh fetch of p, which
 *                 it sends with a backoff that grows with the count.
 *
 * Buffers move by swapping pointers: every slot buffer and every buffer a
 * caller swaps in holds dl_mailbox_buf_numel() floats (the largest fragment).
 *
 * Sessions attach with their own wake-up eventfd (dl_mailbox_attach); every
 * post and bye writes to all of them. Each fragment is served by at most one
 * session. Without any session the mailbox is a plain data structure (tests
 * of learner/node.c drive it alone). */
#ifndef DL_LEARNER_MAILBOX_H
#define DL_LEARNER_MAILBOX_H

#include <stddef.h>
#include <stdint.h>

struct dl_plan;
typedef struct dl_mailbox dl_mailbox;

#define DL_MAILBOX_MAX_SESSIONS 16

/* Where a session stands (dl_comms_state, dl_mailbox_state). */
enum {
    DL_COMMS_IDLE = 0,    /* opened, not started */
    DL_COMMS_HELLO = 1,   /* waiting for Welcome (first hello or re-hello) */
    DL_COMMS_READY = 2,   /* welcomed: pushes flow */
    DL_COMMS_REFUSED = 3, /* the synchronizer sent a fatal Error; thread stopped */
    DL_COMMS_FAILED = 4,  /* local failure (socket, connect timeout); thread stopped */
    DL_COMMS_DONE = 5     /* Bye sent (or stopped); thread stopped */
};

/* Final decisions a session reports for a push (dl_mailbox_decide). */
enum { DL_DECIDE_PENDING = 1, DL_DECIDE_ACCEPTED = 2, DL_DECIDE_DROPPED = 3, DL_DECIDE_REJECTED = 4 };

/* Header of one queued push. The delta travels separately (a buffer swap). */
typedef struct {
    int fragment;
    uint64_t base_version; /* version_p the delta is relative to */
    uint64_t steps;        /* inner steps since adopting base_version, >= 1 */
    uint64_t tokens;       /* tokens over those steps, >= steps */
    double loss;           /* mean training loss over those steps (finite) */
    double compute_s;      /* wall seconds of those steps, >= 0 */
    int final;             /* part of the final flush */
    int held;              /* made late because the previous push of p was undecided (events only) */
} dl_mailbox_push;

/* A global fragment handed to the training thread. */
typedef struct {
    int fragment;
    uint64_t version;
    int forced; /* DL_UPDATE_* */
} dl_mailbox_update;

/* How an update must be adopted (dl_mailbox_update.forced). */
enum {
    DL_UPDATE_NORMAL = 0,  /* a merge result: adopt in the learner's mode when newer */
    DL_UPDATE_FETCHED = 1, /* reply to a Fetch: overwrite theta (a rebase), even if not newer */
    /* the global after an Ack with rebase (a DROPPED_STALE push, or a REJECTED one
     * whose base is unusable): a rebase like FETCHED (theta = g, counters 0),
     * even if not newer, so the dropped push's progress and counters leave
     * (the version may not have moved yet while a round is in flight) */
    DL_UPDATE_REBASE = 2,
    /* the rebase after a push DROPPED_STALE: as REBASE, except that a keep
     * learner carries what it trained after the dropped push onto g (a keep
     * adopt without the dropped push's progress, learner/node.c) */
    DL_UPDATE_STALE = 3
};

/* What became of a push, for the node (dl_mailbox_take_fate). */
enum { DL_FATE_NONE = 0, DL_FATE_ACCEPTED = 1, DL_FATE_RETURNED = 2 };

/* Mailbox-wide counters, monotonic. */
typedef struct {
    uint64_t coalesced;  /* queued pushes replaced by a newer push of the same fragment */
    uint64_t discarded;  /* queued pushes dropped because the learner had to rebase */
    uint64_t superseded; /* updates replaced in their slot by a newer one before the training thread took them */
    uint64_t returned;   /* pushes whose progress came back to the learner (DL_FATE_RETURNED) */
} dl_mailbox_stats;

/* What dl_mailbox_claim_push took, to undo it (dl_mailbox_unclaim_push). */
typedef struct {
    dl_mailbox_push h;
    int prev_open;
    uint64_t prev_base;
    int64_t prev_ns;
    /* a final push's Push.final_pending: the fragments with a push still to
     * leave once this one does -- owed by the final flush
     * (dl_mailbox_flush_owe) or queued, final or not -- ascending, in the
     * caller's buffer given to the claim (NULL: not wanted) */
    uint32_t *pending;
    int n_pending;
} dl_mailbox_claim;

/* Allocate P push and update slots and their buffers. `plan` is borrowed.
 * Returns 0, DL_EINVAL (no plan) or DL_ENOMEM. */
int dl_mailbox_open(const struct dl_plan *plan, dl_mailbox **out);
/* Free everything; NULLs the pointer; safe on NULL and twice. Sessions
 * attached must be closed first. */
void dl_mailbox_close(dl_mailbox **m);
int dl_mailbox_P(const dl_mailbox *m);
/* Floats every swapped buffer must hold (the plan's largest fragment). */
size_t dl_mailbox_buf_numel(const dl_mailbox *m);
/* A buffer of dl_mailbox_buf_numel() floats, for swapping; free() it. NULL when out of memory. */
float *dl_mailbox_buf_alloc(const dl_mailbox *m);

/* ---- training-thread side (never blocks on the network) */

/* Queue a push: swaps *delta with the slot's buffer (first fragment_numel
 * floats the fp32 delta). Wakes the sessions. Returns 1 when an unsent push
 * of the same fragment was replaced (coalesced), else 0. */
int dl_mailbox_post_push(dl_mailbox *m, const dl_mailbox_push *h, float **delta);
/* Pushes of p claimed by sessions so far (dl_mailbox_claim_push). */
uint64_t dl_mailbox_claims(dl_mailbox *m, int p);
/* dl_mailbox_post_push, unless a push of p was claimed since the caller read
 * dl_mailbox_claims = `claims` and the slot is empty (the hold rule's check,
 * dl_mailbox_undecided, saw that push queued, so decided, but it is on its
 * way now and the new push would carry its progress again; UINT64_MAX = no
 * such check), or the queued push is on another base version (the new one
 * does not contain its progress: it must leave first). Returns -1 then
 * (nothing posted, *delta untouched). dl_mailbox_post_push replaces a queued
 * push whatever its base. */
int dl_mailbox_post_push_if(dl_mailbox *m, const dl_mailbox_push *h, float **delta, uint64_t claims);
/* Take the fate of p's latest decided push, if one is waiting: returns
 * DL_FATE_* (NONE when none) and that push's base_version in *base. A newer
 * fate replaces an unread older one (only the latest push is tracked). */
int dl_mailbox_take_fate(dl_mailbox *m, int p, uint64_t *base);
/* Take the pending update of p, if any: swaps *buf with the slot's buffer
 * and fills *u. Taking a forced update also drops a queued push of p (its
 * base is no longer usable). Returns 1 if taken, 0 if none was waiting. */
int dl_mailbox_take_update(dl_mailbox *m, int p, float **buf, dl_mailbox_update *u);
/* The node's adopted version of p, for re-hello held_versions. */
void dl_mailbox_set_held(dl_mailbox *m, int p, uint64_t version);
/* Values for Heartbeat and Hello.step. */
void dl_mailbox_set_progress(dl_mailbox *m, uint64_t step, uint64_t tokens, double steps_per_s);
/* The node threw away `tokens` fragment-tokens of fragment p (an adopt):
 * kept per fragment, so each session reports those of its own fragments
 * (Heartbeat/Bye.discarded_tokens: a shard's ledger settles only its own). */
void dl_mailbox_add_discarded(dl_mailbox *m, int p, uint64_t tokens);
/* Fragment-tokens of p a restored state carries from an earlier process
 * (learner/node.h dl_node_state_restore): every Hello sends the sum over its
 * session's fragments (Hello.carried_tokens), so the ledger moves them from
 * the killed process's account to this one's instead of counting them LOST. */
void dl_mailbox_set_carried(dl_mailbox *m, int p, uint64_t tokens);
uint64_t dl_mailbox_carried(dl_mailbox *m, int p);
/* The push journal's claim counters (learner/node.h): from now on every
 * claim of a push of p writes base[p] + the claims so far (8 bytes at
 * offset + 8p of fd, from the session's thread); fd -1: none. */
void dl_mailbox_set_claims_journal(dl_mailbox *m, int fd, int64_t offset, const uint64_t *base);
uint64_t dl_mailbox_claims_total(dl_mailbox *m, int p); /* base[p] + claims of p */
int dl_mailbox_queued(dl_mailbox *m, int p); /* 1 when a push of p is queued, not yet claimed by a session */
/* 1 when the latest push of p that left is undecided, or an update of p
 * waits in its slot; 2 when it was ACCEPTED and its Update has not come;
 * *since_ns (may be NULL) = when that push was sent (dl_clock_ns), 0 when
 * only an update waits. */
int dl_mailbox_undecided(dl_mailbox *m, int p, int64_t *since_ns);
/* A Welcome said the global version of p is `version` (session): when that
 * is newer than the adopted one, p is behind until an adopt reaches it
 * (dl_mailbox_set_held); 0 or an older version clears it. UINT64_MAX: not
 * known (a re-hello), behind until the Welcome says. */
void dl_mailbox_set_behind(dl_mailbox *m, int p, uint64_t version, int64_t now_ns);
/* 1 while p is behind (above), *since_ns = when the Welcome said so. A keep
 * learner holds its next push of p meanwhile (learner/node.c hold_state). */
int dl_mailbox_behind(dl_mailbox *m, int p, int64_t *since_ns);
/* The final flush owes a push of p (owed 1) or no longer does (0: it has
 * nothing left of p). A session's claim of a final push of p clears it (that
 * push is on its way; taking it unsent too). With the queued pushes, what a
 * final push tells the synchronizer it will still wait for
 * (Push.final_pending, dl_mailbox_claim.pending). */
void dl_mailbox_flush_owe(dl_mailbox *m, int p, int owed);
/* Fragments whose latest push has no known fate yet: still queued, or sent
 * and not decided by an ACCEPTED (and its Update), DROPPED_STALE or
 * REJECTED. 0 when a final flush is complete. */
int dl_mailbox_flush_pending(dl_mailbox *m);
/* Ask every session to send Bye{reason, step} (when it has one) and stop. */
void dl_mailbox_bye(dl_mailbox *m, const char *reason, uint64_t step);
/* The sessions' combined state: REFUSED or FAILED if any is, else IDLE when
 * none is attached or one is idle, else HELLO if one waits for a Welcome,
 * else DONE if one is done, else READY; msg gets the first message. */
int dl_mailbox_state(dl_mailbox *m, char *msg, size_t cap);
/* H from the last Welcome of any session, 0 before the first. */
uint32_t dl_mailbox_h(dl_mailbox *m);
/* 1 when the policy of the last Welcome of any session is a barrier
 * (`sync`, `sync-elastic`): the node then stops training while a due push
 * waits for its predecessor's decision (dl_node_barrier_wait); 0 before the
 * first Welcome and under `decoupled`. */
int dl_mailbox_barrier(dl_mailbox *m);
void dl_mailbox_get_stats(dl_mailbox *m, dl_mailbox_stats *out);

/* ---- session side (public so tests can play a session without a socket) */

/* Register a session waking on eventfd `wake_fd`. Returns its link number
 * (>= 0) or DL_EINVAL when DL_MAILBOX_MAX_SESSIONS are attached. */
int dl_mailbox_attach(dl_mailbox *m, int wake_fd);
void dl_mailbox_detach(dl_mailbox *m, int link);
/* Publish a session's state (msg NULL: keep the old one) and H (0: keep). */
void dl_mailbox_set_link(dl_mailbox *m, int link, int state, uint32_t h, const char *msg);
/* A session received something from its synchronizer (a message, even one
 * it refused): the synchronizer answers. dl_mailbox_heard_ns is the
 * monotonic time (dl_clock_ns) of the latest, 0 before any. The node waits
 * for the initial fetch as long as the synchronizer answers. */
void dl_mailbox_heard(dl_mailbox *m);
int64_t dl_mailbox_heard_ns(dl_mailbox *m);
/* A Welcome's policy (Welcome.policy; NULL or unknown: not a barrier), for
 * dl_mailbox_barrier. */
void dl_mailbox_set_policy(dl_mailbox *m, const char *policy);
/* 1 when a bye was asked for: reason and step copied out. */
int dl_mailbox_bye_asked(dl_mailbox *m, char *reason, size_t cap, uint64_t *step);
/* Progress for Heartbeat, Hello and Bye, read at once: step, tokens and
 * steps_per_s of the learner, and the discarded fragment-tokens summed over
 * the n fragments frags[] (NULL: all P). Any output may be NULL. */
void dl_mailbox_progress(dl_mailbox *m, const int *frags, int n, uint64_t *step, uint64_t *tokens,
                         double *steps_per_s, uint64_t *discarded_tokens);
/* Held version of p into *v; returns whether p is held. */
int dl_mailbox_held(dl_mailbox *m, int p, uint64_t *v);

/* Take the queued push of p without sending it (tests). Returns 1 if one was. */
int dl_mailbox_take_push(dl_mailbox *m, int p, dl_mailbox_push *h, float **delta);
/* Take the queued push of p to send it: as take_push, and from here on it is
 * the latest push of p, undecided, sent at now_ns (so flush_pending never
 * misses a push between its slot and the socket). Nothing is claimed while
 * a forced update of p waits (the push's base is being abandoned). A final
 * push's claim lists in `pending` (P entries, or NULL) the other fragments
 * the flush still owes or with a push queued (c->pending, c->n_pending). */
int dl_mailbox_claim_push(dl_mailbox *m, int p, int64_t now_ns, uint32_t *pending, dl_mailbox_claim *c,
                          float **delta);
/* The claimed push did not leave: restore p's fate; with requeue put it back
 * in the slot unless a newer push arrived meanwhile (then counted coalesced);
 * without, it is RETURNED to the node (its progress goes into the next push). */
void dl_mailbox_unclaim_push(dl_mailbox *m, int p, const dl_mailbox_claim *c, float **delta, int requeue);
/* The claimed push of p (base_version) has left whole, now_ns: a chunked
 * one takes a while, and its undecided time (the node's hold release)
 * counts from its last chunk, not from the claim. */
void dl_mailbox_push_left(dl_mailbox *m, int p, uint64_t base_version, int64_t now_ns);
/* An Ack of p echoing base_version: DL_DECIDE_*. The first immediate answer
 * (PENDING / DROPPED / REJECTED) after the send is the push's own (one push
 * per fragment in flight); a pooled push is decided by an ACCEPTED or
 * REJECTED echoing its base_version. Returns 1 when it decided the latest
 * push. With update_follows (an ACCEPTED, or a DROPPED with rebase) the push
 * stays undecided for the hold rule until that Update is in the slot: a push
 * made before a rebase is adopted would report the dropped tokens again. */
int dl_mailbox_decide(dl_mailbox *m, int p, int decision, uint64_t base_version, int update_follows);
/* The Update that the ACCEPTED just decided for p announced brings `version`
 * (Ack.merged_version): until an Update of at least that version is offered,
 * p stays undecided (an older one crossing the Ack is not it). */
void dl_mailbox_await_version(dl_mailbox *m, int p, uint64_t version);
/* Offer a received global fragment (numel floats, any alignment) to update
 * slot p: kept when newer than a waiting one, or forced. Clears "Update
 * awaited" for p when its version is at least the awaited one. Returns 1 if
 * stored, 0 if a newer update already waits. */
int dl_mailbox_put_update(dl_mailbox *m, int p, uint64_t version, int kind, const void *data, size_t numel);
/* Forget the fates of the pushes of these fragments (their answers will not
 * come: a new epoch, DL_ENOTFOUND): a push still sent or pooled is RETURNED
 * to the node; an ACCEPTED one still awaits its Update (the session fetches
 * the newer version the next Welcome announces). frags NULL = all. */
void dl_mailbox_forget_sent(dl_mailbox *m, const int *frags, int n);
/* The latest push of p that left and is undecided: 1 sent (no answer yet), 2 pooled (MERGED_PENDING), its
 * base_version in *base; 0 when there is none. */
int dl_mailbox_open_push(dl_mailbox *m, int p, uint64_t *base);
/* Drop the queued push of p (must_fetch). Returns 1 if one was dropped. */
int dl_mailbox_discard_queued(dl_mailbox *m, int p);
/* An Update of p arrived and was dropped as out of date (a version below the
 * held one): it still was the Update an ACCEPTED announced, so the push stops
 * waiting for it (as dl_mailbox_put_update would). */
void dl_mailbox_update_seen(dl_mailbox *m, int p);

/* ---- refused updates (either side) */

/* The update of p just received (session) or taken (training thread) was
 * refused and not adopted: count a consecutive refusal of p and ask the
 * serving session for a fresh fetch of p (wakes the sessions). The count
 * restarts at the next dl_mailbox_set_held of p (an adopt). Returns it. */
int dl_mailbox_refuse_update(dl_mailbox *m, int p);
/* Session: take the fetch requests of the n fragments frags[]: refusals[i] =
 * the consecutive refusals of frags[i] when a fetch of it was asked for
 * since the last call, else 0. Returns how many were asked for. */
int dl_mailbox_take_refetches(dl_mailbox *m, const int *frags, int n, int *refusals);

#endif
