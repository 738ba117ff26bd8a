/* swarm: N simulated learners in one process against a real dloco-sync, for load benchmarks
 * (bench/sync_load.sh) and tests/test_swarm.sh, test_load.sh: each one a handle of the public learner API.
 *
 * Each simulated learner is one dloco_learner handle (include/dloco/learner.h,
 * the library every learner uses): its own sessions (a DEALER and a thread
 * per synchronizer shard), learner id (e.g. swarm-000), push schedule, hold
 * rule, adopt and final flush -- the library's, not a copy. It joins as
 * dloco-learner does: the GPT-2 manifest of the model rows (opts.gpt2), so its
 * Hello is a GPT learner's with Hello.batch = --batch. Only the training is
 * fake, and one driver thread plays the training thread of every learner:
 *   - the learners join together (one short-lived thread per join, since
 *     dloco_learner_join blocks until the initial fetch), then the driver
 *     owns every handle;
 *   - --mode schedule: a learner "steps" at --rate steps/s (each interval
 *     stretched by 1 + jitter x U(-1, 1)); each step is one
 *     dloco_learner_step(batch x seq_len tokens, loss 3.0), which pushes
 *     what the library's schedule makes due (H from the Welcome), holds a
 *     push while the previous push of its fragment is undecided, and
 *     adopts (overwrite) what has arrived;
 *   - --mode b2b: a capacity load as close as the API allows: every joined
 *     learner steps once per --tick_ms, so every fragment is due every H
 *     ticks and, under the library's hold rule, is pushed again at the first
 *     step after its previous push is decided (Ack, and the Update adopted).
 *     The API has no "push now" and no in-flight window: a learner has at
 *     most P pushes in flight, one per fragment;
 *   - at --duration every learner finishes at once (final flush, at most
 *     --flush_timeout_ms for the decisions, Bye "done").
 *
 * The parameters: the callbacks binding over ONE model for the whole swarm.
 * theta of every learner is defined as shared + noise: `shared` holds, per
 * fragment, the global fragment some learner adopted last (apply writes it:
 * theta_p = a * theta_p + b * in on the shared copy), and read_end hands the
 * library shared_p + a fixed pseudo-random perturbation (uniform in
 * [-delta_scale, delta_scale], one source for all) in a scratch buffer, so a
 * learner that adopted the newest global pushes about -noise. The scratch
 * is per thread (the driver's serves every step; each finishing thread has
 * its own): the library consumes read_end's values within the call, as the
 * non-deferred binding promises, so handles on one thread may share it.
 *
 * Memory. The swarm's own: one model (shared) + one largest fragment (the
 * noise) + one largest fragment per thread that reads (scratch). Each
 * simulated learner costs what the library costs any learner in overwrite
 * mode with fp32 pushes (docs/LIBRARY.md "Host memory per parameter"): base
 * copies (4 B per parameter, written at the initial fetch), push and update
 * slots of the mailbox (up to 8 B per parameter as they rotate; their
 * address space is 2P + 2 buffers of the largest fragment), fragment
 * scratch, and libzmq's copies of messages in flight. For GPT-2 124M that is
 * about 12 B x 124M = 1.5 GB per learner: the public API keeps a learner's
 * base copies in the library, so N learners are N base copies; the JSON's
 * memory_mb.per_learner reports the measured figure.
 *
 * Timing. The API does not time single pushes, so every handle writes its
 * sessions' events (docs/EVENTS.md: push when a Push was handed to ZeroMQ,
 * ack when an Ack arrived, update when an Update arrived; wall-clock ns) to
 * --events (a temporary file when empty), read back at the end: per
 * (learner, fragment) at most one push is in flight, so a push is matched
 * with the acks and update of its fragment that echo its base version:
 *   ack_ms       push -> its immediate Ack (MERGED_PENDING, DROPPED_STALE or REJECTED)
 *   decision_ms  push -> its final decision (ACCEPTED for a pooled push: the
 *                round merged and committed; else the immediate Ack)
 *   update_ms    push -> the merged Update of an accepted push (what the hold rule waits for)
 * over pushes sent after --warmup seconds.
 *
 * Output: a line per learner (up to 32 learners), then one JSON line (also
 * written to --json). Exit 0 when the run completed (whatever it measured),
 * 2 on a setup failure. */
#define _GNU_SOURCE
#include "core/clock.h"
#include "core/config.h"
#include "core/model.h"
#include "core/rng.h"
#include "dloco/learner.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// config

typedef struct {
    char endpoint[DL_CFG_STRLEN], run_id[DL_CFG_STRLEN], id_prefix[DL_CFG_STRLEN];
    char mode[DL_CFG_STRLEN], json[DL_CFG_STRLEN], events[DL_CFG_STRLEN], log_level[DL_CFG_STRLEN];
    int64_t learners, batch, seed, tick_ms, hold_timeout_ms, connect_timeout_ms, flush_timeout_ms;
    double duration, warmup, rate, jitter, delta_scale;
    dl_model_opts model;
} swarm_cfg;

