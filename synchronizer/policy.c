/* Merge-round policy: quorum, adaptive grace window from robust per-learner
 * arrival statistics, token x staleness weights. Pure; the caller owns time. */
#include "synchronizer/policy.h"

#include "core/defaults.h"
#include "core/err.h"
#include "core/plan.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE_NS INT64_MIN /* "no time recorded" */

enum { SLOT_FREE = 0, SLOT_LIVE, SLOT_DEAD, SLOT_LEFT };

/* One learner. Arrays indexed by fragment are allocated at its first join. */
typedef struct {
    uint32_t id;
    int state;                    /* SLOT_* */
    uint64_t join_seq;            /* p->seq at (re)registration; expected in rounds opened later */
    int64_t *last;                /* [P] arrival of its last push of fragment f, ns, or NONE_NS */
    int32_t *cur_idx;             /* [P] its contribution's index in f's open round, or -1 */
    int64_t gaps[DL_POLICY_HIST]; /* ring of push intervals (same fragment), ns */
    int n_gaps, gap_pos;
    int64_t med, mad;             /* median / MAD of gaps, ns; valid when n_gaps > 0 */
    /* progress report (dl_policy_learner_progress): latest step, cumulative
     * tokens, step rate (steps/s, 0 = unknown) and when it came */
    int64_t rep_ns;               /* NONE_NS until a report */
    int64_t rep_step, rep_tokens;
    double rate;
    int64_t *pstep;               /* [P] step of its last push of f (see push_step()), or -1 */
    int64_t *ptok;                /* [P] tokens of its latest POOLED push of f, 0 if none */
    double tps;                   /* tokens / steps of its latest POOLED push (any fragment), 0 if none */
    int64_t left_ns;              /* when it said Bye (SLOT_LEFT), else NONE_NS */
    int64_t joined_ns;            /* when the slot was taken by this id (a rejoin does not move it), ns */
    int64_t pooled_ns;            /* arrival of its latest POOLED push (any fragment), ns, or NONE_NS */
    int finishing;                /* a push of its final flush came (dl_policy_learner_final): no scheduled push follows */
    uint8_t *fpend;               /* [P] while finishing: its flush has yet to push f (the latest final push's list) */
} slot;

/* One fragment: its committed version, open round and in-flight round. */
typedef struct {
    uint64_t version;
    int in_flight;                /* a closed round awaits committed()/abandon() */
    dl_policy_contrib *cur;       /* open round, [n_cur] of [cap_cur] */
    dl_policy_contrib *flight;    /* round handed out by poll, [n_flight] */
    int n_cur, cap_cur, n_flight, cap_flight;
    uint64_t open_seq;            /* p->seq when the open round got its first push */
    int64_t opened_ns, quorum_ns, cap_ns; /* open round timing; quorum_ns NONE_NS until reached */
    int64_t deadline;             /* when the open round is due, DL_POLICY_NEVER if not */
    dl_policy_close_reason reason;/* why it will close at deadline */
    int n_missing;                /* expected learners without a contribution */
} frag;

struct dl_policy {
    dl_policy_cfg cfg;
    int P;
    frag *frags;                  /* [P] */
    slot *slots;                  /* [cfg.max_learners], [0, n_slots) ever used */
    int n_slots;
    uint32_t *hash;               /* id -> slot index + 1 (0 = empty), open addressing */
    uint32_t hmask;
    int n_live;
    int64_t *scratch;             /* [cfg.max_learners] for the fleet median */
    int64_t fleet_med;            /* fleet's typical push period, ns, 0 if unknown */
    int64_t fleet_step;           /* fleet's typical step time, ns, 0 if unknown (or H unknown) */
    uint64_t seq;                 /* event counter ordering joins against round openings */
    int64_t now;                  /* latest time seen */
    dl_policy_stats st;
    /* Heartbeats (dl_policy_learner_progress) only record: the fleet's step
     * time and every fragment's eval() run once, at the time of the latest
     * one, when anything next reads or changes the state (settle). eval()
     * depends only on the state and that time, and a heartbeat changes
     * nothing else eval reads, so the result is the eager recompute's, and
     * a run of heartbeats between two other events costs one recompute, not
     * one per heartbeat (O(P x N) each: O(P x N^2) per heartbeat period). */
    int unsettled;
    int64_t unsettled_ns;
};

/* Run the recompute the latest heartbeats left (see unsettled). The policy
 * is never const itself: const readers settle it too. */
static void eval(dl_policy *p, int f, int64_t now);
static int64_t fleet_step(dl_policy *p);
static void settle(const dl_policy *cp)
{
    dl_policy *p = (dl_policy *)cp;
    if (!p->unsettled) return;
    p->unsettled = 0;
    p->fleet_step = fleet_step(p);
    for (int f = 0; f < p->P; f++) eval(p, f, p->unsettled_ns);
}

/* ---------------------------------------------------------------- names */

static const char *const kind_names[] = {"decoupled", "sync", "sync-elastic"};
static const char *const sfn_names[] = {"const", "poly", "hinge"};

const char *dl_policy_kind_name(dl_policy_kind k)
{
    return (unsigned)k < 3 ? kind_names[k] : "?";
}

const char *dl_policy_sfn_name(dl_policy_sfn s)
{
    return (unsigned)s < 3 ? sfn_names[s] : "?";
}

int dl_policy_kind_parse(const char *name, dl_policy_kind *out)
{
    if (name) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(name, kind_names[i])) return *out = (dl_policy_kind)i, 0;
        if (!strcmp(name, "ddiloco")) return *out = DL_POLICY_DECOUPLED, 0;
    }
    return dl_err(DL_EINVAL, "unknown merge policy '%s' (valid: decoupled, ddiloco, sync, sync-elastic)",
                  name ? name : "(null)");
}

int dl_policy_sfn_parse(const char *name, dl_policy_sfn *out)
{
    if (name)
        for (int i = 0; i < 3; i++)
            if (!strcmp(name, sfn_names[i])) return *out = (dl_policy_sfn)i, 0;
    return dl_err(DL_EINVAL, "unknown staleness function '%s' (valid: const, poly, hinge)", name ? name : "(null)");
}

