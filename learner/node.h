/* The training-thread side of a networked learner: per-fragment base copies
 * and versions, counters since adopt, push creation, adopt modes, initial fetch wait and final flush.
 *
 * A node reads and writes the learner's parameters (theta) only through a
 * parameter interface (dl_node_model, below), one fragment at a time, so the
 * same logic serves a model in a host buffer and one on a GPU. It talks only
 * to the mailbox (learner/mailbox.h), never to a session or socket, so nothing here
 * blocks on the network except the explicit waits (dl_node_wait_ready
 * before training, dl_node_barrier_wait under a barrier policy, dl_node_finish
 * after it).
 *
 * Per fragment p it keeps:
 *   base_p     the global fragment last adopted (fp32, numel_p floats)
 *   version_p  its version
 *   steps_p, tokens_p, loss_p, compute_p   inner steps, tokens, summed training loss and wall seconds
 *              since the reference point of the next delta (the adopt; in
 *              keep mode, see below)
 * A push of p is delta_p = base_p - theta_p with steps_p / tokens_p.
 *
 * Adopt of global g with version v for p (dl_node_adopt), at a step boundary,
 * each mode one call apply(a, b, in): theta_p = a*theta_p + b*in:
 *   ignored    when p is held, the update is not forced and v <= version_p
 *   rebase     forced (a fetch reply, or the Update after an Ack with rebase:
 *              DL_UPDATE_FETCHED / DL_UPDATE_REBASE) or p not held yet:
 *              theta_p = g, counters 0 (apply(0, 1, g))
 *   overwrite  theta_p = g, counters 0 (apply(0, 1, g))
 *   mix        theta_p = alpha*theta_p + (1-alpha)*g, counters 0
 *              (apply(alpha, 1-alpha, g))
 *   keep       theta_p = theta_p + (g - ref_p), where ref_p is theta_p at the
 *              last push of p, or the global adopted last if there was no
 *              push since; counters become those since ref_p (progress made
 *              since the push is kept and still counted) (apply(1, 1, g - ref_p))
 * and then base_p = g, version_p = v, ref_p = g (keep, while the last push is
 * undecided: ref_p = g + (ref_p - base_p), see "Push fates").
 *
 * Push fates (no progress lost to a refusal): the mailbox tells the node what
 * became of p's latest push (dl_mailbox_take_fate, read before any update in
 * dl_node_poll and at dl_node_after_step): ACCEPTED, or RETURNED (REJECTED
 * without rebase -- a full pool, bad values, a failed merge --, a push that
 * never left, one a new epoch forgot). A returned push's progress is the
 * learner's again and goes into its next delta with its counters:
 *   not yet adopted over   keep: ref_p = base_p, counters at the push 0, so
 *                          the next adopt keeps it; overwrite / mix: the next
 *                          adopt counts it discarded (tokens_posted = 0)
 *   a NORMAL keep adopt    took it out of theta_p (g - ref_p); ref_p - base_p
 *   came first             still holds it: theta_p += ref_p - base_p,
 *                          counters of the push added back
 *   an overwrite, mix or   it is gone: counted in discarded_tokens
 *   rebase came first
 * An ACCEPTED push after a keep adopt sets ref_p = base_p (its Update brings
 * the progress). A DROPPED_STALE or a REJECTED with rebase has no fate: the
 * forced Update that follows rebases. During dl_node_finish a returned final
 * push is owed again (DL_NODE_FLUSH_RETRIES times at most). The ledger (synchronizer/ledger.h) counts a returned
 * push's tokens CARRIED until the next push of p arrives.
 *
 * Trust (an update comes from the network): before any of the above, an
 * update that is not ignored is refused when it holds a non-finite value or,
 * with update_max_ratio r > 0, when it is too far from the learner's own
 * parameters:  ||g - own||_2 > r * (||own||_2 + DL_NODE_RATIO_FLOOR_RMS * sqrt(numel_p)),
 * own = base_p when p is held (the global last adopted: a merge moves it by
 * one outer step, a rebase by what the run trained since), else theta_p (a
 * fresh learner's seeded init). The floor lets a fragment whose own values
 * are all zero (biases at init) be fetched. A refused update changes
 * nothing (theta, base, version, counters), is counted in `refused`, logged,
 * written as an `update_refused` event, and asks the serving session for a
 * fresh fetch of p (dl_mailbox_refuse_update; the session backs off).
 *
 * Deferred pushes (a model with deferred = 1, e.g. a GPU): when p is due after
 * step s, dl_node_after_step only starts the read of theta_p (read_begin) and
 * snapshots the counters; the push is completed (read_end, delta = base_p -
 * snapshot, post, keep-mode ref_p = snapshot) at the start of the next
 * dl_node_after_step, so the device-to-host copy overlaps training step s+1.
 * Anything that needs fragment p earlier (dl_node_adopt, dl_node_delta,
 * dl_node_flush, dl_node_complete, dl_node_finish) completes it first; a
 * forced update (rebase) drops it instead, as the mailbox drops a queued push
 * of a base that is no longer usable. A deferred push is thus the push a
 * non-deferred node makes, with the counters of the step it was snapshotted
 * at, posted one step later.
 *
 * The hold rule (no progress sent twice): delta and counters are cumulative
 * since the reference point, so a push of p made while the previous push of
 * p is undecided (sent and not yet answered by ACCEPTED and its Update,
 * DROPPED_STALE or REJECTED; or an update of p waiting in the mailbox)
 * would carry that push's progress again. When p is due then, the node
 * makes no push (ref_p and the counters stay) and owes it: it is made at the
 * first step boundary (dl_node_after_step) after the decision came and the
 * update was adopted, with everything since the reference point. A
 * decision that never comes (a lost Ack) releases the hold after
 * push_decision_timeout_ms (counted in hold_released, warned); an ACCEPTED
 * whose Update does not come, after DL_NODE_ACCEPTED_HOLD_X times that (its
 * progress is merged: a push on its base would carry it again). The check
 * and the post are one step for the mailbox (dl_mailbox_post_push_if): a
 * push the check saw queued, and so decided, that a session claims before
 * the next push is posted makes that one owed instead. A deferred
 * push is begun only when p is not held. The final flush holds the same way,
 * bounded by the flush timeout (dl_node_finish).
 *
 * Encoded pushes (error feedback): the node always posts the fp32 delta; a
 * session encodes it when it claims the push (dl_comms_opts.push_codec) and
 * keeps, per fragment, the residual the encodings did not carry
 * (learner/ef.h has the rules: ACCEPTED commits the push's residual,
 * REJECTED keeps the committed one, DROPPED_STALE / a rebase / a fetch
 * reply zero it). Nothing here changes: a push the hold rule releases by
 * timeout replaces the undecided one and is encoded again from the
 * committed residual; under mix the adopt keeps alpha of the local progress
 * since the push, so the residual slightly over-counts there.
 *
 * Delta Updates: a session that gets them (Welcome.update_codec) applies
 * them onto its own mirror of the fragment and hands the node full fp32
 * values, so base_p is bit for bit the synchronizer's global.
 *
 * Barrier (the Welcome's policy is `sync` or `sync-elastic`,
 * dl_mailbox_barrier): the synchronous baselines must be the synchronous
 * training they stand for, so a held push stops training instead of being
 * owed while it goes on. dl_node_barrier_wait, called between steps, waits
 * while some owed push is still held (dl_node_barrier_blocked): it polls and
 * adopts, and makes each owed push as soon as its predecessor is decided
 * (before the next step, whether or not it had to wait; one whose adopt
 * reset the counters has nothing to send and is dropped). The decision timeout releases it as it releases a
 * hold, so a lost Ack never deadlocks. Under `decoupled` nothing waits. */
