/* CURVE authentication: key files, the learner allowlist (hash table keyed by
 * public key) and the ZAP handler thread (ZeroMQ RFC 27) that applies it. */
#include "proto/auth.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"
#include "proto/wire.h"

#define KEY_FILE_MAX 4096u                /* bytes of a .key / .pub file */
#define LIST_FILE_MAX (32u << 20)         /* bytes of an allowlist file */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_POLL_MS 100                   /* stop-flag latency of the handler */
#define ZAP_MAX_FRAMES 8                  /* CURVE requests have 7 */
#define DENY_LOG_NS 1000000000LL          /* at most one denial line per second */
#define SHOW_MAX 64                       /* chars of outside text in a message */

static const char Z85_CHARS[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
static const char KEY_COMMENT[] = "# dloco CURVE key (learner or synchronizer); keep .key secret\n";

// ---------------------------------------------------------------------------
// validity of keys and ids

static int z85_char(unsigned char c) { return c && strchr(Z85_CHARS, c) != NULL; }

/* The n bytes at s are a valid key: Z85 chars that decode to 32 bytes and
 * re-encode to themselves (a group whose value passes 2^32 does not). */
static int z85_ok_n(const char *s, size_t n)
{
    if (n != DL_AUTH_Z85_LEN) return 0;
    char z[DL_AUTH_Z85_LEN + 1], back[DL_AUTH_Z85_LEN + 1];
    for (size_t i = 0; i < n; i++)
        if (!z85_char((unsigned char)s[i])) return 0;
    memcpy(z, s, n);
    z[n] = 0;
    uint8_t raw[32];
    if (!zmq_z85_decode(raw, z)) return 0;
    if (!zmq_z85_encode(back, raw, sizeof raw)) return 0;
    return memcmp(back, z, DL_AUTH_Z85_LEN) == 0;
}

int dl_auth_z85_ok(const char *s) { return s && z85_ok_n(s, strnlen(s, DL_AUTH_Z85_LEN + 1)); }

static int id_ok_n(const char *s, size_t n) { return dl_wire_id_ok_n(s, n); }

int dl_auth_id_ok(const char *id) { return dl_wire_id_ok(id); }

/* Outside text for a message: at most SHOW_MAX chars, bytes outside
 * printable ASCII (and '"') as '?', "..." when cut. */
static const char *show(const char *s, size_t n, char out[SHOW_MAX + 4])
{
    size_t k = n < SHOW_MAX ? n : SHOW_MAX;
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = c >= 0x20 && c < 0x7f && c != '"' ? (char)c : '?';
    }
    if (n > SHOW_MAX) memcpy(out + k, "...", 3), k += 3;
    out[k] = 0;
    return out;
}

static int blank(char c) { return c == ' ' || c == '\t'; }

// ---------------------------------------------------------------------------
// files

enum { MODE_ANY, MODE_KEY, MODE_LIST };

/* Read the whole regular file `path` (at most `max` bytes) into a new
 * NUL-terminated heap buffer, after the permission rule `rule` passed on the
 * open descriptor (so the mode checked is the mode of the file read). */
