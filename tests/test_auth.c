/* Tests for proto/auth: key files (modes, no overwrite, corrupt content), every allowlist
 * refusal with its path:line message, and real CURVE ROUTER/DEALER sockets on loopback. */
#include "proto/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "proto/wire.h"
#include "tests/check.h"

// ---------------------------------------------------------------------------
// helpers

/* rc is `code` and dl_errmsg() contains `sub`; `line` is the caller's. */
#define EXPECT_ERR(rc, code, sub) expect_err_((rc), (code), (sub), __LINE__)
static void expect_err_(int rc, int code, const char *sub, int line)
{
    const char *msg = dl_errmsg();
    CHECK(rc == code && strstr(msg, sub), "line %d: got rc %d (%s) \"%s\", want rc %d (%s) containing \"%s\"", line,
          rc, dl_strerror(rc), msg, code, dl_strerror(code), sub);
}

static char g_dir[512];

static const char *path_of(const char *name)
{
    static char buf[4][700];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "fopen %s: %s", path, strerror(errno));
    fputs(text, f);
    REQUIRE(fclose(f) == 0, "fclose %s", path);
    REQUIRE(chmod(path, mode) == 0, "chmod %s", path);
}

/* Replace a file at once (the reload must never see half of it). */
static void replace_file(const char *path, const char *text, mode_t mode)
{
    char tmp[760];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    write_file(tmp, text, mode);
    REQUIRE(rename(tmp, path) == 0, "rename %s", tmp);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static unsigned mode_of(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (unsigned)st.st_mode & 07777 : 0xffffu;
}

/* The i-th of a family of distinct valid keys (not a real pair: for the
 * allowlist, which only needs public keys). */
static void nth_key(uint32_t i, char out[41])
{
    uint8_t raw[32] = {0};
    memcpy(raw, &i, sizeof i);
    raw[31] = 0x5a;
    zmq_z85_encode(out, raw, 32);
}

// ---------------------------------------------------------------------------
// key files

static void test_keygen(void)
{
    dl_auth_keypair kp, again;
    char prefix[700];
    snprintf(prefix, sizeof prefix, "%s", path_of("k1")); /* path_of's buffers rotate */
    CHECK_EQ(dl_auth_keygen(prefix, &kp), 0);
    CHECK(dl_auth_z85_ok(kp.public_z85) && dl_auth_z85_ok(kp.secret_z85), "keys %s", kp.public_z85);
    CHECK_EQ(mode_of(path_of("k1.key")), 0600);
    CHECK_EQ(mode_of(path_of("k1.pub")), 0644);
    char want[256];
    snprintf(want, sizeof want,
             "# dloco CURVE key (learner or synchronizer); keep .key secret\npublic = %s\nsecret = %s\n",
             kp.public_z85, kp.secret_z85);
    char *text = slurp(path_of("k1.key"));
    CHECK_STR(text, want);
    snprintf(want, sizeof want, "# dloco CURVE key (learner or synchronizer); keep .key secret\npublic = %s\n",
             kp.public_z85);
    text = slurp(path_of("k1.pub"));
    CHECK_STR(text, want);

    /* No overwrite, and the files stay as they were. */
    EXPECT_ERR(dl_auth_keygen(prefix, &again), DL_EIO, "k1.key: File exists");
    CHECK(strstr(slurp(path_of("k1.key")), kp.secret_z85) != NULL, "k1.key was rewritten");
    /* Only the .pub exists: refused, and the .key it made is removed again. */
    write_file(path_of("k2.pub"), "keep me\n", 0644);
    EXPECT_ERR(dl_auth_keygen(path_of("k2"), NULL), DL_EIO, "k2.pub: File exists");
    CHECK(access(path_of("k2.key"), F_OK) != 0, "k2.key left behind");
    CHECK_STR(slurp(path_of("k2.pub")), "keep me\n");
    EXPECT_ERR(dl_auth_keygen("", NULL), DL_EINVAL, "empty");

    /* The modes do not depend on the umask. */
    mode_t old = umask(077);
    CHECK_EQ(dl_auth_keygen(path_of("k3"), NULL), 0);
    umask(old);
    CHECK_EQ(mode_of(path_of("k3.key")), 0600);
    CHECK_EQ(mode_of(path_of("k3.pub")), 0644);

    /* Round trip. */
    dl_auth_keypair got;
    CHECK_EQ(dl_auth_load_keypair(path_of("k1.key"), &got), 0);
    CHECK_STR(got.public_z85, kp.public_z85);
    CHECK_STR(got.secret_z85, kp.secret_z85);
    char pub[41];
    CHECK_EQ(dl_auth_load_public(path_of("k1.pub"), pub), 0);
    CHECK_STR(pub, kp.public_z85);
    CHECK_EQ(dl_auth_load_public(path_of("k1.key"), pub), 0);
    CHECK_STR(pub, kp.public_z85);
    CHECK_EQ(dl_auth_load_public(kp.public_z85, pub), 0);
    CHECK_STR(pub, kp.public_z85);
    EXPECT_ERR(dl_auth_load_public(path_of("nope.pub"), pub), DL_EIO, "nope.pub");
    /* A .pub given for a .key: its mode 0644 is the first thing refused. */
    EXPECT_ERR(dl_auth_load_keypair(path_of("k1.pub"), &got), DL_EPERM, "k1.pub is mode 0644");

    /* Unsafe modes: DL_EPERM naming the path and the mode. */
    char sub[700];
    static const unsigned bad_modes[] = {0644, 0640, 0604, 0620, 0602};
    for (size_t i = 0; i < sizeof bad_modes / sizeof bad_modes[0]; i++) {
        REQUIRE(chmod(path_of("k1.key"), bad_modes[i]) == 0, "chmod");
        snprintf(sub, sizeof sub, "key file %s is mode %04o: chmod 600 it", path_of("k1.key"), bad_modes[i]);
        EXPECT_ERR(dl_auth_load_keypair(path_of("k1.key"), &got), DL_EPERM, sub);
        CHECK_STR(got.secret_z85, "");
    }
    REQUIRE(chmod(path_of("k1.key"), 0400) == 0, "chmod");
    CHECK_EQ(dl_auth_load_keypair(path_of("k1.key"), &got), 0);
    REQUIRE(chmod(path_of("k1.key"), 0600) == 0, "chmod");
    EXPECT_ERR(dl_auth_load_keypair(g_dir, &got), DL_EIO, "not a regular file");
}

static void test_corrupt_keys(void)
{
    dl_auth_keypair a, b, got;
    REQUIRE(zmq_curve_keypair(a.public_z85, a.secret_z85) == 0, "keypair");
    REQUIRE(zmq_curve_keypair(b.public_z85, b.secret_z85) == 0, "keypair");
    char text[512], p39[41], sec_over[41];
    memcpy(p39, a.public_z85, 39);
    p39[39] = 0;
    memset(sec_over, '%', 40); /* Z85 chars, but each group is above 2^32 */
    sec_over[40] = 0;
    struct {
        const char *fmt; /* %s: a.public, %s: a.secret (or whatever the case puts there) */
        const char *p, *s;
        const char *want;
    } cases[] = {
        {"public = %s\n%s", a.public_z85, "", "no \"secret = <key>\" line"},
        {"%ssecret = %s\n", "", a.secret_z85, "no \"public = <key>\" line"},
        {"public = %s\nsecret = %s\n", p39, a.secret_z85, "k.key:1: public key is not 40 Z85 characters"},
        {"public = %s\nsecret = %s\n", a.public_z85, sec_over, "k.key:2: secret key is not 40 Z85 characters"},
        {"public = %s\nsecret = %s\n", b.public_z85, a.secret_z85, "the public key does not belong to the secret key"},
        {"public = %s\nsecret = %s x\n", a.public_z85, a.secret_z85, "k.key:2: text after the secret key"},
        {"public = %s\npublic = %s\n", a.public_z85, a.public_z85, "k.key:2: public given twice"},
        {"public: %s\nsecret = %s\n", a.public_z85, a.secret_z85, "k.key:1: expected \"public = <key>\""},
        {"public = %s\nsecret = %s\nmore = x\n", a.public_z85, a.secret_z85, "k.key:3: expected"},
        {"public = %s\nsecret =\n%s", a.public_z85, "", "k.key:2: secret key is not 40 Z85 characters"},
    };
    const char *path = path_of("k.key");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, cases[i].fmt, cases[i].p, cases[i].s);
        write_file(path, text, 0600);
        EXPECT_ERR(dl_auth_load_keypair(path, &got), DL_EFORMAT, cases[i].want);
        CHECK(!strstr(dl_errmsg(), a.secret_z85), "case %zu: the message shows the secret", i);
    }
    /* A non-Z85 byte in an otherwise fine key. */
    snprintf(text, sizeof text, "public = %s\nsecret = %s\n", a.public_z85, a.secret_z85);
    text[12] = '~';
    write_file(path, text, 0600);
    EXPECT_ERR(dl_auth_load_keypair(path, &got), DL_EFORMAT, "k.key:1: public key is not 40 Z85");
    /* Tolerated: comments, blank lines, tabs around '=', CRLF. */
    snprintf(text, sizeof text, "# c\r\n\r\n  public\t=\t%s  \r\n# more\nsecret=%s", a.public_z85, a.secret_z85);
    write_file(path, text, 0600);
    CHECK_EQ(dl_auth_load_keypair(path, &got), 0);
    CHECK_STR(got.secret_z85, a.secret_z85);
    /* load_public: 40 Z85 chars are a key, anything else a path. */
    char pub[41];
    EXPECT_ERR(dl_auth_load_public(p39, pub), DL_EIO, p39);
    write_file(path_of("x.pub"), "# nothing\n", 0644);
    EXPECT_ERR(dl_auth_load_public(path_of("x.pub"), pub), DL_EFORMAT, "x.pub: no \"public = <key>\" line");
    /* Z85 validity itself. */
    CHECK(dl_auth_z85_ok(a.public_z85), "valid key");
    CHECK(!dl_auth_z85_ok(p39), "39 chars");
    CHECK(!dl_auth_z85_ok(sec_over), "group overflow");
    CHECK(!dl_auth_z85_ok(NULL), "NULL");
    char k41[42];
    snprintf(k41, sizeof k41, "%s0", a.public_z85);
    CHECK(!dl_auth_z85_ok(k41), "41 chars");
}

