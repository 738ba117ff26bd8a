/* Seed corpus generator for tests/fuzz: writes valid and invalid inputs of every
 * target into OUT/<target>/, deterministically (same bytes on every run).
 * Usage: seedgen OUT_DIR   (tests/fuzz/build.sh builds it; see corpus/README.md) */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/err.h"
#include "core/manifest.h"
#include "core/model.h"
#include "proto/wire.h"
#include "storage/modelfile.h"
#include "storage/tensorfile.h"
#include "tests/fuzz/fuzz.h"

static const char *g_out;
static int g_files;

static void put(const char *target, const char *name, const void *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_out, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "seedgen: mkdir %s: %s\n", path, strerror(errno));
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/%s", g_out, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "seedgen: write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    g_files++;
}

// ---------------------------------------------------------------------------
// messages: one valid envelope of every body, then variants of them

/* Storage of every body, so one struct describes any message. */
typedef struct {
    Dloco__V1__Envelope env;
    Dloco__V1__Hello hello;
    Dloco__V1__Welcome welcome;
    Dloco__V1__Heartbeat heartbeat;
    Dloco__V1__Push push;
    Dloco__V1__Ack ack;
    Dloco__V1__Update update;
    Dloco__V1__Fetch fetch;
    Dloco__V1__Bye bye;
    Dloco__V1__Error error;
    uint64_t versions[FUZZ_NUM_FRAGMENTS];
    uint64_t answered[FUZZ_NUM_FRAGMENTS]; /* Welcome.answered_bases */
    uint32_t fragments[FUZZ_NUM_FRAGMENTS];
    uint8_t payload[4 * 64 + 64]; /* largest: fp32 x 64 */
    size_t payload_len;           /* 0 = no payload frame */
} msg;

/* Deterministic payload bytes (a fixed LCG), fp32 values in [-1, 1). */
static void fill_payload(msg *m, Dloco__V1__Codec codec, uint64_t numel, uint32_t block)
{
    size_t n = dl_wire_payload_bytes(codec, numel, block, 0);
    if (n == 0 || n > sizeof m->payload) {
        fprintf(stderr, "seedgen: payload of %zu bytes\n", n);
        exit(1);
    }
    uint32_t s = 12345;
    if (codec == DLOCO__V1__CODEC__CODEC_FP32) {
        for (uint64_t i = 0; i < numel; i++) {
            s = s * 1664525u + 1013904223u;
            float f = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
            memcpy(m->payload + 4 * i, &f, 4);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            s = s * 1664525u + 1013904223u;
            m->payload[i] = (uint8_t)(s >> 24);
        }
    }
    m->payload_len = n;
}

static void base(msg *m, const char *learner_id)
{
    memset(m, 0, sizeof *m);
    dl_wire_env_init(&m->env, "run-fuzz", 3, learner_id);
    m->env.seq = 7;
}

static void mk_hello(msg *m, int fresh)
{
    base(m, "learner-1");
    dloco__v1__hello__init(&m->hello);
    m->hello.fingerprint = 0x0123456789abcdefull;
    m->hello.n_layer = 2;
    m->hello.n_head = 2;
    m->hello.n_embd = 16;
    m->hello.seq_len = 8;
    m->hello.vocab = 64;
    m->hello.num_fragments = FUZZ_NUM_FRAGMENTS;
    for (int i = 0; i < FUZZ_NUM_FRAGMENTS; i++) m->versions[i] = (uint64_t)i + 1;
    if (!fresh) {
        m->hello.n_held_versions = FUZZ_NUM_FRAGMENTS;
        m->hello.held_versions = m->versions;
    }
    m->hello.device = "cpu";
    m->hello.step = 10;
    m->hello.batch = 4;
    dl_wire_set_hello(&m->env, &m->hello);
}

static void mk_welcome(msg *m)
{
    base(m, "learner-1");
    dloco__v1__welcome__init(&m->welcome);
    m->welcome.num_fragments = FUZZ_NUM_FRAGMENTS;
    for (int i = 0; i < FUZZ_NUM_FRAGMENTS; i++) m->versions[i] = (uint64_t)i * 10;
    m->welcome.n_fragment_versions = FUZZ_NUM_FRAGMENTS;
    m->welcome.fragment_versions = m->versions;
    m->welcome.h = 24;
    m->welcome.heartbeat_ms = 500;
    m->welcome.liveness = 6;
    m->welcome.policy = "decoupled";
    m->welcome.must_fetch = 1;
    dl_wire_set_welcome(&m->env, &m->welcome);
}

static void mk_heartbeat(msg *m)
{
    base(m, "learner-1");
    dloco__v1__heartbeat__init(&m->heartbeat);
    m->heartbeat.step = 100;
    m->heartbeat.tokens = 4096;
    m->heartbeat.steps_per_s = 2.5;
    m->heartbeat.discarded_tokens = 128;
    dl_wire_set_heartbeat(&m->env, &m->heartbeat);
}

