/* loadgen: N learners in one thread against a real dloco-sync, for the synchronizer's capacity
 * (bench/sync_load.sh): real protocol, real sockets, almost none of a learner's CPU cost.
 *
 * Each learner is one DEALER (its own connection, learner id, instance) speaking
 * docs/PROTOCOL.md: Hello, Welcome, the initial Fetch (its Updates drained), Heartbeats every
 * heartbeat_ms and before each push, chunked Pushes, Acks, Updates, Bye. One thread polls every
 * DEALER (plus libzmq's one I/O thread), so 1,024 learners cost one process.
 *
 * What it does not do, so that the synchronizer gets the machine:
 *   - no training and no encoding per push: the pushed delta of each fragment is made ONCE at
 *     start (uniform in [-delta_scale, delta_scale], --seed) and encoded once in --push_codec
 *     (learner/ef.h's codecs without error feedback); the checksum of every chunk is computed
 *     once when the Welcome says the chunk size. Every push of every learner sends those bytes
 *     zero-copy (zmq_msg_init_data over the shared region, a no-op free): per push only the
 *     small header differs (learner id, base version, steps, tokens, transfer, seq);
 *   - Updates are received (libzmq's own copy) and dropped: the header is unpacked and
 *     validated (proto/wire.c, checksum not verified), the payload never read; the version of
 *     the last chunk of each Update becomes the fragment's base for the next push, so pushes
 *     are not stale.
 *
 * Learners join (Hello, Welcome, the initial fetch) first; steps and pushes begin once every one
 * holds the model (or after --join_timeout), so the fetches of the last do not compete with the
 * pushes of the first. Modes: b2b pushes the fragments in turn (0, 1, ..., P-1, 0, ...: every
 * learner in the same order, as the schedule does) as fast as decisions allow: the next fragment
 * goes once its previous push is decided (ACCEPTED and an Update of at least that version, or
 * DROPPED_STALE / REJECTED-with-rebase and the rebase Update, or REJECTED; busy waits
 * retry_after_ms) and fewer than --window fragments of the learner are undecided, each push
 * covering at least one step (a learner of unbounded speed); schedule
 * steps each learner at --rate steps/s and pushes the fragments due (core/plan.h dl_plan_due,
 * H from the Welcome or --H) with the node's hold rule (a due fragment whose push is undecided
 * is owed, pushed once decided). A decision that never comes is released after
 * --hold_timeout_ms (counted). Counters as a keep-mode learner: a push reports the steps since
 * the fragment's previous push (a REJECTED one's are reported again; a rebase restarts them).
 *
 * Measurement: --warmup seconds after every learner holds every fragment (or after
 * --join_timeout), a window of --duration seconds; at both ends it reads its own CPU
 * (/proc/self/stat, all threads), the synchronizer's (--sync_pid: /proc/PID/stat and per thread)
 * and its /metrics (--metrics HOST:PORT: merged contributions, bytes sent and received).
 * Output: one `loadgen_<key>: value` line per headline figure, then the JSON summary (also
 * --json FILE) with the window's and the whole run's counters. Exit 0 when the run completed
 * (whatever it measured), 2 on a setup failure. */
#define _GNU_SOURCE
#include "core/clock.h"
#include "core/codec.h"
#include "core/config.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rng.h"
#include "kernels/codec.h"
#include "proto/wire.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MS ((int64_t)1000000) /* ns per ms */
#define NEVER INT64_MAX

// ----------------------------------------------------------------------------
// config

typedef struct {
    char endpoint[DL_CFG_STRLEN], run_id[DL_CFG_STRLEN], id_prefix[DL_CFG_STRLEN], mode[DL_CFG_STRLEN];
    char push_codec[DL_CFG_STRLEN], push_rounding[DL_CFG_STRLEN], json[DL_CFG_STRLEN], metrics[DL_CFG_STRLEN];
    char log_level[DL_CFG_STRLEN];
    int64_t learners, H, batch, window, seed, push_block, push_topk, sync_pid, hold_timeout_ms;
    double duration, warmup, join_timeout, rate, delta_scale;
    dl_model_opts model;
} lg_cfg;

