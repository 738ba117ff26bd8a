/* conserve: the learner and the checker of the progress-conservation test
 * (tests/test_conserve.sh, issue 27): a learner whose training is known exactly.
 *
 * `conserve learn ...` is one networked learner wired as dloco-learner wires
 * its network side (learner/node.h over a host parameter buffer, the mailbox,
 * one comms session), whose "training" adds a known amount to every
 * parameter each inner step:  theta[e] += amount x c(e),  c(e) = 1 + (e % 5) / 4
 * (e the flat parameter index; the factor varies inside every codec block, so
 * an int4 push has real quantisation error for error feedback to carry). Each
 * step it reports its progress (step, tokens = step x batch x seq_len) and
 * writes a line to --log, flushed, so a SIGKILL loses nothing of it:
 *   step=S tokens=T discarded=D returned=R
 * and at the end
 *   finish left=N unpushed=U pushes=X flushed=Y
 * (left: fragments whose pushes got no final answer within the flush timeout;
 * unpushed: fragment-tokens it still held when it left, its final pushes
 * refused every time). With --state FILE it saves, every --save_every steps,
 * its node state (FILE.node, learner/node.h) and then its step and
 * parameters (FILE.theta) (a line "saved step=S held=T": T the fragment-tokens
 * of the node's counters then), keeping the push journal at FILE.journal; started
 * again with the same FILE it resumes from them (a line "restored step=S
 * rc=R carried=C format=F residuals=N residuals_dropped=D": int4 pushes'
 * error feedback residuals travel in the node state) and its tokens count from that start, as a restarted
 * learner's Heartbeats do.
 *
 * `conserve check --store DIR --amounts ID=A,ID=A,... [--int4 1]` replays the
 * store's merge records: with outer lr 1, momentum 0, share scaling off,
 * merge mean and aggregate weighted (the settings the test runs dloco-sync
 * with), a merge of fragment p moves every element e of it by
 *   sum over its MERGED contributors i of  weight_i x steps_i x amount(learner_i) x c(e)
 * so the global model is an exact function of which steps were applied. It
 * compares every element of the stored global with its seeded init plus that
 * shift and prints one line per fragment and a last line
 *   check fragments=P worst_rel=X tol=Y ok=0|1
 * Exit 0 when every element is within tolerance: fp32 pushes 1e-4 of the
 * shift (float rounding of the learners' and the merge's arithmetic); int4
 * pushes with error feedback 1/7 of it (a quantum of each push: what the
 * residuals still hold at the end, and what moves between merge weights
 * when a residual owed by one push travels with the next). 1 when one is
 * not, 2 on a usage or store error. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/codec.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/model.h"
#include "core/plan.h"
#include "learner/comms.h"
#include "learner/mailbox.h"
#include "learner/node.h"
#include "storage/store.h"

static double factor(size_t e) { return 1.0 + (double)(e % 5) / 4.0; }

static volatile sig_atomic_t stop_flag;
static void on_term(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void nap_ns(int64_t ns)
{
    if (ns <= 0) return;
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&ts, NULL);
}

/* --name value pairs into a tiny table. */
typedef struct {
    const char *name, *value;
} kv;

static const char *opt(const kv *o, int n, const char *name, const char *def)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(o[i].name, name)) return o[i].value;
    return def;
}

static int usage(const char *why)
{
    fprintf(stderr,
            "conserve: %s\n"
            "usage: conserve learn --endpoint EP --id ID --log FILE [--run_id R] [--n_layer L --n_head NH --n_embd C "
            "--seq_len T --vocab V --fragments P] [--steps N] [--rate STEPS_PER_S] [--batch B] [--amount A] [--adopt "
            "keep|overwrite|mix] [--alpha A] [--push_codec fp32|int4] [--hold_ms MS] [--flush_ms MS] [--events FILE] [--state FILE --save_every N]\n"
            "       conserve check --store DIR --amounts ID=A,... [--int4 0|1]\n",
            why);
    return 2;
}

