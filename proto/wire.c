/* ZeroMQ framing and validation of the dloco wire protocol: packs and sends
 * [routing id][Envelope][payload...], receives and checks every inbound header. */
#include "proto/wire.h"

#include "core/codec.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/shard.h"

dl_wire_limits dl_wire_limits_default(void)
{
    dl_wire_limits lim = {
        .num_fragments = 0,
        .fragment_numel = NULL,
        .max_numel = (uint64_t)1 << 32,
        .max_name = 128,
        .max_text = 1024,
        .max_frames = 2,
        .verify_checksum = true,
    };
    return lim;
}

/* ---- zmq boundary: every failing call records file:line and zmq's reason */

int dl_wire_zmq_fail(const char *what, const char *file, int line)
{
    int e = zmq_errno();
    if (e == EAGAIN) return dl_err(DL_EAGAIN, "%s: would block", what);
    if (e == EINTR) return dl_err(DL_EAGAIN, "%s: interrupted", what);
    if (e == EHOSTUNREACH) return dl_err(DL_ENOTFOUND, "%s: peer not connected", what);
    /* users get the ZeroMQ function and its reason; the expression and
     * file:line are for the debug log */
    DL_DEBUG("%s:%d: %s: %s", file, line, what, zmq_strerror(e));
    int n = (int)strcspn(what, "(");
    if (e == ENOMEM) return dl_err(DL_ENOMEM, "ZeroMQ (%.*s): out of memory", n, what);
    return dl_err(DL_ENET, "ZeroMQ (%.*s): %s", n, what, zmq_strerror(e));
}

void dl_wire_zmq_warn(const char *what, const char *file, int line)
{
    int e = zmq_errno();
    DL_DEBUG("%s:%d: %s: %s", file, line, what, zmq_strerror(e));
    DL_WARN("ZeroMQ (%.*s): %s", (int)strcspn(what, "("), what, zmq_strerror(e));
}

static int setopt_int(void *sock, int opt, int v)
{
    DL_ZMQ_CALL(zmq_setsockopt(sock, opt, &v, sizeof v));
    return 0;
}

void dl_wire_seed_routing_ids(void)
{
    unsigned seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
        DL_WARN("no random source for the routing-id counter (getrandom: %s); seeding it from the clock",
                strerror(errno));
        seed = (unsigned)dl_clock_ns() ^ ((unsigned)getpid() << 16);
    }
    srand(seed);
}

int dl_wire_router_rcvhwm(size_t max_msg_bytes)
{
    size_t n = DL_WIRE_ROUTER_INBOUND_BYTES / (max_msg_bytes ? max_msg_bytes : 1);
    return n < DL_WIRE_HWM_MIN ? DL_WIRE_HWM_MIN : n > DL_WIRE_HWM ? DL_WIRE_HWM : (int)n;
}

int dl_wire_sock_setup(void *sock, int is_router, size_t max_msg_bytes)
{
    assert(sock && max_msg_bytes > 0 && max_msg_bytes <= (size_t)INT64_MAX);
    int64_t maxmsg = (int64_t)max_msg_bytes;
    DL_ZMQ_CALL(zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg));
    DL_TRY(setopt_int(sock, ZMQ_LINGER, 0));
    DL_TRY(setopt_int(sock, ZMQ_SNDHWM, DL_WIRE_HWM));
    DL_TRY(setopt_int(sock, ZMQ_RCVHWM, is_router ? dl_wire_router_rcvhwm(max_msg_bytes) : DL_WIRE_HWM));
    DL_TRY(setopt_int(sock, ZMQ_TCP_KEEPALIVE, 1));
    DL_TRY(setopt_int(sock, ZMQ_TCP_KEEPALIVE_IDLE, 30));
    DL_TRY(setopt_int(sock, ZMQ_TCP_KEEPALIVE_INTVL, 10));
    DL_TRY(setopt_int(sock, ZMQ_TCP_KEEPALIVE_CNT, 3));
    DL_TRY(setopt_int(sock, ZMQ_RECONNECT_IVL, 100));
    DL_TRY(setopt_int(sock, ZMQ_RECONNECT_IVL_MAX, 10000));
    if (is_router) {
        DL_TRY(setopt_int(sock, ZMQ_ROUTER_MANDATORY, 1));
        DL_TRY(setopt_int(sock, ZMQ_ROUTER_HANDOVER, 0));
    }
    return 0;
}

/* ---- outbound queue accounting */

struct dl_wire_queue {
    _Atomic int64_t refs;
    _Atomic uint64_t bytes;
    _Atomic int64_t drained_ns;
    _Atomic uint64_t drained; /* bytes freed so far */
    _Atomic(dl_wire_wake_fn) wake;
    void *wake_ctx;
};

void dl_wire_queue_set_wake(dl_wire_queue *q, dl_wire_wake_fn fn, void *ctx)
{
    if (fn) q->wake_ctx = ctx;
    atomic_store(&q->wake, fn);
}

dl_wire_queue *dl_wire_queue_new(void)
{
    dl_wire_queue *q = dl_xcalloc(1, sizeof *q);
    atomic_init(&q->refs, 1);
    return q;
}

dl_wire_queue *dl_wire_queue_try_new(void)
{
    dl_wire_queue *q = dl_try_calloc(1, sizeof *q);
    if (q) atomic_init(&q->refs, 1);
    return q;
}

static void queue_unref(dl_wire_queue *q)
{
    if (atomic_fetch_sub(&q->refs, 1) == 1) free(q);
}

void dl_wire_queue_release(dl_wire_queue **q)
{
    if (!q || !*q) return;
    queue_unref(*q);
    *q = NULL;
}

uint64_t dl_wire_queue_bytes(const dl_wire_queue *q) { return q ? atomic_load(&q->bytes) : 0; }
int64_t dl_wire_queue_drained_ns(const dl_wire_queue *q) { return q ? atomic_load(&q->drained_ns) : 0; }
uint64_t dl_wire_queue_drained_bytes(const dl_wire_queue *q) { return q ? atomic_load(&q->drained) : 0; }

struct dl_wire_blob {
    _Atomic int64_t refs;
    size_t len;
    uint64_t checksum;
    unsigned char *data; /* 64-byte aligned, its own allocation */
};

dl_wire_blob *dl_wire_blob_try_new(const void *data, size_t len)
{
    assert(data && len > 0);
    dl_wire_blob *b = dl_try_calloc(1, sizeof *b);
    unsigned char *d = b ? dl_try_aligned(64, len) : NULL;
    if (!d) {
        free(b);
        dl_err(DL_ENOMEM, "out of memory for a %zu-byte payload", len);
        return NULL;
    }
    memcpy(d, data, len);
    b->data = d;
    b->len = len;
    /* hashed from the copy: it is in cache now, and it is what goes */
    b->checksum = dl_checksum64(d, len);
    atomic_init(&b->refs, 1);
    return b;
}

