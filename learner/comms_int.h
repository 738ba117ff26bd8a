/* The comms session's private header: the state one session thread owns (struct dl_comms) and the
 * calls its files make to one another, in the words of the synchronizer's files (synchronizer/sync_int.h).
 *
 * What may live here: the session struct and the small types it embeds, constants two files share,
 * and the prototypes of the functions one file of the session calls in another. Nothing here is for
 * other folders (they use learner/comms.h). The files, read in order:
 *   comms.c           the session: open, start, stop, close; the socket (built, watched, rebuilt); the
 *                     thread's loop, its silence limits and the dispatch of what arrives
 *   comms_admit.c     admission: Hello, Welcome, re-hello, heartbeats, Bye, the synchronizer's Errors
 *   comms_uplink.c    pushes leaving: claimed, encoded, sent whole or in chunks, stopped, and their Acks
 *   comms_downlink.c  what comes back: Fetches and refetches, Updates (fp32 chunks, deltas onto the mirror) */
#ifndef DL_LEARNER_COMMS_INT_H
#define DL_LEARNER_COMMS_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/codec.h"
#include "learner/comms.h"
#include "learner/ef.h"
#include "proto/wire.h"

#define MS ((int64_t)1000000) /* ns per ms */
#define NEVER INT64_MAX

/* Session-side state of one fragment; comms thread only. */
typedef struct {
    int served;         /* this session pushes, fetches and receives fragment p */
    int unacked;        /* a push waits for its immediate ack */
    int64_t unacked_ns; /* when it was sent */
    int fetch_pending;  /* the next Update of p is a fetch reply */
    int fetch_soft;     /* ... asked for only because the mirror missed a delta: theta is fine, so the
                         * reply is adopted as a normal update (no rebase, the residual stays) */
    int rebase_pending; /* the next Update of p is a rebase: 2 after a DROPPED_STALE, 1 after a REJECTED */
    int fetch_want;     /* a Fetch of p is to be sent at fetch_at (a Welcome, or a refused update) */
    int64_t fetch_at;
    int64_t fetch_sent; /* when the pending Fetch of p left (dl_clock_ns) */
    uint64_t known;     /* newest version of p known: held, announced by the last Welcome, or received */
    int64_t busy_until; /* the synchronizer's pool was full: no push of p before this (dl_clock_ns) */
    /* a chunked Update arriving: elements [0, rx_off) of version rx_version
     * are in rx (kept across a re-hello or a new connection: a Fetch resumes
     * from there); NULL when none */
    float *rx;
    uint64_t rx_version, rx_off;
    uint64_t gap_at;    /* rx_off + 1 when a resume Fetch was asked for that gap (0: none) */
    int64_t rx_t;       /* when the latest chunk of p's Update (fp32 or delta) arrived (dl_clock_ns) */
    /* push encoding: the encoded push of p (dl_codec_bytes of numel_p; NULL
     * until its first encoded push) and how many pushes of p were encoded
     * (the stochastic rounding seed's counter) */
    uint8_t *enc;
    uint64_t encodes;
    /* delta Updates (Welcome.update_codec != 0 only): mirror = the fp32
     * values of version mirror_version, the last version of p this session
     * handed to the update slot (a full Update's values, or mirror + delta);
     * stage = version stage_version being assembled, elements [0, stage_off)
     * decoded onto the mirror. NULL while there is none. */
    float *mirror, *stage;
    uint64_t mirror_version, stage_version, stage_off;
    int mirror_ok, stage_active;
} sfrag;

/* The chunked push leaving (one at a time): chunks [0, off) of the claimed
 * push of fragment p have been handed to libzmq. */
typedef struct {
    int active, p;
    dl_mailbox_claim cl;
    uint64_t transfer, off;
    uint64_t cn;            /* elements per chunk (every one but the last), fixed at its start */
    const uint8_t *payload; /* the whole push as encoded (fp32: the delta's bytes) */
} ptx;

