/* dloco-learner: trains the GPT, either networked (default: pushes fragment pseudo-gradients to dloco-sync,
 * docs/PROTOCOL.md; run_net.c) or --standalone (one learner, no synchronizer; run_local.c). This file: the
 * options, the device, the data and the trainer both modes share, then the run of the mode. */
#include "gpt/main_int.h"

#include <ctype.h>
#include <dirent.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/model.h"
#include "kernels/blas_select.h"
#include "learner/learner_int.h"
#ifdef DLOCO_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif

volatile sig_atomic_t dl_main_stop;
static dloco_learner *g_learner; /* networked: the library handle the signal also stops (join, barrier) */
static void on_signal(int sig)
{
    (void)sig;
    dl_main_stop = 1;
    if (g_learner) dloco_learner_stop(g_learner);
}

void dl_main_catch_signals(dloco_learner *lib)
{
    g_learner = lib;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
}

int dl_main_fail(const char *what, int rc)
{
    fprintf(stderr, "dloco-learner: %s: %s%s%s\n", what, dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 2;
}

void dl_main_print_data(const learner_cfg *cfg, const dl_data *data, int vocab)
{
    printf("data: %s (%s, %llu tokens, %llu train / %llu val sequences)", cfg->data, dl_data_kind(data),
           (unsigned long long)dl_data_num_tokens(data), (unsigned long long)dl_data_train_seqs(data),
           (unsigned long long)dl_data_val_seqs(data));
    printf(", vocab %d\n", vocab);
    fflush(stdout);
    char ev_path[DL_CFG_STRLEN + 8];
    dl_event("data", "path=%s kind=%s vocab=%d tokens=%llu train_seqs=%llu val_seqs=%llu",
             dl_event_str(cfg->data, ev_path, sizeof ev_path), dl_data_kind(data), vocab,
             (unsigned long long)dl_data_num_tokens(data), (unsigned long long)dl_data_train_seqs(data),
             (unsigned long long)dl_data_val_seqs(data));
}

/* Other dloco-learner processes on this host (their /proc/PID/comm): each
 * with --threads 0 takes every core, and two of them on one host thrash
 * (measured: 9.2 s against 1.0 s per step on 2 cores). */
static int other_learners(void)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0]) || atol(e->d_name) == (long)self) continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && !strcmp(comm, "dloco-learner\n")) n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* Networked with --threads 0 and no OMP_NUM_THREADS: all cores, which is
 * right for a learner alone on its host and wrong for several; say so. */
static void warn_shared_cores(const learner_cfg *cfg)
{
    const char *omp = getenv("OMP_NUM_THREADS");
    if (cfg->standalone || cfg->threads > 0 || (omp && omp[0])) return;
    int others = other_learners();
    if (!others) return;
    int cores = omp_get_num_procs(), each = cores / (others + 1) > 0 ? cores / (others + 1) : 1;
    DL_WARN("%d other dloco-learner process%s on this host, and this one takes all %d cores (--threads 0): learners "
            "sharing cores slow each other down many times over; give each --threads %d (cores / learners)",
            others, others > 1 ? "es run" : " runs", cores, each);
    dl_event("threads_shared", "id=%s threads=%d cores=%d others=%d suggested=%d", cfg->id, omp_get_max_threads(),
             cores, others, each);
}

/* The main thread's cuBLAS handle and scratch (kernels/cuda), once the model is gone. */
static void release_device(int device)
{
#ifdef DLOCO_HAVE_CUDA
    if (device == DL_DEVICE_CUDA) dl_cuda_thread_release();
#else
    (void)device;
#endif
}

/* --device: *device (DL_DEVICE_*), a line for the log (`desc`) and the
 * Hello.device string. DL_ENODEV for --device cuda without a usable one. */
