/* libFuzzer target: the model-file reader (storage/modelfile.c dl_modelfile_read,
 * dloco-sync/dloco-learner --init_from) on any bytes as a file: safetensors or
 * llm.c. An accepted file must give a finite model with zero padded rows. */
#define _GNU_SOURCE /* memfd_create */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/err.h"
#include "core/model.h"
#include "storage/modelfile.h"
#include "tests/fuzz/fuzz.h"

/* The seeds' model (tests/fuzz/seedgen.c model_seeds): small, with padding
 * (V=10: dloco pads to 64, llm.c to 128). */
static const dl_model_config FUZZ_MODEL = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 10};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    static dl_model_config cfg;
    static size_t numel;
    static float *params;
    if (fd < 0) {
        fd = memfd_create("fuzz_modelfile", 0);
        FUZZ_CHECK(fd >= 0, "memfd_create");
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        cfg = FUZZ_MODEL;
        FUZZ_CHECK(dl_model_config_check(&cfg) == 0, "model");
        dl_model_tensor_table(&cfg, NULL, 0, &numel);
        params = malloc(numel * sizeof(float));
        FUZZ_CHECK(params, "malloc");
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate");
    FUZZ_CHECK(size == 0 || pwrite(fd, data, size, 0) == (ssize_t)size, "pwrite");
    /* all bits set: a NaN, which no accepted file holds (accepted values are finite), so a float still
     * holding it was not written. (A finite pattern was once found in a valid file: 0x7f7f7f7f = 3.4e38.) */
    memset(params, 0xff, numel * sizeof(float));
    dl_modelfile_info info;
    dl_err_clear();
    int rc = dl_modelfile_read(path, &cfg, params, &info);
    if (rc != 0) {
        FUZZ_CHECK(rc == DL_EFORMAT || rc == DL_ETRUNC || rc == DL_ERANGE || rc == DL_EMISMATCH,
                   "refused with %d (%s): %s", rc, dl_strerror(rc), dl_errmsg());
        FUZZ_CHECK(strstr(dl_errmsg(), path) != NULL, "message '%s' does not name the file", dl_errmsg());
        FUZZ_VERDICT("refused: %s", dl_errmsg());
        return 0;
    }
    FUZZ_CHECK(info.model.n_layer == cfg.n_layer && info.model.n_head == cfg.n_head && info.model.n_embd == cfg.n_embd &&
                   info.model.seq_len == cfg.seq_len && info.model.vocab == cfg.vocab,
               "accepted a file of another model");
    for (size_t i = 0; i < numel; i++) {
        uint32_t bits;
        memcpy(&bits, &params[i], sizeof bits);
        FUZZ_CHECK(bits != 0xffffffffu, "param %zu was not written", i);
        FUZZ_CHECK(isfinite(params[i]), "accepted: param %zu is not finite", i);
    }
    size_t C = (size_t)cfg.n_embd;
    for (size_t i = (size_t)cfg.vocab * C; i < (size_t)cfg.padded_vocab * C; i++)
        FUZZ_CHECK(params[i] == 0.0f, "padded wte float %zu is %g", i, params[i]);
    FUZZ_VERDICT("accepted: %s, %s", info.kind, info.dtype);
    return 0;
}