#define F(x) offsetof(lg_cfg, x)
static const dl_cfg_entry table[] = {
    {"endpoint", DL_CFG_STR, F(endpoint), 0, 0, "tcp://127.0.0.1:5555", NULL, 0, "the synchronizer's endpoint"},
    {"run_id", DL_CFG_STR, F(run_id), 0, 0, "dloco", NULL, 0, "run id, must match the synchronizer's"},
    {"id_prefix", DL_CFG_STR, F(id_prefix), 0, 0, "lg-", NULL, 0, "learner ids are this + 0000, 0001, ..."},
    {"learners", DL_CFG_INT, F(learners), 1, 4096, "4", NULL, 0, "learners (N), one DEALER each"},
    {"duration", DL_CFG_FLOAT, F(duration), 0.1, 86400, "20", NULL, 0, "seconds of the measured window"},
    {"warmup", DL_CFG_FLOAT, F(warmup), 0, 86400, "2", NULL, 0,
     "the window starts this many seconds after every learner holds the model (its initial fetch is not measured)"},
    {"join_timeout", DL_CFG_FLOAT, F(join_timeout), 0, 86400, "120", NULL, 0,
     "seconds from the start after which the warm-up begins even if some learners do not hold the model yet"},
    {"mode", DL_CFG_ENUM, F(mode), 0, 0, "b2b", "schedule|b2b", 0,
     "b2b: each fragment again as soon as its push is decided; schedule: the real push schedule at --rate"},
    DL_MODEL_CFG_ROWS(lg_cfg, model, "256", "model: vocabulary (V)"),
    {"H", DL_CFG_INT, F(H), 0, 1000000, "0", NULL, 0, "schedule: inner steps per fragment push period; 0 = the Welcome's"},
    {"batch", DL_CFG_INT, F(batch), 1, 65536, "16", NULL, 0, "sequences per step (Hello.batch; tokens per step = batch x seq_len)"},
    {"rate", DL_CFG_FLOAT, F(rate), 0.001, 100000, "1", NULL, 0, "schedule: steps per second per learner"},
    {"window", DL_CFG_INT, F(window), 1, 4096, "2", NULL, 0, "b2b: fragments of one learner undecided at once"},
    {"push_codec", DL_CFG_ENUM, F(push_codec), 0, 0, "fp32", "fp32|bf16|int8|int4|e3m0|topk", 0,
     "codec of the pushes (as dloco-learner's --push_codec); encoded once at start"},
    {"push_block", DL_CFG_INT, F(push_block), 16, 65536, "128", NULL, 0, "elements per block of a block codec (even)"},
    {"push_topk", DL_CFG_INT, F(push_topk), 1, 65536, "8", NULL, 0, "push_codec=topk: entries kept per block"},
    {"push_rounding", DL_CFG_ENUM, F(push_rounding), 0, 0, "nearest", "nearest|stochastic", 0,
     "int8/int4/e3m0 rounding of the one encoding"},
    {"delta_scale", DL_CFG_FLOAT, F(delta_scale), 0, 1, "1e-4", NULL, 0, "pushed deltas are uniform in [-this, this]"},
    {"seed", DL_CFG_INT, F(seed), 0, 9.2e18, "7", NULL, 0, "seed of the deltas and of the learners' instances"},
    {"hold_timeout_ms", DL_CFG_INT, F(hold_timeout_ms), 1, 86400000, "30000", NULL, 0,
     "a push undecided this long stops holding its fragment (the node's push_decision_timeout_ms)"},
    {"sync_pid", DL_CFG_INT, F(sync_pid), 0, 4194304, "0", NULL, 0,
     "the synchronizer's process id: its CPU (/proc) over the window; 0 = not measured"},
    {"metrics", DL_CFG_STR, F(metrics), 0, 0, "", NULL, 0,
     "the synchronizer's /metrics address HOST:PORT (its metrics_listen event): its merged contributions and bytes "
     "over the window; empty = not read"},
    {"json", DL_CFG_STR, F(json), 0, 0, "", NULL, 0, "also write the JSON summary to this file"},
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
// state

/* Counters: the window's are the difference of two copies. */
#define NREASON 24
typedef struct {
    uint64_t pushes, chunks, heartbeats, hellos, fetches, pushes_bytes;
    uint64_t pooled, accepted, dropped, rejected, busy, rebases, hold_released, tx_cut;
    uint64_t updates, update_chunks, acks, errors, errors_fatal, bad_msgs;
    uint64_t bytes_out, bytes_in, merged_bytes; /* merged: fp32 bytes of fragments ACCEPTED */
    uint64_t rej_n[NREASON];
} counters;

enum { FS_IDLE = 0, FS_SENT, FS_POOLED, FS_WAIT_VERSION, FS_WAIT_UPDATE };
typedef struct {
    uint64_t held;     /* version of the last complete Update (the next push's base) */
    uint64_t upd_n;    /* complete Updates received */
    int state;         /* FS_*: the push in flight */
    uint64_t want;     /* FS_WAIT_VERSION: decided once held >= want; FS_WAIT_UPDATE: once upd_n > want */
    int64_t sent_ns;   /* when the push in flight was sent */
    int64_t busy_until;
    uint64_t ref, ref_prev; /* step at the reference point (last push; a rebase), and before the last push */
    int owed;          /* schedule: due and not yet pushed */
    int have;          /* an Update of it arrived since the Welcome (initial fetch) */
} lfrag;

enum { LS_HELLO = 0, LS_FETCH, LS_READY, LS_DEAD };
typedef struct {
    void *sock;
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    uint64_t instance, epoch, seq, transfers, step, cyc; /* cyc: b2b, the next push is of fragment cyc % P */
    int state, have_n, hb_ms, H, undecided;
    int64_t t_hello, hello_wait_ms, t_hb, t_ready, next_step;
    lfrag *f;
    int ch; /* its push chunking (g->ch): the Welcome's chunk size, then the latest Ack.chunk_bytes */
    /* the chunked push leaving: fragment tx_p in chunking tx_ch, next chunk tx_k of its transfer */
    int tx_active, tx_p, tx_ch;
    uint64_t tx_k, tx_transfer, tx_base, tx_steps;
} learner;

/* One fragment's pushed bytes (shared by every learner). */
typedef struct {
    const uint8_t *bytes; /* the encoded payload, dl_codec_bytes(numel) bytes */
    uint64_t numel, bytes_len;
} fpay;

/* One fragment's payload cut at one chunk size. */
typedef struct {
    uint64_t cn;          /* elements per chunk; 0 = one whole frame */
    uint64_t nchunks;
    uint64_t *off_b, *len_b, *csum; /* [nchunks] byte offset, length and checksum of each chunk */
} fchunks;

/* Every payload cut at one push chunk size, each chunk's checksum computed once (shared by every learner
 * told that size: the synchronizer sizes each learner's push chunks, Ack.chunk_bytes). */
typedef struct {
    uint64_t chunk_bytes; /* 0 = whole pushes */
    fchunks *f;           /* [P] */
} chunking;
#define NCHUNKING 12 /* chunk sizes kept (the synchronizer doubles from chunk_kb: 64 KiB .. 64 MiB is 11) */

typedef struct {
    lg_cfg cfg;
    dl_model_config mc;
    dl_plan *plan;
    int P, N, b2b;
    uint64_t *numel;  /* [P] */
    size_t maxn;
    uint64_t fingerprint, tps;
    dl_codec codec;
    dl_codec_rounding rounding;
    float *src;       /* the fp32 delta, maxn floats: every fragment's is its prefix */
    uint8_t **enc;    /* [P] encoded payloads (block codecs; fp32 points into src) */
    fpay *pay;        /* [P] */
    uint64_t chunk_bytes; /* Welcome.chunk_bytes; 0 = not yet */
    chunking ch[NCHUNKING];
    int nch;
    void *ctx;
    learner *l;
    dl_wire_limits lim;
    counters c;
    char reasons[NREASON][64];
    int nreasons;
    char last_error[256];
    int go; /* every learner holds the model (or join_timeout passed): steps and pushes begin */
} lg;

// ----------------------------------------------------------------------------
// the shared payloads

static void no_free(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

/* Elements per chunk of a push at chunk_bytes (as learner/comms_uplink.c: as many as fill chunk_bytes encoded,
 * whole blocks for a block codec, at least one block). */
static uint64_t chunk_numel(const lg *g, uint64_t chunk_bytes)
{
    uint64_t n = dl_codec_chunk_numel(&g->codec, chunk_bytes);
    if (n) return n;
    return dl_codec_is_block(g->codec.id) ? g->codec.block : 1;
}

static uint64_t enc_bytes(const lg *g, uint64_t n) { return n ? dl_codec_bytes(&g->codec, n) : 0; }

/* The deltas and their encodings, once. */
static int payloads_make(lg *g)
{
    g->src = dl_xmalloc(g->maxn * sizeof(float));
    dl_rng r;
    dl_rng_seed(&r, (uint64_t)g->cfg.seed);
    float s = (float)g->cfg.delta_scale;
    for (size_t i = 0; i < g->maxn; i++) g->src[i] = s * (2.0f * dl_rng_uniform(&r) - 1.0f);
    g->enc = dl_xcalloc((size_t)g->P, sizeof *g->enc);
    g->pay = dl_xcalloc((size_t)g->P, sizeof *g->pay);
    for (int p = 0; p < g->P; p++) {
        fpay *f = &g->pay[p];
        f->numel = g->numel[p];
        f->bytes_len = enc_bytes(g, f->numel);
        if (g->codec.id == DL_CODEC_FP32) {
            f->bytes = (const uint8_t *)g->src;
            continue;
        }
        g->enc[p] = dl_xmalloc((size_t)f->bytes_len);
        dl_codec_enc e = {.c = g->codec, .rounding = g->rounding, .seed = (uint64_t)g->cfg.seed + (uint64_t)p};
        int rc = dl_codec_encode(&e, g->src, NULL, f->numel, 0, g->enc[p]);
        if (rc) return rc;
        f->bytes = g->enc[p];
    }
    return 0;
}

/* The index in g->ch of every payload cut at chunk_bytes (0: whole), each chunk checksummed: made the first
 * time a size is asked for. -1 when NCHUNKING sizes are kept already. */
static int chunking_of(lg *g, uint64_t chunk_bytes)
{
    for (int i = 0; i < g->nch; i++)
        if (g->ch[i].chunk_bytes == chunk_bytes) return i;
    if (g->nch == NCHUNKING) return -1;
    chunking *ch = &g->ch[g->nch];
    ch->chunk_bytes = chunk_bytes;
    ch->f = dl_xcalloc((size_t)g->P, sizeof *ch->f);
    uint64_t cn = chunk_bytes ? chunk_numel(g, chunk_bytes) : 0;
    for (int p = 0; p < g->P; p++) {
        const fpay *pf = &g->pay[p];
        fchunks *f = &ch->f[p];
        f->cn = cn && pf->numel > cn ? cn : 0;
        f->nchunks = f->cn ? (pf->numel + cn - 1) / cn : 1;
        f->off_b = dl_xmalloc(f->nchunks * sizeof(uint64_t));
        f->len_b = dl_xmalloc(f->nchunks * sizeof(uint64_t));
        f->csum = dl_xmalloc(f->nchunks * sizeof(uint64_t));
        for (uint64_t k = 0; k < f->nchunks; k++) {
            uint64_t off = k * f->cn, n = f->cn ? (pf->numel - off < cn ? pf->numel - off : cn) : pf->numel;
            f->off_b[k] = enc_bytes(g, off);
            f->len_b[k] = enc_bytes(g, n);
            f->csum[k] = dl_wire_checksum(pf->bytes + f->off_b[k], (size_t)f->len_b[k]);
        }
    }
    return g->nch++;
}

// ----------------------------------------------------------------------------
// sending

/* [header][payload] on learner L's DEALER, never blocking; the payload (NULL: none) is sent
 * zero-copy from the shared region. Returns 0, DL_EAGAIN (the pipe is full: nothing sent), or
 * another DL_E* code. */
static int send_env(lg *g, learner *L, Dloco__V1__Envelope *env, const uint8_t *payload, size_t len)
{
    uint8_t hdr[4096];
    env->seq = L->seq + 1;
    size_t hl = dloco__v1__envelope__get_packed_size(env);
    if (hl > sizeof hdr) return dl_err(DL_EINVAL, "header of %zu bytes", hl);
    dloco__v1__envelope__pack(env, hdr);
    if (zmq_send(L->sock, hdr, hl, ZMQ_DONTWAIT | (payload ? ZMQ_SNDMORE : 0)) < 0)
        return dl_wire_zmq_fail("zmq_send", __FILE__, __LINE__);
    if (payload) {
        zmq_msg_t m;
        zmq_msg_init_data(&m, (void *)payload, len, no_free, NULL);
        /* the first frame was taken, so the rest of the message is too (libzmq checks the
         * high-water mark on a message's first frame) */
        if (zmq_msg_send(&m, L->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return dl_wire_zmq_fail("zmq_msg_send", __FILE__, __LINE__);
        }
    }
    L->seq++;
    g->c.bytes_out += hl + len;
    return 0;
}

static void env_init(lg *g, learner *L, Dloco__V1__Envelope *env)
{
    dl_wire_env_init(env, g->cfg.run_id, L->epoch, L->id);
}

static void send_hello(lg *g, learner *L, int64_t now)
{
    Dloco__V1__Hello h;
    dloco__v1__hello__init(&h);
    h.fingerprint = g->fingerprint;
    h.n_layer = (uint32_t)g->mc.n_layer;
    h.n_head = (uint32_t)g->mc.n_head;
    h.n_embd = (uint32_t)g->mc.n_embd;
    h.seq_len = (uint32_t)g->mc.seq_len;
    h.vocab = (uint32_t)g->mc.vocab;
    h.batch = (uint32_t)g->cfg.batch;
    h.instance = L->instance;
    h.num_fragments = (uint32_t)g->P;
    h.device = "loadgen";
    h.step = L->step;
    size_t mc = g->maxn * sizeof(float);
    h.max_chunk_bytes = mc > DL_WIRE_CHUNK_MAX ? DL_WIRE_CHUNK_MAX : mc < DL_WIRE_CHUNK_MIN ? DL_WIRE_CHUNK_MIN : (uint32_t)mc;
    uint64_t hv[DL_WIRE_MAX_FRAGMENTS];
    int all = L->have_n == g->P;
    for (int p = 0; p < g->P; p++) hv[p] = L->f[p].held;
    h.n_held_versions = all ? (size_t)g->P : 0;
    h.held_versions = all ? hv : NULL;
    Dloco__V1__Envelope env;
    env_init(g, L, &env);
    dl_wire_set_hello(&env, &h);
    int rc = send_env(g, L, &env, NULL, 0);
    L->t_hello = now;
    if (rc == DL_EAGAIN) { /* not connected yet: soon again */
        L->hello_wait_ms = 50;
        return;
    }
    g->c.hellos++;
    L->hello_wait_ms = L->hello_wait_ms < 1000 ? 1000 : L->hello_wait_ms < 8000 ? 2 * L->hello_wait_ms : 16000;
}

static void send_heartbeat(lg *g, learner *L, int64_t now)
{
    Dloco__V1__Heartbeat hb;
    dloco__v1__heartbeat__init(&hb);
    hb.step = L->step;
    hb.tokens = L->step * g->tps;
    hb.steps_per_s = g->b2b ? 0.0 : g->cfg.rate;
    Dloco__V1__Envelope env;
    env_init(g, L, &env);
    dl_wire_set_heartbeat(&env, &hb);
    L->t_hb = now;
    if (send_env(g, L, &env, NULL, 0) == 0) g->c.heartbeats++;
}

static int send_fetch(lg *g, learner *L)
{
    Dloco__V1__Fetch fm;
    dloco__v1__fetch__init(&fm); /* empty: every fragment */
    Dloco__V1__Envelope env;
    env_init(g, L, &env);
    dl_wire_set_fetch(&env, &fm);
    int rc = send_env(g, L, &env, NULL, 0);
    if (rc == 0) g->c.fetches++;
    return rc;
}

/* Go on with L's push leaving: chunks while libzmq takes them. Returns 1 when the pipe is full. */
static int tx_continue(lg *g, learner *L)
{
    const fpay *pf = &g->pay[L->tx_p];
    const fchunks *f = &g->ch[L->tx_ch].f[L->tx_p];
    while (L->tx_active) {
        Dloco__V1__Push m;
        dloco__v1__push__init(&m);
        m.fragment = (uint32_t)L->tx_p;
        m.base_version = L->tx_base;
        m.steps = L->tx_steps;
        m.tokens = L->tx_steps * g->tps;
        m.codec = (Dloco__V1__Codec)g->codec.id;
        m.numel = pf->numel;
        m.block_size = g->codec.block;
        m.topk = g->codec.topk;
        m.loss = 3.0;
        m.compute_s = 0.0;
        uint64_t k = L->tx_k;
        if (f->cn) {
            m.chunk_offset = k * f->cn;
            m.chunk_numel = pf->numel - m.chunk_offset < f->cn ? pf->numel - m.chunk_offset : f->cn;
            m.transfer = L->tx_transfer;
        }
        m.checksum = f->csum[k];
        Dloco__V1__Envelope env;
        env_init(g, L, &env);
        dl_wire_set_push(&env, &m);
        int rc = send_env(g, L, &env, pf->bytes + f->off_b[k], (size_t)f->len_b[k]);
        if (rc == DL_EAGAIN) return 1;
        if (rc) { /* the socket failed: the push is lost, its decision will not come (hold timeout) */
            snprintf(g->last_error, sizeof g->last_error, "push not sent: %s", dl_errmsg());
            L->tx_active = 0;
            return 0;
        }
        g->c.chunks++;
        g->c.pushes_bytes += f->len_b[k];
        if (++L->tx_k == f->nchunks) L->tx_active = 0;
    }
    return 0;
}

/* Start a push of fragment p (the caller checked it may go). */
static void push_start(lg *g, learner *L, int p, int64_t now)
{
    lfrag *f = &L->f[p];
    if (L->step == f->ref) L->step++; /* every push covers at least one step */
    send_heartbeat(g, L, now); /* the tokens processed cover the push's (the ledger) */
    f->ref_prev = f->ref;
    L->tx_steps = L->step - f->ref;
    f->ref = L->step;
    L->tx_active = 1;
    L->tx_p = p;
    L->tx_ch = L->ch;
    L->tx_k = 0;
    L->tx_transfer = ++L->transfers;
    L->tx_base = f->held;
    f->state = FS_SENT;
    f->owed = 0;
    f->sent_ns = now;
    L->undecided++;
    g->c.pushes++;
    tx_continue(g, L);
}

// ----------------------------------------------------------------------------
// receiving

static void decided(learner *L, lfrag *f)
{
    if (f->state != FS_IDLE) L->undecided--;
    f->state = FS_IDLE;
}

static void count_reason(lg *g, const char *reason)
{
    char r[64];
    size_t n = strcspn(reason, ":(0123456789");
    if (n >= sizeof r) n = sizeof r - 1;
    memcpy(r, reason, n);
    while (n && r[n - 1] == ' ') n--;
    r[n] = 0;
    for (int i = 0; i < g->nreasons; i++)
        if (!strcmp(g->reasons[i], r)) {
            g->c.rej_n[i]++;
            return;
        }
    int i = g->nreasons < NREASON ? g->nreasons++ : NREASON - 1;
    if (i == NREASON - 1 && g->reasons[i][0] == 0) snprintf(g->reasons[i], sizeof g->reasons[i], "other");
    else if (i < NREASON - 1) memcpy(g->reasons[i], r, n + 1);
    g->c.rej_n[i]++;
}

static void on_welcome(lg *g, learner *L, const Dloco__V1__Envelope *env, int64_t now)
{
    const Dloco__V1__Welcome *w = env->welcome;
    if (L->state != LS_HELLO) return; /* a late answer to a retried Hello */
    if (g->chunk_bytes != w->chunk_bytes) {
        if (g->chunk_bytes) DL_WARN("loadgen: the synchronizer's chunk size changed to %u bytes", w->chunk_bytes);
        g->chunk_bytes = w->chunk_bytes;
    }
    int ch = chunking_of(g, w->chunk_bytes);
    if (ch < 0) {
        snprintf(g->last_error, sizeof g->last_error, "more than %d push chunk sizes", NCHUNKING);
        return; /* Hello again later */
    }
    L->ch = ch;
    L->epoch = env->epoch;
    L->hb_ms = (int)w->heartbeat_ms;
    L->H = g->cfg.H ? (int)g->cfg.H : (int)w->h;
    L->hello_wait_ms = 0;
    for (int p = 0; p < g->P; p++) {
        lfrag *f = &L->f[p];
        if (f->state != FS_IDLE) decided(L, f); /* what was in flight is forgotten (a new session) */
        f->owed = 0;
    }
    L->tx_active = 0;
    if (w->must_fetch || L->have_n < g->P) {
        L->have_n = 0;
        for (int p = 0; p < g->P; p++) L->f[p].have = 0;
        L->state = LS_FETCH;
        if (send_fetch(g, L)) L->state = LS_HELLO; /* Hello again soon */
    } else {
        L->state = LS_READY;
    }
    L->t_hb = now;
}

static void on_update(lg *g, learner *L, const Dloco__V1__Update *u, int64_t now)
{
    g->c.update_chunks++;
    uint64_t end = u->chunk_numel ? u->chunk_offset + u->chunk_numel : u->numel;
    if (end < u->numel) return; /* the fragment's last chunk completes it */
    g->c.updates++;
    lfrag *f = &L->f[u->fragment];
    f->held = u->version; /* a fetch reply or rebase may go back: it is what the synchronizer says is global */
    f->upd_n++;
    if (!f->have) {
        f->have = 1;
        L->have_n++;
    }
    if (f->state == FS_WAIT_VERSION && f->held >= f->want) decided(L, f);
    else if (f->state == FS_WAIT_UPDATE && f->upd_n > f->want) {
        f->ref = f->ref_prev = L->step; /* a rebase: counters restart */
        decided(L, f);
    }
    if (L->state == LS_FETCH && L->have_n == g->P) {
        L->state = LS_READY;
        L->t_ready = now;
        if (L->next_step < now) L->next_step = now;
    }
}

static void on_ack(lg *g, learner *L, const Dloco__V1__Ack *a, int64_t now)
{
    /* an answer sent again after a Welcome: a new session here forgets what was in flight (on_welcome), and
     * counting it would count its push twice */
    if (a->again) return;
    g->c.acks++;
    /* the chunk size of L's next pushes (0: keep; none while the synchronizer takes only whole pushes) */
    if (a->chunk_bytes && g->ch[L->ch].chunk_bytes && a->chunk_bytes != g->ch[L->ch].chunk_bytes) {
        int ch = chunking_of(g, a->chunk_bytes);
        if (ch >= 0) L->ch = ch;
        else snprintf(g->last_error, sizeof g->last_error, "more than %d push chunk sizes", NCHUNKING);
    }
    lfrag *f = &L->f[a->fragment];
    if (f->state == FS_IDLE) return; /* a late answer to a push already released */
    /* a push refused while its chunks leave: the rest is not sent (the synchronizer drops it unread) */
    if (L->tx_active && L->tx_p == (int)a->fragment && (a->decision == DLOCO__V1__DECISION__DECISION_REJECTED ||
                                                        a->decision == DLOCO__V1__DECISION__DECISION_DROPPED_STALE)) {
        L->tx_active = 0;
        g->c.tx_cut++;
    }
    switch (a->decision) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING:
        g->c.pooled++;
        f->state = FS_POOLED;
        break;
    case DLOCO__V1__DECISION__DECISION_ACCEPTED:
        g->c.accepted++;
        g->c.merged_bytes += g->numel[a->fragment] * sizeof(float);
        if (f->held >= a->merged_version) decided(L, f);
        else {
            f->state = FS_WAIT_VERSION;
            f->want = a->merged_version;
        }
        break;
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE:
        g->c.dropped++;
        g->c.rebases++;
        f->state = FS_WAIT_UPDATE;
        f->want = f->upd_n;
        break;
    default:
        g->c.rejected++;
        count_reason(g, a->reason ? a->reason : "");
        if (a->busy) {
            g->c.busy++;
            f->busy_until = now + (int64_t)a->retry_after_ms * MS;
        }
        f->ref = f->ref_prev; /* the progress stays: the next push reports it again */
        if (a->rebase) {
            g->c.rebases++;
            f->state = FS_WAIT_UPDATE;
            f->want = f->upd_n;
        } else {
            decided(L, f);
        }
        if (g->b2b && !a->busy) f->busy_until = now + 100 * MS; /* not a hot loop of refusals */
        if (!g->b2b) f->owed = 1;
        break;
    }
    (void)now;
}

static void on_error(lg *g, learner *L, const Dloco__V1__Error *e, int64_t now)
{
    g->c.errors++;
    snprintf(g->last_error, sizeof g->last_error, "%s: %s%s", L->id, e->message ? e->message : "",
             e->fatal ? " (fatal)" : "");
    if (e->fatal) {
        g->c.errors_fatal++;
        L->state = LS_DEAD;
        return;
    }
    if (dl_wire_error_kind(e) == DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER && L->state != LS_HELLO) {
        L->state = LS_HELLO;
        L->hello_wait_ms = 0;
        send_hello(g, L, now);
    }
}

static void drain(lg *g, learner *L, int64_t now)
{
    for (int k = 0; k < 256; k++) {
        dl_wire_msg m;
        int rc = dl_wire_recv(L->sock, 0, &g->lim, &m, ZMQ_DONTWAIT);
        if (rc == DL_EAGAIN) {
            dl_wire_msg_close(&m);
            return;
        }
        if (rc) {
            g->c.bad_msgs++;
            snprintf(g->last_error, sizeof g->last_error, "%s: message refused: %s", L->id, dl_errmsg());
            dl_wire_msg_close(&m);
            if (rc == DL_ENET) return;
            continue;
        }
        const Dloco__V1__Envelope *env = m.env;
        g->c.bytes_in += dloco__v1__envelope__get_packed_size(env);
        for (int i = 0; i < m.npayload; i++) g->c.bytes_in += dl_wire_msg_payload_len(&m, i);
        if (env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME) on_welcome(g, L, env, now);
        else if (env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR) on_error(g, L, env->error, now);
        else if (L->state == LS_FETCH || L->state == LS_READY) {
            if (env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE) on_update(g, L, env->update, now);
            else if (env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK) on_ack(g, L, env->ack, now);
        }
        dl_wire_msg_close(&m);
    }
}

// ----------------------------------------------------------------------------
// the learners' clocks

/* Due work of one learner: Hello retries, heartbeats, steps and pushes. Returns the next time it
 * has something to do. */
static int64_t tick(lg *g, learner *L, int64_t now)
{
    if (L->state == LS_DEAD) return NEVER;
    if (L->state == LS_HELLO) {
        if (now - L->t_hello >= L->hello_wait_ms * MS) send_hello(g, L, now);
        return L->t_hello + L->hello_wait_ms * MS;
    }
    int64_t next = NEVER;
    if (L->hb_ms) {
        if (now - L->t_hb >= L->hb_ms * MS) send_heartbeat(g, L, now);
        next = L->t_hb + L->hb_ms * MS;
    }
    if (L->state != LS_READY || !g->go) return next;
    for (int p = 0; p < g->P; p++) { /* decisions that never came */
        lfrag *f = &L->f[p];
        if (f->state != FS_IDLE && now - f->sent_ns >= g->cfg.hold_timeout_ms * MS) {
            decided(L, f);
            g->c.hold_released++;
        }
    }
    if (!g->b2b) {
        int64_t period = (int64_t)(1e9 / g->cfg.rate);
        while (now >= L->next_step) {
            L->step++;
            for (int p = 0; p < g->P; p++)
                if (dl_plan_due((int64_t)L->step, p, L->H, g->P)) L->f[p].owed = 1;
            L->next_step += period;
        }
        if (L->next_step < next) next = L->next_step;
    }
    if (L->tx_active) return next; /* one push leaves at a time; POLLOUT resumes it */
    if (g->b2b) {
        /* every learner pushes the fragments in the same cyclic order (as the schedule does), so a
         * round finds its learners' pushes together instead of waiting out its grace window */
        int p = (int)(L->cyc % (uint64_t)g->P);
        lfrag *f = &L->f[p];
        if (f->state != FS_IDLE || L->undecided >= g->cfg.window) return next;
        if (f->busy_until > now) return f->busy_until < next ? f->busy_until : next;
        L->cyc++;
        push_start(g, L, p, now);
        return next;
    }
    for (int k = 0; k < g->P; k++) {
        int p = (int)((L->transfers + (uint64_t)k) % (uint64_t)g->P); /* owed ones in turn */
        lfrag *f = &L->f[p];
        if (f->state != FS_IDLE || !f->owed) continue;
        if (f->busy_until > now) {
            if (f->busy_until < next) next = f->busy_until;
            continue;
        }
        push_start(g, L, p, now);
        break;
    }
    return next;
}

// ----------------------------------------------------------------------------
// measurement

/* utime + stime of a /proc stat file, in clock ticks; comm into name (may be NULL). */
static int proc_ticks(const char *path, uint64_t *ticks, char *name, size_t cap)
{
    FILE *fp = fopen(path, "r");
    if (!fp) return DL_EIO;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    if (!l || !r || r < l) return DL_EIO;
    if (name) {
        size_t k = (size_t)(r - l - 1) < cap - 1 ? (size_t)(r - l - 1) : cap - 1;
        memcpy(name, l + 1, k);
        name[k] = 0;
    }
    unsigned long long ut = 0, st = 0;
    /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
    if (sscanf(r + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return DL_EIO;
    *ticks = ut + st;
    return 0;
}

#define MAXTHR 64
typedef struct {
    int ok;
    double self_s, sync_s;
    int nthr;
    char thr[MAXTHR][32];
    double thr_s[MAXTHR];
    /* from /metrics; -1 = not read */
    double m_merged, m_sent, m_recv, m_merges;
    int64_t t;
} sample;

/* GET /metrics from host:port; the body into buf. 0 or DL_E*. */
static int http_get(const char *addr, char *buf, size_t cap)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host) return DL_EINVAL;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) || !ai) return DL_ENET;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {5, 0};
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return DL_ENET;
    }
    freeaddrinfo(ai);
    const char req[] = "GET /metrics HTTP/1.0\r\nHost: loadgen\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return DL_ENET;
    }
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
    close(fd);
    buf[n] = 0;
    return 0;
}

