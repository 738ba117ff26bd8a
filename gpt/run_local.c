/* dloco-learner --standalone: one learner without a synchronizer -- a model file or a checkpoint to start
 * from, the training loop with evaluation and checkpoints, and the model file at the end. */
#include "gpt/main_int.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/model.h"
#include "storage/modelfile.h"
#ifdef DLOCO_HAVE_CUDA
#include "gpt/gpt_cuda.h"
#endif

/* --init_from: the model file's parameters into the trainer's model (on a
 * GPU through a host buffer). */
static int init_from_file(dl_trainer *tr, const char *path)
{
    const dl_model_config *mc = dl_trainer_model_cfg(tr);
    dl_modelfile_info info;
    int rc;
    if (dl_trainer_device(tr) == DL_DEVICE_CPU) {
        rc = dl_modelfile_read(path, mc, dl_gpt_params(dl_trainer_model(tr)), &info);
        if (!rc) dl_trainer_params_written(tr); /* gpa: y = x */
    } else {
#ifdef DLOCO_HAVE_CUDA
        size_t n = dl_trainer_num_params(tr);
        float *host = dl_try_malloc(n * sizeof(float));
        if (!host) return dl_err(DL_ENOMEM, "%s: %zu floats to stage for the GPU: out of memory", path, n);
        rc = dl_modelfile_read(path, mc, host, &info);
        if (!rc) rc = dl_gptc_set_params(dl_trainer_gptc(tr), host);
        free(host);
#else
        rc = dl_err(DL_ENODEV, "no CUDA in this build");
#endif
    }
    if (rc) return rc;
    printf("initialised from %s (%s, %s)\n", path, info.kind, info.dtype);
    char ev_path[DL_CFG_STRLEN + 8];
    dl_event("init_from", "path=%s kind=%s", dl_event_str(path, ev_path, sizeof ev_path),
             !strcmp(info.kind, "llmc") ? "llmc" : strstr(info.kind, "hf") ? "safetensors-hf" : "safetensors-dloco");
    return 0;
}

/* --save_model: the trainer's parameters as safetensors (on a GPU through
 * host buffers). */
static int save_model_file(dl_trainer *tr, const char *path)
{
    const dl_model_config *mc = dl_trainer_model_cfg(tr);
    int rc;
    if (dl_trainer_device(tr) == DL_DEVICE_CPU) {
        rc = dl_modelfile_write(path, DL_MODELFILE_SAFETENSORS, mc, dl_gpt_params(dl_trainer_model(tr)), NULL, 1, NULL);
    } else {
#ifdef DLOCO_HAVE_CUDA
        size_t n = dl_trainer_num_params(tr);
        float *host = dl_try_malloc(3 * n * sizeof(float));
        if (!host) return dl_err(DL_ENOMEM, "%s: %zu floats x 3 to stage from the GPU: out of memory", path, n);
        rc = dl_gptc_get_state(dl_trainer_gptc(tr), host, host + n, host + 2 * n);
        if (!rc) rc = dl_modelfile_write(path, DL_MODELFILE_SAFETENSORS, mc, host, NULL, 1, NULL);
        free(host);
#else
        rc = dl_err(DL_ENODEV, "no CUDA in this build");
#endif
    }
    if (rc) return rc;
    printf("model: %s (safetensors, step %lld)\n", path, (long long)dl_trainer_steps_done(tr));
    return 0;
}

/* The training loop from the trainer's step (a resumed one's) to --steps or --stop_after or a signal, then
 * the final evaluation, checkpoint and model file. Returns the exit code. */