#define F(x) offsetof(swarm_cfg, x)
static const dl_cfg_entry table[] = {
    {"endpoint", DL_CFG_STR, F(endpoint), 0, 0, "tcp://127.0.0.1:5555", NULL, 0,
     "the synchronizer's endpoint; a sharded one: its shards' endpoints, comma-separated in shard order (each "
     "learner then holds one session per shard, as dloco-learner does)"},
    {"run_id", DL_CFG_STR, F(run_id), 0, 0, "dloco", NULL, 0, "run id, must match the synchronizer's"},
    {"id_prefix", DL_CFG_STR, F(id_prefix), 0, 0, "swarm-", NULL, 0, "learner ids are this + 000, 001, ..."},
    {"learners", DL_CFG_INT, F(learners), 1, 4096, "4", NULL, 0, "simulated learners (N)"},
    {"duration", DL_CFG_FLOAT, F(duration), 0.1, 86400, "30", NULL, 0, "seconds from the start until the finish"},
    {"warmup", DL_CFG_FLOAT, F(warmup), 0, 86400, "0", NULL, 0,
     "latencies count pushes sent this many seconds after the start or later"},
    {"mode", DL_CFG_ENUM, F(mode), 0, 0, "schedule", "schedule|b2b", 0,
     "schedule: a step every 1/rate s, the library's push schedule; b2b: a step every tick, so each fragment is "
     "pushed again at the first step after its push is decided"},
    DL_MODEL_CFG_ROWS(swarm_cfg, model, "256", "model: vocabulary (V)"),
    {"batch", DL_CFG_INT, F(batch), 1, 65536, "16", NULL, 0,
     "sequences per step (Hello.batch; tokens per step = batch x seq_len)"},
    {"rate", DL_CFG_FLOAT, F(rate), 0.001, 100000, "1", NULL, 0, "schedule: fake training steps per second per learner"},
    {"jitter", DL_CFG_FLOAT, F(jitter), 0, 0.99, "0", NULL, 0, "each step interval times 1 + jitter x U(-1, 1)"},
    {"delta_scale", DL_CFG_FLOAT, F(delta_scale), 0, 1, "1e-4", NULL, 0,
     "a learner's parameters are the shared global plus noise uniform in [-this, this]"},
    {"seed", DL_CFG_INT, F(seed), 0, 9.2e18, "7", NULL, 0, "seed of the noise and the jitter"},
    {"tick_ms", DL_CFG_INT, F(tick_ms), 1, 1000, "2", NULL, 0,
     "the driver visits every learner this often (b2b: one step per visit)"},
    {"hold_timeout_ms", DL_CFG_INT, F(hold_timeout_ms), 1, 86400000, "30000", NULL, 0,
     "a held push goes anyway after its predecessor is undecided this long (the library's push_decision_timeout_ms)"},
    {"connect_timeout_ms", DL_CFG_INT, F(connect_timeout_ms), 100, 86400000, "60000", NULL, 0,
     "a learner without its Welcome and initial fetch this long fails"},
    {"flush_timeout_ms", DL_CFG_INT, F(flush_timeout_ms), 0, 3600000, "30000", NULL, 0,
     "at the end, each learner waits this long for the decisions of its final pushes, then says Bye"},
    {"json", DL_CFG_STR, F(json), 0, 0, "", NULL, 0, "also write the JSON summary to this file"},
    {"events", DL_CFG_STR, F(events), 0, 0, "", NULL, 0,
     "the sessions' events file (read back for latencies); empty = a temporary file, removed at the end"},
    {"log_level", DL_CFG_ENUM, F(log_level), 0, 0, "warn", "debug|info|warn|error", 0, "log verbosity"},
};
#undef F
#define NCFG (sizeof table / sizeof table[0])

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

// ----------------------------------------------------------------------------
// the shared parameters: one model for every learner, and the noise

typedef struct {
    pthread_mutex_t mu; /* apply and read_end may run on the finishing threads at once */
    int P;
    uint64_t numel, maxn;
    uint64_t *off;      /* [P] fragment p's payload at shared + off[p] */
    float *shared;      /* [numel] per fragment, the global some learner adopted last (payload order) */
    float *noise;       /* [maxn] uniform in [-delta_scale, delta_scale] */
} params;

/* The reading thread's scratch, maxn floats (allocated on first use, freed by its thread). */
static _Thread_local float *scratch;

typedef struct learner learner;

static int cb_read_begin(void *ctx, int32_t p)
{
    (void)ctx;
    (void)p;
    return 0;
}

static int32_t cb_read_end(void *ctx, int32_t p, const float **values);
static int32_t cb_apply(void *ctx, int32_t p, float a, float b, const float *in);

// ----------------------------------------------------------------------------
// one simulated learner

enum { L_OPEN = 0, L_JOINING, L_READY, L_FAILED, L_DONE };

struct learner {
    char id[DL_CFG_STRLEN + 16];
    params *pm;
    dloco_learner *h;
    int state;                /* L_* */
    pthread_t thr;            /* join, then finish */
    int thr_live;
    atomic_int thr_done;
    int rc;                   /* of the thread's call */
    char err[512];            /* its message */
    int64_t join_ns;          /* monotonic; 0 = not joined */
    int64_t next_step_ns;
    dl_rng rng;
    uint64_t pooled;          /* acks merged_pending, from the events */
    int flush_unanswered;
    dloco_learner_stats st;   /* at the end */
};

