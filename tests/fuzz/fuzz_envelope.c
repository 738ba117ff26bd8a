/* libFuzzer target: dl_wire_unpack on arbitrary header bytes with payload frame
 * counts and lengths from the input, under the limits real receivers set. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/manifest.h"
#include "proto/wire.h"
#include "tests/fuzz/fuzz.h"

static dl_wire_limits limits_for(int which)
{
    dl_wire_limits lim = dl_wire_limits_default();
    switch (which) {
    case FUZZ_LIM_PLAN:
        lim.num_fragments = FUZZ_NUM_FRAGMENTS;
        lim.fragment_numel = FUZZ_FRAGMENT_NUMEL;
        lim.max_frames = 2;
        break;
    case FUZZ_LIM_DEFAULT: break;
    case FUZZ_LIM_SEND: lim.max_frames = 1 + DL_WIRE_MAX_PAYLOADS; break;
    default: lim.num_fragments = FUZZ_NUM_FRAGMENTS; break;
    }
    return lim;
}

/* What a validated envelope promises its reader, beyond "it decoded". */
static void check_valid(const Dloco__V1__Envelope *env, const size_t *lens, int npayload,
                        const dl_wire_limits *lim)
{
    uint32_t nf = lim->num_fragments ? lim->num_fragments : DL_WIRE_MAX_FRAGMENTS;
    const char *name = dl_wire_body_name(env->body_case);
    FUZZ_CHECK(strcmp(name, "none") != 0 && strcmp(name, "unknown") != 0, "body %d", (int)env->body_case);
    FUZZ_CHECK(env->protocol_version == DL_WIRE_PROTOCOL_VERSION, "version %u", env->protocol_version);
    FUZZ_CHECK(env->learner_id && env->run_id, "strings are never NULL after unpack");
    switch (env->body_case) {
    case DLOCO__V1__ENVELOPE__BODY_PUSH:
    case DLOCO__V1__ENVELOPE__BODY_UPDATE: {
        int push = env->body_case == DLOCO__V1__ENVELOPE__BODY_PUSH;
        uint32_t frag = push ? env->push->fragment : env->update->fragment;
        Dloco__V1__Codec codec = push ? env->push->codec : env->update->codec;
        uint64_t numel = push ? env->push->numel : env->update->numel;
        uint32_t block = push ? env->push->block_size : env->update->block_size;
        uint64_t coff = push ? env->push->chunk_offset : env->update->chunk_offset;
        uint64_t cnum = push ? env->push->chunk_numel : env->update->chunk_numel;
        FUZZ_CHECK(npayload == 1, "%s with %d payloads", name, npayload);
        FUZZ_CHECK(frag < nf, "%s fragment %u of %u", name, frag, nf);
        if (lim->fragment_numel) FUZZ_CHECK(numel == lim->fragment_numel[frag], "%s numel", name);
        FUZZ_CHECK(strcmp(dl_wire_codec_name(codec), "unknown") != 0, "%s codec %d", name, (int)codec);
        uint32_t topk = push ? env->push->topk : env->update->topk;
        /* a chunk: a range inside the fragment; of a block codec, starting on a
         * block and holding whole blocks except the fragment's last; a push's
         * with its transfer id */
        FUZZ_CHECK(cnum ? coff < numel && cnum <= numel - coff : coff == 0, "%s chunk [%llu, +%llu) of %llu", name,
                   (unsigned long long)coff, (unsigned long long)cnum, (unsigned long long)numel);
        if (cnum) {
            if (dl_codec_is_block((dl_codec_id)codec))
                FUZZ_CHECK(block && coff % block == 0 && (coff + cnum == numel || cnum % block == 0),
                           "%s chunk [%llu, +%llu) of %s not on blocks of %u", name, (unsigned long long)coff,
                           (unsigned long long)cnum, dl_wire_codec_name(codec), block);
            FUZZ_CHECK(!push || env->push->transfer != 0, "chunked push without a transfer id");
            numel = cnum;
        }
        /* a full Update is fp32; a delta is never of version 0 */
        if (!push) FUZZ_CHECK(env->update->delta ? env->update->version > 0 : codec == DLOCO__V1__CODEC__CODEC_FP32,
                              "update delta=%d version %llu codec %s", (int)env->update->delta,
                              (unsigned long long)env->update->version, dl_wire_codec_name(codec));
        size_t need = dl_wire_payload_bytes(codec, numel, block, topk);
        FUZZ_CHECK(need != 0 && need == lens[0], "%s payload %zu bytes, codec needs %zu", name, lens[0], need);
        break;
    }
    case DLOCO__V1__ENVELOPE__BODY_ACK: FUZZ_CHECK(env->ack->fragment < nf, "ack fragment"); break;
    case DLOCO__V1__ENVELOPE__BODY_FETCH:
        FUZZ_CHECK(env->fetch->n_fragments <= nf, "fetch count");
        for (size_t i = 0; i < env->fetch->n_fragments; i++)
            FUZZ_CHECK(env->fetch->fragments[i] < nf, "fetch fragment %u", env->fetch->fragments[i]);
        break;
    case DLOCO__V1__ENVELOPE__BODY_ERROR: {
        Dloco__V1__ErrorKind k = dl_wire_error_kind(env->error);
        FUZZ_CHECK(dl_wire_error_kind_valid(k), "error kind %d (field %d, code %d)", (int)k, (int)env->error->kind,
                   env->error->code);
        FUZZ_CHECK(strcmp(dl_wire_error_kind_name(k), "unspecified") != 0, "error kind name");
        break;
    }
    default: FUZZ_CHECK(npayload == 0, "%s with %d payloads", name, npayload); break;
    }
}

