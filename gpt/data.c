/* Data loading: every file is memory-mapped, never copied, and read
 * lazily: a learner's pages are the sequences it trains and validates on.
 * Sequences are T+1-token windows at stride T over the files' tokens taken
 * as one stream, assigned to train or validation by a fixed hash of their
 * index so the split is identical in every run. */
#include "gpt/data.h"

#include "core/err.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/rng.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One file's tokens in the stream: bytes of a text file (one token each) or
 * the uint16 tokens after an llm.c shard's header, inside its mapping. */
typedef struct {
    const unsigned char *p; /* first token */
    uint64_t start, n;      /* stream position of the first token, token count */
    int width;              /* bytes per token: 1 text, 2 shard */
    void *map;              /* the file's mapping (NULL for an empty file) */
    size_t maplen;
    char *path;
} dl_seg;

struct dl_data {
    dl_seg *seg;
    int nseg, capseg;
    uint64_t ntok;
    int T;
    char kind[8];
    uint64_t *train; /* training sequence start offsets, canonical order */
    uint64_t *perm;  /* this epoch's order: indices into train[] */
    uint64_t ntrain;
    uint64_t *val; /* validation sequence start offsets */
    uint64_t nval;
    uint64_t seed;
    dl_data_pos pos;
};

/* ---- reading */

/* Map `path` read-only; an empty file maps nothing (*map NULL, *len 0). */
static int map_file(const char *path, void **map, size_t *len)
{
    *map = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dl_err(DL_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dl_err(DL_EIO, "cannot size %s: %s", path, strerror(e));
    }
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return dl_err(e == ENOMEM ? DL_ENOMEM : DL_EIO, "cannot map data file %s of %lld bytes (%.2f GB): %s",
                          path, (long long)st.st_size, (double)st.st_size / 1e9, strerror(e));
        }
        /* sequences are read in a shuffled order */
        (void)madvise(m, (size_t)st.st_size, MADV_RANDOM);
        *map = m;
        *len = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

static int is_shard_bytes(const unsigned char *b, size_t len)
{
    int32_t magic;
    if (len < 4) return 0;
    memcpy(&magic, b, 4);
    return magic == DL_SHARD_MAGIC;
}

static int has_bin_suffix(const char *path)
{
    size_t l = strlen(path);
    return l > 4 && !strcmp(path + l - 4, ".bin");
}

static char *dup_str(const char *s);

/* Append a file's tokens to the stream; the segment owns the mapping. */
static void add_seg(dl_data *d, const unsigned char *p, uint64_t n, int width, void *map, size_t maplen,
                    const char *path)
{
    if (d->nseg == d->capseg) {
        d->capseg = d->capseg ? d->capseg * 2 : 16;
        d->seg = dl_xrealloc(d->seg, (size_t)d->capseg * sizeof *d->seg);
    }
    d->seg[d->nseg++] = (dl_seg){p, d->ntok, n, width, map, maplen, dup_str(path)};
    d->ntok += n;
}

/* Header and size of a shard are checked here; its token values only where
 * this learner reads (check_vocab), so its other pages stay unread. */
static int load_shard(dl_data *d, const char *path)
{
    void *map;
    size_t len;
    DL_TRY(map_file(path, &map, &len));
    const unsigned char *b = map;
    int rc = 0;
    int32_t hdr[256];
    if (len < sizeof hdr) {
        rc = dl_err(is_shard_bytes(b, len) ? DL_ETRUNC : DL_EFORMAT,
                    "%s: %zu bytes, shorter than the 1024-byte shard header", path, len);
        goto fail;
    }
    memcpy(hdr, b, sizeof hdr);
    if (hdr[0] != DL_SHARD_MAGIC) {
        rc = dl_err(DL_EFORMAT, "%s: not an llm.c token shard (magic %d, expected %d)", path, hdr[0], DL_SHARD_MAGIC);
        goto fail;
    }
    if (hdr[1] != DL_SHARD_VERSION) {
        rc = dl_err(DL_EFORMAT, "%s: shard version %d, only %d is supported", path, hdr[1], DL_SHARD_VERSION);
        goto fail;
    }
    if (hdr[2] < 0) {
        rc = dl_err(DL_EFORMAT, "%s: negative token count %d", path, hdr[2]);
        goto fail;
    }
    uint64_t n = (uint64_t)hdr[2];
    if (len - sizeof hdr < n * 2) {
        rc = dl_err(DL_ETRUNC, "%s: header says %llu tokens (%llu bytes) but only %zu bytes follow", path,
                    (unsigned long long)n, (unsigned long long)n * 2, len - sizeof hdr);
        goto fail;
    }
    if (len - sizeof hdr > n * 2) {
        rc = dl_err(DL_EFORMAT, "%s: %zu trailing bytes after %llu tokens", path, len - sizeof hdr - n * 2,
                    (unsigned long long)n);
        goto fail;
    }
    add_seg(d, b + sizeof hdr, n, 2, map, len, path);
    return 0;
fail:
    munmap(map, len);
    return rc;
}