static int read_file(const char *path, size_t max, int rule, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return dl_err(DL_EIO, "open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dl_err(DL_EIO, "stat %s: %s", path, strerror(e));
    }
    unsigned mode = (unsigned)st.st_mode & 07777;
    int rc = 0;
    if (!S_ISREG(st.st_mode)) rc = dl_err(DL_EIO, "%s is not a regular file", path);
    else if (rule == MODE_KEY && (mode & 077))
        rc = dl_err(DL_EPERM, "key file %s is mode %04o: chmod 600 it", path, mode);
    else if (rule == MODE_LIST && (mode & S_IWOTH))
        rc = dl_err(DL_EPERM, "allowlist %s is mode %04o (writable by others): chmod o-w it", path, mode);
    else if ((uint64_t)st.st_size > max)
        rc = dl_err(DL_EIO, "%s is %lld bytes, max %zu", path, (long long)st.st_size, max);
    if (rc) {
        close(fd);
        return rc;
    }
    /* One byte more than the size: a file that grew while read is noticed. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *b = dl_try_malloc(cap + 1);
    if (!b) {
        close(fd);
        return dl_err(DL_ENOMEM, "%s: no memory for %zu bytes", path, cap);
    }
    while (n < cap) {
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = dl_err(DL_EIO, "read %s: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (!rc && n == cap) rc = dl_err(DL_EIO, "read %s: the file changed while being read", path);
    if (rc) {
        explicit_bzero(b, cap + 1);
        free(b);
        return rc;
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

static void free_secret(char *b, size_t len)
{
    if (!b) return;
    explicit_bzero(b, len);
    free(b);
}

/* The next line of text at *p (before end) that is neither blank nor a
 * '#' comment: [*s, *q) without leading blanks, CR or LF; *line counts every
 * line passed. 0 at the end. */
static int next_line(const char **p, const char *end, int *line, const char **s, const char **q)
{
    while (*p < end) {
        const char *e = memchr(*p, '\n', (size_t)(end - *p));
        const char *next = e ? e + 1 : end;
        if (!e) e = end;
        (*line)++;
        if (e > *p && e[-1] == '\r') e--;
        const char *b = *p;
        *p = next;
        while (b < e && blank(*b)) b++;
        if (b == e || *b == '#') continue;
        *s = b;
        *q = e;
        return 1;
    }
    return 0;
}

/* Parse key file text: "public = K" / "secret = K" lines, comments, blanks.
 * Values are never echoed (one of them is a secret). */
static int parse_keyfile(const char *text, size_t len, const char *name, char pub[DL_AUTH_Z85_LEN + 1],
                         char sec[DL_AUTH_Z85_LEN + 1])
{
    pub[0] = sec[0] = 0;
    int line = 0;
    if (!len) text = ""; /* NULL + 0 is undefined */
    const char *p = text, *end = text + len, *s, *q;
    while (next_line(&p, end, &line, &s, &q)) {
        const char *f = s;
        while (s < q && *s >= 'a' && *s <= 'z') s++;
        size_t flen = (size_t)(s - f);
        char *dst = flen == 6 && !memcmp(f, "public", 6) ? pub : flen == 6 && !memcmp(f, "secret", 6) ? sec : NULL;
        while (s < q && blank(*s)) s++;
        if (!dst || s == q || *s != '=')
            return dl_err(DL_EFORMAT, "%s:%d: expected \"public = <key>\" or \"secret = <key>\"", name, line);
        const char *what = dst == pub ? "public" : "secret";
        if (dst[0]) return dl_err(DL_EFORMAT, "%s:%d: %s given twice", name, line, what);
        s++;
        while (s < q && blank(*s)) s++;
        const char *v = s;
        while (s < q && !blank(*s)) s++;
        size_t vlen = (size_t)(s - v);
        while (s < q && blank(*s)) s++;
        if (s != q) return dl_err(DL_EFORMAT, "%s:%d: text after the %s key", name, line, what);
        if (!z85_ok_n(v, vlen)) return dl_err(DL_EFORMAT, "%s:%d: %s key is not 40 Z85 characters", name, line, what);
        memcpy(dst, v, DL_AUTH_Z85_LEN);
        dst[DL_AUTH_Z85_LEN] = 0;
    }
    return 0;
}

static int create_excl(const char *path, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return dl_err(DL_EIO, "create %s: %s", path, strerror(errno));
    if (fchmod(fd, mode) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return dl_err(DL_EIO, "chmod %s: %s", path, strerror(e));
    }
    return fd;
}

/* Write all of buf, fsync and close fd (closed whatever happens). */
static int write_close(int fd, const char *path, const char *buf, size_t n)
{
    int rc = 0;
    for (size_t off = 0; off < n && !rc;) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) rc = dl_err(DL_EIO, "write %s: %s", path, strerror(errno));
        else off += (size_t)w;
    }
    if (!rc && fsync(fd) != 0) rc = dl_err(DL_EIO, "fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && !rc) rc = dl_err(DL_EIO, "close %s: %s", path, strerror(errno));
    return rc;
}

int dl_auth_keygen(const char *prefix, dl_auth_keypair *out)
{
    assert(prefix);
    if (out) memset(out, 0, sizeof *out);
    if (!prefix[0]) return dl_err(DL_EINVAL, "key prefix is empty");
    char kpath[PATH_MAX], ppath[PATH_MAX];
    if ((size_t)snprintf(kpath, sizeof kpath, "%s.key", prefix) >= sizeof kpath ||
        (size_t)snprintf(ppath, sizeof ppath, "%s.pub", prefix) >= sizeof ppath)
        return dl_err(DL_EINVAL, "key prefix is %zu bytes: too long for a path", strlen(prefix));
    dl_auth_keypair kp;
    memset(&kp, 0, sizeof kp);
    if (zmq_curve_keypair(kp.public_z85, kp.secret_z85) != 0)
        return dl_err(DL_ENET, "zmq_curve_keypair: %s (libzmq without CURVE?)", zmq_strerror(zmq_errno()));
    int kfd = create_excl(kpath, 0600);
    if (kfd < 0) {
        explicit_bzero(&kp, sizeof kp);
        return kfd;
    }
    int pfd = create_excl(ppath, 0644);
    if (pfd < 0) {
        close(kfd);
        unlink(kpath);
        explicit_bzero(&kp, sizeof kp);
        return pfd;
    }
    char ktext[256], ptext[160];
    int kn = snprintf(ktext, sizeof ktext, "%spublic = %s\nsecret = %s\n", KEY_COMMENT, kp.public_z85, kp.secret_z85);
    int pn = snprintf(ptext, sizeof ptext, "%spublic = %s\n", KEY_COMMENT, kp.public_z85);
    assert(kn > 0 && (size_t)kn < sizeof ktext && pn > 0 && (size_t)pn < sizeof ptext);
    int rc = write_close(kfd, kpath, ktext, (size_t)kn);
    int rc2 = write_close(pfd, ppath, ptext, (size_t)pn);
    explicit_bzero(ktext, sizeof ktext);
    if (!rc) rc = rc2;
    if (rc) {
        unlink(kpath);
        unlink(ppath);
    } else if (out) {
        *out = kp;
    }
    explicit_bzero(&kp, sizeof kp);
    return rc;
}

