/* Safetensors files of a manifest's model (see tensorfile.h): the atomic writer, and the reader that
 * checks every length, offset, name, shape and float of the file before a weight is used. */
#define _GNU_SOURCE /* renameat2 */
#include "storage/tensorfile.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/err.h"
#include "core/json.h"
#include "storage/modelfile.h"

#define HEADER_MAX (100ull << 20) /* bytes of JSON header we parse at most */
#define META_KEY "dloco_manifest"

/* ---------------------------------------------------------------- text buffer */

typedef struct {
    char *b;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_grow(sbuf *s, size_t need)
{
    if (s->oom || s->n + need < s->cap) return;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap <= s->n + need) cap *= 2;
    char *b = dl_try_realloc(s->b, cap);
    if (!b) {
        s->oom = 1;
        return;
    }
    s->b = b;
    s->cap = cap;
}

static void sb_add(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
        s->oom = 1;
        return;
    }
    sb_grow(s, (size_t)k + 1);
    if (s->oom) return;
    va_start(ap, fmt);
    vsnprintf(s->b + s->n, s->cap - s->n, fmt, ap);
    va_end(ap);
    s->n += (size_t)k;
}

/* A JSON string of s: quote, backslash and control bytes escaped. */
static void sb_str(sbuf *s, const char *str)
{
    sb_add(s, "\"");
    for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
        if (*p == '"' || *p == '\\') sb_add(s, "\\%c", *p);
        else if (*p == '\n') sb_add(s, "\\n");
        else if (*p < 0x20) sb_add(s, "\\u%04x", *p);
        else sb_add(s, "%c", *p);
    }
    sb_add(s, "\"");
}

/* ---------------------------------------------------------------- writing */

static int write_all(int fd, const char *path, const void *data, size_t n, uint64_t *done, uint64_t total,
                     FILE *progress)
{
    const char *p = data;
    uint64_t next = total / 10;
    while (n) {
        size_t k = n < (8u << 20) ? n : (8u << 20);
        ssize_t w = write(fd, p, k);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return dl_err(DL_EIO, "write %s: %s", path, w < 0 ? strerror(errno) : "short write");
        p += w;
        n -= (size_t)w;
        *done += (uint64_t)w;
        if (progress && total > (64u << 20) && *done >= next) {
            fprintf(progress, "export: %s %.0f%% (%.1f of %.1f MB)\n", path, 100.0 * (double)*done / (double)total,
                    (double)*done / 1e6, (double)total / 1e6);
            fflush(progress);
            next += total / 10;
        }
    }
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

/* The header: __metadata__ first, then the tensors in manifest order, padded
 * with spaces so the data starts 8-byte aligned. */
static int build_header(const dl_manifest *m, const dl_tensorfile_meta *meta, sbuf *h)
{
    char *mj;
    DL_TRY(dl_manifest_to_json(m, &mj, NULL));
    sb_add(h, "{\"__metadata__\":{\"format\":\"pt\",\"" META_KEY "\":");
    sb_str(h, mj);
    free(mj);
    if (meta && meta->run_id) {
        sb_add(h, ",\"run_id\":");
        sb_str(h, meta->run_id);
    }
    if (meta && meta->fingerprint) sb_add(h, ",\"fingerprint\":\"%016llx\"", (unsigned long long)meta->fingerprint);
    if (meta && meta->n_fragments) {
        sb_add(h, ",\"fragments\":\"%u\"", meta->n_fragments);
        if (meta->versions) {
            sb_add(h, ",\"versions\":\"");
            for (uint32_t p = 0; p < meta->n_fragments; p++)
                sb_add(h, "%s%llu", p ? "," : "", (unsigned long long)meta->versions[p]);
            sb_add(h, "\"");
        }
    }
    sb_add(h, "}");
    for (int i = 0; i < dl_manifest_ntensors(m); i++) {
        const dl_tensor *t = dl_manifest_tensor(m, i);
        sb_add(h, ",");
        sb_str(h, t->name);
        sb_add(h, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) sb_add(h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        sb_add(h, "],\"data_offsets\":[%zu,%zu]}", t->offset * 4, (t->offset + t->numel) * 4);
    }
    sb_add(h, "}");
    while (!h->oom && (8 + h->n) % 8) sb_add(h, " ");
    if (h->oom) return dl_err(DL_ENOMEM, "export: out of memory for the header of %d tensors", dl_manifest_ntensors(m));
    return 0;
}

static int write_file(const char *tmp, const char *label, const dl_manifest *m, const float *params,
                      const dl_tensorfile_meta *meta, FILE *progress)
{
    sbuf h = {0};
    int rc = build_header(m, meta, &h);
    if (rc) {
        free(h.b);
        return rc;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(h.b);
        return dl_err(DL_EIO, "cannot create %s: %s", tmp, strerror(errno));
    }
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)h.n >> (8 * k));
    uint64_t done = 0, total = 8 + h.n + (uint64_t)dl_manifest_numel(m) * 4;
    rc = write_all(fd, label, len8, 8, &done, total, progress);
    if (!rc) rc = write_all(fd, label, h.b, h.n, &done, total, progress);
    /* the manifest's buffer layout is the file's data section: tensors back
     * to back in declaration order, fp32 little-endian (the host's) */
    if (!rc) rc = write_all(fd, label, params, dl_manifest_numel(m) * 4, &done, total, progress);
    free(h.b);
    if (!rc && fsync(fd) != 0) rc = dl_err(DL_EIO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !rc) rc = dl_err(DL_EIO, "close %s: %s", tmp, strerror(errno));
    return rc;
}

