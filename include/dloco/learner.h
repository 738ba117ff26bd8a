/* dloco/learner.h: the public C API of libdloco_learner -- any training loop becomes a dloco learner.
 * One header, an API version, error codes fixed forever, no abort or exit, no signal handlers.
 *
 * A dloco run trains one model on many learners that meet only through a
 * synchronizer (dloco-sync): every learner trains its own copy of the model
 * with its own optimizer, and now and then pushes one fragment's progress
 * (the pseudo-gradient: the global fragment it last adopted minus its own)
 * and adopts the merged global fragment the synchronizer sends back. This
 * library is that learner side. The caller owns the model and the inner
 * optimizer; the library owns the sessions (one thread per synchronizer
 * shard), the push schedule, the encodings, error feedback, trust checks
 * and adopt rules. docs/LIBRARY.md is the guide; this header is the
 * reference.
 *
 * The life of a handle:
 *
 *     dloco_learner_opts o;
 *     dloco_learner_opts_init(&o);           // struct_size and defaults
 *     o.connect = "tcp://sync:5555"; o.run_id = "run1"; o.learner_id = "dc1-gpu0";
 *     o.fragments = 8; o.tensors = manifest; o.n_tensors = n; o.max_tokens_per_step = B * T;
 *     dloco_learner *l;
 *     if (dloco_learner_open(&o, &l)) { ... dloco_learner_errmsg(NULL) ... }
 *     dloco_learner_bind_host(l, tensor_pointers, n);   // or _bind_contiguous, _bind_callbacks
 *     dloco_learner_join(l, 30000);          // the global model overwrites the caller's parameters
 *     for (...) { optimizer_step(); dloco_learner_step(l, tokens, loss, -1, &info); }
 *     dloco_learner_finish(l, -1, "done");   // final pushes, their decisions, Bye
 *     dloco_learner_close(&l);
 *
 * The model is a manifest: an ordered list of fp32 tensors (name, 1-4 dims,
 * role). The synchronizer checks it (through the fingerprint of the
 * manifest and the fragment plan, both computed here and there) and refuses
 * a learner whose manifest differs. A GPT-2 in dloco's own layout
 * (dloco-learner's model) is one manifest, named by dloco_learner_opts.gpt2.
 *
 * Threading. A handle is not thread-safe: one thread at a time calls its
 * functions (call it the training thread), except dloco_learner_stop, which
 * any thread and any signal handler may call at any time. The library runs
 * one thread per synchronizer shard (started by join, ended by finish or
 * close); those threads never touch the caller's parameters. Parameters are
 * read and written only on the training thread, inside join, step and
 * finish: with host buffers directly, with callbacks by calling them. The
 * log callback is the one exception: it may be called from any library
 * thread, concurrently.
 *
 * What the caller guarantees (docs/LIBRARY.md has more):
 *   - parameters bound to a handle stay valid and are not written by anyone
 *     else while join, step or finish runs; step is called between optimizer
 *     steps, never during one;
 *   - the bound memory is the memory the model trains (a compiled or
 *     sharded copy the library cannot see must be synchronised by the
 *     caller after each call that reports a change);
 *   - the manifest, the fragments count and max_tokens_per_step are the
 *     same on every learner of a run (else the synchronizer refuses).
 *
 * Errors. Every function that can fail returns 0 (or a count >= 0) on
 * success and a negative DLOCO_E* code on failure; dloco_learner_errmsg says
 * what failed in words that name the thing and the fix. Out of memory is
 * DLOCO_ENOMEM, never an abort. A handle whose call failed with
 * DLOCO_ECALLBACK, DLOCO_ENOMEM or DLOCO_EREFUSED stays closable but can no
 * longer join or step (DLOCO_ESTATE).
 *
 * Binary compatibility: options and results are structs whose first field
 * struct_size is set by the caller to sizeof(the struct) as it knows it;
 * fields are only ever added at the end, so an older caller keeps working
 * with a newer library. The soname's number is the API's major version. */
#ifndef DLOCO_LEARNER_H
#define DLOCO_LEARNER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(DLOCO_LEARNER_BUILD)
#define DLOCO_API __attribute__((visibility("default")))
#else
#define DLOCO_API
#endif

