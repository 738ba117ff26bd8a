/* dloco-sync: the synchronizer process. Config table -> dl_sync -> loop until
 * SIGINT/SIGTERM -> summary. */
#include "core/config.h"
#include "core/defaults.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/model.h"
#include "core/shard.h"
#include "kernels/blas_select.h"
#include "kernels/codec.h"
#include "storage/store.h"
#include "storage/tensorfile.h"
#include "synchronizer/sync.h"

#include <stddef.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char bind[DL_CFG_STRLEN], store[DL_CFG_STRLEN], run_id[DL_CFG_STRLEN];
    dl_model_opts model; /* n_layer .. vocab and fragments: DL_MODEL_CFG_ROWS */
    int64_t H, seed, shard, shards;
    char init_from[DL_CFG_STRLEN], manifest[DL_CFG_STRLEN];
    char policy[DL_CFG_STRLEN];
    int64_t quorum, grace_cap_ms, max_staleness, max_learners;
    double gamma, mad_k, grace_steps;
    char staleness[DL_CFG_STRLEN];
    double staleness_a, staleness_b;
    char merge[DL_CFG_STRLEN], aggregate[DL_CFG_STRLEN];
    double outer_lr, outer_momentum, clip_norm, trim;
    int share_scaling, broadcast, round_schedule;
    int64_t heartbeat_ms, liveness, rebase_ms, sync_every_ms, status_every_ms, max_msg_mb;
    char durability[DL_CFG_STRLEN], log_level[DL_CFG_STRLEN];
    char events[DL_CFG_STRLEN];
    char auth[DL_CFG_STRLEN], key_file[DL_CFG_STRLEN], allowlist[DL_CFG_STRLEN];
    int64_t max_new_hellos_per_s, new_hello_burst, reclaim_ms, max_outbound_mb, peer_outbound_mb, slow_reader_ms,
        outbound_ms;
    int64_t chunk_kb, push_chunk_max_kb, pool_mb;
    char update_codec[DL_CFG_STRLEN], update_rounding[DL_CFG_STRLEN];
    int64_t update_block, update_topk;
    double norm_k, norm_param_ratio, param_abs_max, max_step_rate;
    int64_t norm_window, norm_min_history, step_slack, max_batch, max_tokens_per_step;
    char norm_action[DL_CFG_STRLEN];
    char metrics[DL_CFG_STRLEN];
    int64_t eval_every_s, eval_seqs, eval_batch, eval_threads, eval_max_mb, eval_final_max_s;
    double eval_val_frac;
    char eval_data[DL_CFG_STRLEN];
} sync_cfg;