static int pick_device(const learner_cfg *cfg, int *device, char *desc, size_t cap, char *hello, size_t hcap)
{
    *device = DL_DEVICE_CPU;
    snprintf(hello, hcap, "cpu");
    if (!strcmp(cfg->device, "cpu")) {
        snprintf(desc, cap, "cpu (--device cpu)");
        return 0;
    }
    char why[512];
#ifdef DLOCO_HAVE_CUDA
    if (dl_cuda_available()) {
        char name[200];
        if (dl_cuda_device_name(name, sizeof name) != 0) snprintf(name, sizeof name, "unnamed CUDA device");
        int prec = !strcmp(cfg->matmul, "fp32") ? DL_MATMUL_FP32 : !strcmp(cfg->matmul, "bf16") ? DL_MATMUL_BF16
                                                                                              : DL_MATMUL_TF32;
        dl_cuda_set_matmul(prec);
        *device = DL_DEVICE_CUDA;
        snprintf(desc, cap, "cuda: %s, matmul %s (--device %s)", name, dl_cuda_matmul_name(prec), cfg->device);
        snprintf(hello, hcap, "cuda:0 %.120s", name);
        return 0;
    }
    snprintf(why, sizeof why, "no usable CUDA device (%s)", dl_errmsg());
#else
    snprintf(why, sizeof why, "this build has no CUDA (configured without nvcc or with -DDLOCO_CUDA=OFF)");
#endif
    if (!strcmp(cfg->device, "cuda")) return dl_err(DL_ENODEV, "--device cuda: %s", why);
    snprintf(desc, cap, "cpu (--device auto: %s)", why);
    return 0;
}