const char *dl_policy_decision_name(dl_policy_decision d)
{
    switch (d) {
    case DL_POLICY_POOLED: return "pooled";
    case DL_POLICY_DROPPED_STALE: return "dropped-stale";
    case DL_POLICY_REJECTED: return "rejected";
    case DL_POLICY_MERGED: return "merged";
    }
    return "?";
}

const char *dl_policy_reason_name(dl_policy_reason r)
{
    switch (r) {
    case DL_POLICY_OK: return "ok";
    case DL_POLICY_R_STALE: return "stale";
    case DL_POLICY_R_BAD_STEPS: return "steps must be > 0";
    case DL_POLICY_R_BAD_TOKENS: return "tokens must be > 0";
    case DL_POLICY_R_FUTURE_VERSION: return "base version newer than global";
    case DL_POLICY_R_NOT_MEMBER: return "not a member";
    case DL_POLICY_R_BAD_FRAGMENT: return "fragment out of range";
    case DL_POLICY_R_POOLED_OTHER_BASE:
        return "your push of this fragment on another base version is still pooled; this progress goes into your "
               "next push";
    }
    return "?";
}

const char *dl_policy_close_name(dl_policy_close_reason c)
{
    switch (c) {
    case DL_POLICY_CLOSE_NONE: return "none";
    case DL_POLICY_CLOSE_ALL_IN: return "all-in";
    case DL_POLICY_CLOSE_PREDICTED_NONE: return "predicted-none";
    case DL_POLICY_CLOSE_GRACE_EXPIRED: return "grace-expired";
    case DL_POLICY_CLOSE_CAP: return "cap";
    }
    return "?";
}

/* ---------------------------------------------------------------- config */

void dl_policy_cfg_default(dl_policy_cfg *out)
{
    memset(out, 0, sizeof *out);
    out->kind = DL_POLICY_DECOUPLED;
    out->quorum = 1;
    out->grace_cap_ns = 5000000000LL;
    out->gamma = 0.5;
    out->mad_k = 3.0;
    out->max_staleness = DL_DEF_MAX_STALENESS;
    out->sfn = DL_POLICY_SFN_POLY;
    out->sfn_a = 0.5;
    out->sfn_b = 0.0;
    out->max_learners = 1024;
    out->H = 0;
    out->tau_steps = 4.0;
}

static int bad(char *why, size_t cap, const char *msg)
{
    if (why && cap) snprintf(why, cap, "%s", msg);
    return dl_err(DL_EINVAL, "merge policy config: %s", msg);
}

int dl_policy_cfg_check(const dl_policy_cfg *c, char *why, size_t cap)
{
    char m[160];
    if (why && cap) why[0] = 0;
    if ((unsigned)c->kind > DL_POLICY_SYNC_ELASTIC) return bad(why, cap, "kind must be decoupled, sync or sync-elastic");
    if (c->max_learners < 1 || c->max_learners > DL_POLICY_MAX_LEARNERS) {
        snprintf(m, sizeof m, "max_learners %d outside [1, %d]", c->max_learners, DL_POLICY_MAX_LEARNERS);
        return bad(why, cap, m);
    }
    if (c->quorum < 1 || c->quorum > c->max_learners) {
        snprintf(m, sizeof m, "quorum K=%d outside [1, max_learners=%d]", c->quorum, c->max_learners);
        return bad(why, cap, m);
    }
    if (c->grace_cap_ns <= 0) {
        snprintf(m, sizeof m, "grace_cap_ns %lld must be > 0", (long long)c->grace_cap_ns);
        return bad(why, cap, m);
    }
    if (!(c->gamma > 0.0 && c->gamma <= 10.0)) {
        snprintf(m, sizeof m, "gamma %g outside (0, 10]", c->gamma);
        return bad(why, cap, m);
    }
    if (!(c->mad_k >= 0.0 && c->mad_k <= 100.0)) {
        snprintf(m, sizeof m, "mad_k %g outside [0, 100]", c->mad_k);
        return bad(why, cap, m);
    }
    if (c->H < 0 || c->H > 1000000) {
        snprintf(m, sizeof m, "H %d outside [0, 1e6] (0 = unknown)", c->H);
        return bad(why, cap, m);
    }
    if (!(c->tau_steps > 0.0 && c->tau_steps <= 1e6)) {
        snprintf(m, sizeof m, "tau_steps (grace_steps) %g outside (0, 1e6]", c->tau_steps);
        return bad(why, cap, m);
    }
    if (c->max_staleness < 0 || c->max_staleness > 1000000000LL) {
        snprintf(m, sizeof m, "max_staleness %lld outside [0, 1e9]", (long long)c->max_staleness);
        return bad(why, cap, m);
    }
    switch (c->sfn) {
    case DL_POLICY_SFN_CONST: break;
    case DL_POLICY_SFN_POLY:
        if (!(c->sfn_a >= 0.0 && c->sfn_a <= 64.0)) {
            snprintf(m, sizeof m, "poly staleness exponent a=%g outside [0, 64]", c->sfn_a);
            return bad(why, cap, m);
        }
        break;
    case DL_POLICY_SFN_HINGE:
        if (!(c->sfn_a >= 0.0 && c->sfn_a <= 1e6) || !(c->sfn_b >= 0.0 && c->sfn_b <= 1e9)) {
            snprintf(m, sizeof m, "hinge staleness a=%g, b=%g outside a in [0, 1e6], b in [0, 1e9]", c->sfn_a,
                     c->sfn_b);
            return bad(why, cap, m);
        }
        break;
    default: return bad(why, cap, "staleness function must be const, poly or hinge");
    }
    return 0;
}

/* ---------------------------------------------------------------- weights */

double dl_policy_sfactor(const dl_policy_cfg *cfg, int64_t staleness)
{
    assert(staleness >= 0);
    double s = (double)staleness;
    switch (cfg->sfn) {
    case DL_POLICY_SFN_CONST: return 1.0;
    case DL_POLICY_SFN_POLY: return pow(1.0 + s, -cfg->sfn_a);
    case DL_POLICY_SFN_HINGE: return s <= cfg->sfn_b ? 1.0 : 1.0 / (cfg->sfn_a * (s - cfg->sfn_b) + 1.0);
    }
    DL_PANIC("bad staleness function %d", (int)cfg->sfn);
}