#define F(x) offsetof(sync_cfg, x)
static const dl_cfg_entry table[] = {
    {"bind", DL_CFG_STR, F(bind), 0, 0, "tcp://127.0.0.1:5555", NULL, 0, "ZeroMQ endpoint to bind"},
    {"store", DL_CFG_STR, F(store), 0, 0, "runs/sync.lmdb", NULL, 0, "LMDB store directory (created if missing)"},
    {"run_id", DL_CFG_STR, F(run_id), 0, 0, "dloco", NULL, 0, "run id; learners must use the same"},
    DL_MODEL_CFG_ROWS(sync_cfg, model, "256", "model: vocabulary (V)"),
    {"H", DL_CFG_INT, F(H), 1, 1000000, DL_DEF_STR(DL_DEF_H), NULL, 0, "inner steps between two pushes of one fragment",
     "steps"},
    {"shards", DL_CFG_INT, F(shards), 1, 4096, "1", NULL, 0,
     "synchronizer processes the fragments are split over (<= fragments): fragment p belongs to shard p % shards, "
     "each shard with its own bind and store; learners --connect to all of them, in shard order"},
    {"shard", DL_CFG_INT, F(shard), 0, 4095, "0", NULL, 0, "this process's shard, in [0, shards)"},
    {"seed", DL_CFG_INT, F(seed), 0, 9.2e18, "1337", NULL, 0, "init seed of a new run's global model"},
    {"init_from", DL_CFG_STR, F(init_from), 0, 0, "", NULL, 0,
     "a new run's global model from this file instead of the seed: a safetensors file (dloco export, or an HF "
     "model.safetensors / its directory) or an llm.c checkpoint; its model must be this run's; refused on a store "
     "that already holds a run (docs/OPERATING.md)"},
    {"manifest", DL_CFG_STR, F(manifest), 0, 0, "", NULL, 0,
     "a run of any model: its manifest (JSON: tensor names, shapes, roles; docs/OPERATING.md \"Manifest runs\") "
     "instead of the GPT-2 options; a new run needs init_from (a safetensors file of those tensors). A safetensors "
     "init_from that carries a manifest makes a manifest run by itself"},
    {"policy", DL_CFG_ENUM, F(policy), 0, 0, "decoupled", "decoupled|sync|sync-elastic", 0, "merge policy"},
    {"quorum", DL_CFG_INT, F(quorum), 1, 65536, "1", NULL, 1, "K: learners before a round may close", "learners"},
    {"grace_cap_ms", DL_CFG_INT, F(grace_cap_ms), 1, 86400000, "5000", NULL, 1, "grace window cap, ms"},
    {"gamma", DL_CFG_FLOAT, F(gamma), 1e-6, 10, "0.5", NULL, 1, "grace cap as a fraction of the push period (while no learner reports a step rate)",
     "x push period"},
    {"mad_k", DL_CFG_FLOAT, F(mad_k), 0, 100, "3", NULL, 1, "arrival prediction margin, in MADs"},
    {"grace_steps", DL_CFG_FLOAT, F(grace_steps), 1e-6, 1e6, "4", NULL, 1,
     "grace cap in inner steps: a round waits at most min(grace_cap_ms, grace_steps x the fleet's step time) after "
     "quorum for learners the push schedule predicts (gamma applies only while no learner reports a step rate)",
     "steps"},
    {"round_schedule", DL_CFG_BOOL, F(round_schedule), 0, 0, "true", NULL, 0,
     "rounds follow the push schedule (H, the learners' reported steps and rates) and shares count every live "
     "learner at its tokens per step; false: the push-interval prediction and per-fragment push tokens of a policy "
     "that does not know H (for ablations: docs/ARCHITECTURE.md \"Bandwidth\")"},
    {"broadcast", DL_CFG_BOOL, F(broadcast), 0, 0, "true", NULL, 0,
     "send every merged version to every learner; false: only to the round's contributors (for ablations)"},
    {"max_learners", DL_CFG_INT, F(max_learners), 1, 65536, "1024", NULL, 0,
     "learner slots: the registry's bound (a full table answers FULL; slots of learners gone reclaim_ms are reused)",
     "learners"},
    {"max_staleness", DL_CFG_INT, F(max_staleness), 0, 1000000000, DL_DEF_STR(DL_DEF_MAX_STALENESS), NULL, 1,
     "drop pushes staler than this", "versions"},
    {"staleness", DL_CFG_ENUM, F(staleness), 0, 0, "poly", "const|poly|hinge", 1, "staleness factor s()"},
    {"staleness_a", DL_CFG_FLOAT, F(staleness_a), 0, 1e6, "0.5", NULL, 1, "s() parameter a"},
    {"staleness_b", DL_CFG_FLOAT, F(staleness_b), 0, 1e9, "0", NULL, 1, "s() parameter b (hinge)"},
    {"merge", DL_CFG_ENUM, F(merge), 0, 0, "rda", "rda|mean", 0, "merge rule for non-embedding tensors"},
    /* the local-SGD step by default: at the default quorum 1 DiLoCo's 0.7 / 0.9 lost to it from scratch and
     * after a warm start alike (docs/ARCHITECTURE.md "Outer optimizer settings") */
    {"outer_lr", DL_CFG_FLOAT, F(outer_lr), 0, 10, "1.0", NULL, 1,
     "outer Nesterov learning rate (1.0 with momentum 0: the local-SGD step, the merged delta applied as it is; "
     "DiLoCo's 0.7 with momentum 0.9 pays after a warm start with quorum = the fleet)"},
    {"outer_momentum", DL_CFG_FLOAT, F(outer_momentum), 0, 0.999, "0", NULL, 1, "outer Nesterov momentum"},
    {"share_scaling", DL_CFG_BOOL, F(share_scaling), 0, 0, "true", NULL, 1,
     "scale a round's step by its share of a full period of its fragment: its tokens x s(staleness) over the live "
     "learners' expected tokens per period (H x tokens per step)"},
    {"clip_norm", DL_CFG_FLOAT, F(clip_norm), 0, 1e9, "0", NULL, 1, "clip each pseudo-gradient's norm (0 = off)"},
    {"aggregate", DL_CFG_ENUM, F(aggregate), 0, 0, "weighted", "weighted|trimmed_mean|median", 1,
     "how a round's deltas combine: token-weighted (rda/mean), or coordinate-wise trimmed mean / median (unweighted, "
     "robust to a minority of bad learners; docs/SECURITY.md)"},
    {"trim", DL_CFG_FLOAT, F(trim), 0, 0.49, "0.25", NULL, 1, "trimmed_mean: fraction trimmed from each side"},
    {"auth", DL_CFG_ENUM, F(auth), 0, 0, "auto", "auto|curve|off", 0,
     "who may connect: curve = only learners whose public key is in the allowlist; auto = curve unless bind is "
     "loopback and neither key_file nor allowlist is set"},
    {"key_file", DL_CFG_STR, F(key_file), 0, 0, "", NULL, 0, "CURVE: this synchronizer's key pair (dloco keygen PREFIX)"},
    {"allowlist", DL_CFG_STR, F(allowlist), 0, 0, "", NULL, 0,
     "CURVE: file of 'learner_id public_key' lines; re-read on SIGHUP (removed keys are cut off)"},
    {"max_new_hellos_per_s", DL_CFG_INT, F(max_new_hellos_per_s), 1, 100000, "20", NULL, 0,
     "Hellos from new learner ids admitted per second (token bucket)"},
    {"new_hello_burst", DL_CFG_INT, F(new_hello_burst), 1, 100000, "64", NULL, 0, "depth of that bucket"},
    {"reclaim_ms", DL_CFG_INT, F(reclaim_ms), 0, 864000000, "30000", NULL, 0,
     "a learner dead or gone this long gives its slot back to new learners"},
    {"max_outbound_mb", DL_CFG_INT, F(max_outbound_mb), 0, 1048576, "0", NULL, 0,
     "payload MiB queued for all learners at once; more waits (0 = max(256, 4 x model size))"},
    {"peer_outbound_mb", DL_CFG_INT, F(peer_outbound_mb), 0, 1048576, "0", NULL, 0,
     "payload MiB queued for one learner at most; more waits (0 = 2 x chunk_kb); pacing (outbound_ms) keeps less "
     "for a learner whose link drains less"},
    {"outbound_ms", DL_CFG_INT, F(outbound_ms), 0, 60000, "0", NULL, 0,
     "downlink pacing: Update bytes queued for a learner are at most what its connection drains in this long (its "
     "measured rate; at least one chunk), and its chunks shrink so two fit: an Ack or heartbeat waits about this "
     "long behind Updates (0 = min(500, heartbeat_ms x liveness / 4))", "ms"},
    {"chunk_kb", DL_CFG_INT, F(chunk_kb), 0, 65536, DL_DEF_STR(DL_DEF_CHUNK_KB), NULL, 0,
     "KiB per chunk of an Update, and of a learner's pushes until its uplink's rate is measured "
     "(Welcome.chunk_bytes); >= 4"},
    {"push_chunk_max_kb", DL_CFG_INT, F(push_chunk_max_kb), 0, 65536, DL_DEF_STR(DL_DEF_PUSH_CHUNK_MAX_KB), NULL, 0,
     "a learner's push chunks double (at most once per push) from chunk_kb up to this while its measured uplink carries one "
     "in 50 ms "
     "(fewer, larger messages cost the synchronizer less per byte; a thin link keeps chunk_kb); at most chunk_kb "
     "(0): fixed at chunk_kb"},
    {"update_codec", DL_CFG_ENUM, F(update_codec), 0, 0, "int4", "off|fp32|bf16|int8|int4|e3m0|topk", 0,
     "downlink: after a merge, a learner that holds the previous version gets the version-to-version delta in this "
     "codec instead of the full fp32 fragment (with error feedback; the stored global is exactly what it then "
     "holds: docs/PROTOCOL.md \"Updates\"); off = full fp32 Updates only"},
    {"update_block", DL_CFG_INT, F(update_block), 16, 65536, "128", NULL, 0,
     "downlink int8/int4/e3m0/topk: elements per block (one scale, or topk entries, each); even", "elements"},
    {"update_topk", DL_CFG_INT, F(update_topk), 1, 65536, "8", NULL, 0,
     "downlink topk: entries kept per block, in [1, update_block / 2] (6 bytes each)", "elements"},
    {"update_rounding", DL_CFG_ENUM, F(update_rounding), 0, 0, "nearest", "nearest|stochastic", 0,
     "downlink int8/int4/e3m0: round to the nearest level, or stochastically (unbiased)"},
    {"pool_mb", DL_CFG_INT, F(pool_mb), 0, 1048576, "0", NULL, 0,
     "MiB of pushes pooled or arriving; a push finding no room is refused busy, but under sync/sync-elastic one "
     "that an open round waits for may use as much again (0 = max(2 x model, 4 x largest fragment, 64 MiB), grown "
     "to live learners x model while they need it, at most a quarter of physical memory)"},
    {"slow_reader_ms", DL_CFG_INT, F(slow_reader_ms), 100, 86400000, "60000", NULL, 0,
     "a learner whose queue makes no progress this long is dropped"},
    {"norm_k", DL_CFG_FLOAT, F(norm_k), 0, 1e6, "10", NULL, 1,
     "value guard: a push whose norm exceeds norm_k x the fragment's median recent norm is refused (0 = off)"},
    {"norm_window", DL_CFG_INT, F(norm_window), 1, 1024, "32", NULL, 1,
     "value guard: most recent pushers whose latest norm is kept per fragment", "learners"},
    {"norm_min_history", DL_CFG_INT, F(norm_min_history), 1, 1024, "1", NULL, 1,
     "value guard: learners whose latest norm is known before the median rule applies", "learners"},
    {"norm_param_ratio", DL_CFG_FLOAT, F(norm_param_ratio), 0, 1e9, "10", NULL, 1,
     "value guard: a push whose norm exceeds this x the fragment's parameter norm is refused (0 = off)"},
    {"norm_action", DL_CFG_ENUM, F(norm_action), 0, 0, "reject", "reject|clip", 1,
     "value guard: refuse an oversized push, or clip it to the bound"},
    {"param_abs_max", DL_CFG_FLOAT, F(param_abs_max), 0, 1e30, "1000", NULL, 1,
     "a merge whose result has a parameter beyond this (or not finite) is not committed (0 = finite only)"},
    {"max_step_rate", DL_CFG_FLOAT, F(max_step_rate), 1e-3, 1e9, "10000", NULL, 1,
     "inner steps per second a learner can plausibly make: bounds a push's steps", "steps/s"},
    {"step_slack", DL_CFG_INT, F(step_slack), 0, 1000000000, "64", NULL, 1, "steps allowed on top of that bound",
     "steps"},
    {"max_batch", DL_CFG_INT, F(max_batch), 1, 4294967295.0, "65536", NULL, 1,
     "largest batch (sequences per step) a learner may declare: bounds a push's tokens", "sequences"},
    {"max_tokens_per_step", DL_CFG_INT, F(max_tokens_per_step), 1, 1099511627776.0, "16777216", NULL, 1,
     "manifest learners: the most tokens per step one may claim at Hello (and the bound of one that claims none): "
     "bounds a push's tokens", "tokens"},
    {"heartbeat_ms", DL_CFG_INT, F(heartbeat_ms), 10, 60000, DL_DEF_STR(DL_DEF_HEARTBEAT_MS), NULL, 0,
     "heartbeat period, ms"},
    {"liveness", DL_CFG_INT, F(liveness), 2, 100, DL_DEF_STR(DL_DEF_LIVENESS), NULL, 0,
     "missed heartbeats before a learner is dead", "heartbeats"},
    {"rebase_ms", DL_CFG_INT, F(rebase_ms), 1, 864000000, "60000", NULL, 0,
     "a learner silent longer than this must fetch (rebase) before pushing again"},
    {"durability", DL_CFG_ENUM, F(durability), 0, 0, "sync", "sync|periodic", 0,
     "sync: fsync every merge commit; periodic: fsync every sync_every_ms"},
    {"sync_every_ms", DL_CFG_INT, F(sync_every_ms), 10, 3600000, "1000", NULL, 0, "periodic durability interval"},
    {"status_every_ms", DL_CFG_INT, F(status_every_ms), 0, 3600000, "10000", NULL, 0, "status line interval (0 = off)"},
    {"max_msg_mb", DL_CFG_INT, F(max_msg_mb), 0, 65536, "0", NULL, 0,
     "largest inbound message, MiB (0 = the largest fragment + header: nothing bigger is a valid message)"},
    {"log_level", DL_CFG_ENUM, F(log_level), 0, 0, "info", "debug|info|warn|error", 0, "log verbosity"},
    {"events", DL_CFG_STR, F(events), 0, 0, "", NULL, 0,
     "append machine-readable events (logfmt, docs/EVENTS.md) to this file; empty = off"},
    {"metrics", DL_CFG_STR, F(metrics), 0, 0, "auto", NULL, 0,
     "HTTP /metrics (Prometheus) and /status.json on HOST:PORT; auto = " DL_SYNC_METRICS_DEFAULT
     ", or an ephemeral loopback port when that is busy; off = none (docs/OPERATING.md)"},
    {"eval_every_s", DL_CFG_INT, F(eval_every_s), 0, 86400, "60", NULL, 0,
     "evaluate the global model's validation loss every this many seconds in a background thread (event eval, "
     "metric, status); 0 = off; off with shards > 1"},
    {"eval_final_max_s", DL_CFG_INT, F(eval_final_max_s), 0, 86400, "60", NULL, 0,
     "at a clean stop (SIGTERM, SIGINT), evaluate the final global model for the store's record, for at most this "
     "long (a second signal stops it too); 0 = no final evaluation; needs eval_every_s > 0"},
    {"eval_seqs", DL_CFG_INT, F(eval_seqs), 1, 1000000, "256", NULL, 0,
     "validation sequences per evaluation (rounded up to eval_batch; 256 = dloco eval's default 16 x 16)"},
    {"eval_batch", DL_CFG_INT, F(eval_batch), 1, 4096, "8", NULL, 0,
     "sequences per forward pass of the evaluation (memory: activations of eval_batch x seq_len)"},
    {"eval_threads", DL_CFG_INT, F(eval_threads), 1, 1024, "1", NULL, 0, "OpenMP threads of the evaluation thread"},
    {"eval_max_mb", DL_CFG_INT, F(eval_max_mb), 1, 16777216, "4096", NULL, 0,
     "memory the evaluation may hold (a model copy with its training buffers + activations of eval_batch x "
     "seq_len); more and the evaluation is off, with a warning naming both figures (lower eval_batch)"},
    {"eval_data", DL_CFG_STR, F(eval_data), 0, 0, "/usr/share/games/fortunes", NULL, 0,
     "the data the learners train on (as dloco eval --data), recorded in the store (dloco eval's default); "
     "unreadable = evaluation off, with a warning; left at this default, a warning says the losses may not be of "
     "the learners' data"},
    {"eval_val_frac", DL_CFG_FLOAT, F(eval_val_frac), 0.0, 0.5, "0.05", NULL, 0,
     "the validation fraction the learners use (as dloco eval --val_frac)"},
};
#undef F
#define NCFG (sizeof table / sizeof table[0])