/* --precision bf16 on the CPU model (after the device is known: --device auto on a GPU refuses it). */
static int apply_precision(const learner_cfg *cfg, dl_trainer *tr)
{
    if (strcmp(cfg->precision, "bf16")) return 0;
    if (dl_trainer_device(tr) != DL_DEVICE_CPU)
        return dl_err(DL_EINVAL, "option precision: bf16 is the CPU model's, and this learner trains on a GPU "
                                 "(--device %s): use --matmul bf16 there, or --device cpu", cfg->device);
    dl_gpt_set_precision(dl_trainer_model(tr), DL_GPT_PREC_BF16);
    printf("precision: bf16 GEMM inputs, fp32 sums, fp32 master weights (--precision bf16)\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (dl_blas_select(&argc, argv)) return 2; /* before any matmul: OpenBLAS's kernels (kernels/blas_select.h) */
    learner_cfg cfg;
    int rc;
    if (dl_options_parse(argc, argv, &cfg, &rc)) return rc;
    if ((rc = dl_options_check_hetero(&cfg))) return dl_main_fail("bad configuration", rc);
    dl_log_set_level(dl_log_level_parse(cfg.log_level));
    dl_log_set_name("learner");
    if ((rc = dl_event_open(cfg.events, "learner"))) return dl_main_fail("opening the events file (option events)", rc);
    int id_given = cfg.id[0] != 0; /* a default id (hostname-pid) is never met again: no recovery file */
    if (!cfg.standalone) {
        if (!cfg.id[0]) dl_learner_default_id(cfg.id, sizeof cfg.id);
        if ((rc = dl_options_check_networked(&cfg))) return dl_main_fail("bad configuration", rc);
    }
    double gpa_mu_x = 0.0;
    if ((rc = dl_options_check_optimizer(&cfg, &gpa_mu_x))) return dl_main_fail("bad configuration", rc);
    if (cfg.threads > 0) omp_set_num_threads((int)cfg.threads);
    warn_shared_cores(&cfg);
    if (cfg.warmup >= cfg.steps) cfg.warmup = cfg.steps / 10;

    int device;
    char device_desc[768], hello_device[129];
    if ((rc = pick_device(&cfg, &device, device_desc, sizeof device_desc, hello_device, sizeof hello_device)))
        return dl_main_fail("choosing the device", rc);
    printf("device: %s\n", device_desc);
    if (device == DL_DEVICE_CPU && strcmp(cfg.matmul, "tf32"))
        printf("note: --matmul %s ignored on the cpu (OpenBLAS sgemm, fp32)\n", cfg.matmul);
    fflush(stdout);
    {
        char ev_hello[200], ev_desc[900];
        /* matmul: the precision in use (the cpu is always fp32) */
        dl_event("device", "device=%s matmul=%s desc=%s", dl_event_str(hello_device, ev_hello, sizeof ev_hello),
                 device == DL_DEVICE_CPU ? "fp32" : cfg.matmul, dl_event_str(device_desc, ev_desc, sizeof ev_desc));
    }

    /* the model options before any data is read; vocab 0 ("from the data")
     * stands for a valid one until the data says which */
    dl_model_opts mo = cfg.model;
    if (!mo.vocab) mo.vocab = DL_MODEL_VOCAB_MIN;
    if ((rc = dl_model_config_from(&mo, &(dl_model_config){0}))) return dl_main_fail("model config", rc);

    dl_data_opts dopt = {.path = cfg.data,
                         .format = cfg.data_format,
                         .seq_len = (int)cfg.model.seq_len,
                         .vocab = cfg.model.vocab ? (int)cfg.model.vocab : 65536,
                         .val_frac = cfg.val_frac,
                         .seed = (uint64_t)cfg.seed,
                         .shard_index = (int)cfg.data_shard,
                         .shard_count = (int)cfg.data_shards,
                         .shard_mode = !strcmp(cfg.data_shard_mode, "cluster") ? DL_DATA_SHARD_CLUSTER : DL_DATA_SHARD_IID,
                         .min_seqs = (int)cfg.batch};
    dl_data *data = NULL;
    if ((rc = dl_data_open(&dopt, &data))) return dl_main_fail("loading data", rc);
    int vocab = cfg.model.vocab ? (int)cfg.model.vocab : (!strcmp(dl_data_kind(data), "text") ? 256 : 50257);
    if (!cfg.model.vocab && strcmp(dl_data_kind(data), "text")) {
        /* re-open with the real bound so out-of-range tokens are refused */
        dl_data_close(&data);
        dopt.vocab = vocab;
        if ((rc = dl_data_open(&dopt, &data))) return dl_main_fail("loading data", rc);
    }
    dl_train_cfg tc = {
        .batch = (int)cfg.batch,
        .steps = cfg.steps,
        .lr = (float)cfg.lr,
        .warmup = cfg.warmup,
        .min_lr_frac = (float)cfg.min_lr_frac,
        .adamw = {.beta1 = (float)cfg.beta1, .beta2 = (float)cfg.beta2, .eps = (float)cfg.eps,
                  .weight_decay = (float)cfg.weight_decay, .grad_clip = (float)cfg.grad_clip},
        .seed = (uint64_t)cfg.seed,
        .val_batches = (int)cfg.val_batches,
        .device = device,
        .fleet = (float)cfg.adam_fleet,
        .optimizer = !strcmp(cfg.optimizer, "gpa") ? DL_OPT_GPA : DL_OPT_ADAMW,
        .gpa_mu_x = (float)gpa_mu_x,
        .gpa_mu_y = (float)cfg.gpa_mu_y,
    };
    mo.vocab = vocab; /* 0 resolved from the data above */
    if ((rc = dl_model_config_from(&mo, &tc.model))) {
        dl_data_close(&data);
        return dl_main_fail("model config", rc);
    }
    dl_trainer *tr = NULL;
    if ((rc = dl_trainer_open(&tc, data, &tr))) return dl_main_fail("building the model", rc);
    if ((rc = apply_precision(&cfg, tr))) {
        dl_trainer_close(&tr);
        return dl_main_fail("bad configuration", rc);
    }
    dl_event("learner_hetero", "id=%s precision=%s dynamic_h=%s dynamic_h_min=%lld dynamic_h_max=%lld "
             "data_shard_mode=%s data_shard=%lld data_shards=%lld train_seqs=%llu", cfg.standalone ? "standalone" : cfg.id,
             cfg.precision, cfg.dynamic_h, (long long)cfg.dynamic_h_min, (long long)cfg.dynamic_h_max,
             cfg.data_shard_mode, (long long)cfg.data_shard, (long long)cfg.data_shards,
             (unsigned long long)dl_data_train_seqs(data));
    if (tc.optimizer == DL_OPT_GPA) {
        printf("optimizer: gpa, mu_x %.6g%s, mu_y %.6g (one more parameter copy: %.1f MB)\n", (double)tc.gpa_mu_x,
               cfg.gpa_mu_x == -1.0 ? " (gpa_mu^(1/gpa_h))" : "", (double)tc.gpa_mu_y,
               (double)dl_trainer_num_params(tr) * sizeof(float) * 1e-6);
        dl_event("optimizer", "name=gpa mu_x=%.9g mu_y=%.9g mu_x_from=%s", (double)tc.gpa_mu_x, (double)tc.gpa_mu_y,
                 cfg.gpa_mu_x == -1.0 ? "mapping" : "option");
    } else {
        dl_event("optimizer", "name=adamw");
    }
    rc = cfg.standalone ? dl_run_local(&cfg, tr, &tc, data, hello_device)
                        : dl_run_net(&cfg, id_given, tr, &tc, data, hello_device);
    dl_trainer_close(&tr);
    release_device(device);
    return rc;
}