// ---------------------------------------------------------------------------
// the allowlist

static void test_list_parse(void)
{
    char k1[41], k2[41], k3[41], hk[41], text[2048];
    nth_key(1, k1);
    nth_key(2, k2);
    nth_key(3, k3);
    /* '#' is a Z85 character: find a key with one inside it. */
    hk[0] = 0;
    for (uint32_t i = 100; i < 100000 && !hk[0]; i++) {
        nth_key(i, hk);
        if (!strchr(hk, '#')) hk[0] = 0;
    }
    REQUIRE(hk[0], "no key with a '#'");

    snprintf(text, sizeof text,
             "# the learners\n\n   \nalice %s\r\n\tbob\t%s   # bob's laptop\nl.3_x-Y %s\n  # indented comment\n"
             "hash %s#not-a-comment-start\n",
             k1, k2, k3, hk);
    dl_auth_list *l = NULL;
    /* The '#' right after the key (no blank) is part of the key token: 40+ chars, refused. */
    EXPECT_ERR(dl_auth_list_parse(text, strlen(text), "t", &l), DL_EFORMAT,
               "t:8: learner id \"hash\": public key");
    CHECK(l == NULL, "list on failure");
    /* The last line has no newline. */
    char k4[41];
    nth_key(4, k4);
    snprintf(text, sizeof text,
             "# the learners\n\n   \nalice %s\r\n\tbob\t%s   # bob's laptop\nl.3_x-Y %s\n  # indented comment\n"
             "hash %s # a comment\nlast %s",
             k1, k2, k3, hk, k4);
    REQUIRE(dl_auth_list_parse(text, strlen(text), "t", &l) == 0, "parse: %s", dl_errmsg());
    CHECK_EQ(dl_auth_list_count(l), 5);
    CHECK_STR(dl_auth_list_owner(l, k1), "alice");
    CHECK_STR(dl_auth_list_owner(l, k2), "bob");
    CHECK_STR(dl_auth_list_owner(l, k3), "l.3_x-Y");
    CHECK_STR(dl_auth_list_owner(l, hk), "hash");
    CHECK_STR(dl_auth_list_owner(l, k4), "last");
    char k9[41];
    nth_key(9, k9);
    CHECK(dl_auth_list_owner(l, k9) == NULL, "unknown key");
    CHECK(dl_auth_list_owner(l, "short") == NULL, "not a key");
    CHECK(dl_auth_list_owner(l, NULL) == NULL, "NULL");
    dl_auth_list_free(&l);
    CHECK(l == NULL, "free NULLs");
    dl_auth_list_free(&l);

    /* Empty: valid, admits nobody. */
    REQUIRE(dl_auth_list_parse("# none yet\n", 11, NULL, &l) == 0, "empty: %s", dl_errmsg());
    CHECK_EQ(dl_auth_list_count(l), 0);
    CHECK(dl_auth_list_owner(l, k1) == NULL, "empty list owns nothing");
    dl_auth_list_free(&l);

    /* Every class of bad line, with its line number. */
    char long_id[70];
    memset(long_id, 'a', 65);
    long_id[65] = 0;
    struct {
        char text[512];
        const char *want;
    } cases[16];
    int n = 0;
    snprintf(cases[n].text, 512, "alice %s\nbad/id %s\n", k1, k2);
    cases[n++].want = "t:2: learner id \"bad/id\" is not [A-Za-z0-9._-]{1,64}";
    snprintf(cases[n].text, 512, "%s %s\n", long_id, k1);
    cases[n++].want = "t:1: learner id \"aaaa";
    snprintf(cases[n].text, 512, "\n\nalice\n");
    cases[n++].want = "t:3: learner id \"alice\": no public key";
    snprintf(cases[n].text, 512, "alice %.39s\n", k1);
    cases[n++].want = "t:1: learner id \"alice\": public key \"";
    snprintf(cases[n].text, 512, "alice %s\nbob %sX\n", k1, k2);
    cases[n++].want = "t:2: learner id \"bob\": public key \"";
    snprintf(cases[n].text, 512, "alice %s junk\n", k1);
    cases[n++].want = "t:1: learner id \"alice\": trailing text \"junk\" after the public key";
    snprintf(cases[n].text, 512, "alice %s\nbob %s\nalice %s\n", k1, k2, k3);
    cases[n++].want = "t:3: duplicate learner id \"alice\" (first on line 1)";
    snprintf(cases[n].text, 512, "alice %s\n# x\nbob %s\n", k1, k1);
    cases[n++].want = "t:3: learner id \"bob\": public key already belongs to \"alice\" (line 1)";
    snprintf(cases[n].text, 512, "ali ce %s\n", k1);
    cases[n++].want = "t:1: learner id \"ali\": public key \"ce\" is not 40 Z85 characters";
    snprintf(cases[n].text, 512, "al\"i\x01 %s\n", k1);
    cases[n++].want = "t:1: learner id \"al?i?\" is not";
    for (int i = 0; i < n; i++) {
        EXPECT_ERR(dl_auth_list_parse(cases[i].text, strlen(cases[i].text), "t", &l), DL_EFORMAT, cases[i].want);
        CHECK(l == NULL, "case %d: list on failure", i);
    }
    /* A NUL byte is an ordinary bad byte (the text has an explicit length). */
    char nul[64] = "ali";
    size_t nl = 3;
    nul[nl++] = 0;
    nl += (size_t)snprintf(nul + nl, sizeof nul - nl, "ce %s\n", k1);
    EXPECT_ERR(dl_auth_list_parse(nul, nl, "t", &l), DL_EFORMAT, "t:1: learner id \"ali?ce\" is not");

    /* The entry cap: 65536 entries are fine, one more is refused. */
    size_t cap = (size_t)(DL_AUTH_MAX_ENTRIES + 1) * 64;
    char *big = malloc(cap);
    REQUIRE(big, "malloc");
    size_t off = 0;
    for (uint32_t i = 0; i < DL_AUTH_MAX_ENTRIES; i++) {
        char k[41];
        nth_key(1000000 + i, k);
        off += (size_t)snprintf(big + off, cap - off, "l%u %s\n", i, k);
    }
    int64_t t0 = dl_clock_ns();
    REQUIRE(dl_auth_list_parse(big, off, "big", &l) == 0, "65536 entries: %s", dl_errmsg());
    double ms = (double)(dl_clock_ns() - t0) / 1e6;
    CHECK_EQ(dl_auth_list_count(l), DL_AUTH_MAX_ENTRIES);
    char k[41];
    nth_key(1000000 + 65535, k);
    CHECK_STR(dl_auth_list_owner(l, k), "l65535");
    nth_key(1000000 + 12345, k);
    CHECK_STR(dl_auth_list_owner(l, k), "l12345");
    dl_auth_list_free(&l);
    nth_key(42, k);
    off += (size_t)snprintf(big + off, cap - off, "one-more %s\n", k);
    EXPECT_ERR(dl_auth_list_parse(big, off, "big", &l), DL_EFORMAT, "big:65537: more than 65536 entries");
    free(big);
    printf("allowlist of 65536 entries parsed in %.1f ms\n", ms);
}

