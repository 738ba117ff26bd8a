/* dloco-learner: trains the GPT, either networked (default: pushes fragment
 * pseudo-gradients to dloco-sync, docs/PROTOCOL.md) or --standalone (one learner, no synchronizer). */
#include "core/clock.h"
#include "core/codec.h"
#include "core/config.h"
#include "core/defaults.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/shard.h"
#include "kernels/blas_select.h"
#include "kernels/codec.h"
#include "learner/comms.h"
#include "gpt/dynh.h"
#include "gpt/gpa.h"
#include "gpt/recovery.h"
#include "learner/learner_int.h"
#include "learner/metrics.h"
#include "learner/node.h"
#include "learner/pressure.h"
#include "learner/timing.h"
#include "gpt/train.h"
#include "proto/auth.h"
#include "storage/modelfile.h"
#ifdef DLOCO_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#include "gpt/gpt_cuda.h"
#include "gpt/xfer_cuda.h"
#endif

#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#include <dirent.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    double recovery_every_s;
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
        bye_linger_ms, push_decision_timeout_ms, reconnect_ms, reconnect_max_ms;
    char events[DL_CFG_STRLEN];
    char metrics[DL_CFG_STRLEN];
    int local_eval;
    double throttle;
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
    /* not rows: resolved from the rows above at start (resolve_networked) */
    int byz_on;
    double byz_scale;
    dl_codec pcodec;      /* push_codec, push_block, push_topk */
    int prounding;        /* DL_ROUND_* of push_rounding */
    char curve_server[41], curve_public[41], curve_secret[41];
} learner_cfg;

