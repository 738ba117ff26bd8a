/* Model files (storage/modelfile.h): every format round-trips bit for bit,
 * F16/BF16 convert, writes are atomic and refuse to overwrite, and every
 * hostile file (made here by hand from a valid one) gets its own refusal. */
#include "core/err.h"
#include "core/model.h"
#include "core/rng.h"
#include "storage/modelfile.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"

static char dir[256];
static dl_model_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab = 60};
static size_t numel;
static float *ref; /* the model every file holds */

static const char *at(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz + 1);
    REQUIRE(fread(b, 1, (size_t)sz, f) == (size_t)sz, "read %s", path);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void spill(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(p, 1, n, f) == n, "write %s", path);
    fclose(f);
}

/* Read `path` for `c` and expect `code` with `needle` in the detail. */
static void expect(const char *what, const char *path, const dl_model_config *c, int code, const char *needle)
{
    float *buf = malloc(numel * sizeof(float) + 64);
    dl_err_clear();
    int rc = dl_modelfile_read(path, c, buf, NULL);
    printf("hostile %-28s -> %s: %s\n", what, dl_strerror(rc), dl_errmsg());
    CHECK(rc == code, "%s: expected %s, got %s (%s)", what, dl_strerror(code), dl_strerror(rc), dl_errmsg());
    CHECK(strstr(dl_errmsg(), needle) != NULL, "%s: '%s' not in '%s'", what, needle, dl_errmsg());
    free(buf);
}

static void expect_same(const char *what, const char *path)
{
    float *buf = malloc(numel * sizeof(float));
    memset(buf, 0x7f, numel * sizeof(float)); /* padded rows must be set to 0 by the reader */
    dl_modelfile_info info;
    int rc = dl_modelfile_read(path, &cfg, buf, &info);
    CHECK(rc == 0, "%s: read: %s: %s", what, dl_strerror(rc), dl_errmsg());
    CHECK(!memcmp(buf, ref, numel * sizeof(float)), "%s: read back differs from what was written", what);
    CHECK(info.model.n_layer == cfg.n_layer && info.model.n_head == cfg.n_head && info.model.vocab == cfg.vocab,
          "%s: info L=%d NH=%d V=%d", what, info.model.n_layer, info.model.n_head, info.model.vocab);
    printf("round trip %-12s ok (%s, %s)\n", what, info.kind, info.dtype);
    free(buf);
}

/* --- safetensors surgery: header text and data of a valid file */
typedef struct {
    char *json; /* NUL-terminated header text (with its padding spaces) */
    unsigned char *data;
    size_t dlen;
} st_file;

static st_file st_load(const char *path)
{
    size_t n;
    unsigned char *b = slurp(path, &n);
    uint64_t N = 0;
    for (int k = 0; k < 8; k++) N |= (uint64_t)b[k] << (8 * k);
    st_file s = {.json = malloc(N + 1), .data = malloc(n - 8 - N + 8), .dlen = n - 8 - N};
    memcpy(s.json, b + 8, N);
    s.json[N] = 0;
    memcpy(s.data, b + 8 + N, s.dlen);
    free(b);
    return s;
}

/* Write header text `json` (its own length, as is) + data to `name`. */
static const char *st_write(const char *name, const char *json, const unsigned char *data, size_t dlen)
{
    const char *p = at(name);
    size_t N = strlen(json);
    unsigned char *b = malloc(8 + N + dlen);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)N >> (8 * k));
    memcpy(b + 8, json, N);
    memcpy(b + 8 + N, data, dlen);
    spill(p, b, 8 + N + dlen);
    free(b);
    return p;
}

/* json with the first `from` replaced by `to` (must occur). */
static char *subst(const char *json, const char *from, const char *to)
{
    const char *hit = strstr(json, from);
    REQUIRE(hit, "'%s' not in the header", from);
    size_t a = (size_t)(hit - json), lf = strlen(from), lt = strlen(to), n = strlen(json);
    char *o = malloc(n - lf + lt + 1);
    memcpy(o, json, a);
    memcpy(o + a, to, lt);
    memcpy(o + a + lt, hit + lf, n - a - lf + 1);
    return o;
}