static int32_t cb_read_end(void *ctx, int32_t p, const float **values)
{
    params *pm = ((learner *)ctx)->pm;
    if (!scratch && !(scratch = malloc(pm->maxn * sizeof(float)))) return -1;
    uint64_t n = pm->off[p + 1] - pm->off[p];
    const float *s = pm->shared + pm->off[p];
    pthread_mutex_lock(&pm->mu);
    for (uint64_t i = 0; i < n; i++) scratch[i] = s[i] + pm->noise[i];
    pthread_mutex_unlock(&pm->mu);
    *values = scratch;
    return 0;
}

static int32_t cb_apply(void *ctx, int32_t p, float a, float b, const float *in)
{
    params *pm = ((learner *)ctx)->pm;
    uint64_t n = pm->off[p + 1] - pm->off[p];
    float *s = pm->shared + pm->off[p];
    pthread_mutex_lock(&pm->mu);
    if (a == 0.0f && b == 1.0f) memcpy(s, in, n * sizeof(float));
    else if (a == 0.0f)
        for (uint64_t i = 0; i < n; i++) s[i] = b * in[i];
    else
        for (uint64_t i = 0; i < n; i++) s[i] = a * s[i] + b * in[i];
    pthread_mutex_unlock(&pm->mu);
    return 0;
}

typedef struct {
    swarm_cfg cfg;
    dloco_gpt2_config gpt;
    dloco_tensor *man;
    int nt, P, N, b2b;
    uint64_t tps;             /* tokens per step */
    params pm;
    learner *l;               /* [N] */
    int64_t t0_ns, t0_wall_ns;
    char events[DL_CFG_STRLEN];
} swarm;

static int64_t step_interval_ns(swarm *s, learner *L)
{
    double u = 2.0 * (double)dl_rng_uniform(&L->rng) - 1.0;
    return (int64_t)(1e9 / s->cfg.rate * (1.0 + s->cfg.jitter * u));
}

static int say(const char *id, const char *what, int rc, const char *msg)
{
    fprintf(stderr, "swarm: %s: %s: %s%s%s\n", id, what, dloco_learner_strerror(rc), msg && msg[0] ? ": " : "",
            msg ? msg : "");
    return rc;
}

/* Open, configure and bind learner i (nothing on the network yet). */
static int learner_open(swarm *s, int i, learner *L)
{
    snprintf(L->id, sizeof L->id, "%s%03d", s->cfg.id_prefix, i);
    L->pm = &s->pm;
    dl_rng_seed(&L->rng, (uint64_t)s->cfg.seed * 1000003u + (uint64_t)i);
    dloco_learner_opts o;
    dloco_learner_opts_init(&o);
    o.connect = s->cfg.endpoint;
    o.run_id = s->cfg.run_id;
    o.learner_id = L->id;
    o.fragments = (int32_t)s->cfg.model.fragments;
    o.tensors = s->man;
    o.n_tensors = s->nt;
    o.max_tokens_per_step = s->tps;
    o.gpt2 = &s->gpt;
    o.device = "swarm";
    int rc = dloco_learner_open(&o, &L->h);
    if (rc) return say(L->id, "open", rc, dloco_learner_errmsg(NULL));
    char v[3][32];
    snprintf(v[0], sizeof v[0], "%lld", (long long)s->cfg.hold_timeout_ms);
    snprintf(v[1], sizeof v[1], "%lld", (long long)s->cfg.connect_timeout_ms);
    snprintf(v[2], sizeof v[2], "%lld", (long long)s->cfg.flush_timeout_ms);
    /* overwrite: theta_p = g at every adopt, so the shared copy is the global (see the parameters above);
     * bye_linger_ms: every learner finishes at once, so a Bye may queue behind the final pushes of all of
     * them (GPT-2: P x 20 MB each); the library's 1 s would drop it and the synchronizer declare a death */
    const char *opt[][2] = {{"adopt", "overwrite"},         {"push_decision_timeout_ms", v[0]},
                            {"connect_timeout_ms", v[1]},    {"flush_timeout_ms", v[2]},
                            {"bye_linger_ms", "10000"},      {"log_level", s->cfg.log_level},
                            {"events", s->events}};
    for (size_t k = 0; k < sizeof opt / sizeof opt[0]; k++)
        if ((rc = dloco_learner_set_option(L->h, opt[k][0], opt[k][1])))
            return say(L->id, opt[k][0], rc, dloco_learner_errmsg(L->h));
    dloco_param_callbacks cb = {.struct_size = sizeof cb, .ctx = L, .deferred = 0, .read_begin = cb_read_begin,
                                .read_end = cb_read_end, .apply = cb_apply};
    if ((rc = dloco_learner_bind_callbacks(L->h, &cb))) return say(L->id, "bind", rc, dloco_learner_errmsg(L->h));
    return 0;
}

static void *join_main(void *arg)
{
    learner *L = arg;
    L->rc = dloco_learner_join(L->h, 0); /* 0: the connect_timeout_ms option */
    if (L->rc) snprintf(L->err, sizeof L->err, "%s", dloco_learner_errmsg(L->h));
    atomic_store(&L->thr_done, 1);
    return NULL;
}

