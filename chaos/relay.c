/* The chaos relay (chaos/relay.h): a poll() loop that cuts each TCP byte
 * stream into ZMTP units and releases them late, twice, out of order or never.
 *
 * Structure: a relay owns pairs; a pair owns two sockets (side 0: the
 * learner's accepted connection, side 1: ours to the synchronizer) and two
 * flows. Flow 0 reads side 0 and writes side 1 (up), flow 1 the reverse
 * (down). A flow is a parser (bytes -> units) and a FIFO of units waiting for
 * their release time. Only the relay thread touches sockets; other threads
 * change impairments, queue a replay or ask for a cut under the mutex and
 * wake the thread through a pipe. The thread holds the mutex except while it
 * sleeps in poll(), so every field below is guarded by it. */
#define _GNU_SOURCE /* accept4, pipe2 */
#include "chaos/relay.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "core/rng.h"

/* ---- ZMTP 3 framing (RFC 23) */

#define ZMTP_GREETING 64
#define ZMTP_MORE 0x01
#define ZMTP_LONG 0x02
#define ZMTP_CMD 0x04
#define ZMTP_RESERVED 0xF8

#define MS (INT64_C(1000000))
#define CONNECT_MS 5000     /* upstream connect() still pending after this: give up on the pair */
#define READ_CHUNK 65536    /* bytes per read() into the relay's buffer */
#define READ_PASS (1u << 20) /* most bytes read from one socket per loop pass, so timers stay on time */
#define POLL_MAX_MS 1000    /* wake at least this often even when idle */

enum { UP = 0, DOWN = 1 };                  /* flow index = the side it reads */
enum { U_GREET, U_CMD, U_MSG };             /* unit kinds */
enum { P_GREET, P_FLAGS, P_SIZE, P_BODY };  /* parser states */

/* Wire bytes of one unit. Immutable once complete, shared by a duplicate,
 * a replay and the capture through the reference count. */
typedef struct {
    int refs;
    size_t len, cap;
    uint8_t data[];
} blob;

typedef struct unit {
    struct unit *next;
    blob *b;
    size_t off;         /* bytes of b already written */
    int64_t release_ns; /* monotonic time it may go out */
    int kind;
} unit;
/* What one queued unit costs besides its bytes: the unit, the blob header,
 * malloc's own overhead (about two words per allocation). */
#define UNIT_COST (sizeof(unit) + sizeof(blob) + 4 * sizeof(void *))

typedef struct {
    unit *head, *tail;
} uqueue;

typedef struct {
    /* parser */
    int st;
    unsigned greet_n;    /* greeting bytes seen, 0..64 */
    uint8_t flags;       /* of the frame being parsed */
    uint8_t size[8];
    unsigned size_n, size_need;
    uint64_t body_left;  /* body bytes of the current frame still to come */
    blob *cmd;           /* command frame being assembled */
    blob *msg;           /* message being assembled (its complete frames, then the current one) */
    unsigned msg_frames; /* complete frames in msg */
    bool ready;          /* a command went through after the greeting: the handshake is under way */
    /* output */
    uqueue q;
    uqueue held;         /* a message (and its duplicate) held back for reordering */
    int64_t held_until;
    size_t queued;       /* bytes in q and held, each unit counted with its UNIT_COST (back-pressure at queue_max) */
    bool want_out;       /* the last write would block: wait for POLLOUT on the target */
} flow;

typedef struct pair {
    struct pair *next;
    uint64_t id;
    int fd[2];
    bool connecting;      /* fd[1]'s connect() is in flight */
    int64_t connect_until;
    flow f[2];
    bool eof[2];          /* side i closed (or failed to read): no more reads from it */
    int64_t drain_until;  /* once a side closed: queued units toward the other may go out until then */
    bool dead;            /* close both sides at the end of this pass */
    int pfd[2];           /* index into this pass's pollfd array, -1 when not polled */
} pair;

typedef struct {
    double tokens; /* bytes that may go out now */
    int64_t last_ns;
    double rate;   /* bytes/s the tokens were last refilled at; 0 = unlimited */
} bucket;

struct dl_relay {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int lfd, port;
    int wake[2];
    struct sockaddr_storage up_addr;
    socklen_t up_len;
    size_t queue_max, max_msg;
    int max_conns;

    dl_relay_impair imp;
    dl_rng rng;  /* loss, duplicate, reorder: three draws per message */
    dl_rng jrng; /* jitter: one draw per unit */
    bucket bk[2];

    pair *pairs;
    uint64_t next_id;
    blob *capture;
    unsigned capture_frames;
    uint64_t capture_pair;

    dl_relay_stats st;
    bool stop;
    uint64_t cut_req, cut_done;
    int cut_count;

    struct pollfd *pfds;
    size_t pfd_cap;
    uint8_t *rbuf;
};

/* ---- blobs and units */

