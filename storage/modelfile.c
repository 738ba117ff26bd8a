/* Model files (storage/modelfile.h): the writers of safetensors, the HF GPT-2
 * directory and llm.c checkpoints, and one bounded reader for all three. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* renameat2 */
#endif
#include "storage/modelfile.h"

#include "core/err.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240326
#define LLMC_VERSION 3    /* fp32 params with the padded vocabulary in header[7] */
#define LLMC_HEADER 256   /* int32 */
#define LLMC_VPAD 128     /* llm.c pads the vocabulary to a multiple of this */
#define ST_HEADER_MAX (100u << 20) /* the safetensors spec's header bound */
#define ST_MAX_DIMS 8
#define JSON_DEPTH_MAX 32
#define NAME_MAX_LEN 127
#define CONFIG_JSON_MAX (1u << 20)

/* The 12 per-layer tensors in core/model.c's table order, with their shapes
 * in dloco's orientation as multiples of C: rows x cols (cols 0 = 1-D). */
static const struct {
    const char *suffix;
    int rows, cols; /* in units of C */
    int matrix;     /* a Conv1D weight in HF: stored transposed there */
} layer_t[12] = {
    {"ln_1.weight", 1, 0, 0},      {"ln_1.bias", 1, 0, 0},        {"attn.c_attn.weight", 3, 1, 1},
    {"attn.c_attn.bias", 3, 0, 0}, {"attn.c_proj.weight", 1, 1, 1}, {"attn.c_proj.bias", 1, 0, 0},
    {"ln_2.weight", 1, 0, 0},      {"ln_2.bias", 1, 0, 0},        {"mlp.c_fc.weight", 4, 1, 1},
    {"mlp.c_fc.bias", 4, 0, 0},    {"mlp.c_proj.weight", 1, 4, 1}, {"mlp.c_proj.bias", 1, 0, 0},
};

int dl_modelfile_format_parse(const char *s, int *out)
{
    if (!strcmp(s, "safetensors")) *out = DL_MODELFILE_SAFETENSORS;
    else if (!strcmp(s, "hf")) *out = DL_MODELFILE_HF;
    else if (!strcmp(s, "llmc")) *out = DL_MODELFILE_LLMC;
    else return dl_err(DL_EINVAL, "format '%s' is not one of safetensors|llmc|hf", s);
    return 0;
}

const char *dl_modelfile_format_name(int f)
{
    return f == DL_MODELFILE_SAFETENSORS ? "safetensors" : f == DL_MODELFILE_HF ? "hf" : f == DL_MODELFILE_LLMC ? "llmc" : "?";
}

/* ---------------------------------------------------------------- writing */

/* One run of output floats: n floats of src (rows x cols, written transposed
 * when transpose), or n zeros when src is NULL. */
typedef struct {
    const float *src;
    size_t n;
    size_t rows, cols;
    int transpose;
} piece;

typedef struct {
    int fd;
    const char *path;  /* the file written (a temporary name), for errors */
    const char *label; /* what the progress lines call it */
    char buf[1 << 20];
    size_t used;
    uint64_t done, total, next_report;
    FILE *progress;
} writer;

static int w_flush(writer *w)
{
    const char *p = w->buf;
    size_t left = w->used;
    while (left) {
        ssize_t k = write(w->fd, p, left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return dl_err(DL_EIO, "write %s: %s", w->path, k < 0 ? strerror(errno) : "short write");
        p += k;
        left -= (size_t)k;
    }
    w->done += w->used;
    w->used = 0;
    if (w->progress && w->total > (64u << 20) && w->done >= w->next_report) {
        fprintf(w->progress, "export: %s %.0f%% (%.1f of %.1f MB)\n", w->label ? w->label : w->path, 100.0 * (double)w->done / (double)w->total,
                w->done / 1e6, w->total / 1e6);
        fflush(w->progress);
        w->next_report += w->total / 10;
    }
    return 0;
}

static int w_bytes(writer *w, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        size_t k = sizeof w->buf - w->used;
        if (k > n) k = n;
        memcpy(w->buf + w->used, p, k);
        w->used += k;
        p += k;
        n -= k;
        if (w->used == sizeof w->buf) DL_TRY(w_flush(w));
    }
    return 0;
}

static int w_piece(writer *w, const piece *pc)
{
    if (!pc->src) {
        static const float zeros[1024];
        for (size_t left = pc->n; left;) {
            size_t k = left < 1024 ? left : 1024;
            DL_TRY(w_bytes(w, zeros, k * sizeof(float)));
            left -= k;
        }
        return 0;
    }
    if (!pc->transpose) return w_bytes(w, pc->src, pc->n * sizeof(float));
    /* src is [rows, cols]; the output is [cols, rows] */
    float row[1024];
    for (size_t c = 0; c < pc->cols; c++)
        for (size_t r0 = 0; r0 < pc->rows; r0 += 1024) {
            size_t k = pc->rows - r0 < 1024 ? pc->rows - r0 : 1024;
            for (size_t i = 0; i < k; i++) row[i] = pc->src[(r0 + i) * pc->cols + c];
            DL_TRY(w_bytes(w, row, k * sizeof(float)));
        }
    return 0;
}

/* Create path exclusively, for writing. */
static int create_file(const char *path, int *fd)
{
    *fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (*fd < 0) return dl_err(DL_EIO, "cannot create %s: %s", path, strerror(errno));
    return 0;
}

static int finish_file(int fd, const char *path)
{
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return dl_err(DL_EIO, "fsync %s: %s", path, strerror(e));
    }
    if (close(fd) != 0) return dl_err(DL_EIO, "close %s: %s", path, strerror(errno));
    return 0;
}