const void *dl_wire_blob_data(const dl_wire_blob *b) { return b->data; }
size_t dl_wire_blob_len(const dl_wire_blob *b) { return b->len; }
uint64_t dl_wire_blob_checksum(const dl_wire_blob *b) { return b->checksum; }
int64_t dl_wire_blob_refs(const dl_wire_blob *b) { return atomic_load(&b->refs); }

dl_wire_blob *dl_wire_blob_ref(dl_wire_blob *b)
{
    atomic_fetch_add(&b->refs, 1);
    return b;
}

void dl_wire_blob_release(dl_wire_blob **b)
{
    if (!b || !*b) return;
    if (atomic_fetch_sub(&(*b)->refs, 1) == 1) {
        free((*b)->data);
        free(*b);
    }
    *b = NULL;
}

typedef struct {
    dl_wire_queue *q[2];
    size_t len;
    dl_wire_blob *blob; /* the frame's bytes are this blob's (a reference): not freed with the message */
} queued_buf;

/* libzmq's free callback (its I/O thread, or the sender on a failed send) */
static void queued_free(void *data, void *hint)
{
    queued_buf *b = hint;
    int64_t now = dl_clock_ns();
    for (int i = 0; i < 2; i++)
        if (b->q[i]) {
            atomic_fetch_sub(&b->q[i]->bytes, b->len);
            /* the bytes before the time: who reads the time, then the bytes, counts every free up to that time */
            atomic_fetch_add(&b->q[i]->drained, b->len);
            atomic_store(&b->q[i]->drained_ns, now);
            dl_wire_wake_fn fn = atomic_load(&b->q[i]->wake);
            if (fn) fn(b->q[i]->wake_ctx);
            queue_unref(b->q[i]);
        }
    if (b->blob) dl_wire_blob_release(&b->blob);
    else free(data);
    free(b);
}

/* ---- building messages */

void dl_wire_env_init(Dloco__V1__Envelope *env, const char *run_id, uint64_t epoch,
                      const char *learner_id)
{
    assert(env && run_id && learner_id);
    dloco__v1__envelope__init(env);
    env->protocol_version = DL_WIRE_PROTOCOL_VERSION;
    /* protobuf-c declares strings char *; pack only reads them. */
    env->run_id = (char *)run_id;
    env->epoch = epoch;
    env->learner_id = (char *)learner_id;
}

const char *dl_wire_body_name(Dloco__V1__Envelope__BodyCase body)
{
    switch (body) {
    case DLOCO__V1__ENVELOPE__BODY__NOT_SET: return "none";
    case DLOCO__V1__ENVELOPE__BODY_HELLO: return "hello";
    case DLOCO__V1__ENVELOPE__BODY_WELCOME: return "welcome";
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT: return "heartbeat";
    case DLOCO__V1__ENVELOPE__BODY_PUSH: return "push";
    case DLOCO__V1__ENVELOPE__BODY_ACK: return "ack";
    case DLOCO__V1__ENVELOPE__BODY_UPDATE: return "update";
    case DLOCO__V1__ENVELOPE__BODY_FETCH: return "fetch";
    case DLOCO__V1__ENVELOPE__BODY_BYE: return "bye";
    case DLOCO__V1__ENVELOPE__BODY_ERROR: return "error";
    default: return "unknown";
    }
}

int dl_wire_error_kind_valid(int kind)
{
    return kind >= DLOCO__V1__ERROR_KIND__ERROR_KIND_INVALID && kind <= DLOCO__V1__ERROR_KIND__ERROR_KIND_BUSY;
}

const char *dl_wire_error_kind_name(int kind)
{
    switch (kind) {
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_INVALID: return "invalid";
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL: return "protocol";
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH: return "mismatch";
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER: return "unknown learner";
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_FULL: return "full";
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_INTERNAL: return "internal";
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_UNAUTHORIZED: return "unauthorized";
    case DLOCO__V1__ERROR_KIND__ERROR_KIND_BUSY: return "busy";
    default: return "unspecified";
    }
}

Dloco__V1__ErrorKind dl_wire_error_kind_of(int dl_code)
{
    switch (dl_code) {
    case DL_EINVAL: return DLOCO__V1__ERROR_KIND__ERROR_KIND_INVALID;
    case DL_EPROTO: return DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL;
    case DL_EMISMATCH: return DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH;
    case DL_ENOTFOUND: return DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER;
    case DL_ERANGE: return DLOCO__V1__ERROR_KIND__ERROR_KIND_FULL;
    case DL_EPERM: return DLOCO__V1__ERROR_KIND__ERROR_KIND_UNAUTHORIZED;
    case DL_EAGAIN: return DLOCO__V1__ERROR_KIND__ERROR_KIND_BUSY;
    default: return DLOCO__V1__ERROR_KIND__ERROR_KIND_INTERNAL;
    }
}

Dloco__V1__ErrorKind dl_wire_error_kind(const Dloco__V1__Error *e)
{
    if (e->kind != DLOCO__V1__ERROR_KIND__ERROR_KIND_UNSPECIFIED) return e->kind;
    return dl_wire_error_kind_of(e->code); /* legacy: the sender's DL_E* code of protocol v1.0 */
}

const char *dl_wire_codec_name(Dloco__V1__Codec codec)
{
    return dl_codec_name((int)codec);
}

/* ---- payload sizes and checksums */

static bool codec_known(Dloco__V1__Codec c)
{
    return (int)c >= 1 && (int)c < DL_CODEC_N;
}

size_t dl_wire_payload_bytes(Dloco__V1__Codec codec, uint64_t numel, uint32_t block_size, uint32_t topk)
{
    dl_codec c = {.id = (dl_codec_id)codec, .block = block_size, .topk = topk};
    uint64_t bytes = codec_known(codec) ? dl_codec_bytes(&c, numel) : 0;
    if (bytes > SIZE_MAX) return 0;
    return (size_t)bytes;
}

uint64_t dl_wire_checksum(const void *payload, size_t len)
{
    assert(payload || len == 0);
    return dl_checksum64(payload, len);
}

bool dl_wire_checksum_ok(const void *payload, size_t len, uint64_t expected)
{
    return dl_wire_checksum(payload, len) == expected;
}

/* ---- validation */

/* Every message text starts with the body name so a log line says where. */
static int bad(const char *body, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const char *body, const char *fmt, ...)
{
    char detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return dl_err(DL_EPROTO, "%s: %s", body, detail);
}