/* --help's headings: the options a first cluster needs, then the rest by topic. */
static const dl_cfg_section sections[] = {
    {"common options", "bind store run_id H auth key_file allowlist eval_data metrics log_level"},
    {"model (the same on every learner)", "n_layer n_head n_embd seq_len vocab fragments seed init_from"},
    {"merge policy",
     "policy quorum grace_cap_ms gamma mad_k grace_steps round_schedule broadcast max_learners max_staleness "
     "staleness staleness_a staleness_b merge outer_lr outer_momentum share_scaling"},
    {"guards against bad pushes",
     "clip_norm aggregate trim norm_k norm_window norm_min_history norm_param_ratio norm_action param_abs_max "
     "max_step_rate step_slack max_batch max_new_hellos_per_s new_hello_burst"},
    {"sharding", "shards shard"},
    {"transfers and memory",
     "update_codec update_block update_topk update_rounding chunk_kb push_chunk_max_kb pool_mb max_outbound_mb "
     "peer_outbound_mb outbound_ms slow_reader_ms reclaim_ms max_msg_mb"},
    {"liveness and durability", "heartbeat_ms liveness rebase_ms durability sync_every_ms status_every_ms"},
    {"evaluation of the global model",
     "eval_every_s eval_final_max_s eval_seqs eval_batch eval_threads eval_max_mb eval_val_frac"},
    {"logs", "events"},
};

