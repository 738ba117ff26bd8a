/* dloco-learner's options: the config table and --help, parsing, the checks across rows and what is
 * derived from them (the push codec, byzantine, the learner library's networked rows). */
#include "gpt/options.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/defaults.h"
#include "core/err.h"
#include "gpt/dynh.h"
#include "gpt/gpa.h"
#include "learner/comms.h"

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
     "write the recovery file at least this often (and at a clean finish); 0 = only at the finish", "s"},
    {"recovery_budget", DL_CFG_FLOAT, F(recovery_budget), 0, 0.5, "0.01", NULL, 0,
     "the share of the time the recovery file's copies and writes may take: it is written as often as that allows "
     "(measured per file), every 2 s at most, recovery_every_s at least (a kill loses the steps since the file); "
     "0 = every recovery_every_s", NULL},
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
    {"reconnect_max_ms", DL_CFG_INT, F(reconnect_max_ms), 1, 3600000, "1000", NULL, 0,
     "reconnect backoff doubles up to this (<= hello_retry_max_ms; a link back after an outage is found within "
     "about this)"},
    {"tcp_stall_ms", DL_CFG_INT, F(tcp_stall_ms), 0, 3600000, "10000", NULL, 0,
     "drop and rebuild the connection when what it sent stays unacknowledged this long, and give a connect attempt "
     "at most 2 s before the next (after an outage TCP's own retransmissions back off for many minutes; 0 = the "
     "kernel's own)"},
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
    {"step_ms_min", DL_CFG_FLOAT, F(step_ms_min), 0, 60000, "0", NULL, 0,
     "networked mode: each training step takes at least this long (sleeps after a faster one; 0 = off): a learner at a set speed "
     "whatever the machine's, for tests whose timing is a ratio of merges to a link",
     "ms"},
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
    {"restarts (the recovery file)", "state_dir recovery recovery_every_s recovery_budget recovery_every_steps"},
    {"pushes and the global model",
     "adopt alpha push_codec push_block push_topk push_rounding error_feedback final_flush flush_timeout_ms "
     "local_eval update_max_ratio max_version_jump dynamic_h dynamic_h_min dynamic_h_max"},
    {"logs and metrics", "log_level events metrics"},
    {"connection timers (rarely changed)",
     "connect_timeout_ms hello_retry_ms hello_retry_max_ms hello_unsent_ms poll_max_ms silence_min_ms "
     "silence_rebuild_ms ack_expiry_min_ms bye_linger_ms reconnect_ms reconnect_max_ms tcp_stall_ms "
     "push_decision_timeout_ms"},
    {"research: the GPA inner optimizer (docs/GPA.md)", "optimizer gpa_mu_x gpa_mu_y gpa_mu gpa_h"},
    {"research: sync timing (docs/SYNC_TIMING.md)",
     "sync_timing h_min h_max wa_w_stale wa_w_loss wa_w_rate wa_w_link wa_w_ckpt wa_rate_ref wa_w_queue wa_queue_ref "
     "wa_max_per_step wa_fc_alpha wa_fc_beta pressure pressure_poll_ms pressure_timeout_ms pressure_stale_ms "
     "timing_trace_out timing_trace_in timing_seed oracle_window"},
    {"for tests and benchmarks", "throttle step_ms_min byzantine"},
};

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

const char *dl_options_push_codec_desc(const learner_cfg *cfg, char *buf, size_t cap)
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


int dl_options_check_networked(learner_cfg *cfg)
{
    if (cfg->id[0] && !dl_comms_id_ok(cfg->id))
        return dl_err(DL_EINVAL, "option id: '%s' is not [A-Za-z0-9._-]{1,64}", cfg->id);
    if (!cfg->run_id[0]) return dl_err(DL_EINVAL, "option run_id is empty");
    DL_TRY(parse_byzantine(cfg->byzantine, &cfg->byz_on, &cfg->byz_scale));
    /* the library's own rules for the rows it gets (dl_options_net_rows), so that a config it would refuse at
     * join is refused here, before the data and the model are loaded */
    dl_learner_netcfg n;
    dl_comms_opts co = {0};
    dl_options_net_rows(cfg, &n);
    int rc = dl_learner_netcfg_resolve(&n, &co);
    cfg->pcodec = co.push_codec;
    cfg->prounding = co.push_rounding;
    memset(&co, 0, sizeof co); /* the loaded CURVE secret key: the library loads it again at join */
    if (rc) return rc;
    if (cfg->stop_after)
        return dl_err(DL_EINVAL, "--stop_after is for --standalone runs");
    if (cfg->save_model[0])
        return dl_err(DL_EINVAL, "--save_model is for --standalone runs (dloco export writes the global model)");
    if (cfg->init_from[0])
        return dl_err(DL_EINVAL, "--init_from is for --standalone runs (a networked learner starts from the "
                                 "synchronizer's global model: give the file to dloco-sync --init_from)");
    return 0;
}

int dl_options_check_hetero(const learner_cfg *cfg)
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

int dl_options_check_optimizer(const learner_cfg *cfg, double *mu_x)
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

/* --print-config: the same checks as a networked start, on a copy (the printed id stays as given) */
static int print_check(void *obj)
{
    learner_cfg v = *(const learner_cfg *)obj;
    double mu_x;
    int rc = dl_options_check_optimizer(&v, &mu_x);
    if (!rc && !v.standalone) rc = dl_options_check_networked(&v);
    return rc ? rc : dl_options_check_hetero(&v);
}

int dl_options_parse(int argc, char **argv, learner_cfg *cfg, int *exit_code)
{
    static const dl_cfg_main preamble = {"dloco-learner",
                                         "usage: dloco-learner [--standalone] [--config FILE] [--name value ...]\n"
                                         "networked by default: connects to dloco-sync at --connect; "
                                         "--standalone trains alone\n",
                                         print_check, print_options};
    return dl_cfg_main_parse(learner_table, NCFG, cfg, &preamble, argc, argv, exit_code);
}

void dl_options_net_rows(const learner_cfg *cfg, dl_learner_netcfg *n)
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
    n->tcp_stall_ms = cfg->tcp_stall_ms;
    n->push_decision_timeout_ms = cfg->push_decision_timeout_ms;
    n->update_max_ratio = cfg->update_max_ratio;
    n->max_version_jump = cfg->max_version_jump;
    snprintf(n->server_key, sizeof n->server_key, "%s", cfg->server_key);
    snprintf(n->key_file, sizeof n->key_file, "%s", cfg->key_file);
    /* this program serves its own /metrics and writes its own events and log level */
    snprintf(n->metrics, sizeof n->metrics, "off");
    snprintf(n->log_level, sizeof n->log_level, "%s", cfg->log_level);
}
