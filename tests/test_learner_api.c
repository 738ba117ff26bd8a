/* Tests of the public learner API (include/dloco/learner.h) against a fake synchronizer on loopback
 * (tests/fakesync.h): refusals, host and callback bindings, the changed-fragment report, join failures, and
 * injected allocation failures that must come back as codes, never as an abort. */
#include "dloco/learner.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/model.h"
#include "core/plan.h"
#include "learner/learner_int.h"
#include "tests/fakesync.h"

#include "tests/check.h"
#include "tests/fakesync_check.h"

#define P 4
#define H 2
#define TOK 32 /* tokens per step: B 8 x T 4 */

static void nap_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const dloco_gpt2_config GPT = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 16};
static dl_model_config CFG;
static dl_plan *plan;
static size_t total;
static int NT;
static dloco_tensor man[64];

/* The synchronizer's global fragment p at `version`: recognisable values. */
static void global_of(int p, uint64_t version, float *g)
{
    size_t k = dl_plan_fragment_numel(plan, p);
    for (size_t i = 0; i < k; i++) g[i] = 0.01f * (float)(p + 1) + 0.001f * (float)i + 0.1f * (float)version;
}

static void base_opts(dloco_learner_opts *o, const char *ep, const char *id)
{
    dloco_learner_opts_init(o);
    o->connect = ep;
    o->run_id = "dloco";
    o->learner_id = id;
    o->fragments = P;
    o->tensors = man;
    o->n_tensors = NT;
    o->max_tokens_per_step = TOK;
    o->gpt2 = &GPT;
}