static void *finish_main(void *arg)
{
    learner *L = arg;
    L->rc = dloco_learner_finish(L->h, -1, "done"); /* -1: the flush_timeout_ms option */
    if (L->rc < 0) snprintf(L->err, sizeof L->err, "%s", dloco_learner_errmsg(L->h));
    free(scratch);
    scratch = NULL;
    atomic_store(&L->thr_done, 1);
    return NULL;
}

/* Start fn(L) on a thread of its own (a small stack: a swarm may hold thousands). */
static int spawn(learner *L, void *(*fn)(void *))
{
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 256u << 10);
    atomic_store(&L->thr_done, 0);
    int e = pthread_create(&L->thr, &a, fn, L);
    pthread_attr_destroy(&a);
    if (e) {
        snprintf(L->err, sizeof L->err, "cannot start a thread: %s", strerror(e));
        return -1;
    }
    L->thr_live = 1;
    return 0;
}

static void reap(learner *L)
{
    if (!L->thr_live) return;
    pthread_join(L->thr, NULL);
    L->thr_live = 0;
}

/* One fake step of a joined learner. */
static void step(swarm *s, learner *L)
{
    dloco_step_info info = {.struct_size = sizeof info};
    double compute_s = s->b2b ? -1.0 : 1.0 / s->cfg.rate; /* b2b: the library measures the time since the last */
    int rc = dloco_learner_step(L->h, s->tps, 3.0, compute_s, &info);
    if (rc) {
        say(L->id, "step", rc, dloco_learner_errmsg(L->h));
        L->state = L_FAILED;
    }
}

// ----------------------------------------------------------------------------
// memory of this process

typedef struct {
    double rss, hwm, anon; /* MiB */
} memstat;

static void mem_read(memstat *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        double kb = 0;
        if (sscanf(line, "VmRSS: %lf", &kb) == 1) m->rss = kb / 1024;
        else if (sscanf(line, "VmHWM: %lf", &kb) == 1) m->hwm = kb / 1024;
        else if (sscanf(line, "RssAnon: %lf", &kb) == 1) m->anon = kb / 1024;
    }
    fclose(f);
}

// ----------------------------------------------------------------------------
// latencies from the sessions' events

typedef struct {
    double *v;
    size_t n, cap;
} series;

static void series_add(series *s, double x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v) return; /* a latency less: the summary says how many it has */
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of the sorted series; NAN when empty. */
static double pct(const series *s, double q)
{
    if (!s->n) return NAN;
    size_t k = (size_t)ceil(q * (double)s->n);
    return s->v[k ? k - 1 : 0];
}

/* What one (learner, fragment) push in flight has seen so far. */
enum { PS_NONE = 0, PS_SENT, PS_POOLED, PS_WAIT_UPDATE };
typedef struct {
    int state;
    uint64_t base, merged;
    int64_t ts;  /* push event, wall ns */
    int counted; /* sent after the warm-up */
} pushrec;

typedef struct {
    series ack, decision, update;
    uint64_t pushes_seen, acks_unmatched;
} latencies;

/* The value of key `k` in logfmt line `s` (bare values only) into buf. */
static int lf_get(const char *s, const char *k, char *buf, size_t cap)
{
    size_t kl = strlen(k);
    for (const char *p = s; (p = strstr(p, k)) != NULL; p += kl) {
        if ((p != s && p[-1] != ' ') || p[kl] != '=') continue;
        const char *v = p + kl + 1;
        size_t n = strcspn(v, " \n");
        if (n >= cap) n = cap - 1;
        memcpy(buf, v, n);
        buf[n] = 0;
        return 1;
    }
    return 0;
}

static uint64_t lf_u64(const char *s, const char *k)
{
    char b[64];
    return lf_get(s, k, b, sizeof b) ? strtoull(b, NULL, 10) : 0;
}

/* Learner index of an id this swarm gave out, -1 otherwise. */
static int learner_index(const swarm *s, const char *id)
{
    size_t pl = strlen(s->cfg.id_prefix);
    if (strncmp(id, s->cfg.id_prefix, pl) != 0) return -1;
    char *end = NULL;
    long i = strtol(id + pl, &end, 10);
    if (end == id + pl || *end || i < 0 || i >= s->N) return -1;
    return strcmp(s->l[i].id, id) == 0 ? (int)i : -1;
}

