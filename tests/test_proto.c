/* Tests for proto/: real ZeroMQ ROUTER/DEALER round trips of every message, bad inputs
 * with their exact errors, ZMQ_MAXMSGSIZE, the golden v1 corpus, and a seeded fuzz loop. */
#include "proto/wire.h"

#include <errno.h>
#include <sched.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/manifest.h"
#include "core/plan.h"
#include "core/rng.h"
#include "tests/check.h"

// ---------------------------------------------------------------------------
// check helpers, on tests/check.h's CHECK so every failure is counted there

/* rc is `code` and dl_errmsg() contains `sub`; `line` is the caller's. */
#define EXPECT_ERR(rc, code, sub) expect_err_((rc), (code), (sub), __LINE__)
static void expect_err_(int rc, int code, const char *sub, int line)
{
    const char *msg = dl_errmsg();
    CHECK(rc == code && strstr(msg, sub), "line %d: got rc %d (%s) \"%s\", want rc %d (%s) containing \"%s\"", line,
          rc, dl_strerror(rc), msg, code, dl_strerror(code), sub);
}

// ---------------------------------------------------------------------------
// the run under test: 4 fragments of these sizes (fp32 elements)

#define NF 4
static const uint64_t PLAN_NUMEL[NF] = {1000, 1001, 4096, 17};

static dl_wire_limits plan_limits(void)
{
    dl_wire_limits lim = dl_wire_limits_default();
    lim.num_fragments = NF;
    lim.fragment_numel = PLAN_NUMEL;
    return lim;
}

/* Payload bytes written out independently of dl_wire_payload_bytes, so the
 * fuzz invariant and the size table are not checked against themselves. */
static size_t ref_bytes(int codec, uint64_t n, uint32_t b, uint32_t k)
{
    switch (codec) {
    case DLOCO__V1__CODEC__CODEC_FP32: return (size_t)(n * 4);
    case DLOCO__V1__CODEC__CODEC_BF16: return (size_t)(n * 2);
    case DLOCO__V1__CODEC__CODEC_INT8: return (size_t)(n + 4 * ((n + b - 1) / b));
    case DLOCO__V1__CODEC__CODEC_INT4: /* b is even, so only the last block can hold an odd count */
    case DLOCO__V1__CODEC__CODEC_E3M0: return (size_t)((n + 1) / 2 + 4 * ((n + b - 1) / b));
    case DLOCO__V1__CODEC__CODEC_TOPK: {
        size_t e = 0;
        for (uint64_t o = 0; o < n; o += b) e += (n - o < b ? n - o : b) < k ? (n - o < b ? n - o : b) : k;
        return 6 * e;
    }
    default: return 0;
    }
}

static const Dloco__V1__Codec CODECS[4] = {DLOCO__V1__CODEC__CODEC_FP32, DLOCO__V1__CODEC__CODEC_BF16,
                                           DLOCO__V1__CODEC__CODEC_INT8, DLOCO__V1__CODEC__CODEC_INT4};

// ---------------------------------------------------------------------------
// fixture: one valid message of any type; all storage lives in the struct

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
    uint64_t versions[NF + 2];
    uint32_t frags[NF + 2];
} fixture;

static void fx_make(fixture *f, Dloco__V1__Envelope__BodyCase body, Dloco__V1__Codec codec)
{
    memset(f, 0, sizeof *f);
    dl_wire_env_init(&f->env, "run-test", 7, "learner-7");
    f->env.seq = 11;
    for (int i = 0; i < NF + 2; i++) {
        f->versions[i] = 100 + (uint64_t)i;
        f->frags[i] = (uint32_t)(NF - 1 - i % NF);
    }
    uint32_t block = (codec == DLOCO__V1__CODEC__CODEC_INT8 || codec == DLOCO__V1__CODEC__CODEC_INT4) ? 64 : 0;
    switch (body) {
    case DLOCO__V1__ENVELOPE__BODY_HELLO:
        dloco__v1__hello__init(&f->hello);
        f->hello.fingerprint = 0xfeedface12345678ull;
        f->hello.n_layer = 2, f->hello.n_head = 4, f->hello.n_embd = 64;
        f->hello.seq_len = 128, f->hello.vocab = 256;
        f->hello.num_fragments = NF;
        f->hello.n_held_versions = NF, f->hello.held_versions = f->versions;
        f->hello.device = "cpu";
        f->hello.step = 42;
        dl_wire_set_hello(&f->env, &f->hello);
        break;
    case DLOCO__V1__ENVELOPE__BODY_WELCOME:
        dloco__v1__welcome__init(&f->welcome);
        f->welcome.num_fragments = NF;
        f->welcome.n_fragment_versions = NF, f->welcome.fragment_versions = f->versions;
        f->welcome.h = 24, f->welcome.heartbeat_ms = 500, f->welcome.liveness = 3;
        f->welcome.policy = "ddiloco";
        f->welcome.must_fetch = 1;
        dl_wire_set_welcome(&f->env, &f->welcome);
        break;
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT:
        dloco__v1__heartbeat__init(&f->heartbeat);
        f->heartbeat.step = 43, f->heartbeat.tokens = 22016, f->heartbeat.steps_per_s = 2.5;
        dl_wire_set_heartbeat(&f->env, &f->heartbeat);
        break;
    case DLOCO__V1__ENVELOPE__BODY_PUSH:
        dloco__v1__push__init(&f->push);
        f->push.fragment = 1, f->push.base_version = 6, f->push.steps = 24, f->push.tokens = 3072;
        f->push.codec = codec, f->push.numel = PLAN_NUMEL[1], f->push.block_size = block;
        f->push.checksum = 0, f->push.loss = 3.25, f->push.compute_s = 1.5;
        dl_wire_set_push(&f->env, &f->push);
        break;
    case DLOCO__V1__ENVELOPE__BODY_ACK:
        dloco__v1__ack__init(&f->ack);
        f->ack.fragment = 1, f->ack.base_version = 6;
        f->ack.decision = DLOCO__V1__DECISION__DECISION_DROPPED_STALE;
        f->ack.merged_version = 9, f->ack.reason = "staleness 5 > max 4", f->ack.rebase = 1;
        dl_wire_set_ack(&f->env, &f->ack);
        break;
    case DLOCO__V1__ENVELOPE__BODY_UPDATE:
        dloco__v1__update__init(&f->update);
        f->update.fragment = 2, f->update.version = 9, f->update.codec = codec;
        f->update.numel = PLAN_NUMEL[2], f->update.block_size = block, f->update.checksum = 0;
        f->update.delta = codec != DLOCO__V1__CODEC__CODEC_FP32; /* a full update is fp32 only */
        dl_wire_set_update(&f->env, &f->update);
        break;
    case DLOCO__V1__ENVELOPE__BODY_FETCH:
        dloco__v1__fetch__init(&f->fetch);
        f->fetch.n_fragments = 2, f->fetch.fragments = f->frags;
        dl_wire_set_fetch(&f->env, &f->fetch);
        break;
    case DLOCO__V1__ENVELOPE__BODY_BYE:
        dloco__v1__bye__init(&f->bye);
        f->bye.reason = "shutdown", f->bye.step = 99;
        dl_wire_set_bye(&f->env, &f->bye);
        break;
    case DLOCO__V1__ENVELOPE__BODY_ERROR:
        dloco__v1__error__init(&f->error);
        f->error.kind = DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH, f->error.message = "fingerprint mismatch",
        f->error.fatal = 1;
        dl_wire_set_error(&f->env, &f->error);
        break;
    default: REQUIRE(0, "fx_make: bad body %d", (int)body);
    }
}

/* Payload length the fixture's header promises (0 when it carries none). */
static size_t fx_len(const fixture *f)
{
    if (f->env.body_case == DLOCO__V1__ENVELOPE__BODY_PUSH)
        return ref_bytes(f->push.codec, f->push.numel, f->push.block_size, f->push.topk);
    if (f->env.body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE)
        return ref_bytes(f->update.codec, f->update.numel, f->update.block_size, f->update.topk);
    return 0;
}

static uint8_t *pack_env(const Dloco__V1__Envelope *env, size_t *len)
{
    *len = dloco__v1__envelope__get_packed_size(env);
    uint8_t *buf = malloc(*len ? *len : 1);
    REQUIRE(buf, "malloc");
    REQUIRE(dloco__v1__envelope__pack(env, buf) == *len, "pack size");
    return buf;
}

/* Pack `env`, decode+validate it with the given frames, expect DL_EPROTO
 * with `sub` in the message and no envelope handed out. */
#define EXPECT_BAD(env, lens, np, lim, sub) expect_bad_((env), (lens), (np), (lim), (sub), __LINE__)
static void expect_bad_(const Dloco__V1__Envelope *env, const size_t *lens, int np, const dl_wire_limits *lim,
                        const char *sub, int line)
{
    size_t n;
    uint8_t *buf = pack_env(env, &n);
    Dloco__V1__Envelope *out = (Dloco__V1__Envelope *)1;
    dl_err_clear();
    int rc = dl_wire_unpack(buf, n, lens, np, lim, &out);
    expect_err_(rc, DL_EPROTO, sub, line);
    CHECK(out == NULL, "line %d: rejected header must not be handed out", line);
    dl_wire_env_free(&out);
    free(buf);
}

static void fill_random(dl_rng *r, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)dl_rng_u64(r);
}

// ---------------------------------------------------------------------------
// sizes and checksums