int dl_auth_load_keypair(const char *path, dl_auth_keypair *out)
{
    assert(path && out);
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    DL_TRY(read_file(path, KEY_FILE_MAX, MODE_KEY, &buf, &len));
    dl_auth_keypair kp;
    int rc = parse_keyfile(buf, len, path, kp.public_z85, kp.secret_z85);
    free_secret(buf, len);
    if (!rc && !kp.public_z85[0]) rc = dl_err(DL_EFORMAT, "%s: no \"public = <key>\" line", path);
    if (!rc && !kp.secret_z85[0])
        rc = dl_err(DL_EFORMAT, "%s: no \"secret = <key>\" line (a .pub file? the pair is in the .key)", path);
    char derived[DL_AUTH_Z85_LEN + 1];
    if (!rc && zmq_curve_public(derived, kp.secret_z85) != 0)
        rc = dl_err(DL_ENET, "zmq_curve_public: %s (libzmq without CURVE?)", zmq_strerror(zmq_errno()));
    if (!rc && strcmp(derived, kp.public_z85) != 0)
        rc = dl_err(DL_EFORMAT, "%s: the public key does not belong to the secret key", path);
    if (!rc) *out = kp;
    explicit_bzero(&kp, sizeof kp);
    return rc;
}

int dl_auth_load_public(const char *path_or_z85, char out[DL_AUTH_Z85_LEN + 1])
{
    assert(path_or_z85 && out);
    out[0] = 0;
    if (dl_auth_z85_ok(path_or_z85)) {
        memcpy(out, path_or_z85, DL_AUTH_Z85_LEN + 1);
        return 0;
    }
    char *buf;
    size_t len;
    DL_TRY(read_file(path_or_z85, KEY_FILE_MAX, MODE_ANY, &buf, &len));
    char pub[DL_AUTH_Z85_LEN + 1], sec[DL_AUTH_Z85_LEN + 1];
    int rc = parse_keyfile(buf, len, path_or_z85, pub, sec);
    free_secret(buf, len);
    explicit_bzero(sec, sizeof sec);
    if (!rc && !pub[0]) rc = dl_err(DL_EFORMAT, "%s: no \"public = <key>\" line", path_or_z85);
    if (!rc) memcpy(out, pub, sizeof pub);
    return rc;
}

// ---------------------------------------------------------------------------
// the allowlist: entries plus two open-addressing tables of entry index + 1
// (0 = empty slot), one by key and one by id; load factor at most 1/2

typedef struct {
    char id[DL_AUTH_ID_MAX + 1];
    char key[DL_AUTH_Z85_LEN + 1];
    int line; /* where it was given, for duplicate messages */
} entry;

struct dl_auth_list {
    int n, cap;         /* entries used / allocated */
    entry *e;           /* [cap] */
    uint32_t *by_key;   /* [mask + 1] */
    uint32_t *by_id;    /* [mask + 1] */
    size_t mask;        /* table size - 1, a power of two minus one */
};

static size_t key_hash(const char *key) { return (size_t)dl_hash64(key, DL_AUTH_Z85_LEN, 0); }
static size_t id_hash(const char *id, size_t n) { return (size_t)dl_hash64(id, n, 1); }

static int find_key(const dl_auth_list *l, const char *key)
{
    for (size_t i = key_hash(key) & l->mask;; i = (i + 1) & l->mask) {
        uint32_t s = l->by_key[i];
        if (!s) return -1;
        if (!memcmp(l->e[s - 1].key, key, DL_AUTH_Z85_LEN)) return (int)s - 1;
    }
}