/* Sum of the samples of metric `name` (any labels) in a Prometheus text; -1 when absent. */
static double prom_sum(const char *text, const char *name)
{
    double sum = -1;
    size_t nl = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, nl) || (p[nl] != ' ' && p[nl] != '{')) continue;
        const char *v = p + nl;
        if (*v == '{') v = strchr(v, '}');
        if (!v) continue;
        double x = strtod(v + 1, NULL);
        sum = (sum < 0 ? 0 : sum) + x;
    }
    return sum;
}

static void take_sample(lg *g, sample *s)
{
    memset(s, 0, sizeof *s);
    s->t = dl_clock_ns();
    double tck = (double)sysconf(_SC_CLK_TCK);
    uint64_t t;
    if (proc_ticks("/proc/self/stat", &t, NULL, 0) == 0) s->self_s = (double)t / tck;
    s->m_merged = s->m_sent = s->m_recv = s->m_merges = -1;
    if (g->cfg.sync_pid > 0) {
        char path[128];
        snprintf(path, sizeof path, "/proc/%lld/stat", (long long)g->cfg.sync_pid);
        if (proc_ticks(path, &t, NULL, 0) == 0) {
            s->ok = 1;
            s->sync_s = (double)t / tck;
        }
        /* per thread, summed by name (libzmq's I/O thread, the worker, the loop...) */
        snprintf(path, sizeof path, "/proc/%lld/task", (long long)g->cfg.sync_pid);
        DIR *d = opendir(path);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char tp[512], name[32];
            snprintf(tp, sizeof tp, "%s/%s/stat", path, de->d_name);
            if (proc_ticks(tp, &t, name, sizeof name)) continue;
            int i = 0;
            while (i < s->nthr && strcmp(s->thr[i], name)) i++;
            if (i == s->nthr) {
                if (s->nthr == MAXTHR) continue;
                s->nthr++;
                snprintf(s->thr[i], sizeof s->thr[i], "%s", name);
                s->thr_s[i] = 0;
            }
            s->thr_s[i] += (double)t / tck;
        }
        if (d) closedir(d);
    }
    if (g->cfg.metrics[0]) {
        static char body[1 << 20];
        if (http_get(g->cfg.metrics, body, sizeof body) == 0) {
            s->m_merged = prom_sum(body, "dloco_sync_merged_contributions_total");
            s->m_sent = prom_sum(body, "dloco_sync_sent_bytes_total");
            s->m_recv = prom_sum(body, "dloco_sync_received_bytes_total");
            s->m_merges = prom_sum(body, "dloco_sync_merges_total");
        }
    }
}

