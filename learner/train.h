/* The learner's inner loop: model + data + AdamW + learning-rate schedule,
 * one call per training step, plus evaluation and checkpoint save/resume.
 * Standalone training and (later) the networked learner drive the same one. */
#ifndef DL_LEARNER_TRAIN_H
#define DL_LEARNER_TRAIN_H

#include "learner/ckpt.h"
#include "learner/data.h"
#include "learner/gpt.h"

typedef struct {
    dl_gpt_config model;
    int batch;          /* B sequences per step */
    int64_t steps;      /* total optimizer steps (schedule length) */
    float lr;           /* peak inner learning rate */
    int64_t warmup;     /* linear warm-up steps */
    float min_lr_frac;  /* cosine decays to lr*min_lr_frac at `steps` */
    dl_adamw_cfg adamw;
    uint64_t seed;
    int val_batches;    /* batches per evaluation */
} dl_train_cfg;

typedef struct dl_trainer dl_trainer;

/* Takes ownership of `data`. Initialises the model from cfg->seed. */
int dl_trainer_open(const dl_train_cfg *cfg, dl_data *data, dl_trainer **out);
void dl_trainer_close(dl_trainer **t);

/* One forward/backward/AdamW step on the next training batch; returns the
 * training loss. Fills *grad_norm when non-NULL. */
double dl_trainer_step(dl_trainer *t, float *grad_norm);
/* Mean loss over cfg->val_batches fixed validation batches. */
double dl_trainer_eval(dl_trainer *t);

int64_t dl_trainer_steps_done(const dl_trainer *t);
float dl_trainer_lr_at(const dl_trainer *t, int64_t step); /* 1-based step */
dl_gpt *dl_trainer_model(dl_trainer *t);
dl_data *dl_trainer_data(dl_trainer *t);

int dl_trainer_save(dl_trainer *t, const char *path);
int dl_trainer_resume(dl_trainer *t, const char *path);

#endif