static blob *blob_new(size_t cap)
{
    blob *b = dl_try_malloc(sizeof *b + cap);
    if (!b) return NULL;
    b->refs = 1;
    b->len = 0;
    b->cap = cap;
    return b;
}

static void blob_unref(blob *b)
{
    if (b && --b->refs == 0) free(b);
}

/* Room for `need` bytes in *bp, growing geometrically but never past `final`
 * (the length the unit will have when complete), so what a peer merely
 * announces is never allocated ahead of the bytes that fill it. */
static int blob_reserve(blob **bp, size_t need, size_t final)
{
    blob *b = *bp;
    if (b && b->cap >= need) return 0;
    size_t cap = b ? b->cap * 2 : 256;
    if (cap < need) cap = need;
    if (cap > final) cap = final;
    if (cap < need) cap = need;
    blob *nb = dl_try_realloc(b, sizeof *nb + cap);
    if (!nb) return DL_ENOMEM;
    if (!b) {
        nb->refs = 1;
        nb->len = 0;
    }
    nb->cap = cap;
    *bp = nb;
    return 0;
}

static void blob_append(blob *b, const uint8_t *p, size_t n)
{
    assert(b->len + n <= b->cap);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static unit *unit_new(blob *b, int kind, int64_t release_ns)
{
    unit *u = dl_try_malloc(sizeof *u);
    if (!u) return NULL;
    u->next = NULL;
    u->b = b;
    u->off = 0;
    u->release_ns = release_ns;
    u->kind = kind;
    return u;
}

static void uq_push(uqueue *q, unit *u)
{
    u->next = NULL;
    if (q->tail) q->tail->next = u;
    else q->head = u;
    q->tail = u;
}

static unit *uq_pop(uqueue *q)
{
    unit *u = q->head;
    if (u) {
        q->head = u->next;
        if (!q->head) q->tail = NULL;
        u->next = NULL;
    }
    return u;
}

/* Move every unit of `from` to the end of `to`. */
static void uq_splice(uqueue *to, uqueue *from)
{
    if (!from->head) return;
    if (to->tail) to->tail->next = from->head;
    else to->head = from->head;
    to->tail = from->tail;
    from->head = from->tail = NULL;
}

static void uq_free(uqueue *q)
{
    unit *u;
    while ((u = uq_pop(q))) {
        blob_unref(u->b);
        free(u);
    }
}

static void flow_free(flow *f)
{
    uq_free(&f->q);
    uq_free(&f->held);
    blob_unref(f->cmd);
    blob_unref(f->msg);
    f->cmd = f->msg = NULL;
    f->queued = 0;
}

/* ---- small helpers */

static double draw(dl_rng *g) { return (double)(dl_rng_u64(g) >> 11) * (1.0 / 9007199254740992.0); }

static const char *flow_name(int side) { return side == UP ? "learner->sync" : "sync->learner"; }

static void set_nodelay(int fd)
{
    int one = 1;
    /* Without it Nagle holds small units (commands, heartbeats) back for an
     * ACK, which adds delay the harness did not ask for. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        DL_DEBUG("relay: TCP_NODELAY: %s", strerror(errno));
}

static void close_fd(int *fd, bool rst)
{
    if (*fd < 0) return;
    if (rst) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(*fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(*fd);
    *fd = -1;
}

static void wake(dl_relay *r)
{
    uint8_t b = 1;
    /* A full pipe already holds a wake-up; nothing else can fail here. */
    ssize_t n = write(r->wake[1], &b, 1);
    (void)n;
}

static int64_t ms_to_ns(double ms) { return ms > 0 ? (int64_t)(ms * 1e6) : 0; }

/* ---- pairs */

static void pair_free(dl_relay *r, pair *p, bool rst)
{
    close_fd(&p->fd[0], rst);
    close_fd(&p->fd[1], rst);
    flow_free(&p->f[0]);
    flow_free(&p->f[1]);
    r->st.conns_open--;
    free(p);
}

/* Unlink and free every pair marked dead. */
static void reap(dl_relay *r)
{
    for (pair **pp = &r->pairs; *pp;) {
        pair *p = *pp;
        if (p->dead) {
            *pp = p->next;
            DL_DEBUG("relay %d: pair %llu closed", r->port, (unsigned long long)p->id);
            pair_free(r, p, false);
        } else {
            pp = &p->next;
        }
    }
}

static int cut_all(dl_relay *r)
{
    int n = 0;
    while (r->pairs) {
        pair *p = r->pairs;
        r->pairs = p->next;
        pair_free(r, p, true);
        n++;
    }
    return n;
}

static void bad_framing(dl_relay *r, pair *p, int side, const char *why)
{
    if (p->dead) return;
    DL_WARN("relay %d: pair %llu %s: bad framing (%s): closing the pair", r->port, (unsigned long long)p->id,
            flow_name(side), why);
    r->st.conns_bad_framing++;
    p->dead = true;
}

static void oom(dl_relay *r, pair *p, int side)
{
    DL_WARN("relay %d: pair %llu %s: out of memory: closing the pair", r->port, (unsigned long long)p->id,
            flow_name(side));
    p->dead = true;
}

/* One side closed: what it sent whole still goes on (its held message too),
 * what it was in the middle of sending is gone, as it would be for the
 * receiver of a direct connection. */
static void side_eof(dl_relay *r, pair *p, int side, int64_t now)
{
    (void)r;
    flow *f = &p->f[side];
    p->eof[side] = true;
    blob_unref(f->cmd);
    blob_unref(f->msg);
    f->cmd = f->msg = NULL;
    uq_splice(&f->q, &f->held);
    if (!p->drain_until) p->drain_until = now + DL_RELAY_DRAIN_MS * MS;
}

/* ---- parser: bytes -> units */

static int64_t release_time(dl_relay *r, int64_t now)
{
    double j = r->imp.jitter_ms > 0 ? draw(&r->jrng) * r->imp.jitter_ms : 0;
    return now + ms_to_ns(r->imp.delay_ms) + ms_to_ns(j);
}

static int enqueue(flow *f, uqueue *q, blob *b, int kind, int64_t rel)
{
    unit *u = unit_new(b, kind, rel);
    if (!u) return DL_ENOMEM;
    uq_push(q, u);
    f->queued += b->len + UNIT_COST; /* the heap a unit holds, not only its bytes: tiny messages add up */
    return 0;
}

/* A command frame or greeting chunk is complete: it goes on as it is. */
static int emit_plain(dl_relay *r, flow *f, blob *b, int kind, int64_t now)
{
    int rc = enqueue(f, &f->q, b, kind, release_time(r, now));
    if (rc < 0) blob_unref(b);
    return rc;
}

/* A whole message: drawn for loss, duplication and reordering, captured for
 * replay when it goes up. */
static int emit_msg(dl_relay *r, pair *p, int side, blob *b, unsigned frames, int64_t now)
{
    flow *f = &p->f[side];
    /* Always three draws, so one message's fate does not depend on the
     * settings another one saw. */
    double u_loss = draw(&r->rng), u_dup = draw(&r->rng), u_re = draw(&r->rng);

    /* Give back the slack of the geometric growth before the blob is shared. */
    if (b->cap > b->len + b->len / 4 + 256) {
        blob *nb = dl_try_realloc(b, sizeof *nb + b->len);
        if (nb) {
            b = nb;
            b->cap = b->len;
        }
    }
    /* The sniffer sits at the learner's end of the link, ahead of the loss. */
    if (side == UP && b->len <= DL_RELAY_CAPTURE_MAX && (frames >= 2 || r->capture_frames < 2)) {
        blob_unref(r->capture);
        b->refs++;
        r->capture = b;
        r->capture_frames = frames;
        r->capture_pair = p->id;
    }
    if (u_loss < r->imp.loss) {
        r->st.dropped++;
        blob_unref(b);
        return 0;
    }
    bool dup = u_dup < r->imp.duplicate;
    int64_t rel = release_time(r, now);
    uqueue one = {0};
    if (enqueue(f, &one, b, U_MSG, rel) < 0) {
        blob_unref(b);
        return DL_ENOMEM;
    }
    if (dup) {
        b->refs++;
        if (enqueue(f, &one, b, U_MSG, rel) < 0) {
            blob_unref(b);
            uq_free(&one);
            return DL_ENOMEM;
        }
        r->st.duplicated++;
    }
    if (f->held.head) {
        /* FIFO release keeps the held one behind this one whatever their times. */
        uq_splice(&f->q, &one);
        uq_splice(&f->q, &f->held);
        r->st.reordered++;
    } else if (u_re < r->imp.reorder) {
        uq_splice(&f->held, &one);
        f->held_until = now + DL_RELAY_REORDER_HOLD_MS * MS;
    } else {
        uq_splice(&f->q, &one);
    }
    return 0;
}

/* The frame in f->cmd or f->msg has all its body. */
static int frame_done(dl_relay *r, pair *p, int side, int64_t now)
{
    flow *f = &p->f[side];
    f->st = P_FLAGS;
    if (f->flags & ZMTP_CMD) {
        blob *b = f->cmd;
        f->cmd = NULL;
        f->ready = true;
        return emit_plain(r, f, b, U_CMD, now);
    }
    f->msg_frames++;
    if (f->flags & ZMTP_MORE) return 0;
    blob *b = f->msg;
    unsigned frames = f->msg_frames;
    f->msg = NULL;
    f->msg_frames = 0;
    return emit_msg(r, p, side, b, frames, now);
}

/* The frame header (flags + size) is complete: check the bounds and open
 * the frame in its unit. */
static int frame_begin(dl_relay *r, pair *p, int side, int64_t now, const char **why)
{
    flow *f = &p->f[side];
    uint64_t size = 0;
    for (unsigned i = 0; i < f->size_need; i++) size = size << 8 | f->size[i];
    blob **bp = (f->flags & ZMTP_CMD) ? &f->cmd : &f->msg;
    size_t have = *bp ? (*bp)->len : 0;
    size_t hdr = 1 + f->size_need;
    if (size > r->max_msg || have + hdr + size > r->max_msg) {
        *why = "frame or message above max_msg_bytes";
        return DL_ERANGE;
    }
    size_t final = have + hdr + (size_t)size;
    if (blob_reserve(bp, have + hdr, final) < 0) return DL_ENOMEM;
    blob_append(*bp, &f->flags, 1);
    blob_append(*bp, f->size, f->size_need);
    f->body_left = size;
    f->st = P_BODY;
    if (size == 0) return frame_done(r, p, side, now);
    return 0;
}

/* Body bytes of the current frame. */
static int body_bytes(dl_relay *r, pair *p, int side, const uint8_t *d, size_t n, int64_t now)
{
    flow *f = &p->f[side];
    assert(n <= f->body_left);
    blob **bp = (f->flags & ZMTP_CMD) ? &f->cmd : &f->msg;
    size_t len = (*bp)->len;
    if (blob_reserve(bp, len + n, len + (size_t)f->body_left) < 0) return DL_ENOMEM;
    blob_append(*bp, d, n);
    f->body_left -= n;
    if (f->body_left == 0) return frame_done(r, p, side, now);
    return 0;
}

/* Feed n bytes read from `side`. DL_EPROTO (why set) on bad framing. */
static int parse(dl_relay *r, pair *p, int side, const uint8_t *d, size_t n, int64_t now, const char **why)
{
    flow *f = &p->f[side];
    size_t i = 0;
    while (i < n) {
        switch (f->st) {
        case P_GREET: {
            size_t take = ZMTP_GREETING - f->greet_n;
            if (take > n - i) take = n - i;
            for (size_t k = 0; k < take; k++) {
                unsigned pos = f->greet_n + (unsigned)k;
                uint8_t c = d[i + k];
                /* Bytes 1..8 are padding (libzmq puts its identity length
                 * there); only the signature ends and the version matter. */
                if (pos == 0 && c != 0xFF) {
                    *why = "not a ZMTP greeting";
                    return DL_EPROTO;
                }
                if (pos == 9 && !(c & 0x01)) {
                    *why = "ZMTP 1.0 peer";
                    return DL_EPROTO;
                }
                if (pos == 10 && c < 3) {
                    *why = "ZMTP major version below 3";
                    return DL_EPROTO;
                }
            }
            blob *b = blob_new(take);
            if (!b) return DL_ENOMEM;
            blob_append(b, d + i, take);
            DL_TRY(emit_plain(r, f, b, U_GREET, now));
            f->greet_n += (unsigned)take;
            i += take;
            if (f->greet_n == ZMTP_GREETING) f->st = P_FLAGS;
            break;
        }
        case P_FLAGS:
            f->flags = d[i++];
            if (f->flags & ZMTP_RESERVED) {
                *why = "reserved frame flag bits set";
                return DL_EPROTO;
            }
            if ((f->flags & ZMTP_CMD) && (f->flags & ZMTP_MORE)) {
                *why = "command frame with MORE";
                return DL_EPROTO;
            }
            f->size_need = (f->flags & ZMTP_LONG) ? 8 : 1;
            f->size_n = 0;
            f->st = P_SIZE;
            break;
        case P_SIZE:
            f->size[f->size_n++] = d[i++];
            if (f->size_n == f->size_need) {
                int rc = frame_begin(r, p, side, now, why);
                if (rc == DL_ERANGE) return DL_EPROTO;
                if (rc < 0) return rc;
            }
            break;
        case P_BODY: {
            size_t take = n - i;
            if (take > f->body_left) take = (size_t)f->body_left;
            DL_TRY(body_bytes(r, p, side, d + i, take, now));
            i += take;
            break;
        }
        }
    }
    return 0;
}

/* Read what `side` has (up to READ_PASS bytes, and only while its flow is
 * under queue_max) and parse it. */
static void read_side(dl_relay *r, pair *p, int side, int64_t now)
{
    flow *f = &p->f[side];
    size_t total = 0;
    while (!p->dead && !p->eof[side] && f->queued < r->queue_max && total < READ_PASS) {
        ssize_t n;
        const char *why = "";
        int rc;
        if (f->st == P_BODY && f->body_left >= READ_CHUNK) {
            /* A large body: read straight into its unit, no second copy. */
            blob **bp = (f->flags & ZMTP_CMD) ? &f->cmd : &f->msg;
            size_t len = (*bp)->len, want = (size_t)f->body_left;
            if (want > READ_PASS) want = READ_PASS;
            if (blob_reserve(bp, len + want, len + (size_t)f->body_left) < 0) {
                oom(r, p, side);
                return;
            }
            n = read(p->fd[side], (*bp)->data + len, want);
            if (n > 0) {
                (*bp)->len += (size_t)n;
                f->body_left -= (uint64_t)n;
                rc = f->body_left == 0 ? frame_done(r, p, side, now) : 0;
                if (rc < 0) {
                    oom(r, p, side);
                    return;
                }
            }
        } else {
            n = read(p->fd[side], r->rbuf, READ_CHUNK);
            if (n > 0) {
                rc = parse(r, p, side, r->rbuf, (size_t)n, now, &why);
                if (rc == DL_EPROTO) {
                    bad_framing(r, p, side, why);
                    return;
                }
                if (rc < 0) {
                    oom(r, p, side);
                    return;
                }
            }
        }
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        if (n == 0) {
            side_eof(r, p, side, now);
            return;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        DL_DEBUG("relay %d: pair %llu: read %s: %s", r->port, (unsigned long long)p->id,
                 side == UP ? "learner" : "sync", strerror(errno));
        p->dead = true;
        return;
    }
}

/* ---- output: units -> bytes, on time and within the rate */

static double bucket_burst(double rate) { return rate / 50 > 16384 ? rate / 50 : 16384; }

static void bucket_refill(bucket *b, double rate, int64_t now)
{
    if (rate <= 0) {
        b->rate = 0;
        return;
    }
    double burst = bucket_burst(rate);
    if (b->rate <= 0) {
        b->tokens = burst; /* the link just got a rate: start with a full bucket */
    } else {
        b->tokens += (double)(now - b->last_ns) * rate / 1e9;
        if (b->tokens > burst) b->tokens = burst;
    }
    b->rate = rate;
    b->last_ns = now;
}

/* Smallest write worth waking up for: a quarter bucket, or what is left. */
static double bucket_need(double rate, size_t left)
{
    double q = bucket_burst(rate) / 4;
    return (double)left < q ? (double)left : q;
}

static double rate_bytes(const dl_relay *r) { return r->imp.rate_mbit > 0 ? r->imp.rate_mbit * 1e6 / 8 : 0; }

/* Whether flow `side` may write at all now (time and tokens aside). Nothing
 * goes toward a side that closed: its kernel would answer with an RST that
 * kills the pair before the other direction has drained. */
static bool can_write(const dl_relay *r, const pair *p, int side)
{
    int to = 1 - side;
    return !p->dead && p->fd[to] >= 0 && !(to == 1 && p->connecting) && !p->eof[to] && !p->f[side].want_out &&
           !r->imp.partitioned;
}

static void write_flow(dl_relay *r, pair *p, int side, int64_t now)
{
    flow *f = &p->f[side];
    int to = 1 - side;
    if (!can_write(r, p, side)) return;
    double rate = rate_bytes(r);
    bucket *bk = &r->bk[side];
    while (f->q.head && f->q.head->release_ns <= now) {
        unit *u = f->q.head;
        size_t left = u->b->len - u->off;
        if (rate > 0) {
            bucket_refill(bk, rate, now);
            if (bk->tokens < bucket_need(rate, left)) return;
            if ((double)left > bk->tokens) left = (size_t)bk->tokens;
        }
        ssize_t n = send(p->fd[to], u->b->data + u->off, left, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                f->want_out = true;
                return;
            }
            DL_DEBUG("relay %d: pair %llu: write %s: %s", r->port, (unsigned long long)p->id,
                     to == UP ? "learner" : "sync", strerror(errno));
            p->dead = true;
            return;
        }
        u->off += (size_t)n;
        if (rate > 0) bk->tokens -= (double)n;
        if (side == UP) r->st.up_bytes += (uint64_t)n;
        else r->st.down_bytes += (uint64_t)n;
        if (u->off < u->b->len) continue;
        uq_pop(&f->q);
        f->queued -= u->b->len + UNIT_COST;
        if (u->kind == U_MSG) {
            if (side == UP) r->st.up_msgs++;
            else r->st.down_msgs++;
        }
        blob_unref(u->b);
        free(u);
    }
}

/* When flow `side` next needs the loop without a socket event; INT64_MAX if never. */
static int64_t flow_deadline(const dl_relay *r, const pair *p, int side, int64_t now)
{
    const flow *f = &p->f[side];
    int64_t t = INT64_MAX;
    if (f->held.head && f->held_until < t) t = f->held_until;
    const unit *u = f->q.head;
    if (!u || !can_write(r, p, side)) return t;
    if (u->release_ns > now) return u->release_ns < t ? u->release_ns : t;
    double rate = rate_bytes(r);
    if (rate > 0) {
        const bucket *bk = &r->bk[side];
        double need = bucket_need(rate, u->b->len - u->off) - bk->tokens;
        if (need > 0) {
            int64_t w = bk->last_ns + (int64_t)ceil(need / rate * 1e9);
            return w < t ? w : t;
        }
    }
    return now; /* due now (e.g. the pass stopped early) */
}

/* ---- connections */

static void accept_all(dl_relay *r, int64_t now)
{
    for (;;) {
        int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                DL_WARN("relay %d: accept: %s", r->port, strerror(errno));
            return;
        }
        r->st.conns_accepted++;
        if (r->st.conns_open >= (uint64_t)r->max_conns) {
            DL_WARN("relay %d: %d connections open: refusing one more", r->port, r->max_conns);
            close(fd);
            continue;
        }
        set_nodelay(fd);
        int up = socket(r->up_addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (up < 0) {
            DL_WARN("relay %d: socket: %s", r->port, strerror(errno));
            r->st.conns_failed_upstream++;
            close(fd);
            continue;
        }
        set_nodelay(up);
        bool connecting = false;
        if (connect(up, (const struct sockaddr *)&r->up_addr, r->up_len) < 0) {
            if (errno == EINPROGRESS) {
                connecting = true;
            } else {
                /* The learner's ZeroMQ sees its connection close and reconnects with backoff. */
                DL_DEBUG("relay %d: upstream connect: %s", r->port, strerror(errno));
                r->st.conns_failed_upstream++;
                close(up);
                close(fd);
                continue;
            }
        }
        pair *p = dl_try_calloc(1, sizeof *p);
        if (!p) {
            DL_WARN("relay %d: out of memory for a pair", r->port);
            close(up);
            close(fd);
            continue;
        }
        p->id = ++r->next_id;
        p->fd[0] = fd;
        p->fd[1] = up;
        p->connecting = connecting;
        p->connect_until = now + CONNECT_MS * MS;
        p->pfd[0] = p->pfd[1] = -1;
        p->next = r->pairs;
        r->pairs = p;
        r->st.conns_open++;
        DL_DEBUG("relay %d: pair %llu open", r->port, (unsigned long long)p->id);
    }
}

static void connect_done(dl_relay *r, pair *p)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(p->fd[1], SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err == EINPROGRESS || err == EALREADY) return;
    if (err) {
        DL_DEBUG("relay %d: upstream connect: %s", r->port, strerror(err));
        r->st.conns_failed_upstream++;
        p->dead = true;
        return;
    }
    p->connecting = false;
}