int dl_tensorfile_write(const char *path, const dl_manifest *m, const float *params, const dl_tensorfile_meta *meta,
                        int force, FILE *progress)
{
    DL_TRY(dl_manifest_check(m));
    struct stat st;
    int exists = lstat(path, &st) == 0;
    if (exists && !force) return dl_err(DL_EINVAL, "%s exists (use --force to replace it)", path);
    if (exists && S_ISDIR(st.st_mode)) return dl_err(DL_EINVAL, "%s is a directory", path);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return dl_err(DL_EINVAL, "path too long: %s", path);
    unlink(tmp); /* a crashed earlier writer of this pid's (pids are unique among the living) */
    int rc = write_file(tmp, path, m, params, meta, progress);
    if (rc) {
        unlink(tmp);
        return rc;
    }
    int e = 0;
    if (!exists) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0) e = errno;
        if ((e == EINVAL || e == ENOSYS) && lstat(path, &st) != 0) e = rename(tmp, path) == 0 ? 0 : errno;
    } else if (rename(tmp, path) != 0) {
        e = errno;
    }
    if (e) {
        unlink(tmp);
        if (e == EEXIST) return dl_err(DL_EINVAL, "%s exists (use --force to replace it)", path);
        return dl_err(DL_EIO, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    fsync_dir_of(path);
    return 0;
}

/* ---------------------------------------------------------------- reading */

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

typedef struct {
    const char *name; /* the JSON key, owned by the tree */
    int dtype, esize, ndim;
    int64_t shape[DL_TENSOR_NDIM_MAX];
    uint64_t b, e; /* data_offsets, bytes into the data section */
} entry;

typedef struct {
    const char *path;
    void *map;
    uint64_t size;
    dl_json *root;
    const dl_json *meta; /* __metadata__ or NULL */
    entry *e;            /* [n] */
    int n;
    const unsigned char *data;
    uint64_t data_len;
} stfile;

static void st_close(stfile *f)
{
    dl_json_free(&f->root);
    free(f->e);
    if (f->map) munmap(f->map, (size_t)f->size);
    memset(f, 0, sizeof *f);
}

static int st_map(stfile *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) return dl_err(DL_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dl_err(DL_EIO, "%s: not a regular file", path);
    }
    f->size = (uint64_t)st.st_size;
    if (f->size < 8) {
        close(fd);
        return dl_err(DL_ETRUNC, "%s: %llu bytes: not a safetensors file", path, (unsigned long long)f->size);
    }
    f->map = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return dl_err(DL_EIO, "mmap %s: %s", path, strerror(errno));
    }
    return 0;
}

static int json_uint(const dl_json *v, uint64_t *out)
{
    if (!v || v->type != DL_JSON_NUM || !isfinite(v->num) || v->num < 0 || v->num > 9007199254740992.0 ||
        v->num != floor(v->num))
        return -1;
    *out = (uint64_t)v->num;
    return 0;
}