static int find_id(const dl_auth_list *l, const char *id, size_t n)
{
    for (size_t i = id_hash(id, n) & l->mask;; i = (i + 1) & l->mask) {
        uint32_t s = l->by_id[i];
        if (!s) return -1;
        if (strlen(l->e[s - 1].id) == n && !memcmp(l->e[s - 1].id, id, n)) return (int)s - 1;
    }
}

static void table_put(uint32_t *tab, size_t mask, size_t h, int idx)
{
    size_t i = h & mask;
    while (tab[i]) i = (i + 1) & mask;
    tab[i] = (uint32_t)idx + 1;
}

static void list_rehash(dl_auth_list *l, size_t size)
{
    free(l->by_key);
    free(l->by_id);
    l->mask = size - 1;
    l->by_key = dl_xcalloc(size, sizeof *l->by_key);
    l->by_id = dl_xcalloc(size, sizeof *l->by_id);
    for (int k = 0; k < l->n; k++) {
        table_put(l->by_key, l->mask, key_hash(l->e[k].key), k);
        table_put(l->by_id, l->mask, id_hash(l->e[k].id, strlen(l->e[k].id)), k);
    }
}

static void list_add(dl_auth_list *l, const char *id, size_t idlen, const char *key, int line)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->e = dl_xrealloc(l->e, (size_t)l->cap * sizeof *l->e);
    }
    if ((size_t)(l->n + 1) * 2 > l->mask + 1) list_rehash(l, (l->mask + 1) * 2);
    entry *e = &l->e[l->n];
    memcpy(e->id, id, idlen);
    e->id[idlen] = 0;
    memcpy(e->key, key, DL_AUTH_Z85_LEN);
    e->key[DL_AUTH_Z85_LEN] = 0;
    e->line = line;
    table_put(l->by_key, l->mask, key_hash(e->key), l->n);
    table_put(l->by_id, l->mask, id_hash(e->id, idlen), l->n);
    l->n++;
}

/* One non-comment line [s, q): "<id> <key> [# comment]". */
static int parse_list_line(dl_auth_list *l, const char *s, const char *q, const char *name, int line)
{
    char a[SHOW_MAX + 4], b[SHOW_MAX + 4];
    const char *id = s;
    while (s < q && !blank(*s)) s++;
    size_t idlen = (size_t)(s - id);
    if (!id_ok_n(id, idlen))
        return dl_err(DL_EFORMAT, "%s:%d: learner id \"%s\" is not [A-Za-z0-9._-]{1,64}", name, line,
                      show(id, idlen, a));
    show(id, idlen, a);
    while (s < q && blank(*s)) s++;
    if (s == q) return dl_err(DL_EFORMAT, "%s:%d: learner id \"%s\": no public key", name, line, a);
    const char *key = s;
    while (s < q && !blank(*s)) s++;
    size_t keylen = (size_t)(s - key);
    if (!z85_ok_n(key, keylen))
        return dl_err(DL_EFORMAT, "%s:%d: learner id \"%s\": public key \"%s\" is not 40 Z85 characters", name, line,
                      a, show(key, keylen, b));
    while (s < q && blank(*s)) s++;
    if (s < q && *s != '#')
        return dl_err(DL_EFORMAT, "%s:%d: learner id \"%s\": trailing text \"%s\" after the public key", name, line,
                      a, show(s, (size_t)(q - s), b));
    int k = find_id(l, id, idlen);
    if (k >= 0)
        return dl_err(DL_EFORMAT, "%s:%d: duplicate learner id \"%s\" (first on line %d)", name, line, a,
                      l->e[k].line);
    if ((k = find_key(l, key)) >= 0)
        return dl_err(DL_EFORMAT, "%s:%d: learner id \"%s\": public key already belongs to \"%s\" (line %d)", name,
                      line, a, l->e[k].id, l->e[k].line);
    if (l->n >= DL_AUTH_MAX_ENTRIES)
        return dl_err(DL_EFORMAT, "%s:%d: more than %d entries", name, line, DL_AUTH_MAX_ENTRIES);
    list_add(l, id, idlen, key, line);
    return 0;
}

int dl_auth_list_parse(const char *text, size_t len, const char *name, dl_auth_list **out)
{
    assert(out && (text || !len));
    *out = NULL;
    if (!name) name = "allowlist";
    dl_auth_list *l = dl_xcalloc(1, sizeof *l);
    list_rehash(l, 32);
    int line = 0, rc = 0;
    if (!len) text = ""; /* (NULL, 0) is the empty list; NULL + 0 is undefined */
    const char *p = text, *end = text + len, *s, *q;
    while (!rc && next_line(&p, end, &line, &s, &q)) rc = parse_list_line(l, s, q, name, line);
    if (rc) {
        dl_auth_list_free(&l);
        return rc;
    }
    *out = l;
    return 0;
}