/* Everything a pair does in one pass after poll(): socket events, timers, writes. */
static void service(dl_relay *r, pair *p, int64_t now)
{
    for (int s = 0; s < 2; s++) {
        if (p->pfd[s] < 0 || p->dead) continue;
        short ev = r->pfds[p->pfd[s]].revents;
        if (!ev) continue;
        if (s == 1 && p->connecting) {
            connect_done(r, p);
            continue;
        }
        if (ev & (POLLOUT | POLLERR | POLLHUP)) p->f[1 - s].want_out = false;
        if ((ev & (POLLIN | POLLERR | POLLHUP)) && (r->pfds[p->pfd[s]].events & POLLIN)) read_side(r, p, s, now);
    }
    if (p->dead) return;
    if (p->connecting && now >= p->connect_until) {
        DL_DEBUG("relay %d: upstream connect: timed out", r->port);
        r->st.conns_failed_upstream++;
        p->dead = true;
        return;
    }
    for (int s = 0; s < 2; s++) {
        flow *f = &p->f[s];
        if (f->held.head && now >= f->held_until) uq_splice(&f->q, &f->held); /* nothing followed: not reordered */
        write_flow(r, p, s, now);
    }
    if (p->dead || !p->drain_until) return;
    /* A side closed: the pair goes once what that side sent has gone on. */
    bool drained = true;
    for (int s = 0; s < 2; s++)
        if (p->eof[s] && (p->f[s].q.head || p->f[s].held.head)) drained = false;
    if (drained || now >= p->drain_until) p->dead = true;
}