/* ---- version */

/* The API this header describes. A major bump breaks callers (and the
 * soname); a minor one only adds. */
#define DLOCO_LEARNER_API_MAJOR 1
#define DLOCO_LEARNER_API_MINOR 2 /* 1: dloco_learner_opts.start_step; 2: dloco_learner_save_state, option state_path */
#define DLOCO_LEARNER_API_VERSION (DLOCO_LEARNER_API_MAJOR * 10000 + DLOCO_LEARNER_API_MINOR)

/* The DLOCO_LEARNER_API_VERSION the library was built with (major * 10000 +
 * minor). A binding checks that the major is the one it was written for and
 * the minor at least its own. */
DLOCO_API int32_t dloco_learner_api_version(void);

/* ---- error codes: the values are fixed forever (never renumbered, never reused) */

enum {
    DLOCO_OK = 0,
    DLOCO_EINVAL = -1,     /* bad argument, option or manifest (the message names it) */
    DLOCO_ENOMEM = -2,     /* out of memory */
    DLOCO_EIO = -3,        /* a file could not be read or written (options file, key file, events file) */
    DLOCO_EFORMAT = -4,    /* a file has the wrong format */
    DLOCO_ERANGE = -6,     /* a value outside its allowed range (e.g. a non-finite loss) */
    DLOCO_EMISMATCH = -7,  /* bound parameters do not match the manifest (count, size) */
    DLOCO_ENET = -10,      /* network failure: socket, connection lost for good, a session failed */
    DLOCO_EREFUSED = -11,  /* the synchronizer refused this learner (other model, run id, key, protocol):
                            * retrying cannot heal it */
    DLOCO_ETIMEDOUT = -15, /* join: no Welcome or initial fetch within the timeout (the message names
                            * the endpoint) */
    DLOCO_EPERM = -18,     /* a key file with unsafe permissions, or a key the synchronizer does not know */
    DLOCO_ESTATE = -19,    /* a call out of order: step before join, bind after join, anything after a
                            * failure that ended the handle */
    DLOCO_ESTOPPED = -20,  /* dloco_learner_stop was called: join gave up */
    DLOCO_ECALLBACK = -21  /* a parameter callback returned nonzero (its value is in the message) */
};

/* Fixed short text of a code ("invalid argument"); never NULL, also for codes it does not know. */
DLOCO_API const char *dloco_learner_strerror(int32_t code);

/* ---- the manifest */

/* Role of a tensor: how the synchronizer merges it (embeddings by a
 * weighted mean per element, the rest by radial-directional averaging) and
 * how dloco-learner's AdamW decays it. */
enum { DLOCO_ROLE_MATRIX = 0, DLOCO_ROLE_VECTOR = 1, DLOCO_ROLE_EMBEDDING = 2 };

#define DLOCO_TENSOR_MAX_DIMS 4
/* Longest tensor name, bytes without the NUL. */
#define DLOCO_TENSOR_NAME_MAX 127

/* One fp32 tensor of the model. A manifest is an array of these in the
 * order the tensors are laid out (the order a contiguous binding holds them,
 * and the order of fragment payloads). Names are unique, 1..DLOCO_TENSOR_NAME_MAX
 * bytes without a control byte; shape[0..ndim-1] >= 1, the rest ignored;
 * the whole model at most 2^40 floats. Big tensors are cut into fragments
 * by their first dim (rows). */
typedef struct {
    const char *name;
    int32_t ndim;     /* 1..DLOCO_TENSOR_MAX_DIMS */
    int32_t role;     /* DLOCO_ROLE_* */
    int64_t shape[DLOCO_TENSOR_MAX_DIMS];
} dloco_tensor;

/* dloco's GPT-2 (llm.c layout, dloco-learner's model). With opts.gpt2 set,
 * the manifest must be exactly this model's tensor table (dloco_learner_gpt2_manifest
 * writes it), and the learner joins runs of dloco-learners: same Hello,
 * same fingerprint. */
typedef struct {
    int32_t n_layer, n_head, n_embd, seq_len, vocab;
} dloco_gpt2_config;