struct dl_comms {
    /* ---- immutable after open */
    dl_mailbox *mb;
    int link; /* our number in the mailbox */
    int adopt_keep; /* dl_comms_opts.adopt_keep */
    char endpoint[256];
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    char run_id[129];
    char device[129];
    int P;
    int shard, shards; /* the synchronizer shard we talk to (shards >= 1; 1 = unsharded) */
    int *served; /* [n_served] the fragments we serve, ascending */
    int n_served;
    uint64_t *numel; /* [P] floats per fragment: a uint64 array because dl_wire_limits borrows it */
    size_t maxn;     /* floats per swapped buffer */
    uint64_t fingerprint;
    uint32_t n_layer, n_head, n_embd, seq_len, vocab, batch;
    const struct dl_manifest *manifest; /* borrowed; NULL: a GPT-2 learner */
    uint64_t max_tokens_per_step;       /* Hello.max_tokens_per_step of a manifest learner */
    uint64_t instance;      /* Hello.instance */
    char curve_server[41], curve_public[41], curve_secret[41]; /* Z85; "" = plain */
    uint64_t max_jump;  /* max_version_jump */
    int byzantine;
    float byz_scale;
    dl_codec_enc penc;  /* push codec, rounding (the seed is set per push) */
    size_t maxmsg;      /* ZMQ_MAXMSGSIZE: largest served fragment's fp32 bytes + header */
    int silence_rebuild_ms;
    int hello_retry_ms, hello_retry_max_ms, hello_unsent_ms, connect_timeout_ms, poll_max_ms, silence_min_ms,
        ack_expiry_min_ms, bye_linger_ms, reconnect_ms, reconnect_max_ms, tcp_stall_ms;
    int efd; /* eventfd: training thread (through the mailbox) -> this thread */

    /* ---- guarded by mu (read by other threads: stats and state) */
    pthread_mutex_t mu;
    int stop_req;
    dl_comms_stats st;
    char msg[640];

    /* ---- comms thread only */
    void *ctx, *sock;       /* sock NULL between a rebuild and its reopen (t_reopen) */
    void *mon;              /* PAIR reading the DEALER's socket monitor */
    unsigned mon_seq;       /* makes each monitor's inproc endpoint unique */
    pthread_t thread;
    int started;
    dl_wire_limits lim;
    sfrag *f;               /* [P] */
    float *send_spare;      /* [maxn] */
    float *byz_buf;         /* [maxn] byzantine only: the corrupted copy of a push's delta */
    int *refusals;          /* [n_served] scratch for dl_mailbox_take_refetches */
    uint64_t *hv;           /* [P] held_versions being sent (contiguous: it goes on the wire as is) */
    uint32_t *fetch_list;   /* [P] fragments of the next Fetch (likewise) */
    uint32_t *final_pending; /* [P] a final push's Push.final_pending (dl_mailbox_claim.pending) */
    uint64_t *resume_v, *resume_o; /* [P] its resume points */
    uint64_t seq;
    uint64_t sync_seq;      /* Envelope.seq of the newest message of this epoch received: Heartbeat.received_seq */
    uint64_t epoch;         /* epoch of the last Welcome taken (mirror of st.epoch) */
    int state;              /* mirror of st.state */
    int ever_welcomed;
    int hello_wait_ms, hello_sent_once; /* current Hello retry period (backoff) */
    uint32_t hb_ms, liveness;
    int64_t t_start, t_hello, t_hb, t_recv, t_warn;
    int64_t t_sock;         /* when the current socket was opened */
    double rx_ns_per_byte;  /* our downlink's pace between consecutive chunks of one Update, ns per payload byte
                             * (0: none seen; a moving mean): the synchronizer had the later chunk queued */
    int64_t t_reopen;       /* when a rebuilt socket opens (sock NULL until then) */
    int64_t t_fetch;        /* earliest fetch_at of a wanted Fetch, NEVER when none */
    int sent_on_sock;       /* a message left on the current socket */
    int any_epoch;          /* a new connection: its first Welcome is taken whatever its epoch */
    int rebuilds_row;       /* rebuilds in a row (their backoff): since the last Welcome, or after bad messages
                               since the last good Update or Ack (a Welcome alone does not prove the connection) */
    int rebuild_bad;        /* the latest rebuild was for bad messages */
    int64_t t_update_rx;    /* when the latest Update (or chunk of one) arrived, dl_clock_ns */
    int bad_row;            /* inbound messages rejected by proto/wire.c in a row */
    char conn_err[512];     /* the last connection problem, for the connect-timeout message */
    int auth_denied;        /* the synchronizer's ZAP refused this learner's key for good (status 400) */
    int hs_mismatch;        /* the last handshake failed on the security mechanism (CURVE on one side only) */
    int hs_failed;          /* CURVE handshakes failed in a row without a status (e.g. a wrong server_key);
                             * a handshake that succeeds resets it */
    int hello_unsent; /* the last Hello found no connection */
    int rr; /* round-robin start for fairness among fragments */
    dl_wire_queue *outq;    /* payload bytes of ours libzmq still holds (the push window) */
    uint64_t chunk;         /* chunk, elements, from the last Welcome (0 = whole pushes; its Updates' chunks are
                               at most this) */
    uint64_t push_chunk;    /* push chunk, elements: the last Welcome's, then the latest Ack.chunk_bytes (the
                               synchronizer sizes it from our measured uplink) */
    uint64_t transfers;     /* transfer ids given out */
    ptx tx;                 /* the chunked push leaving */
    dl_ef *ef;              /* error feedback of encoded pushes (learner/ef.h) */
    uint32_t update_codec;  /* Welcome.update_codec of the last Welcome: delta Updates come (0: none) */
    uint64_t epoch_mirrors; /* the epoch whose versions the mirrors hold */
};

