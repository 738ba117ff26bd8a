/* The recovery file (gpt/recovery.h): a good file resumes the trainer bit for bit (step, moments, data
 * position); each bad input -- missing, empty, truncated header, truncated state, flipped byte in the header
 * or the state, another run's or learner's, a plain checkpoint, another model, a step beyond the run, a data
 * position beyond the data, trailing bytes, a directory -- is a fresh start with the trainer untouched and the
 * file moved aside, never a crash. */
#include "gpt/recovery.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/err.h"
#include "gpt/ckpt.h"

#include "tests/check.h"

static char dir[] = "/tmp/dloco_test_recovery.XXXXXX";
static char corpus[512], good[600], path[600];
static dl_model_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab = 256};

static float fleet; /* adam_fleet of the trainers opened next (0: plain AdamW) */

static dl_trainer *trainer(const dl_model_config *mc, int steps)
{
    dl_data_opts o = {.path = corpus, .format = "text", .seq_len = mc->seq_len, .vocab = 256, .val_frac = 0.1,
                      .seed = 3};
    dl_data *d = NULL;
    REQUIRE(dl_data_open(&o, &d) == 0, "data: %s", dl_errmsg());
    dl_train_cfg tc = {.model = *mc, .batch = 4, .steps = 100, .lr = 3e-3f, .warmup = 2, .min_lr_frac = 0.1f,
                       .adamw = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
                       .seed = 11, .val_batches = 2, .fleet = fleet};
    dl_trainer *t = NULL;
    REQUIRE(dl_trainer_open(&tc, d, &t) == 0, "trainer: %s", dl_errmsg());
    for (int s = 0; s < steps; s++) {
        double loss;
        REQUIRE(dl_trainer_step(t, &loss, NULL) == 0, "step");
    }
    return t;
}

static dl_recovery *open_rec(const char *run, const char *id, int64_t max_step)
{
    dl_recovery_opts o = {.path = path, .every_s = 0, .every_steps = 2, .max_step = max_step,
                          .run_tag = dl_recovery_tag(run, id), .id = id};
    dl_recovery *r = NULL;
    REQUIRE(dl_recovery_open(&o, &r) == 0, "open: %s", dl_errmsg());
    return r;
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    REQUIRE(a && b, "copy %s", from);
    int c;
    while ((c = fgetc(a)) != EOF) fputc(c, b);
    fclose(a);
    fclose(b);
}

/* A bad file: the load says fresh start with a reason containing `want`, the
 * trainer stays at step 0 with its moments, the file is moved aside. */
static void expect_refused(const char *what, const char *want, const char *run, const char *id, int64_t max_step)
{
    dl_trainer *t = trainer(&CFG, 0);
    uint64_t h0 = dl_recovery_moments_hash(t);
    dl_recovery *r = open_rec(run, id, max_step);
    char why[1024] = "x";
    int rc = dl_recovery_load(r, t, why, sizeof why);
    CHECK(rc == 0 && strstr(why, want), "%s: rc %d, reason '%s' (want '%s')", what, rc, why, want);
    CHECK(dl_trainer_steps_done(t) == 0 && dl_recovery_moments_hash(t) == h0, "%s: trainer touched", what);
    char aside[700];
    snprintf(aside, sizeof aside, "%s.rejected", path);
    struct stat sb;
    CHECK(stat(path, &sb) != 0 && stat(aside, &sb) == 0, "%s: file not moved aside", what);
    unlink(aside);
    rmdir(aside);
    dl_recovery_close(&r);
    dl_trainer_close(&t);
    printf("ok: %s -> fresh start: %s\n", what, why);
}