static void test_sizes(void)
{
    struct { Dloco__V1__Codec c; uint64_t n; uint32_t b; size_t want; } t[] = {
        {DLOCO__V1__CODEC__CODEC_FP32, 1000, 0, 4000},
        {DLOCO__V1__CODEC__CODEC_FP32, 1000, 64, 0},      /* a block size on a float codec is refused */
        {DLOCO__V1__CODEC__CODEC_FP32, 1000, 0, 4000},
        {DLOCO__V1__CODEC__CODEC_E3M0, 1001, 64, 501 + 4 * 16},
        {DLOCO__V1__CODEC__CODEC_INT8, 1000, 17, 0},      /* odd block */
        {DLOCO__V1__CODEC__CODEC_BF16, 1001, 0, 2002},
        {DLOCO__V1__CODEC__CODEC_INT8, 1000, 64, 1000 + 4 * 16},
        {DLOCO__V1__CODEC__CODEC_INT8, 1024, 64, 1024 + 4 * 16},
        {DLOCO__V1__CODEC__CODEC_INT8, 1, 65536, 1 + 4},
        {DLOCO__V1__CODEC__CODEC_INT4, 1001, 64, 501 + 4 * 16},
        {DLOCO__V1__CODEC__CODEC_INT4, 16, 16, 8 + 4},
        {DLOCO__V1__CODEC__CODEC_INT4, 17, 16, 9 + 8},
        {DLOCO__V1__CODEC__CODEC_INT8, 1000, 15, 0},      /* block below 16 */
        {DLOCO__V1__CODEC__CODEC_INT4, 1000, 65537, 0},   /* block above 65536 */
        {DLOCO__V1__CODEC__CODEC_INT8, 1000, 0, 0},
        {DLOCO__V1__CODEC__CODEC_FP32, 0, 0, 0},          /* empty */
        {DLOCO__V1__CODEC__CODEC_UNSPECIFIED, 10, 0, 0},
        {(Dloco__V1__Codec)9, 10, 0, 0},
        {DLOCO__V1__CODEC__CODEC_FP32, UINT64_MAX / 2, 0, 0}, /* overflows */
        {DLOCO__V1__CODEC__CODEC_FP32, UINT64_MAX, 0, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        size_t got = dl_wire_payload_bytes(t[i].c, t[i].n, t[i].b, 0);
        CHECK(got == t[i].want, "payload_bytes(%d, %llu, %u) = %zu, want %zu", (int)t[i].c,
              (unsigned long long)t[i].n, t[i].b, got, t[i].want);
    }
    uint8_t buf[777];
    dl_rng r;
    dl_rng_seed(&r, 5);
    fill_random(&r, buf, sizeof buf);
    uint64_t h = dl_checksum64(buf, sizeof buf);
    CHECK(dl_wire_checksum(buf, sizeof buf) == h, "checksum is dl_checksum64 (XXH3, protocol version 2)");
    CHECK(dl_wire_checksum_ok(buf, sizeof buf, h), "checksum_ok accepts the right hash");
    buf[400] ^= 1;
    CHECK(!dl_wire_checksum_ok(buf, sizeof buf, h), "checksum_ok rejects a flipped bit");
    CHECK(strcmp(dl_wire_codec_name(DLOCO__V1__CODEC__CODEC_INT4), "int4") == 0, "codec name");
    CHECK(strcmp(dl_wire_body_name(DLOCO__V1__ENVELOPE__BODY_PUSH), "push") == 0, "body name");
    printf("sizes: payload byte table, checksum, names ok\n");
}

// ---------------------------------------------------------------------------
// bad inputs, decoded without sockets

static void test_bad_inputs(void)
{
    dl_wire_limits lim = plan_limits();
    dl_wire_limits dflt = dl_wire_limits_default();
    fixture f;
    size_t len, n;
    int before = checks;

    /* garbage and truncated headers */
    {
        const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
        Dloco__V1__Envelope *out = NULL;
        EXPECT_ERR(dl_wire_unpack(garbage, sizeof garbage, NULL, 0, &lim, &out), DL_EPROTO,
                   "undecodable header (12 bytes)");
        const uint8_t bad_wire_type[] = {0x0f, 0x01}; /* field 1, wire type 7 */
        EXPECT_ERR(dl_wire_unpack(bad_wire_type, 2, NULL, 0, &lim, &out), DL_EPROTO, "undecodable header");
        CHECK(out == NULL, "no envelope from garbage");

        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
        uint8_t *buf = pack_env(&f.env, &n);
        len = fx_len(&f);
        EXPECT_ERR(dl_wire_unpack(buf, n - 1, &len, 1, &lim, &out), DL_EPROTO, "undecodable header");
        /* The body is the last field, so every shorter prefix either cuts it
         * (undecodable) or drops it (no body): none may pass. */
        int all_rejected = 1;
        for (size_t k = 0; k < n; k++) {
            int rc = dl_wire_unpack(buf, k, &len, 1, &lim, &out);
            if (rc != DL_EPROTO || out) all_rejected = 0;
            dl_wire_env_free(&out);
        }
        CHECK(all_rejected, "every truncation of a %zu-byte push header is rejected", n);
        EXPECT_ERR(dl_wire_unpack(buf, 0, &len, 1, &lim, &out), DL_EPROTO, "envelope: no body set");
        free(buf);

        uint8_t *big = calloc(DL_WIRE_MAX_HEADER_BYTES + 1, 1);
        EXPECT_ERR(dl_wire_unpack(big, DL_WIRE_MAX_HEADER_BYTES + 1, NULL, 0, &lim, &out), DL_EPROTO,
                   "header is 65537 bytes, max 65536");
        free(big);
    }

    /* envelope */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    f.env.body_case = DLOCO__V1__ENVELOPE__BODY__NOT_SET;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "envelope: no body set");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    f.env.protocol_version = 1; /* a peer of the XXH64 checksums */
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: protocol_version 1 not supported (this build speaks 3)");
    f.env.protocol_version = 2; /* a peer from before the per-block layouts and delta updates */
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: protocol_version 2 not supported (this build speaks 3)");
    f.env.protocol_version = 4;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: protocol_version 4 not supported (this build speaks 3)");
    f.env.protocol_version = 0;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "protocol_version 0 not supported");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    f.env.learner_id = "learner 7";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: learner_id byte 7 is 0x20, allowed [A-Za-z0-9._-]");
    f.env.learner_id = "l\xc3\xa9";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "learner_id byte 1 is 0xc3");
    f.env.learner_id = "a/b";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "learner_id byte 1 is 0x2f");
    f.env.learner_id = "";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: learner_id is empty");
    char id65[66];
    memset(id65, 'a', 65), id65[65] = 0;
    f.env.learner_id = id65;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "learner_id is 65 bytes, max 64");
    id65[64] = 0; /* exactly 64 is fine */
    {
        size_t pn;
        uint8_t *p = pack_env(&f.env, &pn);
        Dloco__V1__Envelope *out = NULL;
        CHECK(dl_wire_unpack(p, pn, NULL, 0, &lim, &out) == 0, "64-byte learner id accepted: %s", dl_errmsg());
        dl_wire_env_free(&out);
        free(p);
    }
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    char run129[130];
    memset(run129, 'r', 129), run129[129] = 0;
    f.env.run_id = run129;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: run_id is 129 bytes, max 128");
    f.env.run_id = "run\x1b[31m";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "run_id has control byte 0x1b at 3");

    /* push: indices, sizes, counts */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    len = fx_len(&f);
    f.push.fragment = NF;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: fragment 4 out of range (num_fragments 4)");
    f.push.fragment = DL_WIRE_MAX_FRAGMENTS;
    EXPECT_BAD(&f.env, &len, 1, &dflt, "push: fragment 4096 out of range (protocol max 4096)");
    f.push.fragment = UINT32_MAX;
    EXPECT_BAD(&f.env, &len, 1, &dflt, "fragment 4294967295 out of range");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.push.numel = 1000;
    len = 4000;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: fragment 1 numel 1000, plan says 1001");
    f.push.numel = dflt.max_numel + 1;
    EXPECT_BAD(&f.env, &len, 1, &dflt, "push: numel 4294967297 exceeds max 4294967296");
    f.push.numel = 0;
    EXPECT_BAD(&f.env, &len, 1, &dflt, "push: numel is 0");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    len = fx_len(&f);
    size_t two[2] = {len, 8};
    EXPECT_BAD(&f.env, NULL, 0, &lim, "push: needs 1 payload frame, got 0");
    EXPECT_BAD(&f.env, two, 2, &lim, "push: message has 3 frames, max 2");
    dl_wire_limits lim3 = lim;
    lim3.max_frames = 3;
    EXPECT_BAD(&f.env, two, 2, &lim3, "push: needs 1 payload frame, got 2");
    f.push.steps = 0;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: steps is 0");
    f.push.steps = 5, f.push.tokens = 3;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: tokens 3 < steps 5");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.push.loss = NAN;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: loss is nan, must be finite");
    f.push.loss = -INFINITY;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: loss is -inf, must be finite");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.push.compute_s = NAN;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: compute_s is nan, must be finite");
    f.push.compute_s = INFINITY;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: compute_s is inf, must be finite");
    f.push.compute_s = -0.5;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: compute_s is -0.5, must be in [0, steps * 86400 = 2.0736e+06]");
    f.push.compute_s = 24 * 86400.0 + 1;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: compute_s is 2.0736e+06, must be in [0, steps * 86400 = 2.0736e+06]");
    f.push.compute_s = 24 * 86400.0;
    {
        size_t n;
        uint8_t *buf = pack_env(&f.env, &n);
        Dloco__V1__Envelope *out = NULL;
        CHECK(dl_wire_unpack(buf, n, &len, 1, &lim, &out) == 0 && out->push->compute_s == 24 * 86400.0,
              "push: compute_s = steps * 86400 accepted: %s", dl_errmsg());
        dl_wire_env_free(&out);
        free(buf);
    }

    /* payload length off by one, per codec, for push and update */
    for (int c = 0; c < 4; c++) {
        char want[160];
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, CODECS[c]);
        size_t ok = fx_len(&f);
        size_t off[2] = {ok - 1, ok + 1};
        for (int k = 0; k < 2; k++) {
            if (c < 2)
                snprintf(want, sizeof want, "push: payload is %zu bytes, %s x 1001 needs %zu", off[k],
                         dl_wire_codec_name(CODECS[c]), ok);
            else
                snprintf(want, sizeof want, "push: payload is %zu bytes, %s x 1001 (block 64) needs %zu", off[k],
                         dl_wire_codec_name(CODECS[c]), ok);
            EXPECT_BAD(&f.env, &off[k], 1, &lim, want);
        }
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_UPDATE, CODECS[c]);
        ok = fx_len(&f);
        size_t lo = ok - 1;
        snprintf(want, sizeof want, "update: payload is %zu bytes, %s x 4096", lo, dl_wire_codec_name(CODECS[c]));
        EXPECT_BAD(&f.env, &lo, 1, &lim, want);
    }
    /* the example from the design note, verbatim */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.push.fragment = 0, f.push.numel = 1000;
    len = 4096;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: payload is 4096 bytes, fp32 x 1000 needs 4000");

    /* codecs and block sizes */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    len = fx_len(&f);
    f.push.codec = (Dloco__V1__Codec)9;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: unknown codec 9");
    f.push.codec = DLOCO__V1__CODEC__CODEC_UNSPECIFIED;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: unknown codec 0");
    f.push.codec = (Dloco__V1__Codec)-1;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: unknown codec -1");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.push.block_size = 64;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: block_size 64 and topk 0 must be 0 for fp32");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_INT8);
    f.push.block_size = 15;
    len = 1001 + 4 * 67;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: block_size 15 of int8 must be even and in [16, 65536]");
    f.push.block_size = 65537;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: block_size 65537 of int8 must be even and in [16, 65536]");
    f.push.block_size = 66;
    f.push.topk = 3;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: topk 3 must be 0 for int8");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_TOPK);
    f.push.block_size = 64, f.push.topk = 65;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: topk 65 must be in [1, block_size 64]");
    f.push.topk = 0;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: topk 0 must be in [1, block_size 64]");
    f.push.topk = 4; /* 1001 elements in blocks of 64: 15 full blocks of 4 entries, the last (41) of 4 */
    len = 6 * 4 * 16;
    CHECK(dl_wire_validate(&f.env, &len, 1, &lim) == 0, "topk push of 16 blocks x 4 entries: %s", dl_errmsg());
    len -= 6;
    EXPECT_BAD(&f.env, &len, 1, &lim, "push: payload is 378 bytes, topk x 1001 (block 64, topk) needs 384");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_UPDATE, DLOCO__V1__CODEC__CODEC_INT4);
    len = fx_len(&f);
    f.update.codec = (Dloco__V1__Codec)7;
    EXPECT_BAD(&f.env, &len, 1, &lim, "update: unknown codec 7");
    f.update.codec = DLOCO__V1__CODEC__CODEC_INT4, f.update.delta = 0;
    EXPECT_BAD(&f.env, &len, 1, &lim, "update: a full update must be fp32, got int4");
    f.update.delta = 1, f.update.version = 0;
    EXPECT_BAD(&f.env, &len, 1, &lim, "update: delta update of version 0");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_UPDATE, DLOCO__V1__CODEC__CODEC_FP32);
    len = fx_len(&f);
    f.update.fragment = 3;
    EXPECT_BAD(&f.env, &len, 1, &lim, "update: fragment 3 numel 4096, plan says 17");
    f.update.fragment = 2;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "update: needs 1 payload frame, got 0");

    /* bodies that carry no payload */
    size_t one = 10;
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ACK, 0);
    EXPECT_BAD(&f.env, &one, 1, &lim, "ack: needs 0 payload frames, got 1");
    f.ack.decision = (Dloco__V1__Decision)7;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: unknown decision 7");
    f.ack.decision = DLOCO__V1__DECISION__DECISION_UNSPECIFIED;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: unknown decision 0");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ACK, 0);
    f.ack.fragment = 4;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: fragment 4 out of range (num_fragments 4)");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    EXPECT_BAD(&f.env, &one, 1, &lim, "heartbeat: needs 0 payload frames, got 1");
    f.heartbeat.steps_per_s = INFINITY;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: steps_per_s is inf, must be finite");
    f.heartbeat.steps_per_s = NAN;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: steps_per_s is nan");
    f.heartbeat.steps_per_s = -1;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: steps_per_s is -1, must be >= 0");
    /* discarded fragment-tokens are bounded by tokens x fragments (lim: 4 fragments) */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    f.heartbeat.tokens = 100, f.heartbeat.discarded_tokens = 401;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "heartbeat: discarded_tokens 401 > tokens 100 x 4 fragments");
    f.heartbeat.discarded_tokens = 400;
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "heartbeat: discarded_tokens = tokens x P accepted");
    f.heartbeat.tokens = UINT64_MAX, f.heartbeat.discarded_tokens = UINT64_MAX;
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "heartbeat: tokens x P saturates instead of wrapping");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_BYE, 0);
    f.bye.tokens = 0, f.bye.discarded_tokens = 1;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "bye: discarded_tokens 1 > tokens 0 x 4 fragments");
    /* Error.kind: required, known; a v1.0 Error with only the deprecated code is still read */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ERROR, 0);
    f.error.kind = DLOCO__V1__ERROR_KIND__ERROR_KIND_UNSPECIFIED;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "error: kind 0 is not a known ErrorKind");
    f.error.kind = (Dloco__V1__ErrorKind)9;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "error: kind 9 is not a known ErrorKind");
    f.error.kind = DLOCO__V1__ERROR_KIND__ERROR_KIND_UNSPECIFIED, f.error.code = DL_ENOTFOUND;
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0 &&
              dl_wire_error_kind(&f.error) == DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER,
          "a legacy Error (code only) validates and reads as its kind");
    CHECK(dl_wire_error_kind_of(DL_EMISMATCH) == DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH &&
              dl_wire_error_kind_of(DL_ERANGE) == DLOCO__V1__ERROR_KIND__ERROR_KIND_FULL &&
              dl_wire_error_kind_of(DL_ESTORE) == DLOCO__V1__ERROR_KIND__ERROR_KIND_INTERNAL,
          "internal codes map onto the protocol's kinds");

    /* oversize strings, control bytes */
    char text[1100];
    memset(text, 'x', 1025), text[1025] = 0;
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_BYE, 0);
    f.bye.reason = text;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "bye: reason is 1025 bytes, max 1024");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ERROR, 0);
    f.error.message = text;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "error: message is 1025 bytes, max 1024");
    f.error.message = "two\nlines";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "error: message has control byte 0x0a at 3");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ACK, 0);
    f.ack.reason = text;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: reason is 1025 bytes");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    text[129] = 0;
    f.hello.device = text;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: device is 129 bytes, max 128");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
    f.welcome.policy = text;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: policy is 129 bytes, max 128");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    f.env.learner_id = "";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "learner_id is empty"); /* only Error may omit it */

    /* repeated fields and fragment counts */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    f.hello.n_held_versions = NF + 1;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: held_versions has 5 entries, expected 0 or num_fragments 4");
    f.hello.n_held_versions = 0;
    f.hello.num_fragments = 3; /* another P: valid here, the synchronizer refuses it (MISMATCH, fatal) */
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "a hello of another P passes the wire: %s", dl_errmsg());
    f.hello.num_fragments = DL_WIRE_MAX_FRAGMENTS + 1;
    EXPECT_BAD(&f.env, NULL, 0, &dflt, "hello: num_fragments 4097, protocol max 4096");
    f.hello.num_fragments = 0;
    EXPECT_BAD(&f.env, NULL, 0, &dflt, "hello: num_fragments is 0");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    f.hello.n_embd = 0;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: model config has a zero");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
    f.welcome.n_fragment_versions = NF - 1;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: fragment_versions has 3 entries, num_fragments is 4");
    f.welcome.n_fragment_versions = NF + 2;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: fragment_versions has 6 entries");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
    f.welcome.h = 0;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: h is 0");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
    f.welcome.liveness = 0;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: liveness is 0");
    /* answered_bases (the answers to a learner process's pushes): none, or one per fragment, each at most
     * 1 + that fragment's version (versions here: 100 + i) */
    {
        uint64_t ab[NF + 1] = {0, 101, 102, 104, 0};
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
        f.welcome.n_answered_bases = NF, f.welcome.answered_bases = ab;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "welcome with answered_bases: %s", dl_errmsg());
        f.welcome.n_answered_bases = NF - 1;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: answered_bases has 3 entries, num_fragments is 4");
        f.welcome.n_answered_bases = NF + 1;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: answered_bases has 5 entries");
        f.welcome.n_answered_bases = NF;
        ab[3] = 105;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: answered_bases[3] names base version 104, beyond fragment version 103");
        ab[3] = UINT64_MAX;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "beyond fragment version 103");
    }
    /* final_pending (a final push's fragments still to come): ascending, in range, not its own, only on a
     * final push */
    {
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
        size_t plen = fx_len(&f);
        uint32_t fp[3] = {0, 2, 3};
        f.push.final = 1, f.push.n_final_pending = 3, f.push.final_pending = fp;
        CHECK(dl_wire_validate(&f.env, &plen, 1, &lim) == 0, "final push with final_pending: %s", dl_errmsg());
        f.push.final = 0;
        EXPECT_BAD(&f.env, &plen, 1, &lim, "push: final_pending on a push that is not final");
        f.push.final = 1;
        fp[1] = 1; /* the push's own fragment */
        EXPECT_BAD(&f.env, &plen, 1, &lim, "push: final_pending names the push's own fragment 1");
        fp[1] = 3;
        EXPECT_BAD(&f.env, &plen, 1, &lim, "push: final_pending is not ascending (3 after 3)");
        fp[1] = 2, fp[2] = NF;
        EXPECT_BAD(&f.env, &plen, 1, &lim, "push: fragment 4 out of range (num_fragments 4)");
        fp[2] = UINT32_MAX;
        EXPECT_BAD(&f.env, &plen, 1, &lim, "out of range");
        f.push.final = 0, f.push.n_final_pending = 0, f.push.final_pending = NULL;
    }
    /* chunked transfers (docs/PROTOCOL.md "Chunked transfers") */
    {
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
        uint64_t N = f.push.numel;
        f.push.chunk_offset = 0, f.push.chunk_numel = 100, f.push.transfer = 0;
        size_t cl = 400;
        EXPECT_BAD(&f.env, &cl, 1, &lim, "push: chunked push without a transfer id");
        f.push.transfer = 3;
        CHECK(dl_wire_validate(&f.env, &cl, 1, &lim) == 0, "a first chunk of 100 floats is valid: %s", dl_errmsg());
        f.push.chunk_offset = N - 50;
        EXPECT_BAD(&f.env, &cl, 1, &lim, "runs past numel");
        f.push.chunk_offset = N;
        EXPECT_BAD(&f.env, &cl, 1, &lim, "outside numel");
        f.push.chunk_offset = 5, f.push.chunk_numel = 0;
        len = fx_len(&f);
        EXPECT_BAD(&f.env, &len, 1, &lim, "push: chunk_offset 5 without chunk_numel");
        f.push.chunk_offset = 100, f.push.chunk_numel = 100;
        size_t wrong = 396;
        EXPECT_BAD(&f.env, &wrong, 1, &lim, "payload is 396 bytes, fp32 x 100 needs 400");
        /* block codecs chunk on block boundaries (1001 elements, block 64) */
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_INT8);
        f.push.chunk_numel = 64, f.push.transfer = 1;
        len = 64 + 4;
        CHECK(dl_wire_validate(&f.env, &len, 1, &lim) == 0, "int8 chunk of one block: %s", dl_errmsg());
        f.push.chunk_offset = 32;
        EXPECT_BAD(&f.env, &len, 1, &lim, "push: chunk [32, +64) of int8 is not aligned to block_size 64");
        f.push.chunk_offset = 64, f.push.chunk_numel = 100;
        len = 100 + 8;
        EXPECT_BAD(&f.env, &len, 1, &lim, "push: chunk [64, +100) of int8 is not aligned to block_size 64");
        f.push.chunk_offset = 960, f.push.chunk_numel = 41; /* the fragment's last, partial block */
        len = 41 + 4;
        CHECK(dl_wire_validate(&f.env, &len, 1, &lim) == 0, "int8 last partial chunk: %s", dl_errmsg());
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_UPDATE, DLOCO__V1__CODEC__CODEC_FP32);
        f.update.chunk_offset = 8, f.update.chunk_numel = f.update.numel;
        cl = (size_t)f.update.numel * 4;
        EXPECT_BAD(&f.env, &cl, 1, &lim, "update: chunk [8, +");
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
        f.welcome.chunk_bytes = 4094;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: chunk_bytes 4094 is not a multiple of 4 in [4096, 67108864]");
        f.welcome.chunk_bytes = 64u << 21;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "chunk_bytes 134217728 is not a multiple of 4");
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
        f.hello.max_chunk_bytes = 100;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: max_chunk_bytes 100 below the protocol's minimum 4096");
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ACK, 0);
        f.ack.busy = 1;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: busy on a decision other than REJECTED");
        f.ack.decision = DLOCO__V1__DECISION__DECISION_REJECTED, f.ack.retry_after_ms = 600001;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: retry_after_ms 600001 above 600000");
        /* Ack.fleet_steps_per_s (dynamic H): finite, in [0, 1e9] */
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ACK, 0);
        f.ack.fleet_steps_per_s = NAN;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: fleet_steps_per_s is nan, must be finite");
        f.ack.fleet_steps_per_s = INFINITY;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: fleet_steps_per_s is inf, must be finite");
        f.ack.fleet_steps_per_s = -0.5;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: fleet_steps_per_s is -0.5, must be in [0, 1e+09]");
        f.ack.fleet_steps_per_s = 2e9;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: fleet_steps_per_s is 2e+09, must be in [0, 1e+09]");
        f.ack.fleet_steps_per_s = 1e9;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "ack: fleet_steps_per_s 1e9 is valid");
        /* Ack.chunk_bytes (the learner's next push chunk size): 0, or a multiple of 4 in the protocol's range */
        f.ack.chunk_bytes = 4094;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: chunk_bytes 4094 is not a multiple of 4 in [4096, 67108864]");
        f.ack.chunk_bytes = (64u << 20) + 4;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "ack: chunk_bytes 67108868 is not a multiple of 4");
        f.ack.chunk_bytes = 1u << 20;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "ack: chunk_bytes 1 MiB is valid: %s", dl_errmsg());
        f.ack.chunk_bytes = 0;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "ack: chunk_bytes 0 (keep) is valid: %s", dl_errmsg());
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_FETCH, 0);
        uint64_t rv[2] = {1, 2}, ro[2] = {0, 0};
        f.fetch.resume_versions = rv, f.fetch.n_resume_versions = 2;
        f.fetch.resume_offsets = ro, f.fetch.n_resume_offsets = 1;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "fetch: 2 resume_versions but 1 resume_offsets");
        f.fetch.n_resume_versions = f.fetch.n_resume_offsets = 1;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "fetch: 1 resume entries for 2 fragments");
        f.fetch.n_resume_versions = f.fetch.n_resume_offsets = 2;
        ro[1] = PLAN_NUMEL[f.frags[1]];
        EXPECT_BAD(&f.env, NULL, 0, &lim, "fetch: resume_offsets[1]");
        ro[1] = PLAN_NUMEL[f.frags[1]] - 1;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "a resume at the last element is valid: %s", dl_errmsg());
    }
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_FETCH, 0);
    f.fetch.n_fragments = NF + 1;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "fetch: 5 fragments listed, max 4");
    f.fetch.n_fragments = 2;
    f.frags[1] = f.frags[0];
    EXPECT_BAD(&f.env, NULL, 0, &lim, "fetch: fragment 3 listed twice");
    f.frags[1] = 9;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "fetch: fragment 9 out of range (num_fragments 4)");
    {
        /* 4097 entries under the protocol-wide cap */
        uint32_t *many = calloc(DL_WIRE_MAX_FRAGMENTS + 1, sizeof *many);
        for (uint32_t i = 0; i <= DL_WIRE_MAX_FRAGMENTS; i++) many[i] = i;
        f.fetch.fragments = many, f.fetch.n_fragments = DL_WIRE_MAX_FRAGMENTS + 1;
        EXPECT_BAD(&f.env, NULL, 0, &dflt, "fetch: 4097 fragments listed, max 4096");
        f.fetch.n_fragments = DL_WIRE_MAX_FRAGMENTS; /* 0..4095: the most a fetch may list */
        size_t pn;
        uint8_t *p = pack_env(&f.env, &pn);
        Dloco__V1__Envelope *out = NULL;
        CHECK(dl_wire_unpack(p, pn, NULL, 0, &dflt, &out) == 0, "4096-entry fetch accepted: %s", dl_errmsg());
        dl_wire_env_free(&out);
        free(p);
        free(many);
    }

    /* shards (core/shard.h): shard 1 of 2 owns fragments 1 and 3 of the 4 */
    {
        dl_wire_limits sl = lim;
        sl.shard = 1, sl.shards = 2;
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
        size_t pl = (size_t)f.push.numel * 4;
        CHECK(dl_wire_validate(&f.env, &pl, 1, &sl) == 0, "a push of an owned fragment: %s", dl_errmsg());
        f.push.fragment = 2, f.push.numel = PLAN_NUMEL[2];
        pl = (size_t)f.push.numel * 4;
        EXPECT_BAD(&f.env, &pl, 1, &sl,
                   "push: fragment 2 belongs to shard 0 of 2 (p % shards), this synchronizer is shard 1");
        CHECK(dl_wire_validate(&f.env, &pl, 1, &lim) == 0, "unsharded, every fragment is served");
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_FETCH, 0); /* fragments 3 and 2 */
        EXPECT_BAD(&f.env, NULL, 0, &sl, "fetch: fragment 2 belongs to shard 0 of 2");
        f.fetch.n_fragments = 1;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &sl) == 0, "a fetch of an owned fragment: %s", dl_errmsg());
        /* discarded fragment-tokens of a session: tokens x the 2 fragments the shard owns */
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
        f.heartbeat.tokens = 100, f.heartbeat.discarded_tokens = 201;
        EXPECT_BAD(&f.env, NULL, 0, &sl, "heartbeat: discarded_tokens 201 > tokens 100 x 2 fragments");
        f.heartbeat.discarded_tokens = 200;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &sl) == 0, "discarded = tokens x owned accepted");
        /* a Welcome's layout */
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
        f.welcome.shard = 1, f.welcome.shards = 2;
        CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "welcome from shard 1 of 2: %s", dl_errmsg());
        f.welcome.shard = 2;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: shard 2 is not below shards 2");
        f.welcome.shard = 0, f.welcome.shards = 5;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: shards 5 > num_fragments 4");
        f.welcome.shard = 1, f.welcome.shards = 1;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: shard 1 of 1 shards (unsharded is shard 0)");
        f.welcome.shards = 0;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: shard 1 of 0 shards");
        f.welcome.shard = 0, f.welcome.update_codec = 7;
        EXPECT_BAD(&f.env, NULL, 0, &lim, "welcome: update_codec 7 is not a known codec");
    }

    /* every valid fixture does pass (so the rejections above are specific) */
    Dloco__V1__Envelope__BodyCase all[] = {
        DLOCO__V1__ENVELOPE__BODY_HELLO, DLOCO__V1__ENVELOPE__BODY_WELCOME, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT,
        DLOCO__V1__ENVELOPE__BODY_PUSH,  DLOCO__V1__ENVELOPE__BODY_ACK,     DLOCO__V1__ENVELOPE__BODY_UPDATE,
        DLOCO__V1__ENVELOPE__BODY_FETCH, DLOCO__V1__ENVELOPE__BODY_BYE,     DLOCO__V1__ENVELOPE__BODY_ERROR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        for (int c = 0; c < 4; c++) {
            fx_make(&f, all[i], CODECS[c]);
            len = fx_len(&f);
            int rc = dl_wire_validate(&f.env, &len, len ? 1 : 0, &lim);
            CHECK(rc == 0, "valid %s/%s: %s", dl_wire_body_name(all[i]), dl_wire_codec_name(CODECS[c]),
                  dl_errmsg());
        }
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ERROR, 0);
    f.env.learner_id = "";
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "error may omit learner_id: %s", dl_errmsg());
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    f.hello.n_held_versions = 0;
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "fresh hello with no held versions: %s", dl_errmsg());
    printf("bad inputs: %d checks\n", checks - before);
}