/* A bounded string with no control bytes (they would forge log lines).
 * protobuf-c gives "" for an absent proto3 string; NULL is treated the same. */
static int check_str(const char *body, const char *field, const char *s, size_t max)
{
    if (!s) return 0;
    size_t n = strnlen(s, max + 1);
    if (n > max) return bad(body, "%s is %zu bytes, max %zu", field, strlen(s), max);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) return bad(body, "%s has control byte 0x%02x at %zu", field, c, i);
    }
    return 0;
}

int dl_wire_id_ok_n(const char *s, size_t n)
{
    if (n < 1 || n > DL_WIRE_LEARNER_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!dl_wire_id_char((unsigned char)s[i])) return 0;
    return 1;
}

int dl_wire_id_ok(const char *s) { return s && dl_wire_id_ok_n(s, strnlen(s, DL_WIRE_LEARNER_ID_MAX + 1)); }

static int check_learner_id(const char *body, const char *id, bool may_be_empty)
{
    size_t n = id ? strnlen(id, DL_WIRE_LEARNER_ID_MAX + 1) : 0;
    if (n == 0) return may_be_empty ? 0 : bad(body, "learner_id is empty");
    if (n > DL_WIRE_LEARNER_ID_MAX)
        return bad(body, "learner_id is %zu bytes, max %d", strlen(id), DL_WIRE_LEARNER_ID_MAX);
    for (size_t i = 0; i < n; i++)
        if (!dl_wire_id_char((unsigned char)id[i]))
            return bad(body, "learner_id byte %zu is 0x%02x, allowed [A-Za-z0-9._-]", i, (unsigned char)id[i]);
    return 0;
}

static int check_finite(const char *body, const char *field, double v)
{
    if (!isfinite(v)) return bad(body, "%s is %g, must be finite", field, v);
    return 0;
}

/* Upper bound for fragment indices and counts under `lim`. */
static uint32_t frag_bound(const dl_wire_limits *lim)
{
    return lim->num_fragments ? lim->num_fragments : DL_WIRE_MAX_FRAGMENTS;
}

static int check_fragment(const char *body, uint32_t fragment, const dl_wire_limits *lim)
{
    uint32_t nf = frag_bound(lim);
    if (fragment >= nf) {
        if (lim->num_fragments) return bad(body, "fragment %u out of range (num_fragments %u)", fragment, nf);
        return bad(body, "fragment %u out of range (protocol max %u)", fragment, nf);
    }
    return 0;
}

/* A sharded receiver serves only its own fragments (core/shard.h). */
static int check_owned(const char *body, uint32_t fragment, const dl_wire_limits *lim)
{
    if (lim->shards <= 1 || dl_shard_owns((int)fragment, (int)lim->shard, (int)lim->shards)) return 0;
    return bad(body, "fragment %u belongs to shard %d of %u (p %% shards), this synchronizer is shard %u", fragment,
               dl_shard_of((int)fragment, (int)lim->shards), lim->shards, lim->shard);
}

static int check_num_fragments(const char *body, uint32_t n, const dl_wire_limits *lim)
{
    if (n == 0) return bad(body, "num_fragments is 0");
    if (lim->num_fragments && n != lim->num_fragments)
        return bad(body, "num_fragments %u, this run has %u", n, lim->num_fragments);
    if (n > DL_WIRE_MAX_FRAGMENTS) return bad(body, "num_fragments %u, protocol max %u", n, DL_WIRE_MAX_FRAGMENTS);
    return 0;
}

/* The tensor description shared by Push and Update, and its payload frame. */
static int check_tensor(const char *body, uint32_t fragment, Dloco__V1__Codec codec, uint64_t numel,
                        uint32_t block_size, uint32_t topk, uint64_t chunk_offset, uint64_t chunk_numel,
                        const size_t *lens, int npayload, const dl_wire_limits *lim)
{
    DL_TRY(check_fragment(body, fragment, lim));
    if (!codec_known(codec)) return bad(body, "unknown codec %d", (int)codec);
    if (numel == 0) return bad(body, "numel is 0");
    if (lim->fragment_numel) {
        if (numel != lim->fragment_numel[fragment])
            return bad(body, "fragment %u numel %llu, plan says %llu", fragment, (unsigned long long)numel,
                       (unsigned long long)lim->fragment_numel[fragment]);
    } else if (numel > lim->max_numel) {
        return bad(body, "numel %llu exceeds max %llu", (unsigned long long)numel,
                   (unsigned long long)lim->max_numel);
    }
    dl_codec c = {.id = (dl_codec_id)codec, .block = block_size, .topk = topk};
    char why[160];
    if (dl_codec_check(&c, why, sizeof why)) return bad(body, "%s", why);
    if (npayload != 1) return bad(body, "needs 1 payload frame, got %d", npayload);
    /* a chunk: elements [chunk_offset, chunk_offset + chunk_numel) of the fragment */
    if (chunk_numel == 0) {
        if (chunk_offset != 0) return bad(body, "chunk_offset %llu without chunk_numel", (unsigned long long)chunk_offset);
    } else {
        if (chunk_offset >= numel)
            return bad(body, "chunk_offset %llu outside numel %llu", (unsigned long long)chunk_offset,
                       (unsigned long long)numel);
        if (chunk_numel > numel - chunk_offset)
            return bad(body, "chunk [%llu, +%llu) runs past numel %llu", (unsigned long long)chunk_offset,
                       (unsigned long long)chunk_numel, (unsigned long long)numel);
        /* block codecs: a chunk starts on a block and holds whole blocks, except the fragment's last */
        if (dl_codec_is_block(c.id) &&
            (chunk_offset % block_size || (chunk_offset + chunk_numel < numel && chunk_numel % block_size)))
            return bad(body, "chunk [%llu, +%llu) of %s is not aligned to block_size %u",
                       (unsigned long long)chunk_offset, (unsigned long long)chunk_numel, dl_codec_name(c.id),
                       block_size);
        numel = chunk_numel; /* what this frame holds */
    }
    size_t need = dl_wire_payload_bytes(codec, numel, block_size, topk);
    if (need == 0)
        return bad(body, "%s x %llu has no representable size", dl_wire_codec_name(codec),
                   (unsigned long long)numel);
    if (lens[0] != need) {
        if (dl_codec_is_block(c.id))
            return bad(body, "payload is %zu bytes, %s x %llu (block %u%s) needs %zu", lens[0],
                       dl_wire_codec_name(codec), (unsigned long long)numel, block_size,
                       c.id == DL_CODEC_TOPK ? ", topk" : "", need);
        return bad(body, "payload is %zu bytes, %s x %llu needs %zu", lens[0], dl_wire_codec_name(codec),
                   (unsigned long long)numel, need);
    }
    return 0;
}