static void mk_push(msg *m, uint32_t frag, Dloco__V1__Codec codec, uint32_t block)
{
    base(m, "learner-1");
    dloco__v1__push__init(&m->push);
    m->push.fragment = frag;
    m->push.base_version = 5;
    m->push.steps = 24;
    m->push.tokens = 3072;
    m->push.codec = codec;
    m->push.numel = FUZZ_FRAGMENT_NUMEL[frag];
    m->push.block_size = block;
    m->push.loss = 3.25;
    m->push.compute_s = 1.5;
    fill_payload(m, codec, m->push.numel, block);
    m->push.checksum = dl_wire_checksum(m->payload, m->payload_len);
    dl_wire_set_push(&m->env, &m->push);
}

static void mk_ack(msg *m, Dloco__V1__Decision d)
{
    base(m, "learner-1");
    dloco__v1__ack__init(&m->ack);
    m->ack.fragment = 2;
    m->ack.base_version = 5;
    m->ack.decision = d;
    m->ack.merged_version = d == DLOCO__V1__DECISION__DECISION_ACCEPTED ? 6 : 0;
    m->ack.reason = d == DLOCO__V1__DECISION__DECISION_ACCEPTED ? "merged" : "base_version too old";
    m->ack.rebase = d == DLOCO__V1__DECISION__DECISION_DROPPED_STALE;
    dl_wire_set_ack(&m->env, &m->ack);
}

static void mk_update(msg *m, uint32_t frag, Dloco__V1__Codec codec, uint32_t block)
{
    base(m, "learner-1");
    dloco__v1__update__init(&m->update);
    m->update.fragment = frag;
    m->update.version = 6;
    m->update.codec = codec;
    m->update.numel = FUZZ_FRAGMENT_NUMEL[frag];
    m->update.block_size = block;
    m->update.delta = codec != DLOCO__V1__CODEC__CODEC_FP32; /* a full Update is fp32: another codec, a delta */
    /* the payload of the codec as it should be: a block size an fp32 or bf16
     * Update must not carry (bad_update_block) is the header's fault alone */
    int block_codec = codec != DLOCO__V1__CODEC__CODEC_FP32 && codec != DLOCO__V1__CODEC__CODEC_BF16;
    fill_payload(m, codec, m->update.numel, block_codec ? block : 0);
    m->update.checksum = dl_wire_checksum(m->payload, m->payload_len);
    dl_wire_set_update(&m->env, &m->update);
}

/* mk_push / mk_update as one chunk: elements [off, off + n) of the fragment. */
static void mk_push_chunk(msg *m, uint32_t frag, uint64_t off, uint64_t n, uint64_t transfer)
{
    mk_push(m, frag, DLOCO__V1__CODEC__CODEC_FP32, 0);
    m->push.chunk_offset = off, m->push.chunk_numel = n, m->push.transfer = transfer;
    fill_payload(m, DLOCO__V1__CODEC__CODEC_FP32, n, 0);
    m->push.checksum = dl_wire_checksum(m->payload, m->payload_len);
}

static void mk_update_chunk(msg *m, uint32_t frag, uint64_t off, uint64_t n)
{
    mk_update(m, frag, DLOCO__V1__CODEC__CODEC_FP32, 0);
    m->update.chunk_offset = off, m->update.chunk_numel = n;
    fill_payload(m, DLOCO__V1__CODEC__CODEC_FP32, n, 0);
    m->update.checksum = dl_wire_checksum(m->payload, m->payload_len);
}

static void mk_fetch(msg *m, int n)
{
    base(m, "learner-1");
    dloco__v1__fetch__init(&m->fetch);
    m->fragments[0] = 1;
    m->fragments[1] = 3;
    m->fetch.n_fragments = (size_t)n;
    m->fetch.fragments = m->fragments;
    dl_wire_set_fetch(&m->env, &m->fetch);
}

static void mk_bye(msg *m)
{
    base(m, "learner-1");
    dloco__v1__bye__init(&m->bye);
    m->bye.reason = "shutdown";
    m->bye.step = 99;
    m->bye.tokens = 4096;
    m->bye.discarded_tokens = 0;
    dl_wire_set_bye(&m->env, &m->bye);
}

static void mk_error(msg *m, int legacy)
{
    base(m, ""); /* an Error may go to a peer whose id is not known */
    dloco__v1__error__init(&m->error);
    if (legacy) m->error.code = DL_ERANGE; /* a v1.0 peer: code only */
    else m->error.kind = DLOCO__V1__ERROR_KIND__ERROR_KIND_FULL;
    m->error.message = "no free learner slot";
    m->error.fatal = 0;
    dl_wire_set_error(&m->env, &m->error);
}

/* Packed header of m into buf; returns its length. */
static size_t pack(const msg *m, uint8_t *buf, size_t cap)
{
    size_t n = dloco__v1__envelope__get_packed_size(&m->env);
    if (n > cap) {
        fprintf(stderr, "seedgen: header of %zu bytes\n", n);
        exit(1);
    }
    return dloco__v1__envelope__pack(&m->env, buf);
}

/* fuzz_envelope seed: [ctl][len0][len1][header] (tests/fuzz/fuzz.h). */
static void put_envelope(const char *name, const uint8_t *hdr, size_t hlen, int npayload, size_t len0, int lim)
{
    uint8_t buf[FUZZ_ENV_PREFIX + 4096];
    buf[0] = (uint8_t)(npayload | lim << 2);
    for (int i = 0; i < 4; i++) {
        buf[1 + i] = (uint8_t)(len0 >> (8 * i));
        buf[5 + i] = 0;
    }
    memcpy(buf + FUZZ_ENV_PREFIX, hdr, hlen);
    put("fuzz_envelope", name, buf, FUZZ_ENV_PREFIX + hlen);
}