int dl_auth_list_load(const char *path, dl_auth_list **out)
{
    assert(path && out);
    *out = NULL;
    char *buf;
    size_t len;
    DL_TRY(read_file(path, LIST_FILE_MAX, MODE_LIST, &buf, &len));
    int rc = dl_auth_list_parse(buf, len, path, out);
    free(buf);
    return rc;
}

int dl_auth_list_count(const dl_auth_list *l) { return l ? l->n : 0; }

const char *dl_auth_list_owner(const dl_auth_list *l, const char *public_z85)
{
    if (!l || !public_z85 || strnlen(public_z85, DL_AUTH_Z85_LEN + 1) != DL_AUTH_Z85_LEN) return NULL;
    int k = find_key(l, public_z85);
    return k >= 0 ? l->e[k].id : NULL;
}

void dl_auth_list_free(dl_auth_list **l)
{
    if (!l || !*l) return;
    free((*l)->e);
    free((*l)->by_key);
    free((*l)->by_id);
    free(*l);
    *l = NULL;
}

// ---------------------------------------------------------------------------
// the ZAP handler

struct dl_auth {
    void *sock;               /* REP at ZAP_ENDPOINT; the handler thread's alone once started */
    char *path;               /* allowlist file, re-read by dl_auth_reload */
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t mu;       /* guards list */
    dl_auth_list *list;
    _Atomic uint64_t admitted, denied;
    /* handler thread only: the rate-limited denial report */
    int64_t deny_last_ns;     /* monotonic time of the last report line */
    int deny_reported;        /* a line has been written (deny_last_ns is set) */
    uint64_t deny_pending;    /* denials since the last line */
    char deny_mech[24], deny_addr[72], deny_key[DL_AUTH_Z85_LEN + 1];
    const char *deny_reason;
    /* dl_auth_watch: handshakes libzmq refused before ZAP (under mu until
     * the handler thread takes the monitor socket; then its alone) */
    void *mon_pending, *mon;
    uint64_t hs_pending;      /* refusals since the last line */
    int64_t hs_last_ns;
    int hs_reported;
    uint32_t hs_value;        /* the latest refusal's ZMQ_PROTOCOL_ERROR_*, or errno (no detail) */
    int hs_no_detail;         /* ... was ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL */
    char hs_endpoint[128];    /* the endpoint it came in on */
};

/* Frame content as a NUL-terminated string for logs: bytes outside printable
 * ASCII as '?', cut to fit. */
static void frame_text(zmq_msg_t *m, char *out, size_t cap)
{
    size_t n = zmq_msg_size(m);
    const unsigned char *d = zmq_msg_data(m);
    if (n > cap - 1) n = cap - 1;
    for (size_t i = 0; i < n; i++) out[i] = d[i] >= 0x20 && d[i] < 0x7f ? (char)d[i] : '?';
    out[n] = 0;
}

static int frame_is(zmq_msg_t *m, const char *s)
{
    size_t n = strlen(s);
    return zmq_msg_size(m) == n && !memcmp(zmq_msg_data(m), s, n);
}

static void deny_report(dl_auth *a, int64_t now)
{
    if (!a->deny_pending) return;
    if (a->deny_reported && now - a->deny_last_ns < DENY_LOG_NS) return;
    DL_WARN("auth: denied %llu connection(s) since the last report; latest: %s from %s, key %.8s%s: %s",
            (unsigned long long)a->deny_pending, a->deny_mech, a->deny_addr, a->deny_key,
            strcmp(a->deny_key, "none") ? "..." : "", a->deny_reason);
    char em[64], ea[160], ek[96];
    dl_event("auth_denied", "mechanism=%s address=%s key=%s reason=%s count=%llu",
             dl_event_str(a->deny_mech, em, sizeof em), dl_event_str(a->deny_addr, ea, sizeof ea),
             dl_event_str(a->deny_key, ek, sizeof ek), a->deny_reason, (unsigned long long)a->deny_pending);
    a->deny_pending = 0;
    a->deny_last_ns = now;
    a->deny_reported = 1;
}

/* Why libzmq refused a handshake, for the operator. A client without keys
 * usually sees the mismatch first and hangs up: the server then sees only
 * the connection end (no detail, the errno in v). */