static long file_size(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

static void flip_byte(const char *p, long off)
{
    int fd = open(p, O_RDWR);
    REQUIRE(fd >= 0, "open %s", p);
    unsigned char b;
    REQUIRE(pread(fd, &b, 1, off) == 1, "read");
    b ^= 0x40;
    REQUIRE(pwrite(fd, &b, 1, off) == 1, "write");
    close(fd);
}

int main(void)
{
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(path, sizeof path, "%s/dloco-a.recovery", dir);
    snprintf(good, sizeof good, "%s/good", dir);
    FILE *f = fopen(corpus, "w");
    REQUIRE(f, "corpus");
    for (int i = 1; i <= 400; i++) fprintf(f, "line %d: the quick brown fox jumps over the lazy dog %d\n", i, i * 7919 % 1000);
    fclose(f);
    REQUIRE(dl_model_config_check(&CFG) == 0, "config: %s", dl_errmsg());

    /* no file: a fresh start without a reason */
    {
        dl_trainer *t = trainer(&CFG, 0);
        dl_recovery *r = open_rec("run", "a", 100);
        char why[256] = "x";
        CHECK(dl_recovery_load(r, t, why, sizeof why) == 0 && !why[0], "no file: '%s'", why);
        dl_recovery_close(&r);
        dl_trainer_close(&t);
    }
    /* a good file: written by the writer thread every 2 steps, resumed bit for bit */
    dl_trainer *a = trainer(&CFG, 0);
    dl_recovery *r = open_rec("run", "a", 100);
    for (int s = 0; s < 5; s++) {
        double loss;
        REQUIRE(dl_trainer_step(a, &loss, NULL) == 0, "step");
        dl_recovery_step(r, a);
    }
    REQUIRE(dl_recovery_finish(r, a) == 0, "finish: %s", dl_errmsg());
    dl_recovery_stats st;
    dl_recovery_get_stats(r, &st);
    CHECK(st.writes >= 2 && st.last_step == 5 && st.failed == 0, "writes %llu, last step %lld",
          (unsigned long long)st.writes, (long long)st.last_step);
    dl_recovery_close(&r);
    dl_recovery_close(&r); /* safe twice */
    {
        dl_trainer *b = trainer(&CFG, 0);
        r = open_rec("run", "a", 100);
        char why[256];
        CHECK(dl_recovery_load(r, b, why, sizeof why) == 1, "good file not resumed: %s", why);
        CHECK(dl_trainer_steps_done(b) == 5 && dl_recovery_moments_hash(b) == dl_recovery_moments_hash(a),
              "resumed at step %lld, moments equal %d", (long long)dl_trainer_steps_done(b),
              dl_recovery_moments_hash(b) == dl_recovery_moments_hash(a));
        CHECK(!memcmp(dl_gpt_params(dl_trainer_model(a)), dl_gpt_params(dl_trainer_model(b)),
                      dl_trainer_num_params(a) * sizeof(float)), "parameters differ");
        double la, lb;
        dl_trainer_step(a, &la, NULL);
        dl_trainer_step(b, &lb, NULL);
        CHECK(la == lb, "the next step differs (data position or state): %g vs %g", la, lb);
        dl_recovery_close(&r);
        dl_trainer_close(&b);
    }
    copy_file(path, good);
    long size = file_size(good);

    expect_refused("another run", "another run or learner", "other-run", "a", 100);
    copy_file(good, path);
    expect_refused("another learner id", "another run or learner", "run", "b", 100);
    copy_file(good, path);
    expect_refused("a step beyond the run's steps", "beyond this run", "run", "a", 3);
    copy_file(good, path);
    flip_byte(path, 40); /* the step, in the header */
    expect_refused("a damaged header", "header checksum", "run", "a", 100);
    copy_file(good, path);
    flip_byte(path, size - 5); /* the state */
    expect_refused("a damaged state", "checksum mismatch", "run", "a", 100);
    copy_file(good, path);
    REQUIRE(truncate(path, 100) == 0, "truncate");
    expect_refused("a truncated header", "shorter than", "run", "a", 100);
    copy_file(good, path);
    REQUIRE(truncate(path, size - 8) == 0, "truncate");
    expect_refused("a truncated state", "truncated", "run", "a", 100);
    copy_file(good, path);
    f = fopen(path, "ab");
    fputs("junk", f);
    fclose(f);
    expect_refused("trailing bytes", "trailing bytes", "run", "a", 100);
    f = fopen(path, "wb");
    fclose(f);
    expect_refused("an empty file", "shorter than", "run", "a", 100);
    f = fopen(path, "wb");
    for (int i = 0; i < 4096; i++) fputc((i * 7919) & 0xff, f);
    fclose(f);
    expect_refused("random bytes", "not a dloco checkpoint", "run", "a", 100);
    REQUIRE(dl_trainer_save(a, path) == 0, "plain save: %s", dl_errmsg());
    expect_refused("a plain checkpoint", "plain checkpoint", "run", "a", 100);
    REQUIRE(mkdir(path, 0755) == 0, "mkdir");
    expect_refused("a directory", "", "run", "a", 100);
    /* another model (the manifest differs): written tagged for this learner */
    {
        dl_model_config other = CFG;
        other.n_embd = 48;
        REQUIRE(dl_model_config_check(&other) == 0, "other config");
        dl_trainer *o = trainer(&other, 1);
        dl_trainer_snap s = {.st.run_tag = dl_recovery_tag("run", "a")};
        REQUIRE(dl_trainer_snap_take(o, &s) == 0 && dl_trainer_snap_write(&s, path) == 0, "other: %s", dl_errmsg());
        dl_trainer_snap_free(&s);
        dl_trainer_close(&o);
        expect_refused("another model", "checkpoint model", "run", "a", 100);
    }
    /* a data position beyond the data: a file of a learner on a bigger shard */
    {
        dl_trainer_snap s = {.st.run_tag = dl_recovery_tag("run", "a")};
        REQUIRE(dl_trainer_snap_take(a, &s) == 0, "snap");
        s.st.data.index = 1u << 30;
        REQUIRE(dl_trainer_snap_write(&s, path) == 0, "write");
        dl_trainer_snap_free(&s);
        expect_refused("a data position beyond the data", "data position", "run", "a", 100);
    }
    /* an unwritable place: the write fails, is counted, and nothing aborts */
    {
        char bad[700];
        snprintf(bad, sizeof bad, "%s/no/such/dir/f.recovery", dir);
        dl_recovery_opts o = {.path = bad, .every_steps = 1, .max_step = 100, .run_tag = 1, .id = "a"};
        dl_recovery *w = NULL;
        REQUIRE(dl_recovery_open(&o, &w) == 0, "open");
        CHECK(dl_recovery_finish(w, a) != 0, "a write into a missing directory succeeded");
        dl_recovery_get_stats(w, &st);
        CHECK(st.failed == 1 && st.writes == 0, "failed %llu", (unsigned long long)st.failed);
        dl_recovery_close(&w);
    }
    /* the budget: the first file after DL_RECOVERY_MIN_S, then as often as (copy + write) / budget allows,
     * within [DL_RECOVERY_MIN_S, every_s]; no budget: every_s; a budget outside [0, 1) is refused */
    {
        dl_recovery_opts o = {.path = path, .every_s = 60, .budget = 0.01, .max_step = 100,
                              .run_tag = dl_recovery_tag("run", "a"), .id = "a"};
        dl_recovery *w = NULL;
        REQUIRE(dl_recovery_open(&o, &w) == 0, "open: %s", dl_errmsg());
        dl_recovery_get_stats(w, &st);
        CHECK(st.interval_s == DL_RECOVERY_MIN_S, "the first file after %g s, not %g", DL_RECOVERY_MIN_S,
              st.interval_s);
        CHECK(dl_recovery_step(w, a) == 0, "a copy before the first interval");
        REQUIRE(dl_recovery_finish(w, a) == 0, "finish: %s", dl_errmsg());
        dl_recovery_get_stats(w, &st);
        double cost = st.copy_s_sum + st.write_s_sum, want = cost / 0.01;
        if (want < DL_RECOVERY_MIN_S) want = DL_RECOVERY_MIN_S;
        if (want > 60) want = 60;
        CHECK(st.interval_s >= DL_RECOVERY_MIN_S && st.interval_s <= 60 && fabs(st.interval_s - want) < 1e-9,
              "interval %g s after a file costing %g s (want %g)", st.interval_s, cost, want);
        dl_recovery_close(&w);
        o.budget = 0;
        REQUIRE(dl_recovery_open(&o, &w) == 0, "open: %s", dl_errmsg());
        dl_recovery_get_stats(w, &st);
        CHECK(st.interval_s == 60, "no budget: every_s (%g)", st.interval_s);
        dl_recovery_close(&w);
        o.budget = 1;
        CHECK(dl_recovery_open(&o, &w) == DL_EINVAL && strstr(dl_errmsg(), "budget"), "budget 1: %s", dl_errmsg());
        o.budget = -0.5;
        CHECK(dl_recovery_open(&o, &w) == DL_EINVAL && strstr(dl_errmsg(), "budget"), "budget -0.5: %s",
              dl_errmsg());
        CHECK(w == NULL, "a refused open leaves no handle");
    }
    /* a complete run removes its file: a later start under the id is a new run */
    {
        copy_file(good, path);
        dl_recovery *w = open_rec("run", "a", 100);
        struct stat sb;
        CHECK(dl_recovery_remove(w) == 0 && stat(path, &sb) != 0, "the file was not removed");
        dl_recovery_get_stats(w, &st);
        CHECK(st.removed == 1, "removed not counted");
        CHECK(dl_recovery_remove(w) == 0, "removing a missing file is not an error");
        dl_recovery_close(&w);
    }
    /* adam_fleet: its state (m, v as the run holds it, the noise moment w) resumes from a recovery file of its
     * own kind, bit for bit (the moments' hash); a plain AdamW run refuses that file, and a fleet run a plain one */
    {
        fleet = 4.0f;
        dl_trainer *fa = trainer(&CFG, 3);
        dl_recovery *w = open_rec("run", "a", 100);
        REQUIRE(dl_recovery_finish(w, fa) == 0, "adam_fleet recovery file: %s", dl_errmsg());
        dl_recovery_close(&w);
        uint64_t h = dl_recovery_moments_hash(fa);
        copy_file(path, good);
        dl_trainer *fb = trainer(&CFG, 0);
        w = open_rec("run", "a", 100);
        char why[256];
        CHECK(dl_recovery_load(w, fb, why, sizeof why) == 1, "adam_fleet file not resumed: %s", why);
        CHECK(dl_trainer_steps_done(fb) == 3 && dl_recovery_moments_hash(fb) == h && h != 0,
              "adam_fleet state resumed (step %lld, moments %016llx vs %016llx)",
              (long long)dl_trainer_steps_done(fb), (unsigned long long)dl_recovery_moments_hash(fb),
              (unsigned long long)h);
        dl_recovery_close(&w);
        fleet = 0.0f;
        expect_refused("an adam_fleet file for a plain AdamW run", "adam_fleet", "run", "a", 100);
        w = open_rec("run", "a", 100);
        REQUIRE(dl_recovery_finish(w, a) == 0, "adamw recovery file: %s", dl_errmsg());
        dl_recovery_close(&w);
        fleet = 4.0f;
        expect_refused("a plain AdamW file for an adam_fleet run", "adamw run", "run", "a", 100);
        fleet = 0.0f;
        dl_trainer_close(&fa);
        dl_trainer_close(&fb);
    }
    dl_trainer_close(&a);
    unlink(good);
    unlink(corpus);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    printf("test_recovery: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