/* fuzz_message seed: [flags][hlen u16][header][payload]. */
static void put_message(const char *name, const uint8_t *hdr, size_t hlen, const uint8_t *payload, size_t plen,
                        int flags)
{
    uint8_t buf[FUZZ_MSG_PREFIX + 4096 + sizeof(((msg *)0)->payload)];
    buf[0] = (uint8_t)flags;
    buf[1] = (uint8_t)hlen;
    buf[2] = (uint8_t)(hlen >> 8);
    memcpy(buf + FUZZ_MSG_PREFIX, hdr, hlen);
    memcpy(buf + FUZZ_MSG_PREFIX + hlen, payload, plen);
    put("fuzz_message", name, buf, FUZZ_MSG_PREFIX + hlen + plen);
}

/* A message as seeds of both wire targets: the header with its real payload
 * length (envelope) and the whole two- or one-frame message (message). */
static void put_both(const char *name, const msg *m, int lim)
{
    uint8_t hdr[4096];
    size_t hlen = pack(m, hdr, sizeof hdr);
    char n[128];
    snprintf(n, sizeof n, "%s.bin", name);
    put_envelope(n, hdr, hlen, m->payload_len ? 1 : 0, m->payload_len, lim);
    if (lim == FUZZ_LIM_PLAN)
        put_message(n, hdr, hlen, m->payload, m->payload_len, m->payload_len ? 0 : FUZZ_MSG_HEADER_ONLY);
}