static const char *hs_reason(int no_detail, uint32_t v)
{
    if (no_detail)
        return "the client hung up during the handshake: most often it has no CURVE keys (--server_key with this "
               "synchronizer's .pub and --key_file with its own key pair)";
    if (v == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return "the client does not use CURVE (no --server_key/--key_file): it must be given this synchronizer's "
               ".pub and its own key pair";
    if (v == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
        return "the client's server_key is not this synchronizer's public key";
    return "the client broke the ZMTP/CURVE handshake";
}

static void hs_report(dl_auth *a, int64_t now)
{
    if (!a->hs_pending) return;
    if (a->hs_reported && now - a->hs_last_ns < DENY_LOG_NS) return;
    DL_WARN("auth: refused %llu handshake(s) on %s since the last report; latest: %s (code 0x%x)",
            (unsigned long long)a->hs_pending, a->hs_endpoint, hs_reason(a->hs_no_detail, a->hs_value), a->hs_value);
    char ee[200];
    dl_event("handshake_refused", "endpoint=%s reason=%s code=%u count=%llu",
             dl_event_str(a->hs_endpoint, ee, sizeof ee),
             a->hs_no_detail                                            ? "hung_up"
             : a->hs_value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? "mechanism"
             : a->hs_value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC      ? "server_key"
                                                                          : "protocol",
             a->hs_value, (unsigned long long)a->hs_pending);
    a->hs_pending = 0;
    a->hs_last_ns = now;
    a->hs_reported = 1;
}

/* Drain the monitor socket: each refused handshake is counted. */
static void mon_drain(dl_auth *a)
{
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, a->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        uint16_t ev = 0;
        uint32_t val = 0;
        if (zmq_msg_size(&m) >= 6) {
            memcpy(&ev, zmq_msg_data(&m), 2);
            memcpy(&val, (const char *)zmq_msg_data(&m) + 2, 4);
        }
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        char ep[sizeof a->hs_endpoint] = "";
        while (more) { /* the endpoint frame */
            zmq_msg_t b;
            zmq_msg_init(&b);
            if (zmq_msg_recv(&b, a->mon, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&b);
                break;
            }
            frame_text(&b, ep, sizeof ep);
            more = zmq_msg_more(&b);
            zmq_msg_close(&b);
        }
        if (ev & (ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)) {
            a->hs_pending++;
            a->hs_value = val;
            a->hs_no_detail = ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
            memcpy(a->hs_endpoint, ep, sizeof ep);
        }
    }
}

static void send_frame(void *sock, const void *d, size_t n, int more)
{
    if (zmq_send(sock, d, n, more ? ZMQ_SNDMORE : 0) < 0) dl_wire_zmq_warn("zmq_send(zap reply)", __FILE__, __LINE__);
}

/* Receive one request (all frames) and answer it. Returns -1 when the
 * context is terminating, else 0. */
static int zap_handle(dl_auth *a)
{
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int nf = 0, total = 0, more = 1, eterm = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, a->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (zmq_errno() == ETERM) eterm = 1;
            else if (zmq_errno() != EAGAIN) dl_wire_zmq_warn("zmq_msg_recv(zap request)", __FILE__, __LINE__);
            break;
        }
        more = zmq_msg_more(&m);
        total++;
        if (nf < ZAP_MAX_FRAMES) f[nf++] = m;
        else zmq_msg_close(&m);
    }
    /* A multipart message arrives whole, so a failure can only come before
     * its first frame: then there is nothing to answer. */
    if (total == 0 || more) {
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
        return eterm ? -1 : 0;
    }

    char mech[24] = "?", addr[72] = "?", key[DL_AUTH_Z85_LEN + 1] = "none";
    char user[DL_AUTH_USER_ID_MAX + 1] = "", id[DL_AUTH_ID_MAX + 1] = "";
    const char *reason = NULL;
    if (total < 6 || total > ZAP_MAX_FRAMES || !frame_is(&f[0], "1.0")) reason = "malformed";
    if (total >= 6) {
        frame_text(&f[3], addr, sizeof addr);
        frame_text(&f[5], mech, sizeof mech);
    }
    if (!reason && !frame_is(&f[5], "CURVE")) reason = "mechanism";
    if (!reason && (total != 7 || zmq_msg_size(&f[6]) != 32)) reason = "malformed";
    if (!reason) {
        zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
        if (!frame_is(&f[2], DL_AUTH_ZAP_DOMAIN)) reason = "domain";
    }
    if (!reason) {
        pthread_mutex_lock(&a->mu);
        const char *owner = dl_auth_list_owner(a->list, key);
        if (owner) memcpy(id, owner, strlen(owner) + 1);
        pthread_mutex_unlock(&a->mu);
        if (!id[0]) reason = "unknown_key";
        else snprintf(user, sizeof user, "%s %s", id, key);
    }

    /* counted before the reply: once it is sent the connection goes on, and a message can arrive before a
     * count made after it (test_auth read 0 admitted with alice's message in hand) */
    atomic_fetch_add(reason ? &a->denied : &a->admitted, 1);
    send_frame(a->sock, "1.0", 3, 1);
    if (nf >= 2) send_frame(a->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), 1);
    else send_frame(a->sock, "", 0, 1);
    send_frame(a->sock, reason ? "400" : "200", 3, 1);
    send_frame(a->sock, reason ? reason : "OK", strlen(reason ? reason : "OK"), 1);
    send_frame(a->sock, user, strlen(user), 1);
    send_frame(a->sock, "", 0, 0);
    for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);

    if (!reason) {
        char ea[160];
        DL_INFO("auth: admitted learner %s from %s", id, addr);
        dl_event("auth_admitted", "id=%s address=%s", id, dl_event_str(addr, ea, sizeof ea));
    } else {
        a->deny_pending++;
        memcpy(a->deny_mech, mech, sizeof mech);
        memcpy(a->deny_addr, addr, sizeof addr);
        memcpy(a->deny_key, key, sizeof key);
        a->deny_reason = reason;
        deny_report(a, dl_clock_ns());
    }
    return 0;
}