double dl_policy_weight(const dl_policy_cfg *cfg, int64_t steps, int64_t tokens, int64_t staleness)
{
    assert(steps > 0 && tokens > 0);
    double t = (double)tokens;
    return t * t / (double)steps * dl_policy_sfactor(cfg, staleness);
}

/* ---------------------------------------------------------------- small helpers */

static int64_t sat_add(int64_t a, int64_t b) /* b >= 0 */
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* Median of v[0..n) (n >= 1), floor of the mean of the two middles for even n.
 * Sorts a copy; n <= DL_POLICY_HIST. */
static int64_t median(const int64_t *v, int n)
{
    int64_t a[DL_POLICY_HIST];
    assert(n >= 1 && n <= DL_POLICY_HIST);
    for (int i = 0; i < n; i++) {
        int64_t x = v[i];
        int j = i;
        while (j > 0 && a[j - 1] > x) a[j] = a[j - 1], j--;
        a[j] = x;
    }
    if (n & 1) return a[n / 2];
    int64_t lo = a[n / 2 - 1], hi = a[n / 2];
    return lo + (hi - lo) / 2; /* values are >= 0: floor of the mean, no overflow */
}

static void slot_add_gap(slot *s, int64_t gap)
{
    s->gaps[s->gap_pos] = gap;
    s->gap_pos = (s->gap_pos + 1) % DL_POLICY_HIST;
    if (s->n_gaps < DL_POLICY_HIST) s->n_gaps++;
    s->med = median(s->gaps, s->n_gaps);
    int64_t dev[DL_POLICY_HIST];
    for (int i = 0; i < s->n_gaps; i++) dev[i] = s->gaps[i] > s->med ? s->gaps[i] - s->med : s->med - s->gaps[i];
    s->mad = median(dev, s->n_gaps);
}

static int64_t slot_margin(const dl_policy *p, const slot *s)
{
    double m = p->cfg.mad_k * (double)s->mad;
    int64_t floor_ns = s->med / 32;
    if (m >= 9.0e18) return INT64_MAX;
    return (int64_t)m > floor_ns ? (int64_t)m : floor_ns;
}

static void slot_forget_arrivals(dl_policy *p, slot *s)
{
    for (int f = 0; f < p->P; f++) s->last[f] = NONE_NS, s->pstep[f] = -1;
    s->finishing = 0;
}

/* ns per inner step of a learner that reported rate > 0. */
static int64_t step_ns(double rate)
{
    double d = 1e9 / rate;
    return d >= 9.0e18 ? INT64_MAX : (int64_t)d;
}

/* First step of fragment f's schedule (core/plan.h): offset_f, or H when
 * offset_f is 0. */
static int64_t first_due(const dl_policy *p, int f)
{
    int64_t off = (int64_t)f * p->cfg.H / p->P;
    return off ? off : p->cfg.H;
}

/* Smallest step s >= lo (lo >= 1) with dl_plan_due(s, f, H, P). */
static int64_t due_at_or_after(const dl_policy *p, int f, int64_t lo)
{
    int64_t H = p->cfg.H, first = first_due(p, f), off = (int64_t)f * H / p->P;
    int64_t s = lo <= first ? first : off + (lo - off + H - 1) / H * H;
    assert(dl_plan_due(s, f, p->cfg.H, p->P));
    return s;
}

/* Largest step s <= hi with dl_plan_due(s, f, H, P), or hi when none is. */
static int64_t due_at_or_before(const dl_policy *p, int f, int64_t hi)
{
    int64_t H = p->cfg.H, off = (int64_t)f * H / p->P;
    if (hi < first_due(p, f)) return hi;
    return off + (hi - off) / H * H;
}

static int64_t tick(dl_policy *p, int64_t now)
{
    if (now < p->now) return p->now;
    return p->now = now;
}

/* ---------------------------------------------------------------- id -> slot */

static uint32_t hash_id(uint32_t id) { return id * 2654435761u; }

static int find_slot(const dl_policy *p, uint32_t id)
{
    for (uint32_t h = hash_id(id) & p->hmask;; h = (h + 1) & p->hmask) {
        uint32_t v = p->hash[h];
        if (!v) return -1;
        if (p->slots[v - 1].id == id) return (int)(v - 1);
    }
}

/* The slot of a learner that joined and did not leave, or DL_ENOTFOUND. */
static int registered(dl_policy *p, uint32_t id)
{
    int i = find_slot(p, id);
    if (i < 0 || p->slots[i].state == SLOT_LEFT)
        return dl_err(DL_ENOTFOUND, "merge policy: learner %u is not registered", id);
    return i;
}

static void hash_insert(dl_policy *p, uint32_t id, int idx)
{
    uint32_t h = hash_id(id) & p->hmask;
    while (p->hash[h]) h = (h + 1) & p->hmask;
    p->hash[h] = (uint32_t)idx + 1;
}

static void hash_rebuild(dl_policy *p)
{
    memset(p->hash, 0, ((size_t)p->hmask + 1) * sizeof *p->hash);
    for (int i = 0; i < p->n_slots; i++) hash_insert(p, p->slots[i].id, i);
}

/* ---------------------------------------------------------------- round evaluation */

