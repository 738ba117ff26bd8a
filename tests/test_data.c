/* Data loader: text and llm.c shards, the fixed train/val split, per-epoch
 * shuffling, checkpointable position, and the error each bad file (or a
 * failed allocation of its size) gets. */
#include "core/err.h"
#include "gpt/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"

static char dir[256];

static void write_bytes(const char *name, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static int open_path(const char *name, const char *fmt, int T, int vocab, dl_data **d)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dl_data_opts o = {.path = path, .format = fmt, .seq_len = T, .vocab = vocab, .val_frac = 0.1, .seed = 5};
    return dl_data_open(&o, d);
}

static void expect_error(const char *name, const char *fmt, int vocab, int code, const char *needle)
{
    dl_data *d = NULL;
    dl_err_clear();
    int rc = open_path(name, fmt, 8, vocab, &d);
    printf("bad input %-14s -> %s: %s\n", name, dl_strerror(rc), dl_errmsg());
    CHECK(rc == code, "%s: expected %s, got %s", name, dl_strerror(code), dl_strerror(rc));
    CHECK(strstr(dl_errmsg(), needle) != NULL, "%s: message '%s' lacks '%s'", name, dl_errmsg(), needle);
    CHECK(d == NULL, "%s: no handle on error", name);
}

static void test_text(void)
{
    char text[20001];
    for (int i = 0; i < 20000; i++) text[i] = (char)('a' + (i * 7 + i / 13) % 26);
    write_bytes("corpus.txt", text, 20000);
    dl_data *d = NULL;
    int rc = open_path("corpus.txt", "auto", 16, 256, &d);
    CHECK(rc == 0, "open text: %s", dl_errmsg());
    if (rc) return;
    CHECK(!strcmp(dl_data_kind(d), "text"), "kind %s", dl_data_kind(d));
    CHECK(dl_data_num_tokens(d) == 20000, "tokens %llu", (unsigned long long)dl_data_num_tokens(d));
    uint64_t nseq = (20000 - 1) / 16;
    CHECK(dl_data_train_seqs(d) + dl_data_val_seqs(d) == nseq, "every sequence is train or val");
    double vf = (double)dl_data_val_seqs(d) / (double)nseq;
    printf("text: %llu train / %llu val sequences (val fraction %.3f, asked 0.1)\n",
           (unsigned long long)dl_data_train_seqs(d), (unsigned long long)dl_data_val_seqs(d), vf);
    CHECK(vf > 0.05 && vf < 0.15, "val fraction %.3f far from 0.1", vf);

    /* targets are inputs shifted by one, and come from the file */
    int32_t inp[4 * 16], tgt[4 * 16];
    dl_data_next_train(d, 4, inp, tgt);
    int shifted = 1;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 15; t++)
            if (tgt[b * 16 + t] != inp[b * 16 + t + 1]) shifted = 0;
    CHECK(shifted, "targets must be the next token");

    /* an epoch visits every training sequence exactly once */
    dl_data_close(&d);
    open_path("corpus.txt", "text", 16, 256, &d);
    uint64_t ntr = dl_data_train_seqs(d);
    int64_t sum_epoch0 = 0, sum_epoch1 = 0;
    int32_t first0 = -1, first1 = -1;
    for (uint64_t i = 0; i < ntr; i++) {
        dl_data_next_train(d, 1, inp, tgt);
        if (i == 0) first0 = inp[0] * 1000 + inp[1] * 10 + inp[2];
        for (int t = 0; t < 16; t++) sum_epoch0 += inp[t];
    }
    CHECK(dl_data_get_pos(d).epoch == 0 && dl_data_get_pos(d).index == ntr, "position after one epoch");
    for (uint64_t i = 0; i < ntr; i++) {
        dl_data_next_train(d, 1, inp, tgt);
        if (i == 0) first1 = inp[0] * 1000 + inp[1] * 10 + inp[2];
        for (int t = 0; t < 16; t++) sum_epoch1 += inp[t];
    }
    CHECK(sum_epoch0 == sum_epoch1, "both epochs cover the same sequences");
    CHECK(dl_data_get_pos(d).epoch == 1, "second epoch counted");
    printf("text: epoch 0 starts with %d, epoch 1 with %d (reshuffled)\n", first0, first1);

    /* position restore reproduces the stream */
    dl_data_pos pos = {.epoch = 3, .index = 5};
    CHECK(dl_data_set_pos(d, pos) == 0, "set_pos");
    int32_t a[32], at[32], b2[32], bt[32];
    dl_data_next_train(d, 2, a, at);
    dl_data *e = NULL;
    open_path("corpus.txt", "text", 16, 256, &e);
    dl_data_set_pos(e, pos);
    dl_data_next_train(e, 2, b2, bt);
    CHECK(!memcmp(a, b2, sizeof a), "same position, same batch");
    pos.index = ntr + 1;
    CHECK(dl_data_set_pos(e, pos) == DL_ERANGE, "position past the epoch refused");

    /* validation batches are fixed and disjoint from training */
    int32_t v1[32], vt1[32], v2[32], vt2[32];
    dl_data_val_batch(d, 0, 2, v1, vt1);
    dl_data_val_batch(e, 0, 2, v2, vt2);
    CHECK(!memcmp(v1, v2, sizeof v1), "validation batch independent of position and seed");
    dl_data_close(&d);
    dl_data_close(&e);
    dl_data_close(&e);
}

