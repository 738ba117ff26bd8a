/* ZeroMQ framing and validation of the dloco wire protocol (proto/dloco.proto):
 * socket options, multipart send/receive, and the checks every inbound header passes.
 *
 * A message is [header][payload...]: the header frame is a packed
 * dloco.v1.Envelope, each payload frame is raw tensor bytes (never protobuf).
 * On a ROUTER the frames are preceded by the peer's routing-id frame; DEALERs
 * send and receive without it. There is no empty delimiter frame (no REQ/REP).
 *
 * Who checks what: dl_wire_recv/dl_wire_unpack reject anything structurally
 * wrong (undecodable, unknown enum, out-of-range index, payload length that
 * disagrees with codec+numel, non-finite float, oversize string...) with
 * DL_EPROTO and a specific message in dl_errmsg(). Semantic checks (epoch,
 * run_id, fingerprint, staleness, which connection may speak for which
 * learner id, counters and values of a push) are the caller's. */
#ifndef DL_PROTO_WIRE_H
#define DL_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "core/codec.h"
#include "proto/dloco.pb-c.h"

/* Envelope.protocol_version this build speaks (and the only one it accepts:
 * a peer of another version is refused with a message naming both).
 * 1: Push/Update checksums were XXH64. 2: they are XXH3_64bits. 3: codecs
 * e3m0 and topk, per-block payload layouts (core/codec.h), chunked block
 * codecs, delta Updates. */
#define DL_WIRE_PROTOCOL_VERSION 3u
/* Protocol-wide caps, independent of the run's limits. */
#define DL_WIRE_MAX_FRAGMENTS 4096u   /* fragments per plan */
#define DL_WIRE_MAX_PAYLOADS 4        /* payload frames dl_wire_recv keeps */
#define DL_WIRE_MAX_HEADER_BYTES 65536u /* packed Envelope; 4096 held versions fit */
#define DL_WIRE_LEARNER_ID_MAX 64     /* learner_id: [A-Za-z0-9._-]{1,64} */
#define DL_WIRE_ROUTING_ID_MAX 255    /* libzmq's own limit */
#define DL_WIRE_USER_ID_MAX 127       /* ZAP User-Id kept per message ("<learner id> <z85 key>" is 105) */
#define DL_WIRE_BLOCK_MIN DL_CODEC_BLOCK_MIN /* block codecs: elements per block (core/codec.h) */
#define DL_WIRE_BLOCK_MAX DL_CODEC_BLOCK_MAX
/* Chunked transfers (docs/PROTOCOL.md): a chunk's payload is at least
 * DL_WIRE_CHUNK_MIN bytes (but the last one of a fragment) and Welcome.chunk_bytes at most
 * DL_WIRE_CHUNK_MAX. */
#define DL_WIRE_CHUNK_MIN 4096u
#define DL_WIRE_CHUNK_MAX (64u << 20)
#define DL_WIRE_RETRY_MAX_MS 600000u /* Ack.retry_after_ms */
#define DL_WIRE_FLEET_SPS_MAX 1e9     /* Ack.fleet_steps_per_s, inner steps per second */
/* Per-peer-pipe high-water mark in messages (ZMQ HWMs count per connection).
 * A learner has at most a few pushes and heartbeats in flight, so 64 is deep
 * enough, and it bounds queued fragment copies per peer instead of letting a
 * stalled peer pin gigabytes. */
#define DL_WIRE_HWM 64
/* A ROUTER's inbound pipes (the synchronizer's, one per connection) hold at
 * most about this many bytes of messages as large as its message cap:
 * RCVHWM = this / max_msg_bytes, in [DL_WIRE_HWM_MIN, DL_WIRE_HWM]. With
 * 64 KiB push chunks that is DL_WIRE_HWM; with 1 MiB ones (push chunks that
 * grew on a fast link, docs/PROTOCOL.md "Chunked transfers") 7 messages, not
 * 64 MiB per connection. A full pipe stops libzmq reading that connection
 * (TCP's window then holds the sender back); nothing is dropped. */
#define DL_WIRE_ROUTER_INBOUND_BYTES (8u << 20)
#define DL_WIRE_HWM_MIN 4