static void fsync_dir_of(const char *path)
{
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s", path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* The 16 + 12L tensors of a model as pieces, in one of three orders/orientations. */
typedef struct {
    char name[96];
    int ndim;
    uint64_t shape[2];
    piece pc;
} out_tensor;

/* Tensors in buffer order with dloco names (hf = 0) or HF names and
 * orientation (hf = 1); wte without its padded rows. Returns the count. */
static int model_tensors(const dl_model_config *cfg, const float *params, int hf, out_tensor *out)
{
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_xcalloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(cfg, tab, nt, NULL);
    for (int i = 0; i < nt; i++) {
        const dl_tensor *t = &tab[i];
        out_tensor *o = &out[i];
        memset(o, 0, sizeof *o);
        size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
        if (i == 0) rows = (size_t)cfg->vocab; /* wte: the real vocabulary */
        o->pc = (piece){.src = params + t->offset, .n = rows * cols, .rows = rows, .cols = cols};
        o->ndim = t->ndim;
        o->shape[0] = rows;
        o->shape[1] = cols;
        int is_matrix = t->kind == DL_TENSOR_MATRIX;
        if (!hf) {
            snprintf(o->name, sizeof o->name, "%s", t->name);
        } else {
            const char *nm = t->name;
            if (!strcmp(nm, "wte") || !strcmp(nm, "wpe")) snprintf(o->name, sizeof o->name, "transformer.%s.weight", nm);
            else snprintf(o->name, sizeof o->name, "transformer.%s", nm);
            if (is_matrix) {
                o->pc.transpose = 1;
                o->shape[0] = cols;
                o->shape[1] = rows;
            }
        }
    }
    free(tab);
    return nt;
}

/* A growable text buffer for headers. */
typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) DL_PANIC("vsnprintf failed");
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap <= b->len + (size_t)n) cap *= 2;
        b->p = dl_xrealloc(b->p, cap);
        b->cap = cap;
    }
}

/* A JSON string of printable ASCII (names and ids are; anything else is escaped). */
static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') sb_add(b, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f) sb_add(b, "\\u%04x", c);
        else sb_add(b, "%c", c);
    }
    sb_add(b, "\"");
}

static void meta_kv(sbuf *b, const char *k, const char *v)
{
    sb_add(b, ",");
    sb_str(b, k);
    sb_add(b, ":");
    sb_str(b, v);
}

static void meta_int(sbuf *b, const char *k, long long v)
{
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    meta_kv(b, k, t);
}