/* One file written whole, then renamed over `path`. */
static int put_file(const char *path, const void *a, size_t na, const void *b, size_t nb)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int ok = fwrite(a, 1, na, f) == na && (!nb || fwrite(b, 1, nb, f) == nb);
    ok &= fclose(f) == 0;
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

/* The learner's saved state at step s: the node's first, then step and theta (a kill between the two leaves
 * a node state of a newer step, which the restore refuses). */
static int save_state(const char *state, dl_node *node, uint64_t fp, uint64_t tag, long s, const float *theta,
                      size_t total)
{
    char path[1024];
    size_t len = dl_node_state_bytes(node);
    uint8_t *buf = malloc(len);
    uint64_t st = (uint64_t)s;
    int rc = dl_node_state_copy(node, fp, tag, st, buf, &len);
    snprintf(path, sizeof path, "%s.node", state);
    if (!rc) rc = put_file(path, buf, len, NULL, 0);
    free(buf);
    snprintf(path, sizeof path, "%s.theta", state);
    if (!rc) rc = put_file(path, &st, 8, theta, total * sizeof(float));
    return rc;
}

static int learn(const kv *o, int n)
{
    const char *ep = opt(o, n, "endpoint", NULL), *id = opt(o, n, "id", NULL), *logp = opt(o, n, "log", NULL);
    if (!ep || !id || !logp) return usage("learn needs --endpoint, --id and --log");
    dl_model_config mc = {.n_layer = atoi(opt(o, n, "n_layer", "1")),
                          .n_head = atoi(opt(o, n, "n_head", "2")),
                          .n_embd = atoi(opt(o, n, "n_embd", "16")),
                          .seq_len = atoi(opt(o, n, "seq_len", "8")),
                          .vocab = atoi(opt(o, n, "vocab", "64"))};
    int P = atoi(opt(o, n, "fragments", "4"));
    long steps = atol(opt(o, n, "steps", "60"));
    double rate = atof(opt(o, n, "rate", "40"));
    uint64_t batch = (uint64_t)atoll(opt(o, n, "batch", "2"));
    double amount = atof(opt(o, n, "amount", "0.0009765625"));
    const char *adopt = opt(o, n, "adopt", "keep"), *codec = opt(o, n, "push_codec", "fp32");
    int hold_ms = atoi(opt(o, n, "hold_ms", "0")), flush_ms = atoi(opt(o, n, "flush_ms", "20000"));
    if (steps < 1 || !(rate > 0) || batch < 1 || !(amount > 0) || P < 1) return usage("bad --steps/--rate/--batch/--amount/--fragments");
    int mode = !strcmp(adopt, "keep") ? DL_ADOPT_KEEP : !strcmp(adopt, "mix") ? DL_ADOPT_MIX
             : !strcmp(adopt, "overwrite")                                    ? DL_ADOPT_OVERWRITE
                                                                              : -1;
    if (mode < 0) return usage("--adopt is keep, overwrite or mix");
    if (dl_model_config_check(&mc)) return usage(dl_errmsg());
    const char *events = opt(o, n, "events", NULL);
    if (events && dl_event_open(events, "conserve")) return usage(dl_errmsg());
    FILE *log = fopen(logp, "a");
    if (!log) return usage("cannot open --log");
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);

    dl_plan *plan = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = NULL;
    dl_node *node = NULL;
    int rc = dl_model_plan_open(&mc, P, &plan);
    size_t total = plan ? dl_plan_total_numel(plan) : 0;
    float *theta = calloc(total ? total : 1, sizeof(float));
    float *step_add = calloc(total ? total : 1, sizeof(float));
    for (size_t e = 0; e < total; e++) step_add[e] = (float)(amount * factor(e));
    if (!rc) rc = dl_mailbox_open(plan, &mb);
    dl_comms_opts co = {
        .mailbox = mb,
        .endpoint = ep,
        .learner_id = id,
        .run_id = opt(o, n, "run_id", "dloco"),
        .plan = plan,
        .n_layer = (uint32_t)mc.n_layer,
        .n_head = (uint32_t)mc.n_head,
        .n_embd = (uint32_t)mc.n_embd,
        .seq_len = (uint32_t)mc.seq_len,
        .vocab = (uint32_t)mc.vocab,
        .device = "conserve",
        .batch = (uint32_t)batch,
        .connect_timeout_ms = 30000,
    };
    if (!strcmp(codec, "int4")) {
        co.push_codec = (dl_codec){.id = DL_CODEC_INT4, .block = 32};
        co.error_feedback = 1;
    } else if (strcmp(codec, "fp32")) {
        return usage("--push_codec is fp32 or int4");
    }
    if (!rc) {
        co.fingerprint = dl_model_fingerprint(&mc, plan);
        rc = dl_comms_open(&co, &c);
    }
    dl_node_opts no = {.plan = plan, .params = theta, .adopt = mode, .alpha = (float)atof(opt(o, n, "alpha", "0.5")),
                       .push_decision_timeout_ms = hold_ms};
    if (!rc) rc = dl_node_open(&no, mb, &node);
    /* the session's error feedback residuals are saved and restored with the node's state */
    for (int p = 0; !rc && p < P; p++) dl_node_set_ef(node, p, dl_comms_ef(c, p));
    /* --state FILE: a killed learner restarted with it resumes from its last save (FILE.theta: step and
     * parameters; FILE.node: the node's state; FILE.journal: the push journal) */
    const char *state = opt(o, n, "state", NULL);
    long save_every = atol(opt(o, n, "save_every", "10")), s0 = 0;
    uint64_t tag = dl_hash64(id, strlen(id), 0x636f6e73ull);
    char path[1024];
    int jfd = -1;
    if (!rc && state) {
        snprintf(path, sizeof path, "%s.theta", state);
        FILE *f = fopen(path, "rb");
        uint64_t st = 0;
        if (f && fread(&st, 8, 1, f) == 1 && fread(theta, sizeof(float), total, f) == total) {
            s0 = (long)st;
            snprintf(path, sizeof path, "%s.node", state);
            FILE *g = fopen(path, "rb");
            size_t cap = dl_node_state_max_bytes(node), len = 0;
            uint8_t *buf = malloc(cap + 1);
            if (g) len = fread(buf, 1, cap + 1, g), fclose(g);
            uint64_t jr[4096];
            dl_node_restored got = {0};
            snprintf(path, sizeof path, "%s.journal", state);
            int jn = dl_node_journal_read(path, tag, jr, P);
            int r2 = dl_node_state_restore(node, buf, len, co.fingerprint, tag, st, jn ? jr : NULL, jn, &got);
            fprintf(log, "restored step=%ld rc=%d carried=%llu format=%d residuals=%d residuals_dropped=%d\n", s0, r2,
                    (unsigned long long)got.carried, got.format, got.residuals, got.residuals_dropped);
            free(buf);
        }
        if (f) fclose(f);
        snprintf(path, sizeof path, "%s.journal", state);
        jfd = open(path, O_RDWR | O_CREAT, 0600);
        if (jfd >= 0) dl_node_set_journal(node, jfd, tag);
    }
    if (!rc) rc = dl_comms_start(c);
    if (!rc) rc = dl_node_wait_ready(node, 60000, &stop_flag);
    if (rc) {
        fprintf(stderr, "conserve %s: %s\n", id, dl_errmsg());
        fprintf(log, "failed rc=%d\n", rc);
        fclose(log);
        return 2;
    }
    uint64_t tps = batch * (uint64_t)mc.seq_len;
    int64_t period = (int64_t)(1e9 / rate), next = dl_clock_ns();
    uint32_t H = dl_mailbox_h(mb);
    long s = s0;
    while (s < steps && !stop_flag) {
        for (size_t e = 0; e < total; e++) theta[e] += step_add[e];
        s++;
        /* logged before anything reports it: a SIGKILL never leaves a step
         * the synchronizer heard of out of the log; tokens are this process's */
        dl_node_stats st;
        dl_node_get_stats(node, &st);
        fprintf(log, "step=%ld tokens=%llu discarded=%llu returned=%llu\n", s,
                (unsigned long long)((uint64_t)(s - s0) * tps), (unsigned long long)st.discarded_tokens,
                (unsigned long long)st.returned);
        fflush(log);
        dl_mailbox_set_progress(mb, (uint64_t)s, (uint64_t)(s - s0) * tps, rate);
        rc = dl_node_after_step(node, s, H ? (int)H : 8, tps, 1.0, 1.0 / rate);
        if (rc >= 0) rc = dl_node_poll(node);
        if (rc < 0) break;
        if (state && s % save_every == 0 && save_state(state, node, co.fingerprint, tag, s, theta, total) == 0) {
            /* held: the fragment-tokens of the node's counters (since each fragment's reference point), an upper
             * bound of what a restart from this save can carry; what it does not carry is lost at a kill */
            uint64_t held = 0;
            for (int p = 0; p < P; p++) held += dl_node_tokens(node, p);
            fprintf(log, "saved step=%ld held=%llu\n", s, (unsigned long long)held), fflush(log);
        }
        int state = dl_mailbox_state(mb, NULL, 0);
        if (state == DL_COMMS_REFUSED || state == DL_COMMS_FAILED) {
            rc = DL_ENET;
            break;
        }
        next += period;
        nap_ns(next - dl_clock_ns());
    }
    int left = rc < 0 ? -1 : dl_node_finish(node, flush_ms, (uint64_t)s, "done");
    dl_comms_stop(c);
    dl_node_stats st;
    dl_node_get_stats(node, &st);
    fprintf(log, "step=%ld tokens=%llu discarded=%llu returned=%llu\n", s,
            (unsigned long long)((uint64_t)(s - s0) * tps), (unsigned long long)st.discarded_tokens,
            (unsigned long long)st.returned);
    /* what the flush could not place (refused more often than the node sends a final push again): the
     * learner leaves with it, the ledger counts it LOST */
    uint64_t unpushed = 0;
    for (int p = 0; p < P; p++) unpushed += dl_node_tokens(node, p);
    fprintf(log, "finish left=%d unpushed=%llu pushes=%llu flushed=%llu\n", left, (unsigned long long)unpushed,
            (unsigned long long)st.pushes, (unsigned long long)st.flushed);
    fclose(log);
    if (jfd >= 0) close(jfd);
    dl_node_close(&node);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    dl_plan_close(&plan);
    free(theta);
    free(step_add);
    dl_event_close();
    return left == 0 ? 0 : 1;
}