/* ---- opening */

enum { DLOCO_LOG_DEBUG = 0, DLOCO_LOG_INFO = 1, DLOCO_LOG_WARN = 2, DLOCO_LOG_ERROR = 3 };

/* A log line (logfmt, no newline) of `level`. May be called from any library
 * thread, concurrently; must not call back into the library. */
typedef void (*dloco_log_fn)(void *ctx, int32_t level, const char *line);

typedef struct {
    uint32_t struct_size;        /* sizeof(dloco_learner_opts) as the caller knows it */
    /* The synchronizer: "tcp://host:port", or a sharded synchronizer's shards'
     * endpoints comma-separated in shard order (one session each). */
    const char *connect;
    const char *run_id;          /* must be the synchronizer's */
    /* [A-Za-z0-9._-]{1,64}, unique in the run; NULL or "" = <hostname>-<pid> */
    const char *learner_id;
    int32_t fragments;           /* P: the model is pushed in P fragments (1..4096, at most the tensors' count
                                  * unless big tensors are split); the same on every learner */
    const dloco_tensor *tensors; /* the manifest, n_tensors entries (copied by open) */
    int32_t n_tensors;
    /* The most tokens one step processes (a push of s steps claims at most
     * s * this many); the synchronizer's guards hold the learner to it. */
    uint64_t max_tokens_per_step;
    /* NULL, or the GPT-2 config the manifest is (see dloco_gpt2_config). */
    const dloco_gpt2_config *gpt2;
    /* NULL, or an INI file with the networked options (keys as dloco-learner's
     * rows: adopt, alpha, push_codec, push_block, push_topk, push_rounding,
     * error_feedback, flush_timeout_ms, connect_timeout_ms, the hello/silence/
     * reconnect timing rows, push_decision_timeout_ms, update_max_ratio,
     * max_version_jump, server_key, key_file, metrics, events, log_level;
     * docs/LIBRARY.md lists them with defaults). dloco_learner_set_option
     * sets one of them. */
    const char *config_path;
    dloco_log_fn log;            /* NULL = lines go to stderr */
    void *log_ctx;
    const char *device;          /* Hello.device, e.g. "cuda:0 H100"; NULL = "cpu" */
    /* A caller that resumed its own training from its own saved state (its
     * optimizer state and step, e.g. torch.save: docs/LIBRARY.md "Restarts"):
     * the step it resumes at. The library counts on from it (the push
     * schedule's phase, the progress the Hello and Heartbeats report, so the
     * synchronizer's ledger counts its tokens from there). 0 = a fresh start;
     * negative: DLOCO_EINVAL. */
    int64_t start_step;
} dloco_learner_opts;

/* Zero *o and fill struct_size and the defaults (everything NULL/0). */
DLOCO_API void dloco_learner_opts_init(dloco_learner_opts *o);

typedef struct dloco_learner dloco_learner;

/* Check the options and the manifest, build the fragment plan and the
 * fingerprint, read the options file. Nothing touches the network yet.
 * Returns 0 and *out, or (with *out NULL):
 *   DLOCO_EINVAL   a missing or bad option or option row; a bad manifest: none, a NULL or duplicate
 *                  or too long name, ndim outside 1..4, a dim < 1, an unknown role, a GPT-2 manifest
 *                  that is not the table of opts.gpt2 (the message names the first differing tensor);
 *                  P outside what the manifest allows
 * A manifest that is not opts.gpt2's travels in the Hello (with max_tokens_per_step); the synchronizer
 * must run that manifest (dloco-sync --manifest / --init_from, docs/OPERATING.md), else it refuses the
 * learner at join naming the first differing tensor.
 *   DLOCO_EIO      the options file, a key file or the events file cannot be read / written
 *   DLOCO_EPERM    a key file readable by others
 *   DLOCO_ENOMEM
 * With opts.log set, the callback receives the process's library log lines
 * from here on (one sink per process: the handle opened last sets it; close
 * restores stderr). */
DLOCO_API int dloco_learner_open(const dloco_learner_opts *o, dloco_learner **out);

