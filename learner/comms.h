/* The learner's comms thread: owns the ZeroMQ DEALER to the synchronizer and
 * speaks docs/PROTOCOL.md (hello, fetch, pushes, acks, updates, heartbeats, bye).
 *
 * The training thread never touches the socket. It exchanges data with the
 * comms thread through a mailbox of per-fragment slots guarded by one mutex
 * that is only ever held for a few pointer swaps and counter updates (never
 * across a zmq call or a copy of tensor data):
 *
 *   push slot p   (training -> comms)  one queued push of fragment p; a newer
 *                 push of p replaces an unsent older one (it contains the
 *                 older progress), so at most P pushes are ever queued.
 *   update slot p (comms -> training)  the newest global fragment p received
 *                 and not yet adopted; an older version never replaces a newer.
 *
 * Buffers move by swapping pointers: every slot buffer and every buffer a
 * caller swaps in holds dl_comms_buf_numel() floats (the largest fragment).
 * The training thread wakes the comms thread through an eventfd that the
 * comms thread polls together with the DEALER (zmq_poll).
 *
 * Flow control: the comms thread keeps at most one push per fragment waiting
 * for its immediate Ack (MERGED_PENDING / DROPPED_STALE / REJECTED); newer
 * pushes of that fragment wait in the slot and coalesce. This bounds what
 * sits in zmq queues to P pushes even when the synchronizer stalls. A push
 * whose Ack has not come within max(5 s, liveness * heartbeat_ms) stops
 * blocking the slot. The DEALER has ZMQ_IMMEDIATE set: while there is no
 * connection nothing is queued in zmq (sends fail with EAGAIN), so pushes
 * wait in their slots and a Hello is retried every 20 ms until one leaves.
 *
 * dl_comms_open() allocates the mailbox only; the network starts with
 * dl_comms_start(). A mailbox that is never started is a plain data
 * structure (tests of learner/node.c use it without any socket). */
#ifndef DL_LEARNER_COMMS_H
#define DL_LEARNER_COMMS_H

#include <stddef.h>
#include <stdint.h>

struct dl_plan;
typedef struct dl_comms dl_comms;

typedef struct {
    const char *endpoint;   /* "tcp://host:port" of the synchronizer's ROUTER */
    const char *learner_id; /* [A-Za-z0-9._-]{1,64}; also the DEALER routing id */
    const char *run_id;
    const struct dl_plan *plan; /* borrowed, must outlive the comms: P and fragment sizes */
    uint64_t fingerprint;   /* dl_gpt_fingerprint(cfg, plan) */
    uint32_t n_layer, n_head, n_embd, seq_len, vocab; /* Hello's model summary */
    const char *device;     /* Hello.device, e.g. "cpu" */
    int hello_retry_ms;     /* first Hello retry when no Welcome came, doubling per retry to 16 s; 0 = 1000 */
    int connect_timeout_ms; /* first Welcome must come within this, else the comms fail; 0 = 30000 */
    const char *log_acks;   /* NULL/"" or a file: one line appended per Ack / Update received */
} dl_comms_opts;

/* Where the session stands (dl_comms_state). */
enum {
    DL_COMMS_IDLE = 0,    /* opened, not started */
    DL_COMMS_HELLO = 1,   /* waiting for Welcome (first hello or re-hello) */
    DL_COMMS_READY = 2,   /* welcomed: pushes flow */
    DL_COMMS_REFUSED = 3, /* the synchronizer sent a fatal Error; thread stopped */
    DL_COMMS_FAILED = 4,  /* local failure (socket, connect timeout); thread stopped */
    DL_COMMS_DONE = 5     /* Bye sent (or stopped); thread stopped */
};

/* Header of one queued push. The delta travels separately (a buffer swap). */
typedef struct {
    int fragment;
    uint64_t base_version; /* version_p the delta is relative to */
    uint64_t steps;        /* inner steps since adopting base_version, >= 1 */
    uint64_t tokens;       /* tokens over those steps, >= steps */
    double loss;           /* mean training loss over those steps (finite) */
    int final;             /* part of the final flush (logged only: dl_comms_flush_pending waits for every push) */
} dl_comms_push;

/* A global fragment handed to the training thread. */
typedef struct {
    int fragment;
    uint64_t version;
    int forced; /* reply to a Fetch: adopt as a rebase even if not newer */
} dl_comms_update;