static int fail(const char *what, int rc)
{
    fprintf(stderr, "dloco-sync: %s: %s%s%s\n", what, dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 2;
}

/* The reloadable part of a parsed config. */
static int tunables_of(const sync_cfg *c, dl_sync_tunables *t)
{
    dl_policy_cfg_default(&t->policy);
    DL_TRY(dl_policy_kind_parse(c->policy, &t->policy.kind));
    DL_TRY(dl_policy_sfn_parse(c->staleness, &t->policy.sfn));
    t->policy.quorum = (int)c->quorum;
    t->policy.max_learners = (int)c->max_learners;
    t->policy.grace_cap_ns = c->grace_cap_ms * 1000000LL;
    t->policy.gamma = c->gamma;
    t->policy.mad_k = c->mad_k;
    t->policy.tau_steps = c->grace_steps;
    /* restart-only: a reload's candidate keeps the running H */
    t->policy.H = c->round_schedule ? (int)c->H : 0;
    t->policy.max_staleness = c->max_staleness;
    t->policy.sfn_a = c->staleness_a;
    t->policy.sfn_b = c->staleness_b;
    char why[256];
    DL_TRY(dl_policy_cfg_check(&t->policy, why, sizeof why));
    DL_TRY(dl_merge_rule_parse(c->merge, &t->merge.rule));
    t->merge.outer_lr = (float)c->outer_lr;
    t->merge.outer_momentum = (float)c->outer_momentum;
    t->merge.clip_norm = c->clip_norm;
    t->merge.share_scaling = c->share_scaling;
    DL_TRY(dl_merge_aggregate_parse(c->aggregate, &t->merge.aggregate));
    t->merge.trim = c->trim;
    DL_TRY(dl_merge_opts_check(&t->merge));
    t->guard = dl_guard_cfg_default();
    t->guard.norm_k = c->norm_k;
    t->guard.norm_window = (int)c->norm_window;
    t->guard.norm_min_history = (int)c->norm_min_history;
    t->guard.norm_param_ratio = c->norm_param_ratio;
    DL_TRY(dl_guard_action_parse(c->norm_action, &t->guard.norm_action));
    t->guard.param_abs_max = c->param_abs_max;
    t->guard.max_step_rate = c->max_step_rate;
    t->guard.step_slack = (uint64_t)c->step_slack;
    t->guard.max_batch = (uint32_t)c->max_batch;
    t->guard.max_tokens_per_step = (uint64_t)c->max_tokens_per_step;
    DL_TRY(dl_guard_cfg_check(&t->guard));
    return 0;
}

/* The downlink codec rows: off, or a codec whose block and topk are valid
 * (they count only where the codec has them, but are checked whatever the
 * codec, so a config is refused or taken the same way for every codec). */
static int update_codec_of(const sync_cfg *c, dl_codec_enc *out)
{
    memset(out, 0, sizeof *out);
    if (c->update_block % 2)
        return dl_err(DL_EINVAL, "option update_block: %lld is odd (a block holds pairs of 4-bit values)",
                      (long long)c->update_block);
    /* 6 bytes per topk entry: above half a block a delta would be larger than
     * the fp32 fragment, and a learner takes frames up to that size only */
    if (2 * c->update_topk > c->update_block)
        return dl_err(DL_EINVAL, "option update_topk: %lld is more than half of update_block %lld",
                      (long long)c->update_topk, (long long)c->update_block);
    if (!strcmp(c->update_codec, "off")) return 0;
    dl_codec_id id;
    DL_TRY(dl_codec_parse(c->update_codec, &id));
    DL_TRY(dl_codec_rounding_parse(c->update_rounding, &out->rounding));
    out->c.id = id;
    out->c.block = dl_codec_is_block(id) ? (uint32_t)c->update_block : 0;
    out->c.topk = id == DL_CODEC_TOPK ? (uint32_t)c->update_topk : 0;
    char why[160];
    if (dl_codec_check(&out->c, why, sizeof why))
        return dl_err(DL_EINVAL, "options update_codec %s, update_block %lld, update_topk %lld: %s", c->update_codec,
                      (long long)c->update_block, (long long)c->update_topk, why);
    return 0;
}

/* Failure detection must be ordered: a heartbeat period is shorter than the
 * eviction timeout (liveness periods), which is shorter than the grace
 * window's cap (so a dead learner is evicted before a round gives up waiting
 * for it), which is shorter than the rebase timeout. */
static int check_timeouts(const sync_cfg *c)
{
    int64_t hb = c->heartbeat_ms, evict = c->heartbeat_ms * c->liveness;
    if (!(hb < evict && evict < c->grace_cap_ms && c->grace_cap_ms < c->rebase_ms))
        return dl_err(DL_EINVAL,
                      "timeouts must be ordered heartbeat_ms < eviction (heartbeat_ms x liveness) < grace_cap_ms < "
                      "rebase_ms, got %lld < %lld < %lld < %lld",
                      (long long)hb, (long long)evict, (long long)c->grace_cap_ms, (long long)c->rebase_ms);
    return 0;
}

/* SIGHUP. The candidate is the running config with every reloadable option
 * taken from a fresh parse of the start's command line (defaults, then the
 * --config file as it is now, then the start's flags, which still win);
 * restart-only options keep their running values, and a file that changes
 * one is reported as ignored, once per value (again only if the file's value
 * changes, or after it went back and came again). The candidate is validated whole (bounds,
 * timeout order, policy, merge and guard rules) before anything applies, and
 * `running` becomes the candidate only once dl_sync applied it. */
static int saved_argc;
static char **saved_argv;
static sync_cfg running, candidate, fresh;
static unsigned char what[NCFG];
static char reported[NCFG][DL_CFG_STRLEN + 32]; /* the ignored value last reported, if said[i] */
static unsigned char said[NCFG];

static int reload(void *ctx, const dl_sync_tunables *cur, dl_sync_tunables *out, int *ignored)
{
    (void)ctx;
    (void)cur; /* the same values as running's reloadable options */
    int rc = dl_cfg_parse_args(table, NCFG, &fresh, saved_argc, saved_argv);
    if (rc > 0) rc = dl_err(DL_EINVAL, "unexpected --help or --print-config");
    if (rc) return rc;
    candidate = running;
    dl_cfg_reload_plan(table, NCFG, &running, &fresh, &candidate, what);
    DL_TRY(check_timeouts(&candidate));
    DL_TRY(tunables_of(&candidate, out));
    *ignored = 0;
    for (size_t i = 0; i < NCFG; i++) *ignored += what[i] == DL_CFG_IGNORE;
    return 0;
}

static void reload_done(void *ctx, int applied)
{
    (void)ctx;
    if (!applied) return;
    for (size_t i = 0; i < NCFG; i++) {
        if (what[i] != DL_CFG_IGNORE) {
            said[i] = 0;
            continue;
        }
        char a[DL_CFG_STRLEN + 32], b[DL_CFG_STRLEN + 32], ea[DL_CFG_STRLEN + 40], eb[DL_CFG_STRLEN + 40];
        dl_cfg_format(&table[i], &running, a, sizeof a);
        dl_cfg_format(&table[i], &fresh, b, sizeof b);
        if (said[i] && !strcmp(reported[i], b)) continue; /* said at an earlier reload */
        snprintf(reported[i], sizeof reported[i], "%s", b);
        said[i] = 1;
        DL_WARN("reload: %s = %s in the file, but it needs a restart: the run keeps %s", table[i].name, b, a);
        dl_event("reload_ignored", "key=%s from=%s to=%s", table[i].name, dl_event_str(a, ea, sizeof ea),
                 dl_event_str(b, eb, sizeof eb));
    }
    running = candidate;
}

/* The run's manifest: from --manifest, else from a safetensors init_from
 * that carries one; NULL (a GPT-2 run) otherwise. A GPT-2 manifest is
 * refused: such a run is started with the GPT-2 options, whose runs keep
 * what they always were. */
static int manifest_of(const sync_cfg *c, dl_manifest **out)
{
    *out = NULL;
    int rc;
    if (c->manifest[0]) {
        DL_TRY(dl_manifest_load(c->manifest, out));
    } else if (c->init_from[0]) {
        rc = dl_tensorfile_manifest(c->init_from, out);
        /* EINVAL: a safetensors file whose manifest is bad; anything else
         * (no manifest, an llm.c file, an HF directory) is a GPT-2 init file
         * for storage/modelfile.c to read or refuse */
        if (rc == DL_EINVAL) return rc;
        if (rc) return 0;
    } else {
        return 0;
    }
    dl_model_config g;
    if (dl_manifest_gpt(*out, &g)) {
        rc = dl_err(DL_EINVAL,
                    "the manifest is dloco's GPT-2 (n_layer %d n_head %d n_embd %d seq_len %d vocab %d): start that "
                    "run with those options instead of a manifest",
                    g.n_layer, g.n_head, g.n_embd, g.seq_len, g.vocab);
        dl_manifest_close(out);
        return rc;
    }
    return 0;
}

/* --help: the common options first, the rest under headings (sections) */
static void print_options(FILE *f) { dl_cfg_usage_sections(table, NCFG, sections, sizeof sections / sizeof sections[0], f); }

/* What a start refuses beyond each option's own bounds (also before --print-config). */
static int check_cfg(void *obj)
{
    const sync_cfg *c = obj;
    if (strlen(c->run_id) < 1 || strlen(c->run_id) > 64)
        return dl_err(DL_EINVAL, "option run_id: must be 1..64 characters");
    DL_TRY(check_timeouts(c));
    dl_codec_enc update;
    return update_codec_of(c, &update);
}

/* glibc's allocator gives large freed memory back to the kernel (a block
 * above the mmap threshold, a free heap top above the trim threshold, a
 * thread arena's whole heap once it is free), so the next allocation of that
 * size page-faults and zeroes it all again. LMDB allocates every commit's
 * overflow pages (a fragment's blocks, ~1 MiB each) with malloc and frees them
 * after the commit, and the merge worker's Update payloads come and go the
 * same way: at GPT-2 size up to a third of the synchronizer's CPU went to
 * zeroing those pages (bench/sync_load.sh, perf). Fixed thresholds and a top
 * pad of a thread heap's size (glibc deletes a free heap only when it exceeds
 * the pad) keep freed memory in the process for the next commit; what it holds
 * stays within its peak, which the pool and outbound bounds already set. */
static void keep_freed_memory(void)
{
#if defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD) && defined(M_TOP_PAD)
    (void)mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's largest; larger blocks are the pool's, kept as spares */
    (void)mallopt(M_TRIM_THRESHOLD, INT_MAX);
    (void)mallopt(M_TOP_PAD, 64 << 20);
#endif
}

int main(int argc, char **argv)
{
    keep_freed_memory();
    if (dl_blas_select(&argc, argv)) return 2; /* the evaluation's matmuls: OpenBLAS's kernels (kernels/blas_select.h) */
    sync_cfg c;
    static const dl_cfg_main preamble = {"dloco-sync",
                                         "usage: dloco-sync [--config FILE] [--name value ...]\n"
                                         "SIGHUP re-reads --config FILE and applies the options marked reloadable "
                                         "(docs/OPERATING.md);\nSIGINT/SIGTERM stop.\n",
                                         check_cfg, print_options};
    int rc;
    if (dl_cfg_main_parse(table, NCFG, &c, &preamble, argc, argv, &rc)) return rc;
    if ((rc = check_cfg(&c))) return fail("bad configuration", rc);
    dl_codec_enc update;
    if ((rc = update_codec_of(&c, &update))) return fail("bad configuration", rc);
    dl_log_set_level(dl_log_level_parse(c.log_level));
    dl_log_set_name("sync");
    if ((rc = dl_event_open(c.events, "sync"))) return fail("opening the events file (option events)", rc);

    dl_sync_cfg sc;
    memset(&sc, 0, sizeof sc);
    snprintf(sc.bind, sizeof sc.bind, "%s", c.bind);
    snprintf(sc.store, sizeof sc.store, "%s", c.store);
    snprintf(sc.run_id, sizeof sc.run_id, "%.64s", c.run_id);
    if ((rc = dl_model_config_from(&c.model, &sc.model))) return fail("model config", rc);
    sc.P = (int)c.model.fragments;
    sc.H = (int)c.H;
    sc.unicast = !c.broadcast;
    sc.shard = (int)c.shard;
    sc.shards = (int)c.shards;
    if ((rc = dl_shard_check(sc.P, sc.shard, sc.shards))) return fail("bad configuration (options shard, shards)", rc);
    sc.seed = (uint64_t)c.seed;
    if (strlen(c.init_from) >= sizeof sc.init_from)
        return fail("bad configuration", dl_err(DL_EINVAL, "init_from: path longer than %zu bytes", sizeof sc.init_from - 1));
    snprintf(sc.init_from, sizeof sc.init_from, "%s", c.init_from);
    dl_manifest *man = NULL;
    if ((rc = manifest_of(&c, &man))) return fail("bad configuration (options manifest, init_from)", rc);
    sc.manifest = man;
    dl_sync_tunables t;
    if ((rc = tunables_of(&c, &t))) return fail("bad configuration", rc);
    sc.policy = t.policy;
    sc.merge = t.merge;
    sc.heartbeat_ms = (int)c.heartbeat_ms;
    sc.liveness = (int)c.liveness;
    sc.rebase_ms = (int)c.rebase_ms;
    sc.durability = !strcmp(c.durability, "sync") ? DL_STORE_SYNC : DL_STORE_PERIODIC;
    sc.sync_every_ms = (int)c.sync_every_ms;
    sc.status_every_ms = (int)c.status_every_ms;
    sc.max_msg_bytes = (uint64_t)c.max_msg_mb << 20;
    sc.guard = t.guard;
    sc.auth = !strcmp(c.auth, "curve") ? DL_SYNC_AUTH_CURVE : !strcmp(c.auth, "off") ? DL_SYNC_AUTH_OFF : DL_SYNC_AUTH_AUTO;
    snprintf(sc.key_file, sizeof sc.key_file, "%s", c.key_file);
    snprintf(sc.allowlist, sizeof sc.allowlist, "%s", c.allowlist);
    sc.max_new_hellos_per_s = (int)c.max_new_hellos_per_s;
    sc.new_hello_burst = (int)c.new_hello_burst;
    sc.reclaim_ms = (int)c.reclaim_ms;
    sc.max_outbound_bytes = (uint64_t)c.max_outbound_mb << 20;
    sc.peer_outbound_bytes = (uint64_t)c.peer_outbound_mb << 20;
    sc.chunk_bytes = (uint64_t)c.chunk_kb << 10;
    sc.push_chunk_max = (uint64_t)c.push_chunk_max_kb << 10;
    sc.pool_bytes = (uint64_t)c.pool_mb << 20;
    sc.update = update;
    sc.update.seed = (uint64_t)c.seed;
    sc.slow_reader_ms = (int)c.slow_reader_ms;
    sc.outbound_ms = (int)c.outbound_ms;
    snprintf(sc.metrics, sizeof sc.metrics, "%s", c.metrics);
    sc.eval_every_s = (int)c.eval_every_s;
    sc.eval_seqs = (int)c.eval_seqs;
    sc.eval_final_max_s = (int)c.eval_final_max_s;
    sc.eval_batch = (int)c.eval_batch;
    sc.eval_threads = (int)c.eval_threads;
    sc.eval_max_bytes = c.eval_max_mb << 20;
    sc.eval_val_frac = c.eval_val_frac;
    /* recorded in the store for dloco eval, which may run from another directory: absolute */
    char abs_data[PATH_MAX];
    snprintf(sc.eval_data, sizeof sc.eval_data, "%s",
             realpath(c.eval_data, abs_data) && strlen(abs_data) < sizeof sc.eval_data ? abs_data : c.eval_data);
    sc.eval_data_default = !strcmp(c.eval_data, dl_cfg_find(table, NCFG, "eval_data")->def);
    /* the whole effective config, however long, as the store's audit record */
    char *config_text = NULL;
    size_t config_len = 0;
    FILE *m = open_memstream(&config_text, &config_len);
    if (m) {
        dl_cfg_print(table, NCFG, &c, m);
        fclose(m);
    }
    sc.config_text = config_text;
    dl_sync *s = NULL;
    if ((rc = dl_sync_open(&sc, &s))) {
        free(config_text);
        dl_manifest_close(&man);
        return fail("cannot start", rc);
    }
    saved_argc = argc;
    saved_argv = argv;
    running = c;
    dl_sync_set_reload(s, reload, reload_done, NULL);
    printf("dloco-sync: listening on %s\n", dl_sync_endpoint(s));
    fflush(stdout);
    dl_sync_run(s);
    dl_sync_final_eval(s);
    dl_sync_summary(s, stdout);
    dl_sync_close(&s);
    dl_manifest_close(&man);
    free(config_text);
    return 0;
}