/* Write one safetensors file to the (new) file `path`. */
static int write_safetensors(const char *path, const dl_model_config *cfg, const float *params,
                             const dl_modelfile_meta *meta, int hf, FILE *progress, const char *label)
{
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    out_tensor *ts = dl_xcalloc((size_t)nt, sizeof *ts);
    model_tensors(cfg, params, hf, ts);
    sbuf h = {0};
    sb_add(&h, "{\"__metadata__\":{\"format\":\"pt\"");
    meta_kv(&h, "dloco_names", hf ? "hf" : "dloco");
    meta_int(&h, "n_layer", cfg->n_layer);
    meta_int(&h, "n_head", cfg->n_head);
    meta_int(&h, "n_embd", cfg->n_embd);
    meta_int(&h, "seq_len", cfg->seq_len);
    meta_int(&h, "vocab", cfg->vocab);
    if (meta && meta->run_id) meta_kv(&h, "run_id", meta->run_id);
    if (meta && meta->fingerprint) {
        char t[32];
        snprintf(t, sizeof t, "%016llx", (unsigned long long)meta->fingerprint);
        meta_kv(&h, "fingerprint", t);
    }
    if (meta && meta->n_fragments) {
        meta_int(&h, "fragments", meta->n_fragments);
        if (meta->versions) {
            sbuf v = {0};
            uint64_t sum = 0;
            for (uint32_t p = 0; p < meta->n_fragments; p++) {
                sb_add(&v, "%s%llu", p ? "," : "", (unsigned long long)meta->versions[p]);
                sum += meta->versions[p];
            }
            meta_kv(&h, "versions", v.p);
            meta_int(&h, "total_version", (long long)sum);
            free(v.p);
        }
    }
    if (meta && meta->run_id) meta_int(&h, "seed", (long long)meta->seed);
    sb_add(&h, "}");
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        sb_add(&h, ",");
        sb_str(&h, ts[i].name);
        sb_add(&h, ":{\"dtype\":\"F32\",\"shape\":[%llu", (unsigned long long)ts[i].shape[0]);
        if (ts[i].ndim == 2) sb_add(&h, ",%llu", (unsigned long long)ts[i].shape[1]);
        uint64_t bytes = ts[i].pc.n * sizeof(float);
        sb_add(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    sb_add(&h, "}");
    while ((8 + h.len) % 8) sb_add(&h, " "); /* the data starts 8-byte aligned */
    int fd, rc;
    if ((rc = create_file(path, &fd))) goto out;
    writer *w = dl_xmalloc(sizeof *w);
    *w = (writer){.fd = fd, .path = path, .label = label, .total = 8 + h.len + off, .progress = progress};
    w->next_report = w->total / 10;
    uint64_t n = h.len;
    unsigned char le[8];
    for (int k = 0; k < 8; k++) le[k] = (unsigned char)(n >> (8 * k));
    rc = w_bytes(w, le, 8);
    if (!rc) rc = w_bytes(w, h.p, h.len);
    for (int i = 0; !rc && i < nt; i++) rc = w_piece(w, &ts[i].pc);
    if (!rc) rc = w_flush(w);
    free(w);
    if (rc) close(fd);
    else rc = finish_file(fd, path);
out:
    free(h.p);
    free(ts);
    return rc;
}

/* llm.c's 16 parameter arrays, in train_gpt2.c's order, as pieces. */
static int write_llmc(const char *path, const dl_model_config *cfg, const float *params, FILE *progress,
                      const char *label)
{
    int L = cfg->n_layer, C = cfg->n_embd, V = cfg->vocab, T = cfg->seq_len;
    int Vp = (V + LLMC_VPAD - 1) / LLMC_VPAD * LLMC_VPAD;
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_xcalloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(cfg, tab, nt, NULL);
    int32_t hdr[LLMC_HEADER] = {LLMC_MAGIC, LLMC_VERSION, T, V, L, cfg->n_head, C, Vp};
    int fd, rc;
    if ((rc = create_file(path, &fd))) {
        free(tab);
        return rc;
    }
    writer *w = dl_xmalloc(sizeof *w);
    uint64_t total = sizeof hdr + 4ull * ((uint64_t)Vp * C + (uint64_t)T * C + (uint64_t)L * (12ull * C * C + 13ull * C) + 2ull * C);
    *w = (writer){.fd = fd, .path = path, .label = label, .total = total, .progress = progress};
    w->next_report = total / 10;
    rc = w_bytes(w, hdr, sizeof hdr);
    piece wte = {.src = params + tab[0].offset, .n = (size_t)V * C};
    piece pad = {.src = NULL, .n = (size_t)(Vp - V) * C};
    piece wpe = {.src = params + tab[1].offset, .n = (size_t)T * C};
    if (!rc) rc = w_piece(w, &wte);
    if (!rc) rc = w_piece(w, &pad);
    if (!rc) rc = w_piece(w, &wpe);
    /* per-layer tensor k of layer l is table entry 2 + 12 l + k; llm.c stacks each k over l */
    for (int k = 0; k < 12 && !rc; k++)
        for (int l = 0; l < L && !rc; l++) {
            const dl_tensor *t = &tab[2 + 12 * l + k];
            piece pc = {.src = params + t->offset, .n = t->numel};
            rc = w_piece(w, &pc);
        }
    for (int k = 0; k < 2 && !rc; k++) {
        const dl_tensor *t = &tab[2 + 12 * L + k];
        piece pc = {.src = params + t->offset, .n = t->numel};
        rc = w_piece(w, &pc);
    }
    if (!rc) rc = w_flush(w);
    free(w);
    free(tab);
    if (rc) close(fd);
    else rc = finish_file(fd, path);
    return rc;
}

static int write_hf_config(const char *path, const dl_model_config *cfg)
{
    sbuf b = {0};
    int V = cfg->vocab;
    sb_add(&b,
           "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n"
           "  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
           "  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
           "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n  \"initializer_range\": 0.02,\n"
           "  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
           "  \"reorder_and_upcast_attn\": false,\n  \"tie_word_embeddings\": true,\n  \"use_cache\": true,\n"
           "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"torch_dtype\": \"float32\"\n}\n",
           V, cfg->seq_len, cfg->seq_len, cfg->n_embd, cfg->n_layer, cfg->n_head, V - 1, V - 1);
    int fd, rc = create_file(path, &fd);
    if (!rc) {
        writer *w = dl_xmalloc(sizeof *w);
        *w = (writer){.fd = fd, .path = path};
        rc = w_bytes(w, b.p, b.len);
        if (!rc) rc = w_flush(w);
        free(w);
        if (rc) close(fd);
        else rc = finish_file(fd, path);
    }
    free(b.p);
    return rc;
}

static void remove_tree_of_ours(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
}

int dl_modelfile_write(const char *path, int format, const dl_model_config *cfg_in, const float *params,
                       const dl_modelfile_meta *meta, int force, FILE *progress)
{
    dl_model_config cfg = *cfg_in;
    DL_TRY(dl_model_config_check(&cfg));
    if (format != DL_MODELFILE_SAFETENSORS && format != DL_MODELFILE_HF && format != DL_MODELFILE_LLMC)
        return dl_err(DL_EINVAL, "unknown model file format %d", format);
    struct stat st;
    int exists = lstat(path, &st) == 0;
    if (exists && !force) return dl_err(DL_EINVAL, "%s exists (use --force to replace it)", path);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return dl_err(DL_EINVAL, "path too long: %s", path);
    /* a temporary of this pid is a crashed earlier writer's (pids are unique among the living) */
    struct stat ts;
    if (lstat(tmp, &ts) == 0) {
        if (S_ISDIR(ts.st_mode)) remove_tree_of_ours(tmp);
        else unlink(tmp);
    }
    int rc = 0;
    if (format == DL_MODELFILE_HF) {
        char f[4200];
        if (mkdir(tmp, 0755) != 0) return dl_err(DL_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
        snprintf(f, sizeof f, "%s/model.safetensors", tmp);
        rc = write_safetensors(f, &cfg, params, meta, 1, progress, path);
        snprintf(f, sizeof f, "%s/config.json", tmp);
        if (!rc) rc = write_hf_config(f, &cfg);
        if (!rc) fsync_dir_of(f);
        if (rc) {
            remove_tree_of_ours(tmp);
            return rc;
        }
    } else {
        rc = format == DL_MODELFILE_LLMC ? write_llmc(tmp, &cfg, params, progress, path)
                                         : write_safetensors(tmp, &cfg, params, meta, 0, progress, path);
        if (rc) {
            unlink(tmp);
            return rc;
        }
    }
    /* into place: never over something that appeared meanwhile unless forced */
    int e = 0;
    if (!exists) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0) e = errno;
        if ((e == EINVAL || e == ENOSYS) && lstat(path, &st) != 0) {
            /* a filesystem without RENAME_NOREPLACE: checked just before, not atomically */
            e = rename(tmp, path) == 0 ? 0 : errno;
        }
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
        /* the old one is at tmp now */
        if (S_ISDIR(st.st_mode)) {
            remove_tree_of_ours(tmp);
            if (access(tmp, F_OK) == 0 && progress)
                fprintf(progress, "export: the replaced directory held other files; it is kept as %s\n", tmp);
        } else {
            unlink(tmp);
        }
    } else {
        e = errno;
    }
    if (e) {
        if (format == DL_MODELFILE_HF) remove_tree_of_ours(tmp);
        else unlink(tmp);
        if (e == EEXIST) return dl_err(DL_EINVAL, "%s exists (use --force to replace it)", path);
        return dl_err(DL_EIO, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    fsync_dir_of(path);
    return 0;
}

/* ---------------------------------------------------------------- reading */

/* A strict JSON reader over a bounded buffer: no allocation, bounded depth. */
typedef struct {
    const char *p, *end, *start;
    const char *what; /* file name, for messages */
} js;

static int js_fail(js *j, const char *why)
{
    return dl_err(DL_EFORMAT, "%s: bad JSON at byte %ld: %s", j->what, (long)(j->p - j->start), why);
}

static void js_ws(js *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int js_peek(js *j)
{
    js_ws(j);
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

static int js_expect(js *j, char c)
{
    if (js_peek(j) != (unsigned char)c) {
        char why[32];
        snprintf(why, sizeof why, "expected '%c'", c);
        return js_fail(j, why);
    }
    j->p++;
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string into out (cap bytes with the NUL); *trunc set when it did not
 * fit (out then holds a prefix). out may be NULL (skip). */
static int js_string(js *j, char *out, size_t cap, int *trunc)
{
    if (js_peek(j) != '"') return js_fail(j, "expected a string");
    j->p++;
    size_t n = 0;
    if (trunc) *trunc = 0;
    for (;;) {
        if (j->p >= j->end) return js_fail(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') break;
        if (c < 0x20) return js_fail(j, "control character in a string");
        char enc[4];
        int ne = 1;
        enc[0] = (char)c;
        if (c == '\\') {
            if (j->p >= j->end) return js_fail(j, "unterminated escape");
            char e = *j->p++;
            switch (e) {
            case '"': case '\\': case '/': enc[0] = e; break;
            case 'b': enc[0] = '\b'; break;
            case 'f': enc[0] = '\f'; break;
            case 'n': enc[0] = '\n'; break;
            case 'r': enc[0] = '\r'; break;
            case 't': enc[0] = '\t'; break;
            case 'u': {
                if (j->end - j->p < 4) return js_fail(j, "short \\u escape");
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    int h = hexval((unsigned char)j->p[k]);
                    if (h < 0) return js_fail(j, "bad \\u escape");
                    v = v * 16 + (unsigned)h;
                }
                j->p += 4;
                if (v >= 0xd800 && v <= 0xdfff) {
                    enc[0] = '?'; /* a surrogate half: names never need one; kept as '?' */
                } else if (v < 0x80) {
                    if (v == 0) return js_fail(j, "NUL in a string");
                    enc[0] = (char)v;
                } else if (v < 0x800) {
                    enc[0] = (char)(0xc0 | (v >> 6));
                    enc[1] = (char)(0x80 | (v & 0x3f));
                    ne = 2;
                } else {
                    enc[0] = (char)(0xe0 | (v >> 12));
                    enc[1] = (char)(0x80 | ((v >> 6) & 0x3f));
                    enc[2] = (char)(0x80 | (v & 0x3f));
                    ne = 3;
                }
                break;
            }
            default: return js_fail(j, "bad escape");
            }
        }
        if (out) {
            if (n + (size_t)ne < cap) {
                memcpy(out + n, enc, (size_t)ne);
                n += (size_t)ne;
            } else if (trunc) {
                *trunc = 1;
            }
        }
    }
    if (out && cap) out[n] = 0;
    return 0;
}

/* A non-negative integer (no sign, fraction or exponent) below 2^53. */
static int js_uint(js *j, uint64_t *out)
{
    js_ws(j);
    const char *s = j->p;
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        v = v * 10 + (uint64_t)(*j->p - '0');
        if (v >= (1ull << 53)) return js_fail(j, "integer too large");
        j->p++;
    }
    if (j->p == s) return js_fail(j, "expected a non-negative integer");
    if (j->p - s > 1 && *s == '0') return js_fail(j, "integer with a leading zero");
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E' || *j->p == '-'))
        return js_fail(j, "expected an integer");
    *out = v;
    return 0;
}

/* Skip any value (config.json), depth-bounded. */
static int js_skip(js *j, int depth)
{
    if (depth > JSON_DEPTH_MAX) return js_fail(j, "nested too deep");
    int c = js_peek(j);
    if (c == '"') return js_string(j, NULL, 0, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (js_peek(j) == close) {
            j->p++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                DL_TRY(js_string(j, NULL, 0, NULL));
                DL_TRY(js_expect(j, ':'));
            }
            DL_TRY(js_skip(j, depth + 1));
            int d = js_peek(j);
            if (d < 0) return js_fail(j, "unexpected end");
            j->p++;
            if (d == close) return 0;
            if (d != ',') return js_fail(j, "expected ',' or a closing bracket");
        }
    }
    const char *lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(lits[k]);
        if ((size_t)(j->end - j->p) >= n && !memcmp(j->p, lits[k], n)) {
            j->p += n;
            return 0;
        }
    }
    /* a number: -?digits(.digits)?([eE][+-]?digits)? */
    const char *s = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    int digits = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
    if (!digits) return js_fail(j, "expected a value");
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        digits = 0;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        if (!digits) return js_fail(j, "bad number");
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        digits = 0;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        if (!digits) return js_fail(j, "bad number");
    }
    (void)s;
    return 0;
}

enum { DT_F32 = 1, DT_F16 = 2, DT_BF16 = 3, DT_OTHER = 4 };

/* One tensor entry of a safetensors header. */
typedef struct {
    int present;
    int dtype;     /* DT_* */
    int esize;     /* bytes per element */
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t b, e; /* data_offsets */
    char name[NAME_MAX_LEN + 1];
} st_entry;

/* Slots: per layer 12, then wte, wpe, ln_f.weight, ln_f.bias; extras (HF
 * buffers and the tied head) only take part in the offset checks. */
#define SLOT_WTE 0
#define SLOT_WPE 1
#define SLOT_LNFW 2
#define SLOT_LNFB 3
#define EXTRA_MAX (2 * DL_MODEL_LAYER_MAX + 1)

typedef struct {
    st_entry glob[4];
    st_entry *layer; /* [DL_MODEL_LAYER_MAX * 12] */
    st_entry extra[EXTRA_MAX];
    int nextra;
    int scheme; /* 0 unknown, 1 dloco, 2 hf */
    int nlayers;  /* max layer index + 1 */
    int64_t n_head; /* from __metadata__, -1 if absent */
} st_header;

static int set_scheme(js *j, st_header *h, int s, const char *name)
{
    if (h->scheme && h->scheme != s)
        return dl_err(DL_EFORMAT, "%s: tensor '%s' mixes dloco names and Hugging Face names", j->what, name);
    h->scheme = s;
    return 0;
}

/* Which slot a name is: *slot = the entry to fill, or NULL with an
 * "unknown tensor" refusal. */
static int name_slot(js *j, st_header *h, const char *name, st_entry **slot)
{
    const char *n = name;
    *slot = NULL;
    if (!strncmp(n, "transformer.", 12)) {
        n += 12;
        DL_TRY(set_scheme(j, h, 2, name));
    }
    if (!strcmp(n, "wte") || !strcmp(n, "wpe")) {
        if (n != name) return dl_err(DL_EFORMAT, "%s: unknown tensor '%s'", j->what, name);
        DL_TRY(set_scheme(j, h, 1, name));
        *slot = &h->glob[n[1] == 't' ? SLOT_WTE : SLOT_WPE];
        return 0;
    }
    if (!strcmp(n, "wte.weight") || !strcmp(n, "wpe.weight")) {
        DL_TRY(set_scheme(j, h, 2, name));
        *slot = &h->glob[n[1] == 't' ? SLOT_WTE : SLOT_WPE];
        return 0;
    }
    if (!strcmp(n, "ln_f.weight") || !strcmp(n, "ln_f.bias")) {
        *slot = &h->glob[n[5] == 'w' ? SLOT_LNFW : SLOT_LNFB];
        return 0;
    }
    if (!strcmp(n, "lm_head.weight") && n == name) {
        DL_TRY(set_scheme(j, h, 2, name));
        goto extra;
    }
    if (n[0] == 'h' && n[1] == '.' && n[2] >= '0' && n[2] <= '9') {
        const char *q = n + 2;
        long l = 0;
        while (*q >= '0' && *q <= '9' && l < 100000) l = l * 10 + (*q++ - '0');
        if (*q != '.' || (q - (n + 2) > 1 && n[2] == '0') || l >= DL_MODEL_LAYER_MAX)
            return dl_err(DL_EFORMAT, "%s: unknown tensor '%s' (layers are h.0 .. h.%d)", j->what, name,
                          DL_MODEL_LAYER_MAX - 1);
        q++;
        for (int k = 0; k < 12; k++)
            if (!strcmp(q, layer_t[k].suffix)) {
                if (l + 1 > h->nlayers) h->nlayers = (int)l + 1;
                *slot = &h->layer[l * 12 + k];
                return 0;
            }
        if (!strcmp(q, "attn.bias") || !strcmp(q, "attn.masked_bias")) {
            DL_TRY(set_scheme(j, h, 2, name));
            goto extra;
        }
    }
    return dl_err(DL_EFORMAT, "%s: unknown tensor '%s'", j->what, name);
extra:
    if (h->nextra >= EXTRA_MAX) return dl_err(DL_EFORMAT, "%s: too many ignored tensors ('%s')", j->what, name);
    *slot = &h->extra[h->nextra++];
    return 0;
}

static int dtype_of(const char *s, int *dt, int *esize)
{
    static const struct {
        const char *n;
        int dt, sz;
    } d[] = {{"F32", DT_F32, 4},  {"F16", DT_F16, 2},   {"BF16", DT_BF16, 2},   {"F64", DT_OTHER, 8},
             {"I64", DT_OTHER, 8}, {"U64", DT_OTHER, 8}, {"I32", DT_OTHER, 4},   {"U32", DT_OTHER, 4},
             {"I16", DT_OTHER, 2}, {"U16", DT_OTHER, 2}, {"I8", DT_OTHER, 1},    {"U8", DT_OTHER, 1},
             {"BOOL", DT_OTHER, 1}, {"F8_E5M2", DT_OTHER, 1}, {"F8_E4M3", DT_OTHER, 1}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (!strcmp(s, d[i].n)) {
            *dt = d[i].dt;
            *esize = d[i].sz;
            return 0;
        }
    return -1;
}

/* One tensor's {"dtype", "shape", "data_offsets"}, each exactly once. */
static int parse_entry(js *j, st_entry *e, const char *name)
{
    int seen[3] = {0, 0, 0};
    DL_TRY(js_expect(j, '{'));
    if (js_peek(j) == '}') return dl_err(DL_EFORMAT, "%s: tensor '%s' has an empty entry", j->what, name);
    for (;;) {
        char key[32];
        int trunc;
        DL_TRY(js_string(j, key, sizeof key, &trunc));
        DL_TRY(js_expect(j, ':'));
        int k = trunc ? -1 : !strcmp(key, "dtype") ? 0 : !strcmp(key, "shape") ? 1 : !strcmp(key, "data_offsets") ? 2 : -1;
        if (k < 0) return dl_err(DL_EFORMAT, "%s: tensor '%s': unknown field '%s'", j->what, name, key);
        if (seen[k]++) return dl_err(DL_EFORMAT, "%s: tensor '%s': field '%s' twice", j->what, name, key);
        if (k == 0) {
            char dt[16];
            DL_TRY(js_string(j, dt, sizeof dt, &trunc));
            if (trunc || dtype_of(dt, &e->dtype, &e->esize))
                return dl_err(DL_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", j->what, name, dt);
        } else {
            DL_TRY(js_expect(j, '['));
            int n = 0;
            uint64_t v[ST_MAX_DIMS];
            if (js_peek(j) == ']') {
                j->p++;
            } else {
                for (;;) {
                    if (n >= (k == 1 ? ST_MAX_DIMS : 2))
                        return dl_err(DL_EFORMAT, "%s: tensor '%s': %s has too many entries", j->what, name, key);
                    DL_TRY(js_uint(j, &v[n]));
                    n++;
                    int d = js_peek(j);
                    if (d < 0) return js_fail(j, "unexpected end");
                    j->p++;
                    if (d == ']') break;
                    if (d != ',') return js_fail(j, "expected ',' or ']'");
                }
            }
            if (k == 1) {
                e->ndim = n;
                memcpy(e->shape, v, sizeof(uint64_t) * (size_t)n);
            } else {
                if (n != 2) return dl_err(DL_EFORMAT, "%s: tensor '%s': data_offsets needs [begin, end]", j->what, name);
                e->b = v[0];
                e->e = v[1];
            }
        }
        int d = js_peek(j);
        if (d < 0) return js_fail(j, "unexpected end");
        j->p++;
        if (d == '}') break;
        if (d != ',') return js_fail(j, "expected ',' or '}'");
    }
    if (!seen[0] || !seen[1] || !seen[2])
        return dl_err(DL_EFORMAT, "%s: tensor '%s' lacks %s", j->what, name,
                      !seen[0] ? "dtype" : !seen[1] ? "shape" : "data_offsets");
    return 0;
}

static int parse_metadata(js *j, st_header *h)
{
    DL_TRY(js_expect(j, '{'));
    if (js_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[64], val[64];
        int tk, tv;
        DL_TRY(js_string(j, key, sizeof key, &tk));
        DL_TRY(js_expect(j, ':'));
        if (js_peek(j) != '"') return dl_err(DL_EFORMAT, "%s: __metadata__ value of '%s' is not a string", j->what, key);
        DL_TRY(js_string(j, val, sizeof val, &tv));
        if (!tk && !strcmp(key, "n_head")) {
            char *endp;
            long v = strtol(val, &endp, 10);
            if (tv || !val[0] || *endp || v < DL_MODEL_HEAD_MIN || v > DL_MODEL_HEAD_MAX)
                return dl_err(DL_ERANGE, "%s: __metadata__ n_head '%s' is not in [%d, %d]", j->what, val,
                              DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX);
            h->n_head = v;
        }
        int d = js_peek(j);
        if (d < 0) return js_fail(j, "unexpected end");
        j->p++;
        if (d == '}') return 0;
        if (d != ',') return js_fail(j, "expected ',' or '}'");
    }
}

static int parse_header(js *j, st_header *h)
{
    int seen_meta = 0;
    DL_TRY(js_expect(j, '{'));
    if (js_peek(j) == '}') return dl_err(DL_EFORMAT, "%s: the safetensors header holds no tensor", j->what);
    for (;;) {
        char name[NAME_MAX_LEN + 1];
        int trunc;
        DL_TRY(js_string(j, name, sizeof name, &trunc));
        if (trunc) return dl_err(DL_EFORMAT, "%s: tensor name '%s...' longer than %d bytes", j->what, name, NAME_MAX_LEN);
        DL_TRY(js_expect(j, ':'));
        if (!strcmp(name, "__metadata__")) {
            if (seen_meta++) return dl_err(DL_EFORMAT, "%s: __metadata__ twice", j->what);
            DL_TRY(parse_metadata(j, h));
        } else {
            st_entry *e;
            DL_TRY(name_slot(j, h, name, &e));
            if (e->present) return dl_err(DL_EFORMAT, "%s: tensor '%s' appears twice", j->what, name);
            DL_TRY(parse_entry(j, e, name));
            e->present = 1;
            snprintf(e->name, sizeof e->name, "%s", name);
        }
        int d = js_peek(j);
        if (d < 0) return js_fail(j, "unexpected end");
        j->p++;
        if (d == '}') break;
        if (d != ',') return js_fail(j, "expected ',' or '}'");
    }
    js_ws(j);
    if (j->p != j->end) return dl_err(DL_EFORMAT, "%s: bytes after the JSON header", j->what);
    return 0;
}

/* n_head from a config.json beside the model (HF). -1 when there is none
 * or it has no n_head. */
static int config_json_n_head(const char *model_path, int64_t *out)
{
    *out = -1;
    char tmp[4300], p[4400];
    snprintf(tmp, sizeof tmp, "%s", model_path);
    snprintf(p, sizeof p, "%s/config.json", dirname(tmp));
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) return 0;
    struct stat st;
    char *buf = NULL;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > CONFIG_JSON_MAX) {
        rc = dl_err(DL_EFORMAT, "%s: not a regular file of at most %u bytes", p, CONFIG_JSON_MAX);
        goto out;
    }
    buf = dl_xmalloc((size_t)st.st_size);
    for (size_t got = 0; got < (size_t)st.st_size;) {
        ssize_t k = read(fd, buf + got, (size_t)st.st_size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            rc = dl_err(DL_EIO, "read %s: %s", p, k < 0 ? strerror(errno) : "shorter than its size");
            goto out;
        }
        got += (size_t)k;
    }
    js j = {buf, buf + st.st_size, buf, p};
    if ((rc = js_expect(&j, '{'))) goto out;
    if (js_peek(&j) != '}')
        for (;;) {
            char key[64];
            int trunc;
            if ((rc = js_string(&j, key, sizeof key, &trunc)) || (rc = js_expect(&j, ':'))) goto out;
            if (!trunc && !strcmp(key, "n_head")) {
                uint64_t v;
                if ((rc = js_uint(&j, &v))) goto out;
                if (v < DL_MODEL_HEAD_MIN || v > DL_MODEL_HEAD_MAX) {
                    rc = dl_err(DL_ERANGE, "%s: n_head %llu not in [%d, %d]", p, (unsigned long long)v,
                                DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX);
                    goto out;
                }
                *out = (int64_t)v;
            } else if ((rc = js_skip(&j, 1))) {
                goto out;
            }
            int d = js_peek(&j);
            if (d < 0) {
                rc = js_fail(&j, "unexpected end");
                goto out;
            }
            j.p++;
            if (d == '}') break;
            if (d != ',') {
                rc = js_fail(&j, "expected ',' or '}'");
                goto out;
            }
        }
out:
    free(buf);
    close(fd);
    return rc;
}

static float half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (!m) {
            u = s;
        } else { /* subnormal */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) m <<= 1, e--;
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 127 - 15) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float elem(const unsigned char *p, int dt)
{
    float f;
    if (dt == DT_F32) {
        memcpy(&f, p, 4);
    } else if (dt == DT_BF16) {
        uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
        memcpy(&f, &u, 4);
    } else {
        f = half_to_float((uint16_t)(p[0] | (p[1] << 8)));
    }
    return f;
}