static int no_payload(const char *body, int npayload)
{
    if (npayload != 0) return bad(body, "needs 0 payload frames, got %d", npayload);
    return 0;
}

/* The structure of a Hello's manifest: count, names, dimensions, roles.
 * What needs the whole list (duplicate names, the model's total size) is
 * dl_wire_hello_manifest's, a refusal rather than a malformed message. */
static int check_manifest(const char *b, const Dloco__V1__Hello *m)
{
    if (m->n_manifest > DL_MANIFEST_TENSORS_MAX)
        return bad(b, "manifest has %zu tensors, max %d", m->n_manifest, DL_MANIFEST_TENSORS_MAX);
    for (size_t i = 0; i < m->n_manifest; i++) {
        const Dloco__V1__TensorSpec *t = m->manifest[i];
        char field[48];
        snprintf(field, sizeof field, "manifest[%zu].name", i);
        if (!t || !t->name || !t->name[0]) return bad(b, "manifest[%zu] has no name", i);
        DL_TRY(check_str(b, field, t->name, DL_TENSOR_NAME_MAX - 1));
        if (t->n_shape < 1 || t->n_shape > DL_TENSOR_NDIM_MAX)
            return bad(b, "manifest[%zu] '%s' has %zu dimensions, want 1 to %d", i, t->name, t->n_shape,
                       DL_TENSOR_NDIM_MAX);
        for (size_t d = 0; d < t->n_shape; d++)
            if (t->shape[d] < 1 || t->shape[d] > DL_MANIFEST_NUMEL_MAX)
                return bad(b, "manifest[%zu] '%s' has dimension %zu = %llu, want 1 to 2^40", i, t->name, d,
                           (unsigned long long)t->shape[d]);
        if (t->role < DLOCO__V1__TENSOR_ROLE__TENSOR_ROLE_MATRIX ||
            t->role > DLOCO__V1__TENSOR_ROLE__TENSOR_ROLE_EMBEDDING)
            return bad(b, "manifest[%zu] '%s' has role %d, want matrix, vector or embedding", i, t->name,
                       (int)t->role);
    }
    return 0;
}

static int check_hello(const Dloco__V1__Hello *m, int npayload, const dl_wire_limits *lim)
{
    const char *b = "hello";
    DL_TRY(no_payload(b, npayload));
    int any_zero = !m->n_layer || !m->n_head || !m->n_embd || !m->seq_len || !m->vocab;
    int all_zero = !m->n_layer && !m->n_head && !m->n_embd && !m->seq_len && !m->vocab;
    if (m->n_manifest) {
        /* a manifest learner: its model need not be a GPT-2 config at all */
        if (any_zero && !all_zero)
            return bad(b, "model config partly set (n_layer %u n_head %u n_embd %u seq_len %u vocab %u): with a "
                          "manifest all zero or all set",
                       m->n_layer, m->n_head, m->n_embd, m->seq_len, m->vocab);
        DL_TRY(check_manifest(b, m));
    } else if (any_zero) {
        return bad(b, "model config has a zero (n_layer %u n_head %u n_embd %u seq_len %u vocab %u)",
                   m->n_layer, m->n_head, m->n_embd, m->seq_len, m->vocab);
    }
    /* another P than the run's is the synchronizer's semantic refusal (a
     * fatal MISMATCH naming both shapes, so the learner stops), not a
     * malformed message that it would retry: only the protocol's cap here */
    dl_wire_limits any = *lim;
    any.num_fragments = 0;
    DL_TRY(check_num_fragments(b, m->num_fragments, &any));
    if (m->n_held_versions != 0 && m->n_held_versions != m->num_fragments)
        return bad(b, "held_versions has %zu entries, expected 0 or num_fragments %u", m->n_held_versions,
                   m->num_fragments);
    if (m->max_chunk_bytes && m->max_chunk_bytes < DL_WIRE_CHUNK_MIN)
        return bad(b, "max_chunk_bytes %u below the protocol's minimum %u", m->max_chunk_bytes, DL_WIRE_CHUNK_MIN);
    return check_str(b, "device", m->device, lim->max_name);
}

/* A push chunk size (Welcome.chunk_bytes, Ack.chunk_bytes): 0, or a multiple of 4 in [CHUNK_MIN, CHUNK_MAX]. */
static int check_chunk_bytes(const char *b, uint32_t v)
{
    if (v && (v < DL_WIRE_CHUNK_MIN || v > DL_WIRE_CHUNK_MAX || v % 4))
        return bad(b, "chunk_bytes %u is not a multiple of 4 in [%u, %u]", v, DL_WIRE_CHUNK_MIN, DL_WIRE_CHUNK_MAX);
    return 0;
}

static int check_welcome(const Dloco__V1__Welcome *m, int npayload, const dl_wire_limits *lim)
{
    const char *b = "welcome";
    DL_TRY(no_payload(b, npayload));
    DL_TRY(check_num_fragments(b, m->num_fragments, lim));
    if (m->n_fragment_versions != m->num_fragments)
        return bad(b, "fragment_versions has %zu entries, num_fragments is %u", m->n_fragment_versions,
                   m->num_fragments);
    if (m->h == 0) return bad(b, "h is 0");
    if (m->heartbeat_ms == 0) return bad(b, "heartbeat_ms is 0");
    if (m->liveness == 0) return bad(b, "liveness is 0");
    DL_TRY(check_chunk_bytes(b, m->chunk_bytes));
    if (m->shards <= 1 && m->shard != 0)
        return bad(b, "shard %u of %u shards (unsharded is shard 0)", m->shard, m->shards);
    if (m->shards > 1 && m->shards > m->num_fragments)
        return bad(b, "shards %u > num_fragments %u", m->shards, m->num_fragments);
    if (m->shards > 1 && m->shard >= m->shards) return bad(b, "shard %u is not below shards %u", m->shard, m->shards);
    if (m->update_codec && !codec_known((Dloco__V1__Codec)m->update_codec))
        return bad(b, "update_codec %u is not a known codec", m->update_codec);
    if (m->n_answered_bases && m->n_answered_bases != m->num_fragments)
        return bad(b, "answered_bases has %zu entries, num_fragments is %u", m->n_answered_bases, m->num_fragments);
    for (size_t p = 0; p < m->n_answered_bases; p++)
        if (m->answered_bases[p] && m->answered_bases[p] - 1 > m->fragment_versions[p])
            return bad(b, "answered_bases[%zu] names base version %llu, beyond fragment version %llu", p,
                       (unsigned long long)(m->answered_bases[p] - 1), (unsigned long long)m->fragment_versions[p]);
    return check_str(b, "policy", m->policy, lim->max_name);
}