static void read_latencies(swarm *s, const char *path, latencies *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    pushrec *r = calloc((size_t)s->N * (size_t)s->P, sizeof *r);
    if (!f || !r) {
        fprintf(stderr, "swarm: cannot read the events file %s: %s\n", path, f ? "out of memory" : strerror(errno));
        if (f) fclose(f);
        free(r);
        return;
    }
    int64_t cutoff = s->t0_wall_ns + (int64_t)(s->cfg.warmup * 1e9);
    char mypid[32], ev[32], id[160], dec[32], line[4200];
    snprintf(mypid, sizeof mypid, "%d", (int)getpid());
    while (fgets(line, sizeof line, f)) {
        char pid[32];
        if (!lf_get(line, "pid", pid, sizeof pid) || strcmp(pid, mypid) || !lf_get(line, "event", ev, sizeof ev) ||
            !lf_get(line, "learner", id, sizeof id))
            continue;
        int li = learner_index(s, id);
        uint64_t p = lf_u64(line, "fragment");
        if (li < 0 || p >= (uint64_t)s->P) continue;
        pushrec *pr = &r[(size_t)li * (size_t)s->P + p];
        int64_t ts = (int64_t)lf_u64(line, "ts");
        double ms = (double)(ts - pr->ts) * 1e-6;
        if (!strcmp(ev, "push")) {
            *pr = (pushrec){.state = PS_SENT, .base = lf_u64(line, "base_version"), .ts = ts, .counted = ts >= cutoff};
            out->pushes_seen++;
        } else if (!strcmp(ev, "ack") && lf_get(line, "decision", dec, sizeof dec)) {
            uint64_t base = lf_u64(line, "base_version");
            if (!strcmp(dec, "merged_pending")) s->l[li].pooled++;
            if (pr->state == PS_NONE || base != pr->base) {
                out->acks_unmatched++;
                continue;
            }
            int immediate = !strcmp(dec, "merged_pending") || !strcmp(dec, "dropped_stale") || !strcmp(dec, "rejected");
            if (pr->state == PS_SENT && immediate) {
                if (pr->counted) series_add(&out->ack, ms);
                if (!strcmp(dec, "merged_pending")) {
                    pr->state = PS_POOLED;
                } else {
                    if (pr->counted) series_add(&out->decision, ms);
                    pr->state = PS_NONE;
                }
            } else if (pr->state == PS_POOLED && !strcmp(dec, "accepted")) {
                if (pr->counted) series_add(&out->decision, ms);
                pr->merged = lf_u64(line, "merged_version");
                pr->state = PS_WAIT_UPDATE;
            } else if (pr->state == PS_POOLED && !strcmp(dec, "rejected")) {
                if (pr->counted) series_add(&out->decision, ms); /* e.g. the merge failed */
                pr->state = PS_NONE;
            } else {
                out->acks_unmatched++;
            }
        } else if (!strcmp(ev, "update") && pr->state == PS_WAIT_UPDATE && lf_u64(line, "version") >= pr->merged) {
            if (pr->counted) series_add(&out->update, ms);
            pr->state = PS_NONE;
        }
    }
    fclose(f);
    free(r);
    qsort(out->ack.v, out->ack.n, sizeof(double), cmp_double);
    qsort(out->decision.v, out->decision.n, sizeof(double), cmp_double);
    qsort(out->update.v, out->update.n, sizeof(double), cmp_double);
}

// ----------------------------------------------------------------------------
// summary

static void json_num(FILE *f, const char *k, double v, int last)
{
    if (isfinite(v)) fprintf(f, "\"%s\":%.6g%s", k, v, last ? "" : ",");
    else fprintf(f, "\"%s\":null%s", k, last ? "" : ",");
}

static void json_series(FILE *f, const char *k, const series *s)
{
    fprintf(f, "\"%s\":{\"n\":%zu,", k, s->n);
    json_num(f, "p50", pct(s, 0.5), 0);
    json_num(f, "p99", pct(s, 0.99), 0);
    json_num(f, "max", s->n ? s->v[s->n - 1] : NAN, 1);
    fprintf(f, "}");
}

/* MiB the swarm itself holds whatever N: the shared model, the noise, the driver's scratch. */
static double own_mb(const swarm *s)
{
    return (double)(s->pm.numel + 2 * s->pm.maxn) * 4.0 / 1048576.0;
}

#define U(x) ((unsigned long long)(x))