static void test_shards(void)
{
    uint16_t tok[5000];
    for (int i = 0; i < 5000; i++) tok[i] = (uint16_t)((i * 31) % 50000);
    char path[512];
    snprintf(path, sizeof path, "%s/good.bin", dir);
    CHECK(dl_data_write_shard(path, tok, 5000) == 0, "write shard");
    dl_data *d = NULL;
    int rc = open_path("good.bin", "auto", 32, 50257, &d);
    CHECK(rc == 0, "open shard: %s", dl_errmsg());
    if (!rc) {
        CHECK(!strcmp(dl_data_kind(d), "shards"), "auto-detected shard");
        CHECK(dl_data_num_tokens(d) == 5000, "shard tokens");
        int32_t inp[32], tgt[32];
        dl_data_val_batch(d, 0, 1, inp, tgt);
        CHECK((inp[1] - inp[0] + 50000) % 50000 == 31, "shard tokens read back in order");
        dl_data_close(&d);
    }

    /* bad inputs, each with its error */
    FILE *f = fopen(path, "rb");
    unsigned char buf[1024 + 10000];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes("trunc.bin", buf, n - 100);
    expect_error("trunc.bin", "shards", 50257, DL_ETRUNC, "only");
    write_bytes("hdronly.bin", buf, 600);
    expect_error("hdronly.bin", "shards", 50257, DL_ETRUNC, "shorter than the 1024-byte");
    write_bytes("trailing.bin", buf, n);
    {
        char p2[512];
        snprintf(p2, sizeof p2, "%s/trailing.bin", dir);
        FILE *t = fopen(p2, "ab");
        fputs("xyz", t);
        fclose(t);
    }
    expect_error("trailing.bin", "shards", 50257, DL_EFORMAT, "trailing");
    unsigned char foreign[2048];
    memset(foreign, 'A', sizeof foreign);
    write_bytes("foreign.bin", foreign, sizeof foreign);
    expect_error("foreign.bin", "shards", 50257, DL_EFORMAT, "not an llm.c token shard");
    /* auto: a .bin with another magic is refused with the way out, never read as text */
    expect_error("foreign.bin", "auto", 50257, DL_EFORMAT, "not an llm.c token shard (magic 1094795585, expected 20240520)");
    expect_error("foreign.bin", "auto", 50257, DL_EFORMAT, "give --data_format text");
    {
        dl_data *t = NULL;
        CHECK(open_path("foreign.bin", "text", 16, 256, &t) == 0, "foreign.bin as --data_format text: %s", dl_errmsg());
        CHECK(t && !strcmp(dl_data_kind(t), "text"), "foreign.bin read as text when asked");
        dl_data_close(&t);
    }
    memcpy(foreign, buf, 1024);
    int32_t v2 = 2;
    memcpy(foreign + 4, &v2, 4);
    write_bytes("v2.bin", foreign, 1024);
    expect_error("v2.bin", "shards", 50257, DL_EFORMAT, "version 2");
    expect_error("good.bin", "shards", 1000, DL_ERANGE, ">= vocab 1000");
    expect_error("missing.bin", "auto", 50257, DL_EIO, "missing.bin");
    write_bytes("tiny.txt", "abc", 3);
    expect_error("tiny.txt", "text", 256, DL_ERANGE, "too few");
    expect_error("good.bin", "text", 100, DL_ERANGE, "vocab >= 256");
}

/* dl_data_open of one file allocates, in order: the handle, the file list,
 * the file's name, the segment list and the segment's path (the file itself
 * is mapped, never copied), then the train, val and perm index arrays. The
 * index arrays grow with the data, so their failures are a DL_ENOMEM that
 * says what and how much. */
static void test_out_of_memory(void)
{
    char big[5000];
    for (int i = 0; i < 5000; i++) big[i] = (char)('a' + i % 26);
    write_bytes("oom.txt", big, sizeof big);
    dl_data *d = NULL;
    long long c0 = dl_alloc_count();
    REQUIRE(open_path("oom.txt", "text", 8, 256, &d) == 0, "open: %s", dl_errmsg());
    CHECK_EQ(dl_alloc_count() - c0, 8);
    dl_data_close(&d);
    struct { int k; const char *needle; } cases[] = {
        {6, "oom.txt: index of 624 sequences ("}, /* (5000 - 1) / 8 */
        {7, "oom.txt: index of 624 sequences ("},
        {8, "oom.txt: order of "},
    };
    for (int i = 0; i < 3; i++) {
        d = (dl_data *)big; /* must come back NULL */
        dl_err_clear();
        dl_alloc_fail_after(cases[i].k);
        int rc = open_path("oom.txt", "text", 8, 256, &d);
        dl_alloc_fail_after(0);
        printf("allocation %d of dl_data_open failed -> %s: %s\n", cases[i].k, dl_strerror(rc), dl_errmsg());
        CHECK(rc == DL_ENOMEM && d == NULL, "allocation %d: rc %d, handle %p", cases[i].k, rc, (void *)d);
        CHECK(strstr(dl_errmsg(), cases[i].needle) && strstr(dl_errmsg(), " GB): out of memory"),
              "allocation %d: message '%s' lacks '%s'", cases[i].k, dl_errmsg(), cases[i].needle);
    }
    REQUIRE(open_path("oom.txt", "text", 8, 256, &d) == 0, "an open after the failures: %s", dl_errmsg());
    CHECK(dl_data_num_tokens(d) == 5000, "the later open read every token: %llu",
          (unsigned long long)dl_data_num_tokens(d));
    dl_data_close(&d);
}

