/* Model files, safetensors: the writer (dloco or Hugging Face names and
 * orientation) and the bounded reader of a hostile header (core/json.h's cursor). */
#include "storage/modelfile_int.h"

#include "core/err.h"
#include "core/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static void meta_kv(dl_json_w *b, const char *k, const char *v)
{
    dl_json_w_raw(b, ",");
    dl_json_w_string(b, k);
    dl_json_w_raw(b, ":");
    dl_json_w_string(b, v);
}

static void meta_int(dl_json_w *b, const char *k, long long v)
{
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    meta_kv(b, k, t);
}

/* Write one safetensors file to the (new) file `path`. */
int dl_modelfile_write_st(const char *path, const dl_model_config *cfg, const float *params,
                             const dl_modelfile_meta *meta, int hf, FILE *progress, const char *label)
{
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    out_tensor *ts = dl_xcalloc((size_t)nt, sizeof *ts);
    model_tensors(cfg, params, hf, ts);
    dl_json_w h = {0};
    dl_json_w_raw(&h, "{\"__metadata__\":{\"format\":\"pt\"");
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
            dl_json_w v = {0};
            uint64_t sum = 0;
            for (uint32_t p = 0; p < meta->n_fragments; p++) {
                dl_json_w_raw(&v, "%s%llu", p ? "," : "", (unsigned long long)meta->versions[p]);
                sum += meta->versions[p];
            }
            meta_kv(&h, "versions", v.buf);
            meta_int(&h, "total_version", (long long)sum);
            dl_json_w_free(&v);
        }
    }
    if (meta && meta->run_id) meta_int(&h, "seed", (long long)meta->seed);
    dl_json_w_raw(&h, "}");
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        dl_json_w_raw(&h, ",");
        dl_json_w_string(&h, ts[i].name);
        dl_json_w_raw(&h, ":{\"dtype\":\"F32\",\"shape\":[%llu", (unsigned long long)ts[i].shape[0]);
        if (ts[i].ndim == 2) dl_json_w_raw(&h, ",%llu", (unsigned long long)ts[i].shape[1]);
        uint64_t bytes = ts[i].pc.n * sizeof(float);
        dl_json_w_raw(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    dl_json_w_raw(&h, "}");
    while ((8 + h.len) % 8) dl_json_w_raw(&h, " "); /* the data starts 8-byte aligned */
    int fd, rc;
    if ((rc = dl_modelfile_create(path, &fd))) goto out;
    writer *w = dl_xmalloc(sizeof *w);
    *w = (writer){.fd = fd, .path = path, .label = label, .total = 8 + h.len + off, .progress = progress};
    w->next_report = w->total / 10;
    uint64_t n = h.len;
    unsigned char le[8];
    for (int k = 0; k < 8; k++) le[k] = (unsigned char)(n >> (8 * k));
    rc = dl_modelfile_w_bytes(w, le, 8);
    if (!rc) rc = dl_modelfile_w_bytes(w, h.buf, h.len);
    for (int i = 0; !rc && i < nt; i++) rc = dl_modelfile_w_piece(w, &ts[i].pc);
    if (!rc) rc = dl_modelfile_w_flush(w);
    free(w);
    if (rc) close(fd);
    else rc = dl_modelfile_finish(fd, path);
out:
    dl_json_w_free(&h);
    free(ts);
    return rc;
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

static int set_scheme(dl_json_cur *j, st_header *h, int s, const char *name)
{
    if (h->scheme && h->scheme != s)
        return dl_err(DL_EFORMAT, "%s: tensor '%s' mixes dloco names and Hugging Face names", j->what, name);
    h->scheme = s;
    return 0;
}

/* Which slot a name is: *slot = the entry to fill, or NULL with an
 * "unknown tensor" refusal. */
static int name_slot(dl_json_cur *j, st_header *h, const char *name, st_entry **slot)
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
static int parse_entry(dl_json_cur *j, st_entry *e, const char *name)
{
    int seen[3] = {0, 0, 0};
    DL_TRY(dl_json_expect(j, '{'));
    if (dl_json_peek(j) == '}') return dl_err(DL_EFORMAT, "%s: tensor '%s' has an empty entry", j->what, name);
    for (;;) {
        char key[32];
        int trunc;
        DL_TRY(dl_json_string(j, key, sizeof key, &trunc));
        DL_TRY(dl_json_expect(j, ':'));
        int k = trunc ? -1 : !strcmp(key, "dtype") ? 0 : !strcmp(key, "shape") ? 1 : !strcmp(key, "data_offsets") ? 2 : -1;
        if (k < 0) return dl_err(DL_EFORMAT, "%s: tensor '%s': unknown field '%s'", j->what, name, key);
        if (seen[k]++) return dl_err(DL_EFORMAT, "%s: tensor '%s': field '%s' twice", j->what, name, key);
        if (k == 0) {
            char dt[16];
            DL_TRY(dl_json_string(j, dt, sizeof dt, &trunc));
            if (trunc || dtype_of(dt, &e->dtype, &e->esize))
                return dl_err(DL_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", j->what, name, dt);
        } else {
            DL_TRY(dl_json_expect(j, '['));
            int n = 0;
            uint64_t v[ST_MAX_DIMS];
            if (dl_json_peek(j) == ']') {
                j->p++;
            } else {
                for (;;) {
                    if (n >= (k == 1 ? ST_MAX_DIMS : 2))
                        return dl_err(DL_EFORMAT, "%s: tensor '%s': %s has too many entries", j->what, name, key);
                    DL_TRY(dl_json_uint(j, &v[n]));
                    n++;
                    int d = dl_json_peek(j);
                    if (d < 0) return dl_json_fail(j, "unexpected end");
                    j->p++;
                    if (d == ']') break;
                    if (d != ',') return dl_json_fail(j, "expected ',' or ']'");
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
        int d = dl_json_peek(j);
        if (d < 0) return dl_json_fail(j, "unexpected end");
        j->p++;
        if (d == '}') break;
        if (d != ',') return dl_json_fail(j, "expected ',' or '}'");
    }
    if (!seen[0] || !seen[1] || !seen[2])
        return dl_err(DL_EFORMAT, "%s: tensor '%s' lacks %s", j->what, name,
                      !seen[0] ? "dtype" : !seen[1] ? "shape" : "data_offsets");
    return 0;
}

static int parse_metadata(dl_json_cur *j, st_header *h)
{
    DL_TRY(dl_json_expect(j, '{'));
    if (dl_json_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[64], val[64];
        int tk, tv;
        DL_TRY(dl_json_string(j, key, sizeof key, &tk));
        DL_TRY(dl_json_expect(j, ':'));
        if (dl_json_peek(j) != '"') return dl_err(DL_EFORMAT, "%s: __metadata__ value of '%s' is not a string", j->what, key);
        DL_TRY(dl_json_string(j, val, sizeof val, &tv));
        if (!tk && !strcmp(key, "n_head")) {
            char *endp;
            long v = strtol(val, &endp, 10);
            if (tv || !val[0] || *endp || v < DL_MODEL_HEAD_MIN || v > DL_MODEL_HEAD_MAX)
                return dl_err(DL_ERANGE, "%s: __metadata__ n_head '%s' is not in [%d, %d]", j->what, val,
                              DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX);
            h->n_head = v;
        }
        int d = dl_json_peek(j);
        if (d < 0) return dl_json_fail(j, "unexpected end");
        j->p++;
        if (d == '}') return 0;
        if (d != ',') return dl_json_fail(j, "expected ',' or '}'");
    }
}

static int parse_header(dl_json_cur *j, st_header *h)
{
    int seen_meta = 0;
    DL_TRY(dl_json_expect(j, '{'));
    if (dl_json_peek(j) == '}') return dl_err(DL_EFORMAT, "%s: the safetensors header holds no tensor", j->what);
    for (;;) {
        char name[NAME_MAX_LEN + 1];
        int trunc;
        DL_TRY(dl_json_string(j, name, sizeof name, &trunc));
        if (trunc) return dl_err(DL_EFORMAT, "%s: tensor name '%s...' longer than %d bytes", j->what, name, NAME_MAX_LEN);
        DL_TRY(dl_json_expect(j, ':'));
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
        int d = dl_json_peek(j);
        if (d < 0) return dl_json_fail(j, "unexpected end");
        j->p++;
        if (d == '}') break;
        if (d != ',') return dl_json_fail(j, "expected ',' or '}'");
    }
    dl_json_ws(j);
    if (j->p != j->end) return dl_err(DL_EFORMAT, "%s: bytes after the JSON header", j->what);
    return 0;
}

float dl_modelfile_f16_to_f32(uint16_t h)
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
        f = dl_modelfile_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
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

int dl_modelfile_read_st(const char *path, const unsigned char *map, uint64_t size, const dl_model_config *cfg,
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
    dl_json_cur j = {(const char *)map + 8, (const char *)map + 8 + N, (const char *)map + 8, path};
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
    if (h->n_head < 0 && (rc = dl_modelfile_hf_n_head(path, &h->n_head))) goto out;
    dl_model_config fm = {.n_layer = L, .n_head = (int)h->n_head, .n_embd = (int)wte->shape[1],
                          .seq_len = (int)wpe->shape[0], .vocab = (int)wte->shape[0]};
    if (info) {
        info->model = fm;
        snprintf(info->kind, sizeof info->kind, "safetensors (%s names)", h->scheme == 2 ? "hf" : "dloco");
        snprintf(info->dtype, sizeof info->dtype, "%s", mixed ? "mixed" : dt0 == DT_F32 ? "F32" : dt0 == DT_F16 ? "F16" : "BF16");
    }
    if (!dl_modelfile_same_model(&fm, cfg)) {
        if (fm.n_head < 0 && fm.n_layer == cfg->n_layer && fm.n_embd == cfg->n_embd && fm.vocab == cfg->vocab &&
            fm.seq_len == cfg->seq_len)
            rc = dl_err(DL_EMISMATCH, "%s: the file does not say its n_head (no __metadata__ n_head, no config.json "
                        "beside it); refusing to guess (this run has NH=%d)", path, cfg->n_head);
        else
            rc = dl_modelfile_mismatch(path, &fm, cfg);
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

