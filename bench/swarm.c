/* swarm: N simulated learners in one process against a real dloco-sync, for
 * load benchmarks (bench/sync_load.sh): the learner's own mailbox and comms
 * sessions with fake training; measures join time, pushes and their
 * decisions, ack latency, bytes, re-hellos and the swarm's own memory.
 *
 * Each simulated learner is one dl_mailbox and one dl_comms session (its own
 * DEALER, thread and learner id, e.g. swarm-000), exactly as dloco-learner
 * wires them; only the training thread is fake. One driver thread plays the
 * training thread of every learner:
 *   - a learner "steps" at --rate steps/s (each interval stretched by
 *     1 + jitter x U(-1, 1)) once it holds every fragment, and reports its
 *     progress (step, step x batch x seq_len tokens) before it pushes, as the
 *     real learner does;
 *   - --mode schedule: after each step the fragments due by dl_plan_due(step,
 *     p, H, P) are pushed, with the node's hold rule (learner/node.h): a due
 *     fragment whose previous push is undecided (dl_mailbox_undecided) is
 *     owed and pushed at the first step after its decision, or after
 *     --hold_timeout_ms;
 *   - --mode b2b: a fragment is pushed again as soon as its previous push is
 *     decided in the mailbox (ACCEPTED and its Update, DROPPED_STALE or
 *     REJECTED), at most --window fragments per learner in flight; a push
 *     made before the step clock moved takes one step at once (a learner of
 *     unbounded speed), so every push covers >= 1 step;
 *   - a push of p carries base_version = the adopted version of p, steps
 *     since p's adopt, tokens = steps x batch x seq_len, loss 3.0, and a
 *     delta read from ONE shared pseudo-random source (below);
 *   - an Update is adopted as overwrite mode does (counters reset, progress
 *     after the last push counted as discarded) by recording its version
 *     (dl_mailbox_set_held); its payload is dropped.
 *
 * Memory. The mailbox holds 2P + 1 buffers of the LARGEST fragment and each
 * session one more (GPT-2 124M, P = 24: 50 x 154 MB = 7.4 GiB of address
 * space per learner). Only the pages written are resident; an ordinary
 * learner writes its update and push buffers as they rotate, up to about
 * 2 x its model. With --lean (default) the swarm writes almost none (see
 * "lean memory" below): push buffers map one shared memfd of pseudo-random
 * floats, update buffers all map one shared scratch memfd that received
 * payloads are copied into and never read, so the swarm's memory does not
 * grow with N beyond the sessions' own (libzmq's message copies). --lean
 * false copies the source into each push buffer and leaves update buffers
 * alone: what the mailbox costs a real learner.
 *
 * Timing. The public API does not time single pushes, so the swarm writes
 * the sessions' own events (docs/EVENTS.md: push when a Push was handed to
 * ZeroMQ, ack when an Ack arrived, update when an Update arrived; wall-clock
 * ns) to --events (a temporary file when empty) and reads them back at the
 * end: per (learner, fragment) at most one push is in flight, so a push is
 * matched with the acks and update of its fragment that echo its base
 * version:
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
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rng.h"
#include "core/shard.h"
#include "learner/comms.h"
#include "learner/mailbox.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// config

typedef struct {
    char endpoint[DL_CFG_STRLEN], run_id[DL_CFG_STRLEN], id_prefix[DL_CFG_STRLEN];
    char mode[DL_CFG_STRLEN], json[DL_CFG_STRLEN], events[DL_CFG_STRLEN], log_level[DL_CFG_STRLEN];
    int64_t learners, H, batch, window, seed, tick_ms, hold_timeout_ms, connect_timeout_ms;
    double duration, warmup, rate, jitter, delta_scale;
    int lean;
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
    {"duration", DL_CFG_FLOAT, F(duration), 0.1, 86400, "30", NULL, 0, "seconds from the start until the Byes"},
    {"warmup", DL_CFG_FLOAT, F(warmup), 0, 86400, "0", NULL, 0,
     "latencies count pushes sent this many seconds after the start or later"},
    {"mode", DL_CFG_ENUM, F(mode), 0, 0, "schedule", "schedule|b2b", 0,
     "schedule: the real push schedule at --rate; b2b: each fragment again as soon as its push is decided"},
    DL_MODEL_CFG_ROWS(swarm_cfg, model, "256", "model: vocabulary (V)"),
    {"H", DL_CFG_INT, F(H), 0, 1000000, "0", NULL, 0, "inner steps per fragment push period; 0 = the Welcome's"},
    {"batch", DL_CFG_INT, F(batch), 1, 65536, "16", NULL, 0, "sequences per step (Hello.batch; tokens per step = batch x seq_len)"},
    {"rate", DL_CFG_FLOAT, F(rate), 0.001, 100000, "1", NULL, 0, "fake training steps per second per learner"},
    {"jitter", DL_CFG_FLOAT, F(jitter), 0, 0.99, "0", NULL, 0, "each step interval times 1 + jitter x U(-1, 1)"},
    {"window", DL_CFG_INT, F(window), 1, 4096, "2", NULL, 0,
     "b2b: fragments of one learner in flight at once (bounds the libzmq copies: window x fragment per learner)"},
    {"delta_scale", DL_CFG_FLOAT, F(delta_scale), 0, 1, "1e-4", NULL, 0, "pushed deltas are uniform in [-this, this]"},
    {"seed", DL_CFG_INT, F(seed), 0, 9.2e18, "7", NULL, 0, "seed of the delta source and the jitter"},
    {"lean", DL_CFG_BOOL, F(lean), 0, 0, "true", NULL, 0,
     "push and update buffers map shared memfds (false: copy and keep, the memory of a real learner's mailbox)"},
    {"tick_ms", DL_CFG_INT, F(tick_ms), 1, 1000, "2", NULL, 0, "the driver polls every learner this often"},
    {"hold_timeout_ms", DL_CFG_INT, F(hold_timeout_ms), 1, 86400000, "30000", NULL, 0,
     "a held push goes anyway after its predecessor is undecided this long (the node's push_decision_timeout_ms)"},
    {"connect_timeout_ms", DL_CFG_INT, F(connect_timeout_ms), 100, 86400000, "60000", NULL, 0,
     "a session without its first Welcome this long fails"},
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
// lean memory: the shared delta source and the update scratch

/* Two memfds shared by every learner of the swarm:
 *   source   pseudo-random floats, cap + 2 pages long: a push buffer b holds
 *            at byte j the source's byte j - head(b) + PAGE, head(b) being
 *            the distance from b to its first page boundary; its whole
 *            pages map the file MAP_PRIVATE from offset PAGE, its partial
 *            first and last pages are copied once. Sessions only read push
 *            buffers, so the pages stay the file's, resident once.
 *   scratch  cap bytes nobody reads: the whole pages of every update
 *            buffer map it MAP_SHARED, so the copy a session makes of each
 *            received Update (dl_mailbox_put_update) lands in the same
 *            pages whichever learner and fragment it is for; the payload is
 *            dropped anyway (only its version is recorded).
 * The mailbox swaps buffers but never reallocates them, so each buffer is
 * mapped once, the first time it passes through the driver (lean_seen).
 * Mapping over part of a malloc'd buffer is safe only for a chunk glibc
 * mmapped on its own (free() then unmaps our mapping with it): main() fixes
 * M_MMAP_THRESHOLD at or below the buffer size (lean_threshold). Without
 * lean the source is copied into each push buffer and update buffers are
 * left alone: the memory an ordinary learner's mailbox costs. */