static void wire_seeds(void)
{
    msg m;
    uint8_t hdr[4096];
    size_t hlen;
    const Dloco__V1__Codec FP32 = DLOCO__V1__CODEC__CODEC_FP32, BF16 = DLOCO__V1__CODEC__CODEC_BF16,
                           INT8 = DLOCO__V1__CODEC__CODEC_INT8, INT4 = DLOCO__V1__CODEC__CODEC_INT4;

    // ---- valid: every body, and each tensor codec
    mk_hello(&m, 0), put_both("hello", &m, FUZZ_LIM_PLAN);
    mk_hello(&m, 1), put_both("hello_fresh", &m, FUZZ_LIM_PLAN);
    mk_welcome(&m), put_both("welcome", &m, FUZZ_LIM_PLAN);
    mk_heartbeat(&m), put_both("heartbeat", &m, FUZZ_LIM_PLAN);
    mk_push(&m, 0, FP32, 0), put_both("push_fp32", &m, FUZZ_LIM_PLAN);
    mk_push(&m, 1, BF16, 0), put_both("push_bf16", &m, FUZZ_LIM_PLAN);
    mk_push(&m, 0, INT8, 16), put_both("push_int8", &m, FUZZ_LIM_PLAN);
    mk_push(&m, 1, INT4, 16), put_both("push_int4", &m, FUZZ_LIM_PLAN);
    /* a final push naming the fragments its flush still owes (ascending, not its own), and out of order */
    static uint32_t fin[] = {1, 3}, fin_bad[] = {3, 1};
    mk_push(&m, 0, FP32, 0), m.push.final = 1, m.push.n_final_pending = 2, m.push.final_pending = fin;
    put_both("push_final_pending", &m, FUZZ_LIM_PLAN);
    m.push.final_pending = fin_bad, put_both("bad_push_final_pending", &m, FUZZ_LIM_PLAN);
    mk_ack(&m, DLOCO__V1__DECISION__DECISION_ACCEPTED), put_both("ack", &m, FUZZ_LIM_PLAN);
    mk_ack(&m, DLOCO__V1__DECISION__DECISION_DROPPED_STALE), put_both("ack_stale", &m, FUZZ_LIM_PLAN);
    mk_update(&m, 2, FP32, 0), put_both("update_fp32", &m, FUZZ_LIM_PLAN);
    mk_update(&m, 3, INT4, 16), put_both("update_int4", &m, FUZZ_LIM_PLAN);
    mk_update(&m, 0, INT8, 32), put_both("update_int8", &m, FUZZ_LIM_PLAN);
    mk_fetch(&m, 2), put_both("fetch", &m, FUZZ_LIM_PLAN);
    mk_fetch(&m, 0), put_both("fetch_all", &m, FUZZ_LIM_PLAN);
    // chunked transfers (docs/PROTOCOL.md): a push's and an Update's middle chunk, a resumed fetch, chunk sizes
    mk_push_chunk(&m, 0, 16, 16, 7), put_both("push_chunk", &m, FUZZ_LIM_PLAN);
    mk_update_chunk(&m, 1, 8, 4), put_both("update_chunk", &m, FUZZ_LIM_PLAN);
    {
        uint64_t rv[2] = {6, 6}, ro[2] = {4, 0}; /* fragments 1 (17 elements) and 3 (1) */
        mk_fetch(&m, 2), m.fetch.resume_versions = rv, m.fetch.resume_offsets = ro;
        m.fetch.n_resume_versions = m.fetch.n_resume_offsets = 2, put_both("fetch_resume", &m, FUZZ_LIM_PLAN);
        m.fetch.n_resume_offsets = 1, put_both("bad_fetch_resume_count", &m, FUZZ_LIM_PLAN);
    }
    mk_welcome(&m), m.welcome.chunk_bytes = 1u << 20, put_both("welcome_chunks", &m, FUZZ_LIM_PLAN);
    mk_ack(&m, DLOCO__V1__DECISION__DECISION_ACCEPTED), m.ack.chunk_bytes = 256u << 10,
        put_both("ack_chunks", &m, FUZZ_LIM_PLAN);
    mk_welcome(&m), m.welcome.shard = 1, m.welcome.shards = 2, put_both("welcome_shard", &m, FUZZ_LIM_PLAN);
    /* the answers to a learner process's pushes (1 + base per fragment, at most version + 1), and beyond */
    mk_welcome(&m), m.welcome.must_fetch = 0;
    for (int i = 0; i < FUZZ_NUM_FRAGMENTS; i++) m.answered[i] = i ? m.versions[i] : 0;
    m.welcome.n_answered_bases = FUZZ_NUM_FRAGMENTS, m.welcome.answered_bases = m.answered;
    put_both("welcome_answered", &m, FUZZ_LIM_PLAN);
    m.answered[1] = m.versions[1] + 2, put_both("bad_welcome_answered", &m, FUZZ_LIM_PLAN);
    mk_ack(&m, DLOCO__V1__DECISION__DECISION_ACCEPTED), m.ack.again = 1, put_both("ack_again", &m, FUZZ_LIM_PLAN);
    mk_welcome(&m), m.welcome.shard = 3, m.welcome.shards = 2, put_both("bad_welcome_shard", &m, FUZZ_LIM_PLAN);
    mk_hello(&m, 0), m.hello.max_chunk_bytes = 1u << 20, put_both("hello_chunks", &m, FUZZ_LIM_PLAN);
    {
        /* a manifest learner (docs/PROTOCOL.md "Manifests"): GPT fields 0, three tensors, a claim */
        static uint64_t s0[2] = {8, 4}, s1[1] = {4}, s2[4] = {2, 3, 3, 3};
        static Dloco__V1__TensorSpec ts[3];
        static Dloco__V1__TensorSpec *tp[3] = {&ts[0], &ts[1], &ts[2]};
        const char *names[3] = {"model.embed_tokens.weight", "model.norm.weight", "conv"};
        uint64_t *shapes[3] = {s0, s1, s2};
        size_t nd[3] = {2, 1, 4};
        int roles[3] = {DLOCO__V1__TENSOR_ROLE__TENSOR_ROLE_EMBEDDING, DLOCO__V1__TENSOR_ROLE__TENSOR_ROLE_VECTOR,
                        DLOCO__V1__TENSOR_ROLE__TENSOR_ROLE_MATRIX};
        for (int i = 0; i < 3; i++) {
            dloco__v1__tensor_spec__init(&ts[i]);
            ts[i].name = (char *)names[i], ts[i].shape = shapes[i], ts[i].n_shape = nd[i];
            ts[i].role = (Dloco__V1__TensorRole)roles[i];
        }
        mk_hello(&m, 1);
        m.hello.n_layer = m.hello.n_head = m.hello.n_embd = m.hello.seq_len = m.hello.vocab = 0;
        m.hello.n_manifest = 3, m.hello.manifest = tp, m.hello.max_tokens_per_step = 4096;
        put_both("hello_manifest", &m, FUZZ_LIM_PLAN);
        m.hello.n_embd = 16, put_both("bad_hello_manifest_partly_gpt", &m, FUZZ_LIM_PLAN);
    }
    /* another P than the run's: the synchronizer's refusal (MISMATCH), not the wire's */
    mk_hello(&m, 0), m.hello.num_fragments = 5, m.hello.n_held_versions = 0,
                     put_both("hello_other_fragments", &m, FUZZ_LIM_PLAN);
    mk_bye(&m), put_both("bye", &m, FUZZ_LIM_PLAN);
    mk_error(&m, 0), put_both("error", &m, FUZZ_LIM_PLAN);
    mk_error(&m, 1), put_both("error_legacy", &m, FUZZ_LIM_PLAN);
    // the other limits of fuzz_envelope
    mk_hello(&m, 0), put_both("hello_default_limits", &m, FUZZ_LIM_DEFAULT);
    mk_push(&m, 0, INT8, 16), put_both("push_int8_send_limits", &m, FUZZ_LIM_SEND);
    mk_update(&m, 2, FP32, 0), put_both("update_count_only", &m, FUZZ_LIM_COUNT_ONLY);

    // ---- invalid: one broken rule each
    mk_hello(&m, 0), m.env.protocol_version = 1, put_both("bad_version", &m, FUZZ_LIM_PLAN);
    mk_heartbeat(&m), m.env.learner_id = "bad id!", put_both("bad_learner_id", &m, FUZZ_LIM_PLAN);
    mk_heartbeat(&m), m.heartbeat.steps_per_s = NAN, put_both("bad_heartbeat_nan", &m, FUZZ_LIM_PLAN);
    mk_hello(&m, 0), m.hello.num_fragments = 5, put_both("bad_hello_held_count", &m, FUZZ_LIM_PLAN);
    mk_push_chunk(&m, 0, 60, 16, 7), put_both("bad_push_chunk_past", &m, FUZZ_LIM_PLAN);
    mk_push_chunk(&m, 0, 16, 16, 0), put_both("bad_push_chunk_transfer", &m, FUZZ_LIM_PLAN);
    mk_welcome(&m), m.welcome.chunk_bytes = 4098, put_both("bad_welcome_chunks", &m, FUZZ_LIM_PLAN);
    mk_ack(&m, DLOCO__V1__DECISION__DECISION_ACCEPTED), m.ack.chunk_bytes = 4098,
        put_both("bad_ack_chunks", &m, FUZZ_LIM_PLAN);
    mk_welcome(&m), m.welcome.n_fragment_versions = 3, put_both("bad_welcome_versions", &m, FUZZ_LIM_PLAN);
    mk_push(&m, 0, FP32, 0), m.push.numel = 65, put_both("bad_push_numel", &m, FUZZ_LIM_PLAN);
    mk_push(&m, 0, FP32, 0), m.push.steps = 0, put_both("bad_push_steps", &m, FUZZ_LIM_PLAN);
    mk_push(&m, 0, FP32, 0), m.push.compute_s = -1, put_both("bad_push_compute", &m, FUZZ_LIM_PLAN);
    mk_update(&m, 2, FP32, 16), put_both("bad_update_block", &m, FUZZ_LIM_PLAN);
    mk_ack(&m, DLOCO__V1__DECISION__DECISION_UNSPECIFIED), put_both("bad_ack_decision", &m, FUZZ_LIM_PLAN);
    mk_fetch(&m, 2), m.fragments[1] = 1, put_both("bad_fetch_twice", &m, FUZZ_LIM_PLAN);
    mk_error(&m, 0), m.error.kind = 99, put_both("bad_error_kind", &m, FUZZ_LIM_PLAN);
    mk_bye(&m), m.bye.reason = "line\nbreak", put_both("bad_bye_control", &m, FUZZ_LIM_PLAN);
    // wrong payload frames: length off by one, two frames, none
    mk_push(&m, 0, FP32, 0);
    hlen = pack(&m, hdr, sizeof hdr);
    put_envelope("bad_push_len.bin", hdr, hlen, 1, m.payload_len - 1, FUZZ_LIM_PLAN);
    put_envelope("bad_push_two_frames.bin", hdr, hlen, 2, m.payload_len, FUZZ_LIM_PLAN);
    put_envelope("bad_push_no_frame.bin", hdr, hlen, 0, 0, FUZZ_LIM_PLAN);
    put_message("bad_push_short.bin", hdr, hlen, m.payload, m.payload_len - 1, 0);
    put_message("bad_push_no_frame.bin", hdr, hlen, m.payload, 0, FUZZ_MSG_HEADER_ONLY);
    // a checksum that does not match, as is and decoded anyway
    uint8_t pl[sizeof m.payload];
    memcpy(pl, m.payload, m.payload_len);
    pl[5] ^= 1;
    put_message("bad_push_checksum.bin", hdr, hlen, pl, m.payload_len, 0);
    put_message("push_trusted_checksum.bin", hdr, hlen, pl, m.payload_len, FUZZ_MSG_TRUST_SUM);
    // a well-formed push whose payload holds a NaN and an infinity
    {
        float bad[2] = {NAN, INFINITY};
        memcpy(m.payload + 8, bad, sizeof bad);
        m.push.checksum = dl_wire_checksum(m.payload, m.payload_len);
        put_both("push_nonfinite", &m, FUZZ_LIM_PLAN);
    }
    // a heartbeat sent with a payload frame
    mk_heartbeat(&m);
    hlen = pack(&m, hdr, sizeof hdr);
    put_message("bad_heartbeat_payload.bin", hdr, hlen, (const uint8_t *)"xy", 2, 0);
    // not protobuf at all, cut short, empty
    mk_push(&m, 0, FP32, 0);
    hlen = pack(&m, hdr, sizeof hdr);
    put_envelope("bad_truncated.bin", hdr, hlen / 2, 1, m.payload_len, FUZZ_LIM_PLAN);
    put_message("bad_truncated.bin", hdr, hlen / 2, m.payload, m.payload_len, 0);
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x80};
    put_envelope("bad_junk.bin", junk, sizeof junk, 0, 0, FUZZ_LIM_PLAN);
    put_message("bad_junk.bin", junk, sizeof junk, junk, 0, FUZZ_MSG_HEADER_ONLY);
    put_envelope("bad_empty.bin", junk, 0, 0, 0, FUZZ_LIM_PLAN);
}

