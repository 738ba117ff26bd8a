/* The training-thread side of a networked learner: per-fragment base copies
 * and versions, counters since adopt, push creation, adopt modes, initial fetch wait and final flush.
 *
 * A node works on the model's parameter buffer (theta, borrowed) through the
 * fragment plan and talks only to a comms mailbox (learner/comms.h), never to
 * a socket, so nothing here blocks on the network except the two explicit
 * waits (dl_node_wait_ready before training, dl_node_finish after it).
 *
 * Per fragment p it keeps:
 *   base_p     the global fragment last adopted (fp32, numel_p floats)
 *   version_p  its version
 *   steps_p, tokens_p, loss_p   inner steps, tokens and summed training loss
 *              since the reference point of the next delta (the adopt; in
 *              keep mode, see below)
 * A push of p is delta_p = base_p - theta_p with steps_p / tokens_p.
 *
 * Adopt of global g with version v for p (dl_node_adopt), at a step boundary:
 *   ignored    when p is held, the update is not forced and v <= version_p
 *   rebase     forced (fetch reply) or p not held yet: theta_p = g, counters 0
 *   overwrite  theta_p = g, counters 0
 *   mix        theta_p = alpha*theta_p + (1-alpha)*g, counters 0
 *   keep       theta_p = g + (theta_p - ref_p), where ref_p is theta_p at the
 *              last push of p, or the global adopted last if there was no
 *              push since; counters become those since ref_p (progress made
 *              since the push is kept and still counted)
 * and then base_p = g, version_p = v, ref_p = g. */
#ifndef DL_LEARNER_NODE_H
#define DL_LEARNER_NODE_H

#include <signal.h>
#include <stdint.h>

#include "learner/comms.h"

struct dl_plan;
typedef struct dl_node dl_node;

enum { DL_ADOPT_OVERWRITE = 0, DL_ADOPT_MIX = 1, DL_ADOPT_KEEP = 2 };

typedef struct {
    const struct dl_plan *plan; /* borrowed */
    float *params;              /* theta: the model's parameter buffer, borrowed */
    int adopt;                  /* DL_ADOPT_* */
    float alpha;                /* mix: weight of the local theta, in [0, 1] */
} dl_node_opts;

typedef struct {
    uint64_t pushes;    /* pushes handed to the comms thread (flush included) */
    uint64_t coalesced; /* of those, how many replaced an unsent push of the same fragment */
    uint64_t flushed;   /* pushes of the final flush */
    uint64_t adopted;   /* updates adopted (rebases included) */
    uint64_t rebased;   /* of those, forced / first-time adoptions (theta overwritten) */
    uint64_t ignored;   /* updates not newer than the held version */
} dl_node_stats;

/* Allocates base copies (one model's worth) and, in keep mode, reference
 * copies (another). `comms` is the mailbox, borrowed. Returns 0 or DL_EINVAL. */
int dl_node_open(const dl_node_opts *o, dl_comms *comms, dl_node **out);
void dl_node_close(dl_node **n); /* safe on NULL and twice */

/* After completed inner step `step` (1-based) of `tokens` tokens and training
 * loss `loss`: counters of every held fragment grow, then every fragment with
 * dl_plan_due(step, p, H, P) gets a push. Returns the number of pushes. */
int dl_node_after_step(dl_node *n, int64_t step, int H, uint64_t tokens, double loss);
/* Step boundary: take every waiting update from the mailbox and adopt it.
 * Returns the number adopted. Never blocks. */
int dl_node_poll(dl_node *n);
/* Push every held fragment with steps_p > 0, marked final (regardless of the
 * schedule). Returns the number of pushes. */
int dl_node_flush(dl_node *n);

/* Adopt global fragment p (numel_p floats) at `version` as described above.
 * Returns 1 when adopted, 0 when ignored as not newer. */
int dl_node_adopt(dl_node *n, int p, uint64_t version, int forced, const float *global);
/* delta = base_p - theta_p into out (numel_p floats), without pushing. */
void dl_node_delta(dl_node *n, int p, float *out);

/* Before training: poll until every fragment is held (the initial fetch).
 * Returns 0; DL_ETIMEDOUT after timeout_ms; DL_EAGAIN when *stop became
 * nonzero; DL_EPROTO when the synchronizer refused the learner (fatal
 * Error) or DL_ENET when the comms failed (no Welcome, socket): dl_errmsg()
 * carries the reason. Polls every 2 ms. */
int dl_node_wait_ready(dl_node *n, int timeout_ms, const volatile sig_atomic_t *stop);
/* After training: final flush, wait (adopting updates) until every push sent
 * has its final answer (dl_comms_flush_pending() == 0) or flush_timeout_ms
 * passed, then ask the comms thread to send Bye{reason, step}. Returns the
 * number of fragments with unanswered pushes (0 = complete flush). */
int dl_node_finish(dl_node *n, int flush_timeout_ms, uint64_t step, const char *reason);

int dl_node_P(const dl_node *n);
int dl_node_holds_all(const dl_node *n);
int dl_node_held(const dl_node *n, int p);
uint64_t dl_node_version(const dl_node *n, int p);
uint64_t dl_node_steps(const dl_node *n, int p);
uint64_t dl_node_tokens(const dl_node *n, int p);
const float *dl_node_base(const dl_node *n, int p); /* numel_p floats */
void dl_node_get_stats(const dl_node *n, dl_node_stats *out);

#endif