/* ---- check */

typedef struct {
    char id[DL_STORE_ID_MAX + 1];
    double amount;
} who;

typedef struct {
    const who *w;
    int nw;
    double shift; /* per unit of c(e) */
    int unknown;  /* merged contributors without an amount */
} replay;

static int on_merge(const dl_merge_record *rec, void *ctx)
{
    replay *r = ctx;
    for (uint32_t i = 0; i < rec->n_contrib; i++) {
        const dl_merge_contrib *c = &rec->contrib[i];
        if (c->decision != DL_MERGE_MERGED) continue;
        int k = 0;
        while (k < r->nw && strcmp(r->w[k].id, c->learner_id)) k++;
        if (k == r->nw) {
            r->unknown++;
            continue;
        }
        r->shift += c->weight * (double)c->steps * r->w[k].amount;
    }
    return 0;
}

static int check(const kv *o, int n)
{
    const char *dir = opt(o, n, "store", NULL), *am = opt(o, n, "amounts", NULL);
    if (!dir || !am) return usage("check needs --store and --amounts");
    int int4 = atoi(opt(o, n, "int4", "0"));
    who w[256];
    int nw = 0;
    for (const char *a = am; *a && nw < 256;) {
        const char *eq = strchr(a, '='), *comma = strchr(a, ',');
        if (!eq || (comma && comma < eq) || eq - a > DL_STORE_ID_MAX) return usage("--amounts is ID=A,ID=A,...");
        snprintf(w[nw].id, sizeof w[nw].id, "%.*s", (int)(eq - a), a);
        w[nw++].amount = atof(eq + 1);
        if (!comma) break;
        a = comma + 1;
    }
    dl_store_opts so = dl_store_opts_default();
    so.read_only = 1;
    dl_store *st = NULL;
    dl_store_run run;
    dl_plan *plan = NULL;
    if (dl_store_open(dir, &so, &st) || dl_store_get_run(st, &run) || dl_model_plan_open(&run.model, (int)run.n_fragments, &plan)) {
        fprintf(stderr, "conserve check: %s\n", dl_errmsg());
        dl_store_close(&st);
        return 2;
    }
    size_t total = dl_plan_total_numel(plan), maxn = dl_plan_max_fragment_numel(plan);
    float *init = malloc(total * sizeof(float)), *fin = malloc(maxn * sizeof(float));
    float *ini = malloc(maxn * sizeof(float)), *fac = malloc(maxn * sizeof(float));
    float *cflat = malloc(total * sizeof(float));
    for (size_t e = 0; e < total; e++) cflat[e] = (float)factor(e);
    int ok = 1, bad = 0;
    double worst = 0, tol = int4 ? 1.0 / 7.0 : 1e-4;
    if (dl_model_init_params(&run.model, run.seed, init)) {
        fprintf(stderr, "conserve check: %s\n", dl_errmsg());
        bad = 1;
    }
    for (int p = 0; p < (int)run.n_fragments && !bad; p++) {
        replay r = {.w = w, .nw = nw};
        uint64_t v = 0;
        size_t k = dl_plan_fragment_numel(plan, p);
        if (dl_store_foreach_merge(st, (uint32_t)p, 1, on_merge, &r) < 0 ||
            dl_store_read_fragment(st, (uint32_t)p, &v, fin, NULL)) {
            fprintf(stderr, "conserve check: fragment %d: %s\n", p, dl_errmsg());
            bad = 1;
            break;
        }
        dl_plan_gather(plan, p, init, ini);
        dl_plan_gather(plan, p, cflat, fac);
        double frag_worst = 0, max_err = 0;
        for (size_t e = 0; e < k; e++) {
            /* the merge subtracts the merged delta (base - theta = -progress) */
            double want = r.shift * (double)fac[e];
            double got = (double)fin[e] - (double)ini[e];
            double err = fabs(got - want);
            double rel = err / (fabs(want) > 1e-6 ? fabs(want) : 1e-6);
            if (rel > frag_worst) frag_worst = rel;
            if (err > max_err) max_err = err;
        }
        if (frag_worst > worst) worst = frag_worst;
        int fok = frag_worst <= tol && r.unknown == 0;
        ok &= fok;
        printf("fragment=%d version=%llu shift=%.9g max_abs_err=%.3g worst_rel=%.3g unknown_learners=%d ok=%d\n", p,
               (unsigned long long)v, r.shift, max_err, frag_worst, r.unknown, fok);
    }
    printf("check fragments=%u worst_rel=%.3g tol=%.3g ok=%d\n", run.n_fragments, worst, tol, ok && !bad);
    free(init);
    free(fin);
    free(ini);
    free(fac);
    free(cflat);
    dl_plan_close(&plan);
    dl_store_close(&st);
    return bad ? 2 : ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage("no command");
    kv o[64];
    int n = 0;
    for (int i = 2; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) || i + 1 >= argc || n == 64) return usage("options are --name value");
        o[n].name = argv[i] + 2;
        o[n++].value = argv[++i];
    }
    if (!strcmp(argv[1], "learn")) return learn(o, n);
    if (!strcmp(argv[1], "check")) return check(o, n);
    return usage("the command is learn or check");
}
