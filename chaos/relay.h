/* A ZeroMQ-frame-aware TCP relay for the chaos harness: one per emulated
 * datacenter, between the learners' DEALERs and the synchronizer's ROUTER.
 *
 * Learners connect to the relay's listening port; for each accepted
 * connection the relay opens one TCP connection to the synchronizer and
 * forwards bytes both ways, cut into units by a ZMTP 3.x parser (RFC 23):
 *   - greeting bytes, forwarded as they come (libzmq sends its 64-byte
 *     greeting in three parts -- 10, 1, 53 bytes -- each only after seeing
 *     the peer's previous part, so holding them back for a whole greeting
 *     would deadlock the version negotiation);
 *   - one command frame (READY, PING, PONG, ERROR, ...);
 *   - one message: consecutive non-command frames up to the first without
 *     MORE. A command frame between two frames of a message is its own unit
 *     and goes out ahead of that message (still valid ZMTP; libzmq can emit
 *     a PING there).
 * Each unit is queued per connection and direction with a release time
 * (arrival + delay + jitter) and goes out when that time has come, the
 * direction's token bucket allows (rate) and the link is not partitioned.
 * Messages, and only messages, can be dropped, duplicated, held back
 * (reordered) or replayed; the relay never edits bytes.
 *
 * Threads: one thread per relay does all socket work (poll() over the
 * listener, every pair's two non-blocking sockets and a self-pipe). Every
 * function here may be called from any other thread; they take the relay's
 * mutex and wake the thread through the pipe.
 *
 * Memory: per connection and direction, completed units queue up to
 * queue_max_bytes; above it the relay stops reading that side, so the
 * sender's TCP window fills (back-pressure, as with a slow link). A message
 * or command being assembled is bounded by max_msg_bytes (it must be whole
 * before it can be dropped or duplicated: the relay is store-and-forward).
 * Anything unparsable -- not a ZMTP 3 greeting, reserved flag bits, a
 * command with MORE, a frame or message above max_msg_bytes -- closes that
 * pair and counts conns_bad_framing; nothing is allocated from a size
 * before it has been checked against the bound.
 *
 * Limits (what this cannot emulate):
 *   - Loss here is loss of a whole ZeroMQ message inside a TCP connection
 *     that stays up. Real packet loss on TCP is retransmission: latency and
 *     throughput collapse, never a missing message. This is the "lossy
 *     middlebox / broken proxy" model, useful to test the product's
 *     application-level retries and sequence checks.
 *   - Only the NULL mechanism is useful through the relay. Under CURVE every
 *     message travels as a MESSAGE command with a strictly increasing nonce:
 *     the relay sees commands only (no loss/dup/reorder/replay happens), and
 *     if it did duplicate or reorder one the receiver would refuse the
 *     nonce and drop the connection. PLAIN would work like NULL.
 *   - Delay is per unit and store-and-forward: a large message starts going
 *     out only once it has been received whole (plus delay), like a switch
 *     that buffers a whole frame; no serialization delay is modelled except
 *     through rate_mbit.
 *   - rate_mbit shapes the bytes the relay writes; the kernel's loopback
 *     and socket buffers (a few MiB) sit behind it, so short bursts can see
 *     less queueing than a real bottleneck.
 *   - Determinism: loss, duplication and reorder draws come from one seeded
 *     stream (core/rng.h) in the order messages complete, so a run is
 *     reproducible per seed as far as the order in which messages reach the
 *     relay is (several connections interleave by timing). Jitter uses a
 *     second stream so greeting and command chunking does not shift them.
 *   - ZMTP 1.0/2.0 peers are refused (bad framing).
 *   - The ZMTP handshake takes about three round trips (greeting parts, then
 *     READY) through the relay's delay; one-way delays of seconds can run
 *     into libzmq's ZMQ_HANDSHAKE_IVL (30 s by default) and loop reconnects.
 *   - The replay capture is taken before the loss draw (the sniffer sits at
 *     the learner's end), so a dropped message can still be replayed.
 *
 * Errors: dl_relay_open returns 0 or DL_EINVAL / DL_ENET / DL_ENOMEM with
 * dl_errmsg(); replay DL_ENOTFOUND. */
#ifndef DL_CHAOS_RELAY_H
#define DL_CHAOS_RELAY_H

#include <stddef.h>
#include <stdint.h>

typedef struct dl_relay dl_relay;

#define DL_RELAY_QUEUE_DEFAULT ((size_t)8 << 20)    /* queue_max_bytes = 0 */
#define DL_RELAY_MAX_MSG_DEFAULT ((size_t)256 << 20) /* max_msg_bytes = 0 */
#define DL_RELAY_MAX_CONNS_DEFAULT 256              /* max_conns = 0 */
#define DL_RELAY_CAPTURE_MAX ((size_t)1 << 20)      /* largest message kept for dl_relay_replay, wire bytes */
#define DL_RELAY_REORDER_HOLD_MS 200                /* a held message goes on after this if no other follows */
#define DL_RELAY_DRAIN_MS 10000                     /* after a side closed, how long queued units may still go out */