static void test_list_load(void)
{
    char k1[41], text[256], sub[800];
    nth_key(1, k1);
    snprintf(text, sizeof text, "alice %s\n", k1);
    const char *p = path_of("allow.txt");
    dl_auth_list *l = NULL;
    static const unsigned ok_modes[] = {0644, 0600, 0664, 0444};
    for (size_t i = 0; i < sizeof ok_modes / sizeof ok_modes[0]; i++) {
        write_file(p, text, ok_modes[i]);
        CHECK(dl_auth_list_load(p, &l) == 0, "mode %04o: %s", ok_modes[i], dl_errmsg());
        CHECK_EQ(dl_auth_list_count(l), 1);
        dl_auth_list_free(&l);
    }
    static const unsigned bad_modes[] = {0666, 0646, 0602};
    for (size_t i = 0; i < sizeof bad_modes / sizeof bad_modes[0]; i++) {
        write_file(p, text, bad_modes[i]);
        snprintf(sub, sizeof sub, "allowlist %s is mode %04o (writable by others)", p, bad_modes[i]);
        EXPECT_ERR(dl_auth_list_load(p, &l), DL_EPERM, sub);
        CHECK(l == NULL, "list on failure");
    }
    snprintf(text, sizeof text, "alice %s\nbob\n", k1);
    write_file(p, text, 0644);
    snprintf(sub, sizeof sub, "%s:2: learner id \"bob\": no public key", p);
    EXPECT_ERR(dl_auth_list_load(p, &l), DL_EFORMAT, sub);
    EXPECT_ERR(dl_auth_list_load(path_of("missing.txt"), &l), DL_EIO, "missing.txt");
}