static int expected(const dl_policy *p, const slot *s, const frag *fr)
{
    if (s->join_seq >= fr->open_seq) return 0; /* joined after the round opened */
    if (s->finishing && !s->fpend[fr - p->frags]) return 0; /* its final flush pushes f no more */
    if (s->state == SLOT_LIVE) return 1;
    return s->state == SLOT_DEAD && p->cfg.kind == DL_POLICY_SYNC;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Slack: the fleet's typical push period, median over live learners of med_L
 * (same even convention as median()), or 0 with no statistics yet. Cached by
 * refresh(), which runs after every event that changes a learner's state. */
static int64_t fleet_median(dl_policy *p)
{
    int n = 0;
    for (int i = 0; i < p->n_slots; i++)
        if (p->slots[i].state == SLOT_LIVE && p->slots[i].n_gaps > 0) p->scratch[n++] = p->slots[i].med;
    if (!n) return 0;
    qsort(p->scratch, (size_t)n, sizeof *p->scratch, cmp_i64);
    if (n & 1) return p->scratch[n / 2];
    int64_t lo = p->scratch[n / 2 - 1], hi = p->scratch[n / 2];
    return lo + (hi - lo) / 2;
}

int64_t dl_policy_slack_ns(const dl_policy *p) { return p->fleet_med; }

/* Prediction of learner s's next push of fragment f (policy.h): 1 with the
 * point and margin in ns, 0 when there is nothing to predict from. */
static int predict(const dl_policy *p, const slot *s, int f, int64_t *point, int64_t *margin)
{
    if (p->cfg.H > 0 && s->rate > 0 && s->rep_ns != NONE_NS) {
        int64_t lo = s->rep_step > 1 ? s->rep_step : 1;
        if (s->pstep[f] >= 0 && s->pstep[f] + 1 > lo) lo = s->pstep[f] + 1;
        int64_t next = due_at_or_after(p, f, lo);
        double at = (double)s->rep_ns + (double)(next - s->rep_step) * 1e9 / s->rate;
        *point = at >= 9.0e18 ? INT64_MAX : (int64_t)at;
        int64_t m = step_ns(s->rate);
        if (s->n_gaps > 0) {
            double j = p->cfg.mad_k * (double)s->mad;
            int64_t ji = j >= 9.0e18 ? INT64_MAX : (int64_t)j;
            if (ji > m) m = ji;
        }
        *margin = m;
        return 1;
    }
    if (s->n_gaps == 0 || s->last[f] == NONE_NS) return 0;
    *point = sat_add(s->last[f], s->med);
    *margin = slot_margin(p, s);
    return 1;
}

/* Fleet step time: median over live learners with a rate of their ns per
 * step (even convention of median()), 0 with none or while H is unknown. */
static int64_t fleet_step(dl_policy *p)
{
    if (p->cfg.H <= 0) return 0;
    int n = 0;
    for (int i = 0; i < p->n_slots; i++)
        if (p->slots[i].state == SLOT_LIVE && p->slots[i].rate > 0 && p->slots[i].rep_ns != NONE_NS)
            p->scratch[n++] = step_ns(p->slots[i].rate);
    if (!n) return 0;
    qsort(p->scratch, (size_t)n, sizeof *p->scratch, cmp_i64);
    if (n & 1) return p->scratch[n / 2];
    int64_t lo = p->scratch[n / 2 - 1], hi = p->scratch[n / 2];
    return lo + (hi - lo) / 2;
}

int64_t dl_policy_step_ns(const dl_policy *p)
{
    settle(p);
    return p->fleet_step;
}

/* Recompute when fragment f's open round is due and why. Depends only on the
 * state and on `now` (the time of the event that changed the state). */
static void eval(dl_policy *p, int f, int64_t now)
{
    frag *fr = &p->frags[f];
    const dl_policy_cfg *c = &p->cfg;
    fr->deadline = DL_POLICY_NEVER;
    fr->reason = DL_POLICY_CLOSE_NONE;
    fr->n_missing = 0;
    if (fr->n_cur == 0) return;

    int missing = 0;
    if (c->kind != DL_POLICY_DECOUPLED) {
        for (int i = 0; i < p->n_slots; i++) {
            const slot *s = &p->slots[i];
            if (expected(p, s, fr) && s->cur_idx[f] < 0) missing++;
        }
        fr->n_missing = missing;
        if (missing == 0 && !fr->in_flight) fr->deadline = now, fr->reason = DL_POLICY_CLOSE_ALL_IN;
        return;
    }

    /* the live learners that may still push f: one in its final flush counts only with its contribution in
     * this round or a final push of f still to come (waiting for a push that never comes stalls every
     * learner's flush; not waiting for one that comes closes the round without it) */
    int avail = 0;
    for (int i = 0; i < p->n_slots; i++) {
        const slot *s = &p->slots[i];
        if (s->state == SLOT_LIVE && (!s->finishing || s->cur_idx[f] >= 0 || s->fpend[f])) avail++;
    }
    int keff = c->quorum < avail ? c->quorum : (avail > 1 ? avail : 1);
    if (fr->n_cur < keff) {
        for (int i = 0; i < p->n_slots; i++)
            if (expected(p, &p->slots[i], fr) && p->slots[i].cur_idx[f] < 0) missing++;
        fr->n_missing = missing;
        return;
    }
    if (fr->quorum_ns == NONE_NS) fr->quorum_ns = now; /* measured even while a round is in flight */

    int64_t capdur = c->grace_cap_ns;
    int64_t slack = p->fleet_med;
    if (p->fleet_step > 0) {
        double g = c->tau_steps * (double)p->fleet_step;
        int64_t gi = g >= 9.0e18 ? INT64_MAX : (int64_t)g;
        if (gi < capdur) capdur = gi;
    } else if (slack > 0) {
        double g = c->gamma * (double)slack;
        int64_t gi = g >= 9.0e18 ? INT64_MAX : (int64_t)g;
        if (gi < capdur) capdur = gi;
    }
    int64_t cap = sat_add(fr->quorum_ns, capdur);
    fr->cap_ns = cap;

    /* Wait for every expected learner whose next push of f is predicted before
     * the cap and that has not contributed: a contributor's learner holds its
     * next push of f until the pooled one is decided (learner/node.h, the hold
     * rule), so waiting for it would only ever run into the cap. */
    int waited = 0;
    int64_t wait = NONE_NS;
    for (int i = 0; i < p->n_slots; i++) {
        const slot *s = &p->slots[i];
        if (!expected(p, s, fr)) continue;
        if (s->cur_idx[f] >= 0) continue;
        missing++;
        int64_t point, margin;
        if (!predict(p, s, f, &point, &margin)) continue; /* nothing to predict from */
        if (point > cap) continue; /* predicted after the cap: slow or out of phase, not waited for */
        int64_t until = sat_add(point, margin);
        if (until > cap) until = cap;
        if (until < now) continue; /* overdue already */
        waited++;
        if (until > wait) wait = until;
    }
    fr->n_missing = missing;
    if (fr->in_flight) return; /* the next round waits for the commit */
    if (!waited)
        fr->deadline = now, fr->reason = missing ? DL_POLICY_CLOSE_PREDICTED_NONE : DL_POLICY_CLOSE_ALL_IN;
    else
        fr->deadline = wait, fr->reason = wait == cap ? DL_POLICY_CLOSE_CAP : DL_POLICY_CLOSE_GRACE_EXPIRED;
}

static void refresh(dl_policy *p, int64_t now)
{
    p->fleet_med = fleet_median(p);
    p->fleet_step = fleet_step(p);
    for (int f = 0; f < p->P; f++) eval(p, f, now);
}

/* ---------------------------------------------------------------- lifetime */

int dl_policy_reconfigure(dl_policy *p, const dl_policy_cfg *cfg)
{
    settle(p);
    char why[256];
    DL_TRY(dl_policy_cfg_check(cfg, why, sizeof why));
    if (cfg->kind != p->cfg.kind)
        return dl_err(DL_EINVAL, "merge policy kind cannot change at runtime (%s -> %s)", dl_policy_kind_name(p->cfg.kind),
                      dl_policy_kind_name(cfg->kind));
    if (cfg->H != p->cfg.H)
        return dl_err(DL_EINVAL, "H cannot change at runtime (%d -> %d)", p->cfg.H, cfg->H);
    if (cfg->max_learners != p->cfg.max_learners)
        return dl_err(DL_EINVAL, "max_learners cannot change at runtime (%d -> %d)", p->cfg.max_learners,
                      cfg->max_learners);
    /* every decision reads p->cfg afresh, so the new values apply from the
     * next push, poll or deadline on; open rounds keep their pooled pushes */
    p->cfg = *cfg;
    return 0;
}

const dl_policy_cfg *dl_policy_get_cfg(const dl_policy *p) { return &p->cfg; }

void dl_policy_recompute(dl_policy *p)
{
    p->unsettled = 0;
    p->fleet_step = fleet_step(p);
    for (int f = 0; f < p->P; f++) eval(p, f, p->now);
}

int dl_policy_open(const dl_policy_cfg *cfg, int num_fragments, dl_policy **out)
{
    char why[200];
    *out = NULL;
    DL_TRY(dl_policy_cfg_check(cfg, why, sizeof why));
    if (num_fragments < 1 || num_fragments > (1 << 20))
        return dl_err(DL_EINVAL, "merge policy: num_fragments %d outside [1, 2^20]", num_fragments);
    dl_policy *p = dl_xcalloc(1, sizeof *p);
    p->cfg = *cfg;
    p->P = num_fragments;
    p->now = INT64_MIN;
    uint32_t hcap = 16;
    while (hcap < 2u * (uint32_t)cfg->max_learners) hcap <<= 1;
    p->hmask = hcap - 1;
    p->frags = dl_xcalloc((size_t)num_fragments, sizeof *p->frags);
    p->slots = dl_xcalloc((size_t)cfg->max_learners, sizeof *p->slots);
    p->hash = dl_xcalloc(hcap, sizeof *p->hash);
    p->scratch = dl_xcalloc((size_t)cfg->max_learners, sizeof *p->scratch);
    for (int f = 0; f < num_fragments; f++) {
        frag *fr = &p->frags[f];
        fr->quorum_ns = NONE_NS;
        fr->deadline = DL_POLICY_NEVER;
        fr->cap_ns = DL_POLICY_NEVER;
    }
    *out = p;
    return 0;
}

void dl_policy_close(dl_policy **pp)
{
    dl_policy *p = *pp;
    if (!p) return;
    if (p->frags)
        for (int f = 0; f < p->P; f++) free(p->frags[f].cur), free(p->frags[f].flight);
    if (p->slots)
        for (int i = 0; i < p->n_slots; i++)
            free(p->slots[i].last), free(p->slots[i].cur_idx), free(p->slots[i].pstep), free(p->slots[i].ptok),
                free(p->slots[i].fpend);
    free(p->frags);
    free(p->slots);
    free(p->hash);
    free(p->scratch);
    free(p);
    *pp = NULL;
}

void dl_policy_set_version(dl_policy *p, int f, uint64_t version)
{
    settle(p);
    assert(f >= 0 && f < p->P);
    assert(p->frags[f].n_cur == 0 && !p->frags[f].in_flight);
    p->frags[f].version = version;
}

uint64_t dl_policy_version(const dl_policy *p, int f)
{
    assert(f >= 0 && f < p->P);
    return p->frags[f].version;
}

/* ---------------------------------------------------------------- membership */

static int slot_pooled_anywhere(const dl_policy *p, const slot *s)
{
    for (int f = 0; f < p->P; f++)
        if (s->cur_idx[f] >= 0) return 1;
    return 0;
}

int dl_policy_learner_join(dl_policy *p, uint32_t id, int64_t now)
{
    settle(p);
    now = tick(p, now);
    int i = find_slot(p, id);
    if (i >= 0) {
        slot *s = &p->slots[i];
        if (s->state == SLOT_LIVE) return 0;
        if (s->state == SLOT_LEFT) s->join_seq = ++p->seq; /* a new membership */
        s->state = SLOT_LIVE;
        p->n_live++;
        slot_forget_arrivals(p, s);
        refresh(p, now);
        return 0;
    }
    if (p->n_slots < p->cfg.max_learners) {
        i = p->n_slots;
        slot *s = &p->slots[i];
        s->last = dl_xmalloc((size_t)p->P * sizeof *s->last);
        s->cur_idx = dl_xmalloc((size_t)p->P * sizeof *s->cur_idx);
        s->pstep = dl_xmalloc((size_t)p->P * sizeof *s->pstep);
        s->ptok = dl_xmalloc((size_t)p->P * sizeof *s->ptok);
        s->fpend = dl_xcalloc((size_t)p->P, 1);
        p->n_slots++;
        s->id = id;
        hash_insert(p, id, i);
    } else {
        /* Reuse a forgotten slot, or one of a learner that said bye and has nothing pooled. */
        for (i = 0; i < p->n_slots; i++)
            if (p->slots[i].state == SLOT_FREE ||
                (p->slots[i].state == SLOT_LEFT && !slot_pooled_anywhere(p, &p->slots[i])))
                break;
        if (i == p->n_slots)
            return dl_err(DL_ERANGE, "merge policy: learner %u cannot join: all %d learner slots are registered", id,
                          p->cfg.max_learners);
        p->slots[i].id = id;
        hash_rebuild(p);
    }
    slot *s = &p->slots[i];
    s->state = SLOT_LIVE;
    s->join_seq = ++p->seq;
    s->n_gaps = s->gap_pos = 0;
    s->med = s->mad = 0;
    s->rep_ns = NONE_NS;
    s->rep_step = s->rep_tokens = 0;
    s->rate = 0;
    s->tps = 0;
    s->joined_ns = now;
    s->pooled_ns = NONE_NS;
    slot_forget_arrivals(p, s);
    for (int f = 0; f < p->P; f++) s->cur_idx[f] = -1, s->ptok[f] = 0;
    p->n_live++;
    refresh(p, now);
    return 0;
}

int dl_policy_learner_alive(dl_policy *p, uint32_t id, int64_t now)
{
    settle(p);
    now = tick(p, now);
    int i = registered(p, id);
    if (i < 0) return i;
    slot *s = &p->slots[i];
    if (s->state == SLOT_DEAD) {
        s->state = SLOT_LIVE;
        p->n_live++;
        slot_forget_arrivals(p, s);
        refresh(p, now);
    }
    return 0;
}

int dl_policy_learner_leave(dl_policy *p, uint32_t id, int64_t now, dl_policy_leave reason)
{
    settle(p);
    assert(reason == DL_POLICY_LEAVE_DEAD || reason == DL_POLICY_LEAVE_BYE);
    now = tick(p, now);
    int i = registered(p, id);
    if (i < 0) return i;
    slot *s = &p->slots[i];
    if (s->state == SLOT_LIVE) p->n_live--;
    s->state = reason == DL_POLICY_LEAVE_BYE ? SLOT_LEFT : SLOT_DEAD;
    s->left_ns = reason == DL_POLICY_LEAVE_BYE ? now : NONE_NS;
    refresh(p, now);
    return 0;
}

int dl_policy_learner_forget(dl_policy *p, uint32_t id)
{
    settle(p);
    int i = find_slot(p, id);
    if (i < 0) return 0;
    slot *s = &p->slots[i];
    if (s->state == SLOT_LIVE) return dl_err(DL_EINVAL, "merge policy: learner %u is live", id);
    if (slot_pooled_anywhere(p, s)) return dl_err(DL_EAGAIN, "merge policy: learner %u has pooled pushes", id);
    s->state = SLOT_FREE;
    s->id = UINT32_MAX; /* never a learner number */
    hash_rebuild(p);
    return 0;
}

int dl_policy_learner_progress(dl_policy *p, uint32_t id, uint64_t step, uint64_t tokens, double steps_per_s,
                               int64_t now)
{
    now = tick(p, now);
    int i = registered(p, id);
    if (i < 0) return i;
    slot *s = &p->slots[i];
    int64_t st = step > (uint64_t)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)step;
    if (s->rep_ns != NONE_NS && st < s->rep_step) { /* counting again from a lower step: a restarted learner */
        for (int f = 0; f < p->P; f++) s->pstep[f] = -1;
        if (s->finishing) s->finishing = 0, refresh(p, now); /* it trains again: K_eff and the waits change */
    }
    s->rep_ns = now;
    s->rep_step = st;
    s->rep_tokens = tokens > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)tokens;
    s->rate = steps_per_s > 0 && steps_per_s < 1e12 ? steps_per_s : 0; /* NaN, inf, <= 0: unknown */
    /* refresh() less the slack, which a report cannot change: this runs on
     * every Heartbeat of every learner, so it is left to settle() */
    p->unsettled = 1;
    p->unsettled_ns = now;
    return 0;
}