#define COUNT(field)                                                                                     \
    do {                                                                                                 \
        pthread_mutex_lock(&c->mu);                                                                      \
        c->st.field++;                                                                                   \
        pthread_mutex_unlock(&c->mu);                                                                    \
    } while (0)

#define NET_STR_CAP (4 * 1024 + 3) /* a max_text string, every byte escaped */

/* comms.c: the session's state (under mu, mirrored in c->state and the mailbox's link) and what it says */
void dl_comms_set_state(dl_comms *c, int state, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* comms.c: a refusal that cannot heal by retrying: the session stops */
void dl_comms_refuse(dl_comms *c, const char *kind, const char *text, const char *raw);
/* comms.c: text from the network, quoted and escaped for a log line (cap >= 3; NET_STR_CAP holds any) */
const char *dl_comms_net_str(const char *s, char *buf, size_t cap);
/* comms.c: send one message, never blocking: DL_EAGAIN at the high-water mark or without a socket */
int dl_comms_send_env(dl_comms *c, Dloco__V1__Envelope *env, const void *payload, size_t bytes_len);
/* comms.c: the silence limit, ms */
int64_t dl_comms_silence_ms(const dl_comms *c);

/* comms_admit.c: admission */
void dl_comms_admit_hello(dl_comms *c);
/* a Welcome answering our Hello (state HELLO) */
void dl_comms_admit_welcome(dl_comms *c, uint64_t epoch, const Dloco__V1__Welcome *w);
/* a new session on the same socket; with `forget` the pushes sent are forgotten */
void dl_comms_admit_rehello(dl_comms *c, const char *why, int forget);
void dl_comms_admit_heartbeat(dl_comms *c);
void dl_comms_admit_bye(dl_comms *c, const char *reason, uint64_t step);
/* an Error from the synchronizer: 1 when the thread must stop (a fatal one) */
int dl_comms_admit_error(dl_comms *c, const Dloco__V1__Error *e);

/* comms_uplink.c: pushes leaving. Send what flow control allows: 1 when the socket is full (retry soon) */
int dl_comms_uplink_send(dl_comms *c, int64_t now);
/* stop the chunked push leaving: requeued, or gone; decided: an Ack already settled it */
void dl_comms_uplink_abort(dl_comms *c, int requeue, int decided, const char *why);
/* the answers to the pushes sent will never come */
void dl_comms_uplink_forget(dl_comms *c);
/* the answer to fragment p's undecided push will never come (it was never answered: Welcome.answered_bases) */
void dl_comms_uplink_forget_push(dl_comms *c, int p);
void dl_comms_uplink_ack(dl_comms *c, const Dloco__V1__Ack *a);

/* comms_downlink.c: what comes back. Send the Fetches whose time has come (READY only) */
void dl_comms_downlink_fetch(dl_comms *c, int64_t now);
/* ask for a Fetch of p at `at` (merged with an earlier request) */
void dl_comms_downlink_want(dl_comms *c, int p, int64_t at);
/* Fetches whose reply never came, counted as refused replies */
void dl_comms_downlink_timeouts(dl_comms *c, int64_t now);
/* Fetches asked for through the mailbox (refused updates), with their backoff */
void dl_comms_downlink_refetches(dl_comms *c, int64_t now);
void dl_comms_downlink_update(dl_comms *c, const Dloco__V1__Update *u, dl_wire_msg *m);
/* 1 when p is served by this session; counts a bad message otherwise */
int dl_comms_downlink_served(dl_comms *c, int p, const char *what);

#endif
