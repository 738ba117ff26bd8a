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
 * Encoded pushes: the mailbox holds fp32 deltas; the session encodes a push
 * when it claims it (opts.push_codec, kernels/codec.h), once, into a
 * per-fragment buffer, and a chunked push sends block-aligned ranges of that
 * encoding. With error feedback it keeps per fragment the residual the
 * accepted pushes did not carry (learner/ef.h: ACCEPTED commits the push's
 * residual, REJECTED keeps the committed one, DROPPED_STALE, a rebase and a
 * fetch reply zero it; a lost Ack changes nothing).
 *
 * Delta Updates (Welcome.update_codec != 0): the session keeps a mirror of
 * every fragment it serves, the fp32 values of the version it last handed to
 * the update slot. A delta of version v applies onto a mirror at v - 1
 * (dl_codec_decode_add, chunk by chunk into a staging copy that becomes the
 * mirror) and is handed to the slot as a full update, so the node never sees
 * a delta; one for a version the mirror does not hold is dropped and the
 * fragment fetched (updates_delta_missed). An `update_base` event carries
 * dl_checksum64 of every version handed over, full or delta, to compare with
 * the synchronizer's `merge` hash.
 *
 * Rebase: an Ack with rebase (DROPPED_STALE, or REJECTED on an unusable
 * base) makes the next Update of its fragment DL_UPDATE_REBASE: the node
 * sets theta = g and resets the counters, whatever its adopt mode.
 *
 * Trust: the synchronizer is a peer, not an authority over the learner's
 * state. Before anything it sends is used (docs/PROTOCOL.md "What a learner
 * accepts"):
 *   - an Update's payload must be finite, and its version at most
 *     max_version_jump above the newest version the learner knows of that
 *     fragment (held, announced by the last Welcome, or received); a refused
 *     one never reaches the mailbox and a fresh fetch of the fragment is
 *     asked for (dl_mailbox_refuse_update; the node refuses the same way an
 *     update too far from its parameters). Fetches asked for after
 *     refusals go out at once for the first DL_COMMS_REFETCH_FREE refusals
 *     of a fragment in a row, then after hello_retry_ms doubling up to
 *     hello_retry_max_ms. A normal Update below the held version is dropped
 *     as out of date (updates_old).
 *   - the epoch is taken only from a Welcome that answers our Hello; any
 *     other message of a newer epoch means "the synchronizer restarted": the
 *     session re-hellos and otherwise ignores the message (Errors aside), so
 *     one absurd epoch cannot make later genuine messages look old. The first
 *     Welcome on a new connection is taken whatever its epoch.
 *   - a Welcome's h, heartbeat_ms and liveness must lie within the
 *     DL_COMMS_*_MIN/MAX bounds below, and its shard layout must be the one
 *     the session was opened for (opts.shard, opts.shards); a Welcome
 *     otherwise is refused like an unanswered Hello (retried with backoff).
 *   - strings from the network (Error.message, Ack.reason, Welcome.policy)
 *     are logged quoted, with every byte outside printable ASCII escaped.
 *
 * Connections: the DEALER sets no ZMQ_ROUTING_ID (libzmq gives every
 * connection a fresh one; the synchronizer binds the learner id in each
 * envelope to the connection itself). ZMQ_MAXMSGSIZE is the largest served
 * fragment's fp32 bytes + DL_WIRE_MAX_HEADER_BYTES. A socket monitor sees
 * the connection die (libzmq drops it on an oversized frame and then never
 * reconnects by itself) or a handshake fail (e.g. CURVE); the session then
 * closes the DEALER and opens a new one (a rebuild), as it does after
 * DL_COMMS_BAD_IN_ROW inbound messages in a row that proto/wire.c rejects,
 * and when nothing came from the synchronizer for max(silence_min_ms,
 * liveness * heartbeat_ms) (READY), or since the last Hello was sent (HELLO,
 * at its retry): a connection the synchronizer stopped reading recovers by
 * itself. The first rebuild in a row is at once, the next after
 * reconnect_ms doubling up to reconnect_max_ms (a Welcome ends the row); a
 * rebuilt session re-hellos with its held versions. With CURVE keys
 * (curve_server + curve_public + curve_secret) the DEALER is a CURVE client.
 *
 * dl_comms_open() attaches to the mailbox only; the network starts with
 * dl_comms_start(). */
#ifndef DL_LEARNER_COMMS_H
#define DL_LEARNER_COMMS_H

/* A session still without a first Welcome (or without a Welcome again) says so this often, ms. */
#define DL_COMMS_WAIT_NOTE_MS 10000
/* The longest a connect attempt is given before another (tcp_stall_ms): a TCP handshake is one round trip,
 * and past it the kernel's SYN waits 1, 2, 4, ... s across an outage. */
#define DL_COMMS_CONNECT_ATTEMPT_MS 2000

#include <stddef.h>
#include <stdint.h>

#include "core/codec.h"
#include "learner/mailbox.h"

struct dl_plan;
typedef struct dl_comms dl_comms;

/* Bounds on a Welcome's values (a Welcome outside them is refused). */
#define DL_COMMS_H_MIN 1u
#define DL_COMMS_H_MAX 1000000u
#define DL_COMMS_HEARTBEAT_MIN_MS 10u
#define DL_COMMS_HEARTBEAT_MAX_MS 60000u
#define DL_COMMS_LIVENESS_MIN 2u
#define DL_COMMS_LIVENESS_MAX 100u
/* Default of dl_comms_opts.max_version_jump. */
#define DL_COMMS_MAX_VERSION_JUMP 1000000u
/* Refused updates of one fragment in a row that are fetched again at once;
 * later fetches back off. */
#define DL_COMMS_REFETCH_FREE 3
/* Inbound messages in a row rejected by proto/wire.c that rebuild the socket. */
#define DL_COMMS_BAD_IN_ROW 3

typedef struct {
    dl_mailbox *mailbox;    /* borrowed, must outlive the session */
    const char *endpoint;   /* "tcp://host:port" of the synchronizer's ROUTER */
    const char *learner_id; /* [A-Za-z0-9._-]{1,64}: Envelope.learner_id (not the routing id) */
    const char *run_id;
    const struct dl_plan *plan; /* borrowed, must outlive the session: P and fragment sizes */
    const int *fragments;   /* the fragments this session serves (copied); NULL = all P, or the shard's */
    int n_fragments;
    /* The synchronizer shard this session talks to (core/shard.h): its
     * Welcome must say shard `shard` of `shards`, else it is refused like one
     * out of bounds (welcome_refused) and the Hello retried; the fragments
     * served must be that shard's. shards 0 or 1 = an unsharded synchronizer
     * (whose Welcome says shards 0 or 1). */
    int shard, shards;
    uint64_t fingerprint;   /* dl_model_fingerprint(cfg, plan) */
    uint32_t n_layer, n_head, n_embd, seq_len, vocab; /* Hello's model summary */
    const char *device;     /* Hello.device, e.g. "cpu" */
    uint32_t batch;         /* Hello.batch: sequences per inner step (0 = not told) */
    /* A manifest learner (core/manifest.h, docs/PROTOCOL.md "Manifests"): the model's tensors go in every
     * Hello (borrowed, must outlive the session), with max_tokens_per_step; NULL = a GPT-2 learner described
     * by n_layer..vocab alone, whose Hello carries neither */
    const struct dl_manifest *manifest;
    uint64_t max_tokens_per_step;
    uint64_t instance;      /* Hello.instance: this process's random nonce, the same for all its
                             * sessions and connections; 0 = dl_comms_open draws one */
    /* CURVE (Z85, 40 characters each): the synchronizer's public key and this
     * learner's key pair; all three empty = a plain connection */
    char curve_server[41], curve_public[41], curve_secret[41];
    /* a fragment version more than this above the newest known is refused; 0 = DL_COMMS_MAX_VERSION_JUMP */
    uint64_t max_version_jump;
    /* the learner adopts in keep mode: after a push dropped stale it keeps what it
     * trained since, so the residual the accepted pushes owe stays (learner/ef.h) */
    int adopt_keep;
    /* Robustness benchmarks only: with byzantine set, every pushed delta
     * leaves multiplied by byzantine_scale (flip = -1), so the synchronizer's
     * guards can be measured against a corrupt learner. The mailbox, the node
     * and the learner's own training stay honest. */
    int byzantine;
    double byzantine_scale;
    /* Push encoding (core/codec.h, kernels/codec.h; dloco-learner's rows push_codec, push_block, push_topk,
     * push_rounding, error_feedback): id 0 = fp32; block and topk as dl_codec_check wants them for the id
     * (block codecs: block in [16, 65536], even; topk: topk in [1, block]); push_rounding DL_ROUND_*;
     * error_feedback: keep the residual of every encoded push per fragment (learner/ef.h has the rules);
     * ignored for fp32. A byzantine push is corrupted before it is encoded. */
    dl_codec push_codec;
    int push_rounding;
    int error_feedback;
    /* timing, ms; 0 = the default in brackets (dloco-learner's config rows) */
    int hello_retry_ms;     /* first Hello retry without a Welcome, doubling per retry [1000] */
    int hello_retry_max_ms; /* cap of that backoff [16000] */
    int hello_unsent_ms;    /* retry period of a Hello that found no connection [20] */
    int connect_timeout_ms; /* first Welcome must come within this, else the session fails [30000]; < 0: no
                             * bound (it keeps trying, warning every DL_COMMS_WAIT_NOTE_MS), as when the
                             * learner holds every fragment the session serves (restored from its state) */
    int poll_max_ms;        /* timers are checked at least this often [100] */
    int silence_min_ms;     /* re-hello after max(this, liveness * heartbeat_ms) without a message [1000] */
    int silence_rebuild_ms; /* rebuild the socket after max(this, 4 x that) without a message [30000] */
    int ack_expiry_min_ms;  /* unacked push stops blocking after max(this, liveness * heartbeat_ms) [5000] */
    int bye_linger_ms;      /* how long stopping lets a Bye leave [1000] */
    int reconnect_ms;       /* ZeroMQ reconnect backoff: first retry of a lost connection [100] ... */
    int reconnect_max_ms;   /* ... doubling up to this [1000]: a link back after an outage is found within about
                             * that (DL_COMMS_CONNECT_ATTEMPT_MS more), where 10 s added up to 10 s */
    int tcp_stall_ms;       /* a connection whose sent bytes stay unacknowledged this long is dropped by the
                             * kernel (ZMQ_TCP_MAXRT: TCP_USER_TIMEOUT) and the socket rebuilt, and a connect
                             * attempt is given up after min(this, DL_COMMS_CONNECT_ATTEMPT_MS) and made again
                             * [10000]; < 0: the kernel's own (retransmissions back off for many minutes) */
} dl_comms_opts;

/* Counters of one session; all monotonic except epoch/h/state.
 * coalesced, discarded and superseded are the mailbox's (shared by its sessions). */
typedef struct {
    uint64_t pushes;         /* Push messages sent */
    uint64_t push_bytes;     /* payload bytes of those, as encoded */
    uint64_t coalesced;      /* queued pushes replaced by a newer push of the same fragment */
    uint64_t discarded;      /* queued pushes dropped because the learner had to rebase (must_fetch) */
    uint64_t acks_pending;   /* MERGED_PENDING acks received */
    uint64_t accepted, dropped_stale, rejected;
    uint64_t updates;        /* Update messages handed to the mailbox (fetch replies included; refused
                              * and out-of-date ones are counted below instead) */
    uint64_t superseded;     /* updates replaced in their slot by a newer one before the training thread took them */
    uint64_t hellos;         /* Hello messages sent (retries and re-hellos included) */
    uint64_t rehellos;       /* sessions restarted: newer epoch, DL_ENOTFOUND, silence, Bye */
    uint64_t fetches;        /* Fetch messages sent */
    uint64_t heartbeats_sent, heartbeats_recv;
    uint64_t errors_recv;    /* Error messages received */
    uint64_t bad_msgs;       /* inbound messages rejected by proto/wire.c, for run/learner id, or for a fragment not served */
    uint64_t old_epoch;      /* inbound messages ignored for an older epoch */
    uint64_t newer_epoch;    /* inbound messages (not a Welcome answering our Hello) of a newer epoch: re-hello */
    uint64_t updates_refused; /* Updates refused on receipt: non-finite payload, version jump */
    uint64_t updates_old;    /* normal Updates dropped: version below the held one */
    uint64_t updates_delta;  /* of `updates`, delta Updates applied onto the session's mirror */
    uint64_t updates_delta_missed; /* delta Updates dropped because the mirror did not hold version - 1 (missed
                              * versions, no mirror yet, a gap in its chunks); the fragment is fetched */
    uint64_t welcomes_refused; /* Welcomes with h / heartbeat_ms / liveness out of bounds, or of another shard */
    uint64_t refetches;      /* fetches asked for after refused updates (each sent after its backoff,
                              * unless a good Update of the fragment came first) */
    uint64_t rebuilds;       /* sockets closed and opened again (lost connection, bad messages, silence) */
    uint64_t bytes_sent, bytes_recv; /* all frames: packed header + payloads */
    uint64_t chunks_sent;    /* Push messages that carried one chunk of a chunked push */
    uint64_t chunks_recv;    /* Update chunks taken in order */
    uint64_t chunks_dropped; /* Update chunks not taken: already held, leftovers of a replaced or finished transfer,
                              * or after a gap (a resume Fetch follows, once per gap) */
    uint64_t busy;           /* pushes refused busy (the synchronizer's pool was full) */
    uint64_t pushes_stopped; /* chunked pushes stopped before their end (connection, session, refusal) */
    uint64_t staleness_sum, staleness_n; /* over ACCEPTED acks: merged_version - 1 - base_version */
    uint64_t epoch;          /* epoch of the last Welcome taken (0 before) */
    uint32_t h;              /* H from the last Welcome (0 before) */
    uint32_t heartbeat_ms;   /* from the last Welcome (0 before) */
    int state;               /* DL_COMMS_* */
    double fleet_steps_per_s; /* Ack.fleet_steps_per_s of the last Ack that carried one (> 0; validated by
                               * dl_wire_validate: finite, <= DL_WIRE_FLEET_SPS_MAX); 0 = none yet */
} dl_comms_stats;

/* Refuse timing options out of order (DL_EINVAL naming the values); 0s
 * stand for their defaults. push_decision_timeout_ms: the node's hold
 * release (learner/node.h), < 0 = not checked. */
int dl_comms_check_timeouts(const dl_comms_opts *o, int push_decision_timeout_ms);
/* Attach a session to o->mailbox. Copies the strings. Returns 0, DL_EINVAL
 * (bad learner id, missing endpoint/plan/mailbox, bad fragment list or
 * shard layout, a fragment listed that is not the shard's,
 * timeouts out of order, CURVE keys incomplete or not Z85, CURVE asked of a
 * libzmq without it, byzantine_scale not finite, too many sessions), or
 * DL_EIO (no eventfd).
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

/* DL_COMMS_* and, for REFUSED/FAILED, a message into msg; for HELLO the last
 * connection problem ("last connection problem: ...") if the socket was
 * rebuilt since the last Welcome; "" otherwise. */
int dl_comms_state(dl_comms *c, char *msg, size_t cap);
void dl_comms_get_stats(dl_comms *c, dl_comms_stats *out);
/* The error feedback residuals of fragment p (learner/ef.h) when this session
 * serves p, else NULL: the node saves and restores them with its state. */
struct dl_ef *dl_comms_ef(dl_comms *c, int p);
/* H from the last Welcome, 0 before the first. */
uint32_t dl_comms_h(dl_comms *c);
/* The fleet's step rate of the last Ack that carried one (dl_comms_stats.fleet_steps_per_s), 0 before. */
double dl_comms_fleet_sps(dl_comms *c);
/* Add the session counters of `s` to `acc` (a learner's sessions, one per
 * shard, reported as one): the monotonic counters sum; the mailbox's
 * (coalesced, discarded, superseded, shared by all sessions) are taken from
 * `s`, as are h and heartbeat_ms when set; epoch is the largest; state is
 * left as it is. */
void dl_comms_stats_add(dl_comms_stats *acc, const dl_comms_stats *s);

/* 1 when s is a valid learner id: [A-Za-z0-9._-]{1,64}. */
int dl_comms_id_ok(const char *s);

/* This process's learner instance (Hello.instance): random, never 0, drawn
 * once; every session of the process that leaves dl_comms_opts.instance 0
 * uses it. */
uint64_t dl_comms_instance(void);

#endif