// ---------------------------------------------------------------------------
// real sockets

typedef struct {
    void *ctx, *router, *dealer;
    char endpoint[256];
} net;

static void net_open(net *n, const char *learner_id, size_t router_max, size_t dealer_max)
{
    int timeout_ms = 10000; /* a lost message fails the test instead of hanging it */
    n->ctx = zmq_ctx_new();
    REQUIRE(n->ctx, "zmq_ctx_new");
    n->router = zmq_socket(n->ctx, ZMQ_ROUTER);
    n->dealer = zmq_socket(n->ctx, ZMQ_DEALER);
    REQUIRE(n->router && n->dealer, "zmq_socket");
    REQUIRE(dl_wire_sock_setup(n->router, 1, router_max) == 0, "router setup: %s", dl_errmsg());
    REQUIRE(dl_wire_sock_setup(n->dealer, 0, dealer_max) == 0, "dealer setup: %s", dl_errmsg());
    zmq_setsockopt(n->router, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(n->dealer, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    REQUIRE(zmq_bind(n->router, "tcp://127.0.0.1:*") == 0, "bind: %s", zmq_strerror(zmq_errno()));
    size_t sz = sizeof n->endpoint;
    REQUIRE(zmq_getsockopt(n->router, ZMQ_LAST_ENDPOINT, n->endpoint, &sz) == 0, "last endpoint");
    REQUIRE(zmq_setsockopt(n->dealer, ZMQ_ROUTING_ID, learner_id, strlen(learner_id)) == 0, "routing id");
    REQUIRE(zmq_connect(n->dealer, n->endpoint) == 0, "connect %s", n->endpoint);

    /* the options really landed */
    int v = -1;
    int64_t mm = 0;
    sz = sizeof v;
    zmq_getsockopt(n->router, ZMQ_LINGER, &v, &sz);
    CHECK(v == 0, "linger %d", v);
    sz = sizeof mm;
    zmq_getsockopt(n->router, ZMQ_MAXMSGSIZE, &mm, &sz);
    CHECK(mm == (int64_t)router_max, "maxmsgsize %lld", (long long)mm);
    sz = sizeof v;
    zmq_getsockopt(n->dealer, ZMQ_SNDHWM, &v, &sz);
    CHECK(v == DL_WIRE_HWM, "sndhwm %d", v);
    sz = sizeof v;
    zmq_getsockopt(n->router, ZMQ_RCVHWM, &v, &sz);
    CHECK(v == dl_wire_router_rcvhwm(router_max), "router rcvhwm %d, expected %d", v, dl_wire_router_rcvhwm(router_max));
    /* a ROUTER's inbound pipe holds about 8 MiB of messages at its cap: 64 of 64 KiB + a header cap, 7 of
     * 1 MiB + a header cap, never fewer than 4 */
    CHECK(dl_wire_router_rcvhwm((64u << 10) + DL_WIRE_MAX_HEADER_BYTES) == 64 &&
              dl_wire_router_rcvhwm((1u << 20) + DL_WIRE_MAX_HEADER_BYTES) == 7 &&
              dl_wire_router_rcvhwm((size_t)64 << 20) == DL_WIRE_HWM_MIN && dl_wire_router_rcvhwm(4096) == DL_WIRE_HWM,
          "router rcvhwm by message cap: %d %d %d %d", dl_wire_router_rcvhwm((64u << 10) + DL_WIRE_MAX_HEADER_BYTES),
          dl_wire_router_rcvhwm((1u << 20) + DL_WIRE_MAX_HEADER_BYTES), dl_wire_router_rcvhwm((size_t)64 << 20),
          dl_wire_router_rcvhwm(4096));
    sz = sizeof v;
    zmq_getsockopt(n->dealer, ZMQ_TCP_KEEPALIVE, &v, &sz);
    CHECK(v == 1, "keepalive %d", v);
}

static void net_close(net *n)
{
    zmq_close(n->dealer);
    zmq_close(n->router);
    zmq_ctx_term(n->ctx);
}

/* Check the common header fields of a received message against what was sent. */
static void check_env(const Dloco__V1__Envelope *got, const Dloco__V1__Envelope *sent)
{
    CHECK(got->protocol_version == DL_WIRE_PROTOCOL_VERSION, "protocol_version %u", got->protocol_version);
    CHECK(strcmp(got->run_id, sent->run_id) == 0, "run_id %s", got->run_id);
    CHECK(got->epoch == sent->epoch, "epoch %llu", (unsigned long long)got->epoch);
    CHECK(strcmp(got->learner_id, sent->learner_id) == 0, "learner_id %s", got->learner_id);
    CHECK(got->seq == sent->seq, "seq %llu", (unsigned long long)got->seq);
    CHECK(got->body_case == sent->body_case, "body %s", dl_wire_body_name(got->body_case));
}

/* Send `f` (with `payload` if it needs one) from one end, receive it on the
 * other, check header, routing id and every payload byte. Leaves the message
 * open in *m for body checks. */
static void round_trip(net *n, int to_router, fixture *f, const uint8_t *payload, const dl_wire_limits *lim,
                       dl_wire_msg *m)
{
    size_t len = fx_len(f);
    const void *pp[1] = {payload};
    int np = len ? 1 : 0;
    int rc = to_router ? dl_wire_send(n->dealer, NULL, 0, &f->env, pp, &len, np, 0)
                       : dl_wire_send(n->router, "learner-7", 9, &f->env, pp, &len, np, 0);
    REQUIRE(rc == 0, "send %s: %s", dl_wire_body_name(f->env.body_case), dl_errmsg());
    rc = dl_wire_recv(to_router ? n->router : n->dealer, to_router, lim, m, 0);
    REQUIRE(rc == 0, "recv %s: %s", dl_wire_body_name(f->env.body_case), dl_errmsg());
    check_env(m->env, &f->env);
    if (to_router)
        CHECK(m->id_len == 9 && memcmp(m->id, "learner-7", 9) == 0, "router sees routing id '%s'", (char *)m->id);
    else
        CHECK(m->id_len == 0, "dealer has no routing id");
    CHECK(m->npayload == np, "%d payload frames", m->npayload);
    if (np == 1) {
        CHECK(dl_wire_msg_payload_len(m, 0) == len, "payload %zu bytes, want %zu", dl_wire_msg_payload_len(m, 0),
              len);
        CHECK(memcmp(dl_wire_msg_payload(m, 0), payload, len) == 0, "payload bytes identical");
    }
}

static void test_round_trips(void)
{
    net n;
    net_open(&n, "learner-7", 64u << 20, 64u << 20);
    dl_wire_limits lim = plan_limits();
    dl_rng r;
    dl_rng_seed(&r, 99);
    uint8_t *payload = malloc(1 << 16);
    fixture f;
    dl_wire_msg m = {0};
    dl_wire_msg_close(&m); /* close on a zeroed msg is a no-op */
    int before = checks;

    /* hello: learner -> synchronizer (also teaches the ROUTER the peer) */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    f.env.seq = 1;
    round_trip(&n, 1, &f, NULL, &lim, &m);
    {
        const Dloco__V1__Hello *h = m.env->hello;
        CHECK(h->fingerprint == 0xfeedface12345678ull, "fingerprint");
        CHECK(h->n_layer == 2 && h->n_head == 4 && h->n_embd == 64 && h->seq_len == 128 && h->vocab == 256,
              "model summary");
        CHECK(h->num_fragments == NF && h->n_held_versions == NF, "hello counts");
        for (int i = 0; i < NF; i++) CHECK(h->held_versions[i] == 100 + (uint64_t)i, "held_versions[%d]", i);
        CHECK(strcmp(h->device, "cpu") == 0 && h->step == 42, "device, step");
    }
    dl_wire_msg_close(&m);
    dl_wire_msg_close(&m); /* twice is safe */

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_WELCOME, 0);
    round_trip(&n, 0, &f, NULL, &lim, &m);
    {
        const Dloco__V1__Welcome *w = m.env->welcome;
        CHECK(w->num_fragments == NF && w->n_fragment_versions == NF, "welcome counts");
        for (int i = 0; i < NF; i++) CHECK(w->fragment_versions[i] == 100 + (uint64_t)i, "fragment_versions[%d]", i);
        CHECK(w->h == 24 && w->heartbeat_ms == 500 && w->liveness == 3, "H, heartbeat, liveness");
        CHECK(strcmp(w->policy, "ddiloco") == 0 && w->must_fetch, "policy, must_fetch");
    }
    dl_wire_msg_close(&m);

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    round_trip(&n, 1, &f, NULL, &lim, &m);
    CHECK(m.env->heartbeat->step == 43 && m.env->heartbeat->tokens == 22016 &&
              m.env->heartbeat->steps_per_s == 2.5,
          "heartbeat fields");
    dl_wire_msg_close(&m);

    for (int c = 0; c < 4; c++) {
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, CODECS[c]);
        f.env.seq = 20 + (uint64_t)c;
        size_t len = fx_len(&f);
        fill_random(&r, payload, len);
        f.push.checksum = dl_wire_checksum(payload, len);
        round_trip(&n, 1, &f, payload, &lim, &m);
        const Dloco__V1__Push *p = m.env->push;
        CHECK(p->fragment == 1 && p->base_version == 6 && p->steps == 24 && p->tokens == 3072, "push counters");
        CHECK(p->codec == CODECS[c] && p->numel == 1001 && p->block_size == f.push.block_size, "push tensor %s",
              dl_wire_codec_name(CODECS[c]));
        CHECK(p->checksum == f.push.checksum && p->loss == 3.25 && p->compute_s == 1.5, "push checksum, loss, compute_s");
        dl_wire_msg_close(&m);

        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_UPDATE, CODECS[c]);
        len = fx_len(&f);
        fill_random(&r, payload, len);
        f.update.checksum = dl_wire_checksum(payload, len);
        round_trip(&n, 0, &f, payload, &lim, &m);
        const Dloco__V1__Update *u = m.env->update;
        CHECK(u->fragment == 2 && u->version == 9 && u->codec == CODECS[c] && u->numel == 4096 &&
                  u->block_size == f.update.block_size && u->checksum == f.update.checksum,
              "update fields %s", dl_wire_codec_name(CODECS[c]));
        dl_wire_msg_close(&m);
    }

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ACK, 0);
    round_trip(&n, 0, &f, NULL, &lim, &m);
    {
        const Dloco__V1__Ack *a = m.env->ack;
        CHECK(a->fragment == 1 && a->base_version == 6 && a->merged_version == 9, "ack numbers");
        CHECK(a->decision == DLOCO__V1__DECISION__DECISION_DROPPED_STALE && a->rebase, "ack decision, rebase");
        CHECK(strcmp(a->reason, "staleness 5 > max 4") == 0, "ack reason");
    }
    dl_wire_msg_close(&m);

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_FETCH, 0);
    round_trip(&n, 1, &f, NULL, &lim, &m);
    CHECK(m.env->fetch->n_fragments == 2 && m.env->fetch->fragments[0] == 3 && m.env->fetch->fragments[1] == 2,
          "fetch list");
    dl_wire_msg_close(&m);
    f.fetch.n_fragments = 0; /* empty = all */
    round_trip(&n, 1, &f, NULL, &lim, &m);
    CHECK(m.env->fetch->n_fragments == 0, "empty fetch");
    dl_wire_msg_close(&m);

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_BYE, 0);
    round_trip(&n, 1, &f, NULL, &lim, &m);
    CHECK(strcmp(m.env->bye->reason, "shutdown") == 0 && m.env->bye->step == 99, "bye fields");
    dl_wire_msg_close(&m);

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ERROR, 0);
    round_trip(&n, 0, &f, NULL, &lim, &m);
    CHECK(m.env->error->kind == DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH && m.env->error->code == 0 &&
              m.env->error->fatal &&
              strcmp(m.env->error->message, "fingerprint mismatch") == 0,
          "error fields");
    dl_wire_msg_close(&m);

    /* A 16 MiB fragment: large frames live outside libzmq's batch buffer. */
    {
        size_t numel = 4u << 20, len = 4 * numel;
        uint8_t *big = malloc(len);
        fill_random(&r, big, len);
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
        f.push.numel = numel;
        f.push.checksum = dl_wire_checksum(big, len);
        round_trip(&n, 1, &f, big, NULL, &m);
        CHECK(m.env->push->numel == numel, "16 MiB push numel");
        dl_wire_msg_close(&m);
        free(big);
    }

    /* send-side refusals */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.push.loss = NAN;
    size_t len = fx_len(&f);
    const void *pp[1] = {payload};
    EXPECT_ERR(dl_wire_send(n.dealer, NULL, 0, &f.env, pp, &len, 1, 0), DL_EINVAL,
               "refusing to send invalid message: push: loss is nan");
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_ACK, 0);
    EXPECT_ERR(dl_wire_send(n.router, "ghost", 5, &f.env, NULL, NULL, 0, ZMQ_DONTWAIT), DL_ENOTFOUND,
               "peer not connected");
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, ZMQ_DONTWAIT), DL_EAGAIN, "would block");
    dl_wire_msg_close(&m);

    printf("round trips: every message type over ROUTER/DEALER on %s, %d checks\n", n.endpoint,
           checks - before);
    free(payload);
    net_close(&n);
}