/* json without the entry of tensor `name` (",\"name\":{...}") */
static char *cut_entry(const char *json, const char *name)
{
    char key[160];
    snprintf(key, sizeof key, ",\"%s\":{", name);
    const char *hit = strstr(json, key);
    REQUIRE(hit, "%s not in the header", name);
    const char *end = strchr(hit + 1, '}');
    size_t a = (size_t)(hit - json), n = strlen(json);
    char *o = malloc(n + 1);
    memcpy(o, json, a);
    memcpy(o + a, end + 1, n - (size_t)(end + 1 - json) + 1);
    return o;
}

static void hostile_safetensors(void)
{
    st_file s = st_load(at("m.safetensors"));
    char *j;
    /* the header length field */
    {
        size_t n;
        unsigned char *b = slurp(at("m.safetensors"), &n);
        unsigned char *t = malloc(n);
        memcpy(t, b, n);
        uint64_t big = (uint64_t)n; /* past the end of the file */
        for (int k = 0; k < 8; k++) t[k] = (unsigned char)(big >> (8 * k));
        spill(at("h_len_past_end"), t, n);
        expect("header length > file", at("h_len_past_end"), &cfg, DL_ETRUNC, "header length");
        big = 1ull << 62;
        for (int k = 0; k < 8; k++) t[k] = (unsigned char)(big >> (8 * k));
        spill(at("h_len_huge"), t, n);
        expect("header length 2^62", at("h_len_huge"), &cfg, DL_EFORMAT, "header length");
        for (int k = 0; k < 8; k++) t[k] = k == 0 ? 1 : 0;
        spill(at("h_len_1"), t, n);
        expect("header length 1", at("h_len_1"), &cfg, DL_EFORMAT, "header length");
        spill(at("h_7bytes"), t, 7);
        expect("7-byte file", at("h_7bytes"), &cfg, DL_ETRUNC, "not a model file");
        free(t);
        free(b);
    }
    /* JSON */
    j = subst(s.json, "\"dtype\":\"F32\"", "\"dtype\" \"F32\"");
    expect("JSON without ':'", st_write("h_colon", j, s.data, s.dlen), &cfg, DL_EFORMAT, "expected ':'");
    free(j);
    j = strdup(s.json);
    {
        char *last = strrchr(j, '}');
        *last = ' ';
    }
    expect("JSON unterminated", st_write("h_unterm", j, s.data, s.dlen), &cfg, DL_EFORMAT, "bad JSON");
    free(j);
    j = subst(s.json, "\"wpe\":{", "\"wpe\":{\"dtype\":\"F32\",\"dtype\":\"F32\",");
    expect("field twice", st_write("h_field2", j, s.data, s.dlen), &cfg, DL_EFORMAT, "field 'dtype' twice");
    free(j);
    j = subst(s.json, "\"n_head\":\"2\"", "\"n_head\":2");
    expect("metadata not a string", st_write("h_meta_num", j, s.data, s.dlen), &cfg, DL_EFORMAT, "is not a string");
    free(j);
    j = subst(s.json, "\"shape\":[60,16]", "\"shape\":[60,-16]");
    expect("negative dim", st_write("h_negdim", j, s.data, s.dlen), &cfg, DL_EFORMAT, "non-negative integer");
    free(j);
    j = subst(s.json, "\"shape\":[60,16]", "\"shape\":[60,16.0]");
    expect("fractional dim", st_write("h_fracdim", j, s.data, s.dlen), &cfg, DL_EFORMAT, "expected an integer");
    free(j);
    j = subst(s.json, "\"shape\":[60,16]", "\"shape\":[1,1,1,1,1,1,1,1,60,16]");
    expect("ten dims", st_write("h_dims", j, s.data, s.dlen), &cfg, DL_EFORMAT, "too many entries");
    free(j);
    /* names */
    j = subst(s.json, "\"wpe\":", "\"wpe2\":");
    expect("unknown tensor", st_write("h_unknown", j, s.data, s.dlen), &cfg, DL_EFORMAT, "unknown tensor 'wpe2'");
    free(j);
    j = subst(s.json, "\"h.1.ln_1.bias\":", "\"h.1.ln_1.weight\":");
    expect("tensor twice", st_write("h_twice", j, s.data, s.dlen), &cfg, DL_EFORMAT, "'h.1.ln_1.weight' appears twice");
    free(j);
    j = cut_entry(s.json, "h.1.mlp.c_proj.bias");
    expect("tensor missing", st_write("h_missing", j, s.data, s.dlen), &cfg, DL_EFORMAT, "h.1.mlp.c_proj.bias missing");
    free(j);
    j = subst(s.json, "\"wpe\":", "\"transformer.wpe.weight\":");
    expect("mixed names", st_write("h_mixed", j, s.data, s.dlen), &cfg, DL_EFORMAT, "mixes dloco names");
    free(j);
    j = subst(s.json, "\"h.0.ln_1.weight\":", "\"h.00.ln_1.weight\":");
    expect("layer 00", st_write("h_layer00", j, s.data, s.dlen), &cfg, DL_EFORMAT, "unknown tensor 'h.00.ln_1.weight'");
    free(j);
    j = subst(s.json, "\"h.0.ln_1.weight\":", "\"h.999.ln_1.weight\":");
    expect("layer 999", st_write("h_layer999", j, s.data, s.dlen), &cfg, DL_EFORMAT, "layers are h.0");
    free(j);
    /* dtypes */
    j = subst(s.json, "\"dtype\":\"F32\"", "\"dtype\":\"F64\"");
    expect("dtype F64", st_write("h_f64", j, s.data, s.dlen), &cfg, DL_EFORMAT, "dtype not supported");
    free(j);
    j = subst(s.json, "\"dtype\":\"F32\"", "\"dtype\":\"Q4\"");
    expect("dtype Q4", st_write("h_q4", j, s.data, s.dlen), &cfg, DL_EFORMAT, "unknown dtype 'Q4'");
    free(j);
    /* shapes (same element count, so the offsets stay right) */
    j = subst(s.json, "\"h.0.ln_1.weight\":{\"dtype\":\"F32\",\"shape\":[16]", "\"h.0.ln_1.weight\":{\"dtype\":\"F32\",\"shape\":[4,4]");
    expect("shape [4,4] for [16]", st_write("h_shape", j, s.data, s.dlen), &cfg, DL_EFORMAT, "has shape [4, 4], expected [16]");
    free(j);
    j = subst(s.json, "\"h.0.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[48,16]",
              "\"h.0.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[16,48]");
    expect("transposed c_attn", st_write("h_transp", j, s.data, s.dlen), &cfg, DL_EFORMAT, "expected [48, 16]");
    free(j);
    /* offsets: overlap (ln_1.bias onto ln_1.weight, both 16 floats), gap, bounds */
    {
        const char *w = strstr(s.json, "\"h.0.ln_1.weight\"");
        const char *o = strstr(w, "data_offsets\":[");
        unsigned long long b0, e0;
        REQUIRE(sscanf(o, "data_offsets\":[%llu,%llu]", &b0, &e0) == 2, "offsets");
        const char *bb = strstr(s.json, "\"h.0.ln_1.bias\"");
        const char *ob = strstr(bb, "data_offsets\":[");
        unsigned long long b1, e1;
        REQUIRE(sscanf(ob, "data_offsets\":[%llu,%llu]", &b1, &e1) == 2, "offsets");
        char from[96], to[96];
        snprintf(from, sizeof from, "[%llu,%llu]", b1, e1);
        snprintf(to, sizeof to, "[%llu,%llu]", b0, e0);
        j = subst(s.json, from, to);
        expect("overlapping offsets", st_write("h_overlap", j, s.data, s.dlen), &cfg, DL_EFORMAT, "overlap");
        free(j);
        snprintf(to, sizeof to, "[%llu,%llu]", b1 + 1, e1 + 1);
        j = subst(s.json, from, to);
        expect("shifted offsets", st_write("h_shift", j, s.data, s.dlen), &cfg, DL_EFORMAT, "gap");
        free(j);
        snprintf(to, sizeof to, "[%llu,%llu]", b1, e1 + 4);
        j = subst(s.json, from, to);
        expect("offsets != size", st_write("h_size", j, s.data, s.dlen), &cfg, DL_EFORMAT, "do not hold");
        free(j);
        snprintf(to, sizeof to, "[%llu,%llu]", e1, b1);
        j = subst(s.json, from, to);
        expect("end < begin", st_write("h_backw", j, s.data, s.dlen), &cfg, DL_EFORMAT, "do not hold");
        free(j);
    }
    expect("data 4 bytes short", st_write("h_short", s.json, s.data, s.dlen - 4), &cfg, DL_EFORMAT, "do not hold");
    {
        unsigned char *d = malloc(s.dlen + 4);
        memcpy(d, s.data, s.dlen);
        memset(d + s.dlen, 0, 4);
        expect("data 4 bytes long", st_write("h_long", s.json, d, s.dlen + 4), &cfg, DL_EFORMAT, "data bytes");
        /* non-finite weights */
        memcpy(d, s.data, s.dlen);
        float nan = NAN, inf = -INFINITY;
        memcpy(d + 100 * 4, &nan, 4);
        expect("NaN weight", st_write("h_nan", s.json, d, s.dlen), &cfg, DL_ERANGE, "is NaN");
        memcpy(d, s.data, s.dlen);
        memcpy(d + s.dlen - 8, &inf, 4);
        expect("Inf weight", st_write("h_inf", s.json, d, s.dlen), &cfg, DL_ERANGE, "is Inf");
        free(d);
    }
    /* the model: a different one names both shapes; n_head unknown is not guessed */
    dl_model_config other = cfg;
    other.n_layer = 3;
    expect("L mismatch", at("m.safetensors"), &other, DL_EMISMATCH,
           "checkpoint is L=2 NH=2 C=16 V=60 T=8, this run is L=3 NH=2 C=16 V=60 T=8");
    other = cfg;
    other.n_head = 4;
    expect("NH mismatch", at("m.safetensors"), &other, DL_EMISMATCH, "checkpoint is L=2 NH=2 C=16");
    j = subst(s.json, "\"n_head\":\"2\",", "");
    expect("no n_head anywhere", st_write("h_nonh", j, s.data, s.dlen), &cfg, DL_EMISMATCH, "does not say its n_head");
    free(j);
    free(s.json);
    free(s.data);
}