/* The learner id alphabet: 1 when byte c is in [A-Za-z0-9._-]. */
static inline int dl_wire_id_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
}
/* 1 when the n bytes at s are a learner id: [A-Za-z0-9._-]{1,DL_WIRE_LEARNER_ID_MAX}. */
int dl_wire_id_ok_n(const char *s, size_t n);
/* The same for a NUL-terminated string (NULL: 0). */
int dl_wire_id_ok(const char *s);

/* Bounds a receiver enforces. Get one from dl_wire_limits_default() and set
 * the run's plan on it (num_fragments, fragment_numel). */
typedef struct {
    /* Fragments in this run's plan: every fragment index must be below it,
     * Hello/Welcome num_fragments must equal it. 0 = not known yet: indices
     * are then only bounded by DL_WIRE_MAX_FRAGMENTS and the caller must check
     * them against its own plan. */
    uint32_t num_fragments;
    /* [num_fragments] fp32 elements of each fragment, or NULL = unknown (then
     * numel is only bounded by max_numel). Borrowed: must outlive the limits. */
    const uint64_t *fragment_numel;
    uint64_t max_numel;     /* elements, when fragment_numel is NULL */
    size_t max_name;        /* bytes: run_id, Hello.device, Welcome.policy */
    size_t max_text;        /* bytes: Ack.reason, Bye.reason, Error.message */
    int max_frames;         /* frames after the routing id: header + payloads,
                             * in [2, 1 + DL_WIRE_MAX_PAYLOADS] */
    bool verify_checksum;   /* dl_wire_recv hashes Push/Update payloads */
    /* The receiver is shard `shard` of `shards` of a sharded synchronizer
     * (core/shard.h; needs num_fragments): a Push or Fetch naming a fragment
     * it does not own is rejected, and Heartbeat/Bye discarded_tokens are
     * bounded by tokens x the fragments it owns. shards 0 or 1 = unsharded. */
    uint32_t shard, shards;
} dl_wire_limits;

/* num_fragments 0, fragment_numel NULL, max_numel 2^32, max_name 128,
 * max_text 1024, max_frames 2, verify_checksum true, unsharded. */
dl_wire_limits dl_wire_limits_default(void);

/* ---- the ZeroMQ error boundary: every zmq call goes through one of these */

/* Record a failed zmq call: reads zmq_errno() and returns DL_EAGAIN for
 * EAGAIN/EINTR (would block: the caller retries), DL_ENOTFOUND for
 * EHOSTUNREACH (ROUTER_MANDATORY: peer not connected), DL_ENOMEM, else
 * DL_ENET with "file:line: call: zmq_strerror" in dl_errmsg(). */
int dl_wire_zmq_fail(const char *call, const char *file, int line);
/* The same for a place that cannot return (a cleanup): logs a warning. */
void dl_wire_zmq_warn(const char *call, const char *file, int line);

/* Call returning an int (-1 on failure); the enclosing function returns the
 * DL_E* code:  DL_ZMQ_CALL(zmq_connect(sock, ep)); */