typedef struct {
    int src_fd, scr_fd;
    size_t page, cap;  /* cap: bytes of one mailbox buffer */
    const char *view;  /* [cap + 2 pages] the source, read-only */
    int mapping;       /* lean and cap >= the mmap threshold */
} lean;

/* The fixed mmap threshold for buffers of cap bytes: at most half of them
 * (so they are mmapped chunks), at most 256 KiB, so that libzmq's message
 * copies are mmapped too and given back when freed. (Measured with 8 GPT-2
 * learners: a 32 MiB threshold, which lets the heap reuse the copies, kept
 * 5 x the private memory for the same CPU time.) */
static size_t lean_threshold(size_t cap)
{
    size_t t = cap / 2;
    return t < (128u << 10) ? (128u << 10) : t > (256u << 10) ? (256u << 10) : t;
}

static int memfd(const char *name, size_t len, int *fd)
{
    *fd = memfd_create(name, MFD_CLOEXEC);
    if (*fd < 0) return dl_err(DL_EIO, "memfd_create: %s", strerror(errno));
    if (ftruncate(*fd, (off_t)len) != 0) return dl_err(DL_EIO, "ftruncate(memfd): %s", strerror(errno));
    return 0;
}

static int lean_open(size_t cap, double scale, uint64_t seed, int on, lean *m)
{
    m->page = (size_t)sysconf(_SC_PAGESIZE);
    m->cap = cap;
    size_t len = (cap + 3 * m->page - 1) / m->page * m->page;
    DL_TRY(memfd("dloco-swarm-delta", len, &m->src_fd));
    float *w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, m->src_fd, 0);
    if (w == MAP_FAILED) return dl_err(DL_EIO, "mmap(memfd): %s", strerror(errno));
    dl_rng r;
    dl_rng_seed(&r, seed);
    for (size_t i = 0; i < len / sizeof(float); i++) w[i] = (float)scale * (2.0f * dl_rng_uniform(&r) - 1.0f);
    munmap(w, len);
    m->view = mmap(NULL, len, PROT_READ, MAP_SHARED, m->src_fd, 0);
    if (m->view == MAP_FAILED) return dl_err(DL_EIO, "mmap(memfd, read-only): %s", strerror(errno));
    m->mapping = on && cap >= lean_threshold(cap);
    m->scr_fd = -1;
    if (m->mapping) DL_TRY(memfd("dloco-swarm-scratch", (cap + m->page - 1) / m->page * m->page, &m->scr_fd));
    return 0;
}

/* The whole pages of buffer b: [*a, *e); 0 when there are none. */
static int interior(const lean *m, const void *b, uintptr_t *a, uintptr_t *e)
{
    uintptr_t pg = (uintptr_t)m->page;
    *a = ((uintptr_t)b + pg - 1) & ~(pg - 1);
    *e = ((uintptr_t)b + m->cap) & ~(pg - 1);
    return *e > *a;
}