static void *zap_main(void *arg)
{
    dl_auth *a = arg;
    while (!atomic_load(&a->stop)) {
        if (!a->mon) {
            pthread_mutex_lock(&a->mu);
            a->mon = a->mon_pending;
            a->mon_pending = NULL;
            pthread_mutex_unlock(&a->mu);
        }
        zmq_pollitem_t it[2] = {{a->sock, 0, ZMQ_POLLIN, 0}, {a->mon, 0, ZMQ_POLLIN, 0}};
        int n = zmq_poll(it, a->mon ? 2 : 1, ZAP_POLL_MS);
        if (n < 0 && zmq_errno() == EINTR) continue;
        if (n < 0) {
            if (zmq_errno() != ETERM) dl_wire_zmq_warn("zmq_poll(zap)", __FILE__, __LINE__);
            break;
        }
        if (n > 0 && (it[0].revents & ZMQ_POLLIN) && zap_handle(a) < 0) break;
        if (a->mon && (it[1].revents & ZMQ_POLLIN)) mon_drain(a);
        deny_report(a, dl_clock_ns());
        hs_report(a, dl_clock_ns());
    }
    /* Whatever is still pending gets its line now, rate limit or not. */
    a->deny_reported = 0;
    deny_report(a, dl_clock_ns());
    a->hs_reported = 0;
    hs_report(a, dl_clock_ns());
    if (a->mon) DL_ZMQ_LOG(zmq_close(a->mon));
    a->mon = NULL;
    DL_ZMQ_LOG(zmq_close(a->sock));
    a->sock = NULL;
    return NULL;
}

int dl_auth_start(void *zctx, const char *allowlist_path, dl_auth **out)
{
    assert(zctx && allowlist_path && out);
    *out = NULL;
    dl_auth_list *list = NULL;
    DL_TRY(dl_auth_list_load(allowlist_path, &list));
    void *sock = zmq_socket(zctx, ZMQ_REP);
    if (!sock) {
        dl_auth_list_free(&list);
        return dl_wire_zmq_fail("zmq_socket(ZMQ_REP)", __FILE__, __LINE__);
    }
    int zero = 0;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) != 0 || zmq_bind(sock, ZAP_ENDPOINT) != 0) {
        int rc = dl_wire_zmq_fail("zmq_bind(" ZAP_ENDPOINT ")", __FILE__, __LINE__);
        zmq_close(sock);
        dl_auth_list_free(&list);
        return rc;
    }
    dl_auth *a = dl_xcalloc(1, sizeof *a);
    a->sock = sock;
    size_t plen = strlen(allowlist_path) + 1;
    a->path = dl_xmalloc(plen);
    memcpy(a->path, allowlist_path, plen);
    a->list = list;
    atomic_init(&a->stop, 0);
    atomic_init(&a->admitted, 0);
    atomic_init(&a->denied, 0);
    pthread_mutex_init(&a->mu, NULL);
    int e = pthread_create(&a->thread, NULL, zap_main, a);
    if (e) {
        zmq_close(sock);
        dl_auth_list_free(&a->list);
        pthread_mutex_destroy(&a->mu);
        free(a->path);
        free(a);
        return dl_err(DL_ENOMEM, "pthread_create(zap handler): %s", strerror(e));
    }
    DL_INFO("auth: ZAP handler up, %d allowlisted learner(s) from %s", list->n, allowlist_path);
    *out = a;
    return 0;
}

int dl_auth_reload(dl_auth *a, int *n_entries)
{
    assert(a);
    dl_auth_list *fresh = NULL;
    DL_TRY(dl_auth_list_load(a->path, &fresh));
    int n = fresh->n;
    pthread_mutex_lock(&a->mu);
    dl_auth_list *old = a->list;
    a->list = fresh;
    pthread_mutex_unlock(&a->mu);
    dl_auth_list_free(&old);
    if (n_entries) *n_entries = n;
    return 0;
}