static void write_json(FILE *f, swarm *s, const latencies *lat, const memstat *mem_end, double anon_max,
                       double wall_s, double measured_s)
{
    dloco_learner_stats t;
    memset(&t, 0, sizeof t);
    series join = {0};
    int joined = 0, failed = 0, unanswered = 0;
    uint64_t pooled = 0;
    for (int i = 0; i < s->N; i++) {
        learner *L = &s->l[i];
        const dloco_learner_stats *c = &L->st;
        t.steps += c->steps;
        t.tokens += c->tokens;
        t.pushes += c->pushes;
        t.push_bytes += c->push_bytes;
        t.accepted += c->accepted;
        t.dropped_stale += c->dropped_stale;
        t.rejected += c->rejected;
        t.coalesced += c->coalesced;
        t.adopted += c->adopted;
        t.rebased += c->rebased;
        t.ignored += c->ignored;
        t.refused += c->refused;
        t.held += c->held;
        t.hold_released += c->hold_released;
        t.bytes_sent += c->bytes_sent;
        t.bytes_received += c->bytes_received;
        t.rehellos += c->rehellos;
        t.rebuilds += c->rebuilds;
        pooled += L->pooled;
        if (L->join_ns) {
            joined++;
            series_add(&join, (double)(L->join_ns - s->t0_ns) * 1e-9);
        }
        failed += L->state == L_FAILED;
        unanswered += L->flush_unanswered > 0 ? L->flush_unanswered : 0;
    }
    if (join.n) qsort(join.v, join.n, sizeof(double), cmp_double);
    double model_mb = (double)s->pm.numel * 4.0 / 1048576.0;
    fprintf(f, "{\"mode\":\"%s\",\"learners\":%d,\"joined\":%d,\"failed\":%d,", s->cfg.mode, s->N, joined, failed);
    fprintf(f, "\"model\":{\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"seq_len\":%d,\"vocab\":%d,\"P\":%d,"
               "\"params\":%llu,\"max_fragment_bytes\":%llu},",
            s->gpt.n_layer, s->gpt.n_head, s->gpt.n_embd, s->gpt.seq_len, s->gpt.vocab, s->P, U(s->pm.numel),
            U(s->pm.maxn * sizeof(float)));
    fprintf(f, "\"H\":%u,\"batch\":%lld,\"rate\":%g,", s->N ? (unsigned)s->l[0].st.h : 0u, (long long)s->cfg.batch,
            s->cfg.rate);
    fprintf(f, "\"fragment_bytes\":[");
    for (int p = 0; p < s->P; p++) fprintf(f, "%s%llu", p ? "," : "", U((s->pm.off[p + 1] - s->pm.off[p]) * 4));
    fprintf(f, "],\"t0_wall_ns\":%lld,\"warmup_s\":%g,", (long long)s->t0_wall_ns, s->cfg.warmup);
    json_num(f, "wall_s", wall_s, 0);
    json_num(f, "measured_s", measured_s, 0);
    fprintf(f, "\"join_s\":{\"n\":%zu,", join.n);
    json_num(f, "min", join.n ? join.v[0] : NAN, 0);
    json_num(f, "p50", pct(&join, 0.5), 0);
    json_num(f, "max", join.n ? join.v[join.n - 1] : NAN, 1);
    fprintf(f, "},\"steps\":%llu,\"tokens\":%llu,\"coalesced\":%llu,\"pushes\":%llu,\"push_bytes\":%llu,", U(t.steps),
            U(t.tokens), U(t.coalesced), U(t.pushes), U(t.push_bytes));
    fprintf(f, "\"decisions\":{\"pooled\":%llu,\"accepted\":%llu,\"dropped_stale\":%llu,\"rejected\":%llu},",
            U(pooled), U(t.accepted), U(t.dropped_stale), U(t.rejected));
    fprintf(f, "\"held\":%llu,\"hold_released\":%llu,\"adopted\":%llu,\"rebased\":%llu,\"ignored\":%llu,"
               "\"refused\":%llu,\"flush_unanswered\":%d,",
            U(t.held), U(t.hold_released), U(t.adopted), U(t.rebased), U(t.ignored), U(t.refused), unanswered);
    json_series(f, "ack_ms", &lat->ack);
    fprintf(f, ",");
    json_series(f, "decision_ms", &lat->decision);
    fprintf(f, ",");
    json_series(f, "update_ms", &lat->update);
    fprintf(f, ",\"acks_unmatched\":%llu,", U(lat->acks_unmatched));
    fprintf(f, "\"bytes_sent\":%llu,\"bytes_recv\":%llu,\"rehellos\":%llu,\"rebuilds\":%llu,", U(t.bytes_sent),
            U(t.bytes_received), U(t.rehellos), U(t.rebuilds));
    fprintf(f, "\"memory_mb\":{");
    json_num(f, "model", model_mb, 0);
    json_num(f, "vm_hwm", mem_end->hwm, 0);
    json_num(f, "rss_end", mem_end->rss, 0);
    json_num(f, "rss_anon_max", anon_max, 0);
    /* the shared model, noise and scratch: once for the swarm, inside rss_anon_max */
    json_num(f, "swarm_own", own_mb(s), 0);
    /* what this process holds physically per learner: its private pages over N */
    json_num(f, "per_learner", anon_max / s->N, 0);
    json_num(f, "library_per_learner", (anon_max - own_mb(s)) / s->N, 1);
    fprintf(f, "},\"per_learner\":[");
    for (int i = 0; i < s->N; i++) {
        learner *L = &s->l[i];
        const dloco_learner_stats *c = &L->st;
        fprintf(f, "%s{\"id\":\"%s\",", i ? "," : "", L->id);
        json_num(f, "join_s", L->join_ns ? (double)(L->join_ns - s->t0_ns) * 1e-9 : NAN, 0);
        fprintf(f, "\"state\":%d,\"steps\":%llu,\"pushes\":%llu,\"pooled\":%llu,\"accepted\":%llu,"
                   "\"dropped_stale\":%llu,\"rejected\":%llu,\"held\":%llu,\"adopted\":%llu,\"bytes_sent\":%llu,"
                   "\"bytes_recv\":%llu,\"rehellos\":%llu,\"rebuilds\":%llu,\"flush_unanswered\":%d}",
                c->state, U(c->steps), U(c->pushes), U(L->pooled), U(c->accepted), U(c->dropped_stale),
                U(c->rejected), U(c->held), U(c->adopted), U(c->bytes_sent), U(c->bytes_received), U(c->rehellos),
                U(c->rebuilds), L->flush_unanswered);
    }
    fprintf(f, "]}\n");
    free(join.v);
}

// ----------------------------------------------------------------------------
// main

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "swarm: %s: %s\n", what, msg);
    return 2;
}

static void nap_until(int64_t t_ns)
{
    int64_t d = t_ns - dl_clock_ns();
    if (d <= 0) return;
    struct timespec ts = {(time_t)(d / 1000000000), (long)(d % 1000000000)};
    nanosleep(&ts, NULL);
}