/* Peers that do not use dl_wire_send: raw frames from the DEALER must be
 * rejected by the ROUTER with the exact reason, leaving the stream in sync. */
static void test_raw_peer(void)
{
    net n;
    net_open(&n, "learner-7", 64u << 20, 64u << 20);
    dl_wire_limits lim = plan_limits();
    dl_wire_msg m;
    fixture f;
    uint8_t payload[8192] = {0};
    int before = checks;

    /* garbage header; the routing id survives, so the ROUTER can answer */
    zmq_send(n.dealer, "\xff\xff\xff\xff", 4, 0);
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, 0), DL_EPROTO, "undecodable header (4 bytes)");
    CHECK(m.env == NULL && m.npayload == 0, "rejected message holds nothing");
    CHECK(m.id_len == 9 && strcmp((char *)m.id, "learner-7") == 0, "routing id kept for the reply");
    {
        char why[512];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        fixture e;
        fx_make(&e, DLOCO__V1__ENVELOPE__BODY_ERROR, 0);
        e.error.kind = dl_wire_error_kind_of(DL_EPROTO), e.error.message = why;
        CHECK(dl_wire_send(n.router, m.id, m.id_len, &e.env, NULL, NULL, 0, 0) == 0, "error reply: %s",
              dl_errmsg());
        dl_wire_msg_close(&m);
        CHECK(dl_wire_recv(n.dealer, 0, &lim, &m, 0) == 0, "dealer gets the error: %s", dl_errmsg());
        CHECK(m.env && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR &&
                  strstr(m.env->error->message, "undecodable header") &&
                  m.env->error->kind == DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL,
              "error reply carries the reason");
        dl_wire_msg_close(&m);
    }

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_INT8);
    size_t len = fx_len(&f), hn;
    f.push.checksum = dl_wire_checksum(payload, len);
    uint8_t *hdr = pack_env(&f.env, &hn);

    /* push without its payload frame */
    zmq_send(n.dealer, hdr, hn, 0);
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, 0), DL_EPROTO, "push: needs 1 payload frame, got 0");
    dl_wire_msg_close(&m);
    /* push with two payload frames */
    zmq_send(n.dealer, hdr, hn, ZMQ_SNDMORE);
    zmq_send(n.dealer, payload, len, ZMQ_SNDMORE);
    zmq_send(n.dealer, payload, len, 0);
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, 0), DL_EPROTO, "message has 3 frames, max 2");
    dl_wire_msg_close(&m);
    /* push with 6 payload frames: more than dl_wire_msg can hold; all drained */
    zmq_send(n.dealer, hdr, hn, ZMQ_SNDMORE);
    for (int i = 0; i < 6; i++) zmq_send(n.dealer, payload, 100, i < 5 ? ZMQ_SNDMORE : 0);
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, 0), DL_EPROTO, "message has 7 frames, max 2");
    dl_wire_msg_close(&m);
    /* payload one byte long */
    zmq_send(n.dealer, hdr, hn, ZMQ_SNDMORE);
    zmq_send(n.dealer, payload, len + 1, 0);
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, 0), DL_EPROTO,
               "push: payload is 1066 bytes, int8 x 1001 (block 64) needs 1065");
    dl_wire_msg_close(&m);
    /* right length, wrong bytes */
    payload[17] ^= 0x40;
    zmq_send(n.dealer, hdr, hn, ZMQ_SNDMORE);
    zmq_send(n.dealer, payload, len, 0);
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, 0), DL_EPROTO, "push: checksum 0x");
    dl_wire_msg_close(&m);
    dl_wire_limits nock = lim;
    nock.verify_checksum = false; /* same message, checksum left to the caller */
    zmq_send(n.dealer, hdr, hn, ZMQ_SNDMORE);
    zmq_send(n.dealer, payload, len, 0);
    CHECK(dl_wire_recv(n.router, 1, &nock, &m, 0) == 0, "verify_checksum=false accepts: %s", dl_errmsg());
    CHECK(m.env && !dl_wire_checksum_ok(dl_wire_msg_payload(&m, 0), dl_wire_msg_payload_len(&m, 0),
                                        m.env->push->checksum),
          "and checksum_ok sees the damage");
    dl_wire_msg_close(&m);
    payload[17] ^= 0x40;
    /* empty header frame */
    zmq_send(n.dealer, "", 0, 0);
    EXPECT_ERR(dl_wire_recv(n.router, 1, &lim, &m, 0), DL_EPROTO, "envelope: no body set");
    dl_wire_msg_close(&m);

    /* after all that, a good message is still the next one out */
    zmq_send(n.dealer, hdr, hn, ZMQ_SNDMORE);
    zmq_send(n.dealer, payload, len, 0);
    CHECK(dl_wire_recv(n.router, 1, &lim, &m, 0) == 0, "stream still in sync: %s", dl_errmsg());
    CHECK(m.env && m.env->seq == 11 && m.npayload == 1 && dl_wire_msg_payload_len(&m, 0) == len,
          "the good push arrives intact");
    dl_wire_msg_close(&m);
    free(hdr);
    printf("raw peer: malformed frames rejected over real sockets, %d checks\n", checks - before);
    net_close(&n);
}