// ---------------------------------------------------------------------------
// config files and argument lists (the table of tests/fuzz/fuzz_config.c)

static void put_text(const char *target, const char *name, const char *text)
{
    put(target, name, text, strlen(text));
}

/* An argv seed: the arguments NUL-separated (fuzz_config splits on NUL). */
static void put_args(const char *name, const char *const *args)
{
    char buf[2048];
    size_t n = 0;
    for (int i = 0; args[i]; i++) {
        size_t l = strlen(args[i]);
        memcpy(buf + n, args[i], l + 1);
        n += l + 1;
    }
    put("fuzz_config", name, buf, n ? n - 1 : 0);
}

static void config_seeds(void)
{
    const char *T = "fuzz_config";
    put_text(T, "sync.ini",
             "# dloco-sync config\n"
             "bind = tcp://0.0.0.0:5555\n"
             "run_id = fuzz-run\n"
             "H = 24\n"
             "seed = 9200000000000000000\n"
             "policy = sync-elastic\n"
             "quorum = 0x10\n"
             "gamma = 0.25 ; trailing comment\n"
             "outer_momentum = 0.999\n"
             "share_scaling = off\n"
             "staleness = hinge\n"
             "n_layer = 2\n"
             "n_head = 2\n"
             "n_embd = 16\n"
             "fragments = 4096\n"
             "\n"
             "[chaos]\n"
             "seed = -5\n");
    put_text(T, "learner.ini",
             "standalone = yes\r\n"
             "   eps =    1e-12\t\r\n"
             "throttle = 0.001\n"
             "adopt = mix\n"
             "val_frac = .5\n"
             "vocab = 0\n"
             "threads = 1024\n"
             "log_level = debug\n"
             "events =\n"
             "[ ]\n"
             "heartbeat_ms = 10");
    put_text(T, "bad_range.ini", "H = 0\n");
    put_text(T, "bad_unknown.ini", "no_such_option = 1\n");
    put_text(T, "bad_section.ini", "[chaos\nseed = 1\n");
    put_text(T, "bad_section_key.ini", "[policy]\nquorum = 2\n");
    put_text(T, "bad_no_equals.ini", "H 24\n");
    put_text(T, "bad_bool.ini", "share_scaling = maybe\n");
    put_text(T, "bad_float.ini", "gamma = nan\n");
    put_text(T, "bad_float_big.ini", "gamma = 1e400\n");
    put_text(T, "bad_int_junk.ini", "H = 24x\n");
    put_text(T, "bad_int_big.ini", "seed = 99999999999999999999\n");
    put_text(T, "bad_enum.ini", "policy = random\n");
    char longv[400];
    memset(longv, 'a', sizeof longv);
    memcpy(longv, "run_id = ", 9);
    longv[sizeof longv - 2] = '\n';
    longv[sizeof longv - 1] = 0;
    put_text(T, "bad_str_long.ini", longv);
    char longl[1100]; /* 1092 blanks and a valid assignment: over the 1022-byte line cap */
    memset(longl, ' ', sizeof longl);
    memcpy(longl + sizeof longl - 7, "H = 5\n", 7);
    put_text(T, "bad_line_long.ini", longl);

    put_args("args.bin", (const char *const[]){"--H", "48", "--policy=sync", "--share_scaling", "--gamma", "0.75",
                                               "--standalone", "off", "--chaos.seed=7", NULL});
    put_args("args_config.bin", (const char *const[]){"--config", "H = 7\n[chaos]\nseed = 5\n", "--seed=42",
                                                      "--config=eps = 1e-3\nthrottle = 0.5\n", NULL});
    put_args("args_help.bin", (const char *const[]){"--H", "3", "-h", NULL});
    put_args("bad_args_unknown.bin", (const char *const[]){"--unknown=1", NULL});
    put_args("bad_args_positional.bin", (const char *const[]){"--H", "5", "positional", NULL});
    put_args("bad_args_missing.bin", (const char *const[]){"--H", NULL});
    put_args("bad_args_config_missing.bin", (const char *const[]){"--H=2", "--config", NULL});
    put_args("bad_args_config_bad.bin", (const char *const[]){"--config", "H = 0\n", NULL});
}

