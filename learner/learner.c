/* The public learner API (include/dloco/learner.h) over the mailbox, the comms sessions and the node:
 * manifest checks, the options table, parameter bindings, join, the per-step call, finish and stats. */
#include "dloco/learner.h"
#include "learner/learner_int.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/config.h"
#include "core/defaults.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/shard.h"
#include "kernels/codec.h"
#include "kernels/cpu.h"
#include "learner/comms.h"
#include "learner/metrics.h"
#include "learner/node.h"
#include "proto/auth.h"

/* The public codes are the internal ones where both exist (core/err.h). */
_Static_assert((int)DLOCO_EINVAL == (int)DL_EINVAL && (int)DLOCO_ENOMEM == (int)DL_ENOMEM &&
                   (int)DLOCO_EIO == (int)DL_EIO && (int)DLOCO_EFORMAT == (int)DL_EFORMAT &&
                   (int)DLOCO_ERANGE == (int)DL_ERANGE && (int)DLOCO_EMISMATCH == (int)DL_EMISMATCH &&
                   (int)DLOCO_ENET == (int)DL_ENET && (int)DLOCO_EREFUSED == (int)DL_EPROTO &&
                   (int)DLOCO_ETIMEDOUT == (int)DL_ETIMEDOUT && (int)DLOCO_EPERM == (int)DL_EPERM &&
                   (int)DLOCO_ESTATE < (int)DL_EPERM && (int)DLOCO_ECALLBACK > (int)DL_EBUSY,
               "public error codes drifted from core/err.h");
_Static_assert((int)DLOCO_ROLE_MATRIX == (int)DL_TENSOR_MATRIX && (int)DLOCO_ROLE_VECTOR == (int)DL_TENSOR_VECTOR &&
                   (int)DLOCO_ROLE_EMBEDDING == (int)DL_TENSOR_EMBED,
               "roles drifted from core/tensor.h");
_Static_assert(DLOCO_TENSOR_NAME_MAX + 1 == DL_TENSOR_NAME_MAX && DLOCO_TENSOR_MAX_DIMS == DL_TENSOR_NDIM_MAX,
               "tensor bounds drifted from core/tensor.h");

/* ---- the networked options (the rows dloco-learner has, same names, bounds and defaults except metrics) */

#define F(x) offsetof(dl_learner_netcfg, x)
static const dl_cfg_entry net_table[] = {
    {"adopt", DL_CFG_ENUM, F(adopt), 0, 0, DL_DEF_ADOPT, "overwrite|mix|keep", 0,
     "how a new global fragment is adopted: keep the progress since the push, overwrite, or mix"},
    {"alpha", DL_CFG_FLOAT, F(alpha), 0.0, 1.0, "0.5", NULL, 0, "adopt=mix: weight of the local parameters"},
    {"push_codec", DL_CFG_ENUM, F(push_codec), 0, 0, "fp32", "fp32|bf16|int8|int4|e3m0|topk", 0,
     "encoding of pushed pseudo-gradients"},
    {"push_block", DL_CFG_INT, F(push_block), 16, 65536, "128", NULL, 0, "elements per block (even)", "elements"},
    {"push_topk", DL_CFG_INT, F(push_topk), 1, 65536, "8", NULL, 0, "push_codec=topk: entries kept per block",
     "entries"},
    {"push_rounding", DL_CFG_ENUM, F(push_rounding), 0, 0, "nearest", "nearest|stochastic", 0,
     "int8, int4, e3m0 pushes: rounding"},
    {"error_feedback", DL_CFG_BOOL, F(error_feedback), 0, 0, "true", NULL, 0,
     "carry what an encoded push left out into the fragment's next push"},
    {"flush_timeout_ms", DL_CFG_INT, F(flush_timeout_ms), 0, 3600000, "10000", NULL, 0,
     "finish waits this long for the answers to the final flush"},
    {"connect_timeout_ms", DL_CFG_INT, F(connect_timeout_ms), 0, 86400000, "30000", NULL, 0,
     "give up when Welcome and the initial fetch take longer than this (0 = never: keep trying, a warning every 10 s)"},
    {"hello_retry_ms", DL_CFG_INT, F(hello_retry_ms), 1, 3600000, "1000", NULL, 0, "first Hello retry"},
    {"hello_retry_max_ms", DL_CFG_INT, F(hello_retry_max_ms), 1, 3600000, "16000", NULL, 0, "Hello retry cap"},
    {"hello_unsent_ms", DL_CFG_INT, F(hello_unsent_ms), 1, 60000, "20", NULL, 0, "retry of an unsent Hello"},
    {"poll_max_ms", DL_CFG_INT, F(poll_max_ms), 1, 60000, "100", NULL, 0, "timer check period"},
    {"silence_min_ms", DL_CFG_INT, F(silence_min_ms), 1, 3600000, "1000", NULL, 0, "re-hello after this silence"},
    {"silence_rebuild_ms", DL_CFG_INT, F(silence_rebuild_ms), 1, 86400000, "30000", NULL, 0,
     "rebuild the connection after this silence"},
    {"ack_expiry_min_ms", DL_CFG_INT, F(ack_expiry_min_ms), 1, 3600000, "5000", NULL, 0,
     "an unacknowledged push stops blocking its fragment after this"},
    {"bye_linger_ms", DL_CFG_INT, F(bye_linger_ms), 1, 60000, "1000", NULL, 0, "how long a Bye may take to leave"},
    {"reconnect_ms", DL_CFG_INT, F(reconnect_ms), 1, 3600000, "100", NULL, 0, "first reconnect attempt"},
    {"reconnect_max_ms", DL_CFG_INT, F(reconnect_max_ms), 1, 3600000, "1000", NULL, 0, "reconnect backoff cap"},
    {"tcp_stall_ms", DL_CFG_INT, F(tcp_stall_ms), 0, 3600000, "10000", NULL, 0,
     "drop and rebuild a connection whose sent bytes stay unacknowledged this long (0 = the kernel's own)"},
    {"push_decision_timeout_ms", DL_CFG_INT, F(push_decision_timeout_ms), 1, 86400000, "30000", NULL, 0,
     "a due push waits for the previous push's decision at most this long"},
    {"update_max_ratio", DL_CFG_FLOAT, F(update_max_ratio), 0.0, 1e12, "10", NULL, 0,
     "refuse a global fragment farther than this from the learner's own copy (0 = no bound)"},
    {"max_version_jump", DL_CFG_INT, F(max_version_jump), 1, 9.2e18, "1000000", NULL, 0,
     "refuse an update more than this many versions above the newest known", "versions"},
    {"server_key", DL_CFG_STR, F(server_key), 0, 0, "", NULL, 0,
     "CURVE: the synchronizer's public key (Z85 or a .pub file); with key_file"},
    {"key_file", DL_CFG_STR, F(key_file), 0, 0, "", NULL, 0, "CURVE: this learner's key pair file; with server_key"},
    {"metrics", DL_CFG_STR, F(metrics), 0, 0, "off", NULL, 0,
     "HTTP /metrics on HOST:PORT (port 0 = ephemeral); auto = 127.0.0.1:0; off = none"},
    {"events", DL_CFG_STR, F(events), 0, 0, "", NULL, 0, "append machine-readable events to this file; empty = off"},
    {"log_level", DL_CFG_ENUM, F(log_level), 0, 0, "info", "debug|info|warn|error", 0, "log verbosity"},
    {"state_path", DL_CFG_STR, F(state_path), 0, 0, "", NULL, 0,
     "the learner's state across restarts (dloco_learner_save_state writes it, join restores it when its step is "
     "start_step; a push journal at PATH.journal beside it); empty = none"},
};
#undef F
#define NNET (sizeof net_table / sizeof net_table[0])

