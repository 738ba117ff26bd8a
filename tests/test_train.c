/* Trainer and checkpoint tests that run without a GPU: raw-buffer checkpoints
 * are the dl_gpt checkpoint byte for byte, resume through the API is bit-exact, device selection errors, and
 * the out-of-memory refusals of model-sized buffers (the CUDA trainer's where a device exists). */
#include "gpt/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/err.h"
#include "gpt/ckpt.h"
#include "gpt/gpt.h"
#ifdef DLOCO_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif

#include "tests/check.h"

static char dir[] = "/tmp/dloco_test_train.XXXXXX";
static char corpus[512];

static dl_model_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab = 256};

static void *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*n ? *n : 1);
    REQUIRE(fread(p, 1, *n, f) == *n, "read %s", path);
    fclose(f);
    return p;
}

static dl_data *open_data(void)
{
    dl_data_opts o = {.path = corpus, .format = "text", .seq_len = CFG.seq_len, .vocab = 256, .val_frac = 0.1,
                      .seed = 3};
    dl_data *d = NULL;
    REQUIRE(dl_data_open(&o, &d) == 0, "data: %s", dl_errmsg());
    return d;
}

static dl_train_cfg train_cfg(int device)
{
    dl_train_cfg tc = {
        .model = CFG,
        .batch = 4,
        .steps = 20,
        .lr = 3e-3f,
        .warmup = 2,
        .min_lr_frac = 0.1f,
        .adamw = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
        .seed = 11,
        .val_batches = 2,
        .device = device,
    };
    return tc;
}

/* ---- raw checkpoints: the same bytes as the model's, loads back exactly */