static int load_text(dl_data *d, const char *path)
{
    void *map;
    size_t len;
    DL_TRY(map_file(path, &map, &len));
    if (!len) return 0; /* an empty file adds no token */
    add_seg(d, map, len, 1, map, len, path);
    return 0;
}

/* The segment holding stream position g (< ntok): binary search. */
static int seg_of(const dl_data *d, uint64_t g)
{
    int lo = 0, hi = d->nseg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->seg[mid].start <= g) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static inline uint32_t seg_tok(const dl_seg *s, uint64_t i)
{
    if (s->width == 1) return s->p[i];
    uint16_t t;
    memcpy(&t, s->p + 2 * i, 2);
    return t;
}

/* The T+1 tokens from stream position off into w[] (a window may span files). */
static void read_window(const dl_data *d, uint64_t off, int32_t *w)
{
    int k = seg_of(d, off);
    uint64_t i = off - d->seg[k].start;
    for (int t = 0; t <= d->T; t++) {
        while (i >= d->seg[k].n) i -= d->seg[k].n, k++; /* next file (empty ones are never segments) */
        w[t] = (int32_t)seg_tok(&d->seg[k], i++);
    }
}

/* Every token of the windows at off[0..n) is < vocab, else DL_ERANGE naming
 * the file and the token's position in it. */
static int check_vocab(const dl_data *d, const uint64_t *off, uint64_t n, int vocab, int32_t *w)
{
    for (uint64_t s = 0; s < n; s++) {
        read_window(d, off[s], w);
        for (int t = 0; t <= d->T; t++) {
            if (w[t] < vocab) continue;
            uint64_t g = off[s] + (uint64_t)t;
            const dl_seg *sg = &d->seg[seg_of(d, g)];
            return dl_err(DL_ERANGE, "%s: token %d at position %llu is >= vocab %d", sg->path, w[t],
                          (unsigned long long)(g - sg->start), vocab);
        }
    }
    return 0;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(dl_xmalloc(n), s, n);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Regular files of a directory in sorted order; text mode skips fortune's
 * index files (.dat) and anything hidden; symlinks are skipped (fortune's .u8). */
static int list_dir(const char *dir, char ***names, int *n)
{
    DIR *dp = opendir(dir);
    if (!dp) return dl_err(DL_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    char **v = NULL;
    int cnt = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".dat")) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(full, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 64;
            v = dl_xrealloc(v, (size_t)cap * sizeof *v);
        }
        v[cnt++] = dup_str(full);
    }
    closedir(dp);
    qsort(v, (size_t)cnt, sizeof *v, cmp_str);
    *names = v;
    *n = cnt;
    return 0;
}

/* ---- split and order */