#define DL_ZMQ_CALL(call)                                                                                \
    do {                                                                                                 \
        if ((call) == -1) return dl_wire_zmq_fail(#call, __FILE__, __LINE__);                            \
    } while (0)
/* Call returning a pointer (NULL on failure), assigned to lhs. */
#define DL_ZMQ_PTR(lhs, call)                                                                            \
    do {                                                                                                 \
        if (!((lhs) = (call))) return dl_wire_zmq_fail(#call, __FILE__, __LINE__);                       \
    } while (0)
/* Call whose failure can only be logged (void cleanup paths). */
#define DL_ZMQ_LOG(call)                                                                                 \
    do {                                                                                                 \
        if ((call) == -1) dl_wire_zmq_warn(#call, __FILE__, __LINE__);                                   \
    } while (0)
/* Call as an expression: its result, or the DL_E* code when it failed
 * (for zmq_poll's count, and sends whose DL_EAGAIN the caller handles). */
#define DL_ZMQ_RC(call) ({ int zr_ = (call); zr_ == -1 ? dl_wire_zmq_fail(#call, __FILE__, __LINE__) : zr_; })

/* ---- socket setup */

/* Options every dloco socket gets: ZMQ_LINGER 0 (close never blocks on
 * unsent data), ZMQ_MAXMSGSIZE = max_msg_bytes (a larger inbound frame makes
 * libzmq drop the connection; the message is never delivered), SNDHWM/RCVHWM
 * DL_WIRE_HWM (a ROUTER's RCVHWM: DL_WIRE_ROUTER_INBOUND_BYTES of max_msg_bytes messages), TCP keepalive (idle 30 s, interval 10 s, 3 probes: half-open
 * connections die in about a minute, NAT state stays warm, and what was
 * queued for a vanished peer goes with them), reconnect backoff 100 ms
 * doubling to 10 s. No ZMTP heartbeats: libzmq 4.3 only counts a completely
 * received frame as traffic, so its heartbeat timeout cuts any connection on
 * which one frame (a large fragment on a thin link) takes longer. A ROUTER (is_router) also gets ZMQ_ROUTER_MANDATORY
 * (sending to an unknown peer fails with DL_ENOTFOUND instead of vanishing)
 * and keeps ZMQ_ROUTER_HANDOVER off: a second connection that presents a
 * routing id already in use is never attached (libzmq ignores it), so no
 * connection can take over another's route. dloco learners set no routing
 * id; libzmq gives each connection a fresh one, and the synchronizer binds a
 * learner id to the connection it said Hello on (see synchronizer/sync.c).
 * Call before bind/connect. Returns 0 or DL_ENET. */
int dl_wire_sock_setup(void *sock, int is_router, size_t max_msg_bytes);
/* The RCVHWM dl_wire_sock_setup gives a ROUTER whose message cap is max_msg_bytes. */
int dl_wire_router_rcvhwm(size_t max_msg_bytes);

/* Seed the C library's rand() from the kernel's random source (getrandom;
 * the clock and pid if that fails). Call once before creating a ROUTER that
 * peers connect to. Why: libzmq 4.3 gives a connection without a routing id
 * the id 0x00 + a 32-bit counter whose start it draws from rand() when the
 * socket is created (a REP or ROUTER each draw one), and it aborts the
 * process when that id is already held by a connection that presented it
 * itself (it never checks the ids it makes). Unseeded, rand() starts the same
 * in every run, so any peer could present the next ids; seeded, a peer
 * holding k presented ids hits the counter with probability about k x m /
 * 2^32 over m later connections without an id (docs/SECURITY.md). Nothing
 * else in dloco uses rand(). */
void dl_wire_seed_routing_ids(void);

/* ---- outbound queue accounting
 *
 * What a sender hands to zmq_send stays in libzmq (its pipes, then the
 * kernel's socket buffer) until the peer reads it; ZMQ_SNDHWM bounds that in
 * messages, not bytes. A dl_wire_queue counts the payload bytes of messages
 * sent through dl_wire_send_q that libzmq still holds: the count goes up at
 * send and down when libzmq frees the message (its free callback, from
 * libzmq's I/O thread; counters are atomic). One queue per peer connection
 * plus one for the whole socket give the synchronizer byte bounds. A queue
 * lives while its owner or any queued message holds it. */
typedef struct dl_wire_queue dl_wire_queue;
dl_wire_queue *dl_wire_queue_new(void);
/* dl_wire_queue_new returning NULL when out of memory (a library's path). */
dl_wire_queue *dl_wire_queue_try_new(void);
/* Drop the owner's reference and NULL the pointer; safe on NULL. */
void dl_wire_queue_release(dl_wire_queue **q);
uint64_t dl_wire_queue_bytes(const dl_wire_queue *q);
/* Monotonic ns when libzmq last freed a message of this queue (0 = never). */
int64_t dl_wire_queue_drained_ns(const dl_wire_queue *q);
/* Payload bytes libzmq has freed of this queue since it was made: with
 * dl_wire_queue_drained_ns, what a connection drains per second. */
uint64_t dl_wire_queue_drained_bytes(const dl_wire_queue *q);
/* Call fn(ctx) after every message of this queue that libzmq frees (from
 * its I/O thread: fn must be thread-safe and quick, e.g. ev_async_send or
 * an eventfd write), so a sender waiting for room learns of it without
 * polling. fn NULL stops the calls; clear it before the context that fn
 * uses goes away (calls in flight finish with the old ctx, so ctx must live
 * until zmq_ctx_term has returned). */
typedef void (*dl_wire_wake_fn)(void *ctx);
void dl_wire_queue_set_wake(dl_wire_queue *q, dl_wire_wake_fn fn, void *ctx);

/* ---- building messages */

/* Zero `env` and fill the common header: protocol_version, run_id, epoch,
 * learner_id (the sender's id on learner->synchronizer messages, the
 * addressee's on synchronizer->learner ones). Strings are borrowed, not
 * copied: they must live until dl_wire_send returns. seq is left 0 and no
 * body is set; use dl_wire_set_<body>() below. */
void dl_wire_env_init(Dloco__V1__Envelope *env, const char *run_id, uint64_t epoch,
                      const char *learner_id);

/* dl_wire_set_push(env, &push) etc.: set the oneof body. The body struct is
 * borrowed (initialise it with dloco__v1__push__init first). */
#define DL_WIRE_BODY_SETTER(name, Type, CASE)                                  \
    static inline void dl_wire_set_##name(Dloco__V1__Envelope *env, Dloco__V1__##Type *b) \
    {                                                                          \
        env->body_case = DLOCO__V1__ENVELOPE__BODY_##CASE;                     \
        env->name = b;                                                         \
    }
DL_WIRE_BODY_SETTER(hello, Hello, HELLO)
DL_WIRE_BODY_SETTER(welcome, Welcome, WELCOME)
DL_WIRE_BODY_SETTER(heartbeat, Heartbeat, HEARTBEAT)
DL_WIRE_BODY_SETTER(push, Push, PUSH)
DL_WIRE_BODY_SETTER(ack, Ack, ACK)
DL_WIRE_BODY_SETTER(update, Update, UPDATE)
DL_WIRE_BODY_SETTER(fetch, Fetch, FETCH)
DL_WIRE_BODY_SETTER(bye, Bye, BYE)
DL_WIRE_BODY_SETTER(error, Error, ERROR)
#undef DL_WIRE_BODY_SETTER

/* "hello", "push", ... or "none" / "unknown"; for logs. */
const char *dl_wire_body_name(Dloco__V1__Envelope__BodyCase body);
/* "fp32", "bf16", "int8", "int4", or "unknown". */
/* Error.kind: the protocol's own refusal reasons (dloco.proto ErrorKind).
 * DL_E* codes never travel: a sender maps its code with dl_wire_error_kind_of
 * (EINVAL invalid, EPROTO protocol, EMISMATCH mismatch, ENOTFOUND unknown
 * learner, ERANGE full, anything else internal). */
Dloco__V1__ErrorKind dl_wire_error_kind_of(int dl_code);
int dl_wire_error_kind_valid(int kind); /* a known kind other than UNSPECIFIED */
const char *dl_wire_error_kind_name(int kind);
/* The kind of a received (validated) Error: Error.kind, or for a peer from
 * before ErrorKind (kind unset, only the deprecated code) the kind of that code. */
Dloco__V1__ErrorKind dl_wire_error_kind(const Dloco__V1__Error *e);
const char *dl_wire_codec_name(Dloco__V1__Codec codec);

/* ---- payload sizes and checksums */

/* Bytes of a payload frame holding `numel` elements in `codec` with
 * block_size and topk (core/codec.h dl_codec_bytes: the layouts). Returns 0
 * when there is no valid size: numel 0, unknown codec, a block size or topk
 * invalid for the codec (core/codec.h dl_codec_check), or a size that
 * overflows size_t. */
size_t dl_wire_payload_bytes(Dloco__V1__Codec codec, uint64_t numel, uint32_t block_size, uint32_t topk);

/* dl_checksum64(payload, len), XXH3_64bits: the Push/Update checksum field
 * (protocol version 2; version 1 carried XXH64). */
uint64_t dl_wire_checksum(const void *payload, size_t len);
bool dl_wire_checksum_ok(const void *payload, size_t len, uint64_t expected);

/* ---- validation */

/* Structural check of a decoded header against the run's limits (lim NULL =
 * dl_wire_limits_default()) and the byte lengths of the npayload payload
 * frames that came with it. Returns 0, or DL_EPROTO with a message naming the
 * body and the offending value, e.g.
 * "push: payload is 4096 bytes, fp32 x 1000 needs 4000". Checks: body set;
 * protocol_version; learner_id matches [A-Za-z0-9._-]{1,64} (may be empty
 * only on Error); other strings within max_name/max_text and free of control
 * bytes; fragment indices in range; numel equal to the plan's; codec and
 * decision known; block_size in range for int codecs and 0 otherwise;
 * payload frame count exactly what the body needs (Push/Update 1, others 0);
 * payload length exactly dl_wire_payload_bytes(); Push steps >= 1 and
 * tokens >= steps; doubles finite; repeated fields bounded by num_fragments;
 * Fetch indices distinct; a Push's final_pending ascending, without its own
 * fragment, only on a final push; a sharded receiver's Push and Fetch name only its
 * own fragments; a Welcome's shard layout is valid (shard < shards <=
 * num_fragments, or unsharded with shard 0). The checksum is not checked
 * here (see recv). */
int dl_wire_validate(const Dloco__V1__Envelope *env, const size_t *payload_lens, int npayload,
                     const dl_wire_limits *lim);

/* Decode a header frame and validate it as above. On success *out is a new
 * envelope to free with dl_wire_env_free(); on failure *out is NULL and the
 * return is DL_EPROTO ("undecodable header (N bytes)" for bad protobuf, "header
 * is N bytes, max M" when too large) or DL_ENOMEM. */
int dl_wire_unpack(const void *hdr, size_t hdr_len, const size_t *payload_lens, int npayload,
                   const dl_wire_limits *lim, Dloco__V1__Envelope **out);
/* Free an envelope from dl_wire_unpack and NULL the pointer; safe on NULL. */
void dl_wire_env_free(Dloco__V1__Envelope **env);

/* ---- manifests in a Hello (docs/PROTOCOL.md "Manifests") */

struct dl_manifest;
/* The manifest a validated Hello carries, in *out (free with
 * dl_manifest_close); *out NULL and 0 when it carries none (a GPT-2
 * learner described by n_layer..vocab alone). When n_layer..vocab are set
 * beside it, the manifest is tagged as that GPT-2 config, so it gets the
 * GPT-2 fingerprint. DL_EINVAL naming the tensor (duplicate names, a model
 * past 2^40 floats), DL_EMISMATCH (the tensors are not that GPT-2 config's),
 * DL_ENOMEM: a refusal of that learner, not a malformed message. */
int dl_wire_hello_manifest(const Dloco__V1__Hello *h, struct dl_manifest **out);

/* The protobuf-c arrays of a Hello's manifest (the names are borrowed from
 * the manifest, which must outlive the send). */
typedef struct {
    Dloco__V1__TensorSpec *specs;
    Dloco__V1__TensorSpec **ptrs;
    uint64_t *shapes;
} dl_wire_manifest_buf;
/* Put manifest m into Hello h (and, for a GPT-2 manifest, its config into
 * n_layer..vocab), with the arrays in *buf; free them with
 * dl_wire_manifest_buf_free after dl_wire_send. DL_EINVAL from
 * dl_manifest_check, DL_ENOMEM. dloco-learner sends no manifest, so its
 * Hello stays byte for byte what it was. */
int dl_wire_hello_set_manifest(Dloco__V1__Hello *h, const struct dl_manifest *m, dl_wire_manifest_buf *buf);
/* Free and zero; safe on a zeroed buffer and twice. */
void dl_wire_manifest_buf_free(dl_wire_manifest_buf *buf);

/* ---- send / receive */

/* Pack `env` into the header frame and send [routing id][header][payloads...]
 * as one atomic multipart message (routing id only when id_len > 0, i.e. on a
 * ROUTER; pass NULL, 0 on a DEALER). The envelope is validated first with the
 * default limits against `lens`, so an invalid message (say a NaN loss) is
 * refused locally with DL_EINVAL instead of being rejected by the peer.
 * Ownership: nothing is retained. zmq_send copies each payload into a zmq
 * message before returning, so the caller may reuse or free its buffers at
 * once; that one memcpy per payload buys independence from zmq's I/O thread
 * (true zero-copy would tie the buffer's lifetime to a free callback).
 * flags: 0 (block at the high-water mark) or ZMQ_DONTWAIT.
 * Returns 0; DL_EAGAIN (ZMQ_DONTWAIT and the peer's queue is full; nothing
 * was sent); DL_ENOTFOUND (ROUTER: no connected peer has that routing id);
 * DL_EINVAL; DL_ENOMEM; DL_ENET. */
int dl_wire_send(void *sock, const void *routing_id, size_t id_len, const Dloco__V1__Envelope *env,
                 const void *const *payloads, const size_t *lens, int npayload, int flags);
/* dl_wire_send, and the payload bytes count in each non-NULL queue of q[0],
 * q[1] until libzmq frees them (the payload is copied into a buffer libzmq
 * owns, as dl_wire_send does). */
int dl_wire_send_q(void *sock, const void *routing_id, size_t id_len, const Dloco__V1__Envelope *env,
                   const void *const *payloads, const size_t *lens, int npayload, int flags,
                   dl_wire_queue *const q[2]);

/* ---- shared payloads: one buffer sent to many peers without a copy
 *
 * A blob is an immutable copy of payload bytes and their checksum
 * (dl_wire_checksum), made once and sent to any number of peers by
 * dl_wire_send_blob_q: each send hands libzmq a reference instead of a
 * copy, and libzmq's free callback (its I/O thread) drops it. References
 * are atomic; the bytes are freed with the last one. So an Update chunk
 * going to N learners costs one copy and one hash, not N of each. */
typedef struct dl_wire_blob dl_wire_blob;
/* A blob of a copy of the len bytes at data (len >= 1), with their checksum;
 * NULL when out of memory (dl_errmsg says so). The caller holds one reference. */
dl_wire_blob *dl_wire_blob_try_new(const void *data, size_t len);
const void *dl_wire_blob_data(const dl_wire_blob *b);
size_t dl_wire_blob_len(const dl_wire_blob *b);
uint64_t dl_wire_blob_checksum(const dl_wire_blob *b);
/* One more reference to b (returns b). */
dl_wire_blob *dl_wire_blob_ref(dl_wire_blob *b);
/* Drop a reference and NULL the pointer; the last one frees the blob; safe on NULL. */
void dl_wire_blob_release(dl_wire_blob **b);
/* References held now (the caller's, the queued messages', ...): for tests. */
int64_t dl_wire_blob_refs(const dl_wire_blob *b);
/* dl_wire_send_q of one payload frame, the blob's bytes, without copying
 * them: the message holds a reference until libzmq frees it (counted in the
 * queues of q as dl_wire_send_q counts a copy). The caller keeps its own. */
int dl_wire_send_blob_q(void *sock, const void *routing_id, size_t id_len, const Dloco__V1__Envelope *env,
                        dl_wire_blob *blob, int flags, dl_wire_queue *const q[2]);

/* One received message. Payload data stays inside zmq messages (zero-copy:
 * no copy after libzmq's own receive) until dl_wire_msg_close(). */
typedef struct {
    uint8_t id[DL_WIRE_ROUTING_ID_MAX + 1]; /* ROUTER: sender's routing id, NUL-terminated */
    size_t id_len;                          /* bytes of id; 0 on a DEALER */
    char user_id[DL_WIRE_USER_ID_MAX + 1];  /* the ZAP User-Id of the connection (CURVE), "" without */
    Dloco__V1__Envelope *env;               /* validated header; NULL unless recv returned 0 */
    int npayload;                           /* payload frames held in payload[] */
    zmq_msg_t payload[DL_WIRE_MAX_PAYLOADS];
} dl_wire_msg;

/* Receive one whole multipart message (all of its frames are always drained,
 * so a bad message never desynchronises the next one), decode and validate
 * the header with `lim` (NULL = defaults: then fragment indices are only
 * bounded by DL_WIRE_MAX_FRAGMENTS and the caller must check them), and, if
 * lim->verify_checksum, compare the Push/Update checksum with the payload.
 * `out` needs no initialisation. Returns
 *   0          out->env, out->payload[] and (ROUTER) out->id are set;
 *   DL_EAGAIN  flags had ZMQ_DONTWAIT and nothing was waiting (or a signal
 *              interrupted the wait);
 *   DL_EPROTO  a message arrived and was rejected: dl_errmsg() says why;
 *              out->id is still set so a ROUTER can answer with an Error;
 *   DL_ENET    socket failure (context terminated, ...).
 * Call dl_wire_msg_close(out) after every call, whatever it returned.
 * Payload data has no alignment guarantee (it may sit at any byte offset in
 * libzmq's receive buffer): decode with memcpy or unaligned loads. */
int dl_wire_recv(void *sock, int is_router, const dl_wire_limits *lim, dl_wire_msg *out, int flags);

/* Payload frame i of a received message: bytes and length. */
const void *dl_wire_msg_payload(dl_wire_msg *m, int i);
size_t dl_wire_msg_payload_len(dl_wire_msg *m, int i);

/* Release the header and payload frames; `m` becomes empty. Safe twice and
 * on a zero-initialised dl_wire_msg. */
void dl_wire_msg_close(dl_wire_msg *m);

#endif