static int parse_entry(stfile *f, const dl_json *v, entry *e)
{
    const char *nm = v->key;
    if (v->type != DL_JSON_OBJ) return dl_err(DL_EFORMAT, "%s: tensor '%s' is not an object", f->path, nm);
    const char *dt = dl_json_str(v, "dtype", NULL);
    if (!dt) return dl_err(DL_EFORMAT, "%s: tensor '%s' has no dtype", f->path, nm);
    if (!strcmp(dt, "F32")) e->dtype = DT_F32, e->esize = 4;
    else if (!strcmp(dt, "F16")) e->dtype = DT_F16, e->esize = 2;
    else if (!strcmp(dt, "BF16")) e->dtype = DT_BF16, e->esize = 2;
    else return dl_err(DL_EFORMAT, "%s: tensor '%s': dtype %s not supported (F32, F16, BF16)", f->path, nm, dt);
    const dl_json *sh = dl_json_get(v, "shape"), *off = dl_json_get(v, "data_offsets");
    if (!sh || sh->type != DL_JSON_ARR) return dl_err(DL_EFORMAT, "%s: tensor '%s' has no shape", f->path, nm);
    uint64_t numel = 1;
    for (const dl_json *d = sh->child; d; d = d->next) {
        uint64_t x;
        if (e->ndim >= DL_TENSOR_NDIM_MAX)
            return dl_err(DL_EFORMAT, "%s: tensor '%s' has more than %d dimensions", f->path, nm, DL_TENSOR_NDIM_MAX);
        if (json_uint(d, &x) || x > DL_MANIFEST_NUMEL_MAX)
            return dl_err(DL_EFORMAT, "%s: tensor '%s' has a bad dimension", f->path, nm);
        if (x && numel > DL_MANIFEST_NUMEL_MAX / x)
            return dl_err(DL_ERANGE, "%s: tensor '%s' is implausibly large", f->path, nm);
        numel *= x;
        e->shape[e->ndim++] = (int64_t)x;
    }
    uint64_t b, en;
    if (!off || off->type != DL_JSON_ARR || !off->child || !off->child->next || off->child->next->next ||
        json_uint(off->child, &b) || json_uint(off->child->next, &en))
        return dl_err(DL_EFORMAT, "%s: tensor '%s' has no data_offsets [begin, end]", f->path, nm);
    for (const dl_json *k = v->child; k; k = k->next)
        if (strcmp(k->key, "dtype") && strcmp(k->key, "shape") && strcmp(k->key, "data_offsets"))
            return dl_err(DL_EFORMAT, "%s: tensor '%s' has an unknown field \"%s\"", f->path, nm, k->key);
    if (b > en || en > f->data_len || en - b != numel * (uint64_t)e->esize)
        return dl_err(DL_EFORMAT,
                      "%s: tensor '%s': data_offsets [%llu, %llu] do not hold %llu elements of %s inside the %llu "
                      "data bytes",
                      f->path, nm, (unsigned long long)b, (unsigned long long)en, (unsigned long long)numel, dt,
                      (unsigned long long)f->data_len);
    e->name = nm;
    e->b = b;
    e->e = en;
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return (x->b > y->b) - (x->b < y->b);
}

static int cmp_name(const void *a, const void *b) { return strcmp(((const entry *)a)->name, ((const entry *)b)->name); }

/* Map and parse the file: header bounds, JSON, metadata strings, every
 * entry, names unique, data covered exactly. Entries end sorted by name. */
