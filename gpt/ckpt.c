/* Checkpoint file: fixed 128-byte little-endian header, then params, m, v
 * (and y for a GPA run) as fp32; XXH64 of the arrays in the header guards against bit rot. */
#include "gpt/ckpt.h"

#include "core/err.h"
#include "core/hash.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
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
    uint64_t checksum; /* chained XXH64 over params, m, v (, y) */
    uint32_t optimizer; /* 0 AdamW (version 1; zero in files written before GPA), 1 GPA (version 2), 2 AdamW with
                         * adam_fleet (version 3) */
    float gpa_mu_y;     /* GPA: the mu_y y was stored under */
    uint64_t run_tag;   /* dl_ckpt_state.run_tag (0 in files written before it) */
    uint64_t header_hash; /* XXH64 of this header with header_hash 0; 0 in files written before it (unchecked) */
    float fleet;          /* adam_fleet files: the multiplier w was accumulated under; 0 otherwise */
    uint8_t reserved[128 - 8 - 24 - 48 - 8 - 16 - 4];
} ckpt_header;
_Static_assert(sizeof(ckpt_header) == 128, "checkpoint header is 128 bytes");

/* chained over the `k` arrays of nparams floats each, in file order */
static uint64_t state_hash(size_t nparams, const float *const *arr, int k)
{
    uint64_t h = 1;
    for (int i = 0; i < k; i++) h = dl_hash64(arr[i], nparams * sizeof(float), h);
    return h;
}

