/* Error feedback of a learner's encoded pushes: per fragment the residual
 * that the pushes the synchronizer took did not carry, and the rules that move it.
 *
 * A session (learner/comms.c) owns one dl_ef for the fragments it serves and
 * uses it only from its thread. Per fragment p it keeps two fp32 residuals
 * of numel_p floats, allocated at p's first push:
 *   committed_p  what the accepted pushes of p did not carry (zero at first)
 *   pending_p    the residual of p's push in flight, valid from its encode
 *                until its decision
 * A push of p encodes x = delta_p (base_p - theta_p, cumulative since the
 * adopt) with r = a copy of committed_p (kernels/codec.h: y = x + r, payload =
 * encode(y), r = y - decode(payload)) and keeps that r as pending_p. Then:
 *   ACCEPTED (its Update follows)   committed_p = pending_p
 *   REJECTED (busy or not)          committed_p unchanged: the progress stays
 *                                   in theta - base and the next cumulative
 *                                   push carries it again, as it carries r
 *   DROPPED_STALE, an Ack with rebase, any forced adopt of p (a Fetch reply,
 *   a rebase Update)                committed_p = 0: theta_p is overwritten,
 *                                   the progress (and what it owed) is gone
 *   except DROPPED_STALE and its rebase Update under adopt=keep: theta_p
 *   keeps what was trained after the dropped push (learner/node.c), so
 *   pending_p is forgotten and committed_p, owed by the accepted pushes,
 *   stays (dl_ef_forget; comms_uplink.c)
 *   no decision (a lost Ack released by the hold timeout, a new epoch, a
 *   push that did not leave)        committed_p unchanged
 * A push that replaces an earlier undecided push of p (a hold released by
 * timeout: the synchronizer replaces the pooled one) encodes again from
 * committed_p, so only the push the synchronizer keeps is ever committed. A
 * coalesced push that never left never touched either residual.
 *
 * Across a restart (learner/node.h "the node's state across a restart") the
 * node's saved state holds, per fragment, the residual a restarted session
 * starts from (dl_ef_snapshot, dl_ef_restore): committed_p, or pending_p while
 * p's push is undecided (a push in flight at a save is nearly always
 * ACCEPTED, and the restart cannot learn its fate; a refused one's progress
 * is lost at the kill anyway). The session thread moves the residuals and the
 * training thread takes the snapshot, so every call takes the dl_ef's lock.
 *
 * Under adopt=mix the adopt keeps alpha of the local progress made since the
 * push, not only what the push did not carry, so committed_p slightly
 * over-counts there (by at most alpha times the pushed progress's own
 * residual); overwrite and keep are exact. */
#ifndef DL_LEARNER_EF_H
#define DL_LEARNER_EF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/codec.h"

typedef struct dl_ef dl_ef;

/* P fragments of numel[p] floats (copied). on = 0: no residuals at all
 * (dl_ef_encode encodes x alone). Returns 0 or DL_EINVAL. */
int dl_ef_open(int P, const uint64_t *numel, int on, dl_ef **out);
void dl_ef_close(dl_ef **e); /* safe on NULL and twice */

/* Encode x (numel_p floats) of fragment p, a push on base_version, into out
 * (dl_codec_bytes(&enc->c, numel_p) bytes) with r = a copy of committed_p;
 * the resulting residual becomes pending_p (replacing any earlier one).
 * Returns 0 or kernels/codec.h's DL_EINVAL (a non-finite value: nothing
 * pending then). */
int dl_ef_encode(dl_ef *e, const dl_codec_enc *enc, int p, const float *x, uint64_t base_version, uint8_t *out);
/* The push of p on base_version was decided (DL_DECIDE_* of learner/mailbox.h)
 * and it was p's latest push; rebase: the Ack asked for a rebase. Applies the
 * rules above; a decision for another base than the pending push's leaves
 * committed_p as it is (only DROPPED/rebase still zero it). PENDING changes
 * nothing. */
void dl_ef_decided(dl_ef *e, int p, int decision, int rebase, uint64_t base_version);
/* A forced adopt of p is on its way (a Fetch reply, a rebase Update):
 * committed_p = 0, nothing pending. */
void dl_ef_reset(dl_ef *e, int p);
/* The pending push of p will get no decision that counts (it did not leave,
 * or its answer will never come): forget pending_p. */
void dl_ef_forget(dl_ef *e, int p);

/* committed_p, or NULL while it is zero (never pushed, reset) or off. */
const float *dl_ef_committed(const dl_ef *e, int p);
/* pending_p, or NULL when nothing is pending; *base (may be NULL) = its push's base_version. */
const float *dl_ef_pending(const dl_ef *e, int p, uint64_t *base);
/* The residual a restart of p should start from (see above) into out
 * (numel_p floats): 1 when copied, 0 when it is zero or residuals are off
 * (out untouched). Any thread. */
int dl_ef_snapshot(dl_ef *e, int p, float *out);
/* Before the session starts: committed_p = r (numel_p floats, copied),
 * nothing pending. Returns 1 when kept, 0 when residuals are off here (r is
 * dropped), DL_ENOMEM. */
int dl_ef_restore(dl_ef *e, int p, const float *r);
/* 1 when residuals are kept. */
int dl_ef_on(const dl_ef *e);

#endif