/* Make push buffer b hold the source; n = bytes the push needs. */
static void lean_push_buf(const lean *m, float *b, size_t n, int first)
{
    uintptr_t a, e;
    size_t head = (size_t)((((uintptr_t)b + m->page - 1) & ~(uintptr_t)(m->page - 1)) - (uintptr_t)b);
    const char *src = m->view + (m->page - head); /* byte j of b = src[j] */
    if (!m->mapping || !interior(m, b, &a, &e)) {
        memcpy(b, src, n);
        return;
    }
    if (!first) return; /* mapped already: nothing writes push buffers */
    if (mmap((void *)a, (size_t)(e - a), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, m->src_fd,
             (off_t)m->page) == MAP_FAILED)
        DL_PANIC("swarm: mmap(MAP_FIXED) over a push buffer: %s", strerror(errno));
    memcpy(b, src, (size_t)(a - (uintptr_t)b));
    memcpy((void *)e, src + (e - (uintptr_t)b), (size_t)((uintptr_t)b + m->cap - e));
}

/* Point update buffer b's whole pages at the scratch (once per buffer). */
static void lean_update_buf(const lean *m, float *b)
{
    uintptr_t a, e;
    if (!m->mapping || !interior(m, b, &a, &e)) return;
    if (mmap((void *)a, (size_t)(e - a), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m->scr_fd, 0) == MAP_FAILED)
        DL_PANIC("swarm: mmap(MAP_FIXED) over an update buffer: %s", strerror(errno));
}

/* MiB of the shared memfds (resident once whatever the number of learners). */
static double lean_shared_mb(const lean *m)
{
    size_t pages = (m->cap + 3 * m->page - 1) / m->page + (m->mapping ? (m->cap + m->page - 1) / m->page : 0);
    return (double)(pages * m->page) / 1048576.0;
}

/* A small set of buffers: 1 when b was in it already, else adds it. */
typedef struct {
    const void **v;
    int n, cap;
} bufset;

static int lean_seen(bufset *s, const void *b)
{
    for (int i = 0; i < s->n; i++)
        if (s->v[i] == b) return 1;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->v = dl_xrealloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    s->v[s->n++] = b;
    return 0;
}

// ----------------------------------------------------------------------------
// one simulated learner

typedef struct {
    int held;               /* adopted some version */
    uint64_t version;       /* the adopted version: the next push's base */
    int64_t ref_step;       /* the step at that adopt: counters run from here */
    uint64_t tokens_posted; /* tokens of the last push since the adopt (overwrite's discard rule) */
    int owed;               /* schedule: due while held back */
    int inflight;           /* b2b: posted, its decision not seen */
    int seen_open;          /* b2b: seen undecided after the post */
    int64_t post_ns;        /* monotonic, when posted */
} lfrag;

typedef struct {
    char id[DL_CFG_STRLEN + 16];
    dl_mailbox *mb;
    dl_comms *c[DL_MAILBOX_MAX_SESSIONS]; /* one session per shard */
    lfrag *f;                 /* [P] */
    float *hand, *inbuf;      /* the push buffer to post next, the update buffer to take into */
    bufset push_bufs, update_bufs; /* buffers mapped already (lean) */
    int nheld;                /* fragments held */
    int64_t join_ns;          /* monotonic; 0 = not holding all fragments yet */
    int64_t step, next_step_ns;
    int rr;                   /* b2b round-robin start */
    int state;                /* DL_COMMS_* last seen */
    dl_rng rng;
    uint64_t posted, coalesced, held, held_due, hold_released, adopted, ignored, discarded_tokens, extra_steps;
    dl_comms_stats cs;        /* at the end */
} learner;

typedef struct {
    swarm_cfg cfg;
    dl_model_config mc;
    dl_plan *plan;
    uint64_t fingerprint;
    int P, N, b2b;
    size_t maxn;
    uint64_t tps;             /* tokens per step */
    lean mem;
    learner *l;               /* [N] */
    int64_t t0_ns, t0_wall_ns;
    int S;                    /* shards (sessions per learner) */
    char eps[DL_MAILBOX_MAX_SESSIONS][DL_CFG_STRLEN];
} swarm;

/* --endpoint split at commas: the shards' endpoints in order. Returns S or DL_EINVAL. */
static int split_endpoints(swarm *s)
{
    int n = 0;
    for (const char *a = s->cfg.endpoint;;) {
        const char *e = strchr(a, ',');
        size_t len = e ? (size_t)(e - a) : strlen(a);
        if (len == 0) return dl_err(DL_EINVAL, "option endpoint: empty endpoint in '%s'", s->cfg.endpoint);
        if (n == DL_MAILBOX_MAX_SESSIONS)
            return dl_err(DL_EINVAL, "option endpoint: more than %d endpoints", DL_MAILBOX_MAX_SESSIONS);
        snprintf(s->eps[n++], DL_CFG_STRLEN, "%.*s", (int)len, a);
        if (!e) return n;
        a = e + 1;
    }
}

