/* Inner loop of a learner: batches from the loader, forward/backward on the
 * GPT (CPU dl_gpt or CUDA dl_gptc), global-norm clipping and AdamW with warm-up + cosine schedule. */
#include "gpt/train.h"

#include "core/err.h"
#include "core/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef DLOCO_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#include "gpt/gpt_cuda.h"
#endif

struct dl_trainer {
    dl_train_cfg cfg;
    dl_gpt *model;         /* DL_DEVICE_CPU */
    struct dl_gptc *gmodel; /* DL_DEVICE_CUDA */
    size_t nparams;
    dl_data *data;
    int64_t step; /* completed steps */
    int32_t *inp, *tgt;
    float *ga, *w;   /* fleet on the cpu: first half's gradient, noise moment */
    float *dga, *dw; /* the same in device memory (fleet on cuda) */
    float *gy;       /* GPA: y (nparams floats); the model's params are x */
};

static int open_model(dl_trainer *t)
{
    const dl_train_cfg *cfg = &t->cfg;
    if (cfg->device == DL_DEVICE_CPU) {
        DL_TRY(dl_gpt_open(&cfg->model, cfg->batch, &t->model));
        dl_gpt_init(t->model, cfg->seed);
        t->nparams = dl_gpt_num_params(t->model);
        return 0;
    }
    if (cfg->device != DL_DEVICE_CUDA) return dl_err(DL_EINVAL, "trainer: unknown device %d", cfg->device);
#ifdef DLOCO_HAVE_CUDA
    DL_TRY(dl_gptc_open(&cfg->model, cfg->batch, &t->gmodel));
    DL_TRY(dl_gptc_init(t->gmodel, cfg->seed));
    t->nparams = dl_gptc_num_params(t->gmodel);
    return 0;
#else
    return dl_err(DL_ENODEV, "this build has no CUDA (configured without nvcc or with -DDLOCO_CUDA=OFF)");
#endif
}

