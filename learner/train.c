/* Inner loop of a learner: batches from the loader, forward/backward on the
 * GPT, global-norm clipping and AdamW with warm-up + cosine schedule. */
#include "learner/train.h"

#include "core/err.h"

#include <math.h>
#include <stdlib.h>

struct dl_trainer {
    dl_train_cfg cfg;
    dl_gpt *model;
    dl_data *data;
    int64_t step; /* completed steps */
    int32_t *inp, *tgt;
};

int dl_trainer_open(const dl_train_cfg *cfg, dl_data *data, dl_trainer **out)
{
    *out = NULL;
    dl_trainer *t = dl_xcalloc(1, sizeof *t);
    t->cfg = *cfg;
    int rc = dl_gpt_open(&cfg->model, cfg->batch, &t->model);
    if (rc) {
        free(t);
        return rc;
    }
    dl_gpt_init(t->model, cfg->seed);
    t->data = data;
    size_t n = (size_t)cfg->batch * cfg->model.seq_len;
    t->inp = dl_xmalloc(n * sizeof(int32_t));
    t->tgt = dl_xmalloc(n * sizeof(int32_t));
    *out = t;
    return 0;
}

void dl_trainer_close(dl_trainer **tp)
{
    if (!tp || !*tp) return;
    dl_trainer *t = *tp;
    dl_gpt_close(&t->model);
    dl_data_close(&t->data);
    free(t->inp);
    free(t->tgt);
    free(t);
    *tp = NULL;
}

float dl_trainer_lr_at(const dl_trainer *t, int64_t step)
{
    const dl_train_cfg *c = &t->cfg;
    if (step <= c->warmup) return c->lr * (float)step / (float)(c->warmup > 0 ? c->warmup : 1);
    if (step >= c->steps) return c->lr * c->min_lr_frac;
    double frac = (double)(step - c->warmup) / (double)(c->steps - c->warmup);
    double coeff = 0.5 * (1.0 + cos(M_PI * frac));
    return (float)(c->lr * (c->min_lr_frac + (1.0 - c->min_lr_frac) * coeff));
}

double dl_trainer_step(dl_trainer *t, float *grad_norm)
{
    int B = t->cfg.batch, T = t->cfg.model.seq_len;
    dl_data_next_train(t->data, B, t->inp, t->tgt);
    double loss = dl_gpt_forward(t->model, t->inp, t->tgt, B, T);
    dl_gpt_zero_grad(t->model);
    dl_gpt_backward(t->model);
    t->step++;
    float norm = dl_gpt_adamw_step(t->model, &t->cfg.adamw, dl_trainer_lr_at(t, t->step), t->step);
    if (grad_norm) *grad_norm = norm;
    return loss;
}

double dl_trainer_eval(dl_trainer *t)
{
    int B = t->cfg.batch, T = t->cfg.model.seq_len;
    double sum = 0.0;
    for (int i = 0; i < t->cfg.val_batches; i++) {
        dl_data_val_batch(t->data, (uint64_t)i, B, t->inp, t->tgt);
        sum += dl_gpt_forward(t->model, t->inp, t->tgt, B, T);
    }
    return sum / t->cfg.val_batches;
}

int64_t dl_trainer_steps_done(const dl_trainer *t) { return t->step; }
dl_gpt *dl_trainer_model(dl_trainer *t) { return t->model; }
dl_data *dl_trainer_data(dl_trainer *t) { return t->data; }

int dl_trainer_save(dl_trainer *t, const char *path)
{
    dl_ckpt_state st = {.step = t->step, .data = dl_data_get_pos(t->data), .seed = t->cfg.seed};
    return dl_ckpt_save(path, t->model, &st);
}

int dl_trainer_resume(dl_trainer *t, const char *path)
{
    dl_ckpt_state st;
    DL_TRY(dl_ckpt_load(path, t->model, &st));
    DL_TRY(dl_data_set_pos(t->data, st.data));
    t->step = st.step;
    return 0;
}
