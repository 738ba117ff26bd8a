/* Unit tests of storage/tensorfile.c: a manifest's model written as safetensors and read back bit for bit,
 * its manifest from __metadata__, other dtypes, and every hostile or mismatched file refused by name. */
#include "storage/tensorfile.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/err.h"
#include "core/rng.h"
#include "tests/check.h"

static char dir[256];

static const char *path_of(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* embed [16, 8], q [8, 8], norm [8], conv [4, 2, 3, 3], head [16, 8] */
static dl_manifest *small(int variant)
{
    dl_manifest *m;
    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
    int64_t e[2] = {16, 8}, q[2] = {8, 8}, v[1] = {8}, c[4] = {4, 2, 3, 3}, h[2] = {16, 8};
    REQUIRE(dl_manifest_add(m, "embed.weight", 2, e, DL_TENSOR_EMBED) == 0, "%s", dl_errmsg());
    REQUIRE(dl_manifest_add(m, "layers.0.attn.q.weight", 2, q, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    REQUIRE(dl_manifest_add(m, "layers.0.norm.weight", 1, v, variant == 1 ? DL_TENSOR_MATRIX : DL_TENSOR_VECTOR) == 0,
            "%s", dl_errmsg());
    REQUIRE(dl_manifest_add(m, "conv", 4, c, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    if (variant != 2) REQUIRE(dl_manifest_add(m, "lm_head.weight", 2, h, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    return m;
}

/* A file of the given header text and n data bytes (value i % 251 + 1 ... ). */
static void raw_file(const char *path, const char *header, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "create %s", path);
    uint64_t hl = strlen(header);
    unsigned char l8[8];
    for (int k = 0; k < 8; k++) l8[k] = (unsigned char)(hl >> (8 * k));
    fwrite(l8, 1, 8, f);
    fwrite(header, 1, hl, f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static void expect(int rc, int want, const char *what, const char *needle)
{
    CHECK(rc == want, "%s: rc %d, want %d (%s)", what, rc, want, dl_errmsg());
    CHECK(!needle || strstr(dl_errmsg(), needle), "%s: '%s' lacks '%s'", what, dl_errmsg(), needle);
    printf("  refused %-30s -> %s\n", what, dl_errmsg());
}

static void test_round_trip(void)
{
    dl_manifest *m = small(0);
    size_t n = dl_manifest_numel(m);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    dl_rng r;
    dl_rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++) x[i] = dl_rng_normal(&r);
    x[3] = -0.0f;
    x[4] = 1e-40f; /* a subnormal survives */
    const uint64_t versions[2] = {5, 9};
    dl_tensorfile_meta meta = {.run_id = "run \"x\"", .fingerprint = 0x1234, .n_fragments = 2, .versions = versions};
    const char *p = path_of("a.safetensors");
    REQUIRE(dl_tensorfile_write(p, m, x, &meta, 0, NULL) == 0, "%s", dl_errmsg());
    struct stat st;
    REQUIRE(stat(p, &st) == 0, "written");
    CHECK((uint64_t)st.st_size > n * 4 + 8, "size %lld", (long long)st.st_size);
    /* the data section is the buffer, 8-aligned */
    FILE *f = fopen(p, "rb");
    unsigned char l8[8];
    REQUIRE(fread(l8, 1, 8, f) == 8, "length");
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)l8[k] << (8 * k);
    CHECK((8 + hl) % 8 == 0, "data aligned");
    fclose(f);
    CHECK((uint64_t)st.st_size == 8 + hl + n * 4, "size is header + data");

    dl_manifest *back = NULL;
    REQUIRE(dl_tensorfile_manifest(p, &back) == 0, "%s", dl_errmsg());
    char msg[512];
    CHECK(dl_manifest_diff(m, back, "the file's", msg, sizeof msg) == 0, "manifest from metadata: %s", msg);
    dl_tensorfile_info info;
    memset(y, 0xff, n * sizeof *y);
    REQUIRE(dl_tensorfile_read(p, back, y, &info) == 0, "%s", dl_errmsg());
    CHECK(memcmp(x, y, n * sizeof *x) == 0, "bit for bit");
    CHECK(info.has_manifest == 1 && !strcmp(info.dtype, "F32"), "info %d %s", info.has_manifest, info.dtype);

    /* existing: refused without force, replaced with it */
    expect(dl_tensorfile_write(p, m, x, NULL, 0, NULL), DL_EINVAL, "existing file", "--force");
    x[0] = 42.0f;
    REQUIRE(dl_tensorfile_write(p, m, x, NULL, 1, NULL) == 0, "%s", dl_errmsg());
    REQUIRE(dl_tensorfile_read(p, m, y, NULL) == 0, "%s", dl_errmsg());
    CHECK(y[0] == 42.0f, "forced write replaced it");
    CHECK(access(path_of("a.safetensors.tmp"), F_OK) != 0, "no temporary left");

    /* a file whose manifest differs from the run's: the tensor is named */
    dl_manifest *other = small(1);
    expect(dl_tensorfile_read(p, other, y, NULL), DL_EMISMATCH, "metadata manifest differs",
           "tensor 'layers.0.norm.weight' (2 of 5) has role matrix here, vector in the file's manifest");
    dl_manifest *fewer = small(2);
    expect(dl_tensorfile_read(p, fewer, y, NULL), DL_EMISMATCH, "fewer tensors", "'lm_head.weight' is only there");
    dl_manifest_close(&other);
    dl_manifest_close(&fewer);
    dl_manifest_close(&back);
    free(x);
    free(y);
    dl_manifest_close(&m);
    printf("ok: write -> manifest from __metadata__ -> read, bit for bit; force; differing manifests named\n");
}

/* Files made by hand, as PyTorch's safetensors writes them: no dloco
 * manifest (the run's manifest says what they are), other dtypes. */
static void test_foreign(void)
{
    int64_t s23[2] = {2, 3}, s4[1] = {4};
    dl_manifest *m;
    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
    REQUIRE(dl_manifest_add(m, "w", 2, s23, DL_TENSOR_MATRIX) == 0 && dl_manifest_add(m, "b", 1, s4, DL_TENSOR_VECTOR) == 0,
            "%s", dl_errmsg());
    float w[6] = {1, -2, 3.5f, 0, 1e-3f, -7}, b[4] = {0.5f, 0.25f, -1, 2}, got[10];
    unsigned char data[40];
    memcpy(data, b, 16); /* "b" first in the file: the file's order need not be the manifest's */
    memcpy(data + 16, w, 24);
    const char *p = path_of("torch.safetensors");
    raw_file(p,
             "{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[16,40]},\"__metadata__\":{\"format\":\"pt\"}}",
             data, 40);
    dl_manifest *none = (dl_manifest *)&none;
    expect(dl_tensorfile_manifest(p, &none), DL_ENOTFOUND, "no dloco manifest", "--manifest FILE");
    CHECK(none == NULL, "out reset");
    dl_tensorfile_info info;
    REQUIRE(dl_tensorfile_read(p, m, got, &info) == 0, "%s", dl_errmsg());
    CHECK(memcmp(got, w, 24) == 0 && memcmp(got + 6, b, 16) == 0 && !info.has_manifest, "placed by name");

    /* bf16 and f16 are converted */
    uint16_t bf[6], hf[4];
    const float wv[6] = {1, -2, 0.5f, 0, 256, -0.125f};
    for (int i = 0; i < 6; i++) {
        uint32_t u;
        memcpy(&u, &wv[i], 4);
        bf[i] = (uint16_t)(u >> 16);
    }
    const uint16_t hv[4] = {0x3c00, 0xc000, 0x3800, 0x0001}; /* 1, -2, 0.5, the smallest subnormal */
    memcpy(hf, hv, sizeof hf);
    memcpy(data, bf, 12);
    memcpy(data + 12, hf, 8);
    p = path_of("half.safetensors");
    raw_file(p,
             "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
             "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[12,20]}}",
             data, 20);
    REQUIRE(dl_tensorfile_read(p, m, got, &info) == 0, "%s", dl_errmsg());
    CHECK(memcmp(got, wv, 24) == 0, "bf16 exact");
    CHECK(got[6] == 1 && got[7] == -2 && got[8] == 0.5f && got[9] == ldexpf(1, -24), "f16 %g %g %g %g", got[6], got[7],
          got[8], got[9]);
    CHECK(!strcmp(info.dtype, "mixed"), "dtype %s", info.dtype);
    /* the manifest dloco manifest would print for it: file order, roles guessed */
    dl_manifest *g = NULL;
    int guessed = 0;
    REQUIRE(dl_tensorfile_guess_manifest(path_of("torch.safetensors"), &g, &guessed) == 0, "%s", dl_errmsg());
    CHECK(guessed && dl_manifest_ntensors(g) == 2 && !strcmp(dl_manifest_tensor(g, 0)->name, "b") &&
              dl_manifest_tensor(g, 0)->kind == DL_TENSOR_VECTOR && dl_manifest_tensor(g, 1)->kind == DL_TENSOR_MATRIX,
          "guessed manifest");
    dl_manifest_close(&g);
    raw_file(p,
             "{\"tok_embeddings.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
             "\"h.wpe.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[24,40]}}",
             data, 40);
    REQUIRE(dl_tensorfile_guess_manifest(p, &g, &guessed) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_tensor(g, 0)->kind == DL_TENSOR_EMBED && dl_manifest_tensor(g, 1)->kind == DL_TENSOR_EMBED,
          "embeddings guessed by name");
    dl_manifest_close(&g);
    /* a tensor named "" makes no manifest: refused, the message naming the file (fuzz_manifest found it unnamed) */
    raw_file(p, "{\"\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", data, 24);
    g = (dl_manifest *)&g;
    expect(dl_tensorfile_guess_manifest(p, &g, &guessed), DL_EINVAL, "guess: a tensor without a name", p);
    CHECK(g == NULL && !guessed, "nothing guessed");
    REQUIRE(dl_tensorfile_write(p, m, got, NULL, 1, NULL) == 0, "%s", dl_errmsg());
    REQUIRE(dl_tensorfile_guess_manifest(p, &g, &guessed) == 0, "%s", dl_errmsg());
    CHECK(!guessed && dl_manifest_diff(m, g, "x", NULL, 0) == 0, "a carried manifest is returned as is");
    dl_manifest_close(&g);
    dl_manifest_close(&m);
    printf("ok: a torch-written file without a manifest, in the file's order, bf16 and f16 converted; roles guessed\n");
}

static void test_hostile(void)
{
    printf("hostile files:\n");
    int64_t s23[2] = {2, 3};
    dl_manifest *m;
    REQUIRE(dl_manifest_open(&m) == 0 && dl_manifest_add(m, "w", 2, s23, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    float got[6], ok[6] = {1, 2, 3, 4, 5, 6}, nan6[6] = {1, 2, NAN, 4, 5, 6};
    const char *p = path_of("bad.safetensors");
    static const struct {
        const char *header, *what, *needle;
        int data, rc; /* data bytes from ok[] */
    } cases[] = {
        {"{}", "no tensors", "no tensors", 0, DL_EFORMAT},
        {"[1,2]", "header not an object", "not a JSON object", 0, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}", "JSON cut short", "header", 24,
         DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"I8\",\"shape\":[2,3],\"data_offsets\":[0,6]}}", "dtype I8", "dtype I8", 6, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}}", "transposed shape",
         "'w' has shape [3, 2], the manifest says [2, 3]", 24, DL_EMISMATCH},
        {"{\"v\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", "missing tensor", "no tensor 'w'", 24,
         DL_EMISMATCH},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},\"x\":{\"dtype\":\"F32\",\"shape\":[0],"
         "\"data_offsets\":[24,24]}}",
         "extra tensor", "holds tensor 'x'", 24, DL_EMISMATCH},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", "short offsets", "do not hold", 24,
         DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[4,28]}}", "offsets past the data", "do not hold",
         24, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", "data left over", "cover 24 of 28",
         28, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],"
         "\"data_offsets\":[24,48]}}",
         "duplicate name", "'w' appears twice", 48, DL_EFORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],"
         "\"data_offsets\":[4,28]}}",
         "overlap", "overlap", 28, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"extra\":1}}", "unknown field",
         "unknown field \"extra\"", 24, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,24]}}", "negative dimension", "bad dimension",
         24, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,6],\"data_offsets\":[0,24]}}", "5 dimensions",
         "more than 4 dimensions", 24, DL_EFORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,24]}}",
         "2^80 elements", "implausibly large", 24, DL_ERANGE},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3]}}", "no offsets", "no data_offsets", 24, DL_EFORMAT},
        {"{\"__metadata__\":{\"n\":3},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
         "metadata number", "is not a string", 24, DL_EFORMAT},
        {"{\"__metadata__\":{\"dloco_manifest\":\"{}\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,"
         "24]}}",
         "empty manifest in metadata", "dloco_manifest", 24, DL_EINVAL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unsigned char data[64] = {0};
        memcpy(data, ok, 24);
        raw_file(p, cases[k].header, data, (size_t)cases[k].data);
        expect(dl_tensorfile_read(p, m, got, NULL), cases[k].rc, cases[k].what, cases[k].needle);
    }
    raw_file(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", nan6, 24);
    expect(dl_tensorfile_read(p, m, got, NULL), DL_ERANGE, "NaN weight", "'w' element 2 is NaN");
    /* lengths */
    FILE *f = fopen(p, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    expect(dl_tensorfile_read(p, m, got, NULL), DL_ETRUNC, "3-byte file", "not a safetensors file");
    f = fopen(p, "wb");
    unsigned char l8[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    fwrite(l8, 1, 8, f);
    fwrite("{}", 1, 2, f);
    fclose(f);
    expect(dl_tensorfile_read(p, m, got, NULL), DL_ETRUNC, "header past the end", "header of 65535 bytes");
    f = fopen(p, "wb");
    unsigned char huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    fwrite(huge, 1, 8, f);
    fwrite("{}", 1, 2, f);
    fclose(f);
    expect(dl_tensorfile_read(p, m, got, NULL), DL_EFORMAT, "2^63 header length", "not in [2,");
    raw_file(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", ok, 24);
    f = fopen(p, "r+b");
    fseek(f, 20, SEEK_SET);
    fputc(0, f);
    fclose(f);
    expect(dl_tensorfile_read(p, m, got, NULL), DL_EFORMAT, "NUL in the header", "NUL byte");
    /* a header of millions of values: refused before a tree is built */
    size_t hn = DL_MANIFEST_JSON_VALUES_MAX + 16;
    char *hh = malloc(hn + 1);
    memset(hh, ',', hn);
    hh[0] = '{';
    hh[hn - 1] = '}';
    hh[hn] = 0;
    raw_file(p, hh, NULL, 0);
    free(hh);
    expect(dl_tensorfile_read(p, m, got, NULL), DL_EFORMAT, "4M-value header", "JSON values");
    expect(dl_tensorfile_read(dir, m, got, NULL), DL_EIO, "a directory", "not a regular file");
    expect(dl_tensorfile_read(path_of("absent"), m, got, NULL), DL_EIO, "absent file", "cannot open");
    raw_file(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", ok, 24);
    REQUIRE(dl_tensorfile_read(p, m, got, NULL) == 0, "the good file reads: %s", dl_errmsg());
    CHECK(memcmp(got, ok, 24) == 0, "values");
    dl_manifest_close(&m);
    printf("ok: %zu hostile headers and the length, NaN, NUL and file-type cases refused\n",
           sizeof cases / sizeof cases[0]);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_tensorfile.%d", (int)getpid());
    REQUIRE(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    test_round_trip();
    test_foreign();
    test_hostile();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
    return CHECK_DONE("test_tensorfile");
}