/* ---- the loop */

/* Move the first pair to the end. The pass serves pairs in list order and
 * the first one takes what the shared token bucket holds, so without this
 * one busy learner would starve the others of a rate-limited link. */
static void rotate(dl_relay *r)
{
    pair *first = r->pairs;
    if (!first || !first->next) return;
    pair *last = first;
    while (last->next) last = last->next;
    r->pairs = first->next;
    first->next = NULL;
    last->next = first;
}

static int pfd_add(dl_relay *r, size_t *n, int fd, short events)
{
    if (*n == r->pfd_cap) {
        size_t cap = r->pfd_cap * 2;
        struct pollfd *np = dl_try_realloc(r->pfds, cap * sizeof *np);
        if (!np) return -1;
        r->pfds = np;
        r->pfd_cap = cap;
    }
    r->pfds[*n] = (struct pollfd){.fd = fd, .events = events, .revents = 0};
    return (int)(*n)++;
}

static void *relay_main(void *arg)
{
    dl_relay *r = arg;
    size_t npfd = 0;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        int64_t now = dl_clock_ns();
        if (r->cut_done != r->cut_req) {
            r->cut_count = cut_all(r);
            r->cut_done = r->cut_req;
            pthread_cond_broadcast(&r->cv);
        }
        if (npfd >= 2 && (r->pfds[0].revents & POLLIN)) {
            uint8_t buf[64];
            while (read(r->wake[0], buf, sizeof buf) > 0) {
            }
        }
        for (pair *p = r->pairs; p; p = p->next) service(r, p, now);
        if (npfd >= 2 && (r->pfds[1].revents & POLLIN)) accept_all(r, now);
        reap(r);
        rotate(r);

        /* Next pass: what to wait for and until when. */
        npfd = 0;
        pfd_add(r, &npfd, r->wake[0], POLLIN); /* the first two fit the initial capacity */
        /* a partitioned link takes no new connections either: they wait in the
         * backlog (a SYN retried) and are accepted when it heals */
        pfd_add(r, &npfd, r->lfd, r->imp.partitioned ? 0 : POLLIN);
        int64_t next = now + POLL_MAX_MS * MS;
        for (pair *p = r->pairs; p; p = p->next) {
            for (int s = 0; s < 2; s++) {
                short ev = 0;
                bool closing = p->drain_until != 0;
                if (s == 1 && p->connecting) ev = POLLOUT;
                else if (!closing && p->f[s].queued < r->queue_max) ev |= POLLIN;
                if (p->f[1 - s].want_out) ev |= POLLOUT;
                /* Only sockets we want something from: a closed peer's POLLHUP
                 * would otherwise wake the loop over and over while it drains. */
                p->pfd[s] = ev ? pfd_add(r, &npfd, p->fd[s], ev) : -1;
                int64_t t = flow_deadline(r, p, s, now);
                if (t < next) next = t;
                if (p->pfd[s] < 0 && ev) p->dead = true; /* no memory to poll it: give the pair up */
            }
            if (p->connecting && p->connect_until < next) next = p->connect_until;
            if (p->drain_until && p->drain_until < next) next = p->drain_until;
            if (p->dead) next = now;
        }
        int64_t wait_ns = next - dl_clock_ns();
        int timeout = wait_ns <= 0 ? 0 : (int)((wait_ns + MS - 1) / MS);

        pthread_mutex_unlock(&r->mu);
        int n = poll(r->pfds, npfd, timeout);
        pthread_mutex_lock(&r->mu);
        if (n < 0) {
            if (errno != EINTR) DL_WARN("relay %d: poll: %s", r->port, strerror(errno));
            for (size_t i = 0; i < npfd; i++) r->pfds[i].revents = 0;
        }
    }
    cut_all(r);
    r->cut_done = r->cut_req;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- public */

