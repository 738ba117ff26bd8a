/* dloco-sim's engine: a binary heap of timed events over simulated learners
 * made of chips, feeding the real dl_policy (synchronizer/policy.c) its
 * inputs at simulated times and assembling its rounds with the real
 * dl_round_assemble (synchronizer/round.c). Model and accounting: sim.h,
 * docs/SIM.md. */
#include "chaos/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/plan.h"
#include "core/rng.h"
#include "synchronizer/round.h"

/* ---------------------------------------------------------------- rng */
static double urand(dl_rng *r) { return (double)(dl_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
static double exprand(dl_rng *r, double rate) { return -log(1.0 - urand(r)) / rate; }
static double normrand(dl_rng *r)
{
    double u = urand(r), v = urand(r);
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

/* ---------------------------------------------------------------- events */
enum {
    EV_STEP,    /* l, a = gen: an inner step completes */
    EV_FAIL,    /* l: a chip interruption (thinned) */
    EV_REPAIR,  /* l: a dropped slice is back */
    EV_RESUME,  /* l, a = gen: a pause / down / start ends */
    EV_LIVE,    /* l, a = outage: the synchronizer's liveness timeout */
    EV_PUSH,    /* l, a = push record: a push reaches the synchronizer */
    EV_UPDATE,  /* l, f, a = version: an Update reaches a learner */
    EV_REBASE,  /* l, f: a rebase order reaches a learner */
    EV_COMMIT,  /* a = pending round: its merge is committed */
    EV_POLL,    /* the policy's next deadline */
    EV_KILL,    /* l, a = kill index: a scheduled kill (restart after its duration) */
    EV_TICK     /* progress line */
};

typedef struct {
    double t;
    uint64_t seq;
    int type, l, f;
    uint64_t a;
} ev;

typedef struct {
    ev *h;
    size_t n, cap;
    uint64_t seq;
} heap;

static int ev_less(const ev *x, const ev *y) { return x->t < y->t || (x->t == y->t && x->seq < y->seq); }

static void heap_push(heap *q, double t, int type, int l, int f, uint64_t a)
{
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 1024;
        q->h = dl_xrealloc(q->h, q->cap * sizeof *q->h);
    }
    ev e = {t, q->seq++, type, l, f, a};
    size_t i = q->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_less(&e, &q->h[p])) break;
        q->h[i] = q->h[p];
        i = p;
    }
    q->h[i] = e;
}

