/* libFuzzer target: the receive path of a whole [header][payload] message, as
 * the synchronizer runs it: unpack, checksum, payload size, fp32 decode. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "proto/wire.h"
#include "tests/fuzz/fuzz.h"

/* The synchronizer's fp32 read (synchronizer/uplink.c dl_uplink_push): payload frames
 * have no alignment guarantee, so each float is loaded with memcpy. Returns
 * the count of non-finite values (the synchronizer refuses the push then). */
static size_t scan_fp32(const uint8_t *p, uint64_t numel)
{
    size_t bad = 0;
    for (uint64_t i = 0; i < numel; i++) {
        float f;
        memcpy(&f, p + 4 * i, sizeof f);
        bad += !isfinite(f);
    }
    return bad;
}

static void on_tensor(const char *body, uint32_t frag, Dloco__V1__Codec codec, uint64_t numel, uint32_t block,
                      uint32_t topk, uint64_t coff, uint64_t cnum, uint64_t sum, const uint8_t *payload, size_t plen, uint8_t flags)
{
    bool ok = dl_wire_checksum_ok(payload, plen, sum);
    FUZZ_CHECK(ok == (dl_wire_checksum(payload, plen) == sum), "checksum_ok disagrees with checksum");
    if (!ok && !(flags & FUZZ_MSG_TRUST_SUM)) {
        FUZZ_VERDICT("refused: %s checksum does not match the payload", body); /* as dl_wire_recv */
        return;
    }
    FUZZ_CHECK(frag < FUZZ_NUM_FRAGMENTS, "%s fragment %u", body, frag);
    FUZZ_CHECK(numel == FUZZ_FRAGMENT_NUMEL[frag], "%s numel %llu, plan %llu", body, (unsigned long long)numel,
               (unsigned long long)FUZZ_FRAGMENT_NUMEL[frag]);
    /* a chunk is a range inside the fragment: what its payload holds */
    FUZZ_CHECK(cnum ? coff < numel && cnum <= numel - coff : coff == 0, "%s chunk [%llu, +%llu) of %llu", body,
               (unsigned long long)coff, (unsigned long long)cnum, (unsigned long long)numel);
    if (cnum) numel = cnum;
    size_t need = dl_wire_payload_bytes(codec, numel, block, topk);
    FUZZ_CHECK(need != 0 && need == plen, "%s %s x %llu: payload %zu bytes, needs %zu", body,
               dl_wire_codec_name(codec), (unsigned long long)numel, plen, need);
    /* fp32 payloads are scanned here; the other codecs' payloads are decoded
     * by kernels/codec.c, whose decoder tests/test_codec.c checks against an
     * independent one on 18,000 corrupted payloads. */
    if (codec == DLOCO__V1__CODEC__CODEC_FP32) {
        FUZZ_CHECK(plen == 4 * numel, "fp32 payload %zu bytes for %llu elements", plen, (unsigned long long)numel);
        size_t bad = scan_fp32(payload, numel);
        FUZZ_CHECK(bad <= numel, "count");
        FUZZ_VERDICT("accepted %s fp32 x %llu, %zu non-finite%s", body, (unsigned long long)numel, bad,
                     bad ? " (the synchronizer refuses it)" : "");
    } else {
        FUZZ_VERDICT("accepted %s %s (sized by the protocol; decoded and checked by kernels/codec.c)", body,
                     dl_wire_codec_name(codec));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < FUZZ_MSG_PREFIX) {
        FUZZ_VERDICT("refused: shorter than the %d-byte prefix", FUZZ_MSG_PREFIX);
        return 0;
    }
    uint8_t flags = data[0];
    size_t hlen = fuzz_le16(data + 1);
    size_t rest = size - FUZZ_MSG_PREFIX;
    if (hlen > rest) hlen = rest;
    const uint8_t *hdr = data + FUZZ_MSG_PREFIX;
    int npayload = (flags & FUZZ_MSG_HEADER_ONLY) ? 0 : 1;
    size_t plen = npayload ? rest - hlen : 0;
    /* The payload in a buffer of its own, at an odd address: libzmq gives no
     * alignment, and ASan then sees a read past the frame's last byte. */
    uint8_t *frame = malloc(plen + 1);
    FUZZ_CHECK(frame, "malloc");
    uint8_t *payload = frame + 1;
    memcpy(payload, hdr + hlen, plen);

    dl_wire_limits lim = dl_wire_limits_default();
    lim.num_fragments = FUZZ_NUM_FRAGMENTS;
    lim.fragment_numel = FUZZ_FRAGMENT_NUMEL;
    lim.max_frames = 2;
    Dloco__V1__Envelope *env = NULL;
    dl_err_clear();
    int rc = dl_wire_unpack(hdr, hlen, &plen, npayload, &lim, &env);
    if (rc != 0) {
        FUZZ_CHECK(env == NULL && (rc == DL_EPROTO || rc == DL_ENOMEM), "rc %d", rc);
        FUZZ_CHECK(dl_errmsg()[0] != 0, "a refusal without a message");
        FUZZ_VERDICT("refused: %s", dl_errmsg());
    } else if (env->body_case == DLOCO__V1__ENVELOPE__BODY_PUSH) {
        const Dloco__V1__Push *m = env->push;
        FUZZ_CHECK(m->steps >= 1 && m->tokens >= m->steps, "push steps %llu tokens %llu",
                   (unsigned long long)m->steps, (unsigned long long)m->tokens);
        FUZZ_CHECK(isfinite(m->loss) && isfinite(m->compute_s) && m->compute_s >= 0, "push doubles");
        on_tensor("push", m->fragment, m->codec, m->numel, m->block_size, m->topk, m->chunk_offset, m->chunk_numel,
                  m->checksum, payload, plen, flags);
    } else if (env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE) {
        const Dloco__V1__Update *m = env->update;
        on_tensor("update", m->fragment, m->codec, m->numel, m->block_size, m->topk, m->chunk_offset, m->chunk_numel,
                  m->checksum, payload, plen, flags);
    } else {
        FUZZ_CHECK(npayload == 0, "%s accepted with a payload frame", dl_wire_body_name(env->body_case));
        FUZZ_VERDICT("accepted %s", dl_wire_body_name(env->body_case));
    }
    dl_wire_env_free(&env);
    free(frame);
    return 0;
}
