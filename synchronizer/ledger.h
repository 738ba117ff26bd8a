/* The push ledger: every fragment-token a learner reports processing ends in
 * exactly one state. A pure bookkeeping module (no I/O, no clock): the
 * synchronizer forwards every fate of a push and every progress report to
 * it, and it hands back the store updates to persist in the next merge
 * transaction (or the final write at shutdown).
 *
 * Units: fragment-tokens. A push of fragment p reports the tokens behind its
 * delta since the learner's reference point for p, so a token a learner
 * trains on is counted once per fragment; a learner's processed
 * fragment-tokens are P x the tokens it reports in Heartbeat / Bye -- or,
 * for a shard of a sharded synchronizer, which settles only the fragments it
 * owns, (fragments owned) x those tokens (dl_ledger_set_fragments).
 *
 * States (storage/store.h DL_LEDGER_*): persisted ones are final --
 *   APPLIED        in a committed merge
 *   DROPPED_STALE  too stale; the learner rebased and dropped it
 *   REJECTED       refused with rebase: the learner threw it away
 *   LOST           its learner died or left before it was pushed, or a merge
 *                  failed after its learner had gone
 *   DISCARDED      thrown away by the learner itself (adopt overwrite / mix,
 *                  or a rebase), as the learner reports it
 *   OUTSTANDING    still pooled, carried or unpushed when the synchronizer
 *                  stopped
 * and two live ones, in memory only --
 *   POOLED         in the pool, waiting for its round (or in flight)
 *   CARRIED        refused without rebase (a full pool, bad values, a failed
 *                  merge): the push came back to the learner, which keeps the
 *                  progress (learner/node.h "Push fates"). Until the
 *                  learner's next push of the fragment arrives; then they
 *                  are in that push's tokens (the counters are cumulative),
 *                  or, where the learner threw them away later (an adopt
 *                  overwrite or mix), in the DISCARDED it reports. So CARRIED
 *                  tokens are the learner's unpushed ones again: they leave
 *                  CARRIED without a state of their own, and an account that
 *                  ends with some counts them as unpushed (LOST, or
 *                  OUTSTANDING at shutdown). The live figure may overlap
 *                  DISCARDED until that next push arrives.
 * A push that replaces the same learner's pooled push of the fragment
 * carries the older push's tokens (cumulative counters): the older one
 * leaves the pool without a state, so nothing is counted twice.
 *
 * Balance, per learner account (one learner process):
 *   processed = applied + dropped + rejected + discarded + pooled + carried + unpushed
 * where unpushed (>= 0; reports that lag a push are clamped and counted in
 * `overclaim`; CARRIED counts as unpushed once the account ends) becomes LOST
 * when the account ends by Bye, by a new
 * incarnation of the id, or at shutdown for a learner that is dead then, and
 * OUTSTANDING at shutdown otherwise.
 *
 * One synchronizer process keeps the accounts: a learner it meets mid-life
 * (its Hello says step > 0: the synchronizer restarted under it) is counted
 * from its first report on, and what it then pushes of progress from before
 * (the pushes the crashed predecessor had pooled, which the learner makes
 * again) is `carried_in`, not overclaim. The tokens a crashed synchronizer
 * had settled but not yet committed are not in any persisted state. */
#ifndef DL_SYNCHRONIZER_LEDGER_H
#define DL_SYNCHRONIZER_LEDGER_H

#include <stdint.h>

#include "storage/store.h"

typedef struct dl_ledger dl_ledger;

/* Totals, fragment-tokens: persisted states (indexed by DL_LEDGER_*), both
 * the ones already handed out by dl_ledger_take and the pending ones, plus
 * the live states. */
typedef struct {
    uint64_t state[DL_LEDGER_NSTATES];
    uint64_t pooled, carried;
    uint64_t processed; /* sum of every account's reported processed fragment-tokens */
    uint64_t overclaim; /* pushed beyond what was reported processed, clamped at account end */
    uint64_t carried_in; /* pushed by learners met mid-life (Hello step > 0, e.g. after this synchronizer
                          * restarted) beyond what they processed since: progress from before */
} dl_ledger_totals;

int dl_ledger_open(int max_learners, int P, dl_ledger **out);
void dl_ledger_close(dl_ledger **l); /* safe on NULL and twice */
/* Fragments whose pushes this ledger settles (1..P; P after open): a shard
 * owns n of them, so a learner's processed fragment-tokens are n x its
 * reported tokens. Call before the first report. */
void dl_ledger_set_fragments(dl_ledger *l, int n);

