/* The learner's inner loop: model + data + AdamW (or GPA over AdamW) + learning-rate schedule,
 * one call per training step, plus evaluation and checkpoint save/resume.
 * Standalone and networked learners drive the same one, on the CPU or a GPU. */
#ifndef DL_LEARNER_TRAIN_H
#define DL_LEARNER_TRAIN_H

#include "gpt/ckpt.h"
#include "gpt/data.h"
#include "gpt/gpa.h"
#include "gpt/gpt.h"

/* Where the model lives. */
enum {
    DL_DEVICE_CPU = 0, /* dl_gpt: host buffers, kernels/cpu.c (the reference) */
    DL_DEVICE_CUDA = 1 /* dl_gptc: device buffers, kernels/cuda (builds with DLOCO_HAVE_CUDA only) */
};

typedef struct {
    dl_model_config model;
    int batch;          /* B sequences per step */
    int64_t steps;      /* total optimizer steps (schedule length) */
    float lr;           /* peak inner learning rate */
    int64_t warmup;     /* linear warm-up steps */
    float min_lr_frac;  /* cosine decays to lr*min_lr_frac at `steps` */
    dl_adamw_cfg adamw;
    uint64_t seed;
    int val_batches;    /* batches per evaluation */
    int device;         /* DL_DEVICE_*; 0 (cpu) when left out */
    float fleet;        /* 0: plain AdamW. >= 1: the split-batch second moment of a fleet-times
                         * larger batch (dl_cpu_adamw_split; even batch; a checkpoint stores
                         * max(v,0)+w as v, a plain-AdamW state; not resumable with fleet) */
    int optimizer;      /* DL_OPT_ADAMW (0, also when left out) or DL_OPT_GPA (gpt/gpa.h: the
                         * model's parameters are the average x, the trainer keeps y; cpu only,
                         * not with fleet) */
    float gpa_mu_x, gpa_mu_y; /* GPA's coefficients, each in [0, 1) (dl_gpa_check) */
} dl_train_cfg;

typedef struct dl_trainer dl_trainer;
struct dl_gptc;

/* Takes ownership of `data` (closed on failure too). Initialises the model
 * from cfg->seed, identically on both devices. DL_DEVICE_CUDA in a build
 * without CUDA: DL_ENODEV ("this build has no CUDA"); without a usable
 * device: the DL_ENODEV / DL_ECUDA of gpt/gpt_cuda.h. DL_ENOMEM: the
 * CPU model (dl_gpt_open) or the adam_fleet state does not fit. GPA:
 * DL_EINVAL for an unknown optimizer, a coefficient dl_gpa_check refuses,
 * DL_DEVICE_CUDA (the GPU trainer has no GPA step; checked before any
 * device is touched) or fleet != 0; DL_ENOMEM when y does not fit. A GPA
 * trainer starts at x = y = z = the seeded init. */
int dl_trainer_open(const dl_train_cfg *cfg, dl_data *data, dl_trainer **out);
void dl_trainer_close(dl_trainer **t);

/* One forward/backward/AdamW step on the next training batch (GPA: the
 * forward/backward at y, then dl_gpa_step): *loss = the training loss (at y), *grad_norm (may be NULL) = the gradient norm before
 * clipping. Returns 0; on CUDA also DL_ECUDA (the trainer is unusable after)
 * or DL_ERANGE when the gradient norm is not finite (the update was skipped;
 * *loss is still set). The CPU step never fails (a diverged step shows as a
 * non-finite loss). */
int dl_trainer_step(dl_trainer *t, double *loss, float *grad_norm);
/* Mean loss over cfg->val_batches fixed validation batches into *loss (at
 * the model's parameters: x for GPA). */
int dl_trainer_eval(dl_trainer *t, double *loss);

int64_t dl_trainer_steps_done(const dl_trainer *t);
float dl_trainer_lr_at(const dl_trainer *t, int64_t step); /* 1-based step */
int dl_trainer_device(const dl_trainer *t);                /* DL_DEVICE_* */
const dl_model_config *dl_trainer_model_cfg(const dl_trainer *t);
size_t dl_trainer_num_params(const dl_trainer *t);
/* The model of the trainer's device; the other one is NULL. Its parameters
 * are the model (GPA: x; y is swapped in only during a step). */
dl_gpt *dl_trainer_model(dl_trainer *t);
int dl_trainer_optimizer(const dl_trainer *t); /* DL_OPT_* */
/* GPA: y (dl_trainer_num_params floats, host), which the node's parameter
 * interface moves with x (dl_gpa_node_model_open); NULL for AdamW. */
float *dl_trainer_gpa_y(dl_trainer *t);
/* After the model's parameters were written from outside (--init_from): GPA
 * restarts its averaging there (y = x, so z = x); nothing for AdamW. */
void dl_trainer_params_written(dl_trainer *t);
struct dl_gptc *dl_trainer_gptc(dl_trainer *t);
dl_data *dl_trainer_data(dl_trainer *t);

/* Checkpoints (gpt/ckpt.h): the same file from either device, so a run
 * saved on a GPU resumes on a CPU and the other way round. The CUDA trainer
 * downloads / uploads parameters and AdamW moments through host buffers;
 * DL_ENOMEM when those (or the CPU fleet's v staging) do not fit. A GPA
 * trainer writes and reads GPA files only (x, m, v, y: resumed bit for bit
 * under the same mu_y; under another mu_y, y is re-derived from the file's
 * z, which is kept up to rounding), an AdamW trainer AdamW files only: the
 * other kind is DL_EMISMATCH (dl_ckpt_load_gpa). */
int dl_trainer_save(dl_trainer *t, const char *path);
int dl_trainer_resume(dl_trainer *t, const char *path);
/* As dl_trainer_resume but the data position stays where it is: a learner
 * on one data shard continuing a checkpoint of a run over all the data (a
 * data-parallel warm start), whose position means nothing on the shard. */
int dl_trainer_resume_optimizer(dl_trainer *t, const char *path);

/* A copy of the trainer's whole checkpoint state in host memory, taken between
 * steps and written later (on another thread: gpt/recovery.h), so the step
 * path pays one copy and never the write. */
typedef struct {
    dl_model_config model;
    size_t nparams;
    int gpa;          /* 1: buf holds y after v (a GPA file) */
    int fleet;        /* 1: buf holds adam_fleet's noise moment w after v (an adam_fleet file) */
    float *buf;       /* params (GPA: x), m, v (, y or w): nparams floats each; allocated by the first take */
    dl_ckpt_state st; /* step, data position, seed, mu_y; run_tag as the caller sets it */
} dl_trainer_snap;
/* Copy the state into s (buf allocated on the first call, reused after;
 * st.run_tag kept). DL_ENOMEM when buf does not fit; DL_EINVAL with
 * adam_fleet on CUDA (its state does not resume there yet; on the cpu it is
 * copied with its noise moment); on CUDA a download (DL_ECUDA). */
int dl_trainer_snap_take(dl_trainer *t, dl_trainer_snap *s);
/* Write the copy as a checkpoint file (atomically, as dl_trainer_save). */
int dl_trainer_snap_write(const dl_trainer_snap *s, const char *path);
void dl_trainer_snap_free(dl_trainer_snap *s); /* safe twice */

#endif