int dl_policy_learner_final(dl_policy *p, uint32_t id, int frag, const uint32_t *pending, size_t n_pending,
                            int64_t now)
{
    settle(p);
    now = tick(p, now);
    int i = registered(p, id);
    if (i < 0) return i;
    slot *s = &p->slots[i];
    /* its pushes arrive in order: the latest final push's list is what its flush still owes, and this
     * push's own fragment until its body comes (dl_policy_push): a round closed in between would miss it */
    int changed = !s->finishing;
    size_t k = 0;
    for (int f = 0; f < p->P; f++) {
        while (k < n_pending && pending[k] < (uint32_t)f) k++;
        uint8_t v = f == frag || (k < n_pending && pending[k] == (uint32_t)f);
        changed |= s->fpend[f] != v;
        s->fpend[f] = v;
    }
    s->finishing = 1;
    if (changed) refresh(p, now);
    return 0;
}

int dl_policy_live_count(const dl_policy *p) { return p->n_live; }

dl_policy_member dl_policy_learner_state(const dl_policy *p, uint32_t id)
{
    int i = find_slot(p, id);
    if (i < 0) return DL_POLICY_MEMBER_NONE;
    switch (p->slots[i].state) {
    case SLOT_LIVE: return DL_POLICY_MEMBER_LIVE;
    case SLOT_DEAD: return DL_POLICY_MEMBER_DEAD;
    case SLOT_LEFT: return DL_POLICY_MEMBER_LEFT;
    default: return DL_POLICY_MEMBER_NONE;
    }
}