/* Discarded fragment-tokens can never exceed the fragment-tokens processed
 * (of the fragments a shard owns: a learner's session reports its own). */
static int check_discarded(const char *b, uint64_t discarded, uint64_t tokens, const dl_wire_limits *lim)
{
    uint64_t P = lim->num_fragments ? lim->num_fragments : DL_WIRE_MAX_FRAGMENTS;
    if (lim->shards > 1) P = (uint64_t)dl_shard_count((int)lim->num_fragments, (int)lim->shard, (int)lim->shards);
    uint64_t cap = tokens > UINT64_MAX / P ? UINT64_MAX : tokens * P;
    if (discarded > cap)
        return bad(b, "discarded_tokens %llu > tokens %llu x %llu fragments", (unsigned long long)discarded,
                   (unsigned long long)tokens, (unsigned long long)P);
    return 0;
}

static int check_heartbeat(const Dloco__V1__Heartbeat *m, int npayload, const dl_wire_limits *lim)
{
    const char *b = "heartbeat";
    DL_TRY(no_payload(b, npayload));
    DL_TRY(check_finite(b, "steps_per_s", m->steps_per_s));
    if (m->steps_per_s < 0) return bad(b, "steps_per_s is %g, must be >= 0", m->steps_per_s);
    return check_discarded(b, m->discarded_tokens, m->tokens, lim);
}

static int check_error(const Dloco__V1__Error *m, int npayload, const dl_wire_limits *lim)
{
    const char *b = "error";
    DL_TRY(no_payload(b, npayload));
    /* A v1 peer from before ErrorKind sends only the deprecated code. */
    int legacy = m->kind == DLOCO__V1__ERROR_KIND__ERROR_KIND_UNSPECIFIED && m->code != 0;
    if (!legacy && !dl_wire_error_kind_valid(m->kind))
        return bad(b, "kind %d is not a known ErrorKind", (int)m->kind);
    return check_str(b, "message", m->message, lim->max_text);
}

static int check_push(const Dloco__V1__Push *m, const size_t *lens, int npayload, const dl_wire_limits *lim)
{
    const char *b = "push";
    if (m->steps == 0) return bad(b, "steps is 0");
    if (m->tokens < m->steps)
        return bad(b, "tokens %llu < steps %llu", (unsigned long long)m->tokens, (unsigned long long)m->steps);
    DL_TRY(check_finite(b, "loss", m->loss));
    DL_TRY(check_finite(b, "compute_s", m->compute_s));
    /* a day per step is far beyond any real step: larger means a broken clock */
    if (m->compute_s < 0 || m->compute_s > (double)m->steps * 86400.0)
        return bad(b, "compute_s is %g, must be in [0, steps * 86400 = %g]", m->compute_s, (double)m->steps * 86400.0);
    if (m->chunk_numel && m->transfer == 0) return bad(b, "chunked push without a transfer id");
    DL_TRY(check_tensor(b, m->fragment, m->codec, m->numel, m->block_size, m->topk, m->chunk_offset,
                        m->chunk_numel, lens, npayload, lim));
    /* final_pending: a final push's list of fragments, ascending (so no more than the plan's) */
    if (m->n_final_pending && !m->final) return bad(b, "final_pending on a push that is not final");
    for (size_t i = 0; i < m->n_final_pending; i++) {
        uint32_t q = m->final_pending[i];
        DL_TRY(check_fragment(b, q, lim));
        if (i && q <= m->final_pending[i - 1])
            return bad(b, "final_pending is not ascending (%u after %u)", q, m->final_pending[i - 1]);
        if (q == m->fragment) return bad(b, "final_pending names the push's own fragment %u", q);
    }
    return check_owned(b, m->fragment, lim);
}

/* A full Update carries a base, which must be exact: fp32 only. A delta applies to version - 1. */
static int check_update(const Dloco__V1__Update *m, const size_t *lens, int npayload, const dl_wire_limits *lim)
{
    const char *b = "update";
    if (!m->delta && m->codec != DLOCO__V1__CODEC__CODEC_FP32 && codec_known(m->codec))
        return bad(b, "a full update must be fp32, got %s (only a delta may use another codec)",
                   dl_wire_codec_name(m->codec));
    if (m->delta && m->version == 0) return bad(b, "delta update of version 0");
    return check_tensor(b, m->fragment, m->codec, m->numel, m->block_size, m->topk, m->chunk_offset,
                        m->chunk_numel, lens, npayload, lim);
}

static int check_ack(const Dloco__V1__Ack *m, int npayload, const dl_wire_limits *lim)
{
    const char *b = "ack";
    DL_TRY(no_payload(b, npayload));
    DL_TRY(check_fragment(b, m->fragment, lim));
    switch (m->decision) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING:
    case DLOCO__V1__DECISION__DECISION_ACCEPTED:
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE:
    case DLOCO__V1__DECISION__DECISION_REJECTED: break;
    default: return bad(b, "unknown decision %d", (int)m->decision);
    }
    if (m->busy && m->decision != DLOCO__V1__DECISION__DECISION_REJECTED) return bad(b, "busy on a decision other than REJECTED");
    if (m->retry_after_ms > DL_WIRE_RETRY_MAX_MS)
        return bad(b, "retry_after_ms %u above %u", m->retry_after_ms, DL_WIRE_RETRY_MAX_MS);
    DL_TRY(check_finite(b, "fleet_steps_per_s", m->fleet_steps_per_s));
    if (m->fleet_steps_per_s < 0 || m->fleet_steps_per_s > DL_WIRE_FLEET_SPS_MAX)
        return bad(b, "fleet_steps_per_s is %g, must be in [0, %g]", m->fleet_steps_per_s, DL_WIRE_FLEET_SPS_MAX);
    DL_TRY(check_chunk_bytes(b, m->chunk_bytes));
    return check_str(b, "reason", m->reason, lim->max_text);
}

static int check_fetch(const Dloco__V1__Fetch *m, int npayload, const dl_wire_limits *lim)
{
    const char *b = "fetch";
    DL_TRY(no_payload(b, npayload));
    uint32_t nf = frag_bound(lim);
    if (m->n_fragments > nf) return bad(b, "%zu fragments listed, max %u", m->n_fragments, nf);
    uint8_t seen[DL_WIRE_MAX_FRAGMENTS / 8] = {0};
    for (size_t i = 0; i < m->n_fragments; i++) {
        uint32_t f = m->fragments[i];
        DL_TRY(check_fragment(b, f, lim));
        DL_TRY(check_owned(b, f, lim));
        if (seen[f / 8] & (1u << (f % 8))) return bad(b, "fragment %u listed twice", f);
        seen[f / 8] |= (uint8_t)(1u << (f % 8));
    }
    if (m->n_resume_versions != m->n_resume_offsets)
        return bad(b, "%zu resume_versions but %zu resume_offsets", m->n_resume_versions, m->n_resume_offsets);
    if (m->n_resume_offsets && m->n_resume_offsets != m->n_fragments)
        return bad(b, "%zu resume entries for %zu fragments", m->n_resume_offsets, m->n_fragments);
    for (size_t i = 0; i < m->n_resume_offsets; i++) {
        uint32_t f = m->fragments[i];
        uint64_t n = lim->fragment_numel ? lim->fragment_numel[f] : lim->max_numel;
        if (m->resume_offsets[i] >= n)
            return bad(b, "resume_offsets[%zu] %llu outside fragment %u's %llu elements", i,
                       (unsigned long long)m->resume_offsets[i], f, (unsigned long long)n);
    }
    return 0;
}