/* The worst state of a learner's sessions (FAILED/REFUSED over HELLO over READY). */
static int learner_state(const swarm *s, learner *L)
{
    int worst = DL_COMMS_READY;
    for (int k = 0; k < s->S; k++) {
        int st = dl_comms_state(L->c[k], NULL, 0);
        if (st != DL_COMMS_READY && (worst == DL_COMMS_READY || st == DL_COMMS_FAILED || st == DL_COMMS_REFUSED))
            worst = st;
    }
    return worst;
}

static int64_t step_interval_ns(swarm *s, learner *L)
{
    double u = 2.0 * (double)dl_rng_uniform(&L->rng) - 1.0;
    return (int64_t)(1e9 / s->cfg.rate * (1.0 + s->cfg.jitter * u));
}

static int learner_open(swarm *s, int i, learner *L)
{
    snprintf(L->id, sizeof L->id, "%s%03d", s->cfg.id_prefix, i);
    dl_rng_seed(&L->rng, (uint64_t)s->cfg.seed * 1000003u + (uint64_t)i);
    DL_TRY(dl_mailbox_open(s->plan, &L->mb));
    dl_comms_opts o = {
        .mailbox = L->mb,
        .endpoint = s->cfg.endpoint,
        .learner_id = L->id,
        .run_id = s->cfg.run_id,
        .plan = s->plan,
        .fingerprint = s->fingerprint,
        .n_layer = (uint32_t)s->mc.n_layer,
        .n_head = (uint32_t)s->mc.n_head,
        .n_embd = (uint32_t)s->mc.n_embd,
        .seq_len = (uint32_t)s->mc.seq_len,
        .vocab = (uint32_t)s->mc.vocab,
        .device = "swarm",
        .batch = (uint32_t)s->cfg.batch,
        .connect_timeout_ms = (int)s->cfg.connect_timeout_ms,
    };
    for (int k = 0; k < s->S; k++) {
        o.endpoint = s->eps[k];
        o.shard = s->S > 1 ? k : 0;
        o.shards = s->S > 1 ? s->S : 0;
        DL_TRY(dl_comms_open(&o, &L->c[k]));
    }
    L->f = dl_xcalloc((size_t)s->P, sizeof *L->f);
    L->hand = dl_mailbox_buf_alloc(L->mb);
    L->inbuf = dl_mailbox_buf_alloc(L->mb);
    if (s->mem.mapping) {
        /* Before the session starts, pass every update buffer of the mailbox
         * (a slot per fragment and its spare) through our hands once, so that
         * no Update is ever copied into private pages: P + 1 rounds of
         * offer-and-take rotate them all. Leaves the mailbox as it was. */
        lean_seen(&L->update_bufs, L->inbuf);
        lean_update_buf(&s->mem, L->inbuf);
        for (int k = 0; k <= s->P; k++) {
            int p = k % s->P;
            dl_mailbox_update u;
            dl_mailbox_put_update(L->mb, p, 0, DL_UPDATE_NORMAL, s->mem.view, dl_plan_fragment_numel(s->plan, p));
            if (dl_mailbox_take_update(L->mb, p, &L->inbuf, &u) && !lean_seen(&L->update_bufs, L->inbuf))
                lean_update_buf(&s->mem, L->inbuf);
        }
    }
    return 0;
}

static void learner_close(learner *L)
{
    for (int k = 0; k < DL_MAILBOX_MAX_SESSIONS; k++) dl_comms_close(&L->c[k]);
    dl_mailbox_close(&L->mb);
    free(L->f);
    free(L->hand);
    free(L->inbuf);
    free(L->push_bufs.v);
    free(L->update_bufs.v);
}

/* Take every waiting update: adopt (overwrite) or ignore, drop the payload. */
static void take_updates(swarm *s, learner *L, int64_t now)
{
    for (int p = 0; p < s->P; p++) {
        dl_mailbox_update u;
        if (!dl_mailbox_take_update(L->mb, p, &L->inbuf, &u)) continue;
        if (!lean_seen(&L->update_bufs, L->inbuf)) lean_update_buf(&s->mem, L->inbuf);
        lfrag *f = &L->f[p];
        if (f->held && u.forced == DL_UPDATE_NORMAL && u.version <= f->version) {
            L->ignored++;
            continue;
        }
        uint64_t tokens = (uint64_t)(L->step - f->ref_step) * s->tps;
        if (f->held && tokens > f->tokens_posted) {
            L->discarded_tokens += tokens - f->tokens_posted;
            dl_mailbox_add_discarded(L->mb, p, tokens - f->tokens_posted);
        }
        if (!f->held) L->nheld++;
        f->held = 1;
        f->version = u.version;
        f->ref_step = L->step;
        f->tokens_posted = 0;
        L->adopted++;
        dl_mailbox_set_held(L->mb, p, u.version);
    }
    if (!L->join_ns && L->nheld == s->P) {
        L->join_ns = now;
        L->next_step_ns = now + step_interval_ns(s, L);
    }
}