/* Fast timings for the sessions (their order is what the comms checks demand). */
static void fast(dloco_learner *l)
{
    static const char *kv[][2] = {{"poll_max_ms", "10"},        {"hello_unsent_ms", "10"},
                                  {"hello_retry_ms", "100"},    {"hello_retry_max_ms", "200"},
                                  {"reconnect_ms", "20"},       {"reconnect_max_ms", "100"},
                                  {"adopt", "overwrite"},       {"bye_linger_ms", "500"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        REQUIRE(dloco_learner_set_option(l, kv[i][0], kv[i][1]) == 0, "%s: %s", kv[i][0], dloco_learner_errmsg(l));
    if (getenv("DLOCO_TEST_VERBOSE")) dloco_learner_set_option(l, "log_level", "debug");
}

// ---------------------------------------------------------------------------
// refusals: options, manifest, bindings, calls out of order (no network)

static int open_rc(const dloco_learner_opts *o)
{
    dloco_learner *l = NULL;
    int rc = dloco_learner_open(o, &l);
    if (rc) CHECK(l == NULL && dloco_learner_errmsg(NULL)[0], "a refused open leaves no handle and says why");
    dloco_learner_close(&l);
    dloco_learner_close(&l); /* twice is safe */
    return rc;
}

static void test_refusals(void)
{
    CHECK_EQ(dloco_learner_api_version(), DLOCO_LEARNER_API_VERSION);
    CHECK_EQ(dloco_learner_api_version() / 10000, DLOCO_LEARNER_API_MAJOR);
    CHECK_STR(dloco_learner_strerror(DLOCO_ESTATE), "call out of order");
    CHECK_STR(dloco_learner_strerror(DLOCO_EREFUSED), "refused by the synchronizer");
    CHECK(dloco_learner_strerror(-999) != NULL, "unknown code has a text");
    dloco_learner_opts o;
    base_opts(&o, "tcp://127.0.0.1:1", "R1");
    dloco_learner *l = NULL;
    REQUIRE(dloco_learner_open(&o, &l) == 0, "a good open: %s", dloco_learner_errmsg(NULL));
    CHECK_EQ(dloco_learner_fragments(l), P);
    CHECK_EQ(dloco_learner_numel(l), total);
    CHECK(dloco_learner_fingerprint(l) == dl_model_fingerprint(&CFG, plan), "GPT-2 fingerprint = dloco-learner's");
    uint64_t sum = 0;
    for (int p = 0; p < P; p++) {
        int n = dloco_learner_fragment_nspans(l, p);
        CHECK(n >= 1, "fragment %d has spans", p);
        for (int i = 0; i < n; i++) {
            dloco_span s;
            CHECK(dloco_learner_fragment_span(l, p, i, &s) == 0 && s.fragment == p, "span");
            sum += s.numel;
        }
        CHECK_EQ(dloco_learner_fragment_numel(l, p), dl_plan_fragment_numel(plan, p));
    }
    CHECK_EQ(sum, total);
    CHECK_EQ(dloco_learner_fragment_nspans(l, P), DLOCO_EINVAL);
    CHECK_EQ(dloco_learner_set_option(l, "no_such_option", "1"), DLOCO_EINVAL);
    CHECK_EQ(dloco_learner_set_option(l, "alpha", "2"), DLOCO_ERANGE);
    CHECK(strstr(dloco_learner_errmsg(l), "alpha") != NULL, "the message names the option: %s", dloco_learner_errmsg(l));
    CHECK_EQ(dloco_learner_step(l, TOK, 1.0, -1, NULL), DLOCO_ESTATE);
    CHECK_EQ(dloco_learner_join(l, 100), DLOCO_ESTATE); /* not bound */
    CHECK_EQ(dloco_learner_finish(l, 0, NULL), DLOCO_ESTATE);
    float *bufs[64] = {0};
    CHECK_EQ(dloco_learner_bind_host(l, bufs, NT - 1), DLOCO_EMISMATCH);
    CHECK_EQ(dloco_learner_bind_host(l, bufs, NT), DLOCO_EINVAL); /* NULL buffers */
    CHECK(strstr(dloco_learner_errmsg(l), "wte") != NULL, "names the tensor: %s", dloco_learner_errmsg(l));
    float *flat = calloc(total, sizeof(float));
    CHECK_EQ(dloco_learner_bind_contiguous(l, flat, total - 1), DLOCO_EMISMATCH);
    CHECK_EQ(dloco_learner_bind_contiguous(l, NULL, total), DLOCO_EINVAL);
    dloco_param_callbacks cb = {.struct_size = sizeof cb};
    CHECK_EQ(dloco_learner_bind_callbacks(l, &cb), DLOCO_EINVAL);
    CHECK_EQ(dloco_learner_bind_contiguous(l, flat, total), 0);
    CHECK_EQ(dloco_learner_bind_contiguous(l, flat, total), DLOCO_ESTATE); /* one binding */
    dloco_learner_stats st = {.struct_size = sizeof st};
    CHECK(dloco_learner_get_stats(l, &st) == 0 && st.state == DLOCO_STATE_OPEN && st.flush_unanswered == -1,
          "stats before join");
    dloco_learner_close(&l);
    free(flat);

    /* options */
    CHECK_EQ(open_rc(NULL), DLOCO_EINVAL);
    dloco_learner_opts b = o;
    b.struct_size = 4;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.connect = "";
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.connect = "tcp://127.0.0.1:1,,tcp://127.0.0.1:2";
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.connect = "tcp://127.0.0.1:1,tcp://127.0.0.1:2,tcp://127.0.0.1:3,tcp://127.0.0.1:4,tcp://127.0.0.1:5";
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL); /* more shards than fragments */
    b = o, b.run_id = NULL;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.learner_id = "has space";
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.fragments = 0;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.fragments = 1000; /* more than the tensors can make */
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.max_tokens_per_step = 0;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.max_tokens_per_step = 3; /* less than one GPT-2 sequence */
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.config_path = "/nonexistent/learner.ini";
    CHECK_EQ(open_rc(&b), DLOCO_EIO);
    char ini[] = "/tmp/dloco_api_XXXXXX";
    int fd = mkstemp(ini);
    REQUIRE(fd >= 0, "mkstemp");
    const char *bad_ini = "adopt = sideways\n";
    CHECK(write(fd, bad_ini, strlen(bad_ini)) == (ssize_t)strlen(bad_ini), "write ini");
    close(fd);
    b = o, b.config_path = ini;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    CHECK(strstr(dloco_learner_errmsg(NULL), "adopt") != NULL, "names the row: %s", dloco_learner_errmsg(NULL));
    unlink(ini);

    /* the manifest */
    dloco_tensor m2[64];
    b = o, b.n_tensors = 0;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL); /* empty */
    b = o, b.tensors = NULL;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    b = o, b.gpt2 = NULL, b.tensors = m2;
#define BAD_MANIFEST(edit, what)                                                                          \
    do {                                                                                                  \
        memcpy(m2, man, sizeof man);                                                                      \
        edit;                                                                                             \
        CHECK(open_rc(&b) == DLOCO_EINVAL, "%s is refused", what);                                        \
    } while (0)
    BAD_MANIFEST(m2[3].shape[0] = 0, "a zero dim");
    BAD_MANIFEST(m2[4].shape[1] = -5, "a negative dim");
    BAD_MANIFEST(m2[3].ndim = 5, "five dims");
    BAD_MANIFEST(m2[3].ndim = 0, "no dims");
    BAD_MANIFEST(m2[4].name = m2[2].name, "a duplicate name");
    CHECK(strstr(dloco_learner_errmsg(NULL), "both named") != NULL, "%s", dloco_learner_errmsg(NULL));
    BAD_MANIFEST(m2[1].name = NULL, "no name");
    BAD_MANIFEST(m2[1].name = "", "an empty name");
    BAD_MANIFEST(m2[1].name = "tab\there", "a name with a control byte");
    static char longname[200];
    memset(longname, 'x', 140);
    BAD_MANIFEST(m2[1].name = longname, "a 140-byte name");
    BAD_MANIFEST(m2[1].role = 7, "an unknown role");
    BAD_MANIFEST(m2[1].shape[0] = 1ll << 40, "a model above 2^40 floats");
    /* a GPT-2 manifest that is not its config's table */
    b.gpt2 = &GPT;
    BAD_MANIFEST(m2[2].shape[0] = 9, "a GPT-2 tensor of the wrong shape");
    CHECK(strstr(dloco_learner_errmsg(NULL), "GPT-2") != NULL, "%s", dloco_learner_errmsg(NULL));
    BAD_MANIFEST(m2[2].role = DLOCO_ROLE_MATRIX, "a GPT-2 tensor of the wrong role");
    BAD_MANIFEST(m2[0].name = "tok_embeddings", "a GPT-2 tensor of another name");
    memcpy(m2, man, sizeof man);
    b.n_tensors = NT - 1;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL); /* a tensor short */
    dloco_gpt2_config bad = GPT;
    bad.n_head = 3; /* n_embd % n_head != 0 */
    b = o, b.gpt2 = &bad;
    CHECK_EQ(open_rc(&b), DLOCO_EINVAL);
    CHECK_EQ(dloco_learner_gpt2_manifest(&bad, m2, 64), DLOCO_EINVAL);