static int st_open(stfile *f, const char *path)
{
    DL_TRY(st_map(f, path));
    const unsigned char *m = f->map;
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)m[k] << (8 * k);
    uint64_t lim = f->size - 8 < HEADER_MAX ? f->size - 8 : HEADER_MAX;
    if (hl < 2 || hl > lim) {
        if (hl > f->size - 8 && hl <= HEADER_MAX)
            return dl_err(DL_ETRUNC, "%s: header of %llu bytes, the file has %llu after the length", path,
                          (unsigned long long)hl, (unsigned long long)(f->size - 8));
        return dl_err(DL_EFORMAT, "%s: header length %llu not in [2, %llu]: not a safetensors file", path,
                      (unsigned long long)hl, (unsigned long long)lim);
    }
    if (memchr(m + 8, '\0', (size_t)hl))
        return dl_err(DL_EFORMAT, "%s: the header holds a NUL byte", path);
    f->data = m + 8 + hl;
    f->data_len = f->size - 8 - hl;
    /* the tree is allocated: bound what it can hold first */
    DL_TRY(dl_manifest_json_bounded((const char *)m + 8, (size_t)hl, path));
    int rc = dl_json_parse((const char *)m + 8, (size_t)hl, &f->root);
    if (rc) return dl_err(rc, "%s: header: %s", path, dl_errmsg());
    if (f->root->type != DL_JSON_OBJ) return dl_err(DL_EFORMAT, "%s: the header is not a JSON object", path);
    int n = 0;
    for (const dl_json *v = f->root->child; v; v = v->next) {
        if (!strcmp(v->key, "__metadata__")) {
            if (f->meta) return dl_err(DL_EFORMAT, "%s: two __metadata__", path);
            if (v->type != DL_JSON_OBJ) return dl_err(DL_EFORMAT, "%s: __metadata__ is not an object", path);
            for (const dl_json *k = v->child; k; k = k->next)
                if (k->type != DL_JSON_STR)
                    return dl_err(DL_EFORMAT, "%s: __metadata__ value \"%s\" is not a string", path, k->key);
            f->meta = v;
            continue;
        }
        n++;
    }
    if (n == 0) return dl_err(DL_EFORMAT, "%s: no tensors", path);
    f->e = dl_try_calloc((size_t)n, sizeof *f->e);
    if (!f->e) return dl_err(DL_ENOMEM, "%s: out of memory for %d tensors", path, n);
    for (const dl_json *v = f->root->child; v; v = v->next) {
        if (v == f->meta) continue;
        DL_TRY(parse_entry(f, v, &f->e[f->n]));
        f->n++;
    }
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        if (f->e[i].b != at)
            return dl_err(DL_EFORMAT, "%s: tensor '%s' starts at data byte %llu, expected %llu (%s)", path,
                          f->e[i].name, (unsigned long long)f->e[i].b, (unsigned long long)at,
                          f->e[i].b < at ? "overlap" : "gap");
        at = f->e[i].e;
    }
    if (at != f->data_len)
        return dl_err(DL_EFORMAT, "%s: the tensors cover %llu of %llu data bytes", path, (unsigned long long)at,
                      (unsigned long long)f->data_len);
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_name);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->e[i - 1].name, f->e[i].name))
            return dl_err(DL_EFORMAT, "%s: tensor '%s' appears twice", path, f->e[i].name);
    return 0;
}

static int st_manifest(stfile *f, dl_manifest **out)
{
    *out = NULL;
    const char *mj = f->meta ? dl_json_str(f->meta, META_KEY, NULL) : NULL;
    if (!mj)
        return dl_err(DL_ENOTFOUND,
                      "%s carries no dloco manifest (__metadata__ \"" META_KEY
                      "\"): give the manifest with --manifest FILE (dloco manifest %s writes one with guessed roles "
                      "to check), or write the file with the manifest in its metadata (docs/OPERATING.md \"Manifest "
                      "runs\")",
                      f->path, f->path);
    /* DL_EINVAL whatever the reason: the file is a safetensors file, its
     * manifest is what is wrong (DL_EFORMAT says "not a safetensors file") */
    int rc = dl_manifest_from_json(mj, strlen(mj), out);
    if (rc) return dl_err(DL_EINVAL, "%s: __metadata__ " META_KEY ": %s", f->path, dl_errmsg());
    return 0;
}

int dl_tensorfile_manifest(const char *path, dl_manifest **out)
{
    *out = NULL;
    stfile f;
    int rc = st_open(&f, path);
    if (!rc) rc = st_manifest(&f, out);
    st_close(&f);
    return rc;
}

static int guess_role(const entry *e)
{
    if (e->ndim == 1) return DL_TENSOR_VECTOR;
    const char *n = e->name;
    size_t l = strlen(n);
    int ends = (l >= 11 && (!strcmp(n + l - 11, ".wte.weight") || !strcmp(n + l - 11, ".wpe.weight")));
    if (e->ndim == 2 && (strstr(n, "embed") || !strcmp(n, "wte") || !strcmp(n, "wpe") || ends)) return DL_TENSOR_EMBED;
    return DL_TENSOR_MATRIX;
}

int dl_tensorfile_guess_manifest(const char *path, dl_manifest **out, int *guessed)
{
    *out = NULL;
    *guessed = 0;
    stfile f;
    int rc = st_open(&f, path);
    if (!rc) {
        rc = st_manifest(&f, out);
        if (rc == DL_ENOTFOUND) {
            /* the data order is the order a buffer of the file would have */
            qsort(f.e, (size_t)f.n, sizeof *f.e, cmp_begin);
            rc = dl_manifest_open(out);
            for (int i = 0; !rc && i < f.n; i++)
                rc = dl_manifest_add(*out, f.e[i].name, f.e[i].ndim, f.e[i].shape, guess_role(&f.e[i]));
            if (!rc) rc = dl_manifest_check(*out);
            if (rc) {
                rc = dl_err(rc, "%s: its tensors make no manifest: %s", path, dl_errmsg());
                dl_manifest_close(out);
            } else {
                *guessed = 1;
            }
        }
    }
    st_close(&f);
    return rc;
}