/* ---------------------------------------------------------------- pushes */

/* The step of a push of f arriving at `now`: the learner's step extrapolated
 * from its latest report to now (just the report when its rate is unknown;
 * dloco's learners send a Heartbeat right before every Push, so the report is
 * the push's step or a little later), snapped down to the latest step at
 * which f was due (the push belongs to that step even when the mailbox sent it
 * a few steps late, or it was held and sent owed). */
static int64_t push_step(const dl_policy *p, const slot *s, int f, int64_t now)
{
    double x = (double)s->rep_step;
    if (s->rate > 0 && now > s->rep_ns) x += floor((double)(now - s->rep_ns) * 1e-9 * s->rate);
    int64_t xi = x >= 4.0e18 ? INT64_MAX / 2 : (int64_t)x;
    return due_at_or_before(p, f, xi);
}

static int reject(dl_policy *p, dl_policy_verdict *out, dl_policy_reason r)
{
    out->decision = DL_POLICY_REJECTED;
    out->reason = r;
    p->st.rejected++;
    return 0;
}

static void grow(dl_policy_contrib **buf, int *cap, int need, int max)
{
    if (need <= *cap) return;
    int n = *cap ? *cap * 2 : 8;
    if (n > max) n = max;
    if (n < need) n = need;
    *buf = dl_xrealloc(*buf, (size_t)n * sizeof **buf);
    *cap = n;
}