/* Copy a tensor of `rows x cols` (the file's orientation) into dst, as is or
 * transposed (dst is [cols, rows]); refuse a NaN or Inf. */
static int convert(const char *what, const st_entry *e, const unsigned char *data, size_t rows, size_t cols,
                   int transpose, float *dst)
{
    const unsigned char *src = data + e->b;
    size_t n = rows * cols;
    if (e->dtype == DT_F32 && !transpose) memcpy(dst, src, n * 4);
    for (size_t i = 0; i < n; i++) {
        float v = (e->dtype == DT_F32 && !transpose) ? dst[i] : elem(src + i * (size_t)e->esize, e->dtype);
        if (!isfinite(v))
            return dl_err(DL_ERANGE, "%s: tensor '%s' element %zu is %s", what, e->name, i, isnan(v) ? "NaN" : "Inf");
        if (transpose) dst[(i % cols) * rows + i / cols] = v;
        else dst[i] = v;
    }
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    return x->b < y->b ? -1 : x->b > y->b;
}

static void shape_str(const st_entry *e, char *out, size_t cap)
{
    size_t n = 0;
    n += (size_t)snprintf(out + n, cap - n, "[");
    for (int i = 0; i < e->ndim && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%llu", i ? ", " : "", (unsigned long long)e->shape[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

static int mismatch(const char *path, const dl_model_config *f, const dl_model_config *c)
{
    char nh[16];
    if (f->n_head > 0) snprintf(nh, sizeof nh, "%d", f->n_head);
    else snprintf(nh, sizeof nh, "?");
    return dl_err(DL_EMISMATCH, "%s: checkpoint is L=%d NH=%s C=%d V=%d T=%d, this run is L=%d NH=%d C=%d V=%d T=%d",
                  path, f->n_layer, nh, f->n_embd, f->vocab, f->seq_len, c->n_layer, c->n_head, c->n_embd, c->vocab,
                  c->seq_len);
}

static int same_model(const dl_model_config *f, const dl_model_config *c)
{
    return f->n_layer == c->n_layer && f->n_head == c->n_head && f->n_embd == c->n_embd && f->vocab == c->vocab &&
           f->seq_len == c->seq_len;
}

static int read_safetensors(const char *path, const unsigned char *map, uint64_t size, const dl_model_config *cfg,
                            float *params, dl_modelfile_info *info)
{
    if (size < 10) return dl_err(DL_ETRUNC, "%s: %llu bytes: too short for a safetensors file", path, (unsigned long long)size);
    uint64_t N = 0;
    for (int k = 0; k < 8; k++) N |= (uint64_t)map[k] << (8 * k);
    if (N < 2 || N > ST_HEADER_MAX || N > size - 8)
        return dl_err(N > size - 8 && N <= ST_HEADER_MAX ? DL_ETRUNC : DL_EFORMAT,
                      "%s: safetensors header length %llu is not in [2, min(%u, file size %llu - 8)]", path,
                      (unsigned long long)N, ST_HEADER_MAX, (unsigned long long)size);
    if (map[8] != '{') return dl_err(DL_EFORMAT, "%s: not a safetensors file (the header does not start with '{')", path);
    st_header *h = dl_xcalloc(1, sizeof *h);
    h->layer = dl_xcalloc((size_t)DL_MODEL_LAYER_MAX * 12, sizeof(st_entry));
    h->n_head = -1;
    st_entry **all = NULL;
    js j = {(const char *)map + 8, (const char *)map + 8 + N, (const char *)map + 8, path};
    int rc = parse_header(&j, h);
    if (rc) goto out;
    const unsigned char *data = map + 8 + N;
    uint64_t dsize = size - 8 - N;
    int L = h->nlayers;
    if (!h->glob[SLOT_WTE].present || !h->glob[SLOT_WPE].present) {
        rc = dl_err(DL_EFORMAT, "%s: tensor %s missing", path,
                    h->glob[SLOT_WTE].present ? (h->scheme == 2 ? "wpe.weight" : "wpe") : (h->scheme == 2 ? "wte.weight" : "wte"));
        goto out;
    }
    if (!h->glob[SLOT_LNFW].present || !h->glob[SLOT_LNFB].present) {
        rc = dl_err(DL_EFORMAT, "%s: tensor ln_f.%s missing", path, h->glob[SLOT_LNFW].present ? "bias" : "weight");
        goto out;
    }
    if (L < 1) {
        rc = dl_err(DL_EFORMAT, "%s: no transformer layer (h.0.*) in the file", path);
        goto out;
    }
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 12; k++)
            if (!h->layer[l * 12 + k].present) {
                rc = dl_err(DL_EFORMAT, "%s: tensor %sh.%d.%s missing", path, h->scheme == 2 ? "(transformer.)" : "", l,
                            layer_t[k].suffix);
                goto out;
            }
    /* offsets: every entry's [b, e) holds exactly its elements, and the
     * entries tile the data region with no gap and no overlap */
    int nall = 4 + 12 * L + h->nextra;
    all = dl_xcalloc((size_t)nall, sizeof *all);
    int na = 0;
    for (int i = 0; i < 4; i++) all[na++] = &h->glob[i];
    for (int i = 0; i < 12 * L; i++) all[na++] = &h->layer[i];
    for (int i = 0; i < h->nextra; i++) all[na++] = &h->extra[i];
    int mixed = 0, dt0 = all[0]->dtype;
    for (int i = 0; i < na; i++) {
        st_entry *e = all[i];
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] > (1ull << 40) || (e->shape[d] && numel > (1ull << 40) / e->shape[d])) {
                rc = dl_err(DL_ERANGE, "%s: tensor '%s' is implausibly large", path, e->name);
                goto out;
            }
            numel *= e->shape[d];
        }
        if (i < 4 + 12 * L && e->dtype == DT_OTHER) {
            rc = dl_err(DL_EFORMAT, "%s: tensor '%s': dtype not supported (F32, F16, BF16)", path, e->name);
            goto out;
        }
        if (e->b > e->e || e->e > dsize || e->e - e->b != numel * (uint64_t)e->esize) {
            rc = dl_err(DL_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] do not hold its %llu elements of %d bytes "
                        "inside the %llu data bytes", path, e->name, (unsigned long long)e->b, (unsigned long long)e->e,
                        (unsigned long long)numel, e->esize, (unsigned long long)dsize);
            goto out;
        }
        if (i < 4 + 12 * L && e->dtype != dt0) mixed = 1;
    }
    qsort(all, (size_t)na, sizeof *all, cmp_range);
    uint64_t at = 0;
    for (int i = 0; i < na; i++) {
        if (all[i]->b != at) {
            rc = dl_err(DL_EFORMAT, "%s: tensor '%s' starts at data byte %llu, expected %llu (%s)", path, all[i]->name,
                        (unsigned long long)all[i]->b, (unsigned long long)at, all[i]->b < at ? "overlap" : "gap");
            goto out;
        }
        at = all[i]->e;
    }
    if (at != dsize) {
        rc = dl_err(DL_EFORMAT, "%s: the tensors end at data byte %llu but the file has %llu data bytes", path,
                    (unsigned long long)at, (unsigned long long)dsize);
        goto out;
    }
    /* the model the shapes say */
    st_entry *wte = &h->glob[SLOT_WTE], *wpe = &h->glob[SLOT_WPE];
    if (wte->ndim != 2 || wpe->ndim != 2) {
        rc = dl_err(DL_EFORMAT, "%s: wte and wpe must be 2-D", path);
        goto out;
    }
    if (wte->shape[0] > DL_MODEL_VOCAB_MAX || wte->shape[1] > DL_MODEL_EMBD_MAX || wpe->shape[0] > DL_MODEL_SEQ_MAX) {
        rc = dl_err(DL_ERANGE, "%s: wte [%llu, %llu] / wpe [%llu, ...] beyond the model bounds", path,
                    (unsigned long long)wte->shape[0], (unsigned long long)wte->shape[1],
                    (unsigned long long)wpe->shape[0]);
        goto out;
    }
    if (h->n_head < 0 && (rc = config_json_n_head(path, &h->n_head))) goto out;
    dl_model_config fm = {.n_layer = L, .n_head = (int)h->n_head, .n_embd = (int)wte->shape[1],
                          .seq_len = (int)wpe->shape[0], .vocab = (int)wte->shape[0]};
    if (info) {
        info->model = fm;
        snprintf(info->kind, sizeof info->kind, "safetensors (%s names)", h->scheme == 2 ? "hf" : "dloco");
        snprintf(info->dtype, sizeof info->dtype, "%s", mixed ? "mixed" : dt0 == DT_F32 ? "F32" : dt0 == DT_F16 ? "F16" : "BF16");
    }
    if (!same_model(&fm, cfg)) {
        if (fm.n_head < 0 && fm.n_layer == cfg->n_layer && fm.n_embd == cfg->n_embd && fm.vocab == cfg->vocab &&
            fm.seq_len == cfg->seq_len)
            rc = dl_err(DL_EMISMATCH, "%s: the file does not say its n_head (no __metadata__ n_head, no config.json "
                        "beside it); refusing to guess (this run has NH=%d)", path, cfg->n_head);
        else
            rc = mismatch(path, &fm, cfg);
        goto out;
    }
    /* shapes exact, then the floats */
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_xcalloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(cfg, tab, nt, NULL);
    size_t C = (size_t)cfg->n_embd;
    for (int i = 0; i < nt && !rc; i++) {
        st_entry *e;
        size_t rows, cols;
        int matrix = 0;
        if (i == 0) e = wte, rows = (size_t)cfg->vocab, cols = C;
        else if (i == 1) e = wpe, rows = (size_t)cfg->seq_len, cols = C;
        else if (i >= 2 + 12 * L) e = &h->glob[SLOT_LNFW + (i - 2 - 12 * L)], rows = C, cols = 0;
        else {
            int k = (i - 2) % 12;
            e = &h->layer[i - 2];
            rows = (size_t)layer_t[k].rows * C;
            cols = (size_t)layer_t[k].cols * C;
            matrix = layer_t[k].matrix;
        }
        int tr = matrix && h->scheme == 2; /* HF's Conv1D: [in, out] */
        uint64_t want0 = tr ? cols : rows, want1 = tr ? rows : cols;
        int ok = cols ? (e->ndim == 2 && e->shape[0] == want0 && e->shape[1] == want1) : (e->ndim == 1 && e->shape[0] == rows);
        if (!ok) {
            char got[96];
            shape_str(e, got, sizeof got);
            if (cols)
                rc = dl_err(DL_EFORMAT, "%s: tensor '%s' has shape %s, expected [%llu, %llu]", path, e->name, got,
                            (unsigned long long)want0, (unsigned long long)want1);
            else
                rc = dl_err(DL_EFORMAT, "%s: tensor '%s' has shape %s, expected [%zu]", path, e->name, got, rows);
            break;
        }
        if (!cols) cols = 1;
        rc = convert(path, e, data, tr ? cols : rows, tr ? rows : cols, tr, params + tab[i].offset);
        if (!rc && i == 0)
            memset(params + tab[0].offset + (size_t)cfg->vocab * C, 0,
                   (size_t)(cfg->padded_vocab - cfg->vocab) * C * sizeof(float));
    }
    free(tab);