/* ---- the handle */

enum { BIND_NONE = 0, BIND_HOST = 1, BIND_CALLBACKS = 2 };

struct dloco_learner {
    dl_learner_netcfg cfg;
    dl_learner_ext ext;
    char connect[DL_CFG_STRLEN], run_id[DL_CFG_STRLEN], id[DL_CFG_STRLEN], device[129];
    char eps[DL_MAILBOX_MAX_SESSIONS][DL_CFG_STRLEN];
    int S;
    /* the model */
    int nt;
    dl_manifest *man;     /* the caller's manifest (a GPT-2 one tagged with its config) */
    dl_model_config gpt;
    int is_gpt;
    uint64_t max_tokens;
    dl_plan *plan;
    uint64_t fp;
    /* the parameters */
    int bind;
    float **tp;           /* [nt] host binding: tensor i's elements */
    float *shared;        /* [max fragment numel] host binding: the snapshot of the fragment being read */
    dloco_param_callbacks cb;
    dl_node_model iface;  /* what the node calls: one of the bindings, marking what apply changes */
    /* the run */
    dl_mailbox *mb;
    dl_comms *comms[DL_MAILBOX_MAX_SESSIONS];
    dl_node *node;
    dl_lmet *lmet;
    int events_opened;
    int state;            /* DLOCO_STATE_* */
    int joined, finished, dead;
    volatile sig_atomic_t stop;
    uint64_t steps, tokens;
    double step_ewma, t_last;
    uint8_t *fchanged;    /* [P] */
    uint8_t *tchanged;    /* [nt] */
    int nchanged;
    int flush_unanswered;
    int jfd;              /* the push journal (state_path.journal), or -1 */
    char err[1024];
};

static _Thread_local char open_err[1024];

/* Record the failure `rc` (its message is dl_errmsg()) on the handle. */
static int fail(dloco_learner *l, int rc)
{
    if (l) snprintf(l->err, sizeof l->err, "%s", dl_errmsg()[0] ? dl_errmsg() : dloco_learner_strerror(rc));
    return rc;
}

/* As fail, and the handle cannot run on. */
static int fail_dead(dloco_learner *l, int rc)
{
    l->dead = 1;
    return fail(l, rc);
}

DLOCO_API int32_t dloco_learner_api_version(void) { return DLOCO_LEARNER_API_VERSION; }

DLOCO_API const char *dloco_learner_strerror(int32_t code)
{
    switch (code) {
    case DLOCO_EREFUSED: return "refused by the synchronizer";
    case DLOCO_ESTATE: return "call out of order";
    case DLOCO_ESTOPPED: return "stop requested";
    case DLOCO_ECALLBACK: return "a parameter callback failed";
    default: return dl_strerror(code);
    }
}

DLOCO_API const char *dloco_learner_errmsg(const dloco_learner *l)
{
    if (l) return l->err;
    return dl_errmsg()[0] ? dl_errmsg() : open_err;
}

DLOCO_API void dloco_learner_opts_init(dloco_learner_opts *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = (uint32_t)sizeof *o;
}

/* ---- the log sink (core/log.h): one per process */

static dloco_log_fn sink_fn;
static void *sink_ctx;
static const dloco_learner *sink_owner;

static void sink(void *ctx, int level, const char *line)
{
    (void)ctx;
    dloco_log_fn fn = __atomic_load_n(&sink_fn, __ATOMIC_ACQUIRE);
    if (fn) fn(sink_ctx, level, line);
}

/* ---- the manifest */

static int gpt2_config(const dloco_gpt2_config *g, dl_model_config *out)
{
    memset(out, 0, sizeof *out);
    out->n_layer = g->n_layer;
    out->n_head = g->n_head;
    out->n_embd = g->n_embd;
    out->seq_len = g->seq_len;
    out->vocab = g->vocab;
    int rc = dl_model_config_check(out);
    if (rc) return dl_err(rc, "gpt2 config: %s", dl_errmsg());
    return 0;
}

static _Thread_local char gpt2_names[4 + 12 * DL_MODEL_LAYER_MAX][48]; /* GPT-2 names are under 48 bytes */

DLOCO_API int32_t dloco_learner_gpt2_manifest(const dloco_gpt2_config *cfg, dloco_tensor *out, int32_t cap)
{
    dl_model_config c;
    if (!cfg) return dl_err(DLOCO_EINVAL, "gpt2 manifest: no config");
    DL_TRY(gpt2_config(cfg, &c));
    int nt = dl_model_tensor_table(&c, NULL, 0, NULL);
    if (!out || cap <= 0) return nt;
    dl_tensor *tab = dl_try_calloc((size_t)nt, sizeof *tab);
    if (!tab) return dl_err(DLOCO_ENOMEM, "gpt2 manifest: %d tensors: out of memory", nt);
    dl_model_tensor_table(&c, tab, nt, NULL);
    for (int i = 0; i < nt && i < cap; i++) {
        snprintf(gpt2_names[i], sizeof gpt2_names[i], "%.47s", tab[i].name);
        memset(&out[i], 0, sizeof out[i]);
        out[i].name = gpt2_names[i];
        out[i].ndim = tab[i].ndim;
        out[i].role = tab[i].kind;
        for (int d = 0; d < tab[i].ndim; d++) out[i].shape[d] = tab[i].shape[d];
    }
    free(tab);
    return nt;
}

