/* Checkpoint file: fixed 128-byte little-endian header, then params, m, v as
 * fp32; XXH64 of the three arrays in the header guards against bit rot. */
#include "learner/ckpt.h"

#include "core/err.h"
#include "core/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    uint32_t magic, version;
    int32_t n_layer, n_head, n_embd, seq_len, vocab, padded_vocab;
    uint64_t nparams;
    int64_t step;
    uint64_t data_epoch, data_index;
    uint64_t seed;
    uint64_t checksum; /* chained XXH64 over params, m, v */
    uint8_t reserved[128 - 8 - 24 - 48];
} ckpt_header;
_Static_assert(sizeof(ckpt_header) == 128, "checkpoint header is 128 bytes");

static uint64_t state_hash(size_t nparams, const float *params, const float *m, const float *v)
{
    size_t n = nparams * sizeof(float);
    uint64_t h = dl_hash64(params, n, 1);
    h = dl_hash64(m, n, h);
    return dl_hash64(v, n, h);
}

int dl_ckpt_save(const char *path, dl_gpt *g, const dl_ckpt_state *st)
{
    return dl_ckpt_save_raw(path, dl_gpt_cfg(g), dl_gpt_num_params(g), dl_gpt_params(g), dl_gpt_adam_m(g),
                            dl_gpt_adam_v(g), st);
}

int dl_ckpt_load(const char *path, dl_gpt *g, dl_ckpt_state *st)
{
    return dl_ckpt_load_raw(path, dl_gpt_cfg(g), dl_gpt_num_params(g), dl_gpt_params(g), dl_gpt_adam_m(g),
                            dl_gpt_adam_v(g), st);
}

int dl_ckpt_save_raw(const char *path, const dl_model_config *c, size_t nparams, const float *params,
                     const float *m, const float *v, const dl_ckpt_state *st)
{
    ckpt_header h;
    memset(&h, 0, sizeof h);
    h.magic = DL_CKPT_MAGIC;
    h.version = DL_CKPT_VERSION;
    h.n_layer = c->n_layer;
    h.n_head = c->n_head;
    h.n_embd = c->n_embd;
    h.seq_len = c->seq_len;
    h.vocab = c->vocab;
    h.padded_vocab = c->padded_vocab;
    h.nparams = nparams;
    h.step = st->step;
    h.data_epoch = st->data.epoch;
    h.data_index = st->data.index;
    h.seed = st->seed;
    h.checksum = state_hash(nparams, params, m, v);

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return dl_err(DL_EINVAL, "path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return dl_err(DL_EIO, "cannot create %s: %s", tmp, strerror(errno));
    size_t n = h.nparams * sizeof(float);
    const void *parts[4] = {&h, params, m, v};
    size_t lens[4] = {sizeof h, n, n, n};
    for (int i = 0; i < 4; i++) {
        const char *p = parts[i];
        size_t left = lens[i];
        while (left) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int e = errno;
                close(fd);
                unlink(tmp);
                return dl_err(DL_EIO, "write %s: %s", tmp, strerror(e));
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return dl_err(DL_EIO, "fsync %s: %s", tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, path) != 0) return dl_err(DL_EIO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    return 0;
}

int dl_ckpt_load_raw(const char *path, const dl_model_config *c, size_t nparams, float *params, float *m, float *v,
                     dl_ckpt_state *st)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dl_err(DL_EIO, "cannot open checkpoint %s: %s", path, strerror(errno));
    ckpt_header h;
    int rc = 0;
    float *buf = NULL;
    if (fread(&h, sizeof h, 1, f) != 1) {
        rc = dl_err(DL_ETRUNC, "%s: shorter than the 128-byte checkpoint header", path);
        goto out;
    }
    if (h.magic != DL_CKPT_MAGIC) {
        rc = dl_err(DL_EFORMAT, "%s: not a dloco checkpoint (magic 0x%08x)", path, h.magic);
        goto out;
    }
    if (h.version != DL_CKPT_VERSION) {
        rc = dl_err(DL_EFORMAT, "%s: checkpoint version %u, this build reads %u", path, h.version, DL_CKPT_VERSION);
        goto out;
    }
    if (h.n_layer != c->n_layer || h.n_head != c->n_head || h.n_embd != c->n_embd || h.seq_len != c->seq_len ||
        h.vocab != c->vocab || h.nparams != nparams) {
        rc = dl_err(DL_EMISMATCH,
                    "%s: checkpoint model L=%d NH=%d C=%d T=%d V=%d, this run L=%d NH=%d C=%d T=%d V=%d", path,
                    h.n_layer, h.n_head, h.n_embd, h.seq_len, h.vocab, c->n_layer, c->n_head, c->n_embd,
                    c->seq_len, c->vocab);
        goto out;
    }
    size_t n = h.nparams;
    buf = dl_try_malloc(3 * n * sizeof(float));
    if (!buf) {
        rc = dl_err(DL_ENOMEM, "%s: state of %zu parameters x 3 buffers (%.2f GB): out of memory", path, n,
                    3.0 * (double)n * sizeof(float) / 1e9);
        goto out;
    }
    if (fread(buf, sizeof(float), 3 * n, f) != 3 * n) {
        rc = dl_err(DL_ETRUNC, "%s: truncated (expected %zu bytes of state)", path, 3 * n * sizeof(float));
        goto out;
    }
    if (fgetc(f) != EOF) {
        rc = dl_err(DL_EFORMAT, "%s: trailing bytes after the state", path);
        goto out;
    }
    uint64_t hh = dl_hash64(buf, n * sizeof(float), 1);
    hh = dl_hash64(buf + n, n * sizeof(float), hh);
    hh = dl_hash64(buf + 2 * n, n * sizeof(float), hh);
    if (hh != h.checksum) {
        rc = dl_err(DL_ECORRUPT, "%s: checksum mismatch (file damaged)", path);
        goto out;
    }
    memcpy(params, buf, n * sizeof(float));
    memcpy(m, buf + n, n * sizeof(float));
    memcpy(v, buf + 2 * n, n * sizeof(float));
    st->step = h.step;
    st->data.epoch = h.data_epoch;
    st->data.index = h.data_index;
    st->seed = h.seed;
out:
    free(buf);
    fclose(f);
    return rc;
}