/* Stop the sessions (no Bye unless finish ran), free everything, NULL *l.
 * Safe on NULL and twice. Bound buffers are the caller's and untouched. */
DLOCO_API void dloco_learner_close(dloco_learner **l);

/* The message of the last failure: of this handle's last failed call, or
 * with l NULL, of the calling thread's last failed call (dloco_learner_open
 * included). "" when none. Valid until the next call on the handle/thread. */
DLOCO_API const char *dloco_learner_errmsg(const dloco_learner *l);

/* One networked option by name (the rows of opts.config_path), before join.
 * Returns 0, DLOCO_EINVAL (unknown name, bad value), DLOCO_ERANGE (out of
 * bounds) or DLOCO_ESTATE (after join). */
DLOCO_API int dloco_learner_set_option(dloco_learner *l, const char *name, const char *value);

/* ---- the fragment plan (read-only, from open on) */

DLOCO_API int32_t dloco_learner_fragments(const dloco_learner *l);      /* P */
DLOCO_API uint64_t dloco_learner_fingerprint(const dloco_learner *l);   /* what the Hello carries */
DLOCO_API uint64_t dloco_learner_numel(const dloco_learner *l);         /* floats of the whole model */
DLOCO_API uint64_t dloco_learner_fragment_numel(const dloco_learner *l, int32_t fragment); /* 0 when out of range */

/* Fragment p's payload is its spans concatenated in this order: span i of
 * fragment p is elements [start, start + numel) of tensor `tensor` (flat,
 * row-major), at payload offset `offset`. */
typedef struct {
    int32_t tensor;   /* index into the manifest */
    int32_t fragment;
    uint64_t start;   /* first element within the tensor (a multiple of its row size) */
    uint64_t numel;
    uint64_t offset;  /* within the fragment payload, floats */
} dloco_span;
/* Spans of fragment p (>= 1), or DLOCO_EINVAL for a bad fragment. */
DLOCO_API int32_t dloco_learner_fragment_nspans(const dloco_learner *l, int32_t fragment);
DLOCO_API int dloco_learner_fragment_span(const dloco_learner *l, int32_t fragment, int32_t i, dloco_span *out);

/* dloco's GPT-2 manifest for `cfg` into out[0..cap): returns the tensor
 * count (call with cap 0 to size), or DLOCO_EINVAL for a config outside
 * dloco's bounds. Names point at storage inside the library, valid until
 * the next call of this function on any thread. */
DLOCO_API int32_t dloco_learner_gpt2_manifest(const dloco_gpt2_config *cfg, dloco_tensor *out, int32_t cap);

/* ---- binding the parameters (exactly one binding, before join) */

/* Host fp32 buffers, zero copy: tensors[i] points at manifest tensor i's
 * elements (row-major, contiguous); n must be the manifest's n_tensors.
 * Returns 0, DLOCO_EINVAL (a NULL pointer), DLOCO_EMISMATCH (n differs),
 * DLOCO_ESTATE (already bound or joined), DLOCO_ENOMEM. */
DLOCO_API int dloco_learner_bind_host(dloco_learner *l, float *const *tensors, int32_t n);
/* One host buffer holding every tensor in manifest order, numel floats
 * (must be dloco_learner_numel). Same returns as bind_host. */
DLOCO_API int dloco_learner_bind_contiguous(dloco_learner *l, float *params, uint64_t numel);

/* Callbacks, for parameters the library cannot address (GPU memory, a
 * remote or sharded model). Each returns 0, or nonzero to fail the call in
 * progress with DLOCO_ECALLBACK. All run on the training thread, inside
 * join, step and finish. Payloads are fragment payloads (dloco_span order). */