static void post(swarm *s, learner *L, int p, int late, int64_t now)
{
    lfrag *f = &L->f[p];
    uint64_t steps = (uint64_t)(L->step - f->ref_step);
    size_t n = dl_plan_fragment_numel(s->plan, p);
    lean_push_buf(&s->mem, L->hand, n * sizeof(float), !lean_seen(&L->push_bufs, L->hand));
    dl_mailbox_push h = {
        .fragment = p,
        .base_version = f->version,
        .steps = steps,
        .tokens = steps * s->tps,
        .loss = 3.0,
        .compute_s = (double)steps / s->cfg.rate,
        .held = late,
    };
    L->coalesced += (uint64_t)dl_mailbox_post_push(L->mb, &h, &L->hand);
    f->tokens_posted = h.tokens;
    f->post_ns = now;
    L->posted++;
}

/* The node's hold rule: 1 while p's previous push is undecided, released
 * after hold_timeout_ms. */
static int must_hold(swarm *s, learner *L, int p, int64_t now)
{
    int64_t since = 0;
    if (!dl_mailbox_undecided(L->mb, p, &since)) return 0;
    if (since > 0 && now - since >= s->cfg.hold_timeout_ms * 1000000) {
        L->hold_released++;
        return 0;
    }
    return 1;
}

static void progress(swarm *s, learner *L)
{
    dl_mailbox_set_progress(L->mb, (uint64_t)L->step, (uint64_t)L->step * s->tps, s->cfg.rate);
}

/* One fake step; in schedule mode the due (and owed) pushes after it. */
static void step(swarm *s, learner *L, int64_t now)
{
    L->step++;
    progress(s, L);
    if (s->b2b) return;
    uint32_t h = s->cfg.H > 0 ? (uint32_t)s->cfg.H : dl_comms_h(L->c[0]);
    int H = h > 0 ? (int)h : 1;
    for (int p = 0; p < s->P; p++) {
        lfrag *f = &L->f[p];
        int due = dl_plan_due(L->step, p, H, s->P);
        if (!f->held || !(due || f->owed)) continue;
        if (must_hold(s, L, p, now)) {
            if (!f->owed) L->held++;
            if (due) L->held_due++;
            f->owed = 1;
            continue;
        }
        int late = f->owed;
        f->owed = 0;
        post(s, L, p, late, now);
    }
}

/* b2b: 1 when the push of p in flight has its decision. Undecided in the
 * mailbox means sent and waiting; not undecided is either decided or not
 * claimed by the session yet, which taking the push from its slot (and
 * putting it straight back) tells apart. */
static int b2b_decided(learner *L, int p)
{
    lfrag *f = &L->f[p];
    int64_t since = 0;
    if (dl_mailbox_undecided(L->mb, p, &since)) {
        if (since >= f->post_ns) f->seen_open = 1;
        return 0;
    }
    if (f->seen_open) return 1;
    dl_mailbox_push h;
    if (!dl_mailbox_take_push(L->mb, p, &h, &L->hand)) return 1;
    dl_mailbox_post_push(L->mb, &h, &L->hand);
    return 0;
}

static void b2b(swarm *s, learner *L, int64_t now)
{
    int inflight = 0;
    for (int p = 0; p < s->P; p++) {
        lfrag *f = &L->f[p];
        if (f->inflight && b2b_decided(L, p)) f->inflight = 0;
        inflight += f->inflight;
    }
    for (int k = 0; k < s->P && inflight < s->cfg.window; k++) {
        int p = (L->rr + k) % s->P;
        lfrag *f = &L->f[p];
        if (!f->held || f->inflight) continue;
        if (dl_mailbox_undecided(L->mb, p, NULL)) continue; /* e.g. an Update waits */
        if (L->step == f->ref_step) {
            /* nothing trained since the adopt: this learner is as fast as needed */
            L->step++;
            L->extra_steps++;
            progress(s, L);
        }
        post(s, L, p, 0, now);
        f->inflight = 1;
        f->seen_open = 0;
        inflight++;
        L->rr = (p + 1) % s->P;
    }
}

// ----------------------------------------------------------------------------
// memory of this process