/* An unknown field numbered 0. libprotobuf-c 1.4 refuses tag 0 only when its
 * first byte is 0, so a non-minimal varint of it (80 00) decodes, is kept as an
 * unknown field, and packs again as 00, which it then refuses. dloco never
 * re-packs a received envelope, so that is protobuf-c's quirk, not ours. */
static int has_unknown_tag0(const ProtobufCMessage *m)
{
    if (!m) return 0;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0) return 1;
    /* and in every message nested in it, at any depth (a Hello's manifest TensorSpecs: found by the fuzzer) */
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        if (fd->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        const char *at = (const char *)m + fd->offset;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)m + fd->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)at;
            for (size_t k = 0; k < n; k++)
                if (has_unknown_tag0(v[k])) return 1;
        } else if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            /* a oneof member: only the one its case names is set */
            if (*(const uint32_t *)((const char *)m + fd->quantifier_offset) == fd->id &&
                has_unknown_tag0(*(ProtobufCMessage *const *)at))
                return 1;
        } else if (has_unknown_tag0(*(ProtobufCMessage *const *)at)) {
            return 1;
        }
    }
    return 0;
}

/* Pack what was accepted, decode it again: it must validate the same way and
 * re-pack to the same bytes (the first pack normalises field order, unpacked
 * repeated fields, duplicates, strings cut at an embedded NUL). */
static void check_roundtrip(const Dloco__V1__Envelope *env, const size_t *lens, int npayload,
                            const dl_wire_limits *lim)
{
    /* every body starts with its ProtobufCMessage, and they share one union */
    if (has_unknown_tag0(&env->base)) return;
    size_t n = dloco__v1__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    FUZZ_CHECK(buf, "malloc %zu", n);
    size_t packed = dloco__v1__envelope__pack(env, buf);
    FUZZ_CHECK(packed == n, "pack wrote %zu of %zu bytes", packed, n);
    /* (a negative int32 packs to 10 bytes: re-packed can outgrow the cap) */
    if (n > DL_WIRE_MAX_HEADER_BYTES) {
        free(buf);
        return;
    }
    Dloco__V1__Envelope *again = NULL;
    int rc = dl_wire_unpack(buf, n, lens, npayload, lim, &again);
    FUZZ_CHECK(rc == 0 && again, "re-packed %s (%zu bytes) no longer validates: %s",
               dl_wire_body_name(env->body_case), n, dl_errmsg());
    FUZZ_CHECK(again->body_case == env->body_case, "body changed in the round trip");
    size_t n2 = dloco__v1__envelope__get_packed_size(again);
    FUZZ_CHECK(n2 == n, "second pack is %zu bytes, first %zu", n2, n);
    uint8_t *buf2 = malloc(n2 ? n2 : 1);
    FUZZ_CHECK(buf2, "malloc %zu", n2);
    dloco__v1__envelope__pack(again, buf2);
    FUZZ_CHECK(memcmp(buf, buf2, n) == 0, "pack(unpack(pack(x))) differs from pack(x)");
    free(buf2);
    dl_wire_env_free(&again);
    FUZZ_CHECK(again == NULL, "env_free leaves NULL");
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < FUZZ_ENV_PREFIX) {
        FUZZ_VERDICT("refused: shorter than the %d-byte prefix", FUZZ_ENV_PREFIX);
        return 0;
    }
    uint8_t ctl = data[0];
    int npayload = (ctl & 3) % 3;
    size_t lens[2] = {fuzz_le32(data + 1), fuzz_le32(data + 5)};
    dl_wire_limits lim = limits_for((ctl >> 2) & 3);
    const uint8_t *hdr = data + FUZZ_ENV_PREFIX;
    size_t hlen = size - FUZZ_ENV_PREFIX;

    Dloco__V1__Envelope *env = (Dloco__V1__Envelope *)&lim; /* must be overwritten */
    dl_err_clear();
    int rc = dl_wire_unpack(hlen ? hdr : NULL, hlen, lens, npayload, &lim, &env);
    if (rc != 0) {
        FUZZ_CHECK(env == NULL, "failed unpack left *out set");
        FUZZ_CHECK(rc == DL_EPROTO || rc == DL_ENOMEM, "unpack returned %d (%s)", rc, dl_strerror(rc));
        FUZZ_CHECK(dl_errmsg()[0] != 0, "a refusal without a message");
        FUZZ_VERDICT("refused: %s", dl_errmsg());
        return 0;
    }
    FUZZ_CHECK(env != NULL, "unpack returned 0 without an envelope");
    check_valid(env, lens, npayload, &lim);
    check_roundtrip(env, lens, npayload, &lim);
    if (env->body_case == DLOCO__V1__ENVELOPE__BODY_HELLO) {
        /* a Hello's manifest, as the synchronizer reads it: a manifest or a
         * refusal with a message, never a crash */
        dl_manifest *m = (dl_manifest *)&lim;
        dl_err_clear();
        int mrc = dl_wire_hello_manifest(env->hello, &m);
        FUZZ_CHECK(mrc == 0 ? (m != NULL) == (env->hello->n_manifest != 0) : m == NULL && dl_errmsg()[0],
                   "hello manifest: rc %d", mrc);
        dl_manifest_close(&m);
    }
    FUZZ_VERDICT("accepted %s", dl_wire_body_name(env->body_case));
    dl_wire_env_free(&env);
    FUZZ_CHECK(env == NULL, "env_free leaves NULL");
    return 0;
}