/* ZMQ_MAXMSGSIZE: a frame above the router's limit is never delivered
 * (libzmq drops the connection); the learner reconnects and later, small
 * messages arrive. The wait is bounded by attempts, not asserted on. */
static void test_maxmsgsize(void)
{
    net n;
    net_open(&n, "learner-8", 64 << 10, 64u << 20);
    REQUIRE(zmq_socket_monitor(n.router, "inproc://mon", ZMQ_EVENT_DISCONNECTED) == 0, "monitor");
    void *mon = zmq_socket(n.ctx, ZMQ_PAIR);
    REQUIRE(zmq_connect(mon, "inproc://mon") == 0, "monitor connect");
    int before = checks;

    fixture f;
    size_t numel = 65536, len = 4 * numel; /* 256 KiB > 64 KiB */
    uint8_t *big = calloc(len, 1);
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.env.learner_id = "learner-8";
    f.env.seq = 0;
    f.push.numel = numel;
    f.push.checksum = dl_wire_checksum(big, len);
    const void *pp[1] = {big};
    CHECK(dl_wire_send(n.dealer, NULL, 0, &f.env, pp, &len, 1, 0) == 0, "oversize push leaves the dealer");

    fixture hb;
    fx_make(&hb, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0);
    hb.env.learner_id = "learner-8";
    dl_wire_msg m;
    int got = 0;
    for (int attempt = 1; attempt <= 200 && !got; attempt++) {
        hb.env.seq = (uint64_t)attempt;
        dl_wire_send(n.dealer, NULL, 0, &hb.env, NULL, NULL, 0, ZMQ_DONTWAIT);
        zmq_pollitem_t it = {n.router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) > 0) {
            int rc = dl_wire_recv(n.router, 1, NULL, &m, 0);
            CHECK(rc == 0, "recv after oversize: %s", dl_errmsg());
            if (rc == 0) {
                CHECK(m.env->body_case == DLOCO__V1__ENVELOPE__BODY_HEARTBEAT,
                      "first delivered message is a heartbeat, not the %s", dl_wire_body_name(m.env->body_case));
                CHECK(m.env->seq >= 1, "heartbeat seq %llu", (unsigned long long)m.env->seq);
            }
            dl_wire_msg_close(&m);
            got = 1;
        }
    }
    CHECK(got, "a small message gets through after the oversize one");

    uint8_t ev[6];
    int tmo = 5000;
    zmq_setsockopt(mon, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    int evn = zmq_recv(mon, ev, sizeof ev, 0);
    uint16_t event = 0;
    if (evn == 6) memcpy(&event, ev, 2);
    CHECK(evn == 6 && event == ZMQ_EVENT_DISCONNECTED, "router saw the oversize peer disconnected (event %u)", event);

    /* a push under the limit still goes through, and no push above it ever did */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, DLOCO__V1__CODEC__CODEC_FP32);
    f.env.learner_id = "learner-8";
    f.env.seq = 1000;
    f.push.numel = 1024;
    len = 4096;
    f.push.checksum = dl_wire_checksum(big, len);
    CHECK(dl_wire_send(n.dealer, NULL, 0, &f.env, pp, &len, 1, 0) == 0, "small push sent");
    int small_push = 0, big_push = 0;
    for (int i = 0; i < 400 && !small_push; i++) {
        if (dl_wire_recv(n.router, 1, NULL, &m, 0) != 0) break;
        if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_PUSH) {
            if (m.env->push->numel == 1024) small_push = 1;
            else big_push = 1;
        }
        dl_wire_msg_close(&m);
    }
    dl_wire_msg_close(&m);
    CHECK(small_push, "push under ZMQ_MAXMSGSIZE delivered");
    CHECK(!big_push, "push over ZMQ_MAXMSGSIZE never delivered");
    printf("maxmsgsize: 256 KiB frame dropped by a 64 KiB router, %d checks\n", checks - before);
    free(big);
    zmq_socket_monitor(n.router, NULL, 0);
    zmq_close(mon);
    net_close(&n);
}