/* json with every `from` replaced by `to`. */
static char *subst_all(const char *json, const char *from, const char *to)
{
    char *cur = strdup(json);
    while (strstr(cur, from)) {
        char *next = subst(cur, from, to);
        free(cur);
        cur = next;
    }
    return cur;
}

/* What HF checkpoints also hold: names without "transformer." (older
 * checkpoints), the causal-mask buffers and the tied head, all accepted. */
static void hf_variants(void)
{
    st_file s = st_load(at("m.hf/model.safetensors"));
    char *j = subst_all(s.json, "\"transformer.", "\"");
    expect_same("hf without the prefix", st_write("hf_noprefix.safetensors", j, s.data, s.dlen));
    free(j);
    /* + lm_head.weight [60, 16] F32 and h.1.attn.bias [1, 1, 8, 8] BOOL after the data */
    size_t head = 60 * 16 * 4, mask = 64;
    char extra[256];
    snprintf(extra, sizeof extra,
             "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[60,16],\"data_offsets\":[%zu,%zu]},"
             "\"transformer.h.1.attn.bias\":{\"dtype\":\"BOOL\",\"shape\":[1,1,8,8],\"data_offsets\":[%zu,%zu]},",
             s.dlen, s.dlen + head, s.dlen + head, s.dlen + head + mask);
    char *j1 = subst(s.json, "{", extra);
    unsigned char *d = calloc(1, s.dlen + head + mask);
    memcpy(d, s.data, s.dlen);
    expect_same("hf with lm_head and attn.bias", st_write("hf_extras.safetensors", j1, d, s.dlen + head + mask));
    free(j1);
    free(d);
    free(s.json);
    free(s.data);
}

