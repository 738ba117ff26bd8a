/* Tests for learner/ef.c: the error-feedback rules of encoded pushes (committed
 * and pending residuals per fragment, moved by decisions), checked against kernels/codec.h directly. */
#include "learner/ef.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "learner/mailbox.h"

#include "tests/check.h"

#define N 200 /* elements of fragment 0: 12 blocks of 16 and a short one */

static void fill(float *x, int k)
{
    for (int i = 0; i < N; i++) x[i] = sinf((float)(i * 7 + k * 13)) * (float)(1 + i % 5) * 0.01f;
}

/* The payload and residual a push of x encoded with residual r0 (NULL: zero) must have. */
static void reference(const dl_codec_enc *e, const float *x, const float *r0, uint8_t *out, float *r)
{
    if (r0) memcpy(r, r0, N * sizeof(float));
    else memset(r, 0, N * sizeof(float));
    REQUIRE(dl_codec_encode(e, x, r, N, 0, out) == 0, "reference encode: %s", dl_errmsg());
}

static int same(const float *a, const float *b) { return a && b && memcmp(a, b, N * sizeof(float)) == 0; }

static void test_rules(dl_codec c)
{
    const char *name = dl_codec_name(c.id);
    uint64_t numel[2] = {N, 40};
    dl_ef *ef = NULL;
    REQUIRE(dl_ef_open(2, numel, 1, &ef) == 0 && ef && dl_ef_on(ef), "open");
    dl_codec_enc e = {.c = c, .rounding = DL_ROUND_NEAREST};
    size_t bytes = (size_t)dl_codec_bytes(&c, N);
    uint8_t *got = malloc(bytes), *want = malloc(bytes);
    float x[N], r1[N], r2[N], r[N], dec[N];

    /* first push: committed is zero; pending = y - decode(payload) with y = x */
    fill(x, 1);
    CHECK(dl_ef_committed(ef, 0) == NULL, "%s: nothing committed before the first push", name);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 5, got) == 0, "encode: %s", dl_errmsg());
    reference(&e, x, NULL, want, r1);
    CHECK(memcmp(got, want, bytes) == 0, "%s: first push = encode(x) with a zero residual", name);
    uint64_t base = 0;
    CHECK(same(dl_ef_pending(ef, 0, &base), r1) && base == 5, "%s: pending = the encode's residual", name);
    REQUIRE(dl_codec_decode(&c, got, bytes, N, dec) == 0, "decode");
    int exact = 1;
    for (int i = 0; i < N; i++) exact &= dec[i] + r1[i] == x[i] || fabsf(dec[i] + r1[i] - x[i]) <= 1e-6f * fabsf(x[i]);
    CHECK(exact, "%s: decode(payload) + residual = x", name);
    CHECK(dl_ef_committed(ef, 1) == NULL && dl_ef_pending(ef, 1, NULL) == NULL, "%s: fragment 1 untouched", name);

    /* MERGED_PENDING changes nothing; ACCEPTED commits the pending residual */
    dl_ef_decided(ef, 0, DL_DECIDE_PENDING, 0, 5);
    CHECK(dl_ef_committed(ef, 0) == NULL && same(dl_ef_pending(ef, 0, NULL), r1), "%s: pending ack: no change", name);
    dl_ef_decided(ef, 0, DL_DECIDE_ACCEPTED, 0, 5);
    CHECK(same(dl_ef_committed(ef, 0), r1) && dl_ef_pending(ef, 0, NULL) == NULL,
          "%s: after ACCEPTED committed = the pending residual", name);

    /* the next push starts from the committed residual */
    fill(x, 2);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 6, got) == 0, "encode 2");
    reference(&e, x, r1, want, r2);
    CHECK(memcmp(got, want, bytes) == 0, "%s: second push = encode(x + committed)", name);
    /* REJECTED (busy or not): committed unchanged */
    dl_ef_decided(ef, 0, DL_DECIDE_REJECTED, 0, 6);
    CHECK(same(dl_ef_committed(ef, 0), r1) && dl_ef_pending(ef, 0, NULL) == NULL,
          "%s: after REJECTED committed unchanged", name);

    /* a push replaced before its decision (hold released by timeout): the
     * second encode starts again from committed, and only its residual commits */
    fill(x, 3);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 6, got) == 0, "encode 3");
    fill(x, 4);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 6, got) == 0, "encode 4");
    reference(&e, x, r1, want, r);
    CHECK(memcmp(got, want, bytes) == 0 && same(dl_ef_pending(ef, 0, NULL), r),
          "%s: a replacing push is encoded from committed, not from the replaced push's residual", name);
    /* an ACCEPTED of another base (not the pending push's) commits nothing */
    dl_ef_decided(ef, 0, DL_DECIDE_ACCEPTED, 0, 4);
    CHECK(same(dl_ef_committed(ef, 0), r1), "%s: ACCEPTED for another base: committed unchanged", name);

    /* a lost decision (forget) keeps committed; DROPPED_STALE zeroes it */
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 7, got) == 0, "encode 5");
    dl_ef_forget(ef, 0);
    CHECK(same(dl_ef_committed(ef, 0), r1) && dl_ef_pending(ef, 0, NULL) == NULL, "%s: forget keeps committed", name);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 7, got) == 0, "encode 6");
    dl_ef_decided(ef, 0, DL_DECIDE_DROPPED, 1, 7);
    CHECK(dl_ef_committed(ef, 0) == NULL && dl_ef_pending(ef, 0, NULL) == NULL,
          "%s: after DROPPED_STALE committed = 0", name);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 8, got) == 0, "encode 7");
    reference(&e, x, NULL, want, r);
    CHECK(memcmp(got, want, bytes) == 0, "%s: after a drop the push is encoded with a zero residual", name);

    /* REJECTED with rebase (an unusable base) and a forced adopt zero it too */
    dl_ef_decided(ef, 0, DL_DECIDE_ACCEPTED, 0, 8);
    CHECK(same(dl_ef_committed(ef, 0), r), "%s: committed again", name);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 9, got) == 0, "encode 8");
    dl_ef_decided(ef, 0, DL_DECIDE_REJECTED, 1, 9);
    CHECK(dl_ef_committed(ef, 0) == NULL, "%s: REJECTED with rebase: committed = 0", name);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 9, got) == 0, "encode 9");
    dl_ef_decided(ef, 0, DL_DECIDE_ACCEPTED, 0, 9);
    CHECK(dl_ef_committed(ef, 0) != NULL, "%s: committed", name);
    dl_ef_reset(ef, 0);
    CHECK(dl_ef_committed(ef, 0) == NULL && dl_ef_pending(ef, 0, NULL) == NULL, "%s: a forced adopt: committed = 0",
          name);
    printf("ok: %s: ACCEPTED commits the pending residual, REJECTED keeps it, DROPPED / rebase / fetch zero it\n",
           name);
    dl_ef_close(&ef);
    dl_ef_close(&ef);
    CHECK(ef == NULL, "close NULLs and is safe twice");
    free(got);
    free(want);
}