// ---------------------------------------------------------------------------
// golden corpus: headers encoded by protoc-c from text (tests/data/proto_corpus)

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    uint8_t *buf = malloc(DL_WIRE_MAX_HEADER_BYTES);
    *len = fread(buf, 1, DL_WIRE_MAX_HEADER_BYTES, fp);
    fclose(fp);
    return buf;
}

typedef struct {
    const char *name;
    Dloco__V1__Envelope__BodyCase body;
    size_t payload; /* bytes of the payload frame, 0 = none */
    uint8_t *bytes;
    size_t len;
} golden;

static golden GOLDEN[] = {
    {"hello", DLOCO__V1__ENVELOPE__BODY_HELLO, 0, NULL, 0},
    {"welcome", DLOCO__V1__ENVELOPE__BODY_WELCOME, 0, NULL, 0},
    {"heartbeat", DLOCO__V1__ENVELOPE__BODY_HEARTBEAT, 0, NULL, 0},
    {"push", DLOCO__V1__ENVELOPE__BODY_PUSH, 1065, NULL, 0},
    {"ack", DLOCO__V1__ENVELOPE__BODY_ACK, 0, NULL, 0},
    {"ack_fleet", DLOCO__V1__ENVELOPE__BODY_ACK, 0, NULL, 0},
    {"update", DLOCO__V1__ENVELOPE__BODY_UPDATE, 8192, NULL, 0},
    {"fetch", DLOCO__V1__ENVELOPE__BODY_FETCH, 0, NULL, 0},
    {"bye", DLOCO__V1__ENVELOPE__BODY_BYE, 0, NULL, 0},
    {"error", DLOCO__V1__ENVELOPE__BODY_ERROR, 0, NULL, 0},
};
#define NGOLDEN ((int)(sizeof GOLDEN / sizeof GOLDEN[0]))

static void test_golden(void)
{
    const char *src = getenv("DLOCO_SRC");
    REQUIRE(src, "DLOCO_SRC is not set (run through ctest)");
    dl_wire_limits lim = plan_limits();
    int before = checks;
    for (int i = 0; i < NGOLDEN; i++) {
        golden *g = &GOLDEN[i];
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/data/proto_corpus/%s.bin", src, g->name);
        g->bytes = read_file(path, &g->len);
        REQUIRE(g->bytes && g->len > 0, "read %s", path);
        Dloco__V1__Envelope *e = NULL;
        int rc = dl_wire_unpack(g->bytes, g->len, &g->payload, g->payload ? 1 : 0, &lim, &e);
        CHECK(rc == 0, "golden %s decodes and validates: %s", g->name, dl_errmsg());
        if (rc) continue;
        CHECK(e->body_case == g->body, "golden %s body %s", g->name, dl_wire_body_name(e->body_case));
        CHECK(e->protocol_version == DL_WIRE_PROTOCOL_VERSION && strcmp(e->run_id, "run-golden") == 0 && e->epoch == 3,
              "golden %s envelope", g->name);
        switch (e->body_case) {
        case DLOCO__V1__ENVELOPE__BODY_HELLO:
            CHECK(e->hello->fingerprint == 12345678901234567890ull && e->hello->n_embd == 64 &&
                      e->hello->n_held_versions == 4 && e->hello->held_versions[3] == 8 && e->hello->step == 42,
                  "golden hello fields");
            break;
        case DLOCO__V1__ENVELOPE__BODY_WELCOME:
            CHECK(e->welcome->h == 24 && e->welcome->heartbeat_ms == 500 && e->welcome->must_fetch &&
                      e->welcome->fragment_versions[0] == 5 && strcmp(e->welcome->policy, "ddiloco") == 0,
                  "golden welcome fields");
            break;
        case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT:
            CHECK(e->heartbeat->tokens == 22016 && e->heartbeat->steps_per_s == 2.5, "golden heartbeat fields");
            break;
        case DLOCO__V1__ENVELOPE__BODY_PUSH:
            CHECK(e->push->codec == DLOCO__V1__CODEC__CODEC_INT8 && e->push->numel == 1001 &&
                      e->push->block_size == 64 && e->push->checksum == 18364758544493064720ull &&
                      e->push->loss == 3.25 && e->push->tokens == 12288,
                  "golden push fields");
            break;
        case DLOCO__V1__ENVELOPE__BODY_ACK:
            CHECK(e->ack->decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && e->ack->merged_version == 7,
                  "golden ack fields");
            /* ack.bin predates fleet_steps_per_s (reads 0 = unknown); ack_fleet.bin carries it */
            CHECK(e->ack->fleet_steps_per_s == (strcmp(g->name, "ack_fleet") == 0 ? 3.75 : 0.0),
                  "golden %s fleet_steps_per_s", g->name);
            break;
        case DLOCO__V1__ENVELOPE__BODY_UPDATE:
            CHECK(e->update->codec == DLOCO__V1__CODEC__CODEC_BF16 && e->update->version == 9 &&
                      e->update->checksum == 1311768467463790320ull,
                  "golden update fields");
            break;
        case DLOCO__V1__ENVELOPE__BODY_FETCH:
            CHECK(e->fetch->n_fragments == 2 && e->fetch->fragments[1] == 3, "golden fetch fields");
            break;
        case DLOCO__V1__ENVELOPE__BODY_BYE:
            CHECK(e->bye->step == 99 && strcmp(e->bye->reason, "shutdown") == 0, "golden bye fields");
            break;
        case DLOCO__V1__ENVELOPE__BODY_ERROR:
            /* a v1.0 Error (deprecated code only) still validates, and reads as its kind */
            CHECK(e->error->code == DL_EPROTO && e->error->fatal && e->learner_id[0] == 0 &&
                      dl_wire_error_kind(e->error) == DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL,
                  "golden error fields");
            break;
        default: break;
        }
        /* protobuf-c re-encodes exactly what protoc wrote */
        size_t n;
        uint8_t *re = pack_env(e, &n);
        CHECK(n == g->len && memcmp(re, g->bytes, n) == 0, "golden %s re-encodes byte-identically", g->name);
        free(re);
        dl_wire_env_free(&e);
    }
    printf("golden corpus: %d v3 headers from tests/data/proto_corpus, %d checks\n", NGOLDEN, checks - before);
}