static void hostile_hf(void)
{
    /* an HF directory whose config.json is hostile, and one without the metadata n_head */
    st_file s = st_load(at("m.hf/model.safetensors"));
    mkdir(at("hf2"), 0755);
    char *j = subst(s.json, "\"n_head\":\"2\",", "");
    st_write("hf2/model.safetensors", j, s.data, s.dlen);
    free(j);
    char deep[200] = "{\"x\":";
    for (int i = 0; i < 40; i++) strcat(deep, "[");
    spill(at("hf2/config.json"), deep, strlen(deep));
    expect("config.json nested 40 deep", at("hf2"), &cfg, DL_EFORMAT, "nested too deep");
    const char *ok = "{\"model_type\": \"gpt2\", \"task\": {\"a\": [1, 2.5e-3, null, true]}, \"n_head\": 2}";
    spill(at("hf2/config.json"), ok, strlen(ok));
    expect_same("hf n_head from config.json", at("hf2"));
    const char *bad = "{\"n_head\": 0}";
    spill(at("hf2/config.json"), bad, strlen(bad));
    expect("config.json n_head 0", at("hf2"), &cfg, DL_ERANGE, "n_head 0");
    j = subst(s.json, "\"transformer.h.0.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[16,48]",
              "\"transformer.h.0.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[48,16]");
    expect("hf c_attn not transposed", st_write("h_hf_orient", j, s.data, s.dlen), &cfg, DL_EFORMAT, "expected [16, 48]");
    free(j);
    free(s.json);
    free(s.data);
}