typedef struct {
    const char *listen_host;   /* numeric IPv4/IPv6 or a name, e.g. "10.201.0.1" or "127.0.0.1" (copied) */
    int listen_port;           /* 0 = ephemeral; dl_relay_port() tells */
    const char *upstream_host; /* the synchronizer (copied; resolved once at open) */
    int upstream_port;
    uint64_t seed;             /* loss / duplication / reorder / jitter draws, deterministic per seed */
    size_t queue_max_bytes;    /* completed units queued per direction per connection before the relay
                                  stops reading that side; 0 = DL_RELAY_QUEUE_DEFAULT */
    int max_conns;             /* live pairs; one more is accepted and closed at once. 0 = default */
    size_t max_msg_bytes;      /* wire bytes of one message (all its frames) or one command; 0 = default.
                                  Set it above the product's max_msg_bytes plus its header frame. */
} dl_relay_cfg;

typedef struct {               /* one link's impairments; the same both directions */
    double delay_ms;           /* added one-way to every unit (greeting bytes, commands, messages): RTT/2 */
    double jitter_ms;          /* uniform extra delay in [0, jitter_ms]; order is kept unless reorder > 0 */
    double loss;               /* probability a whole message is dropped, [0,1] (never commands/greeting) */
    double duplicate;          /* probability a message is forwarded twice */
    double reorder;            /* probability a message is held back and sent after the next message of
                                  that direction (or after DL_RELAY_REORDER_HOLD_MS if none follows) */
    double rate_mbit;          /* 0 = unlimited; else a token bucket per direction per relay, shared by all
                                  its connections like one link (1 Mbit = 10^6 bits) */
    int partitioned;           /* 1: nothing is forwarded either way (queued, then back-pressure; like a
                                  link down with TCP retransmitting); 0 heals and everything queued goes on */
} dl_relay_impair;

typedef struct {
    uint64_t up_bytes, down_bytes; /* written learner->sync / sync->learner (wire bytes, duplicates and
                                      replays included) */
    uint64_t up_msgs, down_msgs;   /* messages written (each copy of a duplicate, replays included) */
    uint64_t dropped;              /* messages lost on purpose */
    uint64_t duplicated;           /* messages queued a second time */
    uint64_t reordered;            /* held messages that went out after a later one */
    uint64_t replayed;             /* copies injected by dl_relay_replay */
    uint64_t conns_accepted;       /* learner connections accepted (refused ones over max_conns included) */
    uint64_t conns_open;           /* pairs live now */
    uint64_t conns_failed_upstream;/* the synchronizer could not be reached for a pair */
    uint64_t conns_bad_framing;    /* pairs closed because one side broke ZMTP or a bound */
} dl_relay_stats;

/* Validates cfg (hosts present, ports in [0, 65535], upstream_port > 0),
 * resolves the upstream, binds and listens (SO_REUSEADDR), starts the
 * thread. Impairments start at zero (a plain relay). */
int dl_relay_open(const dl_relay_cfg *cfg, dl_relay **out);
/* The bound port (the ephemeral one when listen_port was 0). */
int dl_relay_port(const dl_relay *r);
/* Replace the impairments. Delay, jitter, loss, duplicate and reorder apply
 * to units that arrive from now on (already queued ones keep their release
 * times); rate and partition apply at once, and a heal releases what is
 * queued. Values are clamped: negatives to 0, probabilities to [0, 1]. */
void dl_relay_set(dl_relay *r, const dl_relay_impair *imp);
void dl_relay_get(dl_relay *r, dl_relay_impair *out);
/* A replay attack: queue one more copy of a captured learner->sync message
 * on a live upstream connection (one whose handshake went through), now, at
 * a message boundary behind what is already queued there. The capture is
 * the last message of at least 2 frames seen going up (a bare one-frame
 * message only until such a message exists), at most DL_RELAY_CAPTURE_MAX
 * wire bytes. It goes on the connection it was captured from while that is
 * live, else on the newest live one (then it arrives under another peer's
 * routing id). 0, or DL_ENOTFOUND when nothing is captured or no connection
 * is live. */
int dl_relay_replay(dl_relay *r);
/* Close every pair now with an RST (SO_LINGER 0) on both sides, dropping
 * what is queued; returns how many pairs were closed. */
int dl_relay_cut(dl_relay *r);
void dl_relay_stats_get(dl_relay *r, dl_relay_stats *out);
/* Stop the thread, close every socket, free everything; *r = NULL. Safe on
 * NULL and on an already closed handle. */
void dl_relay_close(dl_relay **r);

#endif