#define F(x) offsetof(learner_cfg, x)
static const dl_cfg_entry learner_table[] = {
    {"standalone", DL_CFG_BOOL, F(standalone), 0, 0, "false", NULL, 0, "train alone, without a synchronizer"},
    {"data", DL_CFG_STR, F(data), 0, 0, "/usr/share/games/fortunes", NULL, 0,
     "training data: text file, directory of text files, or llm.c .bin shard(s)"},
    {"data_format", DL_CFG_ENUM, F(data_format), 0, 0, "auto", "auto|text|shards", 0, "how to read --data"},
    {"val_frac", DL_CFG_FLOAT, F(val_frac), 0.0, 0.5, "0.05", NULL, 0, "fraction of sequences held out"},
    DL_MODEL_CFG_ROWS(learner_cfg, model, "0", "model: vocabulary (V); 0 = 256 for text, 50257 for shards"),
    {"batch", DL_CFG_INT, F(batch), 1, 65536, "16", NULL, 0, "sequences per step (B)", "sequences"},
    {"steps", DL_CFG_INT, F(steps), 1, 1000000000, "1000", NULL, 0, "optimizer steps", "steps"},
    {"warmup", DL_CFG_INT, F(warmup), 0, 1000000000, "50", NULL, 0, "linear warm-up steps", "steps"},
    {"lr", DL_CFG_FLOAT, F(lr), 0.0, 1.0, "3e-3", NULL, 0, "peak AdamW learning rate"},
    {"min_lr_frac", DL_CFG_FLOAT, F(min_lr_frac), 0.0, 1.0, "0.1", NULL, 0, "cosine floor as a fraction of lr"},
    {"adam_fleet", DL_CFG_FLOAT, F(adam_fleet), 0.0, 1e6, "0", NULL, 0,
     "0: plain AdamW. M >= 1: AdamW whose second moment is estimated, from the two halves of each batch, for an "
     "M-times larger batch, so learners whose updates are averaged step like one data-parallel optimizer; "
     "2-4 x the number of learners measured best (even batch; see docs/ARCHITECTURE.md)"},
    {"weight_decay", DL_CFG_FLOAT, F(weight_decay), 0.0, 10.0, "0.1", NULL, 0, "decoupled weight decay (matrices, embeddings)"},
    {"beta1", DL_CFG_FLOAT, F(beta1), 0.0, 0.9999, "0.9", NULL, 0, "AdamW beta1"},
    {"beta2", DL_CFG_FLOAT, F(beta2), 0.0, 0.99999, "0.95", NULL, 0, "AdamW beta2"},
    {"eps", DL_CFG_FLOAT, F(eps), 1e-12, 1e-2, "1e-8", NULL, 0, "AdamW epsilon"},
    {"grad_clip", DL_CFG_FLOAT, F(grad_clip), 0.0, 1e6, "1.0", NULL, 0, "global gradient-norm clip (0 = off)"},
    {"optimizer", DL_CFG_ENUM, F(optimizer), 0, 0, "adamw", "adamw|gpa", 0,
     "inner optimizer: adamw, or gpa (generalized primal averaging over AdamW, docs/GPA.md: the model is an average "
     "x of the AdamW iterate z, gradients at y = mu_y x + (1-mu_y) z; one more parameter copy; cpu only)"},
    {"gpa_mu_x", DL_CFG_FLOAT, F(gpa_mu_x), -1.0, 1.0, "-1", NULL, 0,
     "gpa: x <- mu_x x + (1-mu_x) z, in [0, 1); 0 = plain AdamW; -1 = the DiLoCo mapping gpa_mu^(1/gpa_h) "
     "(0.9^(1/32) = 0.99671 by default)"},
    {"gpa_mu_y", DL_CFG_FLOAT, F(gpa_mu_y), 0.0, 1.0, "0.7", NULL, 0,
     "gpa: gradients at y = mu_y x + (1-mu_y) z, in [0, 1); 0 = at z"},
    {"gpa_mu", DL_CFG_FLOAT, F(gpa_mu), 0.0, 1.0, "0.9", NULL, 0,
     "gpa_mu_x -1: the outer (Nesterov) momentum of the DiLoCo that gpa stands for, in [0, 1)"},
    {"gpa_h", DL_CFG_INT, F(gpa_h), 1, 1000000000, "32", NULL, 0,
     "gpa_mu_x -1: the inner steps per outer step of that DiLoCo", "steps"},
    {"seed", DL_CFG_INT, F(seed), 0, 9.2e18, "1337", NULL, 0, "init and shuffling seed"},
    {"val_every", DL_CFG_INT, F(val_every), 0, 1000000000, "100", NULL, 0, "evaluate every N steps (0 = only at the end)",
     "steps"},
    {"val_batches", DL_CFG_INT, F(val_batches), 1, 100000, "16", NULL, 0, "batches per evaluation", "batches"},
    {"log_every", DL_CFG_INT, F(log_every), 1, 1000000000, "10", NULL, 0, "progress line every N steps", "steps"},
    {"checkpoint", DL_CFG_STR, F(checkpoint), 0, 0, "", NULL, 0, "checkpoint file written at the end (and every save_every)"},
    {"save_every", DL_CFG_INT, F(save_every), 0, 1000000000, "0", NULL, 0, "checkpoint every N steps (0 = only at the end)",
     "steps"},
    {"stop_after", DL_CFG_INT, F(stop_after), 0, 1000000000, "0", NULL, 0,
     "end this invocation after N steps (checkpoint kept; resume later with --resume)", "steps"},
    {"resume", DL_CFG_STR, F(resume), 0, 0, "", NULL, 0,
     "checkpoint file to resume from; networked: its step (the lr schedule) and AdamW state only, the parameters "
     "come from the synchronizer and the data from this learner's shard (continuing a --standalone warm start)"},
    {"state_dir", DL_CFG_STR, F(state_dir), 0, 0, "", NULL, 0,
     "directory of the recovery file (empty = the working directory); give it a path that survives a restart"},
    {"recovery", DL_CFG_STR, F(recovery), 0, 0, "", NULL, 0,
     "networked: the recovery file a restarted learner of the same id resumes from (step and learning-rate "
     "schedule, optimizer state, data position); empty = <state_dir>/dloco-<id>.recovery when --id is given, "
     "off = none"},
    {"recovery_every_s", DL_CFG_FLOAT, F(recovery_every_s), 0, 86400, "60", NULL, 0,
     "write the recovery file at most this often (and at a clean finish); 0 = only at the finish", "s"},
    {"recovery_every_steps", DL_CFG_INT, F(recovery_every_steps), 0, 1000000000, "1000", NULL, 0,
     "... or once this many steps passed since the last one, whichever comes first (0 = time only)", "steps"},
    {"init_from", DL_CFG_STR, F(init_from), 0, 0, "", NULL, 0,
     "--standalone: start from this model file (dloco export: safetensors, an HF directory, llm.c) instead of the "
     "seeded init, at step 0 with fresh AdamW state; its model must be this one (docs/OPERATING.md)"},
    {"save_model", DL_CFG_STR, F(save_model), 0, 0, "", NULL, 0,
     "--standalone: at the end of this invocation also write the model as safetensors to this file (replaced if it "
     "exists), for dloco-sync --init_from"},
    {"loss_log", DL_CFG_STR, F(loss_log), 0, 0, "", NULL, 0, "append 'step train_loss' with exact hex floats to this file"},
    {"threads", DL_CFG_INT, F(threads), 0, 1024, "0", NULL, 0,
     "CPU threads (0 = OMP_NUM_THREADS or all cores; networked, 0 with other dloco-learners on this host and no "
     "OMP_NUM_THREADS warns: give each cores / learners)",
     "threads"},
    {"device", DL_CFG_ENUM, F(device), 0, 0, "auto", "auto|cpu|cuda", 0,
     "where the model trains: cuda (a GPU), cpu, or auto (cuda when this build has CUDA and a usable device)"},
    {"matmul", DL_CFG_ENUM, F(matmul), 0, 0, "tf32", "fp32|tf32|bf16", 0,
     "cuda matmul precision: fp32, or tf32/bf16 tensor cores on fp32 weights with fp32 accumulation; cpu: ignored"},
    {"log_level", DL_CFG_ENUM, F(log_level), 0, 0, "info", "debug|info|warn|error", 0, "log verbosity"},
    {"connect", DL_CFG_STR, F(connect), 0, 0, "tcp://127.0.0.1:5555", NULL, 0,
     "synchronizer endpoint (networked mode); a sharded synchronizer: its shards' endpoints, comma-separated in shard "
     "order (one session each; a shard that is down pauses only its fragments)"},
    {"id", DL_CFG_STR, F(id), 0, 0, "", NULL, 0, "learner id [A-Za-z0-9._-]{1,64}; empty = <hostname>-<pid> (hostname cut to 40 characters, others "
     "than [A-Za-z0-9._-] as '-'): unique per host, and across containers whose learners share a pid"},
    {"run_id", DL_CFG_STR, F(run_id), 0, 0, "dloco", NULL, 0, "run id, must match the synchronizer's"},
    {"adopt", DL_CFG_ENUM, F(adopt), 0, 0, DL_DEF_ADOPT, "overwrite|mix|keep", 0,
     "how a new global fragment is adopted: keep the progress since the push (or since the base, for a version this "
     "learner did not contribute to: the synchronizer broadcasts every merge), overwrite (drops it), or mix "
     "alpha*local+(1-alpha)*global"},
    {"alpha", DL_CFG_FLOAT, F(alpha), 0.0, 1.0, "0.5", NULL, 0, "adopt=mix: weight of the local parameters"},
    {"push_codec", DL_CFG_ENUM, F(push_codec), 0, 0, "fp32", "fp32|bf16|int8|int4|e3m0|topk", 0,
     "encoding of pushed pseudo-gradients (core/codec.h): fp32 exact, bf16, int8 / int4 with a per-block absmax "
     "scale, e3m0 (sign + 3-bit exponent per element, per-block scale), topk (the push_topk largest of each block)"},
    {"push_block", DL_CFG_INT, F(push_block), 16, 65536, "128", NULL, 0,
     "int8, int4, e3m0, topk pushes: elements per block (even)", "elements"},
    {"push_topk", DL_CFG_INT, F(push_topk), 1, 65536, "8", NULL, 0,
     "push_codec=topk: entries kept per block, at most push_block", "entries"},
    {"push_rounding", DL_CFG_ENUM, F(push_rounding), 0, 0, "nearest", "nearest|stochastic", 0,
     "int8, int4, e3m0 pushes: round to nearest, or stochastically (unbiased; the draws are a function of the "
     "learner instance, fragment and push)"},
    {"error_feedback", DL_CFG_BOOL, F(error_feedback), 0, 0, "true", NULL, 0,
     "carry what an encoded push left out into the fragment's next push (ignored for fp32)"},
    {"data_shard", DL_CFG_INT, F(data_shard), 0, 1000000, "0", NULL, 0, "this learner's data shard (0-based)"},
    {"data_shards", DL_CFG_INT, F(data_shards), 0, 1000000, "0", NULL, 0,
     "training sequences are split into this many shards by index (0 or 1 = no split)"},
    {"flush_timeout_ms", DL_CFG_INT, F(flush_timeout_ms), 0, 3600000, "10000", NULL, 0,
     "at the end, wait this long for the answers to the final flush"},
    {"connect_timeout_ms", DL_CFG_INT, F(connect_timeout_ms), 0, 86400000, "0", NULL, 0,
     "give up when Welcome and the initial fetch take longer than this; 0 = never: a learner started while its "
     "synchronizer is down or out of reach keeps trying, saying so every 10 s"},
    {"hello_retry_ms", DL_CFG_INT, F(hello_retry_ms), 1, 3600000, "1000", NULL, 0,
     "first Hello retry when no Welcome came; doubles per retry up to hello_retry_max_ms"},
    {"hello_retry_max_ms", DL_CFG_INT, F(hello_retry_max_ms), 1, 3600000, "16000", NULL, 0,
     "cap of the Hello retry backoff"},
    {"hello_unsent_ms", DL_CFG_INT, F(hello_unsent_ms), 1, 60000, "20", NULL, 0,
     "retry period of a Hello that found no connection yet (<= hello_retry_ms)"},
    {"poll_max_ms", DL_CFG_INT, F(poll_max_ms), 1, 60000, "100", NULL, 0,
     "the comms thread checks its timers at least this often (< hello_retry_ms, < silence_min_ms)"},
    {"silence_min_ms", DL_CFG_INT, F(silence_min_ms), 1, 3600000, "1000", NULL, 0,
     "re-hello after max(this, liveness x heartbeat_ms) without any message from the synchronizer"},
    {"silence_rebuild_ms", DL_CFG_INT, F(silence_rebuild_ms), 1, 86400000, "30000", NULL, 0,
     "close and reopen the connection after max(this, 4 x the re-hello silence) without any message (a large "
     "transfer on a thin link can be silent for long: docs/PROTOCOL.md)"},
    {"ack_expiry_min_ms", DL_CFG_INT, F(ack_expiry_min_ms), 1, 3600000, "5000", NULL, 0,
     "a push without its Ack stops blocking its fragment after max(this, liveness x heartbeat_ms)"},
    {"bye_linger_ms", DL_CFG_INT, F(bye_linger_ms), 1, 60000, "1000", NULL, 0, "how long exiting lets a Bye leave"},
    {"reconnect_ms", DL_CFG_INT, F(reconnect_ms), 1, 3600000, "100", NULL, 0,
     "first reconnect attempt after the connection to the synchronizer is lost (< hello_retry_ms)"},
    {"reconnect_max_ms", DL_CFG_INT, F(reconnect_max_ms), 1, 3600000, "10000", NULL, 0,
     "reconnect backoff doubles up to this (<= hello_retry_max_ms)"},
    {"push_decision_timeout_ms", DL_CFG_INT, F(push_decision_timeout_ms), 1, 86400000, "30000", NULL, 0,
     "a due push waits for the previous push's decision at most this long (> ack_expiry_min_ms)"},
    {"events", DL_CFG_STR, F(events), 0, 0, "", NULL, 0,
     "append machine-readable events (logfmt, docs/EVENTS.md) to this file; empty = off"},
    {"metrics", DL_CFG_STR, F(metrics), 0, 0, "auto", NULL, 0,
     "networked mode: HTTP /metrics (Prometheus) on HOST:PORT (port 0 = ephemeral; the metrics_listen event "
     "says which); auto = 127.0.0.1:0, or none with a warning where loopback cannot be bound; off = none"},
    {"final_flush", DL_CFG_BOOL, F(final_flush), 0, 0, "true", NULL, 0,
     "on exit (end of steps or SIGTERM) push every fragment with progress before saying Bye"},
    {"throttle", DL_CFG_FLOAT, F(throttle), 0.001, 1.0, "1", NULL, 0,
     "run at this fraction of full speed (sleeps after each step): a deliberately slow learner for tests",
     "x full speed"},
    {"local_eval", DL_CFG_BOOL, F(local_eval), 0, 0, "false", NULL, 0,
     "networked mode: also evaluate the local model every val_every steps (the synchronizer evaluates the global one)"},
    {"update_max_ratio", DL_CFG_FLOAT, F(update_max_ratio), 0.0, 1e12, "10", NULL, 0,
     "refuse (and fetch again) a global fragment farther from this learner's own copy than this times (the copy's "
     "norm + 0.1 x sqrt(elements)); 0 = no distance bound (non-finite values are always refused)"},
    {"max_version_jump", DL_CFG_INT, F(max_version_jump), 1, 9.2e18, "1000000", NULL, 0,
     "refuse an update whose fragment version is more than this above the newest version this learner knows",
     "versions"},
    {"server_key", DL_CFG_STR, F(server_key), 0, 0, "", NULL, 0,
     "CURVE: the synchronizer's public key (40 Z85 characters, or the path of its .pub file); with key_file; "
     "empty = no CURVE"},
    {"key_file", DL_CFG_STR, F(key_file), 0, 0, "", NULL, 0,
     "CURVE: this learner's key pair file (as written by dloco keygen, not readable by group/others); with "
     "server_key; empty = no CURVE"},
    {"byzantine", DL_CFG_STR, F(byzantine), 0, 0, "none", NULL, 0,
     "for robustness benchmarks only: corrupt this learner's own pushes (the synchronizer's guards must contain "
     "it): none, scale:K (every pushed delta times K, K finite in [-1e6, 1e6]) or flip (negated); training stays "
     "honest"},
    /* sync timing (docs/SYNC_TIMING.md) */
    {"sync_timing", DL_CFG_ENUM, F(sync_timing), 0, 0, "fixed", "fixed|wa|wa_forecast|matched_random|oracle", 0,
     "when a fragment is pushed: fixed (every H steps, staggered), wa (workload-aware: inside [h_min, h_max] when "
     "progress outweighs --pressure), wa_forecast (wa with a one-step rate forecast), matched_random / oracle (the "
     "control and the offline bound of a bench: need --timing_trace_in from a run of the policy under test)"},
    {"h_min", DL_CFG_INT, F(h_min), 0, 1000000, "0", NULL, 0,
     "sync_timing other than fixed: no push of a fragment sooner than this after its last (0 = max(1, H/2))", "steps"},
    {"h_max", DL_CFG_INT, F(h_max), 0, 1000000, "0", NULL, 0,
     "sync_timing other than fixed: a push of a fragment at the latest this long after its last (0 = 2H)", "steps"},
    {"wa_w_stale", DL_CFG_FLOAT, F(wa_w_stale), 0.0, 1e6, "1", NULL, 0, "wa score: weight of the steps since the last push"},
    {"wa_w_loss", DL_CFG_FLOAT, F(wa_w_loss), 0.0, 1e6, "0.5", NULL, 0,
     "wa score: weight of the relative training-loss decrease since the last push"},
    {"wa_w_rate", DL_CFG_FLOAT, F(wa_w_rate), 0.0, 1e6, "1", NULL, 0,
     "wa score: weight of the serving request rate above wa_rate_ref (relative)"},
    {"wa_w_link", DL_CFG_FLOAT, F(wa_w_link), 0.0, 1e6, "1", NULL, 0, "wa score: weight of the link utilisation"},
    {"wa_w_ckpt", DL_CFG_FLOAT, F(wa_w_ckpt), 0.0, 1e6, "1", NULL, 0, "wa score: weight of checkpoint activity"},
    {"wa_rate_ref", DL_CFG_FLOAT, F(wa_rate_ref), 1e-6, 1e9, "50", NULL, 0,
     "wa score: the serving request rate that is no pressure yet", "requests/s"},
    {"wa_w_queue", DL_CFG_FLOAT, F(wa_w_queue), 0.0, 1e6, "1", NULL, 0,
     "wa score: weight of the serving backlog (queue_depth of --pressure) over wa_queue_ref"},
    {"wa_queue_ref", DL_CFG_FLOAT, F(wa_queue_ref), 1e-6, 1e6, "1", NULL, 0,
     "wa score: the serving backlog that counts as pressure 1 (times wa_w_queue)", "requests"},
    {"wa_max_per_step", DL_CFG_INT, F(wa_max_per_step), 0, 4096, "0", NULL, 0,
     "wa: at most this many unforced push decisions per step (0 = ceil(fragments / H), the fixed schedule's peak)",
     "pushes"},
    {"wa_fc_alpha", DL_CFG_FLOAT, F(wa_fc_alpha), 1e-6, 1.0, "0.5", NULL, 0, "wa_forecast: EWMA weight of the level"},
    {"wa_fc_beta", DL_CFG_FLOAT, F(wa_fc_beta), 1e-6, 1.0, "0.3", NULL, 0, "wa_forecast: EWMA weight of the trend"},
    {"pressure", DL_CFG_STR, F(pressure), 0, 0, "", NULL, 0,
     "pressure source of the wa policies: http://127.0.0.1:PORT/PATH or a file (docs/SYNC_TIMING.md has the "
     "format); empty = unknown pressure (wa pushes every H)"},
    {"pressure_poll_ms", DL_CFG_INT, F(pressure_poll_ms), 1, 60000, "100", NULL, 0,
     "read --pressure at most this often", "ms"},
    {"pressure_timeout_ms", DL_CFG_INT, F(pressure_timeout_ms), 1, 10000, "20", NULL, 0,
     "one read of --pressure blocks the training step at most this long", "ms"},
    {"pressure_stale_ms", DL_CFG_INT, F(pressure_stale_ms), 0, 3600000, "2000", NULL, 0,
     "after a refused read, keep the last good pressure this long after it was read, then treat it as unknown",
     "ms"},
    {"timing_trace_out", DL_CFG_STR, F(timing_trace_out), 0, 0, "", NULL, 0,
     "write the pressure of every step and every push decision to this file (the input of matched_random and "
     "oracle); empty = none"},
    {"timing_trace_in", DL_CFG_STR, F(timing_trace_in), 0, 0, "", NULL, 0,
     "matched_random / oracle: the --timing_trace_out of a run of the policy under test (same steps, fragments, "
     "H and corridor): its push counts and, for oracle, its pressure"},
    {"timing_seed", DL_CFG_INT, F(timing_seed), 0, 9.2e18, "1", NULL, 0, "matched_random: placement seed"},
    {"oracle_window", DL_CFG_INT, F(oracle_window), 1, 1000000, "1", NULL, 0,
     "oracle: steps of pressure a push overlaps", "steps"},
    /* heterogeneous learners and non-IID shards (docs/HETEROGENEOUS.md) */
    {"data_shard_mode", DL_CFG_ENUM, F(data_shard_mode), 0, 0, "iid", "iid|cluster", 0,
     "with data_shards > 1: iid (training sequence k goes to shard k % data_shards) or cluster (documents of 8 "
     "sequences clustered by their character histograms, k-means with k = data_shards, equal sizes: shard i = "
     "cluster i, a non-IID split; a shard smaller than a batch is refused)"},
    {"precision", DL_CFG_ENUM, F(precision), 0, 0, "fp32", "fp32|bf16", 0,
     "cpu: compute precision of the linear layers' GEMMs: fp32, or bf16 inputs (weights and activations, and "
     "the gradients in backward, rounded to bf16) with fp32 sums; master weights, pushes and adopts stay fp32 "
     "(cuda: use --matmul)"},
    {"dynamic_h", DL_CFG_ENUM, F(dynamic_h), 0, 0, "off", "off|speed", 0,
     "networked: off (push every H steps, the Welcome's H) or speed (H x this learner's step rate / the fleet's "
     "median rate from the synchronizer's Acks, rounded, within dynamic_h_min..dynamic_h_max, changed only at "
     "a push-cycle boundary: every learner pushes at the fleet's cadence)"},
    {"dynamic_h_min", DL_CFG_INT, F(dynamic_h_min), 1, 1000000, "1", NULL, 0, "dynamic_h speed: smallest H",
     "steps"},
    {"dynamic_h_max", DL_CFG_INT, F(dynamic_h_max), 0, 1000000, "0", NULL, 0,
     "dynamic_h speed: largest H (0 = 4 x the Welcome's H); >= dynamic_h_min", "steps"},
};
#undef F
#define NCFG (sizeof learner_table / sizeof learner_table[0])