/* Counters; all monotonic except epoch/h/state. */
typedef struct {
    uint64_t pushes;         /* Push messages sent */
    uint64_t push_bytes;     /* payload bytes of those */
    uint64_t coalesced;      /* queued pushes replaced by a newer push of the same fragment */
    uint64_t discarded;      /* queued pushes dropped because the learner had to rebase (must_fetch) */
    uint64_t acks_pending;   /* MERGED_PENDING acks received */
    uint64_t accepted, dropped_stale, rejected;
    uint64_t updates;        /* Update messages received (fetch replies included) */
    uint64_t superseded;     /* updates replaced in their slot by a newer one before the training thread took them */
    uint64_t hellos;         /* Hello messages sent (retries and re-hellos included) */
    uint64_t rehellos;       /* sessions restarted: newer epoch, DL_ENOTFOUND, silence, Bye */
    uint64_t fetches;        /* Fetch messages sent */
    uint64_t heartbeats_sent, heartbeats_recv;
    uint64_t errors_recv;    /* Error messages received */
    uint64_t bad_msgs;       /* inbound messages rejected by proto/wire.c or for run/learner id */
    uint64_t old_epoch;      /* inbound messages ignored for an older epoch */
    uint64_t bytes_sent, bytes_recv; /* all frames: packed header + payloads */
    uint64_t staleness_sum, staleness_n; /* over ACCEPTED acks: merged_version - 1 - base_version */
    uint64_t epoch;          /* newest synchronizer epoch seen */
    uint32_t h;              /* H from the last Welcome (0 before) */
    uint32_t heartbeat_ms;   /* from the last Welcome (0 before) */
    int state;               /* DL_COMMS_* */
} dl_comms_stats;

/* Allocate the mailbox (P push slots, P update slots, buffers). Copies the
 * strings. Returns 0, DL_EINVAL (bad learner id, missing endpoint/plan), or
 * DL_EIO (log_acks cannot be opened). *out is NULL on failure. */
int dl_comms_open(const dl_comms_opts *o, dl_comms **out);
/* Create the socket, connect, and start the comms thread, which sends Hello
 * at once. Returns 0 or DL_ENET. Call at most once. */
int dl_comms_start(dl_comms *c);
/* Stop and join the thread (without Bye unless dl_comms_bye was called; a
 * requested Bye is sent first and given up to 1 s to leave) and close the
 * socket. The mailbox and the counters stay readable. Safe twice. */
void dl_comms_stop(dl_comms *c);
/* dl_comms_stop, then free everything; NULLs the pointer; safe on NULL and twice. */
void dl_comms_close(dl_comms **c);

/* Floats every swapped buffer must hold (the plan's largest fragment). */
size_t dl_comms_buf_numel(const dl_comms *c);
/* A buffer of dl_comms_buf_numel() floats, for swapping; free() it. */
float *dl_comms_buf_alloc(const dl_comms *c);

/* ---- training-thread side (never blocks on the network) */

/* Queue a push: swaps *delta (dl_comms_buf_numel floats, the first
 * fragment_numel of them the fp32 delta) with the slot's buffer, so *delta
 * afterwards points at a spare buffer. Wakes the comms thread. Returns 1 when
 * an unsent push of the same fragment was replaced (coalesced), else 0. */
int dl_comms_post_push(dl_comms *c, const dl_comms_push *h, float **delta);
/* Take the pending update of fragment p, if any: swaps *buf with the slot's
 * buffer and fills *u. Taking a forced update (fetch reply) also drops a
 * queued push of p, which is relative to a base that is no longer usable.
 * Returns 1 if an update was taken, 0 if none was waiting. */
int dl_comms_take_update(dl_comms *c, int p, float **buf, dl_comms_update *u);
/* The node's adopted version of p, for re-hello held_versions. */
void dl_comms_set_held(dl_comms *c, int p, uint64_t version);
/* Values for Heartbeat and Hello.step. */
void dl_comms_set_progress(dl_comms *c, uint64_t step, uint64_t tokens, double steps_per_s);
/* Fragments whose latest push has no known fate yet: still queued, or sent
 * and not yet decided by an ACCEPTED (and its Update), DROPPED_STALE or
 * REJECTED ack echoing its base_version. 0 when a final flush is complete.
 * Only the latest push counts because the synchronizer replaces an earlier
 * pooled push of a fragment with the newer one without answering it. A new
 * epoch or DL_ENOTFOUND forgets sent pushes (their answers will not come). */
int dl_comms_flush_pending(dl_comms *c);
/* Ask the comms thread to send Bye{reason, step} (when it has a session)
 * and stop. Returns at once; dl_comms_close() waits for the thread, giving
 * the Bye up to 1 s to leave. */
void dl_comms_bye(dl_comms *c, const char *reason, uint64_t step);

/* DL_COMMS_* and, for REFUSED/FAILED, a message ("" otherwise) into msg. */
int dl_comms_state(dl_comms *c, char *msg, size_t cap);
void dl_comms_get_stats(dl_comms *c, dl_comms_stats *out);
/* H from the last Welcome, 0 before the first. */
uint32_t dl_comms_h(dl_comms *c);

/* ---- comms-thread side, public so tests can drive a mailbox without a socket */

/* Take the queued push of fragment p: swaps *delta with the slot buffer.
 * Returns 1 if one was queued. */
int dl_comms_take_push(dl_comms *c, int p, dl_comms_push *h, float **delta);
/* Offer a received global fragment (numel floats, any alignment) to update
 * slot p: kept when its version is newer than a waiting one, or forced.
 * Returns 1 if it was stored, 0 if a newer update is already waiting. */
int dl_comms_put_update(dl_comms *c, int p, uint64_t version, int forced, const void *data, size_t numel);

/* 1 when s is a valid learner id: [A-Za-z0-9._-]{1,64}. */
int dl_comms_id_ok(const char *s);

#endif