static void hostile_llmc(void)
{
    size_t n;
    unsigned char *b = slurp(at("m.bin"), &n);
    unsigned char *t = malloc(n + 4);
    int32_t v;
#define WITH_FIELD(idx, val, name, code, needle)                                                                  \
    do {                                                                                                          \
        memcpy(t, b, n);                                                                                          \
        v = (val);                                                                                                \
        memcpy(t + 4 * (idx), &v, 4);                                                                             \
        spill(at(name), t, n);                                                                                    \
        expect(name, at(name), &cfg, code, needle);                                                               \
    } while (0)
    WITH_FIELD(1, 1, "llmc version 1", DL_EFORMAT, "version 1");
    WITH_FIELD(1, 5, "llmc version 5", DL_EFORMAT, "version 5");
    WITH_FIELD(3, 0, "llmc V 0", DL_ERANGE, "vocab 0");
    WITH_FIELD(4, 100000, "llmc L 100000", DL_ERANGE, "n_layer 100000");
    WITH_FIELD(6, -16, "llmc C -16", DL_ERANGE, "n_embd -16");
    WITH_FIELD(5, 3, "llmc NH 3 (C=16)", DL_ERANGE, "not a multiple");
    WITH_FIELD(7, 59, "llmc Vp < V", DL_ERANGE, "padded vocabulary 59");
    WITH_FIELD(7, 2000000000, "llmc Vp 2e9", DL_ERANGE, "padded vocabulary 2000000000");
    WITH_FIELD(2, 16, "llmc T 16 (size)", DL_ETRUNC, "implies exactly");
#undef WITH_FIELD
    spill(at("llmc short"), b, n - 4);
    expect("llmc 4 bytes short", at("llmc short"), &cfg, DL_ETRUNC, "implies exactly");
    memcpy(t, b, n);
    memset(t + n, 0, 4);
    spill(at("llmc long"), t, n + 4);
    expect("llmc 4 bytes long", at("llmc long"), &cfg, DL_EFORMAT, "implies exactly");
    spill(at("llmc header only"), b, 1000);
    expect("llmc 1000 bytes", at("llmc header only"), &cfg, DL_ETRUNC, "1024-byte header");
    memcpy(t, b, n);
    float nan = NAN;
    memcpy(t + n - 4, &nan, 4);
    spill(at("llmc nan"), t, n);
    expect("llmc NaN", at("llmc nan"), &cfg, DL_ERANGE, "is NaN");
    dl_model_config other = cfg;
    other.vocab = 61;
    dl_model_config_check(&other);
    expect("llmc V mismatch", at("m.bin"), &other, DL_EMISMATCH,
           "checkpoint is L=2 NH=2 C=16 V=60 T=8, this run is L=2 NH=2 C=16 V=61 T=8");
    free(t);
    free(b);
}