/* Split "<id> <key>": 0 with the id's length in *idlen and the key at *key. */
static int split_user(const char *user_id, size_t *idlen, const char **key)
{
    if (!user_id) return -1;
    const char *sp = memchr(user_id, ' ', strnlen(user_id, DL_AUTH_USER_ID_MAX + 1));
    if (!sp || !id_ok_n(user_id, (size_t)(sp - user_id)) || !dl_auth_z85_ok(sp + 1)) return -1;
    *idlen = (size_t)(sp - user_id);
    *key = sp + 1;
    return 0;
}

int dl_auth_user_ok(dl_auth *a, const char *user_id, const char *learner_id)
{
    assert(a);
    size_t idlen;
    const char *key;
    if (split_user(user_id, &idlen, &key) || !dl_auth_id_ok(learner_id)) return 0;
    if (strlen(learner_id) != idlen || memcmp(user_id, learner_id, idlen)) return 0;
    pthread_mutex_lock(&a->mu);
    const char *owner = dl_auth_list_owner(a->list, key);
    int ok = owner && !strcmp(owner, learner_id);
    pthread_mutex_unlock(&a->mu);
    return ok;
}

int dl_auth_user_id(const char *user_id, char out_id[DL_AUTH_ID_MAX + 1])
{
    assert(out_id);
    out_id[0] = 0;
    size_t idlen;
    const char *key;
    if (split_user(user_id, &idlen, &key)) return dl_err(DL_EFORMAT, "User-Id is not \"<learner_id> <public_z85>\"");
    memcpy(out_id, user_id, idlen);
    out_id[idlen] = 0;
    return 0;
}

void dl_auth_counts(dl_auth *a, uint64_t *admitted, uint64_t *denied)
{
    assert(a);
    if (admitted) *admitted = atomic_load(&a->admitted);
    if (denied) *denied = atomic_load(&a->denied);
}

int dl_auth_watch(dl_auth *a, void *zctx, void *router)
{
    assert(a && zctx && router);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://dloco-auth-monitor-%p", (void *)a);
    if (zmq_socket_monitor(router, ep, ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
        return dl_wire_zmq_fail("zmq_socket_monitor", __FILE__, __LINE__);
    void *pair = zmq_socket(zctx, ZMQ_PAIR);
    if (!pair) return dl_wire_zmq_fail("zmq_socket(ZMQ_PAIR)", __FILE__, __LINE__);
    int zero = 0;
    if (zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof zero) || zmq_connect(pair, ep)) {
        int rc = dl_wire_zmq_fail("zmq_connect(monitor)", __FILE__, __LINE__);
        zmq_close(pair);
        return rc;
    }
    /* handed to the handler thread (the mutex is the memory barrier a
     * socket needs to change threads) */
    pthread_mutex_lock(&a->mu);
    a->mon_pending = pair;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

void dl_auth_stop(dl_auth **ap)
{
    if (!ap || !*ap) return;
    dl_auth *a = *ap;
    atomic_store(&a->stop, 1);
    pthread_join(a->thread, NULL);
    if (a->mon_pending) DL_ZMQ_LOG(zmq_close(a->mon_pending)); /* never taken: the thread ended first */
    dl_auth_list_free(&a->list);
    pthread_mutex_destroy(&a->mu);
    free(a->path);
    free(a);
    *ap = NULL;
}

// ---------------------------------------------------------------------------
// socket options

/* The option size of a Z85 key string: libzmq takes 40 chars (or 41 with the
 * NUL) and refuses any other size with EINVAL, so a short or unterminated
 * string fails cleanly instead of being read past its end. */
static size_t z85_size(const char *s) { return strnlen(s, DL_AUTH_Z85_LEN + 1); }

int dl_auth_server_sock(void *sock, const dl_auth_keypair *server)
{
    assert(sock && server);
    int one = 1;
    DL_ZMQ_CALL(zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one));
    DL_ZMQ_CALL(zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, server->secret_z85, z85_size(server->secret_z85)));
    DL_ZMQ_CALL(zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, DL_AUTH_ZAP_DOMAIN, strlen(DL_AUTH_ZAP_DOMAIN)));
    return 0;
}

int dl_auth_client_sock(void *sock, const dl_auth_keypair *client, const char *server_public_z85)
{
    assert(sock && client && server_public_z85);
    DL_ZMQ_CALL(zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_public_z85, z85_size(server_public_z85)));
    DL_ZMQ_CALL(zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, client->public_z85, z85_size(client->public_z85)));
    DL_ZMQ_CALL(zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, client->secret_z85, z85_size(client->secret_z85)));
    return 0;
}