typedef struct {
    uint32_t struct_size; /* sizeof(dloco_param_callbacks) */
    void *ctx;
    /* 1: read_begin may return before the copy is done; the library then
     * completes a push one step later (read_end at the next step), so the
     * copy overlaps the next optimizer step. 0: read_end follows read_begin
     * at once. */
    int32_t deferred;
    /* Snapshot fragment p's parameters as they are now. */
    int32_t (*read_begin)(void *ctx, int32_t fragment);
    /* Wait for that snapshot; *values = host memory holding its
     * fragment_numel floats, valid until the next read_begin of p. */
    int32_t (*read_end)(void *ctx, int32_t fragment, const float **values);
    /* theta_p = a*theta_p + b*in (a == 0: theta_p is not read); `in` is
     * fragment_numel host floats, valid only during the call; the next
     * read_begin must see the result. */
    int32_t (*apply)(void *ctx, int32_t fragment, float a, float b, const float *in);
} dloco_param_callbacks;
/* Returns 0, DLOCO_EINVAL (a NULL function, bad struct_size), DLOCO_ESTATE, DLOCO_ENOMEM. */
DLOCO_API int dloco_learner_bind_callbacks(dloco_learner *l, const dloco_param_callbacks *cb);

/* ---- running */

/* Connect to every shard, say Hello, fetch the global model and make it the
 * caller's: every fragment is applied (theta = global) before this returns.
 * Waits at most timeout_ms (<= 0: the connect_timeout_ms option, 30000 by
 * default; that option at 0: no bound, it keeps trying and warns every 10 s
 * until dloco_learner_stop). Returns 0, or
 *   DLOCO_ETIMEDOUT  no Welcome or fetch in time: the message names the endpoint(s) still silent
 *   DLOCO_EREFUSED   the synchronizer refused (its reason is in the message: another model,
 *                    run id, duplicate id, unknown key ...)
 *   DLOCO_ENET       a session could not start or failed (socket, connect timeout)
 *   DLOCO_ESTOPPED   dloco_learner_stop was called
 *   DLOCO_ESTATE     not bound, or joined already
 *   DLOCO_ECALLBACK, DLOCO_ENOMEM, DLOCO_EINVAL (options that need the network checked late: metrics
 *                    address, events file)
 * After a failure the handle can only be closed. */
DLOCO_API int dloco_learner_join(dloco_learner *l, int32_t timeout_ms);

/* What one dloco_learner_step did. */
typedef struct {
    uint32_t struct_size;    /* sizeof(dloco_step_info) */
    int32_t pushes;          /* pushes made (or begun, deferred callbacks) after this step */
    int32_t adopted;         /* fragments whose parameters the library changed in this call */
    int32_t barrier_waited;  /* 1 when the call waited at a barrier (policy sync / sync-elastic) */
    double barrier_wait_s;   /* wall seconds of that wait */
    uint64_t step;           /* steps counted so far (this one included) */
    int32_t stop_requested;  /* 1 once dloco_learner_stop was called */
    int32_t h;               /* H, the inner steps between pushes of one fragment (from the synchronizer) */
    /* library-owned, valid until the next step / finish / close: fragment_changed[p] (P bytes) and
     * tensor_changed[i] (n_tensors bytes) are 1 where this call changed parameters */
    const uint8_t *fragment_changed;
    const uint8_t *tensor_changed;
} dloco_step_info;

/* Call once after each optimizer step, on the training thread, with the
 * step's tokens (1..max_tokens_per_step) and training loss (finite), and
 * compute_s the step's wall seconds (< 0: the library measures the time
 * since the previous call returned). It counts the step, pushes every
 * fragment the schedule makes due (the push itself leaves on a session
 * thread), adopts every global fragment that has arrived -- in place, now,
 * with the adopt rule of the `adopt` option -- and, only under a barrier
 * policy, waits until the previous push of a due fragment is decided. It
 * never blocks on the network otherwise. `out` may be NULL. Returns 0, or
 *   DLOCO_EINVAL / DLOCO_ERANGE  tokens or loss out of range (nothing counted)
 *   DLOCO_EREFUSED  the synchronizer refused this learner since (message says why): stop training
 *   DLOCO_ENET      a session failed for good
 *   DLOCO_ECALLBACK, DLOCO_ESTATE (not joined, or finished) */
DLOCO_API int dloco_learner_step(dloco_learner *l, uint64_t tokens, double loss, double compute_s,
                                 dloco_step_info *out);