int dl_wire_validate(const Dloco__V1__Envelope *env, const size_t *payload_lens, int npayload,
                     const dl_wire_limits *lim)
{
    assert(env && npayload >= 0 && (npayload == 0 || payload_lens));
    dl_wire_limits dflt = dl_wire_limits_default();
    if (!lim) lim = &dflt;
    assert(lim->num_fragments <= DL_WIRE_MAX_FRAGMENTS);
    assert(!lim->fragment_numel || lim->num_fragments > 0); /* numel table needs its length */
    assert(lim->shards <= 1 || dl_shard_check((int)lim->num_fragments, (int)lim->shard, (int)lim->shards) == 0);
    assert(lim->max_frames >= 2 && lim->max_frames <= 1 + DL_WIRE_MAX_PAYLOADS);

    const char *b = dl_wire_body_name(env->body_case);
    if (env->body_case == DLOCO__V1__ENVELOPE__BODY__NOT_SET) return bad("envelope", "no body set");
    if (env->protocol_version != DL_WIRE_PROTOCOL_VERSION)
        return bad(b, "protocol_version %u not supported (this build speaks %u)", env->protocol_version,
                   DL_WIRE_PROTOCOL_VERSION);
    if (1 + npayload > lim->max_frames)
        return bad(b, "message has %d frames, max %d", 1 + npayload, lim->max_frames);
    DL_TRY(check_learner_id(b, env->learner_id, env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR));
    DL_TRY(check_str(b, "run_id", env->run_id, lim->max_name));

    switch (env->body_case) {
    case DLOCO__V1__ENVELOPE__BODY_HELLO:
        if (!env->hello) break;
        return check_hello(env->hello, npayload, lim);
    case DLOCO__V1__ENVELOPE__BODY_WELCOME:
        if (!env->welcome) break;
        return check_welcome(env->welcome, npayload, lim);
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT:
        if (!env->heartbeat) break;
        return check_heartbeat(env->heartbeat, npayload, lim);
    case DLOCO__V1__ENVELOPE__BODY_PUSH:
        if (!env->push) break;
        return check_push(env->push, payload_lens, npayload, lim);
    case DLOCO__V1__ENVELOPE__BODY_ACK:
        if (!env->ack) break;
        return check_ack(env->ack, npayload, lim);
    case DLOCO__V1__ENVELOPE__BODY_UPDATE:
        if (!env->update) break;
        return check_update(env->update, payload_lens, npayload, lim);
    case DLOCO__V1__ENVELOPE__BODY_FETCH:
        if (!env->fetch) break;
        return check_fetch(env->fetch, npayload, lim);
    case DLOCO__V1__ENVELOPE__BODY_BYE:
        if (!env->bye) break;
        DL_TRY(no_payload(b, npayload));
        DL_TRY(check_discarded(b, env->bye->discarded_tokens, env->bye->tokens, lim));
        return check_str(b, "reason", env->bye->reason, lim->max_text);
    case DLOCO__V1__ENVELOPE__BODY_ERROR:
        if (!env->error) break;
        return check_error(env->error, npayload, lim);
    default: return bad("envelope", "unknown body %d", (int)env->body_case);
    }
    return bad(b, "body pointer is NULL");
}

int dl_wire_unpack(const void *hdr, size_t hdr_len, const size_t *payload_lens, int npayload,
                   const dl_wire_limits *lim, Dloco__V1__Envelope **out)
{
    assert(out && (hdr || hdr_len == 0));
    *out = NULL;
    if (hdr_len > DL_WIRE_MAX_HEADER_BYTES)
        return dl_err(DL_EPROTO, "header is %zu bytes, max %u", hdr_len, DL_WIRE_MAX_HEADER_BYTES);
    /* protobuf-c reports decode failures (and allocation failures) only as
     * NULL; headers are at most 64 KiB, so treat NULL as the peer's fault. */
    Dloco__V1__Envelope *env = dloco__v1__envelope__unpack(NULL, hdr_len, (const uint8_t *)hdr);
    if (!env) return dl_err(DL_EPROTO, "undecodable header (%zu bytes)", hdr_len);
    int rc = dl_wire_validate(env, payload_lens, npayload, lim);
    if (rc < 0) {
        dloco__v1__envelope__free_unpacked(env, NULL);
        return rc;
    }
    *out = env;
    return 0;
}

void dl_wire_env_free(Dloco__V1__Envelope **env)
{
    assert(env);
    if (*env) dloco__v1__envelope__free_unpacked(*env, NULL);
    *env = NULL;
}

/* ---- send / receive */

int dl_wire_send(void *sock, const void *routing_id, size_t id_len, const Dloco__V1__Envelope *env,
                 const void *const *payloads, const size_t *lens, int npayload, int flags)
{
    return dl_wire_send_q(sock, routing_id, id_len, env, payloads, lens, npayload, flags, NULL);
}

/* One payload frame. Counted: a copy libzmq frees through queued_free. A
 * blob's frame is its bytes, not a copy: the message holds a reference. */
static int send_payload(void *sock, const void *data, size_t len, int flags, dl_wire_queue *const q[2],
                        dl_wire_blob *blob)
{
    if (!blob && (!q || (!q[0] && !q[1]))) {
        DL_ZMQ_CALL(zmq_send(sock, data, len, flags));
        return 0;
    }
    void *copy = blob ? blob->data : dl_try_malloc(len ? len : 1);
    queued_buf *b = dl_try_calloc(1, sizeof *b);
    if (!copy || !b) {
        /* out of memory: the frame still goes (the message's frames are already on their way), only
         * uncounted in the queues */
        if (!blob) free(copy);
        free(b);
        DL_ZMQ_CALL(zmq_send(sock, data, len, flags));
        return 0;
    }
    if (blob) b->blob = dl_wire_blob_ref(blob);
    else memcpy(copy, data, len);
    b->len = len;
    for (int i = 0; q && i < 2; i++)
        if (q[i]) {
            b->q[i] = q[i];
            atomic_fetch_add(&q[i]->refs, 1);
            atomic_fetch_add(&q[i]->bytes, len);
        }
    zmq_msg_t m;
    if (zmq_msg_init_data(&m, copy, len, queued_free, b) != 0) {
        queued_free(copy, b);
        return dl_wire_zmq_fail("zmq_msg_init_data", __FILE__, __LINE__);
    }
    if (zmq_msg_send(&m, sock, flags) == -1) {
        int rc = dl_wire_zmq_fail("zmq_msg_send", __FILE__, __LINE__);
        DL_ZMQ_LOG(zmq_msg_close(&m)); /* runs queued_free */
        return rc;
    }
    return 0;
}