static void shuffle_epoch(dl_data *d)
{
    /* identity, then Fisher-Yates from (seed, epoch): the permutation of an
     * epoch is a pure function, so a checkpoint only needs (epoch, index) */
    uint64_t *p = d->perm;
    for (uint64_t i = 0; i < d->ntrain; i++) p[i] = i;
    dl_rng r;
    dl_rng_seed(&r, d->seed * 0x9E3779B97F4A7C15ULL + d->pos.epoch + 1);
    for (uint64_t i = d->ntrain - 1; i > 0; i--) {
        uint64_t j = dl_rng_below(&r, i + 1);
        uint64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* ---- cluster shards (gpt/data.h) */

static double dist2(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        s += d * d;
    }
    return s;
}

typedef struct {
    double d;
    uint32_t doc, c;
} dc_pair;

static int cmp_pair(const void *a, const void *b)
{
    const dc_pair *x = a, *y = b;
    if (x->d != y->d) return x->d < y->d ? -1 : 1;
    if (x->doc != y->doc) return x->doc < y->doc ? -1 : 1;
    return (x->c > y->c) - (x->c < y->c);
}

/* Of the n training sequence offsets off[] (corpus order), keep in off[] (order kept) those of cluster
 * `want` of k; returns how many. *sizes_out (k counts of sequences) for the refusal message. */
static uint64_t cluster_select(const dl_data *d, uint64_t *off, uint64_t n, int k, int want, uint64_t *sizes)
{
    const int NB = DL_DATA_CLUSTER_BINS, DOC = DL_DATA_CLUSTER_DOC;
    uint64_t nd = (n + DOC - 1) / DOC;
    float *feat = dl_xcalloc(nd * NB, sizeof(float)), *cen = dl_xcalloc((size_t)k * NB, sizeof(float));
    int32_t *w = dl_xmalloc(((size_t)d->T + 1) * sizeof(int32_t));
    for (uint64_t j = 0; j < nd; j++) {
        float *f = feat + j * NB;
        uint64_t cnt = 0;
        for (uint64_t s = j * DOC; s < n && s < (j + 1) * DOC; s++) {
            read_window(d, off[s], w);
            for (int t = 0; t < d->T; t++, cnt++) f[w[t] % NB] += 1.0f;
        }
        for (int b = 0; b < NB; b++) f[b] /= (float)cnt;
    }
    free(w);
    /* k-means++ seeding from the fixed seed */
    dl_rng r;
    dl_rng_seed(&r, DL_DATA_CLUSTER_SEED);
    double *best = dl_xmalloc(nd * sizeof(double));
    uint32_t *lab = dl_xcalloc(nd, sizeof(uint32_t));
    memcpy(cen, feat + dl_rng_below(&r, nd) * NB, NB * sizeof(float));
    for (uint64_t j = 0; j < nd; j++) best[j] = dist2(feat + j * NB, cen, NB);
    for (int c = 1; c < k; c++) {
        double tot = 0;
        for (uint64_t j = 0; j < nd; j++) tot += best[j];
        uint64_t pick = 0;
        if (tot > 0) {
            double u = (double)(dl_rng_u64(&r) >> 11) * 0x1.0p-53 * tot, acc = 0;
            for (pick = 0; pick + 1 < nd; pick++)
                if ((acc += best[pick]) > u) break;
        } else {
            pick = dl_rng_below(&r, nd);
        }
        memcpy(cen + (size_t)c * NB, feat + pick * NB, NB * sizeof(float));
        for (uint64_t j = 0; j < nd; j++) {
            double e = dist2(feat + j * NB, cen + (size_t)c * NB, NB);
            if (e < best[j]) best[j] = e;
        }
    }
    /* Lloyd */
    double *sum = dl_xmalloc((size_t)k * NB * sizeof(double));
    uint64_t *num = dl_xmalloc((size_t)k * sizeof(uint64_t));
    for (int it = 0; it < DL_DATA_CLUSTER_ITERS; it++) {
        for (uint64_t j = 0; j < nd; j++) {
            double bd = INFINITY;
            for (int c = 0; c < k; c++) {
                double e = dist2(feat + j * NB, cen + (size_t)c * NB, NB);
                if (e < bd) bd = e, lab[j] = (uint32_t)c;
            }
        }
        memset(sum, 0, (size_t)k * NB * sizeof(double));
        memset(num, 0, (size_t)k * sizeof(uint64_t));
        for (uint64_t j = 0; j < nd; j++) {
            num[lab[j]]++;
            for (int b = 0; b < NB; b++) sum[(size_t)lab[j] * NB + b] += feat[j * NB + b];
        }
        for (int c = 0; c < k; c++) /* an empty cluster keeps its centroid */
            for (int b = 0; num[c] && b < NB; b++) cen[(size_t)c * NB + b] = (float)(sum[(size_t)c * NB + b] / num[c]);
    }
    /* capacity-bounded assignment: equal shards */
    dc_pair *pr = dl_xmalloc(nd * (size_t)k * sizeof *pr);
    for (uint64_t j = 0; j < nd; j++)
        for (int c = 0; c < k; c++)
            pr[j * k + c] = (dc_pair){dist2(feat + j * NB, cen + (size_t)c * NB, NB), (uint32_t)j, (uint32_t)c};
    qsort(pr, nd * (size_t)k, sizeof *pr, cmp_pair);
    uint64_t cap = (nd + (uint64_t)k - 1) / (uint64_t)k;
    memset(num, 0, (size_t)k * sizeof(uint64_t));
    for (uint64_t j = 0; j < nd; j++) lab[j] = UINT32_MAX;
    for (uint64_t i = 0; i < nd * (uint64_t)k; i++)
        if (lab[pr[i].doc] == UINT32_MAX && num[pr[i].c] < cap) lab[pr[i].doc] = pr[i].c, num[pr[i].c]++;
    uint64_t m = 0;
    for (int c = 0; c < k; c++) sizes[c] = 0;
    for (uint64_t s = 0; s < n; s++) {
        uint32_t c = lab[s / DOC];
        sizes[c]++;
        if ((int)c == want) off[m++] = off[s];
    }
    free(feat), free(cen), free(best), free(lab), free(sum), free(num), free(pr);
    return m;
}

int dl_data_open(const dl_data_opts *o, dl_data **out)
{
    *out = NULL;
    if (o->seq_len < 1) return dl_err(DL_EINVAL, "seq_len %d", o->seq_len);
    if (o->shard_count < 0 || o->shard_index < 0 || (o->shard_count > 1 && o->shard_index >= o->shard_count) ||
        (o->shard_count <= 1 && o->shard_index != 0))
        return dl_err(DL_EINVAL, "data shard %d of %d", o->shard_index, o->shard_count);
    if (o->shard_mode != DL_DATA_SHARD_IID && o->shard_mode != DL_DATA_SHARD_CLUSTER)
        return dl_err(DL_EINVAL, "data shard mode %d is not iid (0) or cluster (1)", o->shard_mode);
    if (!(o->val_frac >= 0.0 && o->val_frac < 1.0))
        return dl_err(DL_EINVAL, "val_frac %g not in [0, 1)", o->val_frac);
    int want_text = !strcmp(o->format, "text"), want_shards = !strcmp(o->format, "shards");
    if (!want_text && !want_shards && strcmp(o->format, "auto"))
        return dl_err(DL_EINVAL, "data format '%s' is not auto, text or shards", o->format);

    dl_data *d = dl_xcalloc(1, sizeof *d);
    d->T = o->seq_len;
    d->seed = o->seed;
    int rc = 0;
    struct stat st;
    if (stat(o->path, &st) != 0) {
        rc = dl_err(DL_EIO, "data path %s: %s", o->path, strerror(errno));
        goto fail;
    }
    char **files = NULL;
    int nfiles = 0;
    if (S_ISDIR(st.st_mode)) {
        if ((rc = list_dir(o->path, &files, &nfiles))) goto fail;
    } else {
        files = dl_xmalloc(sizeof *files);
        files[0] = dup_str(o->path);
        nfiles = 1;
    }
    if (nfiles == 0) {
        rc = dl_err(DL_ERANGE, "data directory %s has no files", o->path);
        free(files);
        goto fail;
    }
    /* auto: a path with a .bin file is llm.c token shards (whose magic
     * load_shard checks, so a .bin with another magic is refused, never read
     * as text); otherwise the first file's magic decides */
    int shards = want_shards;
    if (!want_text && !want_shards) {
        for (int i = 0; i < nfiles && !shards; i++) shards = has_bin_suffix(files[i]);
        if (!shards) {
            unsigned char head[4] = {0};
            FILE *f = fopen(files[0], "rb");
            size_t got = f ? fread(head, 1, 4, f) : 0;
            if (f) fclose(f);
            shards = is_shard_bytes(head, got);
        }
    }
    if (!shards && o->vocab < 256)
        rc = dl_err(DL_ERANGE, "text data needs vocab >= 256 (bytes), got %d", o->vocab);
    for (int i = 0; i < nfiles && !rc; i++) {
        if (shards) {
            if (nfiles > 1 && !has_bin_suffix(files[i])) continue;
            rc = load_shard(d, files[i]);
            if (rc == DL_EFORMAT && !want_shards && has_bin_suffix(files[i]))
                rc = dl_err(DL_EFORMAT, "%s (--data_format auto reads .bin files as llm.c token shards only: "
                                        "give --data_format text to train on its bytes)", dl_errmsg());
        } else {
            rc = load_text(d, files[i]);
        }
    }
    for (int i = 0; i < nfiles; i++) free(files[i]);
    free(files);
    if (rc) goto fail;
    snprintf(d->kind, sizeof d->kind, "%s", shards ? "shards" : "text");

    uint64_t T = (uint64_t)d->T;
    uint64_t nseq = d->ntok > T ? (d->ntok - 1) / T : 0;
    if (nseq < 2) {
        rc = dl_err(DL_ERANGE, "%s: %llu tokens are too few for sequences of %llu", o->path,
                    (unsigned long long)d->ntok, (unsigned long long)T);
        goto fail;
    }
    /* the index arrays grow with the data (8 bytes a sequence): a refusal that says how much */
    d->train = dl_try_malloc(nseq * sizeof(uint64_t));
    d->val = d->train ? dl_try_malloc(nseq * sizeof(uint64_t)) : NULL;
    if (!d->val) {
        rc = dl_err(DL_ENOMEM, "%s: index of %llu sequences (%.2f GB): out of memory", o->path,
                    (unsigned long long)nseq, (double)nseq * 2 * sizeof(uint64_t) / 1e9);
        goto fail;
    }
    uint64_t thresh = (uint64_t)(o->val_frac * 1000000.0);
    int cluster = o->shard_mode == DL_DATA_SHARD_CLUSTER && o->shard_count > 1;
    uint64_t nshards = o->shard_count > 1 && !cluster ? (uint64_t)o->shard_count : 1, ntr_all = 0;
    for (uint64_t s = 0; s < nseq; s++) {
        uint64_t h = dl_hash64(&s, sizeof s, 0x5EEDu) % 1000000u;
        if (h < thresh) d->val[d->nval++] = s * T;
        else if (ntr_all++ % nshards == (uint64_t)(cluster ? 0 : o->shard_index)) d->train[d->ntrain++] = s * T;
    }
    if (cluster && d->ntrain > 0) {
        uint64_t all = d->ntrain, *sizes = dl_xcalloc((size_t)o->shard_count, sizeof(uint64_t));
        d->ntrain = cluster_select(d, d->train, d->ntrain, o->shard_count, o->shard_index, sizes);
        if (d->ntrain < (uint64_t)(o->min_seqs > 1 ? o->min_seqs : 1)) {
            char list[512];
            int w = 0;
            for (int c = 0; c < o->shard_count && w < (int)sizeof list - 24; c++)
                w += snprintf(list + w, sizeof list - (size_t)w, "%s%llu", c ? "," : "", (unsigned long long)sizes[c]);
            rc = dl_err(DL_ERANGE,
                        "%s: cluster shard %d of %d holds %llu training sequences (of %llu), fewer than the %d a "
                        "batch needs (clusters: %s%s); use fewer shards, a smaller batch or --data_shard_mode iid",
                        o->path, o->shard_index, o->shard_count, (unsigned long long)d->ntrain,
                        (unsigned long long)all, o->min_seqs > 1 ? o->min_seqs : 1, list,
                        w >= (int)sizeof list - 24 ? ",..." : "");
            free(sizes);
            goto fail;
        }
        free(sizes);
    }
    if (d->ntrain == 0 || (o->val_frac > 0 && d->nval == 0)) {
        rc = dl_err(DL_ERANGE, "%s: split of %llu sequences left an empty train or validation set", o->path,
                    (unsigned long long)nseq);
        goto fail;
    }
    if (shards) { /* what this learner reads: its training sequences and the validation ones */
        int32_t *w = dl_xmalloc(((size_t)d->T + 1) * sizeof(int32_t));
        rc = check_vocab(d, d->train, d->ntrain, o->vocab, w);
        if (!rc) rc = check_vocab(d, d->val, d->nval, o->vocab, w);
        free(w);
        if (rc) goto fail;
    }
    if (!(d->perm = dl_try_malloc(d->ntrain * sizeof(uint64_t)))) {
        rc = dl_err(DL_ENOMEM, "%s: order of %llu training sequences (%.2f GB): out of memory", o->path,
                    (unsigned long long)d->ntrain, (double)d->ntrain * sizeof(uint64_t) / 1e9);
        goto fail;
    }
    d->pos.epoch = 0;
    d->pos.index = 0;
    shuffle_epoch(d);
    *out = d;
    return 0;
fail:
    dl_data_close(&d);
    return rc;
}

void dl_data_close(dl_data **dp)
{
    if (!dp || !*dp) return;
    dl_data *d = *dp;
    for (int i = 0; i < d->nseg; i++) {
        if (d->seg[i].map) munmap(d->seg[i].map, d->seg[i].maplen);
        free(d->seg[i].path);
    }
    free(d->seg);
    free(d->train);
    free(d->perm);
    free(d->val);
    free(d);
    *dp = NULL;
}

uint64_t dl_data_num_tokens(const dl_data *d) { return d->ntok; }
uint64_t dl_data_train_seqs(const dl_data *d) { return d->ntrain; }
uint64_t dl_data_val_seqs(const dl_data *d) { return d->nval; }
const char *dl_data_kind(const dl_data *d) { return d->kind; }
uint64_t dl_data_train_offset(const dl_data *d, uint64_t i) { return i < d->ntrain ? d->train[i] : UINT64_MAX; }

static void copy_seq(const dl_data *d, uint64_t off, int32_t *inp, int32_t *tgt)
{
    const dl_seg *s = &d->seg[seg_of(d, off)];
    uint64_t i = off - s->start;
    if (i + (uint64_t)d->T < s->n) { /* the window lies in one file: the common case */
        for (int t = 0; t < d->T; t++) {
            inp[t] = (int32_t)seg_tok(s, i + (uint64_t)t);
            tgt[t] = (int32_t)seg_tok(s, i + (uint64_t)t + 1);
        }
        return;
    }
    /* across files: read the window, then split it (inp is T long, the
     * window T+1: tgt[T-1] is its last token) */
    int k = seg_of(d, off);
    for (int t = 0; t <= d->T; t++) {
        while (i >= d->seg[k].n) i -= d->seg[k].n, k++;
        int32_t v = (int32_t)seg_tok(&d->seg[k], i++);
        if (t < d->T) inp[t] = v;
        if (t > 0) tgt[t - 1] = v;
    }
}

void dl_data_next_train(dl_data *d, int B, int32_t *inp, int32_t *tgt)
{
    for (int b = 0; b < B; b++) {
        if (d->pos.index >= d->ntrain) {
            d->pos.epoch++;
            d->pos.index = 0;
            shuffle_epoch(d);
        }
        copy_seq(d, d->train[d->perm[d->pos.index++]], inp + (size_t)b * d->T, tgt + (size_t)b * d->T);
    }
}

void dl_data_val_batch(const dl_data *d, uint64_t i, int B, int32_t *inp, int32_t *tgt)
{
    const uint64_t *src = d->nval ? d->val : d->train;
    uint64_t n = d->nval ? d->nval : d->ntrain;
    for (int b = 0; b < B; b++)
        copy_seq(d, src[(i * (uint64_t)B + (uint64_t)b) % n], inp + (size_t)b * d->T, tgt + (size_t)b * d->T);
}

dl_data_pos dl_data_get_pos(const dl_data *d) { return d->pos; }

int dl_data_set_pos(dl_data *d, dl_data_pos pos)
{
    if (pos.index > d->ntrain)
        return dl_err(DL_ERANGE, "data position %llu is past the %llu training sequences of an epoch",
                      (unsigned long long)pos.index, (unsigned long long)d->ntrain);
    d->pos = pos;
    shuffle_epoch(d);
    return 0;
}

int dl_data_write_shard(const char *path, const uint16_t *tokens, uint64_t n)
{
    if (n > INT32_MAX) return dl_err(DL_ERANGE, "%llu tokens do not fit a shard header", (unsigned long long)n);
    FILE *f = fopen(path, "wb");
    if (!f) return dl_err(DL_EIO, "cannot create %s: %s", path, strerror(errno));
    int32_t hdr[256] = {DL_SHARD_MAGIC, DL_SHARD_VERSION, (int32_t)n};
    int ok = fwrite(hdr, sizeof hdr, 1, f) == 1 && (n == 0 || fwrite(tokens, 2, n, f) == n);
    ok = (fclose(f) == 0) && ok;
    return ok ? 0 : dl_err(DL_EIO, "write %s failed", path);
}