#ifndef DL_LEARNER_NODE_H
#define DL_LEARNER_NODE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "learner/mailbox.h"

struct dl_plan;
typedef struct dl_node dl_node;

enum { DL_ADOPT_OVERWRITE = 0, DL_ADOPT_MIX = 1, DL_ADOPT_KEEP = 2 };

/* The parameter interface: theta, fragment by fragment, wherever it lives.
 * Every call comes from the training thread between training steps; `p` is a
 * fragment of the node's plan and payloads are in fragment order
 * (dl_plan_gather). Functions return 0 or a negative DL_E* code. */
typedef struct {
    void *ctx;
    /* 1: read_begin may be asynchronous and the node completes pushes one
     * step later (see above); 0: read_end right after read_begin. */
    int deferred;
    /* Snapshot theta_p as it is now (after the completed step); may return
     * before the copy finished. */
    int (*read_begin)(void *ctx, int p);
    /* Wait for the snapshot of the last read_begin(p); *theta = host pointer to
     * numel_p floats, valid until the next read_begin(p). */
    int (*read_end)(void *ctx, int p, const float **theta);
    /* theta_p = a*theta_p + b*in (as dl_cpu_axpby: a == 0 does not read
     * theta_p), in = numel_p host floats. May be asynchronous, but `in` is
     * copied before it returns and every later read_begin sees the result. */
    int (*apply)(void *ctx, int p, float a, float b, const float *in);
} dl_node_model;