static int send_msg(void *sock, const void *routing_id, size_t id_len, const Dloco__V1__Envelope *env,
                    const void *const *payloads, const size_t *lens, int npayload, int flags,
                    dl_wire_queue *const q[2], dl_wire_blob *blob)
{
    assert(sock && env && (id_len == 0 || routing_id) && id_len <= DL_WIRE_ROUTING_ID_MAX);
    assert(npayload >= 0 && npayload <= DL_WIRE_MAX_PAYLOADS && (npayload == 0 || (payloads && lens)));
    assert((flags & ~ZMQ_DONTWAIT) == 0);

    dl_wire_limits lim = dl_wire_limits_default();
    lim.max_frames = 1 + DL_WIRE_MAX_PAYLOADS;
    if (dl_wire_validate(env, lens, npayload, &lim) < 0) {
        char why[480];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        return dl_err(DL_EINVAL, "refusing to send invalid message: %s", why);
    }

    size_t hlen = dloco__v1__envelope__get_packed_size(env);
    if (hlen > DL_WIRE_MAX_HEADER_BYTES)
        return dl_err(DL_EINVAL, "header packs to %zu bytes, max %u", hlen, DL_WIRE_MAX_HEADER_BYTES);
    zmq_msg_t hdr;
    DL_ZMQ_CALL(zmq_msg_init_size(&hdr, hlen));
    size_t packed = dloco__v1__envelope__pack(env, zmq_msg_data(&hdr));
    assert(packed == hlen);
    (void)packed;

    /* The first frame decides: libzmq checks the high-water mark and (ROUTER)
     * the peer only there, and then accepts the rest of the multipart message
     * as a unit, so a failure below the first frame means the socket broke. */
    int rc = id_len > 0 ? DL_ZMQ_RC(zmq_send(sock, routing_id, id_len, flags | ZMQ_SNDMORE)) : 0;
    if (rc >= 0) rc = DL_ZMQ_RC(zmq_msg_send(&hdr, sock, flags | (npayload > 0 ? ZMQ_SNDMORE : 0)));
    if (rc < 0) {
        DL_ZMQ_LOG(zmq_msg_close(&hdr)); /* a sent message belongs to zmq; an unsent one is ours */
        return rc;
    }
    for (int i = 0; i < npayload; i++) {
        int more = i + 1 < npayload ? ZMQ_SNDMORE : 0;
        DL_TRY(send_payload(sock, payloads[i], lens[i], flags | more, q, blob));
    }
    return 0;
}

int dl_wire_send_q(void *sock, const void *routing_id, size_t id_len, const Dloco__V1__Envelope *env,
                   const void *const *payloads, const size_t *lens, int npayload, int flags,
                   dl_wire_queue *const q[2])
{
    return send_msg(sock, routing_id, id_len, env, payloads, lens, npayload, flags, q, NULL);
}

int dl_wire_send_blob_q(void *sock, const void *routing_id, size_t id_len, const Dloco__V1__Envelope *env,
                        dl_wire_blob *blob, int flags, dl_wire_queue *const q[2])
{
    assert(blob);
    const void *pl[1] = {blob->data};
    size_t lens[1] = {blob->len};
    return send_msg(sock, routing_id, id_len, env, pl, lens, 1, flags, q, blob);
}

const void *dl_wire_msg_payload(dl_wire_msg *m, int i)
{
    assert(m && i >= 0 && i < m->npayload);
    return zmq_msg_data(&m->payload[i]);
}

size_t dl_wire_msg_payload_len(dl_wire_msg *m, int i)
{
    assert(m && i >= 0 && i < m->npayload);
    return zmq_msg_size(&m->payload[i]);
}

void dl_wire_msg_close(dl_wire_msg *m)
{
    assert(m);
    dl_wire_env_free(&m->env);
    for (int i = 0; i < m->npayload; i++) DL_ZMQ_LOG(zmq_msg_close(&m->payload[i]));
    m->npayload = 0;
}

/* Receive the remaining frames of a message already started. Keeps up to
 * DL_WIRE_MAX_PAYLOADS in m->payload and drops the rest, counting them. */
static int drain_payloads(void *sock, dl_wire_msg *m, int *nframes)
{
    for (;;) {
        zmq_msg_t spill;
        zmq_msg_t *dst = m->npayload < DL_WIRE_MAX_PAYLOADS ? &m->payload[m->npayload] : &spill;
        DL_ZMQ_CALL(zmq_msg_init(dst));
        /* Later frames of a message are already queued (delivery is atomic). */
        int rc = DL_ZMQ_RC(zmq_msg_recv(dst, sock, 0));
        if (rc < 0) {
            DL_ZMQ_LOG(zmq_msg_close(dst));
            return rc;
        }
        int more = zmq_msg_more(dst);
        if (dst == &spill) DL_ZMQ_LOG(zmq_msg_close(&spill));
        else m->npayload++;
        (*nframes)++;
        if (!more) return 0;
    }
}