int dl_policy_push(dl_policy *p, int f, uint32_t id, uint64_t base_version, int64_t steps, int64_t tokens,
                   int64_t now, uint64_t handle, dl_policy_verdict *out)
{
    settle(p);
    now = tick(p, now);
    memset(out, 0, sizeof *out);
    p->st.pushes++;
    if (f < 0 || f >= p->P) return reject(p, out, DL_POLICY_R_BAD_FRAGMENT);
    int i = find_slot(p, id);
    if (i < 0 || p->slots[i].state == SLOT_LEFT) return reject(p, out, DL_POLICY_R_NOT_MEMBER);
    if (steps <= 0) return reject(p, out, DL_POLICY_R_BAD_STEPS);
    if (tokens <= 0) return reject(p, out, DL_POLICY_R_BAD_TOKENS);
    frag *fr = &p->frags[f];
    if (base_version > fr->version) return reject(p, out, DL_POLICY_R_FUTURE_VERSION);

    slot *s = &p->slots[i];
    s->fpend[f] = 0; /* a finishing learner's push of f has come */
    /* A newer push contains the pooled one's progress only on the same base:
     * on another base (the learner adopted a merge meanwhile, e.g. after its
     * hold timed out) replacing would lose the pooled progress */
    if (s->cur_idx[f] >= 0 && fr->cur[s->cur_idx[f]].base_version != base_version)
        return reject(p, out, DL_POLICY_R_POOLED_OTHER_BASE);
    if (s->cur_idx[f] < 0) grow(&fr->cur, &fr->cap_cur, fr->n_cur + 1, p->cfg.max_learners);

    if (s->state == SLOT_DEAD) { /* a push is proof of life */
        s->state = SLOT_LIVE;
        p->n_live++;
        slot_forget_arrivals(p, s);
    }
    /* The arrival is a timing sample whether or not the push is merged. */
    if (s->last[f] != NONE_NS) slot_add_gap(s, now - s->last[f]);
    s->last[f] = now;
    if (p->cfg.H > 0 && s->rep_ns != NONE_NS) s->pstep[f] = push_step(p, s, f, now);

    uint64_t target = fr->version + (fr->in_flight ? 1 : 0); /* version this push would merge onto */
    out->staleness = (int64_t)(target - base_version);
    if (out->staleness > p->cfg.max_staleness) {
        out->decision = DL_POLICY_DROPPED_STALE;
        out->reason = DL_POLICY_R_STALE;
        out->rebase = 1;
        p->st.dropped_stale++;
        refresh(p, now);
        return 0;
    }

    dl_policy_contrib *c;
    int n_replaced = 0;
    if (s->cur_idx[f] >= 0) {
        c = &fr->cur[s->cur_idx[f]];
        out->replaced = 1;
        out->replaced_handle = c->handle;
        n_replaced = c->n_replaced + 1;
        p->st.replaced++;
    } else {
        if (fr->n_cur == 0) {
            fr->open_seq = ++p->seq;
            fr->opened_ns = now;
            fr->quorum_ns = NONE_NS;
            fr->cap_ns = DL_POLICY_NEVER;
        }
        s->cur_idx[f] = fr->n_cur;
        c = &fr->cur[fr->n_cur++];
    }
    memset(c, 0, sizeof *c);
    c->learner = id;
    c->handle = handle;
    c->arrival_ns = now;
    c->base_version = base_version;
    c->steps = steps;
    c->tokens = tokens;
    c->n_replaced = n_replaced;
    s->ptok[f] = tokens;
    s->tps = (double)tokens / (double)steps;
    s->pooled_ns = now;
    out->decision = DL_POLICY_POOLED;
    out->reason = DL_POLICY_OK;
    p->st.pooled++;
    refresh(p, now);
    return 0;
}

/* ---------------------------------------------------------------- rounds */

/* Expected tokens of a full period of fragment f (policy.h "Share"), over
 * the live learners that contribute (contributes()). A
 * learner's tokens per step come from its latest pooled (validated) push;
 * one without a pooled push counts at its reported tokens / step, but never
 * above the largest pooled rate of the fleet (a Hello may claim any batch up
 * to max_batch, so an idle learner's claims could otherwise shrink every
 * share), else at the mean pooled rate. */
/* A live learner counts in the expected tokens while it contributes: its
 * latest pooled push (or, before its first, its joining) is at most
 * DL_POLICY_CONTRIB_PERIODS of the fleet's push periods old. An id that
 * registers and heartbeats but never pushes stops shrinking the others'
 * shares after that. While the fleet's period is unknown every live learner
 * counts. */
static int contributes(const dl_policy *p, const slot *s)
{
    int64_t period = p->fleet_med;
    if (period <= 0 && p->cfg.H > 0 && p->fleet_step > 0) period = p->fleet_step * p->cfg.H;
    if (period <= 0) return 1;
    int64_t since = s->pooled_ns != NONE_NS ? s->pooled_ns : s->joined_ns;
    return p->now - since <= DL_POLICY_CONTRIB_PERIODS * period;
}

/* 1 when s counts in a share's expected tokens: live and contributing (above), or said Bye less than
 * a push period ago (H x the fleet's step time, else the fleet's push
 * interval). The learners of a run that ends leave one after the other,
 * each after its final flush: counting only those still live would give
 * each later flush a larger share, the last one a whole outer step for one
 * learner's delta. */
static int in_fleet(const dl_policy *p, const slot *s)
{
    if (s->state == SLOT_LIVE) return contributes(p, s);
    if (s->state != SLOT_LEFT || s->left_ns == NONE_NS) return 0;
    int64_t period = p->cfg.H > 0 && p->fleet_step > 0 ? (int64_t)p->cfg.H * p->fleet_step : p->fleet_med;
    return period > 0 && p->now - s->left_ns < period;
}

