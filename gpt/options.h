/* dloco-learner's options: the config table and --help, parsing, the checks across rows and what is
 * derived from them (the push codec, byzantine, the learner library's networked rows). */
#ifndef DL_GPT_OPTIONS_H
#define DL_GPT_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "core/codec.h"
#include "core/config.h"
#include "core/model.h"
#include "learner/learner_int.h"

typedef struct {
    int standalone;
    char data[DL_CFG_STRLEN];
    char data_format[DL_CFG_STRLEN];
    double val_frac;
    dl_model_opts model; /* n_layer .. vocab and fragments: DL_MODEL_CFG_ROWS */
    int64_t batch, steps, warmup;
    double lr, min_lr_frac, weight_decay, beta1, beta2, eps, grad_clip, adam_fleet;
    /* the inner optimizer (gpt/gpa.h, docs/GPA.md) */
    char optimizer[DL_CFG_STRLEN];
    double gpa_mu_x, gpa_mu_y, gpa_mu;
    int64_t gpa_h;
    int64_t seed;
    int64_t val_every, val_batches, log_every;
    char checkpoint[DL_CFG_STRLEN];
    int64_t save_every;
    int64_t stop_after;
    char resume[DL_CFG_STRLEN];
    /* the recovery file (gpt/recovery.h): networked runs resume from it after a restart */
    char state_dir[DL_CFG_STRLEN], recovery[DL_CFG_STRLEN];
    double recovery_every_s, recovery_budget;
    int64_t recovery_every_steps;
    char init_from[DL_CFG_STRLEN];
    char save_model[DL_CFG_STRLEN];
    char loss_log[DL_CFG_STRLEN];
    int64_t threads;
    char device[DL_CFG_STRLEN];
    char matmul[DL_CFG_STRLEN];
    char log_level[DL_CFG_STRLEN];
    /* networked mode */
    char connect[DL_CFG_STRLEN];
    char id[DL_CFG_STRLEN];
    char run_id[DL_CFG_STRLEN];
    char adopt[DL_CFG_STRLEN];
    double alpha;
    /* encoded pushes (learner/ef.h, core/codec.h) */
    char push_codec[DL_CFG_STRLEN], push_rounding[DL_CFG_STRLEN];
    int64_t push_block, push_topk;
    int error_feedback;
    int64_t data_shard, data_shards;
    int64_t flush_timeout_ms, connect_timeout_ms;
    int64_t silence_rebuild_ms;
    int64_t hello_retry_ms, hello_retry_max_ms, hello_unsent_ms, poll_max_ms, silence_min_ms, ack_expiry_min_ms,
        bye_linger_ms, push_decision_timeout_ms, reconnect_ms, reconnect_max_ms, tcp_stall_ms;
    char events[DL_CFG_STRLEN];
    char metrics[DL_CFG_STRLEN];
    int local_eval;
    double throttle;
    double step_ms_min;
    int final_flush;
    /* trusting the synchronizer */
    double update_max_ratio;
    int64_t max_version_jump;
    char server_key[DL_CFG_STRLEN], key_file[DL_CFG_STRLEN];
    char byzantine[DL_CFG_STRLEN];
    /* sync timing (learner/timing.h, docs/SYNC_TIMING.md) */
    char sync_timing[DL_CFG_STRLEN];
    int64_t h_min, h_max, timing_seed, oracle_window, wa_max_per_step;
    double wa_w_stale, wa_w_loss, wa_w_rate, wa_w_link, wa_w_ckpt, wa_rate_ref, wa_fc_alpha, wa_fc_beta;
    double wa_w_queue, wa_queue_ref;
    char pressure[DL_CFG_STRLEN], timing_trace_in[DL_CFG_STRLEN], timing_trace_out[DL_CFG_STRLEN];
    int64_t pressure_poll_ms, pressure_timeout_ms, pressure_stale_ms;
    /* heterogeneous learners and non-IID shards (docs/HETEROGENEOUS.md) */
    char data_shard_mode[DL_CFG_STRLEN], precision[DL_CFG_STRLEN], dynamic_h[DL_CFG_STRLEN];
    int64_t dynamic_h_min, dynamic_h_max;
    /* not rows: resolved from the rows above by dl_options_check_networked */
    int byz_on;
    double byz_scale;
    dl_codec pcodec;      /* push_codec, push_block, push_topk */
    int prounding;        /* DL_ROUND_* of push_rounding */
} learner_cfg;

/* argv (and --config FILE) into *cfg, with --help, --help-all and --print-config (which runs the checks below
 * on a copy). Returns 0 to go on, or 1 when the program ends now with *exit_code (help printed, a bad
 * option named). */
int dl_options_parse(int argc, char **argv, learner_cfg *cfg, int *exit_code);
/* Heterogeneous learners (docs/HETEROGENEOUS.md): the rules across the rows of dynamic_h, sync timing and
 * precision. Returns 0 or DL_EINVAL naming the option. */
int dl_options_check_hetero(const learner_cfg *cfg);
/* The rules of a networked config across options (an empty id is the default <hostname>-<pid>, checked once
 * it is set): id, run_id, byzantine, then the library's own resolution of the push codec, the timers and the
 * CURVE keys (dl_learner_netcfg_resolve, the check join runs); sets byz_on, byz_scale, pcodec, prounding.
 * Returns 0 or a DL_E* code (DL_EINVAL; a key file's own error) naming the option. */
int dl_options_check_networked(learner_cfg *cfg);
/* --optimizer and the gpa rows (checked in either mode, whichever the optimizer): gpa_mu_x -1 resolved from
 * the DiLoCo mapping into *mu_x. Returns 0 or DL_EINVAL naming the option. */
int dl_options_check_optimizer(const learner_cfg *cfg, double *mu_x);
/* A push codec for the banner: "fp32", "int4 block 128 nearest, error feedback". Returns buf. */
const char *dl_options_push_codec_desc(const learner_cfg *cfg, char *buf, size_t cap);
/* The networked rows as the learner library's options (learner/learner_int.h); metrics "off": this program
 * serves its own /metrics. */
void dl_options_net_rows(const learner_cfg *cfg, dl_learner_netcfg *n);

#endif