static void test_ckpt_raw(void)
{
    dl_gpt *g = NULL;
    REQUIRE(dl_gpt_open(&CFG, 2, &g) == 0, "open: %s", dl_errmsg());
    dl_gpt_init(g, 5);
    size_t n = dl_gpt_num_params(g);
    for (size_t i = 0; i < n; i++) {
        dl_gpt_adam_m(g)[i] = (float)i * 1e-4f;
        dl_gpt_adam_v(g)[i] = (float)(n - i) * 1e-6f;
    }
    dl_ckpt_state st = {.step = 42, .data = {.epoch = 3, .index = 17}, .seed = 99};
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/model.ckpt", dir);
    snprintf(b, sizeof b, "%s/raw.ckpt", dir);
    REQUIRE(dl_ckpt_save(a, g, &st) == 0, "save: %s", dl_errmsg());
    REQUIRE(dl_ckpt_save_raw(b, dl_gpt_cfg(g), n, dl_gpt_params(g), dl_gpt_adam_m(g), dl_gpt_adam_v(g), &st) == 0,
            "save_raw: %s", dl_errmsg());
    size_t na, nb;
    void *fa = read_file(a, &na), *fb = read_file(b, &nb);
    CHECK(na == nb && na == 128 + 3 * n * sizeof(float) && memcmp(fa, fb, na) == 0,
          "raw checkpoint differs from the model's (%zu vs %zu bytes)", nb, na);

    float *p = calloc(3 * n, sizeof(float));
    dl_ckpt_state got = {0};
    /* the file's state is staged whole (3 x nparams floats) before it is
     * checked; no room for it is a DL_ENOMEM that leaves the buffers alone */
    dl_err_clear();
    dl_alloc_fail_after(1);
    int rc = dl_ckpt_load_raw(a, dl_gpt_cfg(g), n, p, p + n, p + 2 * n, &got);
    dl_alloc_fail_after(0);
    int untouched = 1;
    for (size_t i = 0; i < 3 * n; i++) untouched &= p[i] == 0.0f;
    char want[160];
    snprintf(want, sizeof want, "state of %zu parameters x 3 buffers (", n);
    printf("load_raw without memory -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_ENOMEM && untouched && got.step == 0, "load_raw out of memory: rc %d, untouched %d", rc,
          untouched);
    CHECK(strstr(dl_errmsg(), want) && strstr(dl_errmsg(), "model.ckpt") && strstr(dl_errmsg(), "out of memory"),
          "load_raw out of memory: message '%s' lacks '%s'", dl_errmsg(), want);
    REQUIRE(dl_ckpt_load_raw(a, dl_gpt_cfg(g), n, p, p + n, p + 2 * n, &got) == 0, "load_raw: %s", dl_errmsg());
    CHECK(!memcmp(p, dl_gpt_params(g), n * 4) && !memcmp(p + n, dl_gpt_adam_m(g), n * 4) &&
              !memcmp(p + 2 * n, dl_gpt_adam_v(g), n * 4),
          "load_raw: params / m / v differ from what was saved");
    CHECK(got.step == 42 && got.data.epoch == 3 && got.data.index == 17 && got.seed == 99, "load_raw: state");

    /* another model's config: refused, buffers untouched */
    dl_model_config other = CFG;
    other.n_embd = 64;
    REQUIRE(dl_model_config_check(&other) == 0, "config");
    size_t n2;
    dl_model_tensor_table(&other, NULL, 0, &n2);
    float *q = calloc(3 * n2, sizeof(float));
    rc = dl_ckpt_load_raw(a, &other, n2, q, q + n2, q + 2 * n2, &got);
    untouched = 1;
    for (size_t i = 0; i < 3 * n2; i++) untouched &= q[i] == 0.0f;
    printf("load_raw of another model -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_EMISMATCH && untouched, "mismatched load_raw: rc %d, buffers untouched %d", rc, untouched);
    free(q);
    free(p);
    free(fa);
    free(fb);
    dl_gpt_close(&g);
    unlink(a);
    unlink(b);
    printf("ok: raw-buffer checkpoints are the model's byte for byte and load back exactly\n");
}

/* ---- the CPU trainer: step/eval/save/resume through the API */

static void test_cpu_resume(void)
{
    dl_train_cfg tc = train_cfg(DL_DEVICE_CPU);
    dl_trainer *a = NULL, *b = NULL;
    REQUIRE(dl_trainer_open(&tc, open_data(), &a) == 0, "open a: %s", dl_errmsg());
    REQUIRE(dl_trainer_open(&tc, open_data(), &b) == 0, "open b: %s", dl_errmsg());
    CHECK(dl_trainer_device(a) == DL_DEVICE_CPU && dl_trainer_model(a) && !dl_trainer_gptc(a), "cpu trainer");
    CHECK(dl_trainer_num_params(a) == dl_gpt_num_params(dl_trainer_model(a)) &&
              dl_trainer_model_cfg(a)->padded_vocab == 256,
          "params %zu, padded vocab %d", dl_trainer_num_params(a), dl_trainer_model_cfg(a)->padded_vocab);
    double la[8], lb = 0, first = 0;
    float norm = -1.0f;
    for (int s = 0; s < 3; s++) {
        CHECK(dl_trainer_step(a, &la[s], &norm) == 0, "step %d", s);
        if (s == 0) first = la[0];
    }
    CHECK(isfinite(first) && norm > 0.0f, "first loss %g, norm %g", first, norm);
    char path[600];
    snprintf(path, sizeof path, "%s/trainer.ckpt", dir);
    REQUIRE(dl_trainer_save(a, path) == 0, "save: %s", dl_errmsg());
    dl_alloc_fail_after(1); /* the checkpoint's staging buffer: refused, b stays at step 0 */
    int rc = dl_trainer_resume(b, path);
    dl_alloc_fail_after(0);
    CHECK(rc == DL_ENOMEM && dl_trainer_steps_done(b) == 0 && strstr(dl_errmsg(), "x 3 buffers"),
          "resume out of memory: rc %d at step %lld '%s'", rc, (long long)dl_trainer_steps_done(b), dl_errmsg());
    REQUIRE(dl_trainer_resume(b, path) == 0, "resume: %s", dl_errmsg());
    CHECK(dl_trainer_steps_done(b) == 3, "resumed at step %lld", (long long)dl_trainer_steps_done(b));
    int same = 1;
    for (int s = 3; s < 8; s++) {
        CHECK(dl_trainer_step(a, &la[s], NULL) == 0 && dl_trainer_step(b, &lb, NULL) == 0, "step %d", s);
        same &= memcmp(&la[s], &lb, sizeof lb) == 0;
    }
    CHECK(same, "losses after resume differ from the uninterrupted run");
    size_t n = dl_trainer_num_params(a);
    CHECK(!memcmp(dl_gpt_params(dl_trainer_model(a)), dl_gpt_params(dl_trainer_model(b)), n * 4),
          "parameters after resume differ");
    double va = -1, vb = -1;
    CHECK(dl_trainer_eval(a, &va) == 0 && dl_trainer_eval(b, &vb) == 0 && va == vb && isfinite(va), "eval %g %g", va,
          vb);
    CHECK(la[7] < first, "loss fell: %g -> %g", first, la[7]);
    printf("ok: cpu trainer: 3 steps, save, resume, 5 more steps bit-identical (loss %.4f -> %.4f, val %.4f)\n", first,
           la[7], va);
    dl_trainer_close(&a);
    dl_trainer_close(&b);
    dl_trainer_close(&b);
    CHECK(a == NULL && b == NULL, "close NULLs");
    unlink(path);
}

/* ---- device selection errors */

static void test_devices(void)
{
    dl_trainer *t = (dl_trainer *)&CFG; /* must be overwritten with NULL */
    dl_train_cfg tc = train_cfg(7);
    int rc = dl_trainer_open(&tc, open_data(), &t);
    CHECK(rc == DL_EINVAL && t == NULL, "unknown device 7: rc %d", rc);
    printf("device 7 -> %s: %s\n", dl_strerror(rc), dl_errmsg());

    tc = train_cfg(DL_DEVICE_CUDA);
#ifndef DLOCO_HAVE_CUDA
    rc = dl_trainer_open(&tc, open_data(), &t);
    printf("cuda trainer in a build without CUDA -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_ENODEV && t == NULL && strstr(dl_errmsg(), "this build has no CUDA"),
          "cuda trainer without CUDA: rc %d '%s'", rc, dl_errmsg());
#else
    if (dl_cuda_available()) {
        printf("a CUDA device is present: the CUDA trainer is tested by test_cuda_learner\n");
        return;
    }
    rc = dl_trainer_open(&tc, open_data(), &t);
    printf("cuda trainer without a device -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK((rc == DL_ENODEV || rc == DL_ECUDA) && t == NULL, "cuda trainer without a device: rc %d", rc);
    dl_cuda_thread_release();
#endif
    printf("ok: device errors\n");
}

/* ---- the CUDA trainer's host staging for checkpoints: 3 (4 with
 * adam_fleet) x nparams floats, each the first allocation of the call; no
 * room is a DL_ENOMEM that writes no file and leaves the trainer usable */

static void test_cuda_staging(void)
{
#ifdef DLOCO_HAVE_CUDA
    if (!dl_cuda_available()) {
        printf("SKIP: no CUDA device: the CUDA trainer's checkpoint staging refusals are not exercised\n");
        dl_cuda_thread_release();
        return;
    }
    char ck[600];
    snprintf(ck, sizeof ck, "%s/cuda.ckpt", dir);
    for (int fleet = 0; fleet < 2; fleet++) {
        dl_train_cfg tc = train_cfg(DL_DEVICE_CUDA);
        tc.fleet = fleet ? 4.0f : 0.0f;
        dl_trainer *t = NULL;
        REQUIRE(dl_trainer_open(&tc, open_data(), &t) == 0, "cuda trainer (fleet %d): %s", fleet, dl_errmsg());
        char want[160];
        snprintf(want, sizeof want, "checkpoint staging of %zu parameters x %d buffers (", dl_trainer_num_params(t),
                 3 + fleet);
        dl_err_clear();
        dl_alloc_fail_after(1);
        int rc = dl_trainer_save(t, ck);
        dl_alloc_fail_after(0);
        printf("cuda save (fleet %d) without memory -> %s: %s\n", fleet, dl_strerror(rc), dl_errmsg());
        CHECK(rc == DL_ENOMEM && strstr(dl_errmsg(), want) && strstr(dl_errmsg(), "out of memory"),
              "cuda save (fleet %d) out of memory: rc %d '%s' (want '%s')", fleet, rc, dl_errmsg(), want);
        CHECK(access(ck, F_OK) != 0, "no checkpoint file after a refused save");
        CHECK(dl_trainer_save(t, ck) == 0, "cuda save (fleet %d) after the failure: %s", fleet, dl_errmsg());
        if (!fleet) {
            dl_alloc_fail_after(1);
            rc = dl_trainer_resume(t, ck);
            dl_alloc_fail_after(0);
            printf("cuda resume without memory -> %s: %s\n", dl_strerror(rc), dl_errmsg());
            CHECK(rc == DL_ENOMEM && strstr(dl_errmsg(), "x 3 buffers (") && strstr(dl_errmsg(), "out of memory"),
                  "cuda resume out of memory: rc %d '%s'", rc, dl_errmsg());
            CHECK(dl_trainer_resume(t, ck) == 0, "cuda resume after the failure: %s", dl_errmsg());
        }
        dl_trainer_close(&t);
        unlink(ck);
    }
    dl_cuda_thread_release();
    printf("ok: cuda checkpoint staging refusals\n");
#else
    printf("SKIP: a build without CUDA: the CUDA trainer's checkpoint staging refusals are not exercised\n");
#endif
}

/* ---- adam_fleet's two nparams-float buffers (ga, w): allocated by
 * dl_trainer_open just before the two token buffers, so they are the
 * 4th and 3rd allocations from the end of a successful open. Either one
 * failing is a DL_ENOMEM, the data is closed, no handle comes back. */

static void test_fleet_out_of_memory(void)
{
    dl_train_cfg tc = train_cfg(DL_DEVICE_CPU);
    tc.fleet = 4.0f;
    dl_trainer *t = NULL;
    dl_data *d = open_data();
    long long c0 = dl_alloc_count();
    REQUIRE(dl_trainer_open(&tc, d, &t) == 0, "fleet trainer: %s", dl_errmsg());
    long long nalloc = dl_alloc_count() - c0;
    char want[160];
    snprintf(want, sizeof want, "adam_fleet state of %zu parameters x 2 buffers (", dl_trainer_num_params(t));
    dl_trainer_close(&t);
    for (long long k = nalloc - 3; k <= nalloc - 2; k++) {
        d = open_data();
        t = (dl_trainer *)&CFG; /* must come back NULL */
        dl_err_clear();
        dl_alloc_fail_after(k);
        int rc = dl_trainer_open(&tc, d, &t);
        dl_alloc_fail_after(0);
        printf("allocation %lld of %lld in a fleet dl_trainer_open failed -> %s: %s\n", k, nalloc, dl_strerror(rc),
               dl_errmsg());
        CHECK(rc == DL_ENOMEM && t == NULL, "allocation %lld: rc %d", k, rc);
        CHECK(strstr(dl_errmsg(), want) && strstr(dl_errmsg(), "out of memory"), "allocation %lld: '%s' lacks '%s'",
              k, dl_errmsg(), want);
    }
    REQUIRE(dl_trainer_open(&tc, open_data(), &t) == 0, "a fleet open after the failures: %s", dl_errmsg());
    double l = NAN;
    CHECK(dl_trainer_step(t, &l, NULL) == 0 && isfinite(l), "a step after the failures: loss %f", l);
    dl_trainer_close(&t);
}

/* ---- adam_fleet: the split-batch step uses the whole batch, refuses what it cannot do */

static void test_fleet(void)
{
    dl_trainer *plain = NULL, *fl = NULL;
    dl_train_cfg tc = train_cfg(DL_DEVICE_CPU);
    REQUIRE(dl_trainer_open(&tc, open_data(), &plain) == 0, "plain trainer: %s", dl_errmsg());
    tc.fleet = 4.0f;
    REQUIRE(dl_trainer_open(&tc, open_data(), &fl) == 0, "fleet trainer: %s", dl_errmsg());
    /* same init, same batch: the halves' mean loss and the gradient norm of
     * (ga + gb) / 2 are the whole batch's */
    double l1 = 0, l2 = 0;
    float n1 = 0, n2 = 0;
    CHECK(dl_trainer_step(plain, &l1, &n1) == 0 && dl_trainer_step(fl, &l2, &n2) == 0, "steps");
    CHECK(fabs(l1 - l2) < 1e-5 * fabs(l1), "fleet step loss %.9f vs whole batch %.9f", l2, l1);
    CHECK(fabsf(n1 - n2) < 1e-4f * n1, "fleet gradient norm %.7f vs whole batch %.7f", n2, n1);
    /* a different second moment: the parameters after the step differ */
    const float *p1 = dl_gpt_params(dl_trainer_model(plain)), *p2 = dl_gpt_params(dl_trainer_model(fl));
    size_t n = dl_trainer_num_params(plain), differ = 0;
    for (size_t i = 0; i < n; i++) differ += p1[i] != p2[i];
    CHECK(differ > n / 10, "fleet step moved %zu of %zu parameters differently from plain AdamW", differ, n);
    double first = l2, last = l2;
    for (int s = 0; s < 15; s++) CHECK(dl_trainer_step(fl, &last, NULL) == 0, "fleet step %d", s);
    CHECK(last < first, "fleet training loss fell: %.4f -> %.4f", first, last);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/fleet.ckpt", dir);
    /* max(v,0)+w is staged in nparams floats first: without them, a DL_ENOMEM and no file */
    dl_err_clear();
    dl_alloc_fail_after(1);
    int rc = dl_trainer_save(fl, ck);
    dl_alloc_fail_after(0);
    char want[160];
    snprintf(want, sizeof want, "checkpoint staging of %zu parameters (", n);
    printf("fleet save without memory -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_ENOMEM && strstr(dl_errmsg(), want) && strstr(dl_errmsg(), "out of memory"),
          "fleet save out of memory: rc %d '%s'", rc, dl_errmsg());
    CHECK(access(ck, F_OK) != 0, "no checkpoint file after a refused save");
    CHECK(dl_trainer_save(fl, ck) == 0, "fleet save: %s", dl_errmsg());
    rc = dl_trainer_resume(fl, ck);
    /* a plain checkpoint (the effective second moment, not its parts) is an AdamW file: a fleet run resumes
     * only its own recovery file's kind (tests/test_recovery.c) */
    CHECK(rc == DL_EMISMATCH && strstr(dl_errmsg(), "adam_fleet 0"), "fleet resume refused: rc %d '%s'", rc,
          dl_errmsg());
    /* the checkpoint holds max(v,0)+w: a plain-AdamW state even where the
     * fleet's v (the EMA of ga*gb) went negative */
    const float *fv = dl_gpt_adam_v(dl_trainer_model(fl));
    size_t neg = 0;
    for (size_t i = 0; i < n; i++) neg += fv[i] < 0.0f;
    dl_trainer *pl = NULL;
    tc = train_cfg(DL_DEVICE_CPU);
    REQUIRE(dl_trainer_open(&tc, open_data(), &pl) == 0, "plain trainer: %s", dl_errmsg());
    CHECK(dl_trainer_resume(pl, ck) == 0, "plain run resumes a fleet checkpoint: %s", dl_errmsg());
    const float *pv = dl_gpt_adam_v(dl_trainer_model(pl));
    size_t pneg = 0, fixed = 0;
    for (size_t i = 0; i < n; i++) {
        pneg += pv[i] < 0.0f;
        fixed += fv[i] < 0.0f && pv[i] >= 0.0f;
    }
    double lp = NAN;
    CHECK(dl_trainer_step(pl, &lp, NULL) == 0 && isfinite(lp), "plain step after a fleet checkpoint: loss %f", lp);
    CHECK(neg > 0 && pneg == 0 && fixed == neg, "fleet v had %zu negative entries, the checkpoint %zu", neg, pneg);
    printf("fleet checkpoint: %zu negative v entries stored as max(v,0)+w; plain resume steps to loss %.4f\n", neg,
           lp);
    dl_trainer_close(&pl);
    unlink(ck);
    dl_trainer_close(&plain);
    dl_trainer_close(&fl);

    struct { float fleet; int batch, device; const char *msg; } bad[] = {
        {0.5f, 4, DL_DEVICE_CPU, "0 (off) or a batch multiple"},
        {4.0f, 3, DL_DEVICE_CPU, "even batch"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dl_trainer *t = NULL;
        tc = train_cfg(bad[i].device);
        tc.fleet = bad[i].fleet;
        tc.batch = bad[i].batch;
        rc = dl_trainer_open(&tc, open_data(), &t);
        CHECK(rc == DL_EINVAL && t == NULL && strstr(dl_errmsg(), bad[i].msg), "fleet %g batch %d device %d: rc %d '%s'",
              bad[i].fleet, bad[i].batch, bad[i].device, rc, dl_errmsg());
        printf("fleet %g, batch %d, device %d -> %s\n", bad[i].fleet, bad[i].batch, bad[i].device, dl_errmsg());
    }
    test_fleet_out_of_memory();
    printf("ok: adam_fleet\n");
}

int main(void)
{
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    REQUIRE(f, "corpus");
    for (int i = 1; i <= 400; i++)
        fprintf(f, "line %d: the quick brown fox jumps over the lazy dog %d\n", i, i * 7919 % 1000);
    fclose(f);
    REQUIRE(dl_model_config_check(&CFG) == 0, "config: %s", dl_errmsg());

    test_ckpt_raw();
    test_cpu_resume();
    test_devices();
    test_fleet();
    test_cuda_staging();

    unlink(corpus);
    rmdir(dir);
    printf("test_train: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