/* The model rows, the manifest, the fragment plan (through a first handle's
 * read-only plan), the shared parameters and the noise. */
static int setup(swarm *s)
{
    s->gpt = (dloco_gpt2_config){(int32_t)s->cfg.model.n_layer, (int32_t)s->cfg.model.n_head,
                                 (int32_t)s->cfg.model.n_embd, (int32_t)s->cfg.model.seq_len,
                                 (int32_t)s->cfg.model.vocab};
    s->nt = dloco_learner_gpt2_manifest(&s->gpt, NULL, 0);
    if (s->nt < 0) return fail("model", dloco_learner_errmsg(NULL));
    if (!(s->man = calloc((size_t)s->nt, sizeof *s->man))) return fail("model", "out of memory");
    dloco_learner_gpt2_manifest(&s->gpt, s->man, s->nt);
    s->tps = (uint64_t)s->cfg.batch * (uint64_t)s->gpt.seq_len;
    s->N = (int)s->cfg.learners;
    s->b2b = !strcmp(s->cfg.mode, "b2b");
    if (!(s->l = calloc((size_t)s->N, sizeof *s->l))) return fail("learners", "out of memory");
    /* learner 0 first: its plan sizes the shared parameters every callback uses */
    if (learner_open(s, 0, &s->l[0])) return 2;
    params *pm = &s->pm;
    pthread_mutex_init(&pm->mu, NULL);
    pm->P = s->P = dloco_learner_fragments(s->l[0].h);
    pm->numel = dloco_learner_numel(s->l[0].h);
    if (!(pm->off = calloc((size_t)s->P + 1, sizeof *pm->off))) return fail("plan", "out of memory");
    for (int p = 0; p < s->P; p++) {
        uint64_t n = dloco_learner_fragment_numel(s->l[0].h, p);
        pm->off[p + 1] = pm->off[p] + n;
        if (n > pm->maxn) pm->maxn = n;
    }
    if (!(pm->shared = calloc(pm->numel, sizeof(float))) || !(pm->noise = malloc(pm->maxn * sizeof(float))))
        return fail("the shared parameters", "out of memory");
    dl_rng r;
    dl_rng_seed(&r, (uint64_t)s->cfg.seed);
    for (uint64_t i = 0; i < pm->maxn; i++)
        pm->noise[i] = (float)s->cfg.delta_scale * (2.0f * dl_rng_uniform(&r) - 1.0f);
    for (int i = 1; i < s->N; i++)
        if (learner_open(s, i, &s->l[i])) return 2;
    return 0;
}

