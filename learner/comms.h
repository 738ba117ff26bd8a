/* A learner's comms session: one ZeroMQ DEALER to one synchronizer, its own
 * thread, speaking docs/PROTOCOL.md (hello, fetch, pushes, acks, updates, heartbeats, re-hello, bye).
 *
 * The training thread never touches the socket: it talks to the mailbox
 * (learner/mailbox.h), which a session serves. A session has no global
 * state, so several can run in one process: a learner talking to a sharded
 * synchronizer runs one per shard over one mailbox, each serving its subset
 * of fragments (opts.fragments), each with its own socket, thread and
 * wake-up eventfd (polled together with the DEALER by zmq_poll).
 *
 * Flow control: a session keeps at most one push per fragment waiting for
 * its immediate Ack (MERGED_PENDING / DROPPED_STALE / REJECTED); newer
 * pushes of that fragment wait in the mailbox slot and coalesce. This bounds
 * what sits in zmq queues to P pushes even when the synchronizer stalls. A
 * push whose Ack has not come within max(ack_expiry_min_ms, liveness *
 * heartbeat_ms) stops blocking the slot. The DEALER has ZMQ_IMMEDIATE set:
 * while there is no connection nothing is queued in zmq (sends fail with
 * EAGAIN), so pushes wait in their slots and a Hello is retried every
 * hello_unsent_ms until one leaves.
 *
 * dl_comms_open() attaches to the mailbox only; the network starts with
 * dl_comms_start(). */
#ifndef DL_LEARNER_COMMS_H
#define DL_LEARNER_COMMS_H

#include <stddef.h>
#include <stdint.h>

#include "learner/mailbox.h"

struct dl_plan;
typedef struct dl_comms dl_comms;

typedef struct {
    dl_mailbox *mailbox;    /* borrowed, must outlive the session */
    const char *endpoint;   /* "tcp://host:port" of the synchronizer's ROUTER */
    const char *learner_id; /* [A-Za-z0-9._-]{1,64}; also the DEALER routing id */
    const char *run_id;
    const struct dl_plan *plan; /* borrowed, must outlive the session: P and fragment sizes */
    const int *fragments;   /* the fragments this session serves (copied); NULL = all P */
    int n_fragments;
    uint64_t fingerprint;   /* dl_model_fingerprint(cfg, plan) */
    uint32_t n_layer, n_head, n_embd, seq_len, vocab; /* Hello's model summary */
    const char *device;     /* Hello.device, e.g. "cpu" */
    /* timing, ms; 0 = the default in brackets (dloco-learner's config rows) */
    int hello_retry_ms;     /* first Hello retry without a Welcome, doubling per retry [1000] */
    int hello_retry_max_ms; /* cap of that backoff [16000] */
    int hello_unsent_ms;    /* retry period of a Hello that found no connection [20] */
    int connect_timeout_ms; /* first Welcome must come within this, else the session fails [30000] */
    int poll_max_ms;        /* timers are checked at least this often [100] */
    int silence_min_ms;     /* re-hello after max(this, liveness * heartbeat_ms) without a message [1000] */
    int ack_expiry_min_ms;  /* unacked push stops blocking after max(this, liveness * heartbeat_ms) [5000] */
    int bye_linger_ms;      /* how long stopping lets a Bye leave [1000] */
    int reconnect_ms;       /* ZeroMQ reconnect backoff: first retry of a lost connection [100] ... */
    int reconnect_max_ms;   /* ... doubling up to this [10000] */
} dl_comms_opts;

/* Counters of one session; all monotonic except epoch/h/state.
 * coalesced, discarded and superseded are the mailbox's (shared by its sessions). */
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
    uint64_t bad_msgs;       /* inbound messages rejected by proto/wire.c, for run/learner id, or for a fragment not served */
    uint64_t old_epoch;      /* inbound messages ignored for an older epoch */
    uint64_t bytes_sent, bytes_recv; /* all frames: packed header + payloads */
    uint64_t staleness_sum, staleness_n; /* over ACCEPTED acks: merged_version - 1 - base_version */
    uint64_t epoch;          /* newest synchronizer epoch seen */
    uint32_t h;              /* H from the last Welcome (0 before) */
    uint32_t heartbeat_ms;   /* from the last Welcome (0 before) */
    int state;               /* DL_COMMS_* */
} dl_comms_stats;

/* Refuse timing options out of order (DL_EINVAL naming the values); 0s
 * stand for their defaults. push_decision_timeout_ms: the node's hold
 * release (learner/node.h), < 0 = not checked. */
int dl_comms_check_timeouts(const dl_comms_opts *o, int push_decision_timeout_ms);
/* Attach a session to o->mailbox. Copies the strings. Returns 0, DL_EINVAL
 * (bad learner id, missing endpoint/plan/mailbox, bad fragment list,
 * timeouts out of order, too many sessions), or DL_EIO (no eventfd).
 * *out is NULL on failure. */
int dl_comms_open(const dl_comms_opts *o, dl_comms **out);
/* Create the socket, connect, and start the session's thread, which sends
 * Hello at once. Returns 0 or DL_ENET. Call at most once. */
int dl_comms_start(dl_comms *c);
/* Stop and join the thread (without Bye unless dl_mailbox_bye was called; a
 * requested Bye is sent first and given up to bye_linger_ms to leave) and
 * close the socket. The counters stay readable. Safe twice. */
void dl_comms_stop(dl_comms *c);
/* dl_comms_stop, detach from the mailbox, free; NULLs the pointer; safe on NULL and twice. */
void dl_comms_close(dl_comms **c);

/* DL_COMMS_* and, for REFUSED/FAILED, a message ("" otherwise) into msg. */
int dl_comms_state(dl_comms *c, char *msg, size_t cap);
void dl_comms_get_stats(dl_comms *c, dl_comms_stats *out);
/* H from the last Welcome, 0 before the first. */
uint32_t dl_comms_h(dl_comms *c);

/* 1 when s is a valid learner id: [A-Za-z0-9._-]{1,64}. */
int dl_comms_id_ok(const char *s);

#endif