static double expected_tokens(const dl_policy *p, int f)
{
    double sum = 0, known = 0, cap = 0;
    int n_known = 0, n_unknown = 0;
    for (int i = 0; i < p->n_slots; i++) {
        const slot *s = &p->slots[i];
        if (in_fleet(p, s) && s->tps > cap) cap = s->tps;
    }
    for (int i = 0; i < p->n_slots; i++) {
        const slot *s = &p->slots[i];
        if (!in_fleet(p, s)) continue;
        if (p->cfg.H <= 0) {
            sum += (double)s->ptok[f];
            continue;
        }
        double tps = s->tps;
        if (tps <= 0 && s->rep_ns != NONE_NS && s->rep_step > 0 && s->rep_tokens > 0) {
            tps = (double)s->rep_tokens / (double)s->rep_step;
            if (cap > 0 && tps > cap) tps = cap;
        }
        if (tps > 0)
            known += tps, n_known++;
        else
            n_unknown++;
    }
    if (p->cfg.H <= 0) return sum;
    if (n_known) known += known / n_known * n_unknown;
    return known * (double)p->cfg.H;
}

int64_t dl_policy_next_deadline(const dl_policy *p)
{
    settle(p);
    int64_t d = DL_POLICY_NEVER;
    for (int f = 0; f < p->P; f++)
        if (p->frags[f].deadline < d) d = p->frags[f].deadline;
    return d;
}

int dl_policy_poll(dl_policy *p, int64_t now, dl_policy_round *out)
{
    settle(p);
    now = tick(p, now);
    int best = -1;
    for (int f = 0; f < p->P; f++) {
        const frag *fr = &p->frags[f];
        if (fr->in_flight || fr->n_cur == 0 || fr->deadline > now) continue;
        if (best < 0 || fr->deadline < p->frags[best].deadline) best = f;
    }
    if (best < 0) return 0;

    frag *fr = &p->frags[best];
    double wsum = 0, scaled = 0;
    for (int k = 0; k < fr->n_cur; k++) {
        dl_policy_contrib *c = &fr->cur[k];
        assert(c->base_version <= fr->version);
        c->staleness = (int64_t)(fr->version - c->base_version);
        c->sfactor = dl_policy_sfactor(&p->cfg, c->staleness);
        c->weight = dl_policy_weight(&p->cfg, c->steps, c->tokens, c->staleness);
        c->decision = DL_POLICY_MERGED;
        c->reason = DL_POLICY_OK;
        int i = find_slot(p, c->learner);
        assert(i >= 0); /* slots with pooled contributions are never reused */
        c->learner_dead = p->slots[i].state != SLOT_LIVE;
        p->slots[i].cur_idx[best] = -1;
        wsum += c->weight;
        scaled += (double)c->tokens * c->sfactor;
    }
    double expect = expected_tokens(p, best);
    /* Hand the open round out; its buffer becomes the flight buffer. */
    dl_policy_contrib *tb = fr->flight;
    int tc = fr->cap_flight;
    fr->flight = fr->cur, fr->cap_flight = fr->cap_cur, fr->n_flight = fr->n_cur;
    fr->cur = tb, fr->cap_cur = tc, fr->n_cur = 0;
    fr->in_flight = 1;

    int dec = p->cfg.kind == DL_POLICY_DECOUPLED;
    memset(out, 0, sizeof *out);
    out->fragment = best;
    out->version = fr->version;
    out->n = fr->n_flight;
    out->contribs = fr->flight;
    out->weight_sum = wsum;
    out->reason = fr->reason;
    out->opened_ns = fr->opened_ns;
    out->deadline_ns = fr->deadline;
    out->quorum_ns = dec ? fr->quorum_ns : fr->deadline;
    out->cap_ns = dec ? fr->cap_ns : DL_POLICY_NEVER;
    out->closed_ns = now;
    out->n_missing = fr->n_missing;
    out->scaled_tokens = scaled;
    out->expected_tokens = expect;
    out->share = expect > 0 && scaled < expect ? scaled / expect : 1.0;

    p->st.rounds++;
    p->st.merged += (uint64_t)fr->n_flight;
    p->st.close[fr->reason]++;
    fr->deadline = DL_POLICY_NEVER;
    fr->reason = DL_POLICY_CLOSE_NONE;
    fr->quorum_ns = NONE_NS;
    fr->cap_ns = DL_POLICY_NEVER;
    return 1;
}

void dl_policy_committed(dl_policy *p, int f, uint64_t new_version, int64_t now)
{
    settle(p);
    assert(f >= 0 && f < p->P);
    frag *fr = &p->frags[f];
    assert(fr->in_flight && "committed() without a round handed out by poll()");
    assert(new_version == fr->version + 1 && "versions advance by exactly one per merge");
    now = tick(p, now);
    fr->version = new_version;
    fr->in_flight = 0;
    fr->n_flight = 0;
    refresh(p, now);
}

void dl_policy_abandon(dl_policy *p, int f, int64_t now)
{
    settle(p);
    assert(f >= 0 && f < p->P);
    frag *fr = &p->frags[f];
    assert(fr->in_flight && "abandon() without a round handed out by poll()");
    now = tick(p, now);
    fr->in_flight = 0;
    fr->n_flight = 0;
    refresh(p, now);
}

/* ---------------------------------------------------------------- introspection */

int dl_policy_prediction(const dl_policy *p, uint32_t id, int f, int64_t *point_ns, int64_t *margin_ns)
{
    assert(f >= 0 && f < p->P);
    int i = find_slot(p, id);
    if (i < 0 || p->slots[i].state == SLOT_LEFT) return DL_ENOTFOUND;
    return predict(p, &p->slots[i], f, point_ns, margin_ns) ? 0 : DL_ENOTFOUND;
}

void dl_policy_get_stats(const dl_policy *p, dl_policy_stats *out)
{
    settle(p);
    *out = p->st;
}

void dl_policy_round_format(const dl_policy_round *r, char *buf, size_t cap)
{
    if (!cap) return;
    size_t o = 0;
    int n = snprintf(buf, cap, "frag %d v%llu->%llu close=%s n=%d missing=%d wsum=%.6g share=%.4g [", r->fragment,
                     (unsigned long long)r->version, (unsigned long long)r->version + 1, dl_policy_close_name(r->reason),
                     r->n, r->n_missing, r->weight_sum, r->share);
    o = n < 0 ? 0 : (size_t)n;
    for (int k = 0; k < r->n && o < cap; k++) {
        const dl_policy_contrib *c = &r->contribs[k];
        n = snprintf(buf + o, cap - o, "%s%u:s%lld:w%.6g%s", k ? " " : "", c->learner, (long long)c->staleness,
                     c->weight, c->learner_dead ? ":dead" : "");
        o += n < 0 ? 0 : (size_t)n;
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
}