static ev heap_pop(heap *q)
{
    ev top = q->h[0], last = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && ev_less(&q->h[c + 1], &q->h[c])) c++;
        if (!ev_less(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

/* ---------------------------------------------------------------- state */
enum { S_RUN, S_PAUSE, S_DEAD, S_START };

typedef struct {
    double compute;          /* chip-s behind it (this fragment's, since the learner's adopt) */
    int64_t steps, tokens;
    uint64_t version;        /* the version it was merged into (awaiting the Update) */
    int on;
} snap;

typedef struct {
    int site;
    double chips;            /* this learner's chips */
    int slices, up;          /* slices, slices up */
    int state, started;      /* started: the first start is over (later starts are recovery) */
    uint64_t gen, outage;    /* gen: step/resume events; outage: liveness timeouts */
    double resume_at, last_t, step_end, step_left, step_s;
    int dead_in_policy, joined;
    int64_t step;
    uint64_t tokens_total;
    double *acc;             /* [P] chip-s since adopt of fragment f */
    int64_t *steps_f, *tokens_f;
    uint64_t *base;          /* [P] adopted version */
    snap *await;             /* [P] the push merged, its Update not yet adopted */
    char *undecided, *owed;  /* [P] dloco-learner's hold rule (learner/node.c): while a push of f is
                                undecided (not yet merged and adopted, nor dropped), the next push of f
                                is held (owed) and made at the first step after the decision */
} learner;

typedef struct {
    int l, f;
    double compute;
    int64_t steps, tokens;
    uint64_t base;
    int used;
} pushrec;

typedef struct {
    dl_policy_round r;
    dl_policy_contrib *c;
    int used;
} pending;

typedef struct {
    const dl_sim_cfg *c;
    dl_sim_result *res;
    dl_rng rng;
    heap q;
    learner *L;
    int M, P;
    dl_policy *pol;
    pushrec *pr;
    size_t n_pr, cap_pr, free_pr;
    pending *pd;
    int n_pd;
    double up_free[DL_SIM_MAX_SITES], down_free[DL_SIM_MAX_SITES];
    double tx_s[DL_SIM_MAX_SITES];
    double poll_at;
    double live_s;
    double now;
    double st_w, st_sum, q_sum; /* staleness and quality, compute-weighted */
    char names[64];
} sim;

static int64_t ns(double s) { return (int64_t)llround(s * 1e9); }

/* ---------------------------------------------------------------- config */
const char *dl_sim_mode_name(dl_sim_mode m)
{
    return m == DL_SIM_DP ? "dp" : m == DL_SIM_ELASTIC ? "elastic" : m == DL_SIM_DECOUPLED ? "decoupled" : "?";
}

void dl_sim_cfg_default(dl_sim_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->mode = DL_SIM_DECOUPLED;
    c->seed = 1;
    c->horizon_s = 86400;
    c->chips = 1200000;
    c->learners = 8;
    c->mtbi_s = 365.25 * 86400;
    c->recovery_s = 60;
    c->ckpt_s = 0;
    c->slice_chips = 256;
    c->resize_s = 10;
    c->repair_s = 3600;
    c->learner_fail = DL_SIM_FAIL_RESIZE;
    c->startup_s = 0;
    c->restart_s = 0;
    c->step_s = 1.0;
    c->step_cv = 0.05;
    c->H = 100;
    c->P = 16;
    c->params = 5e9;
    c->bytes_per_param = 2;
    c->n_sites = 1;
    c->bandwidth_mbit[0] = 100000;
    c->rtt_ms[0] = 50;
    for (int i = 0; i < DL_SIM_MAX_LEARNERS; i++) c->site_of[i] = -1;
    c->heartbeat_ms = 1000;
    c->liveness = 6;
    c->merge_s = 0;
    dl_policy_cfg_default(&c->policy);
    c->policy.quorum = 1;
    c->policy.grace_cap_ns = 30LL * 1000000000LL;
    c->policy.tau_steps = 4;
}

#define RANGE(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) return dl_err(DL_ERANGE, __VA_ARGS__);                                                            \
    } while (0)

int dl_sim_cfg_check(const dl_sim_cfg *c)
{
    RANGE(c->mode >= DL_SIM_DP && c->mode <= DL_SIM_DECOUPLED, "sim: mode %d: dp, elastic or decoupled", (int)c->mode);
    RANGE(c->horizon_s > 0 && c->horizon_s <= 1e9, "sim: horizon_s %g: in (0, 1e9]", c->horizon_s);
    RANGE(c->chips >= 1 && c->chips <= 1000000000LL, "sim: chips %lld: in [1, 1e9]", (long long)c->chips);
    RANGE(c->learners >= 1 && c->learners <= DL_SIM_MAX_LEARNERS && c->learners <= c->chips,
          "sim: learners %d: in [1, %d] and at most chips", c->learners, DL_SIM_MAX_LEARNERS);
    RANGE(c->mtbi_s == 0 || (c->mtbi_s >= 1 && c->mtbi_s <= 1e12), "sim: mtbi_s %g: 0 (none) or in [1, 1e12]",
          c->mtbi_s);
    RANGE(c->recovery_s >= 0 && c->recovery_s <= 1e6, "sim: recovery_s %g: in [0, 1e6]", c->recovery_s);
    RANGE(c->ckpt_s >= 0 && c->ckpt_s <= 1e7, "sim: ckpt_s %g: in [0, 1e7]", c->ckpt_s);
    RANGE(c->slice_chips >= 1 && c->slice_chips <= c->chips, "sim: slice_chips %lld: in [1, chips]",
          (long long)c->slice_chips);
    RANGE(c->resize_s >= 0 && c->resize_s <= 1e6, "sim: resize_s %g: in [0, 1e6]", c->resize_s);
    RANGE(c->repair_s >= 0 && c->repair_s <= 1e8, "sim: repair_s %g: in [0, 1e8]", c->repair_s);
    RANGE(c->learner_fail == DL_SIM_FAIL_RESIZE || c->learner_fail == DL_SIM_FAIL_RESTART,
          "sim: learner_fail %d: resize or restart", (int)c->learner_fail);
    RANGE(c->startup_s >= 0 && c->startup_s <= 1e6 && c->restart_s >= 0 && c->restart_s <= 1e6,
          "sim: startup_s / restart_s: in [0, 1e6]");
    RANGE(c->step_s >= 1e-4 && c->step_s <= 1e4, "sim: step_s %g: in [1e-4, 1e4]", c->step_s);
    RANGE(c->step_cv >= 0 && c->step_cv <= 2, "sim: step_cv %g: in [0, 2]", c->step_cv);
    RANGE(c->H >= 1 && c->H <= 1000000, "sim: H %d: in [1, 1e6]", c->H);
    RANGE(c->P >= 1 && c->P <= 4096, "sim: P %d: in [1, 4096]", c->P);
    RANGE(c->params >= 1 && c->params <= 1e14, "sim: params %g: in [1, 1e14]", c->params);
    RANGE(c->bytes_per_param > 0 && c->bytes_per_param <= 16, "sim: bytes_per_param %g: in (0, 16]",
          c->bytes_per_param);
    RANGE(c->n_sites >= 1 && c->n_sites <= DL_SIM_MAX_SITES, "sim: sites %d: in [1, %d]", c->n_sites,
          DL_SIM_MAX_SITES);
    for (int i = 0; i < c->n_sites; i++)
        RANGE(c->bandwidth_mbit[i] >= 0 && c->bandwidth_mbit[i] <= 1e9 && c->rtt_ms[i] >= 0 && c->rtt_ms[i] <= 1e5,
              "sim: site %d: bandwidth_mbit in [0, 1e9], rtt_ms in [0, 1e5]", i);
    for (int i = 0; i < c->learners; i++)
        RANGE(c->site_of[i] >= -1 && c->site_of[i] < c->n_sites, "sim: learner %d: site %d of %d", i, c->site_of[i],
              c->n_sites);
    RANGE(c->heartbeat_ms >= 1 && c->heartbeat_ms <= 1e6 && c->liveness >= 1 && c->liveness <= 1000,
          "sim: heartbeat_ms in [1, 1e6], liveness in [1, 1000]");
    RANGE(c->merge_s >= 0 && c->merge_s <= 1e4, "sim: merge_s %g: in [0, 1e4]", c->merge_s);
    RANGE(c->update_s >= 0 && c->update_s <= 1e4, "sim: update_s %g: in [0, 1e4]", c->update_s);
    RANGE(c->step_overhead_s >= 0 && c->step_overhead_s <= 1e4, "sim: step_overhead_s %g: in [0, 1e4]",
          c->step_overhead_s);
    RANGE(c->n_kill >= 0 && c->n_kill <= DL_SIM_MAX_KILLS, "sim: %d kills, at most %d", c->n_kill,
          DL_SIM_MAX_KILLS);
    for (int i = 0; i < c->n_kill; i++)
        RANGE(c->kill[i].learner >= 0 && c->kill[i].learner < c->learners && c->kill[i].at_s >= 0 &&
                  c->kill[i].at_s <= 1e9 && c->kill[i].duration_s >= 0 && c->kill[i].duration_s <= 1e9,
              "sim: kill %d: learner %d of %d, at_s %g and duration_s %g in [0, 1e9]", i, c->kill[i].learner,
              c->learners, c->kill[i].at_s, c->kill[i].duration_s);
    RANGE(c->n_fail_at >= 0 && c->n_fail_at <= DL_SIM_MAX_FAILS, "sim: %d fail_at, at most %d", c->n_fail_at,
          DL_SIM_MAX_FAILS);
    for (int i = 0; i < c->n_fail_at; i++) {
        RANGE(c->fail_at[i] >= 0 && c->fail_at[i] <= 1e9, "sim: fail_at %d: %g, in [0, 1e9]", i, c->fail_at[i]);
        if (i) RANGE(c->fail_at[i] >= c->fail_at[i - 1], "sim: fail_at must be non-decreasing");
    }
    if (c->mode == DL_SIM_DECOUPLED && c->policy.kind != DL_POLICY_DECOUPLED)
        return dl_err(DL_EINVAL, "sim: policy %s: the simulated learners never wait at a barrier, so only the "
                                 "decoupled policy is simulated (dp and elastic are the synchronous baselines)",
                      dl_policy_kind_name(c->policy.kind));
    return 0;
}

/* ---------------------------------------------------------------- DP */
/* The SPMD job: runs, an interruption stops it for recovery_s, the work
 * since the last checkpoint is lost; interruptions during a recovery are
 * absorbed. O(interruptions). */
static void run_dp(const dl_sim_cfg *c, dl_sim_result *r)
{
    dl_rng rng;
    dl_rng_seed(&rng, c->seed);
    double N = (double)c->chips, T = c->horizon_s, lam = c->mtbi_s > 0 ? N / c->mtbi_s : 0;
    double t = 0, kept = 0, lost = 0, rec = 0;
    int fi = 0;
    double next = c->n_fail_at ? c->fail_at[fi++] : lam > 0 ? exprand(&rng, lam) : INFINITY;
    while (t < T) {
        double end = next < T ? next : T;
        double run = end - t;
        if (end >= T) { /* the horizon: the work is there (a final checkpoint) */
            kept += run;
            break;
        }
        double k = c->ckpt_s > 0 ? floor(run / c->ckpt_s) * c->ckpt_s : run;
        kept += k;
        lost += run - k;
        r->interruptions++;
        double back = next + c->recovery_s;
        /* interruptions inside the recovery are absorbed */
        do {
            next = fi < c->n_fail_at ? c->fail_at[fi++] : c->n_fail_at ? INFINITY : lam > 0 ? next + exprand(&rng, lam)
                                                                                            : INFINITY;
            if (next < back && next < T) r->interruptions++;
        } while (next < back);
        rec += (back < T ? back : T) - end;
        t = back;
    }
    r->provisioned = N * T;
    r->goodput = N * kept;
    r->wasted = N * lost;
    r->recovery = N * rec;
    r->compute = r->goodput + r->wasted;
}

/* ---------------------------------------------------------------- learners */
static double up_chips(const learner *L) { return L->slices ? L->chips * L->up / L->slices : 0; }

/* Integrate a learner's chips into the buckets up to t. */
static void touch(sim *s, int i, double t)
{
    learner *L = &s->L[i];
    if (t > s->c->horizon_s) t = s->c->horizon_s;
    double dt = t - L->last_t;
    if (dt <= 0) return;
    L->last_t = t;
    double up = up_chips(L);
    dl_sim_result *r = s->res;
    if (L->state == S_DEAD) {
        r->down += L->chips * dt;
        return;
    }
    r->down += (L->chips - up) * dt;
    if (L->state == S_START) {
        if (L->started) r->recovery += up * dt;
        else r->startup += up * dt;
    } else if (L->state == S_PAUSE) {
        r->recovery += up * dt;
    } else {
        double c = up * dt;
        r->compute += c;
        if (s->pol) { /* the step's own share of the loop's wall time goes into the pushes */
            double cf = c * L->step_s / (L->step_s + s->c->step_overhead_s);
            for (int f = 0; f < s->P; f++) L->acc[f] += cf;
        }
        else r->goodput += c;
    }
}

static void schedule_step(sim *s, int i, double t)
{
    learner *L = &s->L[i];
    L->step_end = t + L->step_left + s->c->step_overhead_s;
    heap_push(&s->q, L->step_end, EV_STEP, i, 0, L->gen);
}

/* RUN -> not running (state st) until `until`; a resize inside a resize pause is absorbed by it. */
static void stop_learner(sim *s, int i, double t, int st, double until)
{
    learner *L = &s->L[i];
    touch(s, i, t);
    if (L->state == S_RUN) {
        L->step_left = L->step_end - t;
        if (L->step_left < 0) L->step_left = 0;
        L->outage++;
        if (s->pol) heap_push(&s->q, t + s->live_s, EV_LIVE, i, 0, L->outage);
    } else if (st == S_PAUSE && L->state != S_PAUSE) {
        return; /* dead or starting: a resize has nothing to pause */
    } else if (st == S_PAUSE) {
        return; /* a resize inside a resize pause is done by the same reshard (absorbed, as DP's recovery) */
    }
    L->state = st;
    L->resume_at = until;
    L->gen++;
    heap_push(&s->q, until, EV_RESUME, i, 0, L->gen);
}

static void learner_ready(sim *s, int i, double t)
{
    learner *L = &s->L[i];
    touch(s, i, t);
    L->state = S_RUN;
    L->started = 1;
    if (!s->pol) return;
    if (!L->joined) {
        dl_policy_learner_join(s->pol, (uint32_t)i, ns(t));
        L->joined = 1;
        L->dead_in_policy = 0;
    } else if (L->dead_in_policy) {
        dl_policy_learner_alive(s->pol, (uint32_t)i, ns(t));
        L->dead_in_policy = 0;
    }
    schedule_step(s, i, t);
}

/* A restart: everything unpushed is lost; the learner comes back at step 0 on the global fragments. */
static void kill_learner(sim *s, int i, double t, double down_s)
{
    learner *L = &s->L[i];
    if (L->state == S_DEAD || L->state == S_START) return;
    stop_learner(s, i, t, S_DEAD, t + down_s);
    for (int f = 0; f < s->P; f++) {
        L->acc[f] = 0;
        L->steps_f[f] = L->tokens_f[f] = 0;
        L->await[f].on = 0;
        L->undecided[f] = L->owed[f] = 0;
    }
    L->step = 0;
    L->step_left = L->step_s;
}

static size_t pr_new(sim *s)
{
    if (s->free_pr != (size_t)-1) {
        size_t k = s->free_pr;
        s->free_pr = (size_t)s->pr[k].l;
        return k;
    }
    if (s->n_pr == s->cap_pr) {
        s->cap_pr = s->cap_pr ? s->cap_pr * 2 : 256;
        s->pr = dl_xrealloc(s->pr, s->cap_pr * sizeof *s->pr);
    }
    return s->n_pr++;
}

static void pr_free(sim *s, size_t k)
{
    s->pr[k].used = 0;
    s->pr[k].l = (int)s->free_pr;
    s->free_pr = k;
}

static double tx_up(sim *s, int site, double t)
{
    double st = t > s->up_free[site] ? t : s->up_free[site];
    s->up_free[site] = st + s->tx_s[site];
    return s->up_free[site] + s->c->rtt_ms[site] / 2000.0;
}

static double tx_down(sim *s, int site, double t)
{
    double st = t > s->down_free[site] ? t : s->down_free[site];
    s->down_free[site] = st + s->tx_s[site];
    return s->down_free[site] + s->c->rtt_ms[site] / 2000.0;
}

static void on_step(sim *s, int i, double t)
{
    learner *L = &s->L[i];
    touch(s, i, t);
    L->step++;
    s->res->steps++;
    int64_t tok = (int64_t)llround(up_chips(L));
    L->tokens_total += (uint64_t)tok;
    for (int f = 0; f < s->P; f++) {
        L->steps_f[f]++;
        L->tokens_f[f] += tok;
    }
    int reported = 0;
    for (int f = 0; f < s->P; f++) {
        if (!(dl_plan_due(L->step, f, s->c->H, s->P) || L->owed[f]) || L->steps_f[f] <= 0 || L->tokens_f[f] <= 0)
            continue;
        if (L->undecided[f]) { /* the hold rule */
            L->owed[f] = 1;
            continue;
        }
        L->owed[f] = 0;
        L->undecided[f] = 1;
        if (!reported) { /* the Heartbeat right before the Push */
            dl_policy_learner_progress(s->pol, (uint32_t)i, (uint64_t)L->step, L->tokens_total, 1.0 / L->step_s,
                                       ns(t));
            reported = 1;
        }
        size_t k = pr_new(s);
        s->pr[k] = (pushrec){i, f, L->acc[f], L->steps_f[f], L->tokens_f[f], L->base[f], 1};
        heap_push(&s->q, tx_up(s, L->site, t), EV_PUSH, i, f, k);
        s->res->pushes++;
    }
    L->step_left = L->step_s;
    schedule_step(s, i, t);
}

static const char *lname(void *ctx, uint32_t l)
{
    sim *s = ctx;
    snprintf(s->names, sizeof s->names, "L%u", l);
    return s->names;
}

static void poll_rounds(sim *s, double t)
{
    dl_policy_round r;
    while (dl_policy_poll(s->pol, ns(t), &r)) {
        /* the real round assembly, as dloco-sync's worker gets it */
        dl_round_in in = {.epoch = 1, .staleness_fn = dl_policy_sfn_name(s->c->policy.sfn), .learner_id = lname,
                          .ctx = s};
        dl_round_out out;
        dl_round_assemble(&r, &in, &out);
        dl_round_out_free(&out);
        int k = 0;
        while (k < s->n_pd && s->pd[k].used) k++;
        if (k == s->n_pd) {
            s->pd = dl_xrealloc(s->pd, (size_t)(s->n_pd + 1) * sizeof *s->pd);
            s->pd[s->n_pd++] = (pending){0};
        }
        pending *p = &s->pd[k];
        p->used = 1;
        p->r = r;
        p->c = dl_xcalloc((size_t)(r.n ? r.n : 1), sizeof *p->c);
        memcpy(p->c, r.contribs, (size_t)r.n * sizeof *p->c);
        p->r.contribs = p->c;
        heap_push(&s->q, t + s->c->merge_s, EV_COMMIT, 0, r.fragment, (uint64_t)k);
    }
    int64_t d = dl_policy_next_deadline(s->pol);
    if (d != DL_POLICY_NEVER) {
        double dt = (double)d / 1e9;
        if (dt < t) dt = t;
        if (dt < s->poll_at || s->poll_at <= t) {
            s->poll_at = dt;
            heap_push(&s->q, dt, EV_POLL, 0, 0, 0);
        }
    }
}

static void on_commit(sim *s, int k, double t)
{
    pending *p = &s->pd[k];
    dl_policy_round *r = &p->r;
    dl_policy_committed(s->pol, r->fragment, r->version + 1, ns(t));
    dl_sim_result *res = s->res;
    int counted = t <= s->c->horizon_s;
    if (counted) {
        res->merges++;
        res->contributions += (uint64_t)r->n;
    }
    for (int j = 0; j < r->n; j++) {
        const dl_policy_contrib *c = &r->contribs[j];
        pushrec *pr = &s->pr[c->handle - 1];
        learner *L = &s->L[pr->l];
        if (counted) {
            double g = pr->compute / s->P;
            res->goodput += g;
            s->st_w += g;
            s->st_sum += g * (double)c->staleness;
            s->q_sum += g / sqrt(1.0 + (double)c->staleness);
        }
        /* keep-adopt: the learner keeps its progress since this push when the Update comes */
        L->await[pr->f] = (snap){pr->compute, pr->steps, pr->tokens, r->version + 1, 1};
        pr_free(s, c->handle - 1);
    }
    for (int i = 0; i < s->M; i++)
        if (s->L[i].state != S_DEAD)
            heap_push(&s->q, tx_down(s, s->L[i].site, t) + s->c->update_s, EV_UPDATE, i, r->fragment,
                      r->version + 1);
    free(p->c);
    p->c = NULL;
    p->used = 0;
}

static void on_update(sim *s, int i, int f, uint64_t v, double t)
{
    learner *L = &s->L[i];
    if (L->state == S_DEAD || v <= L->base[f]) return;
    touch(s, i, t);
    snap *a = &L->await[f];
    if (a->on && a->version == v) L->undecided[f] = 0; /* its push was merged and is now adopted */
    if (s->c->adopt_overwrite[i]) { /* theta_f = g: the progress since the push is dropped (wasted) */
        L->acc[f] = 0;
        L->steps_f[f] = L->tokens_f[f] = 0;
        a->on = 0;
    } else if (a->on && a->version == v) {
        L->acc[f] -= a->compute;
        if (L->acc[f] < 0) L->acc[f] = 0;
        L->steps_f[f] -= a->steps;
        L->tokens_f[f] -= a->tokens;
        if (L->steps_f[f] < 0) L->steps_f[f] = 0;
        if (L->tokens_f[f] < 0) L->tokens_f[f] = 0;
        a->on = 0;
    }
    L->base[f] = v;
}

static void on_push(sim *s, size_t k, double t)
{
    pushrec *pr = &s->pr[k];
    dl_policy_verdict v;
    dl_policy_push(s->pol, pr->f, (uint32_t)pr->l, pr->base, pr->steps, pr->tokens, ns(t), k + 1, &v);
    if (v.decision == DL_POLICY_POOLED) {
        if (v.replaced && v.replaced_handle) pr_free(s, v.replaced_handle - 1);
        return;
    }
    if (v.decision == DL_POLICY_DROPPED_STALE) {
        if (t <= s->c->horizon_s) {
            s->res->dropped_stale += pr->compute / s->P;
            s->res->dropped++;
        }
        heap_push(&s->q, tx_down(s, s->L[pr->l].site, t), EV_REBASE, pr->l, pr->f, 0);
    } else {
        s->L[pr->l].undecided[pr->f] = 0; /* rejected: decided (the learner keeps the progress) */
    }
    pr_free(s, k);
}

static void on_rebase(sim *s, int i, int f, double t)
{
    learner *L = &s->L[i];
    if (L->state == S_DEAD) return;
    touch(s, i, t);
    L->acc[f] = 0; /* the local delta is replaced by the global fragment */
    L->steps_f[f] = L->tokens_f[f] = 0;
    L->await[f].on = 0;
    L->undecided[f] = 0; /* decided: dropped */
    L->base[f] = dl_policy_version(s->pol, f);
}

static void on_fail(sim *s, int i, double t)
{
    const dl_sim_cfg *c = s->c;
    learner *L = &s->L[i];
    double rate = L->chips / c->mtbi_s;
    heap_push(&s->q, t + exprand(&s->rng, rate), EV_FAIL, i, 0, 0);
    if (c->learner_fail == DL_SIM_FAIL_RESTART && c->mode == DL_SIM_DECOUPLED) {
        if (L->state == S_DEAD || L->state == S_START) return; /* absorbed by the restart */
        s->res->interruptions++;
        kill_learner(s, i, t, c->recovery_s);
        return;
    }
    /* thinning: the interrupted chip is uniform over all chips; a chip of a dropped slice is already out */
    if (urand(&s->rng) * L->slices >= L->up) return;
    s->res->interruptions++;
    touch(s, i, t);
    L->up--;
    heap_push(&s->q, t + c->repair_s, EV_REPAIR, i, 0, 0);
    stop_learner(s, i, t, S_PAUSE, t + c->resize_s);
}

static void on_resume(sim *s, int i, double t)
{
    learner *L = &s->L[i];
    if (L->state == S_DEAD) {
        touch(s, i, t);
        L->state = S_START;
        L->gen++;
        L->resume_at = t + s->c->restart_s;
        if (s->pol)
            for (int f = 0; f < s->P; f++) L->base[f] = dl_policy_version(s->pol, f);
        heap_push(&s->q, L->resume_at, EV_RESUME, i, 0, L->gen);
        return;
    }
    learner_ready(s, i, t);
}

static void on_live(sim *s, int i, uint64_t outage, double t)
{
    learner *L = &s->L[i];
    if (L->state == S_RUN || L->outage != outage || L->dead_in_policy || !L->joined) return;
    dl_policy_learner_leave(s->pol, (uint32_t)i, ns(t), DL_POLICY_LEAVE_DEAD);
    L->dead_in_policy = 1;
    s->res->deaths++;
}

static int run_fleet(const dl_sim_cfg *c, dl_sim_result *res)
{
    sim S = {0}, *s = &S;
    s->c = c;
    s->res = res;
    dl_rng_seed(&s->rng, c->seed);
    s->M = c->mode == DL_SIM_ELASTIC ? 1 : c->learners;
    s->P = c->P;
    s->free_pr = (size_t)-1;
    s->live_s = c->heartbeat_ms * c->liveness / 1000.0;
    s->poll_at = -1;
    int rc = 0;
    if (c->mode == DL_SIM_DECOUPLED) {
        dl_policy_cfg pc = c->policy;
        pc.max_learners = s->M;
        pc.H = c->H;
        if ((rc = dl_policy_open(&pc, c->P, &s->pol))) return rc;
    }
    double frag_bytes = c->params * c->bytes_per_param / c->P;
    for (int d = 0; d < c->n_sites; d++)
        s->tx_s[d] = c->bandwidth_mbit[d] > 0 ? frag_bytes * 8 / (c->bandwidth_mbit[d] * 1e6) : 0;
    s->L = dl_xcalloc((size_t)s->M, sizeof *s->L);
    int64_t per = c->chips / s->M, extra = c->chips % s->M;
    for (int i = 0; i < s->M; i++) {
        learner *L = &s->L[i];
        L->chips = (double)(per + (i < extra));
        L->slices = (int)((per + (i < extra) + c->slice_chips - 1) / c->slice_chips);
        L->up = L->slices;
        L->site = c->site_of[i] >= 0 ? c->site_of[i] : i % c->n_sites;
        L->step_s = c->step_s / (c->speed[i] > 0 ? c->speed[i] : 1) * exp(c->step_cv * normrand(&s->rng));
        L->step_left = L->step_s;
        L->acc = dl_xcalloc((size_t)c->P, sizeof *L->acc);
        L->steps_f = dl_xcalloc((size_t)c->P, sizeof *L->steps_f);
        L->tokens_f = dl_xcalloc((size_t)c->P, sizeof *L->tokens_f);
        L->base = dl_xcalloc((size_t)c->P, sizeof *L->base);
        L->await = dl_xcalloc((size_t)c->P, sizeof *L->await);
        L->undecided = dl_xcalloc((size_t)c->P, 1);
        L->owed = dl_xcalloc((size_t)c->P, 1);
        L->state = S_START;
        L->gen = 1;
        heap_push(&s->q, c->startup_s, EV_RESUME, i, 0, L->gen);
        if (c->mtbi_s > 0) heap_push(&s->q, exprand(&s->rng, L->chips / c->mtbi_s), EV_FAIL, i, 0, 0);
    }
    for (int k = 0; k < c->n_kill; k++) heap_push(&s->q, c->kill[k].at_s, EV_KILL, c->kill[k].learner, 0, (uint64_t)k);
    if (c->progress)
        for (int k = 1; k < 10; k++) heap_push(&s->q, c->horizon_s * k / 10, EV_TICK, 0, 0, (uint64_t)k);
    while (s->q.n) {
        ev e = heap_pop(&s->q);
        if (e.t > c->horizon_s) break;
        s->now = e.t;
        res->events++;
        learner *L = e.type != EV_COMMIT && e.type != EV_POLL && e.type != EV_TICK ? &s->L[e.l] : NULL;
        switch (e.type) {
        case EV_STEP:
            if (L->state == S_RUN && e.a == L->gen) on_step(s, e.l, e.t);
            break;
        case EV_FAIL: on_fail(s, e.l, e.t); break;
        case EV_REPAIR:
            touch(s, e.l, e.t);
            L->up++;
            stop_learner(s, e.l, e.t, S_PAUSE, e.t + c->resize_s); /* re-adding the slice reshards again */
            break;
        case EV_RESUME:
            if (e.a == L->gen) on_resume(s, e.l, e.t);
            break;
        case EV_LIVE: on_live(s, e.l, e.a, e.t); break;
        case EV_PUSH: on_push(s, (size_t)e.a, e.t); break;
        case EV_UPDATE: on_update(s, e.l, e.f, e.a, e.t); break;
        case EV_REBASE: on_rebase(s, e.l, e.f, e.t); break;
        case EV_COMMIT: on_commit(s, (int)e.a, e.t); break;
        case EV_POLL: break;
        case EV_KILL:
            kill_learner(s, e.l, e.t, c->kill[e.a].duration_s);
            break;
        case EV_TICK:
            fprintf(stderr, "dloco-sim: %s chips=%lld M=%d  %3d%% of %.0f s simulated, %llu events, %llu merges\n",
                    dl_sim_mode_name(c->mode), (long long)c->chips, s->M, (int)e.a * 10, c->horizon_s,
                    (unsigned long long)res->events, (unsigned long long)res->merges);
            break;
        }
        if (s->pol && e.type != EV_TICK) poll_rounds(s, e.t);
    }
    for (int i = 0; i < s->M; i++) touch(s, i, c->horizon_s);
    res->provisioned = (double)c->chips * c->horizon_s;
    if (s->pol) dl_policy_get_stats(s->pol, &res->pstats);
    /* cleanup */
    for (int i = 0; i < s->M; i++) {
        free(s->L[i].acc);
        free(s->L[i].steps_f);
        free(s->L[i].tokens_f);
        free(s->L[i].base);
        free(s->L[i].await);
        free(s->L[i].undecided);
        free(s->L[i].owed);
    }
    for (int k = 0; k < s->n_pd; k++) free(s->pd[k].c);
    free(s->pd);
    free(s->L);
    free(s->pr);
    free(s->q.h);
    if (s->pol) dl_policy_close(&s->pol);
    res->mean_staleness = s->st_w > 0 ? s->st_sum / s->st_w : 0;
    res->quality = s->st_w > 0 ? s->q_sum / s->st_w : 1;
    return 0;
}

int dl_sim_run(const dl_sim_cfg *c, dl_sim_result *r)
{
    memset(r, 0, sizeof *r);
    DL_TRY(dl_sim_cfg_check(c));
    if (c->mode == DL_SIM_DP) run_dp(c, r);
    else DL_TRY(run_fleet(c, r));
    /* the buckets sum to provisioned: wasted is the compute neither merged nor dropped */
    if (r->goodput + r->dropped_stale > r->compute && r->compute > 0) {
        r->credit_excess = (r->goodput + r->dropped_stale) / r->compute - 1;
        double k = r->compute / (r->goodput + r->dropped_stale);
        r->goodput *= k;
        r->dropped_stale *= k;
    }
    if (c->mode != DL_SIM_DP) r->wasted = r->compute - r->goodput - r->dropped_stale;
    if (r->wasted < 0) r->wasted = 0;
    r->goodput_frac = r->provisioned > 0 ? r->goodput / r->provisioned : 0;
    r->mean_contrib = r->merges ? (double)r->contributions / (double)r->merges : 0;
    if (c->mode != DL_SIM_DECOUPLED) r->quality = 1;
    return 0;
}

void dl_sim_result_json(const dl_sim_cfg *c, const dl_sim_result *r, FILE *f)
{
    double P = r->provisioned > 0 ? r->provisioned : 1;
    fprintf(f,
            "{\"mode\":\"%s\",\"chips\":%lld,\"learners\":%d,\"seed\":\"%llu\",\"horizon_s\":%.17g,"
            "\"goodput\":%.9f,\"quality\":%.9f,"
            "\"buckets\":{\"down\":%.9f,\"startup\":%.9f,\"recovery\":%.9f,\"idle_barrier\":%.9f,\"goodput\":%.9f,"
            "\"dropped_stale\":%.9f,\"wasted\":%.9f},\"provisioned_chip_s\":%.17g,\"compute_chip_s\":%.17g,"
            "\"interruptions\":%llu,\"steps\":%llu,\"pushes\":%llu,\"merges\":%llu,\"contributions\":%llu,"
            "\"mean_contrib\":%.6f,\"mean_staleness\":%.6f,\"dropped\":%llu,\"deaths\":%llu,\"events\":%llu,"
            "\"credit_excess\":%.9f,"
            "\"policy\":{\"pushes\":%llu,\"pooled\":%llu,\"replaced\":%llu,\"dropped_stale\":%llu,\"rejected\":%llu,"
            "\"rounds\":%llu,\"merged\":%llu}}\n",
            dl_sim_mode_name(c->mode), (long long)c->chips, c->mode == DL_SIM_DECOUPLED ? c->learners : 1,
            (unsigned long long)c->seed, c->horizon_s, r->goodput_frac, r->quality, r->down / P, r->startup / P,
            r->recovery / P, r->idle_barrier / P, r->goodput / P, r->dropped_stale / P, r->wasted / P,
            r->provisioned, r->compute, (unsigned long long)r->interruptions, (unsigned long long)r->steps,
            (unsigned long long)r->pushes, (unsigned long long)r->merges, (unsigned long long)r->contributions,
            r->mean_contrib, r->mean_staleness, (unsigned long long)r->dropped, (unsigned long long)r->deaths,
            (unsigned long long)r->events, r->credit_excess, (unsigned long long)r->pstats.pushes,
            (unsigned long long)r->pstats.pooled, (unsigned long long)r->pstats.replaced,
            (unsigned long long)r->pstats.dropped_stale, (unsigned long long)r->pstats.rejected,
            (unsigned long long)r->pstats.rounds, (unsigned long long)r->pstats.merged);
}