int dl_wire_recv(void *sock, int is_router, const dl_wire_limits *lim, dl_wire_msg *out, int flags)
{
    assert(sock && out && (flags & ~ZMQ_DONTWAIT) == 0);
    memset(out, 0, sizeof *out);
    dl_wire_limits dflt = dl_wire_limits_default();
    if (!lim) lim = &dflt;

    zmq_msg_t part;
    DL_ZMQ_CALL(zmq_msg_init(&part));
    int rrc = DL_ZMQ_RC(zmq_msg_recv(&part, sock, flags));
    if (rrc < 0) {
        DL_ZMQ_LOG(zmq_msg_close(&part));
        return rrc;
    }
    if (is_router) {
        size_t n = zmq_msg_size(&part);
        if (n > DL_WIRE_ROUTING_ID_MAX) n = DL_WIRE_ROUTING_ID_MAX;
        memcpy(out->id, zmq_msg_data(&part), n);
        out->id[n] = 0;
        out->id_len = n;
        int more = zmq_msg_more(&part);
        DL_ZMQ_LOG(zmq_msg_close(&part));
        if (!more) return dl_err(DL_EPROTO, "message has no header frame");
        DL_ZMQ_CALL(zmq_msg_init(&part));
        rrc = DL_ZMQ_RC(zmq_msg_recv(&part, sock, 0));
        if (rrc < 0) {
            DL_ZMQ_LOG(zmq_msg_close(&part));
            return rrc;
        }
    }
    /* `part` is the header now; its connection's ZAP User-Id, if any */
    const char *uid = zmq_msg_gets(&part, "User-Id");
    if (uid) snprintf(out->user_id, sizeof out->user_id, "%s", uid);
    int nframes = 1;
    int rc = 0;
    if (zmq_msg_more(&part)) rc = drain_payloads(sock, out, &nframes);
    if (rc == 0 && nframes > lim->max_frames)
        rc = dl_err(DL_EPROTO, "message has %d frames, max %d", nframes, lim->max_frames);
    if (rc == 0) {
        size_t lens[DL_WIRE_MAX_PAYLOADS];
        for (int i = 0; i < out->npayload; i++) lens[i] = zmq_msg_size(&out->payload[i]);
        rc = dl_wire_unpack(zmq_msg_data(&part), zmq_msg_size(&part), lens, out->npayload, lim, &out->env);
    }
    DL_ZMQ_LOG(zmq_msg_close(&part));
    if (rc == 0 && lim->verify_checksum) {
        const Dloco__V1__Envelope *e = out->env;
        uint64_t want = 0;
        bool has = true;
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_PUSH) want = e->push->checksum;
        else if (e->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE) want = e->update->checksum;
        else has = false;
        if (has) {
            uint64_t got = dl_wire_checksum(dl_wire_msg_payload(out, 0), dl_wire_msg_payload_len(out, 0));
            if (got != want)
                rc = dl_err(DL_EPROTO, "%s: checksum 0x%016llx does not match payload (0x%016llx)",
                            dl_wire_body_name(e->body_case), (unsigned long long)want,
                            (unsigned long long)got);
        }
    }
    if (rc < 0) {
        /* Keep the routing id for an Error reply; drop everything else. */
        dl_wire_env_free(&out->env);
        for (int i = 0; i < out->npayload; i++) DL_ZMQ_LOG(zmq_msg_close(&out->payload[i]));
        out->npayload = 0;
    }
    return rc;
}

/* ---- manifests in a Hello */

int dl_wire_hello_manifest(const Dloco__V1__Hello *h, dl_manifest **out)
{
    *out = NULL;
    if (!h->n_manifest) return 0;
    dl_manifest *m;
    DL_TRY(dl_manifest_open(&m));
    int rc = 0;
    for (size_t i = 0; i < h->n_manifest && !rc; i++) {
        const Dloco__V1__TensorSpec *t = h->manifest[i];
        int64_t shape[DL_TENSOR_NDIM_MAX] = {0};
        if (t->n_shape < 1 || t->n_shape > DL_TENSOR_NDIM_MAX) {
            rc = dl_err(DL_EINVAL, "manifest: tensor '%s' has %zu dimensions, want 1 to %d", t->name, t->n_shape,
                        DL_TENSOR_NDIM_MAX);
            break;
        }
        for (size_t d = 0; d < t->n_shape; d++)
            shape[d] = t->shape[d] > (uint64_t)INT64_MAX ? -1 : (int64_t)t->shape[d];
        rc = dl_manifest_add(m, t->name, (int)t->n_shape, shape, (int)t->role - 1);
    }
    if (!rc) rc = dl_manifest_check(m);
    if (!rc && h->n_layer) {
        dl_model_config cfg = {.n_layer = (int)h->n_layer, .n_head = (int)h->n_head, .n_embd = (int)h->n_embd,
                               .seq_len = (int)h->seq_len, .vocab = (int)h->vocab};
        if (h->n_layer > INT32_MAX || h->n_head > INT32_MAX || h->n_embd > INT32_MAX || h->seq_len > INT32_MAX ||
            h->vocab > INT32_MAX)
            rc = dl_err(DL_EINVAL, "manifest: the GPT-2 config beside it is out of range");
        else rc = dl_manifest_set_gpt(m, &cfg);
    }
    if (rc) {
        dl_manifest_close(&m);
        return rc;
    }
    *out = m;
    return 0;
}

int dl_wire_hello_set_manifest(Dloco__V1__Hello *h, const dl_manifest *m, dl_wire_manifest_buf *buf)
{
    memset(buf, 0, sizeof *buf);
    DL_TRY(dl_manifest_check(m));
    int n = dl_manifest_ntensors(m);
    size_t ndims = 0;
    for (int i = 0; i < n; i++) ndims += (size_t)dl_manifest_tensor(m, i)->ndim;
    buf->specs = dl_try_calloc((size_t)n, sizeof *buf->specs);
    buf->ptrs = dl_try_calloc((size_t)n, sizeof *buf->ptrs);
    buf->shapes = dl_try_calloc(ndims, sizeof *buf->shapes);
    if (!buf->specs || !buf->ptrs || !buf->shapes) {
        dl_wire_manifest_buf_free(buf);
        return dl_err(DL_ENOMEM, "hello: out of memory for a manifest of %d tensors", n);
    }
    uint64_t *sh = buf->shapes;
    for (int i = 0; i < n; i++) {
        const dl_tensor *t = dl_manifest_tensor(m, i);
        Dloco__V1__TensorSpec *s = &buf->specs[i];
        dloco__v1__tensor_spec__init(s);
        s->name = (char *)t->name; /* borrowed: protobuf-c only reads it when packing */
        s->n_shape = (size_t)t->ndim;
        s->shape = sh;
        for (int d = 0; d < t->ndim; d++) *sh++ = (uint64_t)t->shape[d];
        s->role = (Dloco__V1__TensorRole)(t->kind + 1);
        buf->ptrs[i] = s;
    }
    h->n_manifest = (size_t)n;
    h->manifest = buf->ptrs;
    dl_model_config cfg;
    if (dl_manifest_gpt(m, &cfg)) {
        h->n_layer = (uint32_t)cfg.n_layer;
        h->n_head = (uint32_t)cfg.n_head;
        h->n_embd = (uint32_t)cfg.n_embd;
        h->seq_len = (uint32_t)cfg.seq_len;
        h->vocab = (uint32_t)cfg.vocab;
    }
    return 0;
}

void dl_wire_manifest_buf_free(dl_wire_manifest_buf *buf)
{
    if (!buf) return;
    free(buf->specs);
    free(buf->ptrs);
    free(buf->shapes);
    memset(buf, 0, sizeof *buf);
}