/* End of training: push every fragment with progress (final), wait up to
 * timeout_ms (< 0: the flush_timeout_ms option, 10000 by default) for their
 * decisions and updates (adopting them: parameters may change), say Bye
 * with `reason` (NULL = "done") and stop the sessions. Returns the number of
 * fragments whose final push got no answer in time (0 = a complete flush),
 * or DLOCO_ECALLBACK / DLOCO_ESTATE (not joined; finish twice). */
DLOCO_API int dloco_learner_finish(dloco_learner *l, int32_t timeout_ms, const char *reason);

/* Ask the handle to stop: a join in progress returns DLOCO_ESTOPPED, a
 * barrier wait ends, later steps report stop_requested. Async-signal-safe,
 * from any thread; finish still flushes. */
DLOCO_API void dloco_learner_stop(dloco_learner *l);

/* ---- restarts (docs/LIBRARY.md "Restarts") */
/* Save the learner's own state to the option state_path (atomically: a
 * temporary file, fsync, rename): per fragment the version held, the base
 * its unpushed progress is measured from, and the counters of that
 * progress. Call it on the training thread, between steps, when the caller
 * saves its parameters and optimizer state at the same step. A process
 * started again with those parameters, opts.start_step = that step and the
 * same state_path restores it at join: it keeps the versions it held (it
 * fetches only the fragments merged since, and adopts them in its adopt
 * mode, instead of the whole model) and its pushes carry the progress it
 * had not pushed, counted once by the synchronizer. The file it replaces
 * is kept as state_path.prev: a process killed between this call and its
 * own checkpoint of the step restarts at the previous step, and join then
 * restores state_path.prev. A state of another model, run, learner id or
 * step (and no previous one at start_step), a damaged or truncated one, is refused at
 * join with a warning (a `state_refused` event; the file is moved aside to
 * state_path.rejected) and the learner fetches the global model as a fresh
 * one does. The library keeps a small push journal at state_path.journal
 * (8 bytes per fragment, written at each push) so that progress pushed
 * after the save is not carried again. Returns 0, DLOCO_EINVAL (no
 * state_path), DLOCO_ESTATE (not joined), DLOCO_EIO, DLOCO_ENOMEM. */
DLOCO_API int dloco_learner_save_state(dloco_learner *l);

/* ---- statistics */

enum { DLOCO_STATE_OPEN = 0, DLOCO_STATE_JOINING = 1, DLOCO_STATE_READY = 2, DLOCO_STATE_REFUSED = 3,
       DLOCO_STATE_FAILED = 4, DLOCO_STATE_DONE = 5 };

typedef struct {
    uint32_t struct_size;     /* sizeof(dloco_learner_stats) as the caller knows it */
    int32_t state;            /* DLOCO_STATE_* */
    uint64_t steps, tokens;   /* counted by dloco_learner_step */
    uint64_t pushes;          /* pushes sent (all sessions) */
    uint64_t push_bytes;      /* their payload bytes, as encoded */
    uint64_t accepted, dropped_stale, rejected; /* final decisions of pushes */
    uint64_t coalesced;       /* pushes replaced by a newer push of the fragment before they left */
    uint64_t adopted;         /* updates adopted in the adopt mode (rebases not included) */
    uint64_t rebased;         /* forced adoptions: the initial fetch, after a dropped push */
    uint64_t ignored;         /* updates not newer than what was held */
    uint64_t refused;         /* updates refused (non-finite, too far from the learner's parameters) */
    uint64_t held;            /* due pushes held while the previous one was undecided */
    uint64_t hold_released;   /* holds released by the decision timeout */
    uint64_t barrier_waits;
    double barrier_wait_s;
    uint64_t bytes_sent, bytes_received;
    uint64_t rehellos, rebuilds;
    uint64_t epoch;           /* largest synchronizer epoch seen */
    uint32_t h;               /* H from the last Welcome */
    int32_t flush_unanswered; /* finish's result, -1 before finish */
} dloco_learner_stats;

/* Fill *out (up to out->struct_size bytes). Training thread only. Returns 0
 * or DLOCO_EINVAL (struct_size too small for the first field). */
DLOCO_API int dloco_learner_get_stats(const dloco_learner *l, dloco_learner_stats *out);

#ifdef __cplusplus
}
#endif

#endif