static int convert(const stfile *f, const entry *e, float *dst, size_t n)
{
    const unsigned char *src = f->data + e->b;
    if (e->dtype == DT_F32) memcpy(dst, src, n * 4);
    for (size_t i = 0; i < n; i++) {
        float v;
        if (e->dtype == DT_F32) {
            v = dst[i];
        } else if (e->dtype == DT_BF16) {
            uint32_t u = (uint32_t)(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
            memcpy(&v, &u, 4);
        } else {
            v = dl_modelfile_f16_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        }
        if (!isfinite(v))
            return dl_err(DL_ERANGE, "%s: tensor '%s' element %zu is %s", f->path, e->name, i, isnan(v) ? "NaN" : "Inf");
        dst[i] = v;
    }
    return 0;
}

static int shape_eq(const entry *e, const dl_tensor *t)
{
    if (e->ndim != t->ndim) return 0;
    for (int d = 0; d < t->ndim; d++)
        if (e->shape[d] != t->shape[d]) return 0;
    return 1;
}

static void entry_shape(const entry *e, char *buf, size_t cap)
{
    dl_tensor t = {.ndim = e->ndim};
    memcpy(t.shape, e->shape, sizeof t.shape);
    dl_manifest_shape_str(&t, buf, cap);
}

int dl_tensorfile_read(const char *path, const dl_manifest *m, float *params, dl_tensorfile_info *info)
{
    if (info) memset(info, 0, sizeof *info);
    DL_TRY(dl_manifest_check(m));
    stfile f;
    int rc = st_open(&f, path);
    dl_manifest *fm = NULL;
    if (!rc) {
        rc = st_manifest(&f, &fm);
        if (rc == DL_ENOTFOUND) rc = 0; /* m alone says what the tensors are */
    }
    if (!rc && fm) {
        char msg[512];
        int nd = dl_manifest_diff(m, fm, "the file's manifest", msg, sizeof msg);
        if (nd) rc = dl_err(DL_EMISMATCH, "%s: %d tensor%s from the run's manifest; first: %s", path, nd,
                            nd == 1 ? " differs" : "s differ", msg);
        if (info) info->has_manifest = 1;
    }
    int dts = 0;
    unsigned char *used = rc ? NULL : dl_try_calloc((size_t)f.n, 1);
    if (!rc && !used) rc = dl_err(DL_ENOMEM, "%s: out of memory", path);
    for (int i = 0; !rc && i < dl_manifest_ntensors(m); i++) {
        const dl_tensor *t = dl_manifest_tensor(m, i);
        entry key = {.name = t->name};
        const entry *e = bsearch(&key, f.e, (size_t)f.n, sizeof *f.e, cmp_name);
        char s1[128], s2[128];
        if (!e) {
            rc = dl_err(DL_EMISMATCH, "%s has no tensor '%s' (%s in the manifest)", path, t->name,
                        dl_manifest_shape_str(t, s1, sizeof s1));
            break;
        }
        if (!shape_eq(e, t)) {
            entry_shape(e, s1, sizeof s1);
            rc = dl_err(DL_EMISMATCH, "%s: tensor '%s' has shape %s, the manifest says %s", path, t->name, s1,
                        dl_manifest_shape_str(t, s2, sizeof s2));
            break;
        }
        used[e - f.e] = 1;
        dts |= 1 << e->dtype;
        rc = convert(&f, e, params + t->offset, t->numel);
    }
    /* every manifest tensor was found: any file tensor left over is not one */
    for (int i = 0; !rc && i < f.n; i++)
        if (!used[i])
            rc = dl_err(DL_EMISMATCH, "%s holds tensor '%s', which the manifest has not (%d tensors in the file, %d "
                                      "in the manifest)",
                        path, f.e[i].name, f.n, dl_manifest_ntensors(m));
    free(used);
    if (!rc && info)
        snprintf(info->dtype, sizeof info->dtype, "%s",
                 dts == 1 << DT_F32 ? "F32" : dts == 1 << DT_F16 ? "F16" : dts == 1 << DT_BF16 ? "BF16" : "mixed");
    dl_manifest_close(&fm);
    st_close(&f);
    return rc;
}