/* The host implementation over a parameter buffer (dl_plan_gather/scatter):
 * reads are synchronous gathers into a per-fragment snapshot; with deferred
 * = 1 the node still completes pushes a step later (for tests of that logic
 * without a GPU). `plan` and `params` are borrowed. */
int dl_node_host_model_open(const struct dl_plan *plan, float *params, int deferred, dl_node_model **out);
void dl_node_host_model_close(dl_node_model **m); /* safe on NULL and twice */

typedef struct {
    const struct dl_plan *plan; /* borrowed */
    float *params;              /* theta in a host buffer (borrowed): the node uses its own
                                 * non-deferred host model over it; NULL: use `model` */
    const dl_node_model *model; /* borrowed; used when params is NULL */
    int adopt;                  /* DL_ADOPT_* */
    float alpha;                /* mix: weight of the local theta, in [0, 1] */
    int push_decision_timeout_ms; /* release a held push after this wait for the previous one's decision;
                                   * 0 = 30000; < 0 = at once (only an update waiting in the mailbox holds) */
    double update_max_ratio;      /* refuse an update farther than this from the learner's own parameters
                                   * (see "Trust" above); 0 = no distance bound (finiteness is always checked);
                                   * dloco-learner's row update_max_ratio, default 10 */
    /* Sync timing (docs/SYNC_TIMING.md): when set, whether held fragment p is due after `step` is
     * due(due_ctx, step, p, H) instead of dl_plan_due(step, p, H, P); called exactly once per held fragment
     * per dl_node_after_step, in fragment order, with the H the node was called with (the nominal period).
     * A 1 is a push decision: the push is made, or owed under the hold rule, as a scheduled one is.
     * NULL: dl_plan_due, the fixed staggered schedule. */
    int (*due)(void *due_ctx, int64_t step, int p, int H);
    void *due_ctx;
} dl_node_opts;

/* A push ACCEPTED whose Update has not come is released after this many
 * push_decision_timeout_ms (see "The hold rule"). */
#define DL_NODE_ACCEPTED_HOLD_X 4

/* How often dl_node_finish sends a returned final push of a fragment again. */
#define DL_NODE_FLUSH_RETRIES 3

/* Per-element RMS floor of the distance bound (see "Trust" above). */
#define DL_NODE_RATIO_FLOOR_RMS 0.1

typedef struct {
    uint64_t pushes;    /* pushes handed to the comms thread (flush included) */
    uint64_t coalesced; /* of those, how many replaced an unsent push of the same fragment */
    uint64_t flushed;   /* pushes of the final flush */
    uint64_t adopted;   /* updates adopted (rebases included) */
    uint64_t rebased;   /* of those, forced / first-time adoptions (theta overwritten) */
    uint64_t ignored;   /* updates not newer than the held version */
    uint64_t dropped;   /* deferred pushes dropped unposted because a forced update came first */
    uint64_t discarded_tokens; /* fragment-tokens thrown away by adopts (rebase, overwrite, mix): trained
                                * after the fragment's last push and not kept; reported to the ledger */
    uint64_t held;      /* due pushes held because the previous push of the fragment was undecided */
    uint64_t held_due;  /* scheduled pushes folded into a held (owed) one: >= held, one per due step */
    uint64_t hold_released; /* holds released because a decision did not come in time (or the flush ran out of time) */
    uint64_t refused;   /* updates refused: non-finite, or beyond update_max_ratio (never adopted) */
    uint64_t returned;  /* pushes whose progress came back (REJECTED without rebase, unsent, forgotten) */
    uint64_t barrier_waits; /* waits of dl_node_barrier_wait (barrier policies only) */
    double barrier_wait_s;  /* wall seconds spent in them */
    uint64_t steps_behind_max; /* now (not a counter): the most inner steps any held fragment has trained since
                                * the reference point of its next delta (its adopted base): the adopt lag in steps */
} dl_node_stats;

