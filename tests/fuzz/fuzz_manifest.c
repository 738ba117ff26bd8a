/* libFuzzer target: the manifest decoders of a manifest run (core/manifest.c JSON, storage/tensorfile.c
 * safetensors) on any bytes. Accepted inputs must give a manifest that round-trips and a finite model. */
#define _GNU_SOURCE /* memfd_create */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/err.h"
#include "core/manifest.h"
#include "core/plan.h"
#include "storage/tensorfile.h"
#include "tests/fuzz/fuzz.h"

/* Input: [mode u8][document...]. Mode even: a manifest JSON document
 * (dl_manifest_from_json, as dloco-sync --manifest reads one). Mode odd: a
 * safetensors file read for the seeds' manifest (dl_tensorfile_read, as
 * dloco-sync --init_from reads one) and its manifest guessed
 * (dl_tensorfile_guess_manifest, dloco manifest). */

static void check_json(const uint8_t *d, size_t n)
{
    dl_manifest *m = (dl_manifest *)&m;
    dl_err_clear();
    int rc = dl_manifest_from_json((const char *)d, n, &m);
    if (rc) {
        FUZZ_CHECK(m == NULL, "refused JSON left *out set");
        FUZZ_CHECK(rc == DL_EFORMAT || rc == DL_EINVAL || rc == DL_EMISMATCH, "refused with %d", rc);
        FUZZ_CHECK(dl_errmsg()[0], "a refusal without a message");
        FUZZ_VERDICT("refused: %s", dl_errmsg());
        return;
    }
    FUZZ_CHECK(dl_manifest_check(m) == 0, "accepted a manifest its check refuses: %s", dl_errmsg());
    char *js;
    size_t len;
    FUZZ_CHECK(dl_manifest_to_json(m, &js, &len) == 0, "accepted manifest does not write: %s", dl_errmsg());
    dl_manifest *back;
    FUZZ_CHECK(dl_manifest_from_json(js, len, &back) == 0, "written manifest does not read: %s", dl_errmsg());
    FUZZ_CHECK(dl_manifest_diff(m, back, "x", NULL, 0) == 0, "round trip differs");
    dl_plan *p = NULL;
    FUZZ_CHECK(dl_manifest_plan_open(m, 1, &p) == 0, "accepted manifest has no plan: %s", dl_errmsg());
    FUZZ_CHECK(dl_plan_total_numel(p) == dl_manifest_numel(m), "plan covers %zu of %zu floats",
               dl_plan_total_numel(p), dl_manifest_numel(m));
    dl_plan_close(&p);
    FUZZ_VERDICT("accepted: %d tensors", dl_manifest_ntensors(m));
    dl_manifest_close(&back);
    free(js);
    dl_manifest_close(&m);
}

/* The seeds' manifest (tests/fuzz/seedgen.c manifest_seeds): "e" [4, 2]
 * embedding, "n" [2] vector, "c" [2, 1, 1, 2] matrix. */
static dl_manifest *seed_manifest(void)
{
    dl_manifest *m;
    int64_t e[2] = {4, 2}, v[1] = {2}, c[4] = {2, 1, 1, 2};
    FUZZ_CHECK(dl_manifest_open(&m) == 0 && dl_manifest_add(m, "e", 2, e, DL_TENSOR_EMBED) == 0 &&
                   dl_manifest_add(m, "n", 1, v, DL_TENSOR_VECTOR) == 0 &&
                   dl_manifest_add(m, "c", 4, c, DL_TENSOR_MATRIX) == 0,
               "seed manifest: %s", dl_errmsg());
    return m;
}

static void check_file(const uint8_t *d, size_t n)
{
    static int fd = -1;
    static char path[64];
    static dl_manifest *m;
    static float *params;
    if (fd < 0) {
        fd = memfd_create("fuzz_manifest", 0);
        FUZZ_CHECK(fd >= 0, "memfd_create");
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        m = seed_manifest();
        params = malloc(dl_manifest_numel(m) * sizeof *params);
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate");
    FUZZ_CHECK(n == 0 || pwrite(fd, d, n, 0) == (ssize_t)n, "pwrite");
    size_t numel = dl_manifest_numel(m);
    /* all bits set: a NaN, which no accepted file holds, so a float still holding it was not written (a finite
     * pattern can be a valid file's value: fuzz_modelfile found 0x7f7f7f7f in one) */
    memset(params, 0xff, numel * sizeof *params);
    dl_tensorfile_info info;
    dl_err_clear();
    int rc = dl_tensorfile_read(path, m, params, &info);
    char why[1024];
    snprintf(why, sizeof why, "%s", rc ? dl_errmsg() : "");
    dl_manifest *g = (dl_manifest *)&g;
    int guessed = 0;
    int grc = dl_tensorfile_guess_manifest(path, &g, &guessed);
    FUZZ_CHECK(grc == 0 ? g != NULL : g == NULL, "guess: rc %d with out %p", grc, (void *)g);
    if (!grc) FUZZ_CHECK(dl_manifest_check(g) == 0, "guessed manifest fails its check");
    if (grc) FUZZ_CHECK(strstr(dl_errmsg(), path) != NULL, "guess: message '%s' does not name the file", dl_errmsg());
    dl_manifest_close(&g);
    if (rc) {
        FUZZ_CHECK(rc == DL_EFORMAT || rc == DL_ETRUNC || rc == DL_ERANGE || rc == DL_EMISMATCH || rc == DL_EINVAL,
                   "refused with %d (%s): %s", rc, dl_strerror(rc), why);
        FUZZ_CHECK(strstr(why, path) != NULL, "message '%s' does not name the file", why);
        FUZZ_VERDICT("refused: %s", why);
        return;
    }
    for (size_t i = 0; i < numel; i++) {
        uint32_t bits;
        memcpy(&bits, &params[i], sizeof bits);
        FUZZ_CHECK(bits != 0xffffffffu, "param %zu was not written", i);
        FUZZ_CHECK(isfinite(params[i]), "accepted: param %zu is not finite", i);
    }
    FUZZ_VERDICT("accepted: %s%s", info.dtype, info.has_manifest ? ", with its manifest" : "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        FUZZ_VERDICT("refused: no mode byte");
        return 0;
    }
    if (data[0] & 1) check_file(data + 1, size - 1);
    else check_json(data + 1, size - 1);
    return 0;
}