// ---------------------------------------------------------------------------
// allowlists (format: proto/auth.h)

static void allowlist_seeds(void)
{
    const char *T = "fuzz_allowlist";
    /* keys: Z85 of fixed 32-byte values (zmq_z85_encode needs no CURVE) */
    char k1[41], k2[41], k3[41]; /* 40 chars + NUL */
    char *keys[3] = {k1, k2, k3};
    for (int k = 0; k < 3; k++) {
        uint8_t raw[32];
        for (int i = 0; i < 32; i++) raw[i] = (uint8_t)(37 * i + 101 * k + 11);
        if (!zmq_z85_encode(keys[k], raw, sizeof raw)) {
            fprintf(stderr, "seedgen: zmq_z85_encode failed\n");
            exit(1);
        }
    }
    char buf[1024];
    snprintf(buf, sizeof buf,
             "# learners of run fuzz\n"
             "learner-1 %s\n"
             "\tlearner_2\t%s   # the second one\n"
             "\n"
             "L.3 %s\r\n",
             k1, k2, k3);
    put_text(T, "list.txt", buf);
    put_text(T, "empty.txt", "");
    put_text(T, "comments.txt", "# nobody yet\n   \n\t# still nobody\n");
    snprintf(buf, sizeof buf, "a %s", k1); /* no final newline */
    put_text(T, "one.txt", buf);
    snprintf(buf, sizeof buf, "a %s\nb %s\n", k3, k1);
    put_text(T, "two.txt", buf);
    snprintf(buf, sizeof buf, "bad id! %s\n", k1);
    put_text(T, "bad_id.txt", buf);
    put_text(T, "bad_no_key.txt", "learner-1\n");
    snprintf(buf, sizeof buf, "learner-1 %.39s\n", k1);
    put_text(T, "bad_short_key.txt", buf);
    /* 40 Z85 characters whose groups pass 2^32: not a key */
    snprintf(buf, sizeof buf, "learner-1 %s\n", "########################################");
    put_text(T, "bad_key_overflow.txt", buf);
    snprintf(buf, sizeof buf, "learner-1 %s extra\n", k1);
    put_text(T, "bad_trailing.txt", buf);
    snprintf(buf, sizeof buf, "a %s\na %s\n", k1, k2);
    put_text(T, "bad_dup_id.txt", buf);
    snprintf(buf, sizeof buf, "a %s\nb %s\n", k1, k1);
    put_text(T, "bad_dup_key.txt", buf);
    char nul[128];
    int n = snprintf(nul, sizeof nul, "a %s\n", k1);
    nul[1] = 0; /* "a\0<key>": a NUL is an ordinary bad byte */
    put(T, "bad_nul.txt", nul, (size_t)n);
}