/* One wait at the barrier (dl_node_barrier_wait). */
typedef struct {
    int fragment;     /* the (lowest) fragment whose held push started the wait; -1 when none */
    double waited_s;  /* wall seconds waited */
    const char *end;  /* static: "decided" (every held push decided and its update adopted), "released" (some
                       * hold released by push_decision_timeout_ms), "signal" (*stop), "comms" (a session
                       * REFUSED or FAILED) */
} dl_node_barrier;

/* Allocates base copies (one model's worth) and, in keep mode, reference
 * copies (another). `mb` is the mailbox, borrowed. Returns 0, DL_EINVAL
 * (also for update_max_ratio negative or not finite) or DL_ENOMEM.
 *
 * Every function below that touches theta returns a negative DL_E* code when
 * the parameter interface fails (a GPU error); the node is unusable then. */
int dl_node_open(const dl_node_opts *o, dl_mailbox *mb, dl_node **out);
void dl_node_close(dl_node **n); /* safe on NULL and twice */

/* After completed inner step `step` (1-based) of `tokens` tokens, training
 * loss `loss` and `compute_s` wall seconds: deferred pushes of the previous
 * step are completed, counters of every held fragment grow, then every
 * fragment with dl_plan_due(step, p, H, P) (or opts.due) or an owed push gets a push
 * (deferred: begun) unless the hold rule holds it. Returns the number of
 * pushes made or begun for this step. */
int dl_node_after_step(dl_node *n, int64_t step, int H, uint64_t tokens, double loss, double compute_s);
/* Step boundary: take every waiting update from the mailbox and adopt it.
 * Returns the number adopted. Never blocks on the network. */
int dl_node_poll(dl_node *n);
/* Under a barrier policy (see "Barrier" above): the lowest fragment whose
 * owed push the hold rule still holds (not yet released by the decision
 * timeout), else -1; always -1 under `decoupled`. Counts nothing. */
int dl_node_barrier_blocked(dl_node *n);
/* Between steps, under a barrier policy: make the owed pushes whose
 * predecessor is decided; then, when dl_node_barrier_blocked, wait until it
 * is not (owed pushes made as their predecessors are decided; deferred
 * pushes completed first), *stop becomes nonzero (may be NULL) or a session is REFUSED or
 * FAILED (the caller reads dl_mailbox_state). Polls every 2 ms. Returns 0 when
 * there was nothing to wait for, 1 after a wait (*out filled, counted in
 * barrier_waits / barrier_wait_s), or the parameter interface's error. */
int dl_node_barrier_wait(dl_node *n, const volatile sig_atomic_t *stop, dl_node_barrier *out);
/* Complete every deferred push now. Returns the number posted. */
int dl_node_complete(dl_node *n);
/* Complete deferred pushes, then push every held fragment with steps_p > 0,
 * marked final (regardless of the schedule), except those the hold rule
 * holds: they are owed (dl_node_flush_owed) and dl_node_finish pushes them
 * once decided. Returns the number of final pushes made. */
int dl_node_flush(dl_node *n);
/* Fragments whose final push is still owed. */
int dl_node_flush_owed(dl_node *n);