int dl_trainer_open(const dl_train_cfg *cfg, dl_data *data, dl_trainer **out)
{
    *out = NULL;
    dl_trainer *t = dl_xcalloc(1, sizeof *t);
    t->cfg = *cfg;
    t->data = data;
    /* fills padded_vocab, which the checkpoint header records */
    int rc = dl_model_config_check(&t->cfg.model);
    if (rc == 0 && !dl_gpa_optimizer_name(cfg->optimizer))
        rc = dl_err(DL_EINVAL, "trainer: unknown optimizer %d", cfg->optimizer);
    if (rc == 0 && cfg->optimizer == DL_OPT_GPA) {
        rc = dl_gpa_check(cfg->gpa_mu_x, cfg->gpa_mu_y);
        if (rc == 0 && cfg->device == DL_DEVICE_CUDA)
            rc = dl_err(DL_EINVAL, "optimizer gpa runs on the cpu only (the CUDA trainer has no GPA step): use "
                                   "--device cpu, or --optimizer adamw on the GPU");
        if (rc == 0 && cfg->fleet != 0.0f)
            rc = dl_err(DL_EINVAL, "optimizer gpa with adam_fleet %g: not supported together (adam_fleet 0)",
                        cfg->fleet);
    }
    if (rc == 0 && cfg->fleet != 0.0f) {
        if (!(cfg->fleet >= 1.0f && cfg->fleet <= 1e6f))
            rc = dl_err(DL_EINVAL, "adam_fleet %g: 0 (off) or a batch multiple in [1, 1e6]", cfg->fleet);
        else if (cfg->batch < 2 || cfg->batch % 2)
            rc = dl_err(DL_EINVAL, "adam_fleet needs an even batch of at least 2 (halves), got %d", cfg->batch);
    }
    if (rc == 0) rc = open_model(t);
    if (rc == 0 && cfg->fleet != 0.0f && t->model) {
        t->ga = dl_try_calloc(t->nparams, sizeof(float));
        t->w = t->ga ? dl_try_calloc(t->nparams, sizeof(float)) : NULL;
        if (!t->w)
            rc = dl_err(DL_ENOMEM, "adam_fleet state of %zu parameters x 2 buffers (%.2f GB): out of memory",
                        t->nparams, 2.0 * (double)t->nparams * sizeof(float) / 1e9);
    }
    if (rc == 0 && cfg->optimizer == DL_OPT_GPA) {
        t->gy = dl_try_malloc(t->nparams * sizeof(float));
        if (!t->gy)
            rc = dl_err(DL_ENOMEM, "gpa: the copy y of %zu parameters (%.2f GB): out of memory", t->nparams,
                        (double)t->nparams * sizeof(float) / 1e9);
        else
            memcpy(t->gy, dl_gpt_params(t->model), t->nparams * sizeof(float));
    }
#ifdef DLOCO_HAVE_CUDA
    if (rc == 0 && cfg->fleet != 0.0f && t->gmodel) {
        size_t bytes = t->nparams * sizeof(float);
        rc = dl_cuda_malloc(bytes, (void **)&t->dga);
        if (rc == 0) rc = dl_cuda_malloc(bytes, (void **)&t->dw);
        if (rc == 0) rc = dl_cuda_memset0(t->dw, bytes);
    }
#endif
    if (rc) {
        dl_trainer_close(&t);
        return rc;
    }
    size_t n = (size_t)t->cfg.batch * t->cfg.model.seq_len;
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
#ifdef DLOCO_HAVE_CUDA
    dl_gptc_close(&t->gmodel);
#endif
    dl_data_close(&t->data);
    free(t->inp);
    free(t->tgt);
    free(t->ga);
    free(t->w);
    free(t->gy);
#ifdef DLOCO_HAVE_CUDA
    dl_cuda_free((void **)&t->dga);
    dl_cuda_free((void **)&t->dw);
#endif
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

int dl_trainer_step(dl_trainer *t, double *loss, float *grad_norm)
{
    int B = t->cfg.batch, T = t->cfg.model.seq_len;
    dl_data_next_train(t->data, B, t->inp, t->tgt);
    if (t->model && t->ga) {
        /* two halves, two backward passes: ga, then the model's grads */
        int h = B / 2;
        size_t off = (size_t)h * T;
        double l1 = dl_gpt_forward(t->model, t->inp, t->tgt, h, T);
        dl_gpt_zero_grad(t->model);
        dl_gpt_backward(t->model);
        memcpy(t->ga, dl_gpt_grads(t->model), t->nparams * sizeof(float));
        double l2 = dl_gpt_forward(t->model, t->inp + off, t->tgt + off, h, T);
        dl_gpt_zero_grad(t->model);
        dl_gpt_backward(t->model);
        *loss = 0.5 * (l1 + l2);
        t->step++;
        float norm = dl_gpt_adamw_split_step(t->model, &t->cfg.adamw, dl_trainer_lr_at(t, t->step), t->step, t->ga,
                                             t->w, t->cfg.fleet);
        if (grad_norm) *grad_norm = norm;
        return 0;
    }
    if (t->gy) {
        /* the gradient at y: y into the parameter buffer for forward and
         * backward, x back (swaps are exact), then the step on (x, y) */
        float *x = dl_gpt_params(t->model);
        dl_gpa_swap(x, t->gy, t->nparams);
        *loss = dl_gpt_forward(t->model, t->inp, t->tgt, B, T);
        dl_gpt_zero_grad(t->model);
        dl_gpt_backward(t->model);
        dl_gpa_swap(x, t->gy, t->nparams);
        t->step++;
        float norm = dl_gpa_step(t->model, t->gy, &t->cfg.adamw, dl_trainer_lr_at(t, t->step), t->step,
                                 t->cfg.gpa_mu_x, t->cfg.gpa_mu_y);
        if (grad_norm) *grad_norm = norm;
        return 0;
    }
    if (t->model) {
        *loss = dl_gpt_forward(t->model, t->inp, t->tgt, B, T);
        dl_gpt_zero_grad(t->model);
        dl_gpt_backward(t->model);
        t->step++;
        float norm = dl_gpt_adamw_step(t->model, &t->cfg.adamw, dl_trainer_lr_at(t, t->step), t->step);
        if (grad_norm) *grad_norm = norm;
        return 0;
    }
#ifdef DLOCO_HAVE_CUDA
    /* The forward returns after the loss reached the host; the AdamW kernels
     * are still queued on the device when this returns (the next step's
     * token upload waits for them, so does a push snapshot). */
    *loss = NAN;
    if (t->dga) {
        /* two halves: the first's gradient is copied aside on the compute stream */
        int h = B / 2;
        size_t off = (size_t)h * T;
        double l1 = NAN, l2 = NAN;
        DL_TRY(dl_gptc_forward(t->gmodel, t->inp, t->tgt, h, T, &l1));
        DL_TRY(dl_gptc_zero_grad(t->gmodel));
        DL_TRY(dl_gptc_backward(t->gmodel));
        DL_TRY(dl_cuda_copy_async(t->dga, dl_gptc_grads_dev(t->gmodel), t->nparams * sizeof(float), NULL));
        DL_TRY(dl_gptc_forward(t->gmodel, t->inp + off, t->tgt + off, h, T, &l2));
        DL_TRY(dl_gptc_zero_grad(t->gmodel));
        DL_TRY(dl_gptc_backward(t->gmodel));
        *loss = 0.5 * (l1 + l2);
        t->step++;
        float norm = NAN;
        int rc = dl_gptc_adamw_split_step(t->gmodel, &t->cfg.adamw, dl_trainer_lr_at(t, t->step), t->step, t->dga,
                                          t->dw, t->cfg.fleet, &norm);
        if (grad_norm) *grad_norm = norm;
        return rc;
    }
    DL_TRY(dl_gptc_forward(t->gmodel, t->inp, t->tgt, B, T, loss));
    DL_TRY(dl_gptc_zero_grad(t->gmodel));
    DL_TRY(dl_gptc_backward(t->gmodel));
    t->step++;
    float norm = NAN;
    int rc = dl_gptc_adamw_step(t->gmodel, &t->cfg.adamw, dl_trainer_lr_at(t, t->step), t->step, &norm);
    if (grad_norm) *grad_norm = norm;
    return rc;
#else
    return dl_err(DL_ENODEV, "trainer without a model");
#endif
}

int dl_trainer_eval(dl_trainer *t, double *loss)
{
    int B = t->cfg.batch, T = t->cfg.model.seq_len;
    double sum = 0.0;
    for (int i = 0; i < t->cfg.val_batches; i++) {
        dl_data_val_batch(t->data, (uint64_t)i, B, t->inp, t->tgt);
        if (t->model) {
            sum += dl_gpt_forward(t->model, t->inp, t->tgt, B, T);
            continue;
        }
#ifdef DLOCO_HAVE_CUDA
        double l = 0.0;
        DL_TRY(dl_gptc_forward(t->gmodel, t->inp, t->tgt, B, T, &l));
        sum += l;
#endif
    }
    *loss = sum / t->cfg.val_batches;
    return 0;
}

int64_t dl_trainer_steps_done(const dl_trainer *t) { return t->step; }
int dl_trainer_device(const dl_trainer *t) { return t->cfg.device; }
const dl_model_config *dl_trainer_model_cfg(const dl_trainer *t) { return &t->cfg.model; }
size_t dl_trainer_num_params(const dl_trainer *t) { return t->nparams; }
dl_gpt *dl_trainer_model(dl_trainer *t) { return t->model; }
struct dl_gptc *dl_trainer_gptc(dl_trainer *t) { return t->gmodel; }
dl_data *dl_trainer_data(dl_trainer *t) { return t->data; }
int dl_trainer_optimizer(const dl_trainer *t) { return t->cfg.optimizer; }
float *dl_trainer_gpa_y(dl_trainer *t) { return t->gy; }

void dl_trainer_params_written(dl_trainer *t)
{
    if (t->gy) memcpy(t->gy, dl_gpt_params(t->model), t->nparams * sizeof(float));
}

int dl_trainer_save(dl_trainer *t, const char *path)
{
    dl_ckpt_state st = {.step = t->step, .data = dl_data_get_pos(t->data), .seed = t->cfg.seed};
    if (t->gy) {
        st.gpa_mu_y = t->cfg.gpa_mu_y;
        return dl_ckpt_save_gpa(path, &t->cfg.model, t->nparams, dl_gpt_params(t->model), dl_gpt_adam_m(t->model),
                                dl_gpt_adam_v(t->model), t->gy, &st);
    }
    if (t->model && !t->ga) return dl_ckpt_save(path, t->model, &st);
    size_t n = t->nparams;
    if (t->model) {
        /* adam_fleet: store the effective second moment max(v, 0) + w, so
         * the checkpoint is a valid plain-AdamW state (v may be negative) */
        const float *v = dl_gpt_adam_v(t->model);
        float *ve = dl_try_malloc(n * sizeof(float));
        if (!ve)
            return dl_err(DL_ENOMEM, "%s: checkpoint staging of %zu parameters (%.2f GB): out of memory", path, n,
                          (double)n * sizeof(float) / 1e9);
        for (size_t i = 0; i < n; i++) ve[i] = fmaxf(v[i], 0.0f) + t->w[i];
        int rc = dl_ckpt_save_raw(path, &t->cfg.model, n, dl_gpt_params(t->model), dl_gpt_adam_m(t->model), ve, &st);
        free(ve);
        return rc;
    }
#ifdef DLOCO_HAVE_CUDA
    int nbuf = t->dw ? 4 : 3;
    float *buf = dl_try_malloc((size_t)nbuf * n * sizeof(float));
    if (!buf)
        return dl_err(DL_ENOMEM, "%s: checkpoint staging of %zu parameters x %d buffers (%.2f GB): out of memory",
                      path, n, nbuf, (double)nbuf * (double)n * sizeof(float) / 1e9);
    int rc = dl_gptc_get_state(t->gmodel, buf, buf + n, buf + 2 * n);
    if (rc == 0 && t->dw) {
        float *v = buf + 2 * n, *w = buf + 3 * n; /* as on the cpu: max(v, 0) + w */
        rc = dl_cuda_d2h(w, t->dw, n * sizeof(float));
        for (size_t i = 0; rc == 0 && i < n; i++) v[i] = fmaxf(v[i], 0.0f) + w[i];
    }
    if (rc == 0) rc = dl_ckpt_save_raw(path, &t->cfg.model, n, buf, buf + n, buf + 2 * n, &st);
    free(buf);
    return rc;
#else
    return dl_err(DL_ENODEV, "trainer without a model");
#endif
}

int dl_trainer_snap_take(dl_trainer *t, dl_trainer_snap *s)
{
    if (t->dga)
        return dl_err(DL_EINVAL, "a run with adam_fleet on a GPU cannot resume (its noise moment stays on the "
                                 "device); adam_fleet runs on the cpu can");
    size_t n = t->nparams;
    int fleet = t->ga != NULL;
    int k = t->gy || fleet ? 4 : 3;
    if (!s->buf || s->nparams != n || s->gpa != (t->gy != NULL) || s->fleet != fleet) {
        free(s->buf);
        s->buf = dl_try_malloc((size_t)k * n * sizeof(float));
        if (!s->buf)
            return dl_err(DL_ENOMEM, "a copy of the training state: %zu parameters x %d buffers (%.2f GB): out of memory",
                          n, k, (double)k * (double)n * sizeof(float) / 1e9);
    }
    s->model = t->cfg.model;
    s->nparams = n;
    s->gpa = t->gy != NULL;
    s->fleet = fleet;
    uint64_t tag = s->st.run_tag;
    s->st = (dl_ckpt_state){.step = t->step, .data = dl_data_get_pos(t->data), .seed = t->cfg.seed,
                            .gpa_mu_y = t->gy ? t->cfg.gpa_mu_y : 0.0f, .run_tag = tag,
                            .fleet = fleet ? t->cfg.fleet : 0.0f};
    if (t->model) {
        memcpy(s->buf, dl_gpt_params(t->model), n * sizeof(float));
        memcpy(s->buf + n, dl_gpt_adam_m(t->model), n * sizeof(float));
        memcpy(s->buf + 2 * n, dl_gpt_adam_v(t->model), n * sizeof(float));
        if (t->gy) memcpy(s->buf + 3 * n, t->gy, n * sizeof(float));
        if (fleet) memcpy(s->buf + 3 * n, t->w, n * sizeof(float));
        return 0;
    }
#ifdef DLOCO_HAVE_CUDA
    return dl_gptc_get_state(t->gmodel, s->buf, s->buf + n, s->buf + 2 * n);
#else
    return dl_err(DL_ENODEV, "trainer without a model");
#endif
}

int dl_trainer_snap_write(const dl_trainer_snap *s, const char *path)
{
    size_t n = s->nparams;
    if (s->gpa) return dl_ckpt_save_gpa(path, &s->model, n, s->buf, s->buf + n, s->buf + 2 * n, s->buf + 3 * n, &s->st);
    if (s->fleet)
        return dl_ckpt_save_fleet(path, &s->model, n, s->buf, s->buf + n, s->buf + 2 * n, s->buf + 3 * n, &s->st);
    return dl_ckpt_save_raw(path, &s->model, n, s->buf, s->buf + n, s->buf + 2 * n, &s->st);
}

void dl_trainer_snap_free(dl_trainer_snap *s)
{
    free(s->buf);
    s->buf = NULL;
}

/* A GPA file into (x, m, v, y); y stored under another mu_y is re-derived
 * from the file's z = y + mu_y/(1-mu_y) (y - x) for this run's mu_y. */
static int resume_gpa(dl_trainer *t, const char *path, dl_ckpt_state *st)
{
    dl_gpt *g = t->model;
    /* room for z first: a failure leaves the trainer untouched */
    float *z = dl_try_malloc(t->nparams * sizeof(float));
    if (!z)
        return dl_err(DL_ENOMEM, "%s: room to re-derive y (%zu floats): out of memory", path, t->nparams);
    int rc = dl_ckpt_load_gpa(path, &t->cfg.model, t->nparams, dl_gpt_params(g), dl_gpt_adam_m(g), dl_gpt_adam_v(g),
                              t->gy, st);
    if (rc == 0 && st->gpa_mu_y != t->cfg.gpa_mu_y) {
        dl_gpa_z(z, dl_gpt_params(g), t->gy, t->nparams, st->gpa_mu_y);
        dl_gpa_y(t->gy, dl_gpt_params(g), z, t->nparams, t->cfg.gpa_mu_y);
    }
    free(z);
    return rc;
}

/* restore_data 0: the step and AdamW state only (dl_trainer_resume_optimizer) */
static int resume(dl_trainer *t, const char *path, int restore_data)
{
    dl_ckpt_state st;
    if (t->dga)
        return dl_err(DL_EINVAL,
                      "%s: a run with adam_fleet on a GPU cannot resume (its noise moment stays on the device; resume "
                      "with adam_fleet 0, or on the cpu)", path);
    if (t->ga) {
        /* the recovery file's kind only: a plain checkpoint keeps the effective second moment, not its parts */
        DL_TRY(dl_ckpt_load_fleet(path, &t->cfg.model, t->nparams, dl_gpt_params(t->model), dl_gpt_adam_m(t->model),
                                  dl_gpt_adam_v(t->model), t->w, &st));
        if (st.fleet != t->cfg.fleet)
            DL_WARN("%s: saved under adam_fleet %g, resumed under %g (the noise moment carries on)", path,
                    (double)st.fleet, (double)t->cfg.fleet);
    } else if (t->gy) {
        DL_TRY(resume_gpa(t, path, &st));
    } else if (t->model) {
        DL_TRY(dl_ckpt_load(path, t->model, &st));
    } else {
#ifdef DLOCO_HAVE_CUDA
        size_t n = t->nparams;
        float *buf = dl_try_malloc(3 * n * sizeof(float));
        if (!buf)
            return dl_err(DL_ENOMEM, "%s: checkpoint staging of %zu parameters x 3 buffers (%.2f GB): out of memory",
                          path, n, 3.0 * (double)n * sizeof(float) / 1e9);
        int rc = dl_ckpt_load_raw(path, &t->cfg.model, n, buf, buf + n, buf + 2 * n, &st);
        if (rc == 0) rc = dl_gptc_set_state(t->gmodel, buf, buf + n, buf + 2 * n);
        free(buf);
        DL_TRY(rc);
#else
        return dl_err(DL_ENODEV, "trainer without a model");
#endif
    }
    if (restore_data) DL_TRY(dl_data_set_pos(t->data, st.data));
    t->step = st.step;
    return 0;
}

int dl_trainer_resume(dl_trainer *t, const char *path) { return resume(t, path, 1); }
int dl_trainer_resume_optimizer(dl_trainer *t, const char *path) { return resume(t, path, 0); }