/* The caller's manifest as core/manifest.h's (checked there: names, dims, roles, duplicates, size). */
static int manifest_of(const dloco_tensor *t, int nt, dl_manifest **out)
{
    *out = NULL;
    if (!t || nt < 1) return dl_err(DLOCO_EINVAL, "manifest: no tensors (tensors NULL or n_tensors %d)", nt);
    dl_manifest *m = NULL;
    DL_TRY(dl_manifest_open(&m));
    int rc = 0;
    for (int i = 0; i < nt && !rc; i++) {
        if (!t[i].name) rc = dl_err(DLOCO_EINVAL, "manifest: tensor %d has no name", i);
        else if (t[i].ndim < 1 || t[i].ndim > DLOCO_TENSOR_MAX_DIMS)
            rc = dl_err(DLOCO_EINVAL, "manifest: tensor %.80s has %d dims; 1 to %d are supported", t[i].name,
                        t[i].ndim, DLOCO_TENSOR_MAX_DIMS);
        else rc = dl_manifest_add(m, t[i].name, t[i].ndim, t[i].shape, t[i].role); /* its message names it */
    }
    if (!rc) rc = dl_manifest_check(m);
    if (rc) {
        dl_manifest_close(&m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ---- open / close */

void dl_learner_default_id(char *id, size_t cap)
{
    char host[41] = "learner";
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "learner");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' && *c != '-') *c = '-';
    snprintf(id, cap, "%s-%ld", host, (long)getpid());
}

/* "a,b,c" into l->eps; l->S. */
static int split_connect(dloco_learner *l, const char *list)
{
    int n = 0;
    for (const char *a = list;;) {
        const char *e = strchr(a, ',');
        size_t len = e ? (size_t)(e - a) : strlen(a);
        if (len == 0) return dl_err(DLOCO_EINVAL, "connect: empty endpoint in '%.200s'", list);
        if (len >= DL_CFG_STRLEN) return dl_err(DLOCO_EINVAL, "connect: an endpoint is longer than %d bytes",
                                                DL_CFG_STRLEN - 1);
        if (n == DL_MAILBOX_MAX_SESSIONS)
            return dl_err(DLOCO_EINVAL, "connect: more than %d endpoints (shards)", DL_MAILBOX_MAX_SESSIONS);
        snprintf(l->eps[n++], DL_CFG_STRLEN, "%.*s", (int)len, a);
        if (!e) break;
        a = e + 1;
    }
    l->S = n;
    return 0;
}

static int copy_str(char *dst, size_t cap, const char *src, const char *what)
{
    if (strlen(src) >= cap) return dl_err(DLOCO_EINVAL, "%s: longer than %zu bytes", what, cap - 1);
    snprintf(dst, cap, "%s", src);
    return 0;
}

/* The opts fields this library version knows, from a caller's struct of o->struct_size bytes. */
static int read_opts(const dloco_learner_opts *o, dloco_learner_opts *out)
{
    if (!o) return dl_err(DLOCO_EINVAL, "no options");
    if (o->struct_size < offsetof(dloco_learner_opts, gpt2))
        return dl_err(DLOCO_EINVAL, "options: struct_size %u is too small (call dloco_learner_opts_init)",
                      o->struct_size);
    dloco_learner_opts_init(out);
    memcpy(out, o, o->struct_size < sizeof *out ? o->struct_size : sizeof *out);
    return 0;
}

static int open_checked(const dloco_learner_opts *oin, const dl_learner_ext *ext, dloco_learner *l)
{
    dloco_learner_opts o;
    DL_TRY(read_opts(oin, &o));
    DL_TRY(dl_cfg_defaults(net_table, NNET, &l->cfg));
    if (ext) l->ext = *ext;
    if (ext && ext->net) l->cfg = *ext->net;
    if (o.start_step < 0) return dl_err(DLOCO_EINVAL, "start_step: %lld (a step, >= 0)", (long long)o.start_step);
    if (!l->ext.start_step) l->ext.start_step = o.start_step;
    if (!o.connect || !o.connect[0]) return dl_err(DLOCO_EINVAL, "connect: no synchronizer endpoint");
    DL_TRY(copy_str(l->connect, sizeof l->connect, o.connect, "connect"));
    DL_TRY(split_connect(l, o.connect));
    if (!o.run_id || !o.run_id[0]) return dl_err(DLOCO_EINVAL, "run_id: empty (it must be the synchronizer's)");
    DL_TRY(copy_str(l->run_id, sizeof l->run_id, o.run_id, "run_id"));
    if (o.learner_id && o.learner_id[0]) {
        if (!dl_comms_id_ok(o.learner_id))
            return dl_err(DLOCO_EINVAL, "learner_id: '%.80s' is not [A-Za-z0-9._-]{1,64}", o.learner_id);
        snprintf(l->id, sizeof l->id, "%s", o.learner_id);
    } else dl_learner_default_id(l->id, sizeof l->id);
    DL_TRY(copy_str(l->device, sizeof l->device, o.device && o.device[0] ? o.device : "cpu", "device"));
    if (o.max_tokens_per_step < 1 || o.max_tokens_per_step > (1ull << 40))
        return dl_err(DLOCO_EINVAL, "max_tokens_per_step: %llu is not in 1..2^40",
                      (unsigned long long)o.max_tokens_per_step);
    l->max_tokens = o.max_tokens_per_step;
    if (o.fragments < DL_MODEL_FRAGMENTS_MIN || o.fragments > DL_MODEL_FRAGMENTS_MAX)
        return dl_err(DLOCO_EINVAL, "fragments: %d is not in %d..%d", o.fragments, DL_MODEL_FRAGMENTS_MIN,
                      DL_MODEL_FRAGMENTS_MAX);
    DL_TRY(manifest_of(o.tensors, o.n_tensors, &l->man));
    l->nt = o.n_tensors;
    int rc = 0;
    if (o.gpt2) {
        l->is_gpt = 1;
        DL_TRY(gpt2_config(o.gpt2, &l->gpt));
        if ((rc = dl_manifest_set_gpt(l->man, &l->gpt)))
            return dl_err(rc == DL_ENOMEM ? rc : DLOCO_EINVAL, "the manifest is not the GPT-2 config's: %s", dl_errmsg());
        if (o.max_tokens_per_step < (uint64_t)l->gpt.seq_len)
            return dl_err(DLOCO_EINVAL, "max_tokens_per_step: %llu is less than one sequence (seq_len %d)",
                          (unsigned long long)o.max_tokens_per_step, l->gpt.seq_len);
    }
    if ((rc = dl_manifest_plan_open(l->man, o.fragments, &l->plan)))
        return dl_err(rc == DL_ENOMEM ? rc : DLOCO_EINVAL, "fragments %d: %s", o.fragments, dl_errmsg());
    if (l->S > 1 && (rc = dl_shard_check(dl_plan_P(l->plan), 0, l->S)))
        return dl_err(DLOCO_EINVAL, "connect: %d shards: %s", l->S, dl_errmsg());
    l->fp = dl_manifest_fingerprint(l->man, l->plan);
    if (o.config_path && o.config_path[0]) {
        if ((rc = dl_cfg_load_ini(net_table, NNET, &l->cfg, o.config_path)))
            return dl_err(rc, "options file: %s", dl_errmsg());
    }
    int P = dl_plan_P(l->plan);
    l->fchanged = dl_try_calloc((size_t)P, 1);
    l->tchanged = dl_try_calloc((size_t)l->nt, 1);
    if (!l->fchanged || !l->tchanged) return dl_err(DLOCO_ENOMEM, "change flags: out of memory");
    l->flush_unanswered = -1;
    if (o.log) {
        __atomic_store_n(&sink_fn, NULL, __ATOMIC_RELEASE);
        sink_ctx = o.log_ctx;
        sink_owner = l;
        __atomic_store_n(&sink_fn, o.log, __ATOMIC_RELEASE);
        dl_log_set_sink(sink, NULL);
    }
    return 0;
}

int dl_learner_open_ext(const dloco_learner_opts *o, const dl_learner_ext *ext, dloco_learner **out)
{
    if (!out) return dl_err(DLOCO_EINVAL, "dloco_learner_open: out is NULL");
    *out = NULL;
    open_err[0] = 0;
    dl_err_clear();
    dloco_learner *l = dl_try_calloc(1, sizeof *l);
    if (!l) return dl_err(DLOCO_ENOMEM, "learner handle: out of memory");
    l->jfd = -1;
    int rc = open_checked(o, ext, l);
    if (rc) {
        snprintf(open_err, sizeof open_err, "%s", dl_errmsg());
        dloco_learner_close(&l);
        return dl_err(rc, "%s", open_err);
    }
    *out = l;
    return 0;
}

DLOCO_API int dloco_learner_open(const dloco_learner_opts *o, dloco_learner **out)
{
    return dl_learner_open_ext(o, NULL, out);
}

/* Stop the sessions' threads; their counters stay readable until close. */
static void stop_sessions(dloco_learner *l)
{
    for (int k = 0; k < l->S; k++) dl_comms_stop(l->comms[k]);
}

DLOCO_API void dloco_learner_close(dloco_learner **lp)
{
    if (!lp || !*lp) return;
    dloco_learner *l = *lp;
    if (sink_owner == l) {
        dl_log_set_sink(NULL, NULL);
        __atomic_store_n(&sink_fn, NULL, __ATOMIC_RELEASE);
        sink_owner = NULL;
    }
    if (l->lmet) dl_lmet_close(&l->lmet);
    for (int k = 0; k < l->S; k++) dl_comms_close(&l->comms[k]);
    dl_node_close(&l->node);
    if (l->jfd >= 0) close(l->jfd);
    dl_mailbox_close(&l->mb);
    if (l->events_opened) dl_event_close();
    dl_plan_close(&l->plan);
    dl_manifest_close(&l->man);
    free(l->tp);
    free(l->shared);
    free(l->fchanged);
    free(l->tchanged);
    free(l);
    *lp = NULL;
}

DLOCO_API int dloco_learner_set_option(dloco_learner *l, const char *name, const char *value)
{
    if (!l || !name || !value) return dl_err(DLOCO_EINVAL, "set_option: NULL argument");
    if (l->joined) return fail(l, dl_err(DLOCO_ESTATE, "set_option %.80s: options are set before join", name));
    int rc = dl_cfg_set(net_table, NNET, &l->cfg, name, value);
    return rc ? fail(l, rc) : 0;
}

/* ---- the plan */

DLOCO_API int32_t dloco_learner_fragments(const dloco_learner *l) { return l ? dl_plan_P(l->plan) : 0; }
DLOCO_API uint64_t dloco_learner_fingerprint(const dloco_learner *l) { return l ? l->fp : 0; }
DLOCO_API uint64_t dloco_learner_numel(const dloco_learner *l) { return l ? dl_plan_total_numel(l->plan) : 0; }

DLOCO_API uint64_t dloco_learner_fragment_numel(const dloco_learner *l, int32_t p)
{
    if (!l || p < 0 || p >= dl_plan_P(l->plan)) return 0;
    return dl_plan_fragment_numel(l->plan, p);
}

DLOCO_API int32_t dloco_learner_fragment_nspans(const dloco_learner *l, int32_t p)
{
    if (!l || p < 0 || p >= dl_plan_P(l->plan)) return dl_err(DLOCO_EINVAL, "fragment %d does not exist", p);
    int n = 0;
    dl_plan_fragment_spans(l->plan, p, &n);
    return n;
}

DLOCO_API int dloco_learner_fragment_span(const dloco_learner *l, int32_t p, int32_t i, dloco_span *out)
{
    if (!l || !out || p < 0 || p >= dl_plan_P(l->plan)) return dl_err(DLOCO_EINVAL, "fragment %d does not exist", p);
    int n = 0;
    const dl_plan_span *s = dl_plan_fragment_spans(l->plan, p, &n);
    if (i < 0 || i >= n) return dl_err(DLOCO_EINVAL, "fragment %d has no span %d (it has %d)", p, i, n);
    out->tensor = s[i].tensor;
    out->fragment = p;
    out->start = s[i].start;
    out->numel = s[i].numel;
    out->offset = s[i].offset;
    return 0;
}

/* ---- the bindings: every one is a dl_node_model whose apply marks what it changed */

static void mark(dloco_learner *l, int p)
{
    if (!l->fchanged[p]) {
        l->fchanged[p] = 1;
        l->nchanged++;
    }
    int n = 0;
    const dl_plan_span *s = dl_plan_fragment_spans(l->plan, p, &n);
    for (int i = 0; i < n; i++) l->tchanged[s[i].tensor] = 1;
}

static int host_read_begin(void *ctx, int p)
{
    dloco_learner *l = ctx;
    int n = 0;
    const dl_plan_span *s = dl_plan_fragment_spans(l->plan, p, &n);
    for (int i = 0; i < n; i++) memcpy(l->shared + s[i].offset, l->tp[s[i].tensor] + s[i].start, s[i].numel * 4);
    return 0;
}

static int host_read_end(void *ctx, int p, const float **theta)
{
    (void)p;
    *theta = ((dloco_learner *)ctx)->shared;
    return 0;
}

/* theta = a*theta + b*in span by span, as the node's own host interface does it (dl_cpu_axpby; a copy for
 * a == 0, b == 1), so a host binding adopts bit for bit what dloco-learner adopts. */
static int host_apply(void *ctx, int p, float a, float b, const float *in)
{
    dloco_learner *l = ctx;
    mark(l, p);
    int n = 0;
    const dl_plan_span *s = dl_plan_fragment_spans(l->plan, p, &n);
    for (int i = 0; i < n; i++) {
        float *y = l->tp[s[i].tensor] + s[i].start;
        if (a == 0.0f && b == 1.0f) memcpy(y, in + s[i].offset, s[i].numel * 4);
        else dl_cpu_axpby(y, a, in + s[i].offset, b, s[i].numel);
    }
    return 0;
}

static int cb_read_begin(void *ctx, int p)
{
    dloco_learner *l = ctx;
    int32_t rc = l->cb.read_begin(l->cb.ctx, p);
    return rc ? dl_err(DLOCO_ECALLBACK, "parameter callback read_begin(fragment %d) returned %d", p, (int)rc) : 0;
}

static int cb_read_end(void *ctx, int p, const float **theta)
{
    dloco_learner *l = ctx;
    *theta = NULL;
    int32_t rc = l->cb.read_end(l->cb.ctx, p, theta);
    if (rc) return dl_err(DLOCO_ECALLBACK, "parameter callback read_end(fragment %d) returned %d", p, (int)rc);
    if (!*theta) return dl_err(DLOCO_ECALLBACK, "parameter callback read_end(fragment %d) gave no values", p);
    return 0;
}

static int cb_apply(void *ctx, int p, float a, float b, const float *in)
{
    dloco_learner *l = ctx;
    mark(l, p);
    int32_t rc = l->cb.apply(l->cb.ctx, p, a, b, in);
    return rc ? dl_err(DLOCO_ECALLBACK, "parameter callback apply(fragment %d) returned %d", p, (int)rc) : 0;
}

static int bind_check(dloco_learner *l)
{
    if (!l) return dl_err(DLOCO_EINVAL, "bind: no handle");
    if (l->bind != BIND_NONE || l->joined)
        return fail(l, dl_err(DLOCO_ESTATE, "bind: the parameters are bound already (one binding, before join)"));
    return 0;
}

static int bind_host_ptrs(dloco_learner *l, float **tp)
{
    l->shared = dl_try_malloc(dl_plan_max_fragment_numel(l->plan) * sizeof(float));
    if (!l->shared) {
        free(tp);
        return fail(l, dl_err(DLOCO_ENOMEM, "bind: a fragment's snapshot (%zu floats): out of memory",
                              dl_plan_max_fragment_numel(l->plan)));
    }
    l->tp = tp;
    l->bind = BIND_HOST;
    l->iface = (dl_node_model){.ctx = l, .deferred = 0, .read_begin = host_read_begin, .read_end = host_read_end,
                               .apply = host_apply};
    return 0;
}

DLOCO_API int dloco_learner_bind_host(dloco_learner *l, float *const *tensors, int32_t n)
{
    DL_TRY(bind_check(l));
    if (!tensors) return fail(l, dl_err(DLOCO_EINVAL, "bind_host: tensors is NULL"));
    if (n != l->nt)
        return fail(l, dl_err(DLOCO_EMISMATCH, "bind_host: %d buffers for a manifest of %d tensors", n, l->nt));
    for (int i = 0; i < n; i++)
        if (!tensors[i])
            return fail(l, dl_err(DLOCO_EINVAL, "bind_host: the buffer of tensor %s is NULL",
                                  dl_plan_tensor(l->plan, i)->name));
    float **tp = dl_try_malloc((size_t)n * sizeof *tp);
    if (!tp) return fail(l, dl_err(DLOCO_ENOMEM, "bind_host: out of memory"));
    memcpy(tp, tensors, (size_t)n * sizeof *tp);
    return bind_host_ptrs(l, tp);
}

DLOCO_API int dloco_learner_bind_contiguous(dloco_learner *l, float *params, uint64_t numel)
{
    DL_TRY(bind_check(l));
    if (!params) return fail(l, dl_err(DLOCO_EINVAL, "bind_contiguous: params is NULL"));
    if (numel != dl_plan_total_numel(l->plan))
        return fail(l, dl_err(DLOCO_EMISMATCH, "bind_contiguous: %llu floats for a manifest of %zu",
                              (unsigned long long)numel, dl_plan_total_numel(l->plan)));
    float **tp = dl_try_malloc((size_t)l->nt * sizeof *tp);
    if (!tp) return fail(l, dl_err(DLOCO_ENOMEM, "bind_contiguous: out of memory"));
    for (int i = 0; i < l->nt; i++) tp[i] = params + dl_plan_tensor(l->plan, i)->offset;
    return bind_host_ptrs(l, tp);
}

DLOCO_API int dloco_learner_bind_callbacks(dloco_learner *l, const dloco_param_callbacks *cb)
{
    DL_TRY(bind_check(l));
    if (!cb) return fail(l, dl_err(DLOCO_EINVAL, "bind_callbacks: no callbacks"));
    if (cb->struct_size < sizeof(dloco_param_callbacks))
        return fail(l, dl_err(DLOCO_EINVAL, "bind_callbacks: struct_size %u, expected %zu", cb->struct_size,
                              sizeof(dloco_param_callbacks)));
    if (!cb->read_begin || !cb->read_end || !cb->apply)
        return fail(l, dl_err(DLOCO_EINVAL, "bind_callbacks: read_begin, read_end and apply are all needed"));
    l->cb = *cb;
    l->bind = BIND_CALLBACKS;
    l->iface = (dl_node_model){.ctx = l, .deferred = cb->deferred ? 1 : 0, .read_begin = cb_read_begin,
                               .read_end = cb_read_end, .apply = cb_apply};
    return 0;
}

/* ---- join */

int dl_learner_netcfg_resolve(const dl_learner_netcfg *c, dl_comms_opts *co)
{
    dl_codec_rounding r;
    DL_TRY(dl_codec_push_opts(c->push_codec, (long long)c->push_block, (long long)c->push_topk, c->push_rounding,
                              &co->push_codec, &r));
    co->push_rounding = (int)r;
    co->error_feedback = c->error_feedback;
    co->connect_timeout_ms = c->connect_timeout_ms > 0 ? (int)c->connect_timeout_ms : -1; /* 0: no bound */
    co->hello_retry_ms = (int)c->hello_retry_ms;
    co->hello_retry_max_ms = (int)c->hello_retry_max_ms;
    co->hello_unsent_ms = (int)c->hello_unsent_ms;
    co->poll_max_ms = (int)c->poll_max_ms;
    co->silence_min_ms = (int)c->silence_min_ms;
    co->silence_rebuild_ms = (int)c->silence_rebuild_ms;
    co->ack_expiry_min_ms = (int)c->ack_expiry_min_ms;
    co->bye_linger_ms = (int)c->bye_linger_ms;
    co->reconnect_ms = (int)c->reconnect_ms;
    co->reconnect_max_ms = (int)c->reconnect_max_ms;
    co->tcp_stall_ms = c->tcp_stall_ms > 0 ? (int)c->tcp_stall_ms : -1; /* 0: the kernel's own */
    DL_TRY(dl_comms_check_timeouts(co, (int)c->push_decision_timeout_ms));
    if (!c->server_key[0] && !c->key_file[0]) return 0;
    if (!c->server_key[0] || !c->key_file[0])
        return dl_err(DLOCO_EINVAL, "options server_key and key_file go together (CURVE needs the synchronizer's "
                                    "public key and this learner's key pair); %s is set, %s is empty",
                      c->server_key[0] ? "server_key" : "key_file", c->server_key[0] ? "key_file" : "server_key");
    int rc = dl_auth_load_public(c->server_key, co->curve_server);
    if (rc) return dl_err(rc, "option server_key: %s", dl_errmsg());
    dl_auth_keypair kp;
    if ((rc = dl_auth_load_keypair(c->key_file, &kp))) return dl_err(rc, "option key_file: %s", dl_errmsg());
    memcpy(co->curve_public, kp.public_z85, sizeof co->curve_public);
    memcpy(co->curve_secret, kp.secret_z85, sizeof co->curve_secret);
    memset(&kp, 0, sizeof kp);
    return 0;
}

/* ---- the learner's state across restarts (learner/node.h "the node's state across a restart") */

/* The tag of a saved state: its run and learner id (a state of another one is refused). */
static uint64_t state_tag(const dloco_learner *l)
{
    uint64_t h = dl_hash64(l->run_id, strlen(l->run_id) + 1, 0x6e6f6465ull);
    return dl_hash64(l->id, strlen(l->id), h);
}

/* Read a whole state file: 1 read (*buf malloced), 0 none, < 0 an error. */
static int read_whole(const char *path, size_t max, void **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? 0 : dl_err(DL_EIO, "cannot open %s: %s", path, strerror(errno));
    /* one byte more than the model's state may take: a longer file is refused as such */
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && sb.st_size >= 0 && (uint64_t)sb.st_size < max) max = (size_t)sb.st_size;
    uint8_t *b = dl_try_malloc(max + 1);
    if (!b) {
        fclose(f);
        return dl_err(DL_ENOMEM, "%s: out of memory", path);
    }
    size_t n = fread(b, 1, max + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return dl_err(DL_EIO, "cannot read %s", path);
    }
    *buf = b;
    *len = n;
    return 1;
}

/* Read `path` and restore the node from it: 1 restored, 0 no file, < 0 the
 * refusal (only the header's checks can refuse after a read: the node is
 * untouched then, and another file may be tried). */
static int restore_file(dloco_learner *l, const char *path, uint64_t tag, const uint64_t *jr, int jn,
                        dl_node_restored *got)
{
    void *buf = NULL;
    size_t len = 0;
    int rc = read_whole(path, dl_node_state_max_bytes(l->node), &buf, &len);
    if (rc > 0) {
        rc = dl_node_state_restore(l->node, buf, len, l->fp, tag, l->steps, jn ? jr : NULL, jn, got);
        if (!rc) rc = 1;
    }
    free(buf);
    return rc;
}

/* At join, before the sessions start: restore state_path when it holds this
 * learner's state at its start step (a refusal is warned, the file moved
 * aside, and the learner fetches as a fresh one would), then keep the push
 * journal beside it. A state at another step is answered by the previous
 * file (PATH.prev, kept by each save) when that one is at the start step: a
 * kill between save_state and the caller's own checkpoint leaves exactly
 * that pair. */
static int state_restore(dloco_learner *l)
{
    const char *path = l->cfg.state_path;
    if (!path[0]) return 0;
    char jpath[DL_CFG_STRLEN + 16], prev[DL_CFG_STRLEN + 16], ev_path[600], ev_why[800];
    snprintf(jpath, sizeof jpath, "%s.journal", path);
    snprintf(prev, sizeof prev, "%s.prev", path);
    uint64_t tag = state_tag(l);
    int P = dl_plan_P(l->plan);
    uint64_t *jr = dl_try_calloc(2 * (size_t)P, sizeof *jr);
    if (!jr) return dl_err(DL_ENOMEM, "learner state: out of memory");
    int jn = dl_node_journal_read(jpath, tag, jr, P);
    dl_node_restored got = {0};
    const char *used = path;
    int from_prev = 0;
    int rc = restore_file(l, path, tag, jr, jn, &got);
    if (rc == DL_EMISMATCH) {
        char why[700];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        dl_node_restored got_prev = {0};
        int prc = restore_file(l, prev, tag, jr, jn, &got_prev);
        if (prc == 1) {
            /* the previous save is the caller's step: the newer file goes aside, the previous one takes its place */
            char aside[DL_CFG_STRLEN + 16];
            snprintf(aside, sizeof aside, "%s.rejected", path);
            DL_INFO("learner state %s not used (%s): the previous save %s is at this step", path, why, prev);
            if (rename(path, aside) == 0 && rename(prev, path) == 0) used = path;
            else used = prev;
            got = got_prev;
            from_prev = 1;
            rc = 1;
        } else if (prc == DL_ENOMEM) {
            rc = prc;
        } else {
            dl_err(DL_EMISMATCH, "%s", why); /* the refusal names the file at state_path */
        }
    }
    free(jr);
    if (rc == DL_ENOMEM) return rc;
    if (rc < 0) {
        /* the parameter interface failing is the join's failure; a bad file only this start's */
        int bad_file = rc == DL_ETRUNC || rc == DL_EFORMAT || rc == DL_ECORRUPT || rc == DL_EMISMATCH ||
                       rc == DL_ERANGE || rc == DL_EIO;
        if (!bad_file) return rc;
        char why[700], aside[DL_CFG_STRLEN + 16];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        snprintf(aside, sizeof aside, "%s.rejected", path);
        if (rename(path, aside) != 0) snprintf(aside, sizeof aside, "(not moved: %s)", strerror(errno));
        DL_WARN("learner state %s not used, fetching the global model: %s; moved to %s", path, why, aside);
        dl_event("state_refused", "id=%s path=%s reason=%s", l->id, dl_event_str(path, ev_path, sizeof ev_path),
                 dl_event_str(why, ev_why, sizeof ev_why));
    } else if (rc == 1) {
        int carrying = 0;
        for (int p = 0; p < P; p++) carrying += dl_node_tokens(l->node, p) > 0;
        DL_INFO("learner state restored from %s: step %llu, %d fragments carry %llu fragment-tokens of unpushed "
                "progress, %d error feedback residuals%s", used, (unsigned long long)l->steps, carrying,
                (unsigned long long)got.carried, got.residuals,
                got.format < 2 ? " (a file of an older dloco: residuals start at zero)" : "");
        dl_event("state_restored",
                 "id=%s path=%s step=%llu carried_tokens=%llu carrying=%d journal=%d format=%d residuals=%d "
                 "residuals_dropped=%d previous=%d", l->id, dl_event_str(used, ev_path, sizeof ev_path),
                 (unsigned long long)l->steps, (unsigned long long)got.carried, carrying, jn, got.format,
                 got.residuals, got.residuals_dropped, from_prev);
    }
    l->jfd = open(jpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (l->jfd < 0 || dl_node_set_journal(l->node, l->jfd, tag)) {
        DL_WARN("push journal %s not kept (%s): a restart will carry no unpushed progress", jpath,
                l->jfd < 0 ? strerror(errno) : dl_errmsg());
        if (l->jfd >= 0) close(l->jfd);
        l->jfd = -1;
    }
    return 0;
}

int dl_learner_state_copy(dloco_learner *l, void **buf, size_t *cap, size_t *len)
{
    if (!l || !l->node) return dl_err(DLOCO_ESTATE, "save_state: join first");
    size_t n = dl_node_state_bytes(l->node);
    if (*cap < n) {
        void *b = realloc(*buf, n);
        if (!b) return dl_err(DLOCO_ENOMEM, "save_state: %zu bytes: out of memory", n);
        *buf = b;
        *cap = n;
    }
    return dl_node_state_copy(l->node, l->fp, state_tag(l), l->steps, *buf, len);
}

int dl_learner_state_write(const char *path, const void *buf, size_t len)
{
    char tmp[DL_CFG_STRLEN + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return dl_err(DLOCO_EIO, "cannot write the learner state %s: %s", tmp, strerror(errno));
    const uint8_t *b = buf;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, b + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    int ok = off == len && fsync(fd) == 0;
    int err = errno;
    close(fd);
    if (ok) {
        /* the file being replaced stays as PATH.prev (a hard link, so PATH always names a whole state): a
         * kill before the caller's own checkpoint of this step leaves that one at the previous step, and
         * join restores PATH.prev then. Best effort: without hard links there is no previous file. */
        char prev[DL_CFG_STRLEN + 16], ptmp[DL_CFG_STRLEN + 16];
        snprintf(prev, sizeof prev, "%s.prev", path);
        snprintf(ptmp, sizeof ptmp, "%s.prev.tmp", path);
        unlink(ptmp);
        if (link(path, ptmp) == 0 && rename(ptmp, prev) != 0) unlink(ptmp);
    }
    if (!ok || rename(tmp, path) != 0) {
        if (ok) err = errno;
        unlink(tmp);
        return dl_err(DLOCO_EIO, "cannot write the learner state %s: %s", path, strerror(err));
    }
    return 0;
}

DLOCO_API int dloco_learner_save_state(dloco_learner *l)
{
    if (!l) return dl_err(DLOCO_EINVAL, "save_state: no handle");
    if (!l->joined || l->dead) return fail(l, dl_err(DLOCO_ESTATE, "save_state: join first"));
    if (!l->cfg.state_path[0])
        return fail(l, dl_err(DLOCO_EINVAL, "save_state: no state_path (set the option state_path before join)"));
    void *buf = NULL;
    size_t cap = 0, len = 0;
    int rc = dl_learner_state_copy(l, &buf, &cap, &len);
    if (!rc) rc = dl_learner_state_write(l->cfg.state_path, buf, len);
    free(buf);
    return rc ? fail(l, rc) : 0;
}

static int join_setup(dloco_learner *l)
{
    dl_learner_netcfg *c = &l->cfg;
    dl_comms_opts co = {0};
    DL_TRY(dl_learner_netcfg_resolve(c, &co));
    co.adopt_keep = !strcmp(c->adopt, "keep");
    dl_log_set_level(dl_log_level_parse(c->log_level));
    if (c->events[0]) {
        DL_TRY(dl_event_open(c->events, "learner"));
        l->events_opened = 1;
    }
    DL_TRY(dl_mailbox_open(l->plan, &l->mb));
    dl_mailbox_set_progress(l->mb, l->steps, l->tokens, 0.0); /* before any Hello (dloco_learner_join) */
    co.mailbox = l->mb;
    co.learner_id = l->id;
    co.run_id = l->run_id;
    co.plan = l->plan;
    co.fingerprint = l->fp;
    if (l->is_gpt) {
        co.n_layer = (uint32_t)l->gpt.n_layer;
        co.n_head = (uint32_t)l->gpt.n_head;
        co.n_embd = (uint32_t)l->gpt.n_embd;
        co.seq_len = (uint32_t)l->gpt.seq_len;
        co.vocab = (uint32_t)l->gpt.vocab;
        /* Hello.batch: sequences per step; the synchronizer bounds a push's tokens by steps x batch x seq_len */
        co.batch = l->ext.hello_batch ? l->ext.hello_batch
                                      : (uint32_t)((l->max_tokens + (uint64_t)l->gpt.seq_len - 1) / (uint64_t)l->gpt.seq_len);
    } else {
        /* any other model: its tensors and token bound travel in the Hello (a GPT-2 learner's Hello stays
         * dloco-learner's, byte for byte) */
        co.manifest = l->man;
        co.max_tokens_per_step = l->max_tokens;
    }
    co.device = l->device;
    co.max_version_jump = (uint64_t)c->max_version_jump;
    co.byzantine = l->ext.byzantine;
    co.byzantine_scale = l->ext.byzantine ? l->ext.byzantine_scale : 1.0;
    co.shards = l->S;
    int rc = 0;
    for (int k = 0; k < l->S && !rc; k++) {
        co.endpoint = l->eps[k];
        co.shard = k;
        rc = dl_comms_open(&co, &l->comms[k]);
    }
    memset(co.curve_secret, 0, sizeof co.curve_secret);
    DL_TRY(rc);
    dl_node_opts no = {
        .plan = l->plan,
        .model = l->ext.model ? l->ext.model : &l->iface,
        .adopt = !strcmp(c->adopt, "mix") ? DL_ADOPT_MIX : !strcmp(c->adopt, "keep") ? DL_ADOPT_KEEP
                                                                                     : DL_ADOPT_OVERWRITE,
        .alpha = (float)c->alpha,
        .push_decision_timeout_ms = (int)c->push_decision_timeout_ms,
        .update_max_ratio = c->update_max_ratio,
        .due = l->ext.due,
        .due_ctx = l->ext.due_ctx,
    };
    DL_TRY(dl_lmet_open(c->metrics, l->id, &l->lmet));
    DL_TRY(dl_node_open(&no, l->mb, &l->node));
    /* each fragment's residuals are its serving session's: saved and restored with the node's state */
    for (int p = 0; p < dl_plan_P(l->plan); p++)
        for (int k = 0; k < l->S; k++)
            if (dl_comms_ef(l->comms[k], p)) dl_node_set_ef(l->node, p, dl_comms_ef(l->comms[k], p));
    DL_TRY(state_restore(l)); /* before the sessions: the Hello says what it holds and carries */
    for (int k = 0; k < l->S; k++) DL_TRY(dl_comms_start(l->comms[k]));
    return 0;
}

static void clear_changed(dloco_learner *l)
{
    if (!l->nchanged) return;
    memset(l->fchanged, 0, (size_t)dl_plan_P(l->plan));
    memset(l->tchanged, 0, (size_t)l->nt);
    l->nchanged = 0;
}

/* DL_ETIMEDOUT's message with the endpoints that never answered. */
static int join_timeout(dloco_learner *l, int timeout_ms)
{
    char silent[1024] = "";
    size_t o = 0;
    for (int k = 0; k < l->S; k++) {
        if (dl_comms_state(l->comms[k], NULL, 0) != DL_COMMS_HELLO) continue;
        o += (size_t)snprintf(silent + o, sizeof silent - o, "%s%s", o ? ", " : "", l->eps[k]);
        if (o >= sizeof silent) break;
    }
    if (silent[0])
        return dl_err(DLOCO_ETIMEDOUT, "no Welcome from %s within %d ms: is dloco-sync running there and reachable "
                                       "(address, port, firewall, CURVE keys)?", silent, timeout_ms);
    return dl_err(DLOCO_ETIMEDOUT, "joined %s, but the initial fetch of the model took longer than %d ms (%s)",
                  l->connect, timeout_ms, dl_errmsg());
}

DLOCO_API int dloco_learner_join(dloco_learner *l, int32_t timeout_ms)
{
    if (!l) return dl_err(DLOCO_EINVAL, "join: no handle");
    if (l->joined || l->dead) return fail(l, dl_err(DLOCO_ESTATE, "join: called twice, or after a failure"));
    if (l->bind == BIND_NONE && !l->ext.model)
        return fail(l, dl_err(DLOCO_ESTATE, "join: bind the parameters first (bind_host, bind_contiguous or "
                                            "bind_callbacks)"));
    l->joined = 1;
    l->state = DLOCO_STATE_JOINING;
    /* a resumed trainer counts on from its step (the schedule's phase, Heartbeat and Push progress), and its
     * Hello says so; the tokens it reports are this process's (Heartbeat.tokens: since its start), so the
     * synchronizer's ledger counts them once, not its earlier ones again */
    l->steps = l->ext.start_step > 0 ? (uint64_t)l->ext.start_step : 0;
    l->tokens = 0;
    int rc = join_setup(l);
    if (rc) {
        l->state = DLOCO_STATE_FAILED;
        stop_sessions(l);
        return fail_dead(l, rc);
    }
    int t = timeout_ms > 0 ? timeout_ms : (int)l->cfg.connect_timeout_ms;
    clear_changed(l);
    rc = dl_node_wait_ready(l->node, t > 0 ? t : -1, &l->stop); /* 0: no bound, until stopped or refused */
    if (rc == DL_EAGAIN) rc = dl_err(DLOCO_ESTOPPED, "join: stopped before the model was fetched");
    else if (rc == DL_ETIMEDOUT) rc = join_timeout(l, t);
    else if (rc == DL_EPROTO) rc = dl_err(DLOCO_EREFUSED, "the synchronizer refused this learner: %s", dl_errmsg());
    if (rc) {
        l->state = rc == DLOCO_EREFUSED ? DLOCO_STATE_REFUSED : DLOCO_STATE_FAILED;
        dl_mailbox_bye(l->mb, rc == DLOCO_ESTOPPED ? "signal" : "failed", 0);
        stop_sessions(l);
        return fail_dead(l, rc);
    }
    l->state = DLOCO_STATE_READY;
    l->t_last = dl_clock_s();
    return 0;
}

/* ---- the step */

int dl_learner_step_sched(dloco_learner *l, int64_t sched, int H, uint64_t tokens, double loss, double compute_s,
                          dloco_step_info *out)
{
    if (!l) return dl_err(DLOCO_EINVAL, "step: no handle");
    if (!l->joined || l->finished || l->dead)
        return fail(l, dl_err(DLOCO_ESTATE, "step: %s", !l->joined ? "join first" : l->finished ? "after finish"
                                                                                                : "after a failure"));
    if (tokens < 1 || tokens > l->max_tokens)
        return fail(l, dl_err(DLOCO_EINVAL, "step: %llu tokens; a step has 1..max_tokens_per_step (%llu)",
                              (unsigned long long)tokens, (unsigned long long)l->max_tokens));
    if (!isfinite(loss))
        return fail(l, dl_err(DLOCO_ERANGE, "step: the training loss %g is not finite (diverged? lower the "
                                            "learning rate)", loss));
    double now = dl_clock_s();
    if (!(compute_s >= 0) || !isfinite(compute_s)) compute_s = now - l->t_last;
    if (compute_s < 0) compute_s = 0;
    clear_changed(l);
    l->steps++;
    l->tokens += tokens;
    l->step_ewma = l->step_ewma > 0 ? 0.8 * l->step_ewma + 0.2 * compute_s : compute_s;
    /* progress first: a push of this step must never claim more than the learner reported processing */
    dl_mailbox_set_progress(l->mb, l->steps, l->tokens, l->step_ewma > 0 ? 1.0 / l->step_ewma : 0.0);
    if (H < 1) H = (int)dl_mailbox_h(l->mb);
    if (H < 1) H = 1;
    if (sched < 1) sched = (int64_t)l->steps;
    int rc, pushes;
    if ((pushes = rc = dl_node_after_step(l->node, sched, H, tokens, loss, compute_s)) < 0 ||
        (rc = dl_node_poll(l->node)) < 0)
        return fail_dead(l, rc);
    dl_node_barrier bw = {.fragment = -1};
    if ((rc = dl_node_barrier_wait(l->node, &l->stop, &bw)) < 0) return fail_dead(l, rc);
    if (rc > 0)
        dl_event("barrier_wait", "id=%s fragment=%d waited_ms=%.3f step=%llu end=%s", l->id, bw.fragment,
                 bw.waited_s * 1e3, (unsigned long long)l->steps, bw.end);
    if (l->lmet) {
        dl_lmet_step(l->lmet, compute_s, loss, l->steps, l->tokens);
        if (dl_lmet_due(l->lmet)) {
            dl_comms_stats cs;
            dl_node_stats ns;
            dl_learner_comms_stats(l, &cs);
            dl_node_get_stats(l->node, &ns);
            dl_lmet_publish(l->lmet, &cs, &ns, l->step_ewma > 0 ? (double)tokens / l->step_ewma : 0.0);
        }
    }
    if (out) {
        dloco_step_info info = {.struct_size = out->struct_size};
        info.pushes = pushes;
        info.adopted = l->nchanged;
        info.barrier_waited = rc > 0;
        info.barrier_wait_s = rc > 0 ? bw.waited_s : 0.0;
        info.step = l->steps;
        info.stop_requested = l->stop != 0;
        info.h = (int32_t)dl_mailbox_h(l->mb);
        info.fragment_changed = l->fchanged;
        info.tensor_changed = l->tchanged;
        size_t n = out->struct_size < sizeof info ? out->struct_size : sizeof info;
        if (n >= sizeof out->struct_size) memcpy(out, &info, n);
    }
    char msg[640];
    int st = dl_mailbox_state(l->mb, msg, sizeof msg);
    if (st == DL_COMMS_REFUSED) {
        l->state = DLOCO_STATE_REFUSED;
        return fail_dead(l, dl_err(DLOCO_EREFUSED, "the synchronizer refused this learner: %s", msg));
    }
    if (st == DL_COMMS_FAILED) {
        l->state = DLOCO_STATE_FAILED;
        return fail_dead(l, dl_err(DLOCO_ENET, "connection to the synchronizer failed: %s", msg));
    }
    l->t_last = dl_clock_s();
    return 0;
}

DLOCO_API int dloco_learner_step(dloco_learner *l, uint64_t tokens, double loss, double compute_s,
                                 dloco_step_info *out)
{
    return dl_learner_step_sched(l, 0, 0, tokens, loss, compute_s, out);
}

/* ---- finish */

DLOCO_API int dloco_learner_finish(dloco_learner *l, int32_t timeout_ms, const char *reason)
{
    if (!l) return dl_err(DLOCO_EINVAL, "finish: no handle");
    if (!l->joined || l->finished || l->dead)
        return fail(l, dl_err(DLOCO_ESTATE, "finish: %s", !l->joined ? "never joined" : l->finished ? "called twice"
                                                                                                    : "after a failure"));
    l->finished = 1;
    clear_changed(l);
    int t = timeout_ms >= 0 ? timeout_ms : (int)l->cfg.flush_timeout_ms;
    int rc = dl_node_finish(l->node, t, l->steps, reason && reason[0] ? reason : "done");
    for (int k = 0; k < l->S; k++) dl_comms_stop(l->comms[k]); /* lets the Byes leave */
    l->state = DLOCO_STATE_DONE;
    if (rc < 0) return fail_dead(l, rc);
    l->flush_unanswered = rc;
    return rc;
}

DLOCO_API void dloco_learner_stop(dloco_learner *l)
{
    if (l) l->stop = 1;
}

/* ---- stats */

void dl_learner_comms_stats(const dloco_learner *l, dl_comms_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < l->S; k++) {
        if (!l->comms[k]) continue;
        dl_comms_stats s;
        dl_comms_get_stats(l->comms[k], &s);
        dl_comms_stats_add(out, &s);
    }
}

DLOCO_API int dloco_learner_get_stats(const dloco_learner *l, dloco_learner_stats *out)
{
    if (!l || !out || out->struct_size < sizeof out->struct_size + sizeof out->state)
        return dl_err(DLOCO_EINVAL, "get_stats: no handle, or struct_size too small");
    dloco_learner_stats s = {.struct_size = out->struct_size};
    dl_comms_stats cs;
    dl_node_stats ns = {0};
    dl_learner_comms_stats(l, &cs);
    if (l->node) dl_node_get_stats(l->node, &ns);
    s.state = l->state;
    s.steps = l->steps;
    s.tokens = l->tokens;
    s.pushes = cs.pushes;
    s.push_bytes = cs.push_bytes;
    s.accepted = cs.accepted;
    s.dropped_stale = cs.dropped_stale;
    s.rejected = cs.rejected;
    s.coalesced = cs.coalesced;
    s.adopted = ns.adopted - ns.rebased;
    s.rebased = ns.rebased;
    s.ignored = ns.ignored;
    s.refused = ns.refused + cs.updates_refused;
    s.held = ns.held;
    s.hold_released = ns.hold_released;
    s.barrier_waits = ns.barrier_waits;
    s.barrier_wait_s = ns.barrier_wait_s;
    s.bytes_sent = cs.bytes_sent;
    s.bytes_received = cs.bytes_recv;
    s.rehellos = cs.rehellos;
    s.rebuilds = cs.rebuilds;
    s.epoch = cs.epoch;
    s.h = l->mb ? dl_mailbox_h(l->mb) : 0;
    s.flush_unanswered = l->flush_unanswered;
    memcpy(out, &s, out->struct_size < sizeof s ? out->struct_size : sizeof s);
    return 0;
}

/* ---- internal access for dloco-learner (learner/learner_int.h) */

dl_node *dl_learner_node(dloco_learner *l) { return l->node; }
dl_mailbox *dl_learner_mailbox(dloco_learner *l) { return l->mb; }
const dl_plan *dl_learner_plan(const dloco_learner *l) { return l->plan; }
int dl_learner_sessions(dloco_learner *l, dl_comms ***out)
{
    *out = l->comms;
    return l->S;
}
const char *dl_learner_id(const dloco_learner *l) { return l->id; }
