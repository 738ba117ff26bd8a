/* The learner library's internal extension points (not installed): what dloco-learner needs beyond
 * include/dloco/learner.h -- its own parameter interface, sync timing, dynamic H, byzantine tests, stats. */
#ifndef DL_LEARNER_LEARNER_INT_H
#define DL_LEARNER_LEARNER_INT_H

#include <stdint.h>

#include "core/config.h"
#include "dloco/learner.h"
#include "learner/comms.h"
#include "learner/node.h"

/* The networked option rows (dloco_learner_opts.config_path, dloco_learner_set_option). */
typedef struct {
    char adopt[DL_CFG_STRLEN];
    double alpha;
    char push_codec[DL_CFG_STRLEN], push_rounding[DL_CFG_STRLEN];
    int64_t push_block, push_topk;
    int error_feedback;
    int64_t flush_timeout_ms, connect_timeout_ms, hello_retry_ms, hello_retry_max_ms, hello_unsent_ms, poll_max_ms,
        silence_min_ms, silence_rebuild_ms, ack_expiry_min_ms, bye_linger_ms, reconnect_ms, reconnect_max_ms,
        tcp_stall_ms, push_decision_timeout_ms;
    double update_max_ratio;
    int64_t max_version_jump;
    char server_key[DL_CFG_STRLEN], key_file[DL_CFG_STRLEN];
    char metrics[DL_CFG_STRLEN], events[DL_CFG_STRLEN], log_level[DL_CFG_STRLEN];
    char state_path[DL_CFG_STRLEN]; /* the saved learner state (dloco_learner_save_state); "" = none */
} dl_learner_netcfg;

/* The rows that need more than their bounds, into session options: the push codec (push_codec, push_block,
 * push_topk, push_rounding; error_feedback), the timers (ordered: dl_comms_check_timeouts; connect_timeout_ms
 * 0 = no bound) and the CURVE keys (server_key and key_file together or not at all, loaded). Join uses it, and
 * dloco-learner checks its rows with it before anything opens. Returns 0 or a DL_E* code naming the option. */
int dl_learner_netcfg_resolve(const dl_learner_netcfg *c, dl_comms_opts *co);

/* Extras of dloco_learner_open for dloco-learner; all zero = the public behaviour. */
typedef struct {
    /* the networked rows, instead of their defaults and opts.config_path (copied by open) */
    const dl_learner_netcfg *net;
    /* steps done before this run (a resumed trainer): the step counter starts there (its tokens at 0: the
     * Heartbeat reports this process's) */
    int64_t start_step;
    /* the node's parameter interface instead of a public binding (dloco-learner's GPA and GPU fragment
     * copies, learner/node.h); borrowed; a handle with one needs no bind call */
    const dl_node_model *model;
    /* sync timing (learner/node.h dl_node_opts.due); NULL = the fixed staggered schedule */
    int (*due)(void *due_ctx, int64_t step, int p, int H);
    void *due_ctx;
    /* robustness benchmarks: pushes leave multiplied by byzantine_scale (learner/comms.h) */
    int byzantine;
    double byzantine_scale;
    /* Hello.batch (sequences per step) when it is not ceil(max_tokens_per_step / seq_len) */
    uint32_t hello_batch;
} dl_learner_ext;

int dl_learner_open_ext(const dloco_learner_opts *o, const dl_learner_ext *ext, dloco_learner **out);
/* dloco_learner_step with the schedule step and H the node is called with (dynamic H, gpt/dynh.h):
 * sched < 1 = the step count, H < 1 = the Welcome's. */
int dl_learner_step_sched(dloco_learner *l, int64_t sched, int H, uint64_t tokens, double loss, double compute_s,
                          dloco_step_info *out);
/* The sessions' counters as one learner's (dl_comms_stats_add). */
void dl_learner_comms_stats(const dloco_learner *l, dl_comms_stats *out);
dl_node *dl_learner_node(dloco_learner *l);       /* NULL before join */
dl_mailbox *dl_learner_mailbox(dloco_learner *l); /* NULL before join */
const struct dl_plan *dl_learner_plan(const dloco_learner *l);
int dl_learner_sessions(dloco_learner *l, dl_comms ***out); /* S, the sessions (NULL before join) */
const char *dl_learner_id(const dloco_learner *l);
/* The learner state of dloco_learner_save_state, copied now into *buf
 * (grown as needed; the caller frees it) for a write on another thread
 * (dl_learner_state_write): the step path's part of a save. After join. */
int dl_learner_state_copy(dloco_learner *l, void **buf, size_t *cap, size_t *len);
/* Write a copied state to `path` atomically (path.tmp, fsync, rename); any thread. */
int dl_learner_state_write(const char *path, const void *buf, size_t len);
/* The default learner id, <hostname>-<pid> (the hostname's other characters
 * as '-'): a second live process with one id is refused (duplicate_id), and
 * containers often give every learner the same pid. */
void dl_learner_default_id(char *id, size_t cap);

#endif