static void test_user_id(void)
{
    char k1[41], uid[160], id[65];
    nth_key(1, k1);
    snprintf(uid, sizeof uid, "alice %s", k1);
    CHECK_EQ(dl_auth_user_id(uid, id), 0);
    CHECK_STR(id, "alice");
    const char *bad[] = {NULL, "", "alice", "alice ", " x", "alice  x", "bad/id KEY", "alice short"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_ERR(dl_auth_user_id(bad[i], id), DL_EFORMAT, "User-Id");
        CHECK_STR(id, "");
    }
    snprintf(uid, sizeof uid, "alice %sX", k1);
    CHECK(dl_auth_user_id(uid, id) == DL_EFORMAT, "a key of 41 chars");
}

// ---------------------------------------------------------------------------
// real sockets: one context, a CURVE ROUTER, DEALERs of every kind

enum { CLIENT_CURVE, CLIENT_PLAIN };

/* A DEALER that connects to ep and sends "hello"; mon (NULL = none) gets a
 * monitor PAIR for its handshake failures, set up before the connect. */
static void *dealer_mon(void *ctx, int kind, const dl_auth_keypair *kp, const char *server_pub, const char *id,
                        const char *ep, void **mon)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    REQUIRE(s, "zmq_socket");
    REQUIRE(dl_wire_sock_setup(s, 0, 1 << 20) == 0, "setup: %s", dl_errmsg());
    REQUIRE(zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id)) == 0, "routing id");
    if (kind == CLIENT_CURVE) REQUIRE(dl_auth_client_sock(s, kp, server_pub) == 0, "client: %s", dl_errmsg());
    if (mon) {
        char mep[96];
        snprintf(mep, sizeof mep, "inproc://monitor-%s", id);
        REQUIRE(zmq_socket_monitor(s, mep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED) == 0,
                "monitor");
        REQUIRE((*mon = zmq_socket(ctx, ZMQ_PAIR)) && zmq_connect(*mon, mep) == 0, "monitor pair");
    }
    REQUIRE(zmq_connect(s, ep) == 0, "connect");
    REQUIRE(zmq_send(s, "hello", 5, 0) == 5, "send");
    return s;
}