static int resolve(const char *host, int port, bool passive, struct sockaddr_storage *out, socklen_t *len)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *ai = NULL;
    int e = getaddrinfo(host, ps, &hints, &ai);
    if (e != 0 || !ai) return dl_err(DL_ENET, "relay: resolve %s:%d: %s", host, port, gai_strerror(e));
    memcpy(out, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* What open made, once the thread is gone (or never started). */
static void free_relay(dl_relay *r)
{
    close_fd(&r->lfd, false);
    close_fd(&r->wake[0], false);
    close_fd(&r->wake[1], false);
    free(r->pfds);
    free(r->rbuf);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int dl_relay_open(const dl_relay_cfg *cfg, dl_relay **out)
{
    assert(cfg && out);
    *out = NULL;
    if (!cfg->listen_host || !cfg->upstream_host) return dl_err(DL_EINVAL, "relay: listen_host and upstream_host are required");
    if (cfg->listen_port < 0 || cfg->listen_port > 65535 || cfg->upstream_port <= 0 || cfg->upstream_port > 65535)
        return dl_err(DL_EINVAL, "relay: ports %d -> %d outside [0, 65535] (upstream > 0)", cfg->listen_port,
                      cfg->upstream_port);
    if (cfg->max_conns < 0) return dl_err(DL_EINVAL, "relay: max_conns %d < 0", cfg->max_conns);

    dl_relay *r = dl_try_calloc(1, sizeof *r);
    if (!r) return dl_err(DL_ENOMEM, "relay: %zu bytes", sizeof *r);
    r->lfd = r->wake[0] = r->wake[1] = -1;
    r->queue_max = cfg->queue_max_bytes ? cfg->queue_max_bytes : DL_RELAY_QUEUE_DEFAULT;
    r->max_msg = cfg->max_msg_bytes ? cfg->max_msg_bytes : DL_RELAY_MAX_MSG_DEFAULT;
    r->max_conns = cfg->max_conns ? cfg->max_conns : DL_RELAY_MAX_CONNS_DEFAULT;
    dl_rng_seed(&r->rng, cfg->seed);
    dl_rng_seed(&r->jrng, cfg->seed ^ UINT64_C(0x6a09e667f3bcc908));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int rc = 0;

    r->pfd_cap = 16;
    r->pfds = dl_try_calloc(r->pfd_cap, sizeof *r->pfds);
    r->rbuf = dl_try_malloc(READ_CHUNK);
    if (!r->pfds || !r->rbuf) {
        rc = dl_err(DL_ENOMEM, "relay: buffers");
        goto fail;
    }
    if ((rc = resolve(cfg->upstream_host, cfg->upstream_port, false, &r->up_addr, &r->up_len)) < 0) goto fail;
    struct sockaddr_storage la;
    socklen_t llen;
    if ((rc = resolve(cfg->listen_host, cfg->listen_port, true, &la, &llen)) < 0) goto fail;
    r->lfd = socket(la.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (r->lfd < 0 || setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(r->lfd, (struct sockaddr *)&la, llen) < 0 || listen(r->lfd, 128) < 0) {
        rc = dl_err(DL_ENET, "relay: listen on %s:%d: %s", cfg->listen_host, cfg->listen_port, strerror(errno));
        goto fail;
    }
    llen = sizeof la;
    if (getsockname(r->lfd, (struct sockaddr *)&la, &llen) < 0) {
        rc = dl_err(DL_ENET, "relay: getsockname: %s", strerror(errno));
        goto fail;
    }
    r->port = ntohs(la.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&la)->sin6_port
                                             : ((struct sockaddr_in *)&la)->sin_port);
    if (pipe2(r->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
        rc = dl_err(DL_EIO, "relay: pipe: %s", strerror(errno));
        goto fail;
    }
    if ((errno = pthread_create(&r->thread, NULL, relay_main, r)) != 0) {
        rc = dl_err(DL_EIO, "relay: thread: %s", strerror(errno));
        goto fail;
    }
    DL_DEBUG("relay %d: forwarding to %s:%d", r->port, cfg->upstream_host, cfg->upstream_port);
    *out = r;
    return 0;
fail:
    free_relay(r);
    return rc;
}

int dl_relay_port(const dl_relay *r)
{
    assert(r);
    return r->port;
}

static double clamp(double v, double lo, double hi)
{
    if (!(v >= lo)) return lo; /* NaN too */
    return v > hi ? hi : v;
}

void dl_relay_set(dl_relay *r, const dl_relay_impair *imp)
{
    assert(r && imp);
    dl_relay_impair c = {
        .delay_ms = clamp(imp->delay_ms, 0, 1e7),
        .jitter_ms = clamp(imp->jitter_ms, 0, 1e7),
        .loss = clamp(imp->loss, 0, 1),
        .duplicate = clamp(imp->duplicate, 0, 1),
        .reorder = clamp(imp->reorder, 0, 1),
        .rate_mbit = clamp(imp->rate_mbit, 0, 1e7),
        .partitioned = imp->partitioned ? 1 : 0,
    };
    pthread_mutex_lock(&r->mu);
    r->imp = c;
    pthread_mutex_unlock(&r->mu);
    wake(r);
}

void dl_relay_get(dl_relay *r, dl_relay_impair *out)
{
    assert(r && out);
    pthread_mutex_lock(&r->mu);
    *out = r->imp;
    pthread_mutex_unlock(&r->mu);
}

static bool pair_live(const pair *p)
{
    return !p->dead && !p->connecting && !p->drain_until && p->f[UP].ready && p->f[DOWN].ready;
}

int dl_relay_replay(dl_relay *r)
{
    assert(r);
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    pair *target = NULL;
    if (r->capture) {
        /* The pair it came from, else the newest (largest id) live one. */
        for (pair *p = r->pairs; p; p = p->next) {
            if (!pair_live(p)) continue;
            if (p->id == r->capture_pair) {
                target = p;
                break;
            }
            if (!target || p->id > target->id) target = p;
        }
    }
    if (!target) {
        rc = dl_err(DL_ENOTFOUND, "relay %d: %s", r->port,
                    r->capture ? "no live upstream connection" : "no learner->sync message captured yet");
    } else {
        /* At the queue's tail, so it starts at a message boundary after the
         * units already queued (the handshake among them). */
        r->capture->refs++;
        if (enqueue(&target->f[UP], &target->f[UP].q, r->capture, U_MSG, dl_clock_ns()) < 0) {
            r->capture->refs--;
            rc = dl_err(DL_ENOMEM, "relay %d: replay unit", r->port);
        } else {
            r->st.replayed++;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (rc == 0) wake(r);
    return rc;
}

int dl_relay_cut(dl_relay *r)
{
    assert(r);
    pthread_mutex_lock(&r->mu);
    uint64_t ticket = ++r->cut_req;
    wake(r);
    while (r->cut_done < ticket) pthread_cond_wait(&r->cv, &r->mu);
    int n = r->cut_count;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void dl_relay_stats_get(dl_relay *r, dl_relay_stats *out)
{
    assert(r && out);
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}

void dl_relay_close(dl_relay **rp)
{
    if (!rp || !*rp) return;
    dl_relay *r = *rp;
    *rp = NULL;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_mutex_unlock(&r->mu);
    wake(r);
    pthread_join(r->thread, NULL);
    blob_unref(r->capture);
    free_relay(r);
}