/* Adopt global fragment p (numel_p floats) at `version` as described above;
 * `forced` is a DL_UPDATE_* kind: FETCHED (a fetch reply) and REBASE (after
 * an Ack with rebase: a dropped push, or one rejected on an unusable base)
 * are the rebase (theta_p = g, counters 0, even if not newer; a deferred
 * push of p is dropped), NORMAL is adopted in the node's mode only when newer. Returns 1 when adopted, 0 when ignored
 * or refused (see "Trust" above; counted in ignored / refused). */
int dl_node_adopt(dl_node *n, int p, uint64_t version, int forced, const float *global);
/* delta = base_p - theta_p into out (numel_p floats), without pushing
 * (a deferred push of p is completed first). Returns 0. */
int dl_node_delta(dl_node *n, int p, float *out);

/* Before training: poll until every fragment is held (the initial fetch).
 * Returns 0; DL_ETIMEDOUT once the synchronizer has not been heard for
 * timeout_ms (dl_mailbox_heard_ns; counted from the call before anything is
 * heard; timeout_ms < 0: no bound): a synchronizer that keeps answering, even with Updates the learner
 * refuses, is waited for, its refetches backing off; DL_EAGAIN when *stop became
 * nonzero; DL_EPROTO when the synchronizer refused the learner (fatal
 * Error) or DL_ENET when the comms failed (no Welcome, socket): dl_errmsg()
 * carries the reason; or the parameter interface's error. Polls every 2 ms. */
int dl_node_wait_ready(dl_node *n, int timeout_ms, const volatile sig_atomic_t *stop);
/* After training: final flush, wait (adopting updates, making held final
 * pushes once their predecessor is decided) until every push sent has its
 * final answer (dl_mailbox_flush_pending() == 0) or flush_timeout_ms passed
 * (held final pushes still owed then are sent anyway), then ask the
 * sessions to send Bye{reason, step}. Returns the
 * number of fragments with unanswered pushes (0 = complete flush), or the
 * parameter interface's error (Bye is still requested). */
int dl_node_finish(dl_node *n, int flush_timeout_ms, uint64_t step, const char *reason);

/* ---- the node's state across a restart (docs/FAILURE_MODEL.md "Kills")
 *
 * A learner killed and restarted from a saved state (its parameters, and for
 * dloco-learner its optimizer) keeps the progress it had not pushed when the
 * node's state is saved with the parameters, at the same step boundary. Per
 * fragment the state holds the version it holds and the base its progress
 * is measured from -- theta_p - base_p is what its next push carries, with
 * the counters since that base -- so a push whose fate was undecided at the
 * save (posted, or accepted with its Update still to come) is left to the
 * synchronizer: keep mode measures from the theta at that push (ref_p),
 * exactly as its adopt would. Overwrite and mix keep no ref_p: a fragment
 * pushed since its adopt carries nothing (its base becomes theta_p at the
 * restore).
 *
 * A save is taken at one step and the kill comes later: what the node did
 * to a fragment after the save must not be carried again. The push journal
 * says it: a small file (8 bytes per fragment, written at once with pwrite,
 * no fsync: a process kill keeps the page cache) holding, per fragment, a
 * counter bumped at every push posted and every adopt that threw progress
 * away (overwrite, mix, rebase), and after them, per fragment, the count of
 * pushes a session claimed (written from the session's thread). A fragment
 * whose journal counter differs from the state's carries nothing after the
 * restore (its pushes after the save took that progress; the synchronizer
 * accounts for them). A push posted but still queued at the save (it had
 * not left: a busy synchronizer's retry, a connection down) is carried with
 * the rest unless its claim counter moved after the save. An OS crash
 * can lose the journal's last writes: at most one push per fragment may
 * then be carried twice.
 *
 * Encoded pushes: the state also holds each fragment's error feedback
 * residual (learner/ef.h dl_ef_snapshot: the committed one, or the residual
 * of a push undecided at the save, taken as accepted), restored when the
 * journal agrees; otherwise it starts at zero (at most one quantum per
 * element of what the accepted pushes owed is lost). */

/* The error feedback residuals of fragment p live in its session (learner/ef.h):
 * with one attached (before a save, before a restore) the state holds p's
 * residual, so a restarted session's first encoded push carries what the
 * killed process's accepted pushes still owed. NULL detaches. Before the
 * sessions start. */