static void *dealer(void *ctx, int kind, const dl_auth_keypair *kp, const char *server_pub, const char *id,
                    const char *ep)
{
    return dealer_mon(ctx, kind, kp, server_pub, id, ep, NULL);
}

/* The first monitor event within ms: 1 with its event and value, else 0. */
static int monitor_event(void *mon, int ms, int *event, int *value)
{
    zmq_pollitem_t it = {mon, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0) return 0;
    uint8_t hdr[6];
    char addr[256];
    int n = zmq_recv(mon, hdr, sizeof hdr, 0);
    if (n != 6 || zmq_recv(mon, addr, sizeof addr, 0) < 0) return 0;
    uint16_t e;
    uint32_t v;
    memcpy(&e, hdr, 2);
    memcpy(&v, hdr + 2, 4);
    *event = e;
    *value = (int)v;
    return 1;
}

/* Reads monitor events until n of those in mask (ZMQ_EVENT_*) came, at most
 * ms; how many did. The server's monitor says when a connection's handshake
 * has ended, so a count read after it is final. */
static int wait_monitor(void *mon, int mask, int n, int ms)
{
    int got = 0, ev = 0, val = 0;
    for (int64_t end = dl_clock_ns() + (int64_t)ms * 1000000; got < n;) {
        int64_t left = (end - dl_clock_ns()) / 1000000;
        if (left <= 0 || !monitor_event(mon, (int)left, &ev, &val)) break;
        got += (ev & mask) != 0;
    }
    return got;
}

/* Wait up to ms for one [routing id][data] message; 1 with its User-Id
 * (or "" when it has none) in uid, 0 when nothing came. */
static int recv_within(void *router, int ms, char *uid, size_t cap)
{
    zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(&it, 1, ms);
    if (n <= 0) return 0;
    zmq_msg_t rid, data;
    zmq_msg_init(&rid);
    zmq_msg_init(&data);
    int ok = zmq_msg_recv(&rid, router, 0) >= 0 && zmq_msg_more(&rid) && zmq_msg_recv(&data, router, 0) >= 0;
    CHECK(ok, "recv: %s", zmq_strerror(zmq_errno()));
    const char *u = ok ? zmq_msg_gets(&data, "User-Id") : NULL;
    snprintf(uid, cap, "%s", u ? u : "");
    CHECK(ok && zmq_msg_size(&data) == 5 && !memcmp(zmq_msg_data(&data), "hello", 5), "payload");
    zmq_msg_close(&rid);
    zmq_msg_close(&data);
    return 1;
}

/* Poll dl_auth_counts until `denied` reaches want or ms pass; the count. */
static uint64_t wait_denied(dl_auth *a, uint64_t want, int ms)
{
    uint64_t den = 0;
    for (int64_t end = dl_clock_ns() + (int64_t)ms * 1000000; ; usleep(10000)) {
        dl_auth_counts(a, NULL, &den);
        if (den >= want || dl_clock_ns() > end) return den;
    }
}

static void close_sock(void **s)
{
    if (*s) zmq_close(*s);
    *s = NULL;
}

/* Sum of count= over the auth_denied lines and the number of lines of `name`. */
static int event_lines(const char *text, const char *name, unsigned long long *count_sum)
{
    int n = 0;
    char pat[64];
    snprintf(pat, sizeof pat, "event=%s ", name);
    if (count_sum) *count_sum = 0;
    for (const char *p = text; (p = strstr(p, pat)); p++) {
        n++;
        const char *c = strstr(p, " count=");
        const char *eol = strchr(p, '\n');
        if (count_sum && c && (!eol || c < eol)) *count_sum += strtoull(c + 7, NULL, 10);
    }
    return n;
}