// ---------------------------------------------------------------------------
// model files (format: storage/modelfile.h), of fuzz_modelfile.c's model

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "seedgen: open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (!b || fread(b, 1, *n, f) != *n) exit(1);
    fclose(f);
    return b;
}

/* Write `cfg`'s seeded model as `format` in a scratch directory; its bytes. */
static unsigned char *model_bytes(const dl_model_config *cfg_in, int format, size_t *n)
{
    dl_model_config cfg = *cfg_in;
    size_t numel;
    if (dl_model_config_check(&cfg)) exit(1);
    dl_model_tensor_table(&cfg, NULL, 0, &numel);
    float *p = malloc(numel * sizeof(float));
    if (!p || dl_model_init_params(&cfg, 11, p)) exit(1);
    char dir[] = "/tmp/dloco_seedgen.XXXXXX", path[256];
    if (!mkdtemp(dir)) exit(1);
    snprintf(path, sizeof path, "%s/m", dir);
    if (dl_modelfile_write(path, format, &cfg, p, NULL, 0, NULL)) {
        fprintf(stderr, "seedgen: model file: %s\n", dl_errmsg());
        exit(1);
    }
    char file[300];
    snprintf(file, sizeof file, format == DL_MODELFILE_HF ? "%s/model.safetensors" : "%s", path);
    unsigned char *b = slurp(file, n);
    unlink(file);
    if (format == DL_MODELFILE_HF) {
        snprintf(file, sizeof file, "%s/config.json", path);
        unlink(file);
        rmdir(path);
    }
    rmdir(dir);
    free(p);
    return b;
}

static void model_seeds(void)
{
    const char *T = "fuzz_modelfile";
    const dl_model_config m = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 10};
    size_t n;
    unsigned char *st = model_bytes(&m, DL_MODELFILE_SAFETENSORS, &n);
    put(T, "dloco.safetensors", st, n);
    put(T, "bad_short.safetensors", st, n - 4);
    unsigned char *b = malloc(n);
    memcpy(b, st, n);
    b[0] = (unsigned char)(n - 7); /* header length past the end (n < 64 KiB here) */
    b[1] = (unsigned char)((n - 7) >> 8);
    put(T, "bad_header_len.safetensors", b, n);
    memcpy(b, st, n);
    char *colon = memchr(b + 8, ':', n - 8);
    *colon = ' ';
    put(T, "bad_json.safetensors", b, n);
    memcpy(b, st, n);
    float nan = NAN;
    memcpy(b + n - 4, &nan, 4);
    put(T, "bad_nan.safetensors", b, n);
    free(b);
    free(st);
    st = model_bytes(&m, DL_MODELFILE_HF, &n);
    put(T, "hf.safetensors", st, n);
    free(st);
    st = model_bytes(&m, DL_MODELFILE_LLMC, &n);
    put(T, "model.llmc", st, n);
    put(T, "bad_short.llmc", st, n - 4);
    b = malloc(n);
    memcpy(b, st, n);
    b[4] = 1; /* version 1 */
    put(T, "bad_version.llmc", b, n);
    free(b);
    free(st);
    dl_model_config two = m;
    two.n_layer = 2;
    st = model_bytes(&two, DL_MODELFILE_LLMC, &n);
    put(T, "bad_other_model.llmc", st, n);
    free(st);
}

/* fuzz_manifest: [mode][document]; mode 0 a manifest JSON, mode 1 a
 * safetensors file of the harness's manifest ("e" [4, 2] embedding, "n" [2]
 * vector, "c" [2, 1, 1, 2] matrix). */
static void put_mode(const char *name, int mode, const void *doc, size_t len)
{
    unsigned char *b = malloc(len + 1);
    b[0] = (unsigned char)mode;
    memcpy(b + 1, doc, len);
    put("fuzz_manifest", name, b, len + 1);
    free(b);
}