// ----------------------------------------------------------------------------
// output

static void json_counters(FILE *f, const lg *g, const counters *a, const counters *b)
{
#define D(x) (unsigned long long)(b->x - (a ? a->x : 0))
    fprintf(f,
            "{\"pushes\":%llu,\"chunks\":%llu,\"push_payload_bytes\":%llu,\"heartbeats\":%llu,\"hellos\":%llu,"
            "\"fetches\":%llu,\"acks\":%llu,\"pooled\":%llu,\"accepted\":%llu,\"dropped_stale\":%llu,\"rejected\":%llu,"
            "\"busy\":%llu,\"rebases\":%llu,\"hold_released\":%llu,\"pushes_cut\":%llu,\"updates\":%llu,\"update_chunks\":%llu,"
            "\"errors\":%llu,\"errors_fatal\":%llu,\"bad_msgs\":%llu,\"bytes_out\":%llu,\"bytes_in\":%llu,"
            "\"merged_bytes\":%llu,\"rejected_by_reason\":{",
            D(pushes), D(chunks), D(pushes_bytes), D(heartbeats), D(hellos), D(fetches), D(acks), D(pooled), D(accepted),
            D(dropped), D(rejected), D(busy), D(rebases), D(hold_released), D(tx_cut), D(updates), D(update_chunks), D(errors),
            D(errors_fatal), D(bad_msgs), D(bytes_out), D(bytes_in), D(merged_bytes));
    int first = 1;
    for (int i = 0; i < g->nreasons; i++) {
        if (!D(rej_n[i])) continue;
        fprintf(f, "%s\"", first ? "" : ",");
        for (const char *p = g->reasons[i]; *p; p++)
            fputc(*p == '"' || *p == '\\' || (unsigned char)*p < 0x20 ? '_' : *p, f);
        fprintf(f, "\":%llu", D(rej_n[i]));
        first = 0;
    }
    fprintf(f, "}}");
#undef D
}