// ---------------------------------------------------------------------------
// fuzz: mutated valid headers through unpack+validate

typedef struct {
    uint8_t *bytes;
    size_t len, payload; /* header and the payload length it promises */
} seed;

#define FUZZ_ITERS 20000
#define FUZZ_MAX 4096

static void mutate(dl_rng *r, uint8_t *buf, size_t *len, const seed *seeds, int nseeds)
{
    int nmut = 1 + (int)dl_rng_below(r, 3);
    for (int k = 0; k < nmut; k++) {
        size_t n = *len;
        switch (dl_rng_below(r, 7)) {
        case 0: /* bit flip */
            if (n) buf[dl_rng_below(r, n)] ^= (uint8_t)(1u << dl_rng_below(r, 8));
            break;
        case 1: /* random byte */
            if (n) buf[dl_rng_below(r, n)] = (uint8_t)dl_rng_u64(r);
            break;
        case 2: /* truncate */
            if (n) *len = dl_rng_below(r, n);
            break;
        case 3: { /* splice: our prefix + another header's suffix */
            const seed *o = &seeds[dl_rng_below(r, (uint64_t)nseeds)];
            size_t cut = n ? dl_rng_below(r, n + 1) : 0, from = dl_rng_below(r, o->len + 1);
            size_t take = o->len - from;
            if (cut + take > FUZZ_MAX) take = FUZZ_MAX - cut;
            memcpy(buf + cut, o->bytes + from, take);
            *len = cut + take;
            break;
        }
        case 4: { /* insert 1..8 random bytes */
            size_t at = dl_rng_below(r, n + 1), cnt = 1 + dl_rng_below(r, 8);
            if (n + cnt > FUZZ_MAX) break;
            memmove(buf + at + cnt, buf + at, n - at);
            for (size_t i = 0; i < cnt; i++) buf[at + i] = (uint8_t)dl_rng_u64(r);
            *len = n + cnt;
            break;
        }
        case 5: { /* delete a range */
            if (!n) break;
            size_t at = dl_rng_below(r, n), cnt = 1 + dl_rng_below(r, n - at);
            memmove(buf + at, buf + at + cnt, n - at - cnt);
            *len = n - cnt;
            break;
        }
        default: { /* an interesting varint at a random spot */
            static const uint8_t vals[][10] = {
                {0x00}, {0x01}, {0x7f}, {0x80, 0x01}, {0xff, 0xff, 0xff, 0xff, 0x0f},
                {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, {0x80, 0x20}, {0x81, 0x80, 0x04}};
            static const size_t vlen[] = {1, 1, 1, 2, 5, 10, 2, 3};
            int v = (int)dl_rng_below(r, 8);
            if (n < vlen[v]) break;
            memcpy(buf + dl_rng_below(r, n - vlen[v] + 1), vals[v], vlen[v]);
            break;
        }
        }
    }
}

static void test_fuzz(void)
{
    /* seeds: every fixture (all bodies, all codecs) plus the golden corpus */
    seed seeds[64];
    int ns = 0;
    Dloco__V1__Envelope__BodyCase bodies[] = {
        DLOCO__V1__ENVELOPE__BODY_HELLO, DLOCO__V1__ENVELOPE__BODY_WELCOME, DLOCO__V1__ENVELOPE__BODY_HEARTBEAT,
        DLOCO__V1__ENVELOPE__BODY_ACK,   DLOCO__V1__ENVELOPE__BODY_FETCH,   DLOCO__V1__ENVELOPE__BODY_BYE,
        DLOCO__V1__ENVELOPE__BODY_ERROR};
    fixture f;
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        fx_make(&f, bodies[i], 0);
        seeds[ns].bytes = pack_env(&f.env, &seeds[ns].len), seeds[ns].payload = 0, ns++;
    }
    for (int c = 0; c < 4; c++) {
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_PUSH, CODECS[c]);
        seeds[ns].bytes = pack_env(&f.env, &seeds[ns].len), seeds[ns].payload = fx_len(&f), ns++;
        fx_make(&f, DLOCO__V1__ENVELOPE__BODY_UPDATE, CODECS[c]);
        seeds[ns].bytes = pack_env(&f.env, &seeds[ns].len), seeds[ns].payload = fx_len(&f), ns++;
    }
    for (int i = 0; i < NGOLDEN; i++)
        if (GOLDEN[i].bytes) seeds[ns].bytes = GOLDEN[i].bytes, seeds[ns].len = GOLDEN[i].len,
                             seeds[ns].payload = GOLDEN[i].payload, ns++;

    dl_wire_limits plan = plan_limits(), dflt = dl_wire_limits_default();
    dl_wire_limits plan3 = plan;
    plan3.max_frames = 3;
    dl_rng r;
    dl_rng_seed(&r, 20240601);
    uint8_t *buf = malloc(FUZZ_MAX);
    int accepted = 0, rejected = 0, acc_tensor = 0, bad_accept = 0, bad_code = 0;
    for (int it = 0; it < FUZZ_ITERS; it++) {
        const seed *s = &seeds[dl_rng_below(&r, (uint64_t)ns)];
        memcpy(buf, s->bytes, s->len);
        size_t len = s->len;
        mutate(&r, buf, &len, seeds, ns);

        /* payload frames: usually what the seed promised, sometimes not */
        size_t lens[2] = {s->payload, s->payload};
        int np = s->payload ? 1 : 0;
        uint64_t pick = dl_rng_below(&r, 20);
        if (pick < 2) lens[0] = s->payload + 1;
        else if (pick < 4) lens[0] = s->payload ? s->payload - 1 : 0, np = 1;
        else if (pick < 5) np = 0;
        else if (pick < 6) np = 2;
        else if (pick < 7) lens[0] = dl_rng_below(&r, 20000), np = 1;
        const dl_wire_limits *lim = (it & 1) ? &plan : (np == 2 ? &plan3 : &dflt);

        Dloco__V1__Envelope *e = NULL;
        int rc = dl_wire_unpack(buf, len, lens, np, lim, &e);
        if (rc != 0) {
            rejected++;
            if (rc != DL_EPROTO || e) bad_code++;
            continue;
        }
        accepted++;
        /* invariants of anything accepted, recomputed here independently */
        const char *why = NULL;
        uint32_t nf = lim->num_fragments ? lim->num_fragments : DL_WIRE_MAX_FRAGMENTS;
        if (e->protocol_version != DL_WIRE_PROTOCOL_VERSION) why = "protocol version";
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_PUSH || e->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE) {
            int push = e->body_case == DLOCO__V1__ENVELOPE__BODY_PUSH;
            uint32_t frag = push ? e->push->fragment : e->update->fragment;
            uint64_t numel = push ? e->push->numel : e->update->numel;
            int codec = push ? (int)e->push->codec : (int)e->update->codec;
            uint32_t block = push ? e->push->block_size : e->update->block_size;
            uint32_t topk = push ? e->push->topk : e->update->topk;
            uint64_t cn = push ? e->push->chunk_numel : e->update->chunk_numel;
            size_t want = ref_bytes(codec, cn ? cn : numel, block, topk);
            acc_tensor++;
            if (np != 1) why = "tensor with payload frame count != 1";
            else if (want == 0 || lens[0] != want) why = "payload length disagrees with header";
            if (frag >= nf) why = "fragment out of range";
            if (lim->fragment_numel && numel != lim->fragment_numel[frag]) why = "numel differs from plan";
            if (push && (e->push->steps < 1 || e->push->tokens < e->push->steps || !isfinite(e->push->loss)))
                why = "push counters or loss";
        } else if (np != 0) {
            why = "payload frame on a body that takes none";
        }
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_FETCH)
            for (size_t i = 0; i < e->fetch->n_fragments; i++)
                if (e->fetch->fragments[i] >= nf) why = "fetch index out of range";
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_HEARTBEAT && !isfinite(e->heartbeat->steps_per_s))
            why = "heartbeat rate not finite";
        if (why) {
            bad_accept++;
            if (bad_accept <= 5) fprintf(stderr, "fuzz iteration %d accepted a bad %s: %s\n", it,
                                         dl_wire_body_name(e->body_case), why);
        }
        dl_wire_env_free(&e);
    }
    CHECK(bad_accept == 0, "%d accepted headers broke an invariant", bad_accept);
    CHECK(bad_code == 0, "%d rejections were not DL_EPROTO without an envelope", bad_code);
    CHECK(accepted > FUZZ_ITERS / 50 && rejected > FUZZ_ITERS / 2,
          "fuzz exercised both paths (accepted %d, rejected %d)", accepted, rejected);
    CHECK(acc_tensor > 0, "some mutated push/update headers were accepted (and checked)");
    printf("fuzz: %d mutated headers, %d accepted (%d push/update), %d rejected, %d invariant breaks (must be 0)\n",
           FUZZ_ITERS, accepted, acc_tensor, rejected, bad_accept);
    free(buf);
    for (int i = 0; i < ns; i++) {
        int golden_owned = 0;
        for (int g = 0; g < NGOLDEN; g++) golden_owned |= seeds[i].bytes == GOLDEN[g].bytes;
        if (!golden_owned) free(seeds[i].bytes);
    }
}

// ---------------------------------------------------------------------------
// manifests in a Hello (docs/PROTOCOL.md "Manifests")

/* A Hello carrying manifest m (and, gpt set, the GPT-2 fields too) packed
 * and unpacked: the manifest that comes out equals m. */