static uint16_t to_half(float f) /* exact for the values used below */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = u >> 31, e = (u >> 23) & 0xff, m = u & 0x7fffff;
    if (!e && !m) return (uint16_t)(s << 15);
    return (uint16_t)((s << 15) | ((e - 127 + 15) << 10) | (m >> 13));
}

/* F16 and BF16 files (as HF saves half models): values exact in both convert exactly. */
static void half_dtypes(void)
{
    for (size_t i = 0; i < numel; i++) ref[i] = (float)((int)(i % 37) - 18) / 8.0f; /* k/8: exact in F16 and BF16 */
    int nt = dl_model_tensor_table(&cfg, NULL, 0, NULL);
    dl_tensor *tab = calloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(&cfg, tab, nt, NULL);
    for (size_t i = (size_t)cfg.vocab * cfg.n_embd; i < tab[1].offset; i++) ref[i] = 0; /* padded wte rows */
    REQUIRE(dl_modelfile_write(at("q.safetensors"), DL_MODELFILE_SAFETENSORS, &cfg, ref, NULL, 0, NULL) == 0, "%s",
            dl_errmsg());
    st_file s = st_load(at("q.safetensors"));
    for (int bf = 0; bf < 2; bf++) {
        /* every "F32" -> "F16"/"BF16", offsets halved: rebuild the header from the table */
        char *json = malloc(strlen(s.json) + 16 * (size_t)nt + 64);
        unsigned char *d = malloc(s.dlen / 2);
        const char *src = s.json;
        char *o = json;
        size_t at_out = 0;
        const float *f = (const float *)s.data;
        const char *dt = bf ? "BF16" : "F16";
        while (*src) {
            if (!strncmp(src, "\"dtype\":\"F32\"", 13)) {
                o += sprintf(o, "\"dtype\":\"%s\"", dt);
                src += 13;
            } else if (!strncmp(src, "\"data_offsets\":[", 16)) {
                unsigned long long b0, e0;
                int used;
                sscanf(src, "\"data_offsets\":[%llu,%llu]%n", &b0, &e0, &used);
                o += sprintf(o, "\"data_offsets\":[%llu,%llu]", b0 / 2, e0 / 2);
                src += used;
                for (unsigned long long k = b0 / 4; k < e0 / 4; k++) {
                    uint16_t h;
                    if (bf) {
                        uint32_t u;
                        memcpy(&u, &f[k], 4);
                        h = (uint16_t)(u >> 16);
                    } else {
                        h = to_half(f[k]);
                    }
                    d[at_out++] = (unsigned char)h;
                    d[at_out++] = (unsigned char)(h >> 8);
                }
            } else {
                *o++ = *src++;
            }
        }
        *o = 0;
        char name[32];
        snprintf(name, sizeof name, "%s.safetensors", dt);
        const char *p = st_write(name, json, d, at_out);
        CHECK(at_out == s.dlen / 2, "%s data %zu", dt, at_out);
        expect_same(dt, p);
        free(json);
        free(d);
    }
    free(s.json);
    free(s.data);
    free(tab);
}