out:
    free(all);
    free(h->layer);
    free(h);
    return rc;
}

static int read_llmc(const char *path, const unsigned char *map, uint64_t size, const dl_model_config *cfg,
                     float *params, dl_modelfile_info *info)
{
    if (size < LLMC_HEADER * 4)
        return dl_err(DL_ETRUNC, "%s: %llu bytes: shorter than llm.c's 1024-byte header", path, (unsigned long long)size);
    int32_t hd[LLMC_HEADER];
    memcpy(hd, map, sizeof hd);
    if (hd[1] != LLMC_VERSION)
        return dl_err(DL_EFORMAT, "%s: llm.c checkpoint version %d, this build reads version %d (fp32, padded vocabulary)",
                      path, hd[1], LLMC_VERSION);
    dl_model_config fm = {.n_layer = hd[4], .n_head = hd[5], .n_embd = hd[6], .seq_len = hd[2], .vocab = hd[3]};
    dl_model_config chk = fm;
    if (dl_model_config_check(&chk))
        return dl_err(DL_ERANGE, "%s: llm.c header maxT=%d V=%d L=%d NH=%d C=%d: %s", path, hd[2], hd[3], hd[4], hd[5],
                      hd[6], dl_errmsg());
    int64_t Vp = hd[7];
    if (Vp < fm.vocab || Vp > (int64_t)fm.vocab + 1048576)
        return dl_err(DL_ERANGE, "%s: llm.c header padded vocabulary %lld is not in [V=%d, V + 2^20]", path, (long long)Vp,
                      fm.vocab);
    uint64_t L = (uint64_t)fm.n_layer, C = (uint64_t)fm.n_embd, T = (uint64_t)fm.seq_len;
    uint64_t nparams = (uint64_t)Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    uint64_t want = LLMC_HEADER * 4 + 4 * nparams;
    if (size != want)
        return dl_err(size < want ? DL_ETRUNC : DL_EFORMAT,
                      "%s: %llu bytes, but its header (L=%d C=%d Vp=%lld T=%d) implies exactly %llu", path,
                      (unsigned long long)size, fm.n_layer, fm.n_embd, (long long)Vp, fm.seq_len, (unsigned long long)want);
    if (info) {
        info->model = fm;
        snprintf(info->kind, sizeof info->kind, "llmc");
        snprintf(info->dtype, sizeof info->dtype, "F32");
    }
    if (!same_model(&fm, cfg)) return mismatch(path, &fm, cfg);
    const float *src = (const float *)(map + LLMC_HEADER * 4); /* page-aligned map + 1024 */
    for (uint64_t i = 0; i < nparams; i++)
        if (!isfinite(src[i])) return dl_err(DL_ERANGE, "%s: parameter %llu is %s", path, (unsigned long long)i, isnan(src[i]) ? "NaN" : "Inf");
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_xcalloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(cfg, tab, nt, NULL);
    const float *p = src;
    memcpy(params + tab[0].offset, p, (size_t)cfg->vocab * C * sizeof(float));
    memset(params + tab[0].offset + (size_t)cfg->vocab * C, 0, (size_t)(cfg->padded_vocab - cfg->vocab) * C * sizeof(float));
    p += (size_t)Vp * C;
    memcpy(params + tab[1].offset, p, (size_t)(T * C) * sizeof(float));
    p += T * C;
    for (int k = 0; k < 12; k++)
        for (uint64_t l = 0; l < L; l++) {
            const dl_tensor *t = &tab[2 + 12 * l + (uint64_t)k];
            memcpy(params + t->offset, p, t->numel * sizeof(float));
            p += t->numel;
        }
    for (int k = 0; k < 2; k++) {
        const dl_tensor *t = &tab[2 + 12 * L + (uint64_t)k];
        memcpy(params + t->offset, p, t->numel * sizeof(float));
        p += t->numel;
    }
    free(tab);
    return 0;
}

int dl_modelfile_read(const char *path_in, const dl_model_config *cfg_in, float *params, dl_modelfile_info *info)
{
    dl_model_config cfg = *cfg_in;
    DL_TRY(dl_model_config_check(&cfg));
    if (info) memset(info, 0, sizeof *info);
    char path[4200];
    struct stat st;
    if (stat(path_in, &st) != 0) return dl_err(DL_EIO, "cannot open %s: %s", path_in, strerror(errno));
    if (S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/model.safetensors", path_in);
    else snprintf(path, sizeof path, "%s", path_in);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) return dl_err(DL_EIO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dl_err(DL_EIO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        close(fd);
        return dl_err(DL_ETRUNC, "%s: %llu bytes: not a model file", path, (unsigned long long)size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return dl_err(DL_EIO, "mmap %s: %s", path, strerror(errno));
    const unsigned char *m = map;
    int32_t magic;
    memcpy(&magic, m, 4);
    int rc = magic == LLMC_MAGIC ? read_llmc(path, m, size, &cfg, params, info)
                                 : read_safetensors(path, m, size, &cfg, params, info);
    munmap(map, (size_t)size);
    return rc;
}