struct dl_ef;
void dl_node_set_ef(dl_node *n, int p, struct dl_ef *ef);
/* Bytes a saved state of this node takes at most (its attached residuals
 * included): the buffer dl_node_state_copy needs. */
size_t dl_node_state_bytes(const dl_node *n);
/* Bytes a saved state of this model may take (any fragment's residual
 * included): the most a reader reads. */
size_t dl_node_state_max_bytes(const dl_node *n);
/* Copy the state into buf (dl_node_state_bytes bytes) at step boundary
 * `step`, tagged with the model fingerprint and `tag` (the run and learner:
 * a state of another run or learner is refused at the restore); *len = the
 * bytes written (fragments with a zero residual save none). Training
 * thread, between steps; reads no parameters (residuals: under their lock).
 * Returns 0. */
int dl_node_state_copy(const dl_node *n, uint64_t fingerprint, uint64_t tag, uint64_t step, void *buf, size_t *len);
/* What a restore found. */
typedef struct {
    uint64_t carried;      /* fragment-tokens of unpushed progress carried */
    int format;            /* the file's format: 1 (written before residuals were saved: none restored), 2 */
    int residuals;         /* fragments whose error feedback residual was restored */
    int residuals_dropped; /* saved residuals not restored: the fragment was pushed after the save (the journal
                            * moved), or this learner keeps no residuals (fp32 pushes, error_feedback off) */
} dl_node_restored;
/* Restore a saved state, after dl_node_open (and dl_node_set_ef) and before
 * the sessions start (the Hello then says the versions held and the carried
 * tokens). `journal` is the push journal read back ([2P] counters, or NULL
 * when there is none: nothing is carried then), `journal_n` its entries (a
 * short journal counts as changed). Every fragment ends held at its saved
 * version; those whose journal agrees carry their progress (base_p and
 * counters as saved) and their residual, the others carry nothing (base_p =
 * theta_p now, residual zero). Format 1 files (no residuals) still load:
 * residuals start at zero (out->format says so). (A fragment the killed
 * process pushed on the version it holds may see its next push refused as a
 * replay, with a rebase, when that push merged before the Welcome's fetch of
 * the newer version is adopted: it costs the steps since the restart of that
 * fragment, counted REJECTED.) Returns 0; DL_ETRUNC, DL_EFORMAT, DL_ECORRUPT
 * (checksum), DL_EMISMATCH (another model, run, learner or step), DL_ERANGE
 * (a value no learner can hold: non-finite, counters beyond the step): the
 * message says which, and the node is untouched; DL_ENOMEM (a residual); or
 * the parameter interface's error. */
int dl_node_state_restore(dl_node *n, const void *buf, size_t len, uint64_t fingerprint, uint64_t tag, uint64_t step,
                          const uint64_t *journal, int journal_n, dl_node_restored *out);
/* Write the push journal to fd from now on (-1: none): its head (magic, P,
 * `tag`) and the node's counters are written at once. The fd stays the
 * caller's. Returns 0 or DL_EIO. */
int dl_node_set_journal(dl_node *n, int fd, uint64_t tag);
/* Read a push journal file of `tag` into out[0..2P) (the node's counters,
 * then the mailbox's claim counters): the entries read; 0 for none, an
 * unreadable file, or one of another run, learner or model. */
int dl_node_journal_read(const char *path, uint64_t tag, uint64_t *out, int P);

/* The journal's head: magic "DLNJ", P (u32), tag (u64); counters follow. */
#define DL_NODE_JOURNAL_HEAD 16

int dl_node_P(const dl_node *n);
int dl_node_holds_all(const dl_node *n);
int dl_node_held(const dl_node *n, int p);
uint64_t dl_node_version(const dl_node *n, int p);
uint64_t dl_node_steps(const dl_node *n, int p);
uint64_t dl_node_tokens(const dl_node *n, int p);
double dl_node_compute_s(const dl_node *n, int p);
int dl_node_owes(const dl_node *n, int p); /* a held push of p is owed */
const float *dl_node_base(const dl_node *n, int p); /* numel_p floats */
void dl_node_get_stats(const dl_node *n, dl_node_stats *out);

#endif