/* --help's headings: the options a first cluster needs, then the rest by topic. */
static const dl_cfg_section learner_sections[] = {
    {"common options", "connect id data data_shard data_shards server_key key_file steps threads device"},
    {"model (the same on every learner and the synchronizer)", "run_id n_layer n_head n_embd seq_len vocab fragments"},
    {"data", "data_format val_frac data_shard_mode"},
    {"training", "batch lr warmup min_lr_frac adam_fleet weight_decay beta1 beta2 eps grad_clip seed precision matmul"},
    {"alone (--standalone), checkpoints and model files",
     "standalone val_every val_batches log_every checkpoint save_every stop_after resume init_from save_model "
     "loss_log"},
    {"restarts (the recovery file)", "state_dir recovery recovery_every_s recovery_every_steps"},
    {"pushes and the global model",
     "adopt alpha push_codec push_block push_topk push_rounding error_feedback final_flush flush_timeout_ms "
     "local_eval update_max_ratio max_version_jump dynamic_h dynamic_h_min dynamic_h_max"},
    {"logs and metrics", "log_level events metrics"},
    {"connection timers (rarely changed)",
     "connect_timeout_ms hello_retry_ms hello_retry_max_ms hello_unsent_ms poll_max_ms silence_min_ms "
     "silence_rebuild_ms ack_expiry_min_ms bye_linger_ms reconnect_ms reconnect_max_ms push_decision_timeout_ms"},
    {"research: the GPA inner optimizer (docs/GPA.md)", "optimizer gpa_mu_x gpa_mu_y gpa_mu gpa_h"},
    {"research: sync timing (docs/SYNC_TIMING.md)",
     "sync_timing h_min h_max wa_w_stale wa_w_loss wa_w_rate wa_w_link wa_w_ckpt wa_rate_ref wa_w_queue wa_queue_ref "
     "wa_max_per_step wa_fc_alpha wa_fc_beta pressure pressure_poll_ms pressure_timeout_ms pressure_stale_ms "
     "timing_trace_out timing_trace_in timing_seed oracle_window"},
    {"for tests and benchmarks", "throttle byzantine"},
};

static volatile sig_atomic_t stop_requested;
static dloco_learner *g_learner; /* networked: the library handle the signal also stops (join, barrier) */
static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
    if (g_learner) dloco_learner_stop(g_learner);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "dloco-learner: %s: %s%s%s\n", what, dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 2;
}

/* --byzantine: none | flip | scale:K into *on, *scale. Returns 0 or DL_EINVAL. */
static int parse_byzantine(const char *s, int *on, double *scale)
{
    *on = 0;
    *scale = 1.0;
    if (!strcmp(s, "none")) return 0;
    if (!strcmp(s, "flip")) {
        *on = 1;
        *scale = -1.0;
        return 0;
    }
    if (!strncmp(s, "scale:", 6)) {
        char *end = NULL;
        double k = strtod(s + 6, &end);
        if (end != s + 6 && !*end && isfinite(k) && fabs(k) <= 1e6) {
            *on = 1;
            *scale = k;
            return 0;
        }
    }
    return dl_err(DL_EINVAL, "option byzantine: '%s' is not none, flip or scale:K with K finite in [-1e6, 1e6]", s);
}

/* push_codec, push_block, push_topk, push_rounding into cfg->pcodec and
 * cfg->prounding; the block and topk rows count only for the codecs that
 * have them. Returns 0 or DL_EINVAL naming the row. */
static int resolve_push_codec(learner_cfg *cfg)
{
    dl_codec_rounding r;
    DL_TRY(dl_codec_push_opts(cfg->push_codec, (long long)cfg->push_block, (long long)cfg->push_topk,
                              cfg->push_rounding, &cfg->pcodec, &r));
    cfg->prounding = (int)r;
    return 0;
}

/* A push codec for the banner: "fp32", "int4 block 128 nearest, error feedback". */
static const char *push_codec_desc(const learner_cfg *cfg, char *buf, size_t cap)
{
    const dl_codec *pc = &cfg->pcodec;
    int n = snprintf(buf, cap, "%s", dl_codec_name(pc->id));
    if (pc->id == DL_CODEC_TOPK) n += snprintf(buf + n, cap - (size_t)n, " %u of %u", pc->topk, pc->block);
    else if (dl_codec_is_block(pc->id))
        n += snprintf(buf + n, cap - (size_t)n, " block %u %s", pc->block, cfg->push_rounding);
    if (pc->id != DL_CODEC_FP32)
        snprintf(buf + n, cap - (size_t)n, ", %s", cfg->error_feedback ? "error feedback" : "no error feedback");
    return buf;
}

/* The networked rows that need more than a bounds check: byzantine, the push codec, and the
 * CURVE keys (server_key and key_file together or not at all). */
static int resolve_networked(learner_cfg *cfg)
{
    DL_TRY(parse_byzantine(cfg->byzantine, &cfg->byz_on, &cfg->byz_scale));
    DL_TRY(resolve_push_codec(cfg));
    cfg->curve_server[0] = cfg->curve_public[0] = cfg->curve_secret[0] = 0;
    if (!cfg->server_key[0] && !cfg->key_file[0]) return 0;
    if (!cfg->server_key[0] || !cfg->key_file[0])
        return dl_err(DL_EINVAL, "options server_key and key_file go together (CURVE needs the synchronizer's public "
                                 "key and this learner's key pair); %s is set, %s is empty",
                      cfg->server_key[0] ? "server_key" : "key_file", cfg->server_key[0] ? "key_file" : "server_key");
    int rc = dl_auth_load_public(cfg->server_key, cfg->curve_server);
    if (rc) return dl_err(rc, "option server_key: %s", dl_errmsg());
    dl_auth_keypair kp;
    if ((rc = dl_auth_load_keypair(cfg->key_file, &kp))) return dl_err(rc, "option key_file: %s", dl_errmsg());
    memcpy(cfg->curve_public, kp.public_z85, sizeof cfg->curve_public);
    memcpy(cfg->curve_secret, kp.secret_z85, sizeof cfg->curve_secret);
    memset(&kp, 0, sizeof kp);
    return 0;
}

