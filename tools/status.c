/* dloco status: live (HTTP GET /status.json from dloco-sync --metrics) or
 * offline (the store, read-only), text or JSON, once or --watch. */
#include "tools/status.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/json.h"
#include "core/prom.h"
#include "storage/store.h"

#define STATUS_TIMEOUT_S 5
#define STATUS_MAX_BYTES (64u << 20) /* ~330 B a learner: 65536 learners are ~21 MB */

static int fail(const char *what, int rc)
{
    fprintf(stderr, "dloco status: %s: %s%s%s\n", what, dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 1;
}

/* ------------------------------------------------------------------------ */
/* live: a tiny HTTP/1.0 GET with a timeout */

/* "host:port", "http://host:port" or "http://host:port/..." -> host, port. */
static int parse_target(const char *addr, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *a = addr;
    if (!strncmp(a, "http://", 7)) a += 7;
    size_t n = strcspn(a, "/");
    const char *colon = memchr(a, ':', n);
    if (!colon || colon == a || (size_t)(colon - a) >= hcap || n - (size_t)(colon - a) - 1 >= pcap ||
        n == (size_t)(colon - a) + 1)
        return dl_err(DL_EINVAL, "'%s' is neither a store directory nor HOST:PORT", addr);
    memcpy(host, a, (size_t)(colon - a));
    host[colon - a] = 0;
    memcpy(port, colon + 1, n - (size_t)(colon - a) - 1);
    port[n - (size_t)(colon - a) - 1] = 0;
    return 0;
}

/* GET path from addr; the body (malloc'd, NUL-terminated) on a 200. */
static int http_get(const char *addr, const char *path, char **body, size_t *blen)
{
    char host[256], port[16];
    DL_TRY(parse_target(addr, host, sizeof host, port, sizeof port));
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g) return dl_err(DL_ENET, "%s: %s", addr, gai_strerror(g));
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {.tv_sec = STATUS_TIMEOUT_S};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect() too */
        if (connect(fd, ai->ai_addr, ai->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return dl_err(DL_ENET, "cannot connect to %s: %s", addr, strerror(errno));
    char req[512];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host);
    if (send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) {
        close(fd);
        return dl_err(DL_ENET, "%s: send: %s", addr, strerror(errno));
    }
    size_t cap = 65536, n = 0;
    char *b = dl_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= STATUS_MAX_BYTES) {
                close(fd);
                free(b);
                return dl_err(DL_ERANGE, "%s: the answer is larger than %d bytes: refused, not cut", addr,
                              (int)STATUS_MAX_BYTES);
            }
            b = dl_xrealloc(b, cap *= 2);
        }
        ssize_t k = recv(fd, b + n, cap - 1 - n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            close(fd);
            free(b);
            return dl_err(e == EAGAIN ? DL_ETIMEDOUT : DL_ENET, "%s: no answer within %d s", addr, STATUS_TIMEOUT_S);
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    b[n] = 0;
    int code = 0;
    char *hdr_end = strstr(b, "\r\n\r\n");
    if (sscanf(b, "HTTP/1.%*d %d", &code) != 1 || !hdr_end) {
        free(b);
        return dl_err(DL_EPROTO, "%s: not an HTTP answer", addr);
    }
    if (code != 200) {
        free(b);
        return dl_err(DL_EPROTO, "%s%s: HTTP %d", addr, path, code);
    }
    size_t off = (size_t)(hdr_end + 4 - b);
    /* a body cut by a dropped connection is refused, not parsed as a whole one */
    for (const char *h = strstr(b, "\r\n"); h && h < hdr_end; h = strstr(h + 2, "\r\n")) {
        unsigned long long want;
        if (!strncasecmp(h + 2, "Content-Length:", 15) && sscanf(h + 17, " %llu", &want) == 1 && want != n - off) {
            free(b);
            return dl_err(DL_ETRUNC, "%s%s: the answer was cut: %zu of %llu bytes", addr, path, n - off, want);
        }
    }
    memmove(b, b + off, n - off + 1);
    *body = b;
    *blen = n - off;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* offline: the store as the same JSON document (source "store") */


typedef struct {
    dl_prom *o;
    int n;
} learners_ctx;

static int learner_json(const dl_store_learner *l, void *ctx)
{
    learners_ctx *c = ctx;
    dl_prom_raw(c->o, "%s{\"id\":", c->n++ ? "," : "");
    dl_prom_json_str(c->o, l->id);
    dl_prom_raw(c->o,
                ",\"site\":null,\"state\":null,\"alive\":null,\"steps_per_s\":null,\"step\":%llu,"
                "\"tokens_processed\":%llu,"
                "\"tokens_applied\":%llu,\"pushes\":%llu,\"merged\":%llu,\"dropped_stale\":%llu,\"rejected\":%llu,"
                "\"last_staleness\":null,\"bytes_in\":%llu,\"bytes_out\":%llu,\"last_seen_unix\":%.3f}",
                (unsigned long long)l->step, (unsigned long long)l->tokens, (unsigned long long)l->tokens_applied,
                (unsigned long long)l->pushes, (unsigned long long)l->merged, (unsigned long long)l->dropped,
                (unsigned long long)l->rejected, (unsigned long long)l->bytes_in, (unsigned long long)l->bytes_out,
                (double)l->last_seen_ns * 1e-9);
    return 0;
}

static int count_one(const dl_store_learner *l, void *ctx)
{
    (void)l;
    ++*(uint64_t *)ctx;
    return 0;
}

/* The newest merge record of fragment p (version v), or none. */
static int last_merge(dl_store *s, uint32_t p, uint64_t v, int64_t *wall, uint32_t *contributors)
{
    *wall = 0;
    *contributors = 0;
    if (!v) return 0;
    dl_merge_record r;
    if (dl_store_get_merge(s, p, v, &r)) return 0;
    *wall = r.wallclock_ns;
    for (uint32_t i = 0; i < r.n_contrib; i++) *contributors += r.contrib[i].decision == DL_MERGE_MERGED;
    dl_merge_record_free(&r);
    return 1;
}

static int store_json(const char *dir, dl_prom *o)
{
    dl_store_opts so = dl_store_opts_default();
    so.read_only = 1;
    dl_store *s = NULL;
    DL_TRY(dl_store_open(dir, &so, &s));
    dl_store_run run;
    int rc = dl_store_get_run(s, &run);
    if (rc) {
        dl_store_close(&s);
        return rc;
    }
    uint64_t epoch = 0, known = 0, merges = 0;
    dl_store_get_epoch(s, &epoch);
    dl_store_foreach_learner(s, count_one, &known);
    dl_store_shard lay = {0};
    dl_store_get_shard(s, &lay);
    dl_prom_raw(o, "{\"schema\":1,\"source\":\"store\",\"run_id\":");
    dl_prom_json_str(o, run.run_id);
    dl_prom_raw(o, ",\"store\":");
    dl_prom_json_str(o, dir);
    dl_prom_raw(o,
                ",\"fingerprint\":\"%016llx\",\"epoch\":%llu,\"shard\":%u,\"shards\":%u,\"uptime_s\":null,"
                "\"learners_live\":null,\"learners_dead\":null,\"learners_left\":null,\"learners_known\":%llu,",
                (unsigned long long)run.fingerprint, (unsigned long long)epoch, lay.shards > 1 ? lay.shard : 0,
                lay.shards > 1 ? lay.shards : 1, (unsigned long long)known);
    /* fragments first into a side buffer: merges are counted on the way */
    dl_prom fr;
    dl_prom_init(&fr);
    int64_t now = dl_wallclock_ns();
    for (uint32_t p = 0; p < run.n_fragments; p++) {
        uint64_t v = 0;
        dl_store_read_fragment(s, p, &v, NULL, NULL);
        merges += v;
        int64_t wall;
        uint32_t contributors;
        dl_prom_raw(&fr, "%s{\"p\":%u,\"version\":%llu,\"last_merge_age_s\":", p ? "," : "", p, (unsigned long long)v);
        if (last_merge(s, p, v, &wall, &contributors)) dl_prom_raw(&fr, "%.3f", (double)(now - wall) * 1e-9);
        else dl_prom_raw(&fr, "null");
        dl_prom_raw(&fr, ",\"contributors\":%u}", contributors);
    }
    dl_prom_raw(o, "\"merges\":%llu,\"learners\":[", (unsigned long long)merges);
    learners_ctx lc = {o, 0};
    dl_store_foreach_learner(s, learner_json, &lc);
    if (fr.failed) o->failed = 1;
    else dl_prom_raw(o, "],\"fragments\":[%s]", fr.buf);
    dl_prom_free(&fr);
    dl_store_ledger led = {{0}};
    dl_store_ledger_get(s, &led);
    dl_prom_raw(o,
                ",\"ledger\":{\"unit\":\"fragment_tokens\",\"applied\":%llu,\"dropped_stale\":%llu,\"rejected\":%llu,"
                "\"lost\":%llu,\"discarded\":%llu,\"outstanding\":%llu,\"pooled\":null,\"carried\":null,"
                "\"processed\":null},\"eval\":",
                (unsigned long long)led.tokens[DL_LEDGER_APPLIED],
                (unsigned long long)led.tokens[DL_LEDGER_DROPPED_STALE],
                (unsigned long long)led.tokens[DL_LEDGER_REJECTED], (unsigned long long)led.tokens[DL_LEDGER_LOST],
                (unsigned long long)led.tokens[DL_LEDGER_DISCARDED],
                (unsigned long long)led.tokens[DL_LEDGER_OUTSTANDING]);
    dl_store_eval ev;
    dl_store_evaldata ed;
    int have_ed = dl_store_get_evaldata(s, &ed) == 0;
    if (dl_store_get_eval(s, &ev) == 0) {
        if (isfinite(ev.loss))
            dl_prom_raw(o, "{\"version\":%llu,\"loss\":%.6g,\"seqs\":%u,\"age_s\":%.3f,\"data\":",
                        (unsigned long long)ev.version, ev.loss, ev.seqs, (double)(now - ev.wallclock_ns) * 1e-9);
        else /* a diverged model's loss: JSON has no NaN or Inf */
            dl_prom_raw(o, "{\"version\":%llu,\"loss\":null,\"seqs\":%u,\"age_s\":%.3f,\"data\":",
                        (unsigned long long)ev.version, ev.seqs, (double)(now - ev.wallclock_ns) * 1e-9);
        if (have_ed) dl_prom_json_str(o, ed.path);
        else dl_prom_raw(o, "null"); /* a store from before the record */
        dl_prom_raw(o, "}");
    } else {
        dl_prom_raw(o, "null");
    }
    dl_prom_raw(o, "}\n");
    dl_store_close(&s);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* text, from the JSON document (live or store) */

static void num_or_dash(char *b, size_t cap, const dl_json *j, const char *key, const char *fmt)
{
    const dl_json *v = dl_json_get(j, key);
    if (v && v->type == DL_JSON_NUM) snprintf(b, cap, fmt, v->num);
    else snprintf(b, cap, "-");
}

static void print_text(const dl_json *d, FILE *f)
{
    const char *src = dl_json_str(d, "source", "?");
    int live = !strcmp(src, "live");
    fprintf(f, "run %s (%s %s), epoch %.0f, fingerprint %s\n", dl_json_str(d, "run_id", "?"), src,
            dl_json_str(d, live ? "endpoint" : "store", ""), dl_json_num(d, "epoch", 0),
            dl_json_str(d, "fingerprint", "?"));
    if (live)
        fprintf(f, "learners: %.0f live / %.0f dead / %.0f left (%.0f known); this epoch (since the synchronizer "
                   "started): merges %.0f, pushes rejected %.0f, dropped stale %.0f, busy %.0f\n",
                dl_json_num(d, "learners_live", 0), dl_json_num(d, "learners_dead", 0),
                dl_json_num(d, "learners_left", 0), dl_json_num(d, "learners_known", 0), dl_json_num(d, "merges", 0),
                dl_json_num(d, "rejected", 0), dl_json_num(d, "dropped_stale", 0), dl_json_num(d, "busy_refused", 0));
    if (live && dl_json_num(d, "commit_failures_in_a_row", 0) > 0)
        fprintf(f, "COMMITS FAILING: %.0f in a row; pushes answered busy for %.0f ms, then one round probes the store "
                   "(the synchronizer's log names the error: free disk space or fix the disk)\n",
                dl_json_num(d, "commit_failures_in_a_row", 0), dl_json_num(d, "commit_backoff_ms", 0));
    if (!live)
        fprintf(f, "learners: %.0f known; merges %.0f (whole run)\n", dl_json_num(d, "learners_known", 0),
                dl_json_num(d, "merges", 0));
    fprintf(f, "%-20s %-8s %-6s %9s %10s %14s %12s %7s %6s %6s %6s %12s %12s\n", "LEARNER", "SITE", "ALIVE", "STEPS/S",
            "TRAIN_LOSS", "TOKENS_APPLIED", "STEP", "PUSHES", "MERGED", "REJ", "STALE", "BYTES_IN", "BYTES_OUT");
    const dl_json *ls = dl_json_get(d, "learners");
    for (const dl_json *l = ls ? ls->child : NULL; l; l = l->next) {
        const dl_json *alive = dl_json_get(l, "alive");
        char sps[24], st[24], tl[24];
        num_or_dash(sps, sizeof sps, l, "steps_per_s", "%.2f");
        num_or_dash(tl, sizeof tl, l, "train_loss", "%.4f");
        num_or_dash(st, sizeof st, l, "last_staleness", "%.0f");
        fprintf(f, "%-20s %-8s %-6s %9s %10s %14.0f %12.0f %7.0f %6.0f %6.0f %6s %12.0f %12.0f\n",
                dl_json_str(l, "id", "?"), dl_json_str(l, "site", "-"),
                alive && alive->type == DL_JSON_BOOL ? (alive->num ? "yes" : "no") : "-", sps, tl,
                dl_json_num(l, "tokens_applied", 0), dl_json_num(l, "step", 0), dl_json_num(l, "pushes", 0),
                dl_json_num(l, "merged", 0), dl_json_num(l, "rejected", 0), st, dl_json_num(l, "bytes_in", 0),
                dl_json_num(l, "bytes_out", 0));
    }
    if (ls && ls->child)
        fprintf(f, "(TRAIN_LOSS: the learner's recent training loss on its own data, from its latest push; "
                   "TOKENS_APPLIED in fragment-tokens: a push of one fragment trained on N tokens counts N)\n");
    fprintf(f, "%-9s %9s %16s %13s\n", "FRAGMENT", "VERSION", "LAST_MERGE_AGE_S", "CONTRIBUTORS");
    const dl_json *fs = dl_json_get(d, "fragments");
    for (const dl_json *p = fs ? fs->child : NULL; p; p = p->next) {
        char age[24];
        num_or_dash(age, sizeof age, p, "last_merge_age_s", "%.1f");
        fprintf(f, "%-9.0f %9.0f %16s %13.0f\n", dl_json_num(p, "p", 0), dl_json_num(p, "version", 0), age,
                dl_json_num(p, "contributors", 0));
    }
    const dl_json *led = dl_json_get(d, "ledger");
    if (led)
        fprintf(f, "token ledger (fragment-tokens): applied %.0f, dropped_stale %.0f, rejected %.0f, lost %.0f, "
                   "discarded %.0f, outstanding %.0f\n",
                dl_json_num(led, "applied", 0), dl_json_num(led, "dropped_stale", 0), dl_json_num(led, "rejected", 0),
                dl_json_num(led, "lost", 0), dl_json_num(led, "discarded", 0), dl_json_num(led, "outstanding", 0));
    const dl_json *ev = dl_json_get(d, "eval");
    if (ev && ev->type == DL_JSON_OBJ)
        fprintf(f, "global validation loss %.4f on %s at total version %.0f (%.0f sequences, %.0f s ago)\n",
                dl_json_num(ev, "loss", NAN), dl_json_str(ev, "data", "unrecorded data"), dl_json_num(ev, "version", 0),
                dl_json_num(ev, "seqs", 0), dl_json_num(ev, "age_s", 0));
    else
        fprintf(f, "global validation loss: none yet (dloco-sync --eval_every_s, or dloco eval STORE)\n");
}

/* ------------------------------------------------------------------------ */

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The document of target: fetched, or built from the store. */
static int fetch(const char *target, char **doc, size_t *len)
{
    if (is_dir(target)) {
        dl_prom o;
        dl_prom_init(&o);
        int rc = store_json(target, &o);
        if (!rc && o.failed) rc = dl_err(DL_ENOMEM, "%s: out of memory building the status document", target);
        if (rc) {
            dl_prom_free(&o);
            return rc;
        }
        *doc = o.buf;
        *len = o.len;
        return 0;
    }
    return http_get(target, "/status.json", doc, len);
}

int dl_status_store_text(const char *dir); /* tools/dloco.c: the offline report */

static int once(const char *target, int json, int text_store)
{
    if (text_store) return dl_status_store_text(target) ? 1 : 0;
    char *doc = NULL;
    size_t len = 0;
    int rc = fetch(target, &doc, &len);
    if (rc) return fail(target, rc);
    if (json) {
        fwrite(doc, 1, len, stdout);
        if (!len || doc[len - 1] != '\n') fputc('\n', stdout);
        free(doc);
        return 0;
    }
    dl_json *d = NULL;
    rc = dl_json_parse(doc, len, &d);
    free(doc);
    if (rc) return fail(target, rc);
    print_text(d, stdout);
    dl_json_free(&d);
    return 0;
}

int dl_status_main(int argc, char **argv)
{
    const char *target = NULL;
    int json = 0, watch = 0;
    double every = 2.0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--watch")) {
            watch = 1;
            char *end;
            if (i + 1 < argc && (every = strtod(argv[i + 1], &end), *end == 0)) i++;
            else every = 2.0;
            if (!(every >= 0.1 && every <= 86400)) {
                fprintf(stderr, "dloco status: --watch SECONDS must be in [0.1, 86400]\n");
                return 2;
            }
        } else if (argv[i][0] == '-' || target) {
            fprintf(stderr, "dloco status: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else target = argv[i];
    }
    if (!target) {
        fprintf(stderr, "usage: dloco status ADDR|STORE [--json] [--watch [SECONDS]]\n");
        return 2;
    }
    /* a store as text keeps its long-standing report (versions, merges, ...) */
    int text_store = !json && is_dir(target);
    if (!watch) return once(target, json, text_store);
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int tty = isatty(STDOUT_FILENO);
    int rc = 0;
    while (!interrupted) {
        if (tty) fputs("\033[H\033[2J", stdout);
        rc = once(target, json, text_store);
        if (!tty) fputs("\n", stdout);
        fflush(stdout);
        struct timespec ts = {(time_t)every, (long)((every - (double)(time_t)every) * 1e9)};
        while (!interrupted && nanosleep(&ts, &ts) && errno == EINTR) {
        }
    }
    return rc;
}