/* over the header with header_hash zeroed; never 0, so 0 keeps meaning "a file from before the field" */
static uint64_t header_hash(const ckpt_header *h)
{
    ckpt_header c = *h;
    c.header_hash = 0;
    uint64_t x = dl_hash64(&c, sizeof c, 2);
    return x ? x : 1;
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

enum { KIND_ADAMW = 0, KIND_GPA = 1, KIND_FLEET = 2 }; /* the header's optimizer code */
static const uint32_t kind_version[3] = {DL_CKPT_VERSION, DL_CKPT_VERSION_GPA, DL_CKPT_VERSION_FLEET};
static const char *const kind_run[3] = {"an adamw run", "a gpa run", "an adamw run with adam_fleet"};
static const char *const kind_name[3] = {"adamw", "gpa", "adamw with adam_fleet"};
static const char *const kind_fix[3] = {"--optimizer adamw (adam_fleet 0)", "--optimizer gpa",
                                        "--optimizer adamw and the same --adam_fleet"};

/* kind KIND_ADAMW: y unused; KIND_GPA: y after v; KIND_FLEET: the noise moment w after v (y) */
static int save(const char *path, const dl_model_config *c, size_t nparams, const float *params, const float *m,
                const float *v, const float *y, int kind, const dl_ckpt_state *st)
{
    ckpt_header h;
    memset(&h, 0, sizeof h);
    h.magic = DL_CKPT_MAGIC;
    h.version = kind_version[kind];
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
    const float *arr[4] = {params, m, v, y};
    int narr = kind != KIND_ADAMW ? 4 : 3;
    h.checksum = state_hash(nparams, arr, narr);
    h.optimizer = (uint32_t)kind;
    if (kind == KIND_GPA) h.gpa_mu_y = st->gpa_mu_y;
    if (kind == KIND_FLEET) h.fleet = st->fleet;
    h.run_tag = st->run_tag;
    h.header_hash = header_hash(&h);

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return dl_err(DL_EINVAL, "path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return dl_err(DL_EIO, "cannot create %s: %s", tmp, strerror(errno));
    size_t n = h.nparams * sizeof(float);
    const void *parts[5] = {&h, params, m, v, y};
    size_t lens[5] = {sizeof h, n, n, n, n};
    for (int i = 0; i < 1 + narr; i++) {
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

int dl_ckpt_save_raw(const char *path, const dl_model_config *c, size_t nparams, const float *params,
                     const float *m, const float *v, const dl_ckpt_state *st)
{
    return save(path, c, nparams, params, m, v, NULL, KIND_ADAMW, st);
}

int dl_ckpt_save_gpa(const char *path, const dl_model_config *c, size_t nparams, const float *x, const float *m,
                     const float *v, const float *y, const dl_ckpt_state *st)
{
    assert(y);
    return save(path, c, nparams, x, m, v, y, KIND_GPA, st);
}

int dl_ckpt_save_fleet(const char *path, const dl_model_config *c, size_t nparams, const float *params,
                       const float *m, const float *v, const float *w, const dl_ckpt_state *st)
{
    assert(w);
    return save(path, c, nparams, params, m, v, w, KIND_FLEET, st);
}

/* Read and check the header (everything but the model's shape and the arrays). */
static int read_header(FILE *f, const char *path, ckpt_header *out)
{
    ckpt_header h;
    memset(out, 0, sizeof *out);
    if (fread(&h, sizeof h, 1, f) != 1) return dl_err(DL_ETRUNC, "%s: shorter than the 128-byte checkpoint header", path);
    if (h.magic != DL_CKPT_MAGIC) return dl_err(DL_EFORMAT, "%s: not a dloco checkpoint (magic 0x%08x)", path, h.magic);
    if (h.version != DL_CKPT_VERSION && h.version != DL_CKPT_VERSION_GPA && h.version != DL_CKPT_VERSION_FLEET)
        return dl_err(DL_EFORMAT, "%s: checkpoint version %u, this build reads %u (AdamW), %u (GPA) and %u "
                                  "(adam_fleet)", path, h.version, DL_CKPT_VERSION, DL_CKPT_VERSION_GPA,
                      DL_CKPT_VERSION_FLEET);
    if (h.header_hash && h.header_hash != header_hash(&h))
        return dl_err(DL_ECORRUPT, "%s: header checksum mismatch (file damaged)", path);
    int kind = h.version == DL_CKPT_VERSION_GPA ? KIND_GPA : h.version == DL_CKPT_VERSION_FLEET ? KIND_FLEET
                                                                                                : KIND_ADAMW;
    if (h.optimizer != (uint32_t)kind)
        return dl_err(DL_EFORMAT, "%s: checkpoint version %u with optimizer code %u (expected %d)", path, h.version,
                      h.optimizer, kind);
    if (kind == KIND_GPA && !(isfinite(h.gpa_mu_y) && h.gpa_mu_y >= 0.0f && h.gpa_mu_y < 1.0f))
        return dl_err(DL_EFORMAT, "%s: GPA checkpoint with mu_y %g, not in [0, 1)", path, (double)h.gpa_mu_y);
    if (kind == KIND_FLEET && !(h.fleet >= 1.0f && h.fleet <= 1e6f))
        return dl_err(DL_EFORMAT, "%s: adam_fleet checkpoint with adam_fleet %g, not in [1, 1e6]", path,
                      (double)h.fleet);
    if (h.step < 0) return dl_err(DL_EFORMAT, "%s: checkpoint at step %lld", path, (long long)h.step);
    *out = h;
    return 0;
}

static void header_state(const ckpt_header *h, dl_ckpt_state *st)
{
    st->gpa_mu_y = h->version == DL_CKPT_VERSION_GPA ? h->gpa_mu_y : 0.0f;
    st->fleet = h->version == DL_CKPT_VERSION_FLEET ? h->fleet : 0.0f;
    st->step = h->step;
    st->data.epoch = h->data_epoch;
    st->data.index = h->data_index;
    st->seed = h->seed;
    st->run_tag = h->run_tag;
}

int dl_ckpt_peek(const char *path, dl_ckpt_state *st, int *hashed)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dl_err(DL_EIO, "cannot open checkpoint %s: %s", path, strerror(errno));
    ckpt_header h;
    int rc = read_header(f, path, &h);
    fclose(f);
    if (rc) return rc;
    header_state(&h, st);
    if (hashed) *hashed = h.header_hash != 0;
    return 0;
}

/* the caller's kind only (y: GPA's y or adam_fleet's w) */
static int load(const char *path, const dl_model_config *c, size_t nparams, float *params, float *m, float *v,
                float *y, int want, dl_ckpt_state *st)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dl_err(DL_EIO, "cannot open checkpoint %s: %s", path, strerror(errno));
    ckpt_header h;
    float *buf = NULL;
    int rc = read_header(f, path, &h);
    if (rc) goto out;
    int kind = (int)h.optimizer;
    if (kind != want) {
        rc = dl_err(DL_EMISMATCH, "%s: checkpoint of %s, this run uses %s: resume it with %s", path, kind_run[kind],
                    kind_name[want], kind_fix[kind]);
        goto out;
    }
    int four = kind != KIND_ADAMW; /* a 4th array */
    if (h.n_layer != c->n_layer || h.n_head != c->n_head || h.n_embd != c->n_embd || h.seq_len != c->seq_len ||
        h.vocab != c->vocab || h.nparams != nparams) {
        rc = dl_err(DL_EMISMATCH,
                    "%s: checkpoint model L=%d NH=%d C=%d T=%d V=%d, this run L=%d NH=%d C=%d T=%d V=%d", path,
                    h.n_layer, h.n_head, h.n_embd, h.seq_len, h.vocab, c->n_layer, c->n_head, c->n_embd,
                    c->seq_len, c->vocab);
        goto out;
    }
    size_t n = h.nparams, k = four ? 4 : 3;
    buf = dl_try_malloc(k * n * sizeof(float));
    if (!buf) {
        rc = dl_err(DL_ENOMEM, "%s: state of %zu parameters x %zu buffers (%.2f GB): out of memory", path, n, k,
                    (double)k * (double)n * sizeof(float) / 1e9);
        goto out;
    }
    if (fread(buf, sizeof(float), k * n, f) != k * n) {
        rc = dl_err(DL_ETRUNC, "%s: truncated (expected %zu bytes of state)", path, k * n * sizeof(float));
        goto out;
    }
    if (fgetc(f) != EOF) {
        rc = dl_err(DL_EFORMAT, "%s: trailing bytes after the state", path);
        goto out;
    }
    const float *arr[4] = {buf, buf + n, buf + 2 * n, buf + 3 * n};
    if (state_hash(n, arr, (int)k) != h.checksum) {
        rc = dl_err(DL_ECORRUPT, "%s: checksum mismatch (file damaged)", path);
        goto out;
    }
    memcpy(params, buf, n * sizeof(float));
    memcpy(m, buf + n, n * sizeof(float));
    memcpy(v, buf + 2 * n, n * sizeof(float));
    if (four) memcpy(y, buf + 3 * n, n * sizeof(float));
    header_state(&h, st);
out:
    free(buf);
    fclose(f);
    return rc;
}

int dl_ckpt_load_raw(const char *path, const dl_model_config *c, size_t nparams, float *params, float *m, float *v,
                     dl_ckpt_state *st)
{
    return load(path, c, nparams, params, m, v, NULL, KIND_ADAMW, st);
}

int dl_ckpt_load_gpa(const char *path, const dl_model_config *c, size_t nparams, float *x, float *m, float *v,
                     float *y, dl_ckpt_state *st)
{
    assert(y);
    return load(path, c, nparams, x, m, v, y, KIND_GPA, st);
}

int dl_ckpt_load_fleet(const char *path, const dl_model_config *c, size_t nparams, float *params, float *m, float *v,
                       float *w, dl_ckpt_state *st)
{
    assert(w);
    return load(path, c, nparams, params, m, v, w, KIND_FLEET, st);
}