static double delta_or_neg(double a, double b) { return a < 0 || b < 0 ? -1 : b - a; }

static void report(FILE *f, const lg *g, const counters *c0, const counters *c1, const sample *s0, const sample *s1,
                   int joined, int ready, int window_full)
{
    double win = (double)(s1->t - s0->t) * 1e-9;
    double self = s1->self_s - s0->self_s;
    double sync = s0->ok && s1->ok ? s1->sync_s - s0->sync_s : -1;
    double merged = (double)(c1->merged_bytes - c0->merged_bytes);
    double m_merged = delta_or_neg(s0->m_merged, s1->m_merged), m_sent = delta_or_neg(s0->m_sent, s1->m_sent);
    double m_recv = delta_or_neg(s0->m_recv, s1->m_recv), m_merges = delta_or_neg(s0->m_merges, s1->m_merges);
    double mean_frag = 0;
    for (int p = 0; p < g->P; p++) mean_frag += (double)g->numel[p] * 4.0 / g->P;
    /* bytes out of the synchronizer: its own count when /metrics was read, else what we received */
    double out = m_sent >= 0 ? m_sent : (double)(c1->bytes_in - c0->bytes_in);
    fprintf(f,
            "{\"learners\":%d,\"joined\":%d,\"ready\":%d,\"mode\":\"%s\",\"push_codec\":\"%s\",\"P\":%d,"
            "\"fragment_bytes_mean\":%.0f,\"chunk_bytes\":%llu,\"push_message_bytes_mean\":%.0f,\"window_s\":%.3f,"
            "\"window_complete\":%d,"
            "\"merged_bytes\":%.0f,\"merged_mb_per_s\":%.3f,\"loadgen_cpu_s\":%.3f,\"loadgen_cpu_share\":%.4f,"
            "\"sync_cpu_s\":%.3f,\"sync_cpu_share\":%.4f,\"sync_cpu_s_per_merged_gb\":%.4f,"
            "\"sync_merged_contributions\":%.0f,\"sync_merges\":%.0f,\"sync_sent_bytes\":%.0f,\"sync_received_bytes\":%.0f,"
            "\"bytes_out_per_merged_byte\":%.4f,\"sync_threads_cpu_s\":{",
            g->N, joined, ready, g->cfg.mode, dl_codec_name(g->codec.id), g->P, mean_frag,
            (unsigned long long)g->chunk_bytes,
            c1->chunks > c0->chunks ? (double)(c1->pushes_bytes - c0->pushes_bytes) / (double)(c1->chunks - c0->chunks)
                                    : 0.0,
            win, window_full, merged, win > 0 ? merged / win / 1e6 : 0.0, self,
            win > 0 ? self / win : 0.0, sync, sync >= 0 && win > 0 ? sync / win : -1.0,
            sync >= 0 && merged > 0 ? sync / (merged / 1e9) : -1.0, m_merged, m_merges, m_sent, m_recv,
            merged > 0 ? out / merged : -1.0);
    for (int i = 0; i < s1->nthr; i++) {
        double a = 0;
        for (int j = 0; j < s0->nthr; j++)
            if (!strcmp(s0->thr[j], s1->thr[i])) a = s0->thr_s[j];
        fprintf(f, "%s\"%s\":%.3f", i ? "," : "", s1->thr[i], s1->thr_s[i] - a);
    }
    fprintf(f, "},\"window\":");
    json_counters(f, g, c0, c1);
    fprintf(f, ",\"total\":");
    json_counters(f, g, NULL, c1);
    fprintf(f, ",\"last_error\":\"");
    for (const char *p = g->last_error; *p; p++) fputc(*p == '"' || *p == '\\' || (unsigned char)*p < 0x20 ? '_' : *p, f);
    fprintf(f, "\"}\n");
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "loadgen: %s: %s\n", what, dl_errmsg()[0] ? dl_errmsg() : dl_strerror(rc));
    return 2;
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv)
{
    static lg G;
    lg *g = &G;
    static const dl_cfg_main preamble = {
        "loadgen", "usage: loadgen [--config FILE] [--name value ...]\n"
                   "N learners in one thread against dloco-sync: real protocol, pre-encoded zero-copy pushes.\n"};
    int rc;
    if (dl_cfg_main_parse(table, NCFG, &g->cfg, &preamble, argc, argv, &rc)) return rc;
    dl_log_set_level(dl_log_level_parse(g->cfg.log_level));
    dl_log_set_name("loadgen");
    g->N = (int)g->cfg.learners;
    g->b2b = !strcmp(g->cfg.mode, "b2b");
    if ((rc = dl_model_config_from(&g->cfg.model, &g->mc))) return fail("model config", rc);
    if ((rc = dl_model_plan_open(&g->mc, (int)g->cfg.model.fragments, &g->plan))) return fail("fragment plan", rc);
    g->P = dl_plan_P(g->plan);
    g->numel = dl_xcalloc((size_t)g->P, sizeof *g->numel);
    for (int p = 0; p < g->P; p++) g->numel[p] = dl_plan_fragment_numel(g->plan, p);
    g->maxn = dl_plan_max_fragment_numel(g->plan);
    g->fingerprint = dl_model_fingerprint(&g->mc, g->plan);
    g->tps = (uint64_t)g->cfg.batch * (uint64_t)g->mc.seq_len;
    if ((rc = dl_codec_push_opts(g->cfg.push_codec, g->cfg.push_block, g->cfg.push_topk, g->cfg.push_rounding,
                                 &g->codec, &g->rounding)))
        return fail("push codec", rc);
    if ((rc = payloads_make(g))) return fail("encoding the pushes", rc);
    g->lim = dl_wire_limits_default();
    g->lim.num_fragments = (uint32_t)g->P;
    g->lim.fragment_numel = g->numel;
    g->lim.verify_checksum = false; /* Updates are dropped unread */
    struct rlimit nof; /* a DEALER per learner */
    if (getrlimit(RLIMIT_NOFILE, &nof) == 0 && nof.rlim_cur < nof.rlim_max) {
        nof.rlim_cur = nof.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nof);
    }
    if (!(g->ctx = zmq_ctx_new())) return fail("zmq context", DL_ENET);
    zmq_ctx_set(g->ctx, ZMQ_MAX_SOCKETS, g->N + 64);
    size_t maxmsg = g->maxn * sizeof(float) + DL_WIRE_MAX_HEADER_BYTES;
    g->l = dl_xcalloc((size_t)g->N, sizeof *g->l);
    dl_rng ir;
    dl_rng_seed(&ir, (uint64_t)g->cfg.seed ^ (uint64_t)dl_wallclock_ns());
    for (int i = 0; i < g->N; i++) {
        learner *L = &g->l[i];
        char id[2 * DL_WIRE_LEARNER_ID_MAX];
        snprintf(id, sizeof id, "%.*s%04d", DL_WIRE_LEARNER_ID_MAX, g->cfg.id_prefix, i);
        if (strlen(id) >= sizeof L->id || !dl_wire_id_ok(id))
            return fail("option id_prefix", dl_err(DL_EINVAL, "learner id '%s' is not [A-Za-z0-9._-]{1,64}", id));
        memcpy(L->id, id, strlen(id) + 1);
        L->instance = dl_rng_u64(&ir) | 1;
        L->f = dl_xcalloc((size_t)g->P, sizeof *L->f);
        if (!(L->sock = zmq_socket(g->ctx, ZMQ_DEALER))) return fail("zmq socket", DL_ENET);
        if ((rc = dl_wire_sock_setup(L->sock, 0, maxmsg))) return fail("socket options", rc);
        if (zmq_connect(L->sock, g->cfg.endpoint)) return fail("option endpoint", dl_wire_zmq_fail("zmq_connect", __FILE__, __LINE__));
    }
    zmq_pollitem_t *items = dl_xcalloc((size_t)g->N, sizeof *items);
    for (int i = 0; i < g->N; i++) items[i].socket = g->l[i].sock;
    printf("loadgen: %d learners (%s0000..) -> %s, mode %s, push codec %s, GPT L=%d NH=%d C=%d T=%d V=%d, P=%d "
           "(largest fragment %.1f MB fp32), B=%lld%s\n",
           g->N, g->cfg.id_prefix, g->cfg.endpoint, g->cfg.mode, dl_codec_name(g->codec.id), g->mc.n_layer,
           g->mc.n_head, g->mc.n_embd, g->mc.seq_len, g->mc.vocab, g->P, (double)g->maxn * 4e-6,
           (long long)g->cfg.batch, g->b2b ? "" : " (schedule)");
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    int64_t t0 = dl_clock_ns(), t_join = t0 + (int64_t)(g->cfg.join_timeout * 1e9);
    int64_t t_warm = NEVER, win_ns = (int64_t)(g->cfg.duration * 1e9), t_end = NEVER;
    int in_window = 0, window_full = 0;
    counters c0 = {0};
    sample s0, s1;
    memset(&s0, 0, sizeof s0);
    for (;;) {
        int64_t now = dl_clock_ns();
        int64_t next = now + 100 * MS;
        int ready = 0;
        for (int i = 0; i < g->N; i++) {
            learner *L = &g->l[i];
            int64_t t = tick(g, L, now);
            if (t < next) next = t;
            ready += L->state == LS_READY;
            items[i].events = ZMQ_POLLIN | (L->tx_active ? ZMQ_POLLOUT : 0);
        }
        if (t_warm == NEVER && (ready == g->N || now >= t_join)) {
            t_warm = now + (int64_t)(g->cfg.warmup * 1e9);
            g->go = 1;
            for (int i = 0; i < g->N; i++) g->l[i].next_step = now; /* the schedule's clocks start together */
            printf("loadgen_join_s: %.2f (%d of %d learners hold the model)\n", (double)(now - t0) * 1e-9, ready, g->N);
            fflush(stdout);
        }
        if (!in_window && now >= t_warm) {
            in_window = 1;
            c0 = g->c;
            take_sample(g, &s0);
            t_end = s0.t + win_ns;
        }
        if (in_window && now >= t_end) {
            window_full = 1;
            break;
        }
        if (stop_requested) break;
        if (t_end < next) next = t_end;
        if (!in_window && t_warm < next) next = t_warm;
        long wait_ms = next > now ? (long)((next - now + MS - 1) / MS) : 0;
        if (wait_ms > 100) wait_ms = 100;
        int n = zmq_poll(items, g->N, wait_ms);
        if (n < 0 && zmq_errno() != EINTR) return fail("zmq_poll", dl_wire_zmq_fail("zmq_poll", __FILE__, __LINE__));
        if (n <= 0) continue;
        now = dl_clock_ns();
        for (int i = 0; i < g->N; i++) {
            if (items[i].revents & ZMQ_POLLIN) drain(g, &g->l[i], now);
            if ((items[i].revents & ZMQ_POLLOUT) && g->l[i].tx_active) tx_continue(g, &g->l[i]);
        }
    }
    counters c1 = g->c;
    if (!in_window) { /* stopped before the window: report the run so far */
        take_sample(g, &s0);
        s0.t = t0;
        s0.self_s = 0;
    }
    take_sample(g, &s1);
    int joined = 0, ready = 0;
    for (int i = 0; i < g->N; i++) {
        joined += g->l[i].state == LS_FETCH || g->l[i].state == LS_READY;
        ready += g->l[i].state == LS_READY;
    }
    /* Byes: the final counts, the synchronizer closes each account */
    for (int i = 0; i < g->N; i++) {
        learner *L = &g->l[i];
        if (L->state != LS_FETCH && L->state != LS_READY) continue;
        Dloco__V1__Bye b;
        dloco__v1__bye__init(&b);
        b.reason = "done";
        b.step = L->step;
        b.tokens = L->step * g->tps;
        Dloco__V1__Envelope env;
        env_init(g, L, &env);
        dl_wire_set_bye(&env, &b);
        send_env(g, L, &env, NULL, 0);
        int linger = 1000;
        zmq_setsockopt(L->sock, ZMQ_LINGER, &linger, sizeof linger);
    }
    for (int i = 0; i < g->N; i++) zmq_close(g->l[i].sock);
    zmq_ctx_term(g->ctx);

    double win = (double)(s1.t - s0.t) * 1e-9;
    double merged = (double)(c1.merged_bytes - c0.merged_bytes);
    double self = s1.self_s - s0.self_s, sync = s0.ok && s1.ok ? s1.sync_s - s0.sync_s : -1;
    printf("loadgen_learners: %d (joined %d, holding the model %d)\n", g->N, joined, ready);
    printf("loadgen_window_s: %.2f%s\n", win, window_full ? "" : " (cut short)");
    printf("loadgen_pushes: %llu (accepted %llu, pooled %llu, dropped_stale %llu, rejected %llu, busy %llu)\n",
           (unsigned long long)(c1.pushes - c0.pushes), (unsigned long long)(c1.accepted - c0.accepted),
           (unsigned long long)(c1.pooled - c0.pooled), (unsigned long long)(c1.dropped - c0.dropped),
           (unsigned long long)(c1.rejected - c0.rejected), (unsigned long long)(c1.busy - c0.busy));
    printf("loadgen_merged_mb_per_s: %.2f\n", win > 0 ? merged / win / 1e6 : 0.0);
    printf("loadgen_bytes_out: %llu\nloadgen_bytes_in: %llu\n", (unsigned long long)(c1.bytes_out - c0.bytes_out),
           (unsigned long long)(c1.bytes_in - c0.bytes_in));
    printf("loadgen_cpu_s: %.3f (%.0f%% of one core)\n", self, win > 0 ? 100 * self / win : 0.0);
    if (sync >= 0) printf("loadgen_sync_cpu_s: %.3f (%.0f%% of one core)\n", sync, win > 0 ? 100 * sync / win : 0.0);
    if (g->last_error[0]) printf("loadgen_last_error: %s\n", g->last_error);
    report(stdout, g, &c0, &c1, &s0, &s1, joined, ready, window_full);
    if (g->cfg.json[0]) {
        FILE *f = fopen(g->cfg.json, "w");
        if (!f) return fail("option json", dl_err(DL_EIO, "cannot write %s: %s", g->cfg.json, strerror(errno)));
        report(f, g, &c0, &c1, &s0, &s1, joined, ready, window_full);
        fclose(f);
    }
    return 0;
}