/* The comms timing rows as session options. */
static dl_comms_opts comms_timing(const learner_cfg *cfg)
{
    return (dl_comms_opts){
        .connect_timeout_ms = (int)cfg->connect_timeout_ms,
        .hello_retry_ms = (int)cfg->hello_retry_ms,
        .hello_retry_max_ms = (int)cfg->hello_retry_max_ms,
        .hello_unsent_ms = (int)cfg->hello_unsent_ms,
        .poll_max_ms = (int)cfg->poll_max_ms,
        .silence_min_ms = (int)cfg->silence_min_ms,
        .silence_rebuild_ms = (int)cfg->silence_rebuild_ms,
        .ack_expiry_min_ms = (int)cfg->ack_expiry_min_ms,
        .bye_linger_ms = (int)cfg->bye_linger_ms,
        .reconnect_ms = (int)cfg->reconnect_ms,
        .reconnect_max_ms = (int)cfg->reconnect_max_ms,
    };
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

/* The `data:` line and event, in both modes: which data, read how, and the
 * vocab the model takes from it (what a networked learner's Hello declares). */
static void print_data(const learner_cfg *cfg, const dl_data *data, int vocab)
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

static int run_networked(const learner_cfg *cfg, dl_trainer *tr, const dl_train_cfg *tc, const char *hello_device,
                         FILE *losslog, dl_recovery *rec);

/* The sessions' counters as one learner's (dl_comms_stats_add). */
static void sessions_stats(dl_comms **c, int n, dl_comms_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; c && k < n; k++) {
        if (!c[k]) continue; /* a join that failed before its sessions were opened */
        dl_comms_stats s;
        dl_comms_get_stats(c[k], &s);
        dl_comms_stats_add(out, &s);
    }
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

/* The rules of a networked config across options (an empty id is the
 * default learner-<pid>, checked once it is set); resolves the CURVE keys. */
static int check_networked(learner_cfg *cfg)
{
    if (cfg->id[0] && !dl_comms_id_ok(cfg->id))
        return dl_err(DL_EINVAL, "option id: '%s' is not [A-Za-z0-9._-]{1,64}", cfg->id);
    dl_comms_opts t = comms_timing(cfg);
    DL_TRY(dl_comms_check_timeouts(&t, (int)cfg->push_decision_timeout_ms));
    if (!cfg->run_id[0]) return dl_err(DL_EINVAL, "option run_id is empty");
    DL_TRY(resolve_networked(cfg));
    if (cfg->stop_after)
        return dl_err(DL_EINVAL, "--stop_after is for --standalone runs");
    if (cfg->save_model[0])
        return dl_err(DL_EINVAL, "--save_model is for --standalone runs (dloco export writes the global model)");
    if (cfg->init_from[0])
        return dl_err(DL_EINVAL, "--init_from is for --standalone runs (a networked learner starts from the "
                                 "synchronizer's global model: give the file to dloco-sync --init_from)");
    return 0;
}

/* heterogeneous learners (docs/HETEROGENEOUS.md): the rules across rows of dynamic_h and precision. */
static int check_hetero(const learner_cfg *cfg)
{
    dl_dynh d;
    DL_TRY(dl_dynh_init(&d, !strcmp(cfg->dynamic_h, "speed") ? DL_DYNH_SPEED : DL_DYNH_OFF, (int)cfg->dynamic_h_min,
                        (int)cfg->dynamic_h_max));
    /* the wa policies keep their own corridor per fragment from the real step; dynamic H moves the schedule
     * step and H per cycle: the two would disagree about when a fragment last left */
    if (d.mode != DL_DYNH_OFF && strcmp(cfg->sync_timing, "fixed"))
        return dl_err(DL_EINVAL, "option dynamic_h: speed works with sync_timing fixed only (sync_timing is %s)",
                      cfg->sync_timing);
    /* the timing trace and the pressure poll count real steps; dynamic H hands the node schedule steps */
    if (d.mode != DL_DYNH_OFF && (cfg->pressure[0] || cfg->timing_trace_out[0]))
        return dl_err(DL_EINVAL, "option dynamic_h: speed does not go with --pressure or --timing_trace_out (their "
                                 "steps are the fixed schedule's)");
    /* sync timing and dynamic H decide when pushes leave: a standalone learner has none */
    if (cfg->standalone && (d.mode != DL_DYNH_OFF || strcmp(cfg->sync_timing, "fixed") || cfg->pressure[0] ||
                            cfg->timing_trace_in[0] || cfg->timing_trace_out[0]))
        return dl_err(DL_EINVAL, "options dynamic_h, sync_timing, pressure and timing_trace_in/out are for networked "
                                 "learners (a --standalone run pushes nothing)");
    if (!strcmp(cfg->precision, "bf16") && !strcmp(cfg->device, "cuda"))
        return dl_err(DL_EINVAL, "option precision: bf16 is the CPU model's; on --device cuda use --matmul bf16");
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

/* --optimizer and the gpa rows (checked in either mode, whichever the
 * optimizer): gpa_mu_x -1 resolved from the DiLoCo mapping into *mu_x.
 * Returns 0 or DL_EINVAL naming the option. */
static int check_optimizer(const learner_cfg *cfg, double *mu_x)
{
    if (cfg->gpa_mu >= 1.0)
        return dl_err(DL_EINVAL, "option gpa_mu: %g, the outer momentum, must be below 1", cfg->gpa_mu);
    *mu_x = cfg->gpa_mu_x == -1.0 ? dl_gpa_mu_x_from(cfg->gpa_mu, cfg->gpa_h) : cfg->gpa_mu_x;
    if (cfg->gpa_mu_x != -1.0 && !(cfg->gpa_mu_x >= 0.0 && cfg->gpa_mu_x < 1.0))
        return dl_err(DL_EINVAL, "option gpa_mu_x: %g is not -1 (the DiLoCo mapping) or in [0, 1)", cfg->gpa_mu_x);
    if (cfg->gpa_mu_y >= 1.0)
        return dl_err(DL_EINVAL, "option gpa_mu_y: %g must be below 1 (z = y + mu_y/(1-mu_y) (y - x))", cfg->gpa_mu_y);
    if (!strcmp(cfg->optimizer, "gpa") && !strcmp(cfg->device, "cuda"))
        return dl_err(DL_EINVAL, "option optimizer: gpa runs on the cpu only (the CUDA trainer has no GPA step): use "
                                 "--device cpu, or --optimizer adamw on the GPU");
    if (!strcmp(cfg->optimizer, "gpa") && cfg->adam_fleet != 0.0)
        return dl_err(DL_EINVAL, "option optimizer: gpa with adam_fleet %g is not supported (adam_fleet 0)",
                      cfg->adam_fleet);
    return dl_gpa_check(*mu_x, cfg->gpa_mu_y);
}

/* --help: the common options first, the rest under headings (learner_sections) */
static void print_options(FILE *f)
{
    dl_cfg_usage_sections(learner_table, NCFG, learner_sections, sizeof learner_sections / sizeof learner_sections[0],
                          f);
}

static int resumed_from_recovery;

/* The recovery file of a networked learner (gpt/recovery.h): its path from
 * --recovery / --state_dir / --id, then a resume from it when it is this
 * learner's. *out stays NULL when there is none (off, a default id, adam_fleet on a GPU). */
static int open_recovery(const learner_cfg *cfg, int id_given, dl_trainer *tr, dl_recovery **out)
{
    *out = NULL;
    char path[2 * DL_CFG_STRLEN + 32];
    if (!strcmp(cfg->recovery, "off")) return 0;
    if (cfg->adam_fleet != 0.0 && dl_trainer_device(tr) == DL_DEVICE_CUDA) {
        printf("recovery: off (a run with adam_fleet on a GPU cannot resume its optimizer state yet)\n");
        return 0;
    }
    if (cfg->recovery[0]) snprintf(path, sizeof path, "%s", cfg->recovery);
    else if (!id_given) {
        printf("recovery: off (no --id: a restart under the default id %s would not find it again)\n", cfg->id);
        return 0;
    } else {
        if (cfg->state_dir[0] && mkdir(cfg->state_dir, 0755) != 0 && errno != EEXIST)
            return dl_err(DL_EIO, "option state_dir: cannot create %s: %s", cfg->state_dir, strerror(errno));
        snprintf(path, sizeof path, "%s%sdloco-%s.recovery", cfg->state_dir, cfg->state_dir[0] ? "/" : "", cfg->id);
    }
    dl_recovery_opts o = {.path = path,
                          .every_s = cfg->recovery_every_s,
                          .every_steps = cfg->recovery_every_steps,
                          .max_step = cfg->steps,
                          .run_tag = dl_recovery_tag(cfg->run_id, cfg->id),
                          .id = cfg->id};
    DL_TRY(dl_recovery_open(&o, out));
    int rc = dl_recovery_prepare(*out, tr);
    if (rc) {
        dl_recovery_close(out);
        return dl_err(rc, "recovery file %s: %s (or give --recovery off)", path, dl_errmsg());
    }
    char why[1024];
    if (dl_recovery_load(*out, tr, why, sizeof why)) {
        resumed_from_recovery = 1;
        printf("recovery: resumed at step %lld (learning-rate schedule, optimizer state, data position) from %s%s\n",
               (long long)dl_trainer_steps_done(tr), path, cfg->resume[0] ? " (not --resume: this file is newer)" : "");
    } else if (why[0]) {
        printf("recovery: %s not used (%s); starting fresh\n", path, why);
    } else {
        printf("recovery: %s (written every %g s or %lld steps and at the finish; none yet: starting fresh)\n", path,
               cfg->recovery_every_s, (long long)cfg->recovery_every_steps);
    }
    return 0;
}

/* --print-config: the same checks as a networked start, on a copy (the printed id stays as given) */
static int print_check(void *obj)
{
    learner_cfg v = *(const learner_cfg *)obj;
    double mu_x;
    int rc = check_optimizer(&v, &mu_x);
    if (!rc && !v.standalone) rc = check_networked(&v);
    return rc ? rc : check_hetero(&v);
}

int main(int argc, char **argv)
{
    if (dl_blas_select(&argc, argv)) return 2; /* before any matmul: OpenBLAS's kernels (kernels/blas_select.h) */
    learner_cfg cfg;
    static const dl_cfg_main preamble = {"dloco-learner",
                                         "usage: dloco-learner [--standalone] [--config FILE] [--name value ...]\n"
                                         "networked by default: connects to dloco-sync at --connect; "
                                         "--standalone trains alone\n",
                                         print_check, print_options};
    int rc;
    if (dl_cfg_main_parse(learner_table, NCFG, &cfg, &preamble, argc, argv, &rc)) return rc;
    if ((rc = check_hetero(&cfg))) return fail("bad configuration", rc);
    dl_log_set_level(dl_log_level_parse(cfg.log_level));
    dl_log_set_name("learner");
    if ((rc = dl_event_open(cfg.events, "learner"))) return fail("opening the events file (option events)", rc);
    int id_given = cfg.id[0] != 0; /* a default id (hostname-pid) is never met again: no recovery file */
    if (!cfg.standalone) {
        if (!cfg.id[0]) dl_learner_default_id(cfg.id, sizeof cfg.id);
        if ((rc = check_networked(&cfg))) return fail("bad configuration", rc);
    }
    double gpa_mu_x = 0.0;
    if ((rc = check_optimizer(&cfg, &gpa_mu_x))) return fail("bad configuration", rc);
    if (cfg.threads > 0) omp_set_num_threads((int)cfg.threads);
    warn_shared_cores(&cfg);
    if (cfg.warmup >= cfg.steps) cfg.warmup = cfg.steps / 10;

    int device;
    char device_desc[768], hello_device[129];
    if ((rc = pick_device(&cfg, &device, device_desc, sizeof device_desc, hello_device, sizeof hello_device)))
        return fail("choosing the device", rc);
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
    if ((rc = dl_model_config_from(&mo, &(dl_model_config){0}))) return fail("model config", rc);

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
    if ((rc = dl_data_open(&dopt, &data))) return fail("loading data", rc);
    int vocab = cfg.model.vocab ? (int)cfg.model.vocab : (!strcmp(dl_data_kind(data), "text") ? 256 : 50257);
    if (!cfg.model.vocab && strcmp(dl_data_kind(data), "text")) {
        /* re-open with the real bound so out-of-range tokens are refused */
        dl_data_close(&data);
        dopt.vocab = vocab;
        if ((rc = dl_data_open(&dopt, &data))) return fail("loading data", rc);
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
        return fail("model config", rc);
    }
    dl_trainer *tr = NULL;
    if ((rc = dl_trainer_open(&tc, data, &tr))) return fail("building the model", rc);
    if ((rc = apply_precision(&cfg, tr))) {
        dl_trainer_close(&tr);
        return fail("bad configuration", rc);
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
    if (!cfg.standalone && cfg.resume[0] && (rc = dl_trainer_resume_optimizer(tr, cfg.resume))) {
        dl_trainer_close(&tr);
        return fail("resuming", rc);
    }
    dl_recovery *rec = NULL;
    if (!cfg.standalone && (rc = open_recovery(&cfg, id_given, tr, &rec))) {
        dl_trainer_close(&tr);
        return fail("bad configuration", rc);
    }
    if (!cfg.standalone) {
        print_data(&cfg, data, vocab);
        if (cfg.resume[0] && !resumed_from_recovery)
            printf("resumed the step (%lld) and AdamW state of %s\n", (long long)dl_trainer_steps_done(tr), cfg.resume);
        FILE *ll = NULL;
        if (cfg.loss_log[0] && !(ll = fopen(cfg.loss_log, "a"))) {
            dl_trainer_close(&tr);
            return fail("opening loss_log", dl_err(DL_EIO, "%s", cfg.loss_log));
        }
        if (ll) setvbuf(ll, NULL, _IOLBF, 0);
        rc = run_networked(&cfg, tr, &tc, hello_device, ll, rec);
        dl_recovery_close(&rec);
        if (ll) fclose(ll);
        dl_trainer_close(&tr);
        release_device(device);
        return rc;
    }
    if (cfg.init_from[0] && cfg.resume[0]) {
        dl_trainer_close(&tr);
        return fail("bad configuration", dl_err(DL_EINVAL, "--init_from and --resume both given: a checkpoint already "
                                                           "holds the model (and the optimizer state); choose one"));
    }
    if (cfg.init_from[0] && (rc = init_from_file(tr, cfg.init_from))) {
        dl_trainer_close(&tr);
        return fail("--init_from", rc);
    }
    if (cfg.resume[0] && (rc = dl_trainer_resume(tr, cfg.resume))) {
        dl_trainer_close(&tr);
        return fail("resuming", rc);
    }
    FILE *losslog = NULL;
    if (cfg.loss_log[0] && !(losslog = fopen(cfg.loss_log, "a"))) {
        dl_trainer_close(&tr);
        return fail("opening loss_log", dl_err(DL_EIO, "%s", cfg.loss_log));
    }
    if (losslog) setvbuf(losslog, NULL, _IOLBF, 0); /* one line per step, visible as it happens */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    size_t nparams = dl_trainer_num_params(tr);
    double flops_tok = dl_model_flops_per_token(&tc.model, tc.model.seq_len);
    int64_t tok_per_step = (int64_t)tc.batch * tc.model.seq_len;
    printf("dloco-learner standalone: GPT L=%d NH=%d C=%d T=%d V=%d, %zu parameters, B=%d, %d threads\n",
           tc.model.n_layer, tc.model.n_head, tc.model.n_embd, tc.model.seq_len, vocab, nparams, tc.batch,
           omp_get_max_threads());
    char ev_dev[200];
    dl_event("learner_start", "mode=standalone device=%s params=%zu steps=%lld",
             dl_event_str(hello_device, ev_dev, sizeof ev_dev), nparams, (long long)cfg.steps);
    print_data(&cfg, data, vocab);
    int64_t start = dl_trainer_steps_done(tr);
    if (start) {
        char ev_path[DL_CFG_STRLEN + 8];
        printf("resumed from %s at step %lld\n", cfg.resume, (long long)start);
        dl_event("resumed", "path=%s step=%lld", dl_event_str(cfg.resume, ev_path, sizeof ev_path), (long long)start);
    }
    double val0 = 0.0;
    if ((rc = dl_trainer_eval(tr, &val0))) {
        dl_trainer_close(&tr);
        return fail("evaluating", rc);
    }
    double val = val0, best = val0;
    printf("step %6lld | val loss %.4f\n", (long long)start, val0);
    fflush(stdout);

    double t_run = dl_clock_s(), t_win = t_run, train_sum = 0.0, last_train = NAN;
    int64_t win_steps = 0, step = start, val_at = start; /* val is the loss of the model at step val_at */
    int64_t stop_at = cfg.stop_after ? start + cfg.stop_after : cfg.steps;
    if (stop_at > cfg.steps) stop_at = cfg.steps;
    while (step < stop_at && !stop_requested) {
        float norm = 0.0f;
        double loss = NAN;
        rc = dl_trainer_step(tr, &loss, &norm);
        step = dl_trainer_steps_done(tr);
        if (rc == DL_ERANGE || (rc == 0 && !isfinite(loss))) {
            fprintf(stderr, "dloco-learner: training loss became %f (gradient norm %f) at step %lld; stopping (lower --lr?)\n",
                    loss, norm, (long long)step);
            dl_trainer_close(&tr);
            return 3;
        }
        if (rc) {
            dl_trainer_close(&tr);
            return fail("training step", rc);
        }
        if (losslog) fprintf(losslog, "%lld %a\n", (long long)step, loss);
        train_sum += loss;
        last_train = loss;
        win_steps++;
        int do_val = (cfg.val_every && step % cfg.val_every == 0) || step == cfg.steps;
        if (do_val) {
            if ((rc = dl_trainer_eval(tr, &val))) {
                dl_trainer_close(&tr);
                return fail("evaluating", rc);
            }
            if (val < best) best = val;
            val_at = step;
        }
        if (step % cfg.log_every == 0 || do_val) {
            double dt = dl_clock_s() - t_win;
            double ms = 1e3 * dt / (double)win_steps;
            double tps = (double)(win_steps * tok_per_step) / dt;
            printf("step %6lld/%lld | train %.4f | ", (long long)step, (long long)cfg.steps,
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
        if (cfg.checkpoint[0] && cfg.save_every && step % cfg.save_every == 0 &&
            (rc = dl_trainer_save(tr, cfg.checkpoint))) {
            dl_trainer_close(&tr);
            return fail("saving checkpoint", rc);
        }
    }
    double wall = dl_clock_s() - t_run;
    if (stop_requested) printf("stopped by signal at step %lld\n", (long long)step);
    /* the summary's loss is the final model's (--stop_after, a signal) */
    if (val_at != step) {
        if ((rc = dl_trainer_eval(tr, &val))) {
            dl_trainer_close(&tr);
            return fail("evaluating", rc);
        }
        if (val < best) best = val;
    }
    if (cfg.checkpoint[0]) {
        if ((rc = dl_trainer_save(tr, cfg.checkpoint))) {
            dl_trainer_close(&tr);
            return fail("saving checkpoint", rc);
        }
        printf("checkpoint: %s (step %lld)\n", cfg.checkpoint, (long long)step);
        char ev_path[DL_CFG_STRLEN + 8];
        dl_event("checkpoint", "path=%s step=%lld", dl_event_str(cfg.checkpoint, ev_path, sizeof ev_path),
                 (long long)step);
    }
    if (cfg.save_model[0] && (rc = save_model_file(tr, cfg.save_model))) {
        dl_trainer_close(&tr);
        return fail("saving the model (option save_model)", rc);
    }
    if (losslog) fclose(losslog);
    int64_t done = step - start;
    printf("summary: %lld steps in %.1f s | %.0f tok/s | train loss %.4f | val loss on %s %.4f -> %.4f (best %.4f)\n",
           (long long)done, wall, done ? (double)(done * tok_per_step) / wall : 0.0, last_train, cfg.data, val0, val,
           best);
    dl_event("train_summary", "steps=%lld step=%lld wall_s=%.3f train_loss=%.17g val_loss_start=%.17g val_loss=%.17g "
             "val_loss_best=%.17g stopped=%d",
             (long long)done, (long long)step, wall, last_train, val0, val, best, stop_requested ? 1 : 0);
    dl_trainer_close(&tr);
    release_device(device);
    return 0;
}

/* ---- networked mode: the training thread; the comms thread owns the socket */


/* ---- sync timing (learner/timing.h, learner/pressure.h, docs/SYNC_TIMING.md) */

typedef struct {
    const learner_cfg *cfg;
    dl_timing_kind kind;
    dl_timing *t;      /* opened once H is known (after the Welcome); NULL: dl_plan_due */
    dl_pressure *src;  /* --pressure, or NULL */
    FILE *trace;       /* --timing_trace_out */
    int *counts;       /* --timing_trace_in: [P] push decisions per fragment */
    double *ptrace;    /* its pressure per step (unknown = 0) */
    int64_t tsteps;
    int P, on; /* on: the node asks timing_due (not fixed, or a trace or a pressure source wanted) */
    dl_pressure_sample last;
} timing_ctx;

/* Read a --timing_trace_out file: "dloco-timing-trace 1", "fragments P", then "p STEP PRESSURE" for steps 1, 2,
 * ... in order (PRESSURE a finite value >= 0, or "unknown"), "d STEP FRAGMENT" (FRAGMENT in [0, P), STEP
 * not above the last p line), and last "end STEPS" (= the last p line). Everything else is refused. */
static int read_timing_trace(const char *path, int P, int64_t steps, int **counts, double **pr, int64_t *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return dl_err(DL_EIO, "option timing_trace_in: cannot open %s", path);
    char line[256];
    long long s = 0, end = -1, lineno = 0;
    size_t cap = 1024;
    int *c = dl_xcalloc((size_t)P, sizeof *c);
    double *t = dl_xcalloc(cap, sizeof *t);
    int rc = 0, hp = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char tag[24], val[64], extra;
        long long a;
        int fr;
        if (end >= 0) rc = dl_err(DL_EINVAL, "line %lld after the end line", lineno);
        else if (lineno == 1) {
            if (strcmp(line, "dloco-timing-trace 1\n")) rc = dl_err(DL_EINVAL, "line 1 is not 'dloco-timing-trace 1'");
        } else if (lineno == 2) {
            if (sscanf(line, "fragments %d %c", &fr, &extra) != 1 || fr != P)
                rc = dl_err(DL_EINVAL, "line 2: not 'fragments %d' (this learner's fragments)", P);
        } else if (sscanf(line, "%23s %lld %63s %c", tag, &a, val, &extra) == 3 && !strcmp(tag, "p")) {
            char *e = NULL;
            double v = strcmp(val, "unknown") ? strtod(val, &e) : 0.0;
            if (a != s + 1) rc = dl_err(DL_EINVAL, "line %lld: step %lld, expected %lld", lineno, a, (long long)(s + 1));
            else if (e && (*e || !isfinite(v) || v < 0))
                rc = dl_err(DL_EINVAL, "line %lld: pressure '%s' is not a finite value >= 0 or unknown", lineno, val);
            else if (a > 100000000) rc = dl_err(DL_EINVAL, "line %lld: more than 1e8 steps", lineno);
            else {
                if ((size_t)a > cap) t = dl_xrealloc(t, (cap *= 2) * sizeof *t);
                t[a - 1] = v;
                s = a;
                hp = 1;
            }
        } else if (sscanf(line, "%23s %lld %d %c", tag, &a, &fr, &extra) == 3 && !strcmp(tag, "d")) {
            if (a < 1 || a > s || fr < 0 || fr >= P)
                rc = dl_err(DL_EINVAL, "line %lld: decision at step %lld of fragment %d outside steps 1..%lld, "
                                       "fragments 0..%d", lineno, a, fr, (long long)s, P - 1);
            else c[fr]++;
        } else if (sscanf(line, "%23s %lld %c", tag, &a, &extra) == 2 && !strcmp(tag, "end")) {
            if (a != s) rc = dl_err(DL_EINVAL, "line %lld: end %lld, but the last step is %lld", lineno, a, (long long)s);
            end = a;
        } else rc = dl_err(DL_EINVAL, "line %lld: not a p, d or end line", lineno);
    }
    fclose(f);
    if (!rc && (end < 0 || !hp)) rc = dl_err(DL_EINVAL, "no end line (a trace of a run that did not finish?)");
    if (!rc && end != steps)
        rc = dl_err(DL_EINVAL, "the trace has %lld steps, this run --steps %lld", (long long)end, (long long)steps);
    if (rc) {
        free(c);
        free(t);
        return dl_err(rc, "option timing_trace_in: %s: %s", path, dl_errmsg());
    }
    *counts = c;
    *pr = t;
    *n = end;
    return 0;
}

/* Before joining: the sync timing rows across options; opens --pressure and reads --timing_trace_in. */
static int timing_prepare(const learner_cfg *cfg, int P, timing_ctx *tc)
{
    memset(tc, 0, sizeof *tc);
    tc->cfg = cfg;
    tc->P = P;
    DL_TRY(dl_timing_parse(cfg->sync_timing, &tc->kind));
    tc->on = tc->kind != DL_TIMING_FIXED || cfg->timing_trace_out[0] || cfg->pressure[0];
    int planned = tc->kind == DL_TIMING_MATCHED_RANDOM || tc->kind == DL_TIMING_ORACLE;
    if (planned && !cfg->timing_trace_in[0])
        return dl_err(DL_EINVAL, "option sync_timing %s needs --timing_trace_in (a trace of the policy under test)",
                      cfg->sync_timing);
    if (!planned && cfg->timing_trace_in[0])
        return dl_err(DL_EINVAL, "option timing_trace_in is for sync_timing matched_random or oracle");
    if (cfg->h_min && cfg->h_max && cfg->h_min > cfg->h_max)
        return dl_err(DL_EINVAL, "option h_min %lld is above h_max %lld", (long long)cfg->h_min, (long long)cfg->h_max);
    if (cfg->pressure[0]) {
        int rc = dl_pressure_open(cfg->pressure, (int)cfg->pressure_poll_ms, (int)cfg->pressure_timeout_ms,
                                  (int)cfg->pressure_stale_ms, &tc->src);
        if (rc) return dl_err(rc, "option pressure: %s", dl_errmsg());
    }
    if (planned) DL_TRY(read_timing_trace(cfg->timing_trace_in, P, cfg->steps, &tc->counts, &tc->ptrace, &tc->tsteps));
    if (cfg->timing_trace_out[0]) {
        if (!(tc->trace = fopen(cfg->timing_trace_out, "w")))
            return dl_err(DL_EIO, "option timing_trace_out: cannot write %s", cfg->timing_trace_out);
        fprintf(tc->trace, "dloco-timing-trace 1\nfragments %d\n", P);
    }
    return 0;
}

/* After the Welcome: the policy for the synchronizer's H. */
static int timing_start(timing_ctx *tc, int P, int H)
{
    const learner_cfg *cfg = tc->cfg;
    dl_timing_cfg c;
    dl_timing_defaults(&c, tc->kind, P, H);
    if (cfg->h_min) c.h_min = (int)cfg->h_min;
    if (cfg->h_max) c.h_max = (int)cfg->h_max;
    c.w_stale = cfg->wa_w_stale, c.w_loss = cfg->wa_w_loss, c.w_rate = cfg->wa_w_rate, c.w_link = cfg->wa_w_link;
    c.w_ckpt = cfg->wa_w_ckpt, c.rate_ref = cfg->wa_rate_ref, c.fc_alpha = cfg->wa_fc_alpha, c.fc_beta = cfg->wa_fc_beta;
    c.w_queue = cfg->wa_w_queue, c.queue_ref = cfg->wa_queue_ref;
    c.seed = (uint64_t)cfg->timing_seed;
    c.steps = cfg->steps;
    c.counts = tc->counts;
    c.trace = tc->ptrace;
    c.trace_len = tc->tsteps;
    c.window = (int)cfg->oracle_window;
    c.max_per_step = (int)cfg->wa_max_per_step;
    int rc = dl_timing_open(&c, &tc->t);
    if (rc) return dl_err(rc, "option sync_timing %s at H=%d: %s", cfg->sync_timing, H, dl_errmsg());
    char ev_src[DL_CFG_STRLEN + 8];
    dl_event("timing_start", "id=%s policy=%s h=%d h_min=%d h_max=%d fragments=%d pressure=%s seed=%llu", cfg->id,
             cfg->sync_timing, H, c.h_min, c.h_max, P, dl_event_str(cfg->pressure, ev_src, sizeof ev_src),
             (unsigned long long)c.seed);
    return 0;
}

/* After each step, before dl_node_after_step: poll the pressure and feed the policy. */
static void timing_step(timing_ctx *tc, int64_t step, double loss)
{
    if (!tc->t) return;
    dl_pressure_sample s = {.known = 0};
    if (tc->src) {
        const char *why = NULL;
        if (dl_pressure_get(tc->src, dl_clock_ns(), &s, &why))
            dl_event("pressure_refused", "id=%s step=%lld reason=%s kept=%d", tc->cfg->id, (long long)step,
                     why ? why : "unknown", s.known);
    }
    tc->last = s;
    dl_timing_observe(tc->t, step, &s, loss);
    if (tc->trace) {
        double pr = dl_timing_pressure(tc->t);
        if (isnan(pr)) fprintf(tc->trace, "p %lld unknown\n", (long long)step);
        else fprintf(tc->trace, "p %lld %.17g\n", (long long)step, pr);
    }
}

/* dl_node_opts.due */
static int timing_due(void *ctx, int64_t step, int p, int H)
{
    timing_ctx *tc = ctx;
    if (!tc->t) return dl_plan_due(step, p, H, tc->P);
    dl_timing_decision d;
    int due = dl_timing_due(tc->t, step, p, H, &d);
    if (!due) return 0;
    if (tc->trace) fprintf(tc->trace, "d %lld %d\n", (long long)step, p);
    dl_event("sync_timing",
             "id=%s step=%lld fragment=%d policy=%s elapsed=%lld forced=%d score=%.6g pressure=%.6g rate=%.6g "
             "link=%.6g ckpt=%.6g queue=%.6g known=%d",
             tc->cfg->id, (long long)step, p, tc->cfg->sync_timing, (long long)d.elapsed, d.forced, d.score,
             d.pressure, tc->last.rate, tc->last.link, tc->last.ckpt, tc->last.queue, tc->last.known);
    return 1;
}

static void timing_finish(timing_ctx *tc, int64_t step)
{
    if (tc->trace) {
        fprintf(tc->trace, "end %lld\n", (long long)step);
        fclose(tc->trace);
        tc->trace = NULL;
    }
    if (tc->src) {
        dl_pressure_stats st;
        dl_pressure_get_stats(tc->src, &st);
        dl_event("pressure_summary", "id=%s polls=%llu good=%llu refused=%llu", tc->cfg->id,
                 (unsigned long long)st.polls, (unsigned long long)st.good, (unsigned long long)st.refused);
    }
    dl_timing_close(&tc->t);
    dl_pressure_close(&tc->src);
    free(tc->counts);
    free(tc->ptrace);
}

/* The networked rows as the learner library's options (learner/learner_int.h). */
static void net_rows(const learner_cfg *cfg, dl_learner_netcfg *n)
{
    memset(n, 0, sizeof *n);
    snprintf(n->adopt, sizeof n->adopt, "%s", cfg->adopt);
    n->alpha = cfg->alpha;
    snprintf(n->push_codec, sizeof n->push_codec, "%s", cfg->push_codec);
    snprintf(n->push_rounding, sizeof n->push_rounding, "%s", cfg->push_rounding);
    n->push_block = cfg->push_block;
    n->push_topk = cfg->push_topk;
    n->error_feedback = cfg->error_feedback;
    n->flush_timeout_ms = cfg->flush_timeout_ms;
    n->connect_timeout_ms = cfg->connect_timeout_ms;
    n->hello_retry_ms = cfg->hello_retry_ms;
    n->hello_retry_max_ms = cfg->hello_retry_max_ms;
    n->hello_unsent_ms = cfg->hello_unsent_ms;
    n->poll_max_ms = cfg->poll_max_ms;
    n->silence_min_ms = cfg->silence_min_ms;
    n->silence_rebuild_ms = cfg->silence_rebuild_ms;
    n->ack_expiry_min_ms = cfg->ack_expiry_min_ms;
    n->bye_linger_ms = cfg->bye_linger_ms;
    n->reconnect_ms = cfg->reconnect_ms;
    n->reconnect_max_ms = cfg->reconnect_max_ms;
    n->push_decision_timeout_ms = cfg->push_decision_timeout_ms;
    n->update_max_ratio = cfg->update_max_ratio;
    n->max_version_jump = cfg->max_version_jump;
    snprintf(n->server_key, sizeof n->server_key, "%s", cfg->server_key);
    snprintf(n->key_file, sizeof n->key_file, "%s", cfg->key_file);
    /* this program serves its own /metrics and writes its own events and log level */
    snprintf(n->metrics, sizeof n->metrics, "off");
    snprintf(n->log_level, sizeof n->log_level, "%s", cfg->log_level);
}

/* dl_recovery_copy_fn over the library handle */
static int learner_state_copy(void *ctx, void **buf, size_t *cap, size_t *len)
{
    return dl_learner_state_copy(ctx, buf, cap, len);
}

static int run_networked(const learner_cfg *cfg, dl_trainer *tr, const dl_train_cfg *tc, const char *hello_device,
                         FILE *losslog, dl_recovery *rec)
{
    const dl_model_config *mc = dl_trainer_model_cfg(tr);
    int rc;
    timing_ctx tmg;
    if ((rc = timing_prepare(cfg, (int)cfg->model.fragments, &tmg))) {
        timing_finish(&tmg, 0);
        return fail("setting up the sync timing", rc);
    }
    /* The learner library (include/dloco/learner.h) with this GPT-2 as its manifest: its Hello and fingerprint
     * are the ones this program always sent. */
    dloco_gpt2_config g2 = {.n_layer = mc->n_layer, .n_head = mc->n_head, .n_embd = mc->n_embd,
                            .seq_len = mc->seq_len, .vocab = mc->vocab};
    int nt = dloco_learner_gpt2_manifest(&g2, NULL, 0);
    dloco_tensor *man = nt > 0 ? dl_try_calloc((size_t)nt, sizeof *man) : NULL;
    if (!man || dloco_learner_gpt2_manifest(&g2, man, nt) != nt) {
        free(man);
        timing_finish(&tmg, 0);
        return fail("describing the model", nt < 0 ? nt : DL_ENOMEM);
    }
    dloco_learner_opts lo;
    dloco_learner_opts_init(&lo);
    lo.connect = cfg->connect;
    lo.run_id = cfg->run_id;
    lo.learner_id = cfg->id;
    lo.fragments = (int32_t)cfg->model.fragments;
    lo.tensors = man;
    lo.n_tensors = nt;
    lo.max_tokens_per_step = (uint64_t)tc->batch * (uint64_t)mc->seq_len;
    lo.gpt2 = &g2;
    lo.device = hello_device;
    dl_learner_netcfg net;
    net_rows(cfg, &net);
    /* the library's own state beside the recovery file: restored at join when the trainer resumed at its step */
    if (rec) snprintf(net.state_path, sizeof net.state_path, "%s", dl_recovery_learner_path(rec));
    /* The node reaches theta through a parameter interface: the host buffer
     * directly on the cpu (the library's contiguous binding); on a GPU the
     * fragment copies of xfer_cuda.c, whose pushes complete one step later so
     * the copy overlaps the next step; with gpa, x (an adopt moves y with it). */
    dl_node_model *gpa_model = NULL;
    const dl_node_model *model = NULL;
#ifdef DLOCO_HAVE_CUDA
    dl_gptc_xfer *xfer = NULL;
#endif
    dloco_learner *lib = NULL;
    dl_plan *plan = NULL; /* the parameter interfaces' plan: the library's, built the same way */
    rc = dl_model_plan_open(mc, (int)cfg->model.fragments, &plan);
    if (rc) {
        free(man);
        timing_finish(&tmg, 0);
        return fail("building the fragment plan (option fragments)", rc);
    }
    if (dl_trainer_gpa_y(tr) &&
        (rc = dl_gpa_node_model_open(plan, dl_gpt_params(dl_trainer_model(tr)), dl_trainer_gpa_y(tr), &gpa_model)))
        rc = fail("setting up the gpa parameter interface", rc);
    model = gpa_model;
#ifdef DLOCO_HAVE_CUDA
    if (!rc && dl_trainer_device(tr) == DL_DEVICE_CUDA) {
        if ((rc = dl_gptc_xfer_open(dl_trainer_gptc(tr), plan, &xfer))) rc = fail("setting up the GPU fragment copies", rc);
        else model = dl_gptc_xfer_model(xfer);
    }
#endif
    dl_learner_ext ext = {.net = &net,
                          .model = model,
                          .due = tmg.on ? timing_due : NULL,
                          .due_ctx = &tmg,
                          .byzantine = cfg->byz_on,
                          .byzantine_scale = cfg->byz_scale,
                          .hello_batch = (uint32_t)tc->batch,
                          .start_step = dl_trainer_steps_done(tr)};
    if (!rc && (rc = dl_learner_open_ext(&lo, &ext, &lib))) rc = fail("bad configuration", rc);
    if (!rc && rec) dl_recovery_set_learner(rec, learner_state_copy, dl_learner_state_write, lib);
    free(man);
    if (!rc && !model &&
        (rc = dloco_learner_bind_contiguous(lib, dl_gpt_params(dl_trainer_model(tr)), dl_trainer_num_params(tr))))
        rc = fail("binding the parameters", rc);
    dl_lmet *lmet = NULL; /* --metrics: opened first, so a bad address stops before joining */
    if (!rc && (rc = dl_lmet_open(cfg->metrics, cfg->id, &lmet))) rc = fail("starting", rc);
    if (rc) {
        dloco_learner_close(&lib);
        dl_gpa_node_model_close(&gpa_model);
#ifdef DLOCO_HAVE_CUDA
        dl_gptc_xfer_close(&xfer);
#endif
        timing_finish(&tmg, 0);
        dl_plan_close(&plan);
        return rc;
    }
    uint64_t fp = dloco_learner_fingerprint(lib);
    int S = 1;
    for (const char *c = cfg->connect; *c; c++) S += *c == ',';
    g_learner = lib;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int64_t tok_per_step = (int64_t)tc->batch * mc->seq_len;
    printf("dloco-learner %s: GPT L=%d NH=%d C=%d T=%d V=%d, %zu parameters, B=%d, %d threads\n", cfg->id,
           mc->n_layer, mc->n_head, mc->n_embd, mc->seq_len, mc->vocab, dl_trainer_num_params(tr), tc->batch,
           omp_get_max_threads());
    char pdesc[128];
    printf("synchronizer %s, run %s, P=%d fragments (imbalance %.3f), fingerprint %016llx, adopt %s, adam_fleet %g, "
           "push %s\n",
           cfg->connect, cfg->run_id, dl_plan_P(plan), dl_plan_imbalance(plan), (unsigned long long)fp, cfg->adopt,
           cfg->adam_fleet, push_codec_desc(cfg, pdesc, sizeof pdesc));
    fflush(stdout);
    char ev_dev[200], ev_ep[DL_CFG_STRLEN + 8];
    dl_event("learner_start",
             "id=%s mode=networked device=%s params=%zu fragments=%d fingerprint=%016llx endpoint=%s shards=%d "
             "push_codec=%s push_block=%u push_topk=%u push_rounding=%s error_feedback=%d", cfg->id,
             dl_event_str(hello_device, ev_dev, sizeof ev_dev), dl_trainer_num_params(tr), dl_plan_P(plan),
             (unsigned long long)fp, dl_event_str(cfg->connect, ev_ep, sizeof ev_ep), S, dl_codec_name(cfg->pcodec.id),
             cfg->pcodec.block, cfg->pcodec.topk, cfg->push_rounding,
             cfg->error_feedback && cfg->pcodec.id != DL_CODEC_FP32);
    if (cfg->byz_on) {
        char ev_mode[DL_CFG_STRLEN + 8];
        DL_WARN("BYZANTINE MODE '%s': every delta this learner pushes is corrupted on purpose (multiplied by %g); "
                "for robustness benchmarks only, never in a real run", cfg->byzantine, cfg->byz_scale);
        dl_event("byzantine", "id=%s mode=%s scale=%.17g", cfg->id,
                 dl_event_str(cfg->byzantine, ev_mode, sizeof ev_mode), cfg->byz_scale);
    }
    if (cfg->curve_server[0]) printf("CURVE: encrypted and authenticated connection to the synchronizer\n");

    int exit_code = 0;
    double t_run = dl_clock_s();
    rc = dloco_learner_join(lib, (int)cfg->connect_timeout_ms);
    /* the library's node, mailbox and sessions (learner/learner_int.h), for what this program reports */
    dl_node *node = dl_learner_node(lib);
    dl_mailbox *mb = dl_learner_mailbox(lib);
    dl_comms **comms = NULL;
    dl_learner_sessions(lib, &comms);
    int64_t step = dl_trainer_steps_done(tr); /* a resumed trainer goes on from its step */
    double last_train = NAN;
    int flush_left = 0;
    if (rc == DLOCO_EREFUSED) {
        fprintf(stderr, "dloco-learner: %s\n", dloco_learner_errmsg(lib));
        exit_code = 3;
    } else if (rc == DLOCO_ESTOPPED) {
        printf("stopped by signal before training\n"); /* the library said Bye */
    } else if (rc) {
        fprintf(stderr, "dloco-learner: joining the synchronizer at %s: %s: %s\n", cfg->connect,
                dloco_learner_strerror(rc), dloco_learner_errmsg(lib));
        exit_code = 2;
    } else {
        printf("joined: holding all %d fragments of the global model, H=%u\n", dl_plan_P(plan), dl_mailbox_h(mb));
        if (tmg.on && (rc = timing_start(&tmg, dl_plan_P(plan), dl_mailbox_h(mb) > 0 ? (int)dl_mailbox_h(mb) : 1))) {
            fail("starting the sync timing", rc);
            exit_code = 2;
        }
        {
            dl_node_stats ns;
            dl_node_get_stats(node, &ns);
            dl_event("ready", "id=%s fragments=%d fetched=%llu h=%u wait_s=%.3f", cfg->id, dl_plan_P(plan),
                     (unsigned long long)ns.adopted, dl_mailbox_h(mb), dl_clock_s() - t_run);
        }
        fflush(stdout);
        double t_win = dl_clock_s(), train_sum = 0.0, sps = 0.0;
        /* the step rate heartbeats report (the synchronizer predicts each
         * push from it: synchronizer/policy.h): an EWMA of the step time,
         * updated every step, so the first pushes are predicted too */
        double step_ewma = 0.0;
        int64_t win_steps = 0;
        /* --dynamic_h (gpt/dynh.h; checked by check_hetero) */
        dl_dynh dynh;
        dl_dynh_init(&dynh, !strcmp(cfg->dynamic_h, "speed") ? DL_DYNH_SPEED : DL_DYNH_OFF, (int)cfg->dynamic_h_min,
                     (int)cfg->dynamic_h_max);
        while (!exit_code && step < cfg->steps && !stop_requested) {
            float norm = 0.0f;
            double t_step = dl_clock_s(), loss = NAN;
            rc = dl_trainer_step(tr, &loss, &norm);
            step = dl_trainer_steps_done(tr);
            if (rc && rc != DL_ERANGE) {
                fail("training step", rc);
                exit_code = 2;
                break;
            }
            if (cfg->throttle < 1.0) {
                /* a straggler on purpose: stretch each step to 1/throttle of its time */
                double extra = (dl_clock_s() - t_step) * (1.0 / cfg->throttle - 1.0);
                struct timespec ts = {.tv_sec = (time_t)extra, .tv_nsec = (long)((extra - (double)(time_t)extra) * 1e9)};
                while (nanosleep(&ts, &ts) != 0 && !stop_requested) {}
            }
            if (rc == DL_ERANGE || !isfinite(loss)) {
                fprintf(stderr,
                        "dloco-learner: training loss became %f (gradient norm %f) at step %lld; stopping (lower --lr?)\n",
                        loss, norm, (long long)step);
                exit_code = 3;
                break;
            }
            if (losslog) fprintf(losslog, "%lld %a\n", (long long)step, loss);
            dl_lmet_step(lmet, dl_clock_s() - t_step, loss, (uint64_t)step, (uint64_t)(step * tok_per_step));
            if (dl_lmet_due(lmet)) {
                dl_comms_stats mcs;
                dl_node_stats mns;
                sessions_stats(comms, S, &mcs);
                dl_node_get_stats(node, &mns);
                dl_lmet_publish(lmet, &mcs, &mns, sps * (double)tok_per_step);
            }
            last_train = loss;
            train_sum += loss;
            win_steps++;
            /* H comes from the (last) Welcome; a re-hello may change it. */
            int H = (int)dl_mailbox_h(mb);
            /* wall seconds behind this step (throttle included): Push.compute_s */
            double compute_s = dl_clock_s() - t_step;
            step_ewma = step_ewma > 0 ? 0.8 * step_ewma + 0.2 * compute_s : compute_s;
            /* progress first: a push of this step must never report more than the
             * learner has reported processing (the ledger's overclaim check) */
            timing_step(&tmg, step, loss);
            /* dynamic H: the schedule step and H of this push cycle (plain: the step and the Welcome's H) */
            int64_t sched = step;
            if (H < 1) H = 1;
            if (dynh.mode != DL_DYNH_OFF) {
                double fleet = 0, own = step_ewma > 0 ? 1.0 / step_ewma : 0.0;
                for (int k = 0; k < S && !(fleet > 0); k++) fleet = dl_comms_fleet_sps(comms[k]);
                int base = H, changed;
                sched = dl_dynh_step(&dynh, step, base, own, fleet, &H, &changed);
                if (changed)
                    dl_event("dynamic_h", "id=%s step=%lld h=%d base_h=%d steps_per_s=%.6g fleet_steps_per_s=%.6g",
                             cfg->id, (long long)step, H, base, own, fleet);
            }
            /* the library's step: progress first (a push of this step must never report more than the
             * learner has reported processing: the ledger's overclaim check), pushes due, adopts, and
             * under sync / sync-elastic the barrier (node.h "Barrier") */
            rc = dl_learner_step_sched(lib, sched, H, (uint64_t)tok_per_step, loss, compute_s, NULL);
            char msg[640];
            int st = dl_mailbox_state(mb, msg, sizeof msg); /* REFUSED or FAILED when any session is */
            if (rc == DLOCO_EREFUSED || st == DL_COMMS_REFUSED) {
                fprintf(stderr, "dloco-learner: %s\n", msg);
                exit_code = 3;
                break;
            }
            if (rc == DLOCO_ENET || st == DL_COMMS_FAILED) {
                fprintf(stderr, "dloco-learner: connection failed: %s\n", msg);
                exit_code = 2;
                break;
            }
            if (rc < 0) {
                fprintf(stderr, "dloco-learner: pushing or adopting fragments: %s: %s\n", dloco_learner_strerror(rc),
                        dloco_learner_errmsg(lib));
                exit_code = 2;
                break;
            }
            if (rec) dl_recovery_step(rec, tr); /* a copy when due; the writer thread writes it */
            int do_val = cfg->local_eval && ((cfg->val_every && step % cfg->val_every == 0) || step == cfg->steps);
            if (step % cfg->log_every == 0 || do_val || step == cfg->steps) {
                double dt = dl_clock_s() - t_win;
                sps = (double)win_steps / dt;
                dl_comms_stats cs;
                dl_node_stats ns;
                sessions_stats(comms, S, &cs);
                dl_node_get_stats(node, &ns);
                printf("step %6lld/%lld | train %.4f | ", (long long)step, (long long)cfg->steps,
                       train_sum / (double)win_steps);
                double lv = NAN;
                if (do_val && dl_trainer_eval(tr, &lv) == 0) printf("local val %.4f | ", lv);
                else if (do_val) printf("local val failed (%s) | ", dl_errmsg());
                printf("%7.0f tok/s | %7.1f ms/step | pushes %llu | adopted %llu | ", sps * (double)tok_per_step,
                       1e3 * dt / (double)win_steps, (unsigned long long)cs.pushes,
                       (unsigned long long)(ns.adopted - ns.rebased));
                if (cs.staleness_n) printf("staleness %.2f | ", (double)cs.staleness_sum / (double)cs.staleness_n);
                else printf("staleness  -   | ");
                /* sync lag: the most steps a fragment has trained past its adopted base;
                 * pending: pushes sent without a final decision yet (as /metrics) */
                uint64_t decided = cs.accepted + cs.dropped_stale + cs.rejected;
                printf("lag %llu steps | pending %llu | ", (unsigned long long)ns.steps_behind_max,
                       (unsigned long long)(cs.pushes > decided ? cs.pushes - decided : 0));
                printf("sent %.2f MB | recv %.2f MB\n", (double)cs.bytes_sent * 1e-6, (double)cs.bytes_recv * 1e-6);
                fflush(stdout);
                dl_event("step", "id=%s step=%lld loss=%.17g tokens=%lld pushes=%llu coalesced=%llu lr=%.9g", cfg->id,
                         (long long)step, train_sum / (double)win_steps, (long long)(step * tok_per_step),
                         (unsigned long long)cs.pushes, (unsigned long long)cs.coalesced,
                         (double)dl_trainer_lr_at(tr, step));
                t_win = dl_clock_s();
                train_sum = 0.0;
                win_steps = 0;
            }
        }
        if (stop_requested) printf("stopped by signal at step %lld\n", (long long)step);
        if (exit_code == 0 && cfg->final_flush) {
            flush_left = dloco_learner_finish(lib, (int)cfg->flush_timeout_ms, stop_requested ? "signal" : "done");
            if (flush_left < 0) {
                fprintf(stderr, "dloco-learner: final flush: %s: %s\n", dloco_learner_strerror(flush_left),
                        dloco_learner_errmsg(lib));
                exit_code = 2;
            }
        } else if (exit_code == 0) {
            /* the scheduled pushes of the last step still go (a deferred one is not posted yet) */
            if ((rc = dl_node_complete(node)) < 0) exit_code = fail("last pushes", rc);
            dl_mailbox_bye(mb, stop_requested ? "signal (no flush)" : "done (no flush)", (uint64_t)step);
        }
        else if (mb && dl_mailbox_state(mb, NULL, 0) != DL_COMMS_REFUSED)
            dl_mailbox_bye(mb, "failed", (uint64_t)step); /* diverged: push nothing more, just leave */
    }
    double wall = dl_clock_s() - t_run;
    if (rec) {
        /* a clean finish (a signal included: a preempted learner) leaves its newest state; a failure keeps the
         * last periodic one (a diverged model is not worth resuming) */
        if (exit_code == 0 && step >= cfg->steps) {
            /* every step trained: nothing to resume, and a later start under this id is a new run */
            if ((rc = dl_recovery_remove(rec))) DL_WARN("%s", dl_errmsg());
        } else if (exit_code == 0 && (rc = dl_recovery_finish(rec, tr))) {
            DL_WARN("recovery file not written at the finish: %s", dl_errmsg());
        }
        dl_recovery_stats rs;
        dl_recovery_get_stats(rec, &rs);
        uint64_t copies = rs.writes + rs.failed;
        dl_event("recovery_summary",
                 "id=%s writes=%llu skipped=%llu failed=%llu last_step=%lld copy_ms_mean=%.3f copy_ms_max=%.3f "
                 "write_ms_mean=%.3f removed=%d",
                 cfg->id, (unsigned long long)rs.writes, (unsigned long long)rs.skipped, (unsigned long long)rs.failed,
                 (long long)rs.last_step, copies ? rs.copy_s_sum * 1e3 / (double)copies : 0.0, rs.copy_s_max * 1e3,
                 rs.writes ? rs.write_s_sum * 1e3 / (double)rs.writes : 0.0, rs.removed);
        if (rs.removed) printf("recovery: every step trained; the recovery file is removed\n");
        if (rs.writes)
            printf("recovery: %llu files written, the last at step %lld; copying the state cost %.2f ms per write "
                   "(at most %.2f) on the training thread\n", (unsigned long long)rs.writes, (long long)rs.last_step,
                   copies ? rs.copy_s_sum * 1e3 / (double)copies : 0.0, rs.copy_s_max * 1e3);
    }
    if (exit_code == 0 && cfg->checkpoint[0]) {
        if ((rc = dl_trainer_save(tr, cfg->checkpoint))) exit_code = fail("saving checkpoint", rc);
        else {
            char ev_path[DL_CFG_STRLEN + 8];
            printf("checkpoint: %s (step %lld, local parameters)\n", cfg->checkpoint, (long long)step);
            dl_event("checkpoint", "id=%s path=%s step=%lld", cfg->id,
                     dl_event_str(cfg->checkpoint, ev_path, sizeof ev_path), (long long)step);
        }
    }
    for (int k = 0; comms && k < S; k++) dl_comms_stop(comms[k]); /* joins the comms threads; lets the Byes leave */
    dl_comms_stats cs;
    dl_node_stats ns;
    sessions_stats(comms, S, &cs);
    memset(&ns, 0, sizeof ns);
    if (node) dl_node_get_stats(node, &ns);
    if (lmet) {
        dl_lmet_publish(lmet, &cs, &ns, 0);
        dl_lmet_close(&lmet);
    }
    char epochs[DL_MAILBOX_MAX_SESSIONS * 21 + 1] = "";
    for (int k = 0, o = 0; k < S; k++) {
        dl_comms_stats ks = {0};
        if (comms && comms[k]) dl_comms_get_stats(comms[k], &ks);
        o += snprintf(epochs + o, sizeof epochs - (size_t)o, "%s%llu", k ? "," : "", (unsigned long long)ks.epoch);
    }
    if (node) dl_node_get_stats(node, &ns);
    uint64_t decided = cs.accepted + cs.dropped_stale + cs.rejected;
    /* acks_pending: MERGED_PENDING acks received; undecided: pushes sent
     * without a final decision (accepted, dropped_stale, rejected) at exit,
     * which includes pushes the synchronizer replaced by a newer push of the
     * same fragment in the same open round */
    char summary[1536];
    snprintf(summary, sizeof summary, "id=%s steps=%lld tokens=%lld pushes=%llu coalesced=%llu acks_pending=%llu "
           "accepted=%llu dropped_stale=%llu rejected=%llu undecided=%llu updates_adopted=%llu rebased=%llu "
           "updates_superseded=%llu updates_ignored=%llu discarded=%llu flush_unanswered=%d bytes_sent=%llu "
           "bytes_received=%llu epoch=%llu held=%llu held_due=%llu hold_released=%llu discarded_tokens=%llu wall_s=%.3f "
           "final_train_loss=%.6f updates_refused=%llu welcomes_refused=%llu socket_rebuilds=%llu busy=%llu "
           "chunks_sent=%llu chunks_recv=%llu chunks_dropped=%llu pushes_stopped=%llu shards=%d epochs=%s",
           cfg->id, (long long)step, (long long)(step * tok_per_step), (unsigned long long)cs.pushes,
           (unsigned long long)cs.coalesced, (unsigned long long)cs.acks_pending, (unsigned long long)cs.accepted,
           (unsigned long long)cs.dropped_stale, (unsigned long long)cs.rejected,
           (unsigned long long)(cs.pushes > decided ? cs.pushes - decided : 0),
           (unsigned long long)(ns.adopted - ns.rebased), (unsigned long long)ns.rebased,
           (unsigned long long)cs.superseded, (unsigned long long)ns.ignored, (unsigned long long)cs.discarded,
           flush_left, (unsigned long long)cs.bytes_sent, (unsigned long long)cs.bytes_recv,
           (unsigned long long)cs.epoch, (unsigned long long)ns.held, (unsigned long long)ns.held_due,
           (unsigned long long)ns.hold_released, (unsigned long long)ns.discarded_tokens, wall,
           last_train, (unsigned long long)(cs.updates_refused + ns.refused), (unsigned long long)cs.welcomes_refused,
           (unsigned long long)cs.rebuilds, (unsigned long long)cs.busy, (unsigned long long)cs.chunks_sent,
           (unsigned long long)cs.chunks_recv, (unsigned long long)cs.chunks_dropped,
           (unsigned long long)cs.pushes_stopped, S, epochs);
    /* fields added after exit_code go after it in the event (docs/EVENTS.md) */
    char later[320];
    snprintf(later, sizeof later,
             "barrier_waits=%llu barrier_wait_s=%.3f push_codec=%s push_bytes=%llu updates_delta=%llu "
             "updates_delta_missed=%llu",
             (unsigned long long)ns.barrier_waits, ns.barrier_wait_s, dl_codec_name(cfg->pcodec.id),
             (unsigned long long)cs.push_bytes, (unsigned long long)cs.updates_delta,
             (unsigned long long)cs.updates_delta_missed);
    timing_finish(&tmg, step);
    printf("learner-summary: %s %s\n", summary, later);
    dl_event("learner_summary", "%s exit_code=%d %s", summary, exit_code, later);
    fflush(stdout);
    g_learner = NULL;
    dloco_learner_close(&lib);
    dl_gpa_node_model_close(&gpa_model);
#ifdef DLOCO_HAVE_CUDA
    dl_gptc_xfer_close(&xfer);
#endif
    dl_plan_close(&plan);
    return exit_code;
}
