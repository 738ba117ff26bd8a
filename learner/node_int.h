/* Private to the node's files (learner/node.c, node_state.c): a fragment's training-side
 * state, the node itself, and the calls one file makes into the other. */
#ifndef DLOCO_LEARNER_NODE_INT_H
#define DLOCO_LEARNER_NODE_INT_H

#include <stdint.h>
#include <stddef.h>

#include "core/plan.h"
#include "learner/ef.h"
#include "learner/mailbox.h"
#include "learner/node.h"

/* One fragment's training-side state; training thread only (the node is
 * not shared: every field is read and written between training steps). */
typedef struct {
    size_t numel;
    float *base;      /* [numel] last adopted global */
    float *ref;       /* keep mode: [numel] theta at the last push, or the last global */
    uint64_t version; /* of base */
    int held;         /* base is valid */
    uint64_t steps, tokens; /* since the reference point of the next delta */
    double loss;            /* summed training loss over those steps */
    double compute_s;       /* summed wall seconds of those steps */
    uint64_t steps_ref, tokens_ref; /* keep mode: counters at the last push */
    uint64_t tokens_posted; /* tokens of the last push posted since the adopt (all modes): what the next
                             * adopt does not discard, since that push reported them */
    double loss_ref, compute_ref;
    int pending;                    /* deferred push begun (read_begin), not yet posted */
    uint64_t pend_steps, pend_tokens; /* counters at its snapshot */
    double pend_loss, pend_compute;
    int flight;          /* FLIGHT_*: the latest push of p and what the node has done with its progress */
    uint64_t flight_base; /* its base_version */
    uint64_t fl_steps, fl_tokens; /* its counters */
    double fl_loss, fl_compute;
    uint64_t claims_seen; /* dl_mailbox_claims at the hold check that let the next push go (UINT64_MAX: none) */
    int owed;       /* a scheduled push was held (previous push of p undecided): make it when decided */
    int owed_final; /* the final flush of p waits for the previous push's decision */
    int final_returns; /* final pushes of p returned and owed again */
    uint64_t journal;  /* pushes posted + adopts that threw progress away (the push journal, node.h) */
    uint64_t claims0;  /* the push journal's claim count of earlier processes (dl_mailbox_set_claims_journal) */
    dl_ef *ef;         /* the serving session's error feedback residuals (dl_node_set_ef), or NULL */
} nfrag;

/* The latest push of a fragment, until its fate is known (node.h "Push
 * fates"). Keep mode keeps ref_p - base_p = the pushed progress while it is
 * POSTED or ABSORBED. */
enum {
    FLIGHT_NONE = 0,     /* decided, or no push since the adopt */
    FLIGHT_POSTED = 1,   /* posted; its progress is still in theta_p - base_p */
    FLIGHT_ABSORBED = 2, /* a NORMAL adopt took its progress out of theta_p (keep: it is ref_p - base_p) */
    FLIGHT_GONE = 3      /* a forced adopt overwrote theta_p: a returned push's progress is lost */
};

struct dl_node {
    const dl_plan *plan;
    const dl_node_model *model;
    dl_node_model *own_model; /* host model over opts.params, or NULL */
    dl_mailbox *mb;
    int P;
    int adopt;
    float alpha;
    double max_ratio; /* 0 = no distance bound */
    int64_t decision_timeout_ns;
    int (*due)(void *, int64_t, int, int); /* opts.due, or NULL: dl_plan_due */
    void *due_ctx;
    nfrag *f;   /* [P] */
    float *out; /* [mailbox buf] delta being posted (swapped with the mailbox) */
    float *in;  /* [mailbox buf] update being adopted (swapped with the mailbox) */
    float *tmp; /* [max numel] keep mode: g - ref_p */
    int finishing; /* dl_node_finish runs: a returned final push is owed again */
    int jfd;       /* the push journal's file, or -1 */
    dl_node_stats st;
};

/* theta_p now, through the parameter interface (synchronously). */
int dl_node_read_now(dl_node *n, int p, const float **theta);
/* node_state.c: the push journal's entry of p moves on (node.h "push journal"). */
void dl_node_journal_bump(dl_node *n, int p);

#endif