static void manifest_round_trip(const dl_manifest *m, int gpt_fields, const char *what)
{
    fixture f;
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    f.hello.n_layer = f.hello.n_head = f.hello.n_embd = f.hello.seq_len = f.hello.vocab = 0;
    f.hello.max_tokens_per_step = 4096;
    dl_wire_manifest_buf buf;
    REQUIRE(dl_wire_hello_set_manifest(&f.hello, m, &buf) == 0, "%s", dl_errmsg());
    CHECK(gpt_fields == (f.hello.n_layer != 0), "%s: GPT-2 fields set for a GPT-2 manifest only", what);
    size_t n;
    uint8_t *bytes = pack_env(&f.env, &n);
    dl_wire_limits lim = plan_limits();
    Dloco__V1__Envelope *e = NULL;
    CHECK(dl_wire_unpack(bytes, n, NULL, 0, &lim, &e) == 0, "%s: %s", what, dl_errmsg());
    if (e) {
        dl_manifest *got = NULL;
        char msg[256];
        CHECK(dl_wire_hello_manifest(e->hello, &got) == 0 && got, "%s: %s", what, dl_errmsg());
        if (got) CHECK(dl_manifest_diff(m, got, "the Hello's", msg, sizeof msg) == 0, "%s: %s", what, msg);
        CHECK(e->hello->max_tokens_per_step == 4096, "max_tokens_per_step");
        dl_manifest_close(&got);
    }
    printf("  %s: a Hello of %zu bytes\n", what, n);
    CHECK(n <= DL_WIRE_MAX_HEADER_BYTES, "%s: %zu bytes", what, n);
    dl_wire_env_free(&e);
    dl_wire_manifest_buf_free(&buf);
    dl_wire_manifest_buf_free(&buf); /* twice is safe */
    free(bytes);
}

static void test_manifest_hello(void)
{
    printf("manifest hellos:\n");
    dl_wire_limits lim = plan_limits();
    /* a GPT-2 learner's Hello (the golden one) is the same bytes it was:
     * the new fields, unset, pack to nothing */
    const char *src = getenv("DLOCO_SRC");
    REQUIRE(src, "DLOCO_SRC is not set (run through ctest)");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/proto_corpus/hello.bin", src);
    size_t glen = 0;
    uint8_t *gold = read_file(path, &glen);
    REQUIRE(gold && glen, "read %s", path);
    Dloco__V1__Envelope *ge = NULL;
    REQUIRE(dl_wire_unpack(gold, glen, NULL, 0, &lim, &ge) == 0, "golden hello: %s", dl_errmsg());
    CHECK(ge->hello->n_manifest == 0 && ge->hello->max_tokens_per_step == 0, "golden hello has no manifest");
    size_t rlen;
    uint8_t *re = pack_env(ge, &rlen);
    CHECK(rlen == glen && memcmp(re, gold, glen) == 0, "golden hello repacks to %zu bytes, was %zu", rlen, glen);
    free(re);
    free(gold);
    dl_wire_env_free(&ge);
    /* a GPT-2 learner's Hello carries no manifest: nothing comes out */
    fixture f;
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    dl_manifest *m = (dl_manifest *)&m;
    CHECK(dl_wire_hello_manifest(&f.hello, &m) == 0 && m == NULL, "a GPT-2 Hello has no manifest");

    /* a Llama-like model, and GPT-2 124M's 148 tensors with its config */
    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
    const int64_t emb[2] = {32000, 4096}, sq[2] = {4096, 4096}, vec[1] = {4096}, conv[4] = {64, 3, 7, 7};
    REQUIRE(dl_manifest_add(m, "model.embed_tokens.weight", 2, emb, DL_TENSOR_EMBED) == 0, "%s", dl_errmsg());
    for (int l = 0; l < 32; l++) {
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_proj.weight", l);
        REQUIRE(dl_manifest_add(m, nm, 2, sq, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        REQUIRE(dl_manifest_add(m, nm, 1, vec, DL_TENSOR_VECTOR) == 0, "%s", dl_errmsg());
    }
    REQUIRE(dl_manifest_add(m, "vision.stem.conv", 4, conv, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    manifest_round_trip(m, 0, "Llama-like, 66 tensors");
    dl_manifest *g;
    dl_model_config c124 = {.n_layer = 12, .n_head = 12, .n_embd = 768, .seq_len = 1024, .vocab = 50257};
    REQUIRE(dl_manifest_from_gpt(&c124, &g) == 0, "%s", dl_errmsg());
    manifest_round_trip(g, 1, "GPT-2 124M, 148 tensors");

    /* zero GPT fields are not malformed beside a manifest; partly set are */
    dl_wire_manifest_buf buf;
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    f.hello.n_layer = f.hello.n_head = f.hello.n_embd = f.hello.seq_len = f.hello.vocab = 0;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: model config has a zero");
    REQUIRE(dl_wire_hello_set_manifest(&f.hello, m, &buf) == 0, "%s", dl_errmsg());
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "manifest Hello with zero GPT fields: %s", dl_errmsg());
    f.hello.n_embd = 64;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: model config partly set");
    /* all set but not that config's tensors: valid on the wire, refused by the conversion */
    f.hello.n_layer = 2, f.hello.n_head = 4, f.hello.seq_len = 128, f.hello.vocab = 256;
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "%s", dl_errmsg());
    dl_manifest *got = (dl_manifest *)&got;
    EXPECT_ERR(dl_wire_hello_manifest(&f.hello, &got), DL_EMISMATCH, "not the GPT-2 table");
    CHECK(got == NULL, "refused manifest not handed out");
    f.hello.n_layer = f.hello.n_head = f.hello.n_embd = f.hello.seq_len = f.hello.vocab = 0;

    /* each malformed entry, on tensor 3 */
    Dloco__V1__TensorSpec *t = f.hello.manifest[3], save = *t;
    uint64_t dims5[5] = {1, 2, 3, 4, 5}, dim0[2] = {4, 0}, huge[1] = {(1ull << 40) + 1};
    char longname[200];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    t->name = "";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: manifest[3] has no name");
    t->name = longname;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: manifest[3].name is 199 bytes, max 127");
    t->name = "a\tb";
    EXPECT_BAD(&f.env, NULL, 0, &lim, "hello: manifest[3].name has control byte 0x09");
    *t = save;
    t->n_shape = 0;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "has 0 dimensions, want 1 to 4");
    t->n_shape = 5, t->shape = dims5;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "has 5 dimensions, want 1 to 4");
    t->n_shape = 2, t->shape = dim0;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "manifest[3] 'model.layers.1.self_attn.q_proj.weight' has dimension 1 = 0");
    t->n_shape = 1, t->shape = huge;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "dimension 0 = 1099511627777, want 1 to 2^40");
    *t = save;
    t->role = DLOCO__V1__TENSOR_ROLE__TENSOR_ROLE_UNSPECIFIED;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "has role 0, want matrix, vector or embedding");
    t->role = (Dloco__V1__TensorRole)9;
    EXPECT_BAD(&f.env, NULL, 0, &lim, "has role 9");
    *t = save;
    /* well formed, but two tensors share a name: the conversion refuses it */
    t->name = f.hello.manifest[1]->name;
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "%s", dl_errmsg());
    EXPECT_ERR(dl_wire_hello_manifest(&f.hello, &got), DL_EINVAL, "tensors 1 and 3 are both named");
    *t = save;
    CHECK(dl_wire_validate(&f.env, NULL, 0, &lim) == 0, "restored: %s", dl_errmsg());
    dl_wire_manifest_buf_free(&buf);
    dl_manifest_close(&g);
    dl_manifest_close(&m);
}

/* A shared payload (dl_wire_blob): its bytes are a copy made once with
 * their checksum; sent to a peer three times with no copy, it lives while a
 * queued message holds it (the sender's own reference dropped first), and
 * the last message freed leaves only the references the test holds. */
static void test_blob(void)
{
    net n;
    net_open(&n, "learner-7", 64u << 20, 64u << 20);
    dl_wire_limits lim = plan_limits();
    int before = checks;
    fixture f;
    dl_wire_msg m = {0};
    /* the ROUTER learns the peer from its first message */
    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_HELLO, 0);
    round_trip(&n, 1, &f, NULL, &lim, &m);
    dl_wire_msg_close(&m);

    fx_make(&f, DLOCO__V1__ENVELOPE__BODY_UPDATE, DLOCO__V1__CODEC__CODEC_FP32);
    size_t len = fx_len(&f);
    uint8_t *src = malloc(len);
    for (size_t i = 0; i < len; i++) src[i] = (uint8_t)(i * 7 + 3);
    dl_wire_blob *b = dl_wire_blob_try_new(src, len);
    REQUIRE(b, "blob: %s", dl_errmsg());
    uint64_t want = dl_wire_checksum(src, len);
    CHECK(dl_wire_blob_checksum(b) == want && dl_wire_blob_len(b) == len, "blob checksum and length");
    memset(src, 0, len); /* the blob holds a copy */
    CHECK(dl_wire_blob_refs(b) == 1, "a new blob has one reference");

    dl_wire_queue *q = dl_wire_queue_new();
    dl_wire_queue *qs[2] = {q, NULL};
    f.update.checksum = dl_wire_blob_checksum(b);
    /* to a peer that is not connected: nothing is kept */
    int rc = dl_wire_send_blob_q(n.router, "nobody", 6, &f.env, b, ZMQ_DONTWAIT, qs);
    CHECK(rc == DL_ENOTFOUND && dl_wire_blob_refs(b) == 1, "unroutable send: rc %d, refs %lld", rc,
          (long long)dl_wire_blob_refs(b));
    for (int k = 0; k < 3; k++) {
        rc = dl_wire_send_blob_q(n.router, "learner-7", 9, &f.env, b, 0, qs);
        REQUIRE(rc == 0, "blob send %d: %s", k, dl_errmsg());
    }
    dl_wire_blob *mine = dl_wire_blob_ref(b);
    dl_wire_blob_release(&b);
    CHECK(b == NULL, "release NULLs the pointer");
    for (int k = 0; k < 3; k++) {
        REQUIRE(dl_wire_recv(n.dealer, 0, &lim, &m, 0) == 0, "recv blob %d: %s", k, dl_errmsg());
        CHECK(m.npayload == 1 && dl_wire_msg_payload_len(&m, 0) == len, "blob %d: one payload of %zu bytes", k, len);
        CHECK(m.env->update->checksum == want && dl_wire_checksum(dl_wire_msg_payload(&m, 0), len) == want,
              "blob %d: the bytes sent are the blob's", k);
        dl_wire_msg_close(&m);
    }
    /* received means libzmq has freed (or is freeing) each message: wait on the queue's count */
    int64_t deadline = dl_clock_ns() + 10000000000LL;
    while (dl_wire_queue_bytes(q) && dl_clock_ns() < deadline) sched_yield();
    CHECK(dl_wire_queue_bytes(q) == 0 && dl_wire_queue_drained_bytes(q) == 3 * len, "queue drained %llu of %zu",
          (unsigned long long)dl_wire_queue_drained_bytes(q), 3 * len);
    CHECK(dl_wire_blob_refs(mine) == 1, "every message freed its reference: %lld left",
          (long long)dl_wire_blob_refs(mine));
    dl_wire_blob_release(&mine);
    dl_wire_blob_release(&mine); /* safe on NULL */
    dl_wire_queue_release(&q);
    free(src);
    net_close(&n);
    printf("blob: %d checks\n", checks - before);
}

int main(void)
{
    test_sizes();
    test_bad_inputs();
    test_manifest_hello();
    test_round_trips();
    test_raw_peer();
    test_maxmsgsize();
    test_blob();
    test_golden();
    test_fuzz();
    for (int g = 0; g < NGOLDEN; g++) free(GOLDEN[g].bytes);
    return CHECK_DONE("test_proto");
}