/* error_feedback off: no residual, every push is encode(x) alone */
static void test_off(void)
{
    uint64_t numel[1] = {N};
    dl_ef *ef = NULL;
    REQUIRE(dl_ef_open(1, numel, 0, &ef) == 0 && !dl_ef_on(ef), "open off");
    dl_codec c = {.id = DL_CODEC_INT4, .block = 16};
    dl_codec_enc e = {.c = c};
    size_t bytes = (size_t)dl_codec_bytes(&c, N);
    uint8_t *got = malloc(bytes), *want = malloc(bytes);
    float x[N];
    fill(x, 9);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 1, got) == 0, "encode");
    dl_ef_decided(ef, 0, DL_DECIDE_ACCEPTED, 0, 1);
    REQUIRE(dl_ef_encode(ef, &e, 0, x, 2, got) == 0, "encode");
    REQUIRE(dl_codec_encode(&e, x, NULL, N, 0, want) == 0, "reference");
    CHECK(memcmp(got, want, bytes) == 0 && dl_ef_committed(ef, 0) == NULL, "off: encode(x) alone, nothing kept");
    x[3] = NAN;
    CHECK(dl_ef_encode(ef, &e, 0, x, 3, got) == DL_EINVAL, "a non-finite delta is refused");
    dl_ef_close(&ef);
    free(got);
    free(want);
    printf("ok: error_feedback off keeps no residual\n");
}

int main(void)
{
    test_rules((dl_codec){.id = DL_CODEC_INT4, .block = 16});
    test_rules((dl_codec){.id = DL_CODEC_TOPK, .block = 16, .topk = 3});
    test_rules((dl_codec){.id = DL_CODEC_BF16});
    test_off();
    dl_ef *ef = NULL;
    CHECK(dl_ef_open(0, NULL, 1, &ef) == DL_EINVAL && !ef, "no fragments refused");
    printf("test_ef: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