static int train(const learner_cfg *cfg, dl_trainer *tr, const dl_train_cfg *tc, const dl_data *data,
                 const char *hello_device, FILE *losslog)
{
    int rc;
    dl_main_catch_signals(NULL);

    size_t nparams = dl_trainer_num_params(tr);
    double flops_tok = dl_model_flops_per_token(&tc->model, tc->model.seq_len);
    int64_t tok_per_step = (int64_t)tc->batch * tc->model.seq_len;
    printf("dloco-learner standalone: GPT L=%d NH=%d C=%d T=%d V=%d, %zu parameters, B=%d, %d threads\n",
           tc->model.n_layer, tc->model.n_head, tc->model.n_embd, tc->model.seq_len, tc->model.vocab, nparams, tc->batch,
           omp_get_max_threads());
    char ev_dev[200];
    dl_event("learner_start", "mode=standalone device=%s params=%zu steps=%lld",
             dl_event_str(hello_device, ev_dev, sizeof ev_dev), nparams, (long long)cfg->steps);
    dl_main_print_data(cfg, data, tc->model.vocab);
    int64_t start = dl_trainer_steps_done(tr);
    if (start) {
        char ev_path[DL_CFG_STRLEN + 8];
        printf("resumed from %s at step %lld\n", cfg->resume, (long long)start);
        dl_event("resumed", "path=%s step=%lld", dl_event_str(cfg->resume, ev_path, sizeof ev_path), (long long)start);
    }
    double val0 = 0.0;
    if ((rc = dl_trainer_eval(tr, &val0)))
        return dl_main_fail("evaluating", rc);
    double val = val0, best = val0;
    printf("step %6lld | val loss %.4f\n", (long long)start, val0);
    fflush(stdout);

    double t_run = dl_clock_s(), t_win = t_run, train_sum = 0.0, last_train = NAN;
    int64_t win_steps = 0, step = start, val_at = start; /* val is the loss of the model at step val_at */
    int64_t stop_at = cfg->stop_after ? start + cfg->stop_after : cfg->steps;
    if (stop_at > cfg->steps) stop_at = cfg->steps;
    while (step < stop_at && !dl_main_stop) {
        float norm = 0.0f;
        double loss = NAN;
        rc = dl_trainer_step(tr, &loss, &norm);
        step = dl_trainer_steps_done(tr);
        if (rc == DL_ERANGE || (rc == 0 && !isfinite(loss))) {
            fprintf(stderr, "dloco-learner: training loss became %f (gradient norm %f) at step %lld; stopping (lower --lr?)\n",
                    loss, norm, (long long)step);
            return 3;
        }
        if (rc)
            return dl_main_fail("training step", rc);
        if (losslog) fprintf(losslog, "%lld %a\n", (long long)step, loss);
        train_sum += loss;
        last_train = loss;
        win_steps++;
        int do_val = (cfg->val_every && step % cfg->val_every == 0) || step == cfg->steps;
        if (do_val) {
            if ((rc = dl_trainer_eval(tr, &val)))
                return dl_main_fail("evaluating", rc);
            if (val < best) best = val;
            val_at = step;
        }
        if (step % cfg->log_every == 0 || do_val) {
            double dt = dl_clock_s() - t_win;
            double ms = 1e3 * dt / (double)win_steps;
            double tps = (double)(win_steps * tok_per_step) / dt;
            printf("step %6lld/%lld | train %.4f | ", (long long)step, (long long)cfg->steps,
                   train_sum / (double)win_steps);
            if (do_val) printf("val %.4f | ", val);
            else printf("val    -   | ");
            printf("lr %.2e | norm %6.3f | %7.0f tok/s | %7.1f ms/step | %.1f GFLOP/s\n",
                   dl_trainer_lr_at(tr, step), norm, tps, ms, tps * flops_tok * 1e-9);
            fflush(stdout);
            if (do_val)
                dl_event("step", "step=%lld loss=%.17g tokens=%lld val_loss=%.17g", (long long)step,
                         train_sum / (double)win_steps, (long long)(step * tok_per_step), val);
            else
                dl_event("step", "step=%lld loss=%.17g tokens=%lld", (long long)step, train_sum / (double)win_steps,
                         (long long)(step * tok_per_step));
            t_win = dl_clock_s();
            train_sum = 0.0;
            win_steps = 0;
        }
        if (cfg->checkpoint[0] && cfg->save_every && step % cfg->save_every == 0 &&
            (rc = dl_trainer_save(tr, cfg->checkpoint)))
            return dl_main_fail("saving checkpoint", rc);
    }
    double wall = dl_clock_s() - t_run;
    if (dl_main_stop) printf("stopped by signal at step %lld\n", (long long)step);
    /* the summary's loss is the final model's (--stop_after, a signal) */
    if (val_at != step) {
        if ((rc = dl_trainer_eval(tr, &val)))
            return dl_main_fail("evaluating", rc);
        if (val < best) best = val;
    }
    if (cfg->checkpoint[0]) {
        if ((rc = dl_trainer_save(tr, cfg->checkpoint)))
            return dl_main_fail("saving checkpoint", rc);
        printf("checkpoint: %s (step %lld)\n", cfg->checkpoint, (long long)step);
        char ev_path[DL_CFG_STRLEN + 8];
        dl_event("checkpoint", "path=%s step=%lld", dl_event_str(cfg->checkpoint, ev_path, sizeof ev_path),
                 (long long)step);
    }
    if (cfg->save_model[0] && (rc = save_model_file(tr, cfg->save_model)))
        return dl_main_fail("saving the model (option save_model)", rc);
    int64_t done = step - start;
    printf("summary: %lld steps in %.1f s | %.0f tok/s | train loss %.4f | val loss on %s %.4f -> %.4f (best %.4f)\n",
           (long long)done, wall, done ? (double)(done * tok_per_step) / wall : 0.0, last_train, cfg->data, val0, val,
           best);
    dl_event("train_summary", "steps=%lld step=%lld wall_s=%.3f train_loss=%.17g val_loss_start=%.17g val_loss=%.17g "
             "val_loss_best=%.17g stopped=%d",
             (long long)done, (long long)step, wall, last_train, val0, val, best, dl_main_stop ? 1 : 0);
    return 0;
}

int dl_run_local(const learner_cfg *cfg, dl_trainer *tr, const dl_train_cfg *tc, const dl_data *data,
                 const char *hello_device)
{
    int rc;
    if (cfg->init_from[0] && cfg->resume[0])
        return dl_main_fail("bad configuration", dl_err(DL_EINVAL, "--init_from and --resume both given: a checkpoint "
                                                                   "already holds the model (and the optimizer state); "
                                                                   "choose one"));
    if (cfg->init_from[0] && (rc = init_from_file(tr, cfg->init_from))) return dl_main_fail("--init_from", rc);
    if (cfg->resume[0] && (rc = dl_trainer_resume(tr, cfg->resume))) return dl_main_fail("resuming", rc);
    FILE *losslog = NULL;
    if (cfg->loss_log[0] && !(losslog = fopen(cfg->loss_log, "a")))
        return dl_main_fail("opening loss_log", dl_err(DL_EIO, "%s", cfg->loss_log));
    if (losslog) setvbuf(losslog, NULL, _IOLBF, 0); /* one line per step, visible as it happens */
    rc = train(cfg, tr, tc, data, hello_device, losslog);
    if (losslog) fclose(losslog);
    return rc;
}