/* The smallest gap (ns) between consecutive `name` lines but the last (ts=
 * at each line's start); INT64_MAX with fewer than three lines. The last
 * line may come sooner: stopping the handler writes what is pending. */
static int64_t min_gap_but_last(const char *text, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof pat, "event=%s ", name);
    long long ts[64];
    int n = 0;
    for (const char *p = text; (p = strstr(p, pat)) && n < 64; p++) {
        const char *line = p;
        while (line > text && line[-1] != '\n') line--;
        ts[n++] = strncmp(line, "ts=", 3) ? 0 : strtoll(line + 3, NULL, 10);
    }
    int64_t gap = INT64_MAX;
    for (int i = 1; i + 1 < n; i++)
        if (ts[i] - ts[i - 1] < gap) gap = ts[i] - ts[i - 1];
    return gap;
}

static void test_sockets(void)
{
    const char *events = path_of("events.log");
    REQUIRE(dl_event_open(events, "test") == 0, "events: %s", dl_errmsg());
    int64_t t_start = dl_clock_ns();
    dl_auth_keypair server, alice, bob, mallory;
    REQUIRE(dl_auth_keygen(path_of("server"), &server) == 0, "keygen: %s", dl_errmsg());
    REQUIRE(dl_auth_keygen(path_of("alice"), &alice) == 0, "keygen: %s", dl_errmsg());
    REQUIRE(zmq_curve_keypair(bob.public_z85, bob.secret_z85) == 0, "keypair");
    REQUIRE(zmq_curve_keypair(mallory.public_z85, mallory.secret_z85) == 0, "keypair");
    char text[512], uid[256], alice_uid[160], bob_uid[160];
    snprintf(alice_uid, sizeof alice_uid, "alice %s", alice.public_z85);
    snprintf(bob_uid, sizeof bob_uid, "bob %s", bob.public_z85);
    const char *allow = path_of("sync-allow.txt");
    snprintf(text, sizeof text, "alice %s\nbob %s\n", alice.public_z85, bob.public_z85);
    write_file(allow, text, 0644);

    void *ctx = zmq_ctx_new();
    REQUIRE(ctx, "ctx");
    dl_auth *auth = NULL;
    REQUIRE(dl_auth_start(ctx, allow, &auth) == 0, "start: %s", dl_errmsg());
    dl_auth *second = NULL;
    EXPECT_ERR(dl_auth_start(ctx, allow, &second), DL_ENET, "Address already in use");
    CHECK(second == NULL, "second handler");

    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    REQUIRE(router, "router");
    REQUIRE(dl_wire_sock_setup(router, 1, 1 << 20) == 0, "setup: %s", dl_errmsg());
    REQUIRE(dl_auth_server_sock(router, &server) == 0, "server: %s", dl_errmsg());
    REQUIRE(zmq_bind(router, "tcp://127.0.0.1:*") == 0, "bind");
    char ep[256];
    size_t eplen = sizeof ep;
    REQUIRE(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &eplen) == 0, "endpoint");
    uint64_t adm = 0, den = 0, den0;
    /* the server's side of every handshake: refused by ZAP (AUTH) or by libzmq before ZAP (PROTOCOL) */
    const int failed_auth = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
              failed_early = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
    REQUIRE(zmq_socket_monitor(router, "inproc://monitor-router", failed_auth | failed_early) == 0, "router monitor");
    void *rmon = zmq_socket(ctx, ZMQ_PAIR);
    REQUIRE(rmon && zmq_connect(rmon, "inproc://monitor-router") == 0, "router monitor pair");

    /* (1) an allowlisted key: delivered, User-Id "<id> <key>". */
    void *d1 = dealer(ctx, CLIENT_CURVE, &alice, server.public_z85, "alice", ep);
    CHECK(recv_within(router, 30000, uid, sizeof uid), "alice's message did not arrive");
    CHECK_STR(uid, alice_uid);
    CHECK_EQ(dl_auth_user_ok(auth, uid, "alice"), 1);
    CHECK_EQ(dl_auth_user_ok(auth, uid, "bob"), 0);
    CHECK_EQ(dl_auth_user_ok(auth, uid, ""), 0);
    CHECK_EQ(dl_auth_user_ok(auth, uid, NULL), 0);
    CHECK_EQ(dl_auth_user_ok(auth, NULL, "alice"), 0);
    CHECK_EQ(dl_auth_user_ok(auth, "alice", "alice"), 0);
    /* bob's id with alice's key, or alice's id with bob's key: no. */
    snprintf(text, sizeof text, "bob %s", alice.public_z85);
    CHECK_EQ(dl_auth_user_ok(auth, text, "bob"), 0);
    snprintf(text, sizeof text, "alice %s", bob.public_z85);
    CHECK_EQ(dl_auth_user_ok(auth, text, "alice"), 0);
    CHECK_EQ(dl_auth_user_ok(auth, bob_uid, "bob"), 1);
    char id[65];
    CHECK_EQ(dl_auth_user_id(uid, id), 0);
    CHECK_STR(id, "alice");
    dl_auth_counts(auth, &adm, &den);
    CHECK_EQ(adm, 1);
    CHECK_EQ(den, 0);

    /* (2) a key not in the list: ZAP says 400, nothing is delivered. Several
     * clients at once, so the denial report has something to aggregate.
     * libzmq 4.3 treats the refusal as a protocol error: the client sees
     * ZMQ_EVENT_HANDSHAKE_FAILED_AUTH with value 400 and never reconnects to
     * that endpoint (one denial per connection, not one per reconnect). */
    enum { NM = 4 };
    void *d2[NM], *mon = NULL;
    for (int i = 0; i < NM; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "mallory-%d", i);
        d2[i] = dealer_mon(ctx, CLIENT_CURVE, &mallory, server.public_z85, rid, ep, i == 0 ? &mon : NULL);
    }
    int mev = 0, mval = 0;
    CHECK(monitor_event(mon, 30000, &mev, &mval), "no handshake event on the denied client");
    CHECK_EQ(mev, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    CHECK_EQ(mval, 400);
    CHECK(!recv_within(router, 1000, uid, sizeof uid), "mallory's message arrived (User-Id \"%s\")", uid);
    /* every handshake reaches ZAP and ends on the server before the sockets close */
    CHECK_EQ(wait_monitor(rmon, failed_auth, NM, 30000), NM);
    wait_denied(auth, NM, 30000);
    for (int i = 0; i < NM; i++) close_sock(&d2[i]);
    close_sock(&mon);
    dl_auth_counts(auth, &adm, &den);
    CHECK_EQ(den, NM);
    CHECK_EQ(adm, 1);
    printf("(2) unknown key, %d connections: %llu denial(s) in ~1 s\n", NM, (unsigned long long)den);

    /* (3) no CURVE at all: libzmq fails the greeting (mechanism mismatch)
     * before ZAP, so the handler never hears of it. */
    den0 = den;
    void *d3 = dealer(ctx, CLIENT_PLAIN, NULL, NULL, "plain", ep);
    CHECK(!recv_within(router, 700, uid, sizeof uid), "the NULL-mechanism message arrived");
    CHECK(wait_monitor(rmon, failed_early, 1, 30000) == 1, "the server ended the NULL-mechanism handshake");
    close_sock(&d3);
    dl_auth_counts(auth, &adm, &den);
    CHECK_EQ(den - den0, 0);
    printf("(3) NULL mechanism: %llu denial(s) counted (refused by libzmq before ZAP)\n",
           (unsigned long long)(den - den0));

    /* (4) an allowlisted client key but the wrong server key: the server
     * cannot open the client's HELLO, so this too ends before ZAP. */
    den0 = den;
    void *d4 = dealer(ctx, CLIENT_CURVE, &alice, mallory.public_z85, "alice-wrong-server", ep);
    CHECK(!recv_within(router, 700, uid, sizeof uid), "the wrong-server-key message arrived");
    CHECK(wait_monitor(rmon, failed_early, 1, 30000) == 1, "the server ended the wrong-server-key handshake");
    close_sock(&d4);
    dl_auth_counts(auth, &adm, &den);
    CHECK_EQ(den - den0, 0);
    CHECK_EQ(adm, 1);
    printf("(4) wrong server key: %llu denial(s) counted (HELLO fails before ZAP)\n", (unsigned long long)(den - den0));

    /* (5) revoke alice. Her open connection still delivers (ZMQ admits per
     * connection), which is why the receiver asks dl_auth_user_ok. */
    snprintf(text, sizeof text, "# alice revoked\nbob %s\n", bob.public_z85);
    replace_file(allow, text, 0644);
    int n = -1;
    CHECK(dl_auth_reload(auth, &n) == 0, "reload: %s", dl_errmsg());
    CHECK_EQ(n, 1);
    CHECK_EQ(dl_auth_user_ok(auth, alice_uid, "alice"), 0);
    CHECK_EQ(dl_auth_user_ok(auth, bob_uid, "bob"), 1);
    REQUIRE(zmq_send(d1, "hello", 5, 0) == 5, "send");
    CHECK(recv_within(router, 30000, uid, sizeof uid), "alice's open connection stopped delivering");
    CHECK_STR(uid, alice_uid);
    CHECK_EQ(dl_auth_user_ok(auth, uid, "alice"), 0);
    close_sock(&d1);
    den0 = den;
    void *d5 = dealer(ctx, CLIENT_CURVE, &alice, server.public_z85, "alice", ep);
    CHECK(!recv_within(router, 1000, uid, sizeof uid), "a revoked key's new connection delivered");
    CHECK(wait_monitor(rmon, failed_auth, 1, 30000) == 1, "the server ended the revoked key's handshake");
    wait_denied(auth, den0 + 1, 30000);
    close_sock(&d5);
    dl_auth_counts(auth, &adm, &den);
    CHECK(den > den0, "the revoked key was not denied (%llu -> %llu)", (unsigned long long)den0,
          (unsigned long long)den);
    CHECK_EQ(adm, 1);

    /* Re-assigned key: alice's key now belongs to carol. Neither the old
     * User-Id's id nor the new owner is OK on the old connection. */
    snprintf(text, sizeof text, "bob %s\ncarol %s\n", bob.public_z85, alice.public_z85);
    replace_file(allow, text, 0644);
    CHECK(dl_auth_reload(auth, NULL) == 0, "reload: %s", dl_errmsg());
    CHECK_EQ(dl_auth_user_ok(auth, alice_uid, "alice"), 0);
    CHECK_EQ(dl_auth_user_ok(auth, alice_uid, "carol"), 0);

    /* Broken reloads keep the running list. */
    snprintf(text, sizeof text, "bob %s\nnot a valid line\n", bob.public_z85);
    replace_file(allow, text, 0644);
    char sub[800];
    snprintf(sub, sizeof sub, "%s:2: learner id \"not\": public key \"a\"", allow);
    n = -1;
    EXPECT_ERR(dl_auth_reload(auth, &n), DL_EFORMAT, sub);
    CHECK_EQ(n, -1);
    snprintf(text, sizeof text, "alice %s\n", alice.public_z85);
    replace_file(allow, text, 0666);
    EXPECT_ERR(dl_auth_reload(auth, &n), DL_EPERM, "writable by others");
    REQUIRE(unlink(allow) == 0, "unlink");
    EXPECT_ERR(dl_auth_reload(auth, &n), DL_EIO, "sync-allow.txt");
    CHECK_EQ(dl_auth_user_ok(auth, bob_uid, "bob"), 1);
    snprintf(text, sizeof text, "carol %s", alice.public_z85);
    CHECK_EQ(dl_auth_user_ok(auth, text, "carol"), 1);

    /* Restore alice: a new connection is admitted again. */
    snprintf(text, sizeof text, "alice %s\nbob %s\n", alice.public_z85, bob.public_z85);
    write_file(allow, text, 0644);
    CHECK(dl_auth_reload(auth, &n) == 0 && n == 2, "reload: %s", dl_errmsg());
    void *d6 = dealer(ctx, CLIENT_CURVE, &alice, server.public_z85, "alice", ep);
    CHECK(recv_within(router, 30000, uid, sizeof uid), "re-allowed alice's message did not arrive");
    CHECK_STR(uid, alice_uid);
    CHECK_EQ(dl_auth_user_ok(auth, uid, "alice"), 1);
    close_sock(&d6);
    dl_auth_counts(auth, &adm, &den);
    CHECK_EQ(adm, 2);

    /* Servers first, then the handler (see the caveat in auth.h). */
    close_sock(&rmon);
    close_sock(&router);
    dl_auth_stop(&auth);
    CHECK(auth == NULL, "stop NULLs");
    dl_auth_stop(&auth);
    dl_auth_stop(NULL);
    zmq_ctx_term(ctx);
    double secs = (double)(dl_clock_ns() - t_start) / 1e9;
    dl_event_close();

    /* The event log: one auth_admitted per admission; auth_denied at most
     * once a second, and their count= fields add up to every denial. */
    char *ev = slurp(events);
    REQUIRE(ev, "no events file");
    unsigned long long sum = 0;
    int nden = event_lines(ev, "auth_denied", &sum);
    CHECK_EQ(event_lines(ev, "auth_admitted", NULL), 2);
    CHECK(strstr(ev, "event=auth_admitted id=alice address=127.0.0.1") != NULL, "admitted event: %s", ev);
    CHECK(strstr(ev, "mechanism=CURVE address=127.0.0.1") != NULL, "denied event fields: %s", ev);
    CHECK(strstr(ev, "reason=unknown_key") != NULL, "denied reason: %s", ev);
    CHECK(nden >= 1 && nden <= (int)secs + 2, "%d auth_denied lines in %.1f s", nden, secs);
    /* rate-limited: lines a second apart (the wall clock against the handler's monotonic one: 0.9 s), however
     * the denials spread on a loaded machine; four denials at once are more than one line's worth */
    int64_t gap = min_gap_but_last(ev, "auth_denied");
    CHECK(gap >= 900000000LL, "auth_denied lines %.3f s apart: not rate-limited", (double)gap / 1e9);
    CHECK(nden < (int)den || gap != INT64_MAX, "%d auth_denied lines for %llu denials: not rate-limited", nden,
          (unsigned long long)den);
    CHECK_EQ(sum, den);
    printf("sockets: %llu admitted, %llu denied, %d auth_denied event lines in %.1f s\n", (unsigned long long)adm,
           (unsigned long long)den, nden, secs);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/dloco_test_auth.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    REQUIRE(mkdtemp(g_dir), "mkdtemp %s: %s", g_dir, strerror(errno));
    REQUIRE(zmq_has("curve"), "libzmq without CURVE");

    test_keygen();
    test_corrupt_keys();
    test_list_parse();
    test_list_load();
    test_user_id();
    test_sockets();

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (!failures && system(cmd) != 0) printf("could not remove %s\n", g_dir);
    return CHECK_DONE("test_auth");
}