#undef BAD_MANIFEST

    /* a manifest of any model: 3 and 4 dims are cut by rows */
    dloco_tensor any[3] = {{.name = "conv", .ndim = 4, .role = DLOCO_ROLE_MATRIX, .shape = {8, 3, 3, 3}},
                           {.name = "emb", .ndim = 2, .role = DLOCO_ROLE_EMBEDDING, .shape = {100, 16}},
                           {.name = "norm", .ndim = 1, .role = DLOCO_ROLE_VECTOR, .shape = {16}}};
    b = o, b.gpt2 = NULL, b.tensors = any, b.n_tensors = 3, b.fragments = 2;
    l = NULL;
    CHECK(dloco_learner_open(&b, &l) == 0, "any model opens: %s", dloco_learner_errmsg(NULL));
    CHECK_EQ(dloco_learner_numel(l), 8 * 27 + 1600 + 16);
    dloco_learner_close(&l);
}

// ---------------------------------------------------------------------------
// a whole session through the API: join, pushes, the changed report, finish

typedef struct {
    dloco_learner *l;
    int timeout_ms, rc;
    atomic_int done; /* join_main returned */
    pthread_t t;
} bg;

static void *join_main(void *a)
{
    bg *b = a;
    b->rc = dloco_learner_join(b->l, b->timeout_ms);
    atomic_store(&b->done, 1);
    return NULL;
}

/* The next message within timeout_ms while the join in j still runs: its
 * body case, or -1 (nothing, or the join gave up first: an allocation
 * failure before the Hello left need not cost the whole timeout). */
static int next_while_joining(dl_fakesync *fs, dl_wire_msg *m, bg *j, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        int body = fs_next(fs, m, 20);
        if (body >= 0) return body;
        if (atomic_load(&j->done)) return -1;
    }
    return -1;
}

static void *finish_main(void *a)
{
    bg *b = a;
    b->rc = dloco_learner_finish(b->l, b->timeout_ms, "done");
    return NULL;
}

/* Play the synchronizer's side of a join: Hello (checked), Welcome must_fetch at version 1, Fetch, P Updates. */
static void serve_join(dl_fakesync *fs, bg *j)
{
    dl_wire_msg m;
    REQUIRE(fs_expect(fs, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, WAIT_MS, "hello"), "hello");
    const Dloco__V1__Hello *hl = m.env->hello;
    CHECK(hl->fingerprint == dl_model_fingerprint(&CFG, plan), "Hello.fingerprint is dloco-learner's");
    CHECK(hl->n_layer == 1 && hl->n_head == 2 && hl->n_embd == 8 && hl->seq_len == 4 && hl->vocab == 16,
          "Hello's GPT-2 config");
    CHECK_EQ(hl->batch, TOK / 4); /* sequences per step */
    CHECK_EQ(hl->num_fragments, P);
    CHECK_STR(hl->device, "cpu");
    dl_wire_msg_close(&m);
    fs_welcome_args w = {.epoch = 1, .version = 1, .h = H, .hb_ms = 100, .liveness = 50, .must_fetch = 1};
    REQUIRE(fs_welcome(fs, NULL, &w) == 0, "welcome");
    REQUIRE(fs_expect(fs, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, WAIT_MS, "fetch"), "fetch");
    dl_wire_msg_close(&m);
    float *g = malloc(dl_plan_max_fragment_numel(plan) * sizeof(float));
    for (int p = 0; p < P; p++) {
        global_of(p, 1, g);
        REQUIRE(fs_update(fs, NULL, 1, p, 1, g) == 0, "update");
    }
    free(g);
    pthread_join(j->t, NULL);
}