static void writes(void)
{
    /* refuse to overwrite, then replace with force; hf over a directory */
    dl_err_clear();
    int rc = dl_modelfile_write(at("m.safetensors"), DL_MODELFILE_SAFETENSORS, &cfg, ref, NULL, 0, NULL);
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), "exists"), "overwrite refused: %s %s", dl_strerror(rc), dl_errmsg());
    rc = dl_modelfile_write(at("m.hf"), DL_MODELFILE_HF, &cfg, ref, NULL, 0, NULL);
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), "exists"), "hf overwrite refused: %s", dl_errmsg());
    ref[5] += 1.0f;
    rc = dl_modelfile_write(at("m.safetensors"), DL_MODELFILE_SAFETENSORS, &cfg, ref, NULL, 1, NULL);
    CHECK(rc == 0, "force: %s", dl_errmsg());
    expect_same("forced file", at("m.safetensors"));
    rc = dl_modelfile_write(at("m.hf"), DL_MODELFILE_HF, &cfg, ref, NULL, 1, NULL);
    CHECK(rc == 0, "hf force: %s", dl_errmsg());
    expect_same("forced hf dir", at("m.hf"));
    ref[5] -= 1.0f;
    rc = dl_modelfile_write(at("m.safetensors"), DL_MODELFILE_SAFETENSORS, &cfg, ref, NULL, 1, NULL);
    rc |= dl_modelfile_write(at("m.hf"), DL_MODELFILE_HF, &cfg, ref, NULL, 1, NULL);
    CHECK(rc == 0, "rewrite");
    /* no temp file left behind */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", at("m.hf"), (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", at("m.safetensors"), (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);
    /* a directory that does not exist: nothing written, an I/O error */
    rc = dl_modelfile_write(at("no/such/dir/x.bin"), DL_MODELFILE_LLMC, &cfg, ref, NULL, 0, NULL);
    CHECK(rc == DL_EIO, "missing directory: %s", dl_strerror(rc));
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dloco_test_import.XXXXXX");
    REQUIRE(mkdtemp(dir), "mkdtemp");
    REQUIRE(dl_model_config_check(&cfg) == 0, "config");
    dl_model_tensor_table(&cfg, NULL, 0, &numel);
    ref = malloc(numel * sizeof(float));
    REQUIRE(dl_model_init_params(&cfg, 7, ref) == 0, "init");
    /* non-trivial biases and layernorms, so a transposed or misplaced tensor shows */
    int nt = dl_model_tensor_table(&cfg, NULL, 0, NULL);
    dl_tensor *tab = calloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(&cfg, tab, nt, NULL);
    dl_rng r;
    dl_rng_seed(&r, 3);
    for (int i = 1; i < nt; i++)
        for (size_t k = 0; k < tab[i].numel; k++) ref[tab[i].offset + k] += 0.1f * dl_rng_normal(&r);
    free(tab);
    CHECK(cfg.padded_vocab == 64, "dloco pads V=60 to 64 (llm.c to 128)");

    dl_modelfile_meta meta = {.run_id = "test-run", .fingerprint = 0x1234, .n_fragments = 2,
                              .versions = (const uint64_t[]){3, 4}, .seed = 9};
    for (int f = 0; f < 3; f++) {
        const char *name = f == DL_MODELFILE_SAFETENSORS ? "m.safetensors" : f == DL_MODELFILE_HF ? "m.hf" : "m.bin";
        int rc = dl_modelfile_write(at(name), f, &cfg, ref, &meta, 0, NULL);
        REQUIRE(rc == 0, "write %s: %s", name, dl_errmsg());
        expect_same(dl_modelfile_format_name(f), at(name));
    }
    expect_same("hf model.safetensors", at("m.hf/model.safetensors"));
    {
        size_t n;
        unsigned char *b = slurp(at("m.bin"), &n);
        int32_t h[8];
        memcpy(h, b, sizeof h);
        CHECK(h[0] == 20240326 && h[1] == 3 && h[2] == 8 && h[3] == 60 && h[4] == 2 && h[5] == 2 && h[6] == 16 &&
                  h[7] == 128,
              "llmc header %d %d %d %d %d %d %d %d", h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
        CHECK_EQ(n, 1024 + 4 * (128 * 16 + 8 * 16 + 2 * (12 * 16 * 16 + 13 * 16) + 2 * 16));
        free(b);
        st_file s = st_load(at("m.safetensors"));
        CHECK((8 + strlen(s.json)) % 8 == 0, "data 8-byte aligned");
        CHECK(strstr(s.json, "\"run_id\":\"test-run\"") && strstr(s.json, "\"versions\":\"3,4\""), "metadata: %.300s",
              s.json);
        free(s.json);
        free(s.data);
    }
    hostile_safetensors();
    hostile_hf();
    hf_variants();
    hostile_llmc();
    writes();
    half_dtypes();

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    free(ref);
    return CHECK_DONE("test_import");
}