static void manifest_seeds(void)
{
    static const char *json[][2] = {
        {"llama.json", "{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"model.embed_tokens.weight\", \"shape\": [8, 4], "
                       "\"role\": \"embedding\"}, {\"name\": \"model.norm.weight\", \"shape\": [4], \"role\": \"vector\"}, "
                       "{\"name\": \"conv\", \"shape\": [2, 3, 3, 3], \"role\": \"matrix\", \"dtype\": \"F32\"}]}"},
        {"gpt.json", NULL},
        {"bad_duplicate.json", "{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": "
                               "\"vector\"}, {\"name\": \"w\", \"shape\": [2], \"role\": \"vector\"}]}"},
        {"bad_5dims.json", "{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [1, 1, 1, 1, 1], "
                           "\"role\": \"matrix\"}]}"},
        {"bad_role.json", "{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": \"bias\"}]}"},
        {"bad_member.json", "{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": "
                            "\"vector\", \"role\": \"matrix\"}]}"},
    };
    for (size_t i = 0; i < sizeof json / sizeof json[0]; i++) {
        if (json[i][1]) {
            put_mode(json[i][0], 0, json[i][1], strlen(json[i][1]));
            continue;
        }
        dl_model_config c = {.n_layer = 1, .n_head = 1, .n_embd = 8, .seq_len = 2, .vocab = 2};
        dl_manifest *g;
        char *js;
        size_t n;
        if (dl_manifest_from_gpt(&c, &g) || dl_manifest_to_json(g, &js, &n)) exit(1);
        put_mode(json[i][0], 0, js, n);
        free(js);
        dl_manifest_close(&g);
    }
    /* files: written by storage/tensorfile.c (the manifest in __metadata__) */
    dl_manifest *m;
    int64_t e[2] = {4, 2}, v[1] = {2}, cv[4] = {2, 1, 1, 2};
    if (dl_manifest_open(&m) || dl_manifest_add(m, "e", 2, e, DL_TENSOR_EMBED) ||
        dl_manifest_add(m, "n", 1, v, DL_TENSOR_VECTOR) || dl_manifest_add(m, "c", 4, cv, DL_TENSOR_MATRIX))
        exit(1);
    float x[14];
    for (int i = 0; i < 14; i++) x[i] = 0.125f * (float)(i - 7);
    char path[4200];
    snprintf(path, sizeof path, "%s/.seed.safetensors", g_out);
    unlink(path);
    if (dl_tensorfile_write(path, m, x, NULL, 1, NULL)) {
        fprintf(stderr, "seedgen: %s\n", dl_errmsg());
        exit(1);
    }
    FILE *f = fopen(path, "rb");
    static unsigned char st[65536];
    size_t n = f ? fread(st, 1, sizeof st, f) : 0;
    if (f) fclose(f);
    unlink(path);
    put_mode("model.safetensors", 1, st, n);
    put_mode("bad_short.safetensors", 1, st, n - 4);
    unsigned char *b = malloc(n);
    memcpy(b, st, n);
    float nan = NAN;
    memcpy(b + n - 4, &nan, 4);
    put_mode("bad_nan.safetensors", 1, b, n);
    free(b);
    /* a file as PyTorch writes it: no manifest, tensors in another order */
    static const char hdr[] = "{\"c\":{\"dtype\":\"F32\",\"shape\":[2,1,1,2],\"data_offsets\":[0,16]},"
                              "\"n\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]},"
                              "\"e\":{\"dtype\":\"F16\",\"shape\":[4,2],\"data_offsets\":[20,36]}}";
    size_t hl = sizeof hdr - 1;
    b = calloc(1, 8 + hl + 36);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(b + 8, hdr, hl);
    memcpy(b + 8 + hl, x, 16);
    b[8 + hl + 16 + 1] = 0x3f; /* bf16 1.0 */
    b[8 + hl + 20 + 1] = 0x3c; /* f16 1.0 */
    put_mode("torch.safetensors", 1, b, 8 + hl + 36);
    b[8 + 35] = (unsigned char)'3'; /* "c" shape [2,1,1,3]: not the manifest's */
    put_mode("bad_shape.safetensors", 1, b, 8 + hl + 36);
    free(b);
    /* tensors that make no manifest: one named "" (the fuzzer's find of 2026-12-04, commit b491d75) */
    static const char hdr0[] = "{\"\" :{\"dtype\":\"F32\",\"shape\":[2,1,1,2],\"data_offsets\":[0,16]},"
                               "\"/\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]},"
                               "\"e\":{\"dtype\":\"F16\",\"shape\":[4,2],\"data_offsets\":[20,36]}}";
    hl = sizeof hdr0 - 1;
    b = calloc(1, 8 + hl + 36);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(b + 8, hdr0, hl);
    memcpy(b + 8 + hl, x, 16);
    b[8 + hl + 16 + 1] = 0x3f;
    b[8 + hl + 20 + 1] = 0x3c;
    put_mode("bad_empty_name.safetensors", 1, b, 8 + hl + 36);
    free(b);
    dl_manifest_close(&m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: seedgen OUT_DIR\n");
        return 2;
    }
    g_out = argv[1];
    if (mkdir(g_out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "seedgen: mkdir %s: %s\n", g_out, strerror(errno));
        return 1;
    }
    wire_seeds();
    config_seeds();
    allowlist_seeds();
    model_seeds();
    manifest_seeds();
    printf("seedgen: wrote %d files under %s\n", g_files, g_out);
    return 0;
}