typedef struct {
    double rss, hwm, anon, file, shmem; /* MiB */
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
        else if (sscanf(line, "RssFile: %lf", &kb) == 1) m->file = kb / 1024;
        else if (sscanf(line, "RssShmem: %lf", &kb) == 1) m->shmem = kb / 1024;
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
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->v = dl_xrealloc(s->v, s->cap * sizeof *s->v);
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
    if (!f) {
        DL_WARN("swarm: cannot read the events file %s: %s", path, strerror(errno));
        return;
    }
    pushrec *r = dl_xcalloc((size_t)s->N * (size_t)s->P, sizeof *r);
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

static void write_json(FILE *f, swarm *s, const latencies *lat, const memstat *mem_end, double anon_max,
                       double wall_s, double measured_s)
{
    dl_comms_stats t;
    memset(&t, 0, sizeof t);
    series join = {0};
    int joined = 0, failed = 0;
    uint64_t held = 0, held_due = 0, released = 0, adopted = 0, ignored = 0, discarded = 0, steps = 0, extra = 0,
             posted = 0, coalesced = 0;
    for (int i = 0; i < s->N; i++) {
        learner *L = &s->l[i];
        const dl_comms_stats *c = &L->cs;
        t.pushes += c->pushes;
        t.push_bytes += c->push_bytes;
        t.acks_pending += c->acks_pending;
        t.accepted += c->accepted;
        t.dropped_stale += c->dropped_stale;
        t.rejected += c->rejected;
        t.updates += c->updates;
        t.updates_refused += c->updates_refused;
        t.updates_old += c->updates_old;
        t.hellos += c->hellos;
        t.rehellos += c->rehellos;
        t.rebuilds += c->rebuilds;
        t.fetches += c->fetches;
        t.errors_recv += c->errors_recv;
        t.bad_msgs += c->bad_msgs;
        t.bytes_sent += c->bytes_sent;
        t.bytes_recv += c->bytes_recv;
        t.heartbeats_sent += c->heartbeats_sent;
        t.welcomes_refused += c->welcomes_refused;
        if (L->join_ns) {
            joined++;
            series_add(&join, (double)(L->join_ns - s->t0_ns) * 1e-9);
        }
        failed += L->state == DL_COMMS_FAILED || L->state == DL_COMMS_REFUSED;
        held += L->held;
        held_due += L->held_due;
        released += L->hold_released;
        adopted += L->adopted;
        ignored += L->ignored;
        discarded += L->discarded_tokens;
        steps += (uint64_t)L->step;
        extra += L->extra_steps;
        posted += L->posted;
        coalesced += L->coalesced;
    }
    if (join.n) qsort(join.v, join.n, sizeof(double), cmp_double);
    double model_mb = (double)dl_plan_total_numel(s->plan) * 4.0 / 1048576.0;
    fprintf(f, "{\"mode\":\"%s\",\"learners\":%d,\"joined\":%d,\"failed\":%d,", s->cfg.mode, s->N, joined, failed);
    fprintf(f, "\"model\":{\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"seq_len\":%d,\"vocab\":%d,\"P\":%d,"
               "\"params\":%zu,\"max_fragment_bytes\":%zu},",
            s->mc.n_layer, s->mc.n_head, s->mc.n_embd, s->mc.seq_len, s->mc.vocab, s->P, dl_plan_total_numel(s->plan),
            s->maxn * sizeof(float));
    fprintf(f, "\"H\":%u,\"batch\":%lld,\"rate\":%g,\"window\":%lld,\"lean\":%s,",
            s->cfg.H > 0 ? (unsigned)s->cfg.H : (s->N ? dl_comms_h(s->l[0].c[0]) : 0u), (long long)s->cfg.batch,
            s->cfg.rate, (long long)s->cfg.window, s->cfg.lean ? "true" : "false");
    fprintf(f, "\"fragment_bytes\":[");
    for (int p = 0; p < s->P; p++) fprintf(f, "%s%zu", p ? "," : "", dl_plan_fragment_numel(s->plan, p) * sizeof(float));
    fprintf(f, "],\"t0_wall_ns\":%lld,\"warmup_s\":%g,", (long long)s->t0_wall_ns, s->cfg.warmup);
    json_num(f, "wall_s", wall_s, 0);
    json_num(f, "measured_s", measured_s, 0);
    fprintf(f, "\"join_s\":{\"n\":%zu,", join.n);
    json_num(f, "min", join.n ? join.v[0] : NAN, 0);
    json_num(f, "p50", pct(&join, 0.5), 0);
    json_num(f, "max", join.n ? join.v[join.n - 1] : NAN, 1);
    fprintf(f, "},\"steps\":%llu,\"extra_steps\":%llu,\"posted\":%llu,\"coalesced\":%llu,\"pushes\":%llu,"
               "\"push_bytes\":%llu,",
            (unsigned long long)steps, (unsigned long long)extra, (unsigned long long)posted,
            (unsigned long long)coalesced, (unsigned long long)t.pushes, (unsigned long long)t.push_bytes);
    fprintf(f, "\"decisions\":{\"pooled\":%llu,\"accepted\":%llu,\"dropped_stale\":%llu,\"rejected\":%llu},",
            (unsigned long long)t.acks_pending, (unsigned long long)t.accepted, (unsigned long long)t.dropped_stale,
            (unsigned long long)t.rejected);
    fprintf(f, "\"held\":%llu,\"held_due\":%llu,\"hold_released\":%llu,\"updates\":%llu,\"adopted\":%llu,"
               "\"ignored\":%llu,\"updates_refused\":%llu,\"discarded_tokens\":%llu,",
            (unsigned long long)held, (unsigned long long)held_due, (unsigned long long)released,
            (unsigned long long)t.updates, (unsigned long long)adopted, (unsigned long long)ignored,
            (unsigned long long)t.updates_refused, (unsigned long long)discarded);
    json_series(f, "ack_ms", &lat->ack);
    fprintf(f, ",");
    json_series(f, "decision_ms", &lat->decision);
    fprintf(f, ",");
    json_series(f, "update_ms", &lat->update);
    fprintf(f, ",\"acks_unmatched\":%llu,", (unsigned long long)lat->acks_unmatched);
    fprintf(f, "\"bytes_sent\":%llu,\"bytes_recv\":%llu,\"hellos\":%llu,\"rehellos\":%llu,\"rebuilds\":%llu,"
               "\"fetches\":%llu,\"errors_recv\":%llu,\"bad_msgs\":%llu,\"welcomes_refused\":%llu,",
            (unsigned long long)t.bytes_sent, (unsigned long long)t.bytes_recv, (unsigned long long)t.hellos,
            (unsigned long long)t.rehellos, (unsigned long long)t.rebuilds, (unsigned long long)t.fetches,
            (unsigned long long)t.errors_recv, (unsigned long long)t.bad_msgs,
            (unsigned long long)t.welcomes_refused);
    fprintf(f, "\"memory_mb\":{");
    json_num(f, "model", model_mb, 0);
    json_num(f, "vm_hwm", mem_end->hwm, 0);
    json_num(f, "rss_end", mem_end->rss, 0);
    json_num(f, "rss_anon_max", anon_max, 0);
    json_num(f, "rss_shmem_end", mem_end->shmem, 0);
    json_num(f, "source", lean_shared_mb(&s->mem), 0);
    /* what this process holds physically per learner: private pages + the one shared source */
    json_num(f, "per_learner", (anon_max + lean_shared_mb(&s->mem)) / s->N, 0);
    json_num(f, "mailbox_address_space_per_learner",
             (double)(2 * s->P + 2) * (double)(s->maxn * sizeof(float)) / 1048576.0, 1);
    fprintf(f, "},\"per_learner\":[");
    for (int i = 0; i < s->N; i++) {
        learner *L = &s->l[i];
        const dl_comms_stats *c = &L->cs;
        fprintf(f, "%s{\"id\":\"%s\",", i ? "," : "", L->id);
        json_num(f, "join_s", L->join_ns ? (double)(L->join_ns - s->t0_ns) * 1e-9 : NAN, 0);
        fprintf(f, "\"state\":%d,\"steps\":%lld,\"pushes\":%llu,\"pooled\":%llu,\"accepted\":%llu,"
                   "\"dropped_stale\":%llu,\"rejected\":%llu,\"held\":%llu,\"bytes_sent\":%llu,\"bytes_recv\":%llu,"
                   "\"rehellos\":%llu,\"rebuilds\":%llu}",
                L->state, (long long)L->step, (unsigned long long)c->pushes, (unsigned long long)c->acks_pending,
                (unsigned long long)c->accepted, (unsigned long long)c->dropped_stale,
                (unsigned long long)c->rejected, (unsigned long long)L->held, (unsigned long long)c->bytes_sent,
                (unsigned long long)c->bytes_recv, (unsigned long long)c->rehellos, (unsigned long long)c->rebuilds);
    }
    fprintf(f, "]}\n");
    free(join.v);
}

// ----------------------------------------------------------------------------
// main

static int fail(const char *what, int rc)
{
    fprintf(stderr, "swarm: %s: %s%s%s\n", what, dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 2;
}

static void nap_until(int64_t t_ns)
{
    int64_t d = t_ns - dl_clock_ns();
    if (d <= 0) return;
    struct timespec ts = {(time_t)(d / 1000000000), (long)(d % 1000000000)};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    /* before any allocation: big buffers (ours and libzmq's message copies)
     * are mmapped and given back when freed, never kept in the heap */
    swarm S;
    memset(&S, 0, sizeof S);
    swarm *s = &S;
    static const dl_cfg_main preamble = {
        "swarm", "usage: swarm [--config FILE] [--name value ...]\n"
                 "N simulated learners (the learner's mailbox + comms sessions, fake training) against dloco-sync.\n"};
    int rc;
    if (dl_cfg_main_parse(table, NCFG, &s->cfg, &preamble, argc, argv, &rc)) return rc;
    dl_log_set_level(dl_log_level_parse(s->cfg.log_level));
    dl_log_set_name("swarm");
    s->N = (int)s->cfg.learners;
    s->b2b = !strcmp(s->cfg.mode, "b2b");
    if ((rc = dl_model_config_from(&s->cfg.model, &s->mc))) return fail("model config", rc);
    if ((rc = dl_model_plan_open(&s->mc, (int)s->cfg.model.fragments, &s->plan))) return fail("fragment plan", rc);
    s->P = dl_plan_P(s->plan);
    if ((s->S = split_endpoints(s)) < 0) return fail("option endpoint", s->S);
    if (s->S > 1 && dl_shard_check(s->P, 0, s->S)) return fail("option endpoint (shards)", DL_EINVAL);
    s->maxn = dl_plan_max_fragment_numel(s->plan);
    s->fingerprint = dl_model_fingerprint(&s->mc, s->plan);
    s->tps = (uint64_t)s->cfg.batch * (uint64_t)s->mc.seq_len;
    /* a session is a DEALER, a monitor, an eventfd and a ZeroMQ context: raise the descriptor limit */
    struct rlimit nof;
    if (getrlimit(RLIMIT_NOFILE, &nof) == 0 && nof.rlim_cur < nof.rlim_max) {
        nof.rlim_cur = nof.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nof);
    }
    /* Before the mailboxes: a fixed threshold (no dynamic adjustment) makes
     * every mailbox buffer an mmapped chunk of its own (see "lean memory"). */
    mallopt(M_MMAP_THRESHOLD, (int)lean_threshold(s->maxn * sizeof(float)));
    if ((rc = lean_open(s->maxn * sizeof(float), s->cfg.delta_scale, (uint64_t)s->cfg.seed, s->cfg.lean, &s->mem)))
        return fail("the delta source", rc);
    char events[DL_CFG_STRLEN];
    int temp_events = !s->cfg.events[0];
    if (temp_events) {
        snprintf(events, sizeof events, "/tmp/dloco_swarm_events.XXXXXX");
        int fd = mkstemp(events);
        if (fd < 0) return fail("temporary events file", dl_err(DL_EIO, "mkstemp: %s", strerror(errno)));
        close(fd);
    } else {
        memcpy(events, s->cfg.events, sizeof events);
    }
    if ((rc = dl_event_open(events, "learner"))) return fail("events file", rc);

    s->l = dl_xcalloc((size_t)s->N, sizeof *s->l);
    for (int i = 0; i < s->N; i++)
        if ((rc = learner_open(s, i, &s->l[i]))) return fail("opening a learner", rc);
    printf("swarm: %d learners (%s%03d..) -> %s, mode %s, GPT L=%d NH=%d C=%d T=%d V=%d, %zu params, P=%d "
           "(largest fragment %.1f MB), B=%lld, %g steps/s, lean %s\n",
           s->N, s->cfg.id_prefix, 0, s->cfg.endpoint, s->cfg.mode, s->mc.n_layer, s->mc.n_head, s->mc.n_embd,
           s->mc.seq_len, s->mc.vocab, dl_plan_total_numel(s->plan), s->P, (double)s->maxn * 4e-6,
           (long long)s->cfg.batch, s->cfg.rate, s->cfg.lean ? "on" : "off");
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    // ---- start every session at once: the learners join together
    s->t0_ns = dl_clock_ns();
    s->t0_wall_ns = dl_wallclock_ns();
    for (int i = 0; i < s->N; i++)
        for (int k = 0; k < s->S; k++)
            if ((rc = dl_comms_start(s->l[i].c[k]))) fprintf(stderr, "swarm: %s: %s\n", s->l[i].id, dl_errmsg());
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
            take_updates(s, L, now);
            L->state = learner_state(s, L);
            if (!L->join_ns) continue;
            joined++;
            while (now >= L->next_step_ns) {
                step(s, L, now);
                L->next_step_ns += step_interval_ns(s, L);
            }
            if (s->b2b) b2b(s, L, now);
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

    // ---- leave: every Bye at once, then stop the sessions
    for (int i = 0; i < s->N; i++) dl_mailbox_bye(s->l[i].mb, "done", (uint64_t)s->l[i].step);
    for (int i = 0; i < s->N; i++) {
        memset(&s->l[i].cs, 0, sizeof s->l[i].cs);
        for (int k = 0; k < s->S; k++) {
            dl_comms_stats cs;
            dl_comms_stop(s->l[i].c[k]);
            dl_comms_get_stats(s->l[i].c[k], &cs);
            dl_comms_stats_add(&s->l[i].cs, &cs);
        }
    }
    memstat mem_end;
    mem_read(&mem_end);
    if (mem_end.anon > anon_max) anon_max = mem_end.anon;
    dl_event_close();
    latencies lat;
    read_latencies(s, events, &lat);
    if (temp_events) unlink(events);

    if (s->N <= 32)
        for (int i = 0; i < s->N; i++) {
            learner *L = &s->l[i];
            const dl_comms_stats *c = &L->cs;
            printf("swarm: %s join %6.2f s | steps %lld | pushes %llu (pooled %llu accepted %llu dropped %llu "
                   "rejected %llu) | held %llu | sent %.1f MB recv %.1f MB | rehellos %llu rebuilds %llu\n",
                   L->id, L->join_ns ? (double)(L->join_ns - s->t0_ns) * 1e-9 : NAN, (long long)L->step,
                   (unsigned long long)c->pushes, (unsigned long long)c->acks_pending,
                   (unsigned long long)c->accepted, (unsigned long long)c->dropped_stale,
                   (unsigned long long)c->rejected, (unsigned long long)L->held, (double)c->bytes_sent * 1e-6,
                   (double)c->bytes_recv * 1e-6, (unsigned long long)c->rehellos, (unsigned long long)c->rebuilds);
        }
    printf("swarm: memory: VmHWM %.0f MiB, private (RssAnon) max %.0f MiB, shared delta source %.0f MiB, "
           "mailbox address space %.0f MiB per learner\n",
           mem_end.hwm, anon_max, lean_shared_mb(&s->mem),
           (double)(2 * s->P + 2) * (double)(s->maxn * sizeof(float)) / 1048576.0);
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
    for (int i = 0; i < s->N; i++) learner_close(&s->l[i]);
    free(s->l);
    free(lat.ack.v);
    free(lat.decision.v);
    free(lat.update.v);
    dl_plan_close(&s->plan);
    return 0;
}