/* Resident anonymous memory of this process, KiB (/proc/self/status). */
static long rss_anon_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

/* Shards are mapped, not copied: opening 64 MiB of tokens (four files, a
 * window crossing each boundary) adds only the index arrays (8 bytes per
 * sequence) to the process's anonymous memory, and a window that spans two
 * files reads the same tokens as the stream would. */
static void test_mapped(void)
{
    enum { NF = 4, PER = 8 << 20, T = 1000 };
    uint16_t *tok = malloc((size_t)PER * sizeof *tok);
    REQUIRE(tok, "buffer");
    char sub[512], path[600];
    snprintf(sub, sizeof sub, "%s/big", dir);
    mkdir(sub, 0755);
    for (int f = 0; f < NF; f++) {
        for (uint32_t i = 0; i < PER; i++) tok[i] = (uint16_t)(((uint64_t)f * PER + i) % 50000);
        snprintf(path, sizeof path, "%s/part%d.bin", sub, f);
        REQUIRE(dl_data_write_shard(path, tok, PER) == 0, "write %s", path);
    }
    free(tok);
    long before = rss_anon_kb();
    dl_data *d = NULL;
    dl_data_opts o = {.path = sub, .format = "auto", .seq_len = T, .vocab = 50257, .val_frac = 0.01, .seed = 1,
                      .shard_index = 1, .shard_count = 4};
    REQUIRE(dl_data_open(&o, &d) == 0, "open the big shards: %s", dl_errmsg());
    long grew = rss_anon_kb() - before;
    uint64_t nseq = ((uint64_t)NF * PER - 1) / T;
    printf("4 x %d tokens (%d MiB) opened as shard 1 of 4: anonymous memory +%ld KiB (index arrays %llu KiB)\n",
           PER, NF * PER * 2 >> 20, grew, (unsigned long long)(nseq * 8 * 2 + nseq / 4 * 8) >> 10);
    CHECK(before >= 0 && grew < 4096, "mapping, not copying: anonymous memory grew %ld KiB for 64 MiB of tokens",
          grew);
    CHECK_EQ(dl_data_num_tokens(d), (uint64_t)NF * PER);
    /* every window, the ones across file boundaries included, is the stream's tokens in order */
    int32_t inp[T], tgt[T];
    int bad = 0;
    for (uint64_t i = 0; i < 64 && !bad; i++) {
        dl_data_next_train(d, 1, inp, tgt);
        for (int t = 0; t < T; t++) {
            bad |= inp[t] != (inp[0] + t) % 50000;
            bad |= tgt[t] != (inp[t] + 1) % 50000;
        }
    }
    CHECK(!bad, "training windows read the stream in order");
    /* the windows across a boundary: compare with the stream rule directly */
    dl_data_close(&d);
    o.shard_count = 0, o.shard_index = 0, o.val_frac = 0.0;
    REQUIRE(dl_data_open(&o, &d) == 0, "open unsharded: %s", dl_errmsg());
    int wrong = 0;
    for (int b = 1; b < NF; b++) {
        uint64_t s = ((uint64_t)b * PER - 5) / T; /* the window holding the boundary */
        uint64_t off = s * T;
        REQUIRE(dl_data_train_offset(d, s) == off, "sequence %llu at %llu", (unsigned long long)s,
                (unsigned long long)off);
        dl_data_val_batch(d, s, 1, inp, tgt); /* val_frac 0: validation batches read training sequences */
        for (int t = 0; t < T; t++) {
            wrong += inp[t] != (int32_t)((off + (uint64_t)t) % 50000);
            wrong += tgt[t] != (int32_t)((off + (uint64_t)t + 1) % 50000);
        }
    }
    CHECK(wrong == 0, "windows across file boundaries: %d tokens wrong", wrong);
    dl_data_close(&d);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dloco_test_data_%d", (int)getpid());
    mkdir(dir, 0755);
    test_text();
    test_shards();
    test_out_of_memory();
    test_mapped();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    printf("%s\n", failures ? "test_data: FAILED" : "test_data: all checks passed");
    return failures ? 1 : 0;
}