/* ---- progress reports. `tokens` is the learner's tokens processed since its
 * start (Heartbeat.tokens, Bye), `discarded` the fragment-tokens it reports
 * having thrown away, both cumulative for the process. */
/* A Hello. A learner whose reported step went backwards, or whose Hello is
 * from another process (`new_process`: its Hello.instance differs), is a new
 * process: the old account ends (its unpushed tokens LOST) and a new one
 * opens. A new process restarted from a saved state carries `carried`
 * fragment-tokens of the old one's unpushed progress (Hello.carried_tokens):
 * up to the old account's unpushed tokens move into the new account's
 * processed instead of LOST (a `ledger_carried` event), so its pushes of
 * them are counted once. The rest of the claim is progress the old process
 * trained but never reported (its heartbeats did not get through: a
 * partition, a kill): it counts as processed now, up to what the steps
 * between the old account's last report and the Hello's step can hold
 * (`step_tokens`: the fragment-tokens one step adds at most); when the old
 * account was met mid-life, as carried in (its progress from before this
 * synchronizer saw it is not this synchronizer's to count). A claim beyond
 * both stays unmoved: its pushes overclaim. A new process's reports count
 * its tokens from its own start (Heartbeat.tokens), whatever step it resumed
 * at; an account opened with step > 0 while none of the id was open is met
 * mid-life. */
void dl_ledger_hello(dl_ledger *l, int learner, uint64_t step, int new_process, uint64_t carried,
                     uint64_t step_tokens);
void dl_ledger_progress(dl_ledger *l, int learner, uint64_t step, uint64_t tokens, uint64_t discarded);
/* Bye: a last progress report, then the account ends (unpushed and
 * carried -> LOST). Pooled pushes stay pooled and still merge. */
void dl_ledger_bye(dl_ledger *l, int learner, uint64_t step, uint64_t tokens, uint64_t discarded);

/* The learner's slot is reclaimed (it left or died long ago, nothing of it
 * is pooled): its account ends as at a Bye and the slot's account is blank
 * for the next learner that gets the number. */
void dl_ledger_forget(dl_ledger *l, int learner);

/* ---- fates of one push of `fragment` by `learner` with `tokens` */
/* Arrival of a push, before its verdict: tokens carried for this fragment
 * leave CARRIED (this push carries them on, or the learner reported them
 * discarded). */
void dl_ledger_arrived(dl_ledger *l, int learner, int fragment, uint64_t base_version, uint64_t tokens);
/* Pooled; `replaced_tokens` > 0 when it replaced the learner's pooled push. */
void dl_ledger_pooled(dl_ledger *l, int learner, int fragment, uint64_t tokens, uint64_t replaced_tokens);
void dl_ledger_dropped_stale(dl_ledger *l, int learner, int fragment, uint64_t tokens);
/* Refused on arrival without rebase (a full pool, bad values, the policy):
 * carried by its next push. */
void dl_ledger_refused(dl_ledger *l, int learner, int fragment, uint64_t base_version, uint64_t tokens);
/* Refused on arrival with rebase (implausible counters, a norm outlier): the
 * learner throws the progress away: REJECTED. */
void dl_ledger_refused_rebase(dl_ledger *l, int learner, int fragment, uint64_t tokens);
/* A pooled push was merged and committed. Its APPLIED tokens went into the
 * merge's own transaction (the job's ledger delta, see round.h), so take
 * does not hand them out again. */
void dl_ledger_merged(dl_ledger *l, int learner, int fragment, uint64_t tokens);
/* A pooled push's round failed: carried by its next push (LOST if the
 * learner's account has ended). */
void dl_ledger_failed(dl_ledger *l, int learner, int fragment, uint64_t base_version, uint64_t tokens);

/* Shutdown: every open account ends, unpushed (and carried) tokens LOST for
 * learners not live (`live(ctx, learner)` == 0) and OUTSTANDING otherwise;
 * pooled tokens become OUTSTANDING. */
void dl_ledger_shutdown(dl_ledger *l, int (*live)(void *ctx, int learner), void *ctx);

/* Persisted-state changes since the last take, then zeroed: persist them in
 * the next store transaction. 1 when any is nonzero. */
int dl_ledger_take(dl_ledger *l, dl_store_ledger *delta);
/* Give back a delta whose transaction failed (it is persisted later). */
void dl_ledger_untake(dl_ledger *l, const dl_store_ledger *delta);
void dl_ledger_get_totals(const dl_ledger *l, dl_ledger_totals *out);

#endif