int main(int argc, char **argv)
{
    swarm S;
    memset(&S, 0, sizeof S);
    swarm *s = &S;
    static const dl_cfg_main preamble = {
        "swarm", "usage: swarm [--config FILE] [--name value ...]\n"
                 "N simulated learners (handles of the learner library, fake training) against dloco-sync.\n"};
    int rc;
    if (dl_cfg_main_parse(table, NCFG, &s->cfg, &preamble, argc, argv, &rc)) return rc;
    /* Big buffers (the library's and libzmq's message copies) are mmapped and
     * given back when freed, never kept in the heap. (Measured with 8 GPT-2
     * learners: a 32 MiB threshold, which lets the heap reuse the copies,
     * kept 5 x the private memory for the same CPU time.) */
    mallopt(M_MMAP_THRESHOLD, 256 << 10);
    /* a session is a DEALER, a monitor, an eventfd and a ZeroMQ context: raise the descriptor limit */
    struct rlimit nof;
    if (getrlimit(RLIMIT_NOFILE, &nof) == 0 && nof.rlim_cur < nof.rlim_max) {
        nof.rlim_cur = nof.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nof);
    }
    int temp_events = !s->cfg.events[0];
    if (temp_events) {
        snprintf(s->events, sizeof s->events, "/tmp/dloco_swarm_events.XXXXXX");
        int fd = mkstemp(s->events);
        if (fd < 0) return fail("temporary events file", strerror(errno));
        close(fd);
    } else {
        memcpy(s->events, s->cfg.events, sizeof s->events);
    }
    if ((rc = setup(s))) return rc;
    printf("swarm: %d learners (%s%03d..) -> %s, mode %s, GPT L=%d NH=%d C=%d T=%d V=%d, %llu params, P=%d "
           "(largest fragment %.1f MB), B=%lld, %g steps/s\n",
           s->N, s->cfg.id_prefix, 0, s->cfg.endpoint, s->cfg.mode, s->gpt.n_layer, s->gpt.n_head, s->gpt.n_embd,
           s->gpt.seq_len, s->gpt.vocab, U(s->pm.numel), s->P, (double)s->pm.maxn * 4e-6, (long long)s->cfg.batch,
           s->cfg.rate);
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    // ---- every learner joins at once, each on a thread of its own until it holds the model
    s->t0_ns = dl_clock_ns();
    s->t0_wall_ns = dl_wallclock_ns();
    for (int i = 0; i < s->N; i++) {
        learner *L = &s->l[i];
        L->state = L_JOINING;
        if (spawn(L, join_main)) {
            fprintf(stderr, "swarm: %s: join: %s\n", L->id, L->err);
            L->state = L_FAILED;
        }
    }
    int64_t t_end = s->t0_ns + (int64_t)(s->cfg.duration * 1e9), tick = s->cfg.tick_ms * 1000000;
    int64_t t_mem = 0;
    double anon_max = 0;
    int joined_all = 0;
    while (!stop_requested) {
        int64_t now = dl_clock_ns();
        if (now >= t_end) break;
        int joined = 0;
        for (int i = 0; i < s->N; i++) {
            learner *L = &s->l[i];
            if (L->state == L_JOINING && atomic_load(&L->thr_done)) {
                reap(L);
                if (L->rc) {
                    fprintf(stderr, "swarm: %s: join: %s: %s\n", L->id, dloco_learner_strerror(L->rc), L->err);
                    L->state = L_FAILED;
                } else {
                    L->state = L_READY;
                    L->join_ns = now;
                    L->next_step_ns = now + (s->b2b ? 0 : step_interval_ns(s, L));
                }
            }
            if (L->state != L_READY) continue;
            joined++;
            if (s->b2b) step(s, L);
            else
                while (L->state == L_READY && now >= L->next_step_ns) {
                    step(s, L);
                    L->next_step_ns += step_interval_ns(s, L);
                }
        }
        if (joined == s->N && !joined_all) {
            joined_all = 1;
            printf("swarm: all %d learners hold every fragment after %.2f s\n", s->N, (double)(now - s->t0_ns) * 1e-9);
            fflush(stdout);
        }
        if (now >= t_mem) {
            memstat m;
            mem_read(&m);
            if (m.anon > anon_max) anon_max = m.anon;
            t_mem = now + 500 * 1000000LL;
        }
        nap_until(now + tick);
    }
    double wall_s = (double)(dl_clock_ns() - s->t0_ns) * 1e-9;
    double measured_s = wall_s - s->cfg.warmup;
    free(scratch);
    scratch = NULL;

    // ---- leave: joins still in progress give up; every joined learner finishes at once (flush, Bye)
    for (int i = 0; i < s->N; i++)
        if (s->l[i].state == L_JOINING) dloco_learner_stop(s->l[i].h);
    for (int i = 0; i < s->N; i++) {
        learner *L = &s->l[i];
        reap(L);
        if (L->state == L_JOINING) L->state = L_FAILED; /* never joined (stopped, or failed late) */
        if (L->state != L_READY) continue;
        if (spawn(L, finish_main)) fprintf(stderr, "swarm: %s: finish: %s\n", L->id, L->err);
    }
    for (int i = 0; i < s->N; i++) {
        learner *L = &s->l[i];
        if (L->state != L_READY) continue;
        reap(L);
        if (L->rc < 0) fprintf(stderr, "swarm: %s: finish: %s: %s\n", L->id, dloco_learner_strerror(L->rc), L->err);
        L->flush_unanswered = L->rc;
        L->state = L_DONE;
    }
    for (int i = 0; i < s->N; i++) {
        s->l[i].st.struct_size = sizeof s->l[i].st;
        dloco_learner_get_stats(s->l[i].h, &s->l[i].st);
    }
    memstat mem_end;
    mem_read(&mem_end);
    if (mem_end.anon > anon_max) anon_max = mem_end.anon;
    latencies lat;
    read_latencies(s, s->events, &lat);
    if (temp_events) unlink(s->events);

    if (s->N <= 32)
        for (int i = 0; i < s->N; i++) {
            learner *L = &s->l[i];
            const dloco_learner_stats *c = &L->st;
            printf("swarm: %s join %6.2f s | steps %llu | pushes %llu (pooled %llu accepted %llu dropped %llu "
                   "rejected %llu) | held %llu | adopted %llu | sent %.1f MB recv %.1f MB | rehellos %llu rebuilds "
                   "%llu\n",
                   L->id, L->join_ns ? (double)(L->join_ns - s->t0_ns) * 1e-9 : NAN, U(c->steps), U(c->pushes),
                   U(L->pooled), U(c->accepted), U(c->dropped_stale), U(c->rejected), U(c->held), U(c->adopted),
                   (double)c->bytes_sent * 1e-6, (double)c->bytes_received * 1e-6, U(c->rehellos), U(c->rebuilds));
        }
    printf("swarm: memory: VmHWM %.0f MiB, private (RssAnon) max %.0f MiB = the swarm's own %.0f MiB (one model, "
           "the noise, a scratch) + %.1f MiB per learner (the library's)\n",
           mem_end.hwm, anon_max, own_mb(s), (anon_max - own_mb(s)) / s->N);
    write_json(stdout, s, &lat, &mem_end, anon_max, wall_s, measured_s);
    if (s->cfg.json[0]) {
        FILE *f = fopen(s->cfg.json, "w");
        if (!f) fprintf(stderr, "swarm: cannot write %s: %s\n", s->cfg.json, strerror(errno));
        else {
            write_json(f, s, &lat, &mem_end, anon_max, wall_s, measured_s);
            fclose(f);
        }
    }
    fflush(stdout);
    for (int i = 0; i < s->N; i++) dloco_learner_close(&s->l[i].h);
    free(s->l);
    free(s->man);
    free(s->pm.off);
    free(s->pm.shared);
    free(s->pm.noise);
    free(lat.ack.v);
    free(lat.decision.v);
    free(lat.update.v);
    return 0;
}