/* As the synchronizer does: MERGED_PENDING at once, ACCEPTED into version v later, then the Update. */
static void accept(dl_fakesync *fs, int p, uint64_t base, uint64_t v)
{
    float *g = malloc(dl_plan_max_fragment_numel(plan) * 4);
    fs_ack(fs, NULL, 1, p, base, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    fs_ack(fs, NULL, 1, p, base, DLOCO__V1__DECISION__DECISION_ACCEPTED, v);
    global_of(p, v, g);
    fs_update(fs, NULL, 1, p, v, g);
    free(g);
}

/* theta (the model in manifest layout, flat) holds the global of p at version v. */
static int frag_is(const float *theta, int p, uint64_t v)
{
    size_t k = dl_plan_fragment_numel(plan, p);
    float *a = malloc(k * 4), *g = malloc(k * 4);
    dl_plan_gather(plan, p, theta, a);
    global_of(p, v, g);
    int same = memcmp(a, g, k * 4) == 0;
    free(a);
    free(g);
    return same;
}

/* The callback binding over a private flat buffer: counts calls, can be told to fail. */
typedef struct {
    float *theta;
    float *snap[P];
    int begins, ends, applies, fail_apply;
} cbmodel;

static int32_t cb_begin(void *ctx, int32_t p)
{
    cbmodel *c = ctx;
    c->begins++;
    if (!c->snap[p]) c->snap[p] = malloc(dl_plan_fragment_numel(plan, p) * 4);
    dl_plan_gather(plan, p, c->theta, c->snap[p]);
    return 0;
}

static int32_t cb_end(void *ctx, int32_t p, const float **v)
{
    cbmodel *c = ctx;
    c->ends++;
    *v = c->snap[p];
    return 0;
}

static int32_t cb_apply(void *ctx, int32_t p, float a, float b, const float *in)
{
    cbmodel *c = ctx;
    c->applies++;
    if (c->fail_apply) return 42;
    size_t k = dl_plan_fragment_numel(plan, p);
    float *t = malloc(k * 4);
    dl_plan_gather(plan, p, c->theta, t);
    for (size_t i = 0; i < k; i++) t[i] = (a == 0.0f ? 0.0f : a * t[i]) + b * in[i];
    dl_plan_scatter(plan, p, t, c->theta);
    free(t);
    return 0;
}

/* mode 0: one host buffer per tensor; 1: one contiguous buffer; 2: callbacks (deferred reads). */
static void test_session(int mode)
{
    printf("-- session, binding %s\n", mode == 0 ? "host" : mode == 1 ? "contiguous" : "callbacks");
    dl_fakesync fs;
    fs_open(&fs, plan, NULL, NULL);
    dloco_learner_opts o;
    base_opts(&o, fs.ep, "S1");
    dloco_learner *l = NULL;
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open: %s", dloco_learner_errmsg(NULL));
    fast(l);
    float *theta = calloc(total, sizeof(float)); /* the model, flat in manifest order */
    float *tp[64];
    for (int i = 0; i < NT; i++) tp[i] = theta + dl_plan_tensor(plan, i)->offset;
    cbmodel cm = {.theta = theta};
    dloco_param_callbacks cb = {.struct_size = sizeof cb, .ctx = &cm, .deferred = 1, .read_begin = cb_begin,
                                .read_end = cb_end, .apply = cb_apply};
    if (mode == 0) CHECK_EQ(dloco_learner_bind_host(l, tp, NT), 0);
    else if (mode == 1) CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    else CHECK_EQ(dloco_learner_bind_callbacks(l, &cb), 0);
    bg j = {.l = l, .timeout_ms = WAIT_MS};
    REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
    serve_join(&fs, &j);
    REQUIRE(j.rc == 0, "join: %s", dloco_learner_errmsg(l));
    for (int p = 0; p < P; p++) CHECK(frag_is(theta, p, 1), "after join the caller's fragment %d is the global", p);
    if (mode == 2) CHECK_EQ(cm.applies, P);
    dloco_learner_stats st = {.struct_size = sizeof st};
    CHECK(dloco_learner_get_stats(l, &st) == 0 && st.state == DLOCO_STATE_READY && st.rebased == P && st.h == H,
          "stats after join: state %d rebased %llu h %u", st.state, (unsigned long long)st.rebased, st.h);

    /* step 1: H 2, P 4 -> fragments 2 and 3 are due (offset (p*H)/P = 1) */
    for (size_t i = 0; i < total; i++) theta[i] -= 0.5f;
    dloco_step_info info = {.struct_size = sizeof info};
    CHECK_EQ(dloco_learner_step(l, TOK, 2.5, 0.01, &info), 0);
    CHECK_EQ(info.step, 1);
    CHECK_EQ(info.adopted, 0);
    CHECK_EQ(info.h, H);
    if (mode == 2) {
        CHECK_EQ(info.pushes, 2); /* begun; posted at the next step */
        for (size_t i = 0; i < total; i++) theta[i] -= 0.25f; /* step 2 trains while the copy "flies" */
        CHECK_EQ(dloco_learner_step(l, TOK, 2.4, 0.01, &info), 0);
        CHECK_EQ(cm.begins, P + 4); /* the join read every fragment once (the trust check), steps 1 and 2 two each */
    } else CHECK_EQ(info.pushes, 2);
    int pushed[P] = {0};
    for (int k = 0; k < 2; k++) {
        dl_wire_msg m;
        if (!fs_expect(&fs, DLOCO__V1__ENVELOPE__BODY_PUSH, &m, WAIT_MS, "push")) break;
        const Dloco__V1__Push *u = m.env->push;
        int p = (int)u->fragment;
        CHECK(p == 2 || p == 3, "push of a due fragment (%d)", p);
        if (p == 2 || p == 3) pushed[p] = 1;
        CHECK_EQ(u->base_version, 1);
        CHECK_EQ(u->steps, 1);
        CHECK_EQ(u->tokens, TOK);
        size_t n = dl_plan_fragment_numel(plan, p), bad = 0;
        float *g1 = malloc(n * 4), *d = malloc(n * 4); /* the payload frame is not float-aligned */
        memcpy(d, dl_wire_msg_payload(&m, 0), n * 4);
        global_of(p < P ? p : 0, 1, g1);
        for (size_t i = 0; i < n; i++) bad += d[i] != g1[i] - (g1[i] - 0.5f); /* base - theta after step 1 */
        free(g1);
        free(d);
        CHECK(bad == 0, "push %d carries base - theta (%zu of %zu elements differ)", p, bad, n);
        dl_wire_msg_close(&m);
    }
    CHECK(pushed[2] && pushed[3], "fragments 2 and 3 pushed");
    /* fragment 2 rejected (nothing follows), fragment 3 accepted and merged into version 2 */
    CHECK_EQ(fs_ack(&fs, NULL, 1, 2, 1, DLOCO__V1__DECISION__DECISION_REJECTED, 0), 0);
    accept(&fs, 3, 1, 2);
    dl_comms_stats cs;
    CHECK(WAIT_FOR((dl_learner_comms_stats(l, &cs), cs.updates >= (uint64_t)P + 1)), "the update arrives");
    CHECK_EQ(dloco_learner_step(l, TOK, 2.3, 0.01, &info), 0);
    CHECK_EQ(info.adopted, 1);
    for (int p = 0; p < P; p++) CHECK_EQ(info.fragment_changed[p], p == 3);
    CHECK(frag_is(theta, 3, 2), "fragment 3 is the merged version 2 (adopt overwrite)");
    int n3 = 0;
    const dl_plan_span *s3 = dl_plan_fragment_spans(plan, 3, &n3);
    for (int i = 0; i < NT; i++) {
        int in3 = 0;
        for (int k = 0; k < n3; k++) in3 |= s3[k].tensor == i;
        CHECK(info.tensor_changed[i] == in3, "tensor %s changed %d, in fragment 3 %d", man[i].name,
              info.tensor_changed[i], in3);
    }
    /* the next step reports nothing new */
    CHECK_EQ(dloco_learner_step(l, TOK, 2.2, 0.01, &info), 0);
    CHECK_EQ(info.adopted, 0);
    for (int p = 0; p < P; p++) CHECK_EQ(info.fragment_changed[p], 0);

    /* finish: final pushes of every fragment with progress; answer them; Bye */
    bg f = {.l = l, .timeout_ms = WAIT_MS};
    REQUIRE(pthread_create(&f.t, NULL, finish_main, &f) == 0, "thread");
    int byes = 0, finals = 0;
    for (int k = 0; k < 40 && !byes; k++) {
        dl_wire_msg m;
        int body = fs_next(&fs, &m, WAIT_MS);
        if (body < 0) break;
        if (body == DLOCO__V1__ENVELOPE__BODY_PUSH) {
            const Dloco__V1__Push *u = m.env->push;
            finals++;
            accept(&fs, (int)u->fragment, u->base_version, u->base_version + 2); /* above every version sent */
        }
        if (getenv("DLOCO_TEST_VERBOSE"))
            fprintf(stderr, "finish: %s %d\n", dl_wire_body_name((Dloco__V1__Envelope__BodyCase)body),
                    body == DLOCO__V1__ENVELOPE__BODY_PUSH ? (int)m.env->push->fragment : -1);
        byes += body == DLOCO__V1__ENVELOPE__BODY_BYE;
        dl_wire_msg_close(&m);
    }
    pthread_join(f.t, NULL);
    if (getenv("DLOCO_TEST_VERBOSE")) {
        dl_learner_comms_stats(l, &cs);
        printf("acks_pending %llu accepted %llu rejected %llu updates %llu old %llu refused %llu\n",
               (unsigned long long)cs.acks_pending, (unsigned long long)cs.accepted, (unsigned long long)cs.rejected,
               (unsigned long long)cs.updates, (unsigned long long)cs.updates_old,
               (unsigned long long)cs.updates_refused);
    }
    CHECK_EQ(byes, 1);
    CHECK(finals >= 1, "final pushes sent (%d)", finals);
    CHECK_EQ(f.rc, 0); /* every final push answered */
    CHECK(dloco_learner_get_stats(l, &st) == 0, "stats");
    CHECK(st.state == DLOCO_STATE_DONE && st.flush_unanswered == 0 && st.steps == (mode == 2 ? 4u : 3u) &&
              st.accepted >= 2 && st.adopted >= 1 && st.pushes >= 3,
          "stats after finish: state %d steps %llu accepted %llu adopted %llu pushes %llu", st.state,
          (unsigned long long)st.steps, (unsigned long long)st.accepted, (unsigned long long)st.adopted,
          (unsigned long long)st.pushes);
    CHECK_EQ(dloco_learner_step(l, TOK, 1.0, -1, NULL), DLOCO_ESTATE);
    CHECK_EQ(dloco_learner_finish(l, 0, NULL), DLOCO_ESTATE);
    CHECK_EQ(fs.bad, 0);
    dloco_learner_close(&l);
    for (int p = 0; p < P; p++) free(cm.snap[p]);
    free(theta);
    fs_close(&fs);
}

/* A callback that fails ends the call with DLOCO_ECALLBACK and the handle with it. */
static void test_callback_failure(void)
{
    dl_fakesync fs;
    fs_open(&fs, plan, NULL, NULL);
    dloco_learner_opts o;
    base_opts(&o, fs.ep, "C1");
    dloco_learner *l = NULL;
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    float *theta = calloc(total, sizeof(float));
    cbmodel cm = {.theta = theta, .fail_apply = 1};
    dloco_param_callbacks cb = {.struct_size = sizeof cb, .ctx = &cm, .read_begin = cb_begin, .read_end = cb_end,
                                .apply = cb_apply};
    CHECK_EQ(dloco_learner_bind_callbacks(l, &cb), 0);
    bg j = {.l = l, .timeout_ms = WAIT_MS};
    REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
    serve_join(&fs, &j);
    CHECK_EQ(j.rc, DLOCO_ECALLBACK);
    CHECK(strstr(dloco_learner_errmsg(l), "returned 42") != NULL, "%s", dloco_learner_errmsg(l));
    CHECK_EQ(dloco_learner_step(l, TOK, 1.0, -1, NULL), DLOCO_ESTATE);
    dloco_learner_close(&l);
    for (int p = 0; p < P; p++) free(cm.snap[p]);
    free(theta);
    fs_close(&fs);
}

/* Nothing listening: a timeout naming the endpoint. A refusing synchronizer: DLOCO_EREFUSED with its reason.
 * A stop request: DLOCO_ESTOPPED. */
static void test_join_failures(void)
{
    dl_fakesync fs;
    fs_open(&fs, plan, NULL, NULL);
    char dead[256];
    snprintf(dead, sizeof dead, "%s", fs.ep);
    fs_close(&fs); /* its port is free now: nothing answers there */
    dloco_learner_opts o;
    base_opts(&o, dead, "J1");
    float *theta = calloc(total, sizeof(float));
    dloco_learner *l = NULL;
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    CHECK_EQ(dloco_learner_join(l, 300), DLOCO_ETIMEDOUT);
    CHECK(strstr(dloco_learner_errmsg(l), dead) != NULL, "the timeout names the endpoint: %s",
          dloco_learner_errmsg(l));
    CHECK_EQ(dloco_learner_join(l, 300), DLOCO_ESTATE);
    dloco_learner_close(&l);

    fs_open(&fs, plan, NULL, NULL);
    base_opts(&o, fs.ep, "J2");
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    bg j = {.l = l, .timeout_ms = WAIT_MS};
    REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
    dl_wire_msg m;
    if (fs_expect(&fs, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, WAIT_MS, "hello")) {
        dl_wire_msg_close(&m);
        fs_error(&fs, NULL, 1, DL_EMISMATCH, "model fingerprint differs: tensor wte", 1);
    }
    pthread_join(j.t, NULL);
    CHECK_EQ(j.rc, DLOCO_EREFUSED);
    CHECK(strstr(dloco_learner_errmsg(l), "tensor wte") != NULL, "the refusal's reason: %s", dloco_learner_errmsg(l));
    dloco_learner_stats st = {.struct_size = sizeof st};
    CHECK(dloco_learner_get_stats(l, &st) == 0 && st.state == DLOCO_STATE_REFUSED, "state refused");
    dloco_learner_close(&l);

    base_opts(&o, fs.ep, "J3");
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    j = (bg){.l = l, .timeout_ms = 20000};
    REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
    if (fs_expect(&fs, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, WAIT_MS, "hello")) dl_wire_msg_close(&m);
    dloco_learner_stop(l); /* as a signal handler would */
    pthread_join(j.t, NULL);
    CHECK_EQ(j.rc, DLOCO_ESTOPPED);
    dloco_learner_close(&l);

    /* a resumed caller (opts.start_step): its Hello says the step it resumed at, so the ledger counts from there */
    fs_close(&fs);
    fs_open(&fs, plan, NULL, NULL);
    base_opts(&o, fs.ep, "J5");
    o.start_step = -1;
    CHECK_EQ(dloco_learner_open(&o, &l), DLOCO_EINVAL);
    o.start_step = 77;
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    j = (bg){.l = l, .timeout_ms = 20000};
    REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
    if (fs_expect(&fs, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, WAIT_MS, "hello")) {
        CHECK(m.env->hello->step == 77, "the Hello of a learner resumed at step 77 says step %llu",
              (unsigned long long)m.env->hello->step);
        dl_wire_msg_close(&m);
    }
    dloco_learner_stop(l);
    pthread_join(j.t, NULL);
    CHECK_EQ(j.rc, DLOCO_ESTOPPED);
    dloco_learner_close(&l);
    fs_close(&fs);

    /* connect_timeout_ms 0: no bound; join keeps trying a dead endpoint (past the 300 ms that timed out above)
     * until it is stopped */
    base_opts(&o, dead, "J4");
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    CHECK(dloco_learner_set_option(l, "connect_timeout_ms", "0") == 0, "connect_timeout_ms 0: %s",
          dloco_learner_errmsg(l));
    CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    j = (bg){.l = l, .timeout_ms = 0};
    REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
    struct timespec ts = {.tv_sec = 1}; /* the stimulus: how long it is left waiting */
    nanosleep(&ts, NULL);
    dloco_learner_stop(l);
    pthread_join(j.t, NULL);
    CHECK_EQ(j.rc, DLOCO_ESTOPPED);
    dloco_learner_close(&l);
    free(theta);
}

/* Issue 27: a learner restarted from its saved state (option state_path)
 * while its synchronizer is out of reach holds every fragment, so join
 * returns at once and it trains; its session keeps trying past
 * connect_timeout_ms (the bound is join's alone). Before, the session gave up
 * after connect_timeout_ms (30 s by default) and the next step failed with
 * DLOCO_ENET: the learner died in the partition it was restarted into.
 * The state it restores is the previous save (path.prev): the caller was
 * killed between the library's save of step 5 and its own checkpoint, so it
 * resumes at step 3 (tests/test_recovery.sh met that pair about 1 run in 15). */
static void test_restart_unreachable(void)
{
    char dir[] = "/tmp/dloco_test_api_XXXXXX", path[300], aside[320];
    REQUIRE(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/state", dir);
    dl_fakesync fs;
    fs_open(&fs, plan, NULL, NULL);
    dloco_learner_opts o;
    base_opts(&o, fs.ep, "R1");
    float *theta = calloc(total, sizeof(float));
    dloco_learner *l = NULL;
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    REQUIRE(dloco_learner_set_option(l, "state_path", path) == 0, "state_path: %s", dloco_learner_errmsg(l));
    CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    bg j = {.l = l, .timeout_ms = WAIT_MS};
    REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
    serve_join(&fs, &j);
    REQUIRE(j.rc == 0, "join: %s", dloco_learner_errmsg(l));
    dloco_step_info info = {.struct_size = sizeof info};
    for (int s = 0; s < 3; s++) CHECK_EQ(dloco_learner_step(l, TOK, 1.0, 0.01, &info), 0);
    CHECK(dloco_learner_save_state(l) == 0, "save_state: %s", dloco_learner_errmsg(l));
    /* a later save whose caller was killed before its own checkpoint of step 5: the state at `path` is at
     * step 5, the caller's at 3; the save kept the step-3 file as path.prev */
    for (int s = 0; s < 2; s++) CHECK_EQ(dloco_learner_step(l, TOK, 1.0, 0.01, &info), 0);
    CHECK(dloco_learner_save_state(l) == 0, "save_state: %s", dloco_learner_errmsg(l));
    snprintf(aside, sizeof aside, "%s.prev", path);
    CHECK(access(aside, F_OK) == 0, "the save kept the previous state as %s", aside);
    dloco_learner_close(&l);
    char dead[256];
    snprintf(dead, sizeof dead, "%s", fs.ep);
    fs_close(&fs); /* the synchronizer is gone: nothing answers there */

    base_opts(&o, dead, "R1");
    o.start_step = 3; /* the caller's own state was saved with the library's, at step 3 */
    REQUIRE(dloco_learner_open(&o, &l) == 0, "open");
    fast(l);
    REQUIRE(dloco_learner_set_option(l, "state_path", path) == 0 &&
                dloco_learner_set_option(l, "connect_timeout_ms", "300") == 0,
            "options: %s", dloco_learner_errmsg(l));
    CHECK_EQ(dloco_learner_bind_contiguous(l, theta, total), 0);
    CHECK(dloco_learner_join(l, 0) == 0, "join of a restored learner returns at once: %s", dloco_learner_errmsg(l));
    /* restored from path.prev (the step-5 state refused for its step): that one went aside, the previous
     * one took its place */
    snprintf(aside, sizeof aside, "%s.rejected", path);
    CHECK(access(aside, F_OK) == 0 && access(path, F_OK) == 0, "the step-5 state moved to %s, step 3's to %s",
          aside, path);
    unlink(aside);
    snprintf(aside, sizeof aside, "%s.prev", path);
    CHECK(access(aside, F_OK) != 0, "%s took the place of %s", aside, path);
    /* the stimulus: it trains for about 1 s, past the 300 ms bound, with nothing answering */
    int ok = 1;
    for (int s = 0; s < 40 && ok; s++) {
        ok = dloco_learner_step(l, TOK, 1.0, 0.01, &info) == 0;
        struct timespec ts = {.tv_nsec = 25 * 1000000L};
        nanosleep(&ts, NULL);
    }
    CHECK(ok, "it trains on while its synchronizer is out of reach: %s", dloco_learner_errmsg(l));
    dloco_learner_stats st = {.struct_size = sizeof st};
    CHECK(dloco_learner_get_stats(l, &st) == 0 && st.state != DLOCO_STATE_FAILED, "not failed (state %d)",
          (int)st.state);
    dloco_learner_close(&l);
    snprintf(aside, sizeof aside, "%s.journal", path);
    unlink(aside);
    unlink(path);
    rmdir(dir);
    free(theta);
}

/* Every allocation of open, bind, join and a step, failed in turn: a code, never an abort. */
static void test_alloc_failures(void)
{
    float *theta = calloc(total, sizeof(float));
    int n, fired = 0, codes = 0;
    for (n = 1; n < 400; n++) {
        dl_fakesync fs;
        fs_open(&fs, plan, NULL, NULL);
        dloco_learner_opts o;
        base_opts(&o, fs.ep, "M1");
        long long before = dl_alloc_count();
        dl_alloc_fail_after(n);
        dloco_learner *l = NULL;
        int rc = dloco_learner_open(&o, &l);
        if (!rc) rc = dloco_learner_set_option(l, "poll_max_ms", "10");
        if (!rc) rc = dloco_learner_set_option(l, "hello_unsent_ms", "10");
        if (!rc) rc = dloco_learner_bind_contiguous(l, theta, total);
        if (!rc) {
            bg j = {.l = l, .timeout_ms = 3000};
            REQUIRE(pthread_create(&j.t, NULL, join_main, &j) == 0, "thread");
            dl_wire_msg m;
            if (next_while_joining(&fs, &m, &j, 1500) == DLOCO__V1__ENVELOPE__BODY_HELLO) {
                dl_wire_msg_close(&m);
                fs_welcome_args w = {.epoch = 1, .version = 1, .h = H, .hb_ms = 100, .liveness = 50, .must_fetch = 1};
                fs_welcome(&fs, NULL, &w);
                if (next_while_joining(&fs, &m, &j, 1500) == DLOCO__V1__ENVELOPE__BODY_FETCH) {
                    dl_wire_msg_close(&m);
                    float *g = malloc(dl_plan_max_fragment_numel(plan) * 4);
                    for (int p = 0; p < P; p++) {
                        global_of(p, 1, g);
                        fs_update(&fs, NULL, 1, p, 1, g);
                    }
                    free(g);
                }
            }
            pthread_join(j.t, NULL);
            rc = j.rc;
            if (!rc) rc = dloco_learner_step(l, TOK, 1.0, 0.01, NULL);
            if (!rc) rc = dloco_learner_step(l, TOK, 1.0, 0.01, NULL);
        }
        int did_fire = dl_alloc_count() - before >= n;
        dl_alloc_fail_after(0);
        dloco_learner_close(&l);
        fs_close(&fs);
        if (rc) {
            codes++;
            CHECK(rc == DLOCO_ENOMEM || rc == DLOCO_ENET || rc == DLOCO_ETIMEDOUT,
                  "allocation %d failed: %s (%s)", n, dloco_learner_strerror(rc), dloco_learner_errmsg(NULL));
        }
        if (!did_fire) break;
        fired++;
    }
    printf("allocation failures: %d injected, %d returned a code, none aborted\n", fired, codes);
    CHECK(fired >= 20 && n < 400, "the loop covered every allocation (%d)", fired);
    free(theta);
}

int main(void)
{
    CFG = (dl_model_config){.n_layer = GPT.n_layer, .n_head = GPT.n_head, .n_embd = GPT.n_embd,
                            .seq_len = GPT.seq_len, .vocab = GPT.vocab};
    REQUIRE(dl_model_config_check(&CFG) == 0, "cfg");
    REQUIRE(dl_model_plan_open(&CFG, P, &plan) == 0, "plan");
    total = dl_plan_total_numel(plan);
    NT = dloco_learner_gpt2_manifest(&GPT, man, 64);
    REQUIRE(NT == dl_plan_ntensors(plan), "gpt2 manifest: %d tensors", NT);
    test_refusals();
    test_session(0);
    test_session(1);
    test_session(2);
    test_callback_failure();
    test_join_failures();
    test_restart_unreachable();
    test_alloc_failures();
    dl_plan_close(&plan);
    return CHECK_DONE("test_learner_api");
}
