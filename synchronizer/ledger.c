/* Push ledger: per learner account and per (learner, fragment) carried
 * tokens; every fate moves tokens between states, counted once. */
#include "synchronizer/ledger.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/event.h"

typedef struct {
    uint64_t carried; /* tokens of its last push of this fragment refused without rebase, 0 = none */
} frag_acct;

typedef struct {
    int open;              /* the account is open (the learner said hello and has not ended) */
    uint64_t step;         /* last reported inner step */
    uint64_t processed;    /* P x reported tokens (since the base, for a learner met mid-life) */
    int midlife;           /* opened by a Hello with step > 0: the learner trained before this
                            * synchronizer saw it (it restarted); its first report is the base */
    int reported;          /* the base was taken */
    uint64_t base_tokens, base_discarded; /* its reports then: not this account's */
    uint64_t discarded;    /* reported discarded fragment-tokens (already moved to DISCARDED) */
    uint64_t settled;      /* tokens of this account in persisted states */
    uint64_t pooled, carried;
    uint64_t pooled_before; /* of pooled: pushes of an earlier process of this id, still to merge */
    uint64_t inherited;     /* processed fragment-tokens moved in from the killed process's account: the
                             * unpushed progress this restarted process carries (Hello.carried_tokens) */
} account;

struct dl_ledger {
    int P, max;
    int settles;           /* fragments whose pushes come here: P, or a shard's own */
    account *acct;         /* [max] */
    frag_acct *fa;         /* [max * P] */
    dl_store_ledger pending;
    dl_ledger_totals tot;  /* tot.state includes pending */
};

int dl_ledger_open(int max_learners, int P, dl_ledger **out)
{
    assert(out && max_learners >= 1 && P >= 1);
    dl_ledger *l = dl_xcalloc(1, sizeof *l);
    l->P = P;
    l->settles = P;
    l->max = max_learners;
    l->acct = dl_xcalloc((size_t)max_learners, sizeof *l->acct);
    l->fa = dl_xcalloc((size_t)max_learners * (size_t)P, sizeof *l->fa);
    *out = l;
    return 0;
}

void dl_ledger_close(dl_ledger **lp)
{
    if (!lp || !*lp) return;
    free((*lp)->acct);
    free((*lp)->fa);
    free(*lp);
    *lp = NULL;
}

void dl_ledger_set_fragments(dl_ledger *l, int n)
{
    assert(n >= 1 && n <= l->P && l->tot.processed == 0);
    l->settles = n;
}

static account *acct(dl_ledger *l, int learner)
{
    assert(learner >= 0 && learner < l->max);
    return &l->acct[learner];
}

static frag_acct *fa(dl_ledger *l, int learner, int fragment)
{
    assert(learner >= 0 && learner < l->max && fragment >= 0 && fragment < l->P);
    return &l->fa[(size_t)learner * (size_t)l->P + (size_t)fragment];
}

/* Move tokens of `a` into persisted state `state`. */
static void settle(dl_ledger *l, account *a, int state, uint64_t tokens)
{
    if (!tokens) return;
    l->pending.tokens[state] += tokens;
    l->tot.state[state] += tokens;
    a->settled += tokens;
}

/* A new process of the id: pushes of the earlier one may still sit in the
 * pool; they settle as before but are not this account's. */
static void open_account(account *a)
{
    uint64_t pooled = a->pooled;
    memset(a, 0, sizeof *a);
    a->open = 1;
    a->pooled = a->pooled_before = pooled;
}

/* Carried tokens of (learner, fragment) leave CARRIED without a state: they
 * are in the push that arrives now, in the learner's discarded report, or
 * still unpushed. */
static void uncarry(dl_ledger *l, account *a, frag_acct *f)
{
    a->carried -= f->carried;
    l->tot.carried -= f->carried;
    f->carried = 0;
}

/* End the account: unpushed (carried included) -> `unpushed_state`, but
 * for up to `move` of it, which leaves this account for the next process of
 * the id (returned). Pooled pushes stay pooled (their merge settles them). */
static uint64_t end_account(dl_ledger *l, int learner, int unpushed_state, uint64_t move)
{
    account *a = acct(l, learner);
    if (!a->open) return 0;
    for (int p = 0; p < l->P; p++) uncarry(l, a, fa(l, learner, p));
    uint64_t accounted = a->settled + (a->pooled - a->pooled_before) + a->carried;
    uint64_t moved = 0;
    if (a->processed > accounted) {
        moved = a->processed - accounted < move ? a->processed - accounted : move;
        a->processed -= moved;
        l->tot.processed -= moved;
    }
    if (a->processed > accounted) {
        settle(l, a, unpushed_state, a->processed - accounted);
    } else if (accounted > a->processed && a->midlife) {
        /* progress made before this synchronizer saw the learner (e.g. the
         * pushes a crashed predecessor pooled, made again): not processed here */
        l->tot.carried_in += accounted - a->processed;
    } else if (accounted > a->processed) {
        l->tot.overclaim += accounted - a->processed;
        dl_event("ledger_overclaim", "learner=%d processed=%llu settled=%llu pooled=%llu carried=%llu", learner,
                 (unsigned long long)a->processed, (unsigned long long)a->settled,
                 (unsigned long long)(a->pooled - a->pooled_before), (unsigned long long)a->carried);
    }
    a->open = 0;
    return moved;
}

static void report(dl_ledger *l, account *a, uint64_t step, uint64_t tokens, uint64_t discarded)
{
    if (!a->reported) {
        a->reported = 1;
        if (a->midlife) a->base_tokens = tokens, a->base_discarded = discarded;
    }
    tokens = tokens > a->base_tokens ? tokens - a->base_tokens : 0;
    discarded = discarded > a->base_discarded ? discarded - a->base_discarded : 0;
    uint64_t processed = a->inherited + tokens * (uint64_t)l->settles;
    if (processed > a->processed) {
        l->tot.processed += processed - a->processed;
        a->processed = processed;
    }
    if (discarded > a->discarded) {
        settle(l, a, DL_LEDGER_DISCARDED, discarded - a->discarded);
        a->discarded = discarded;
    }
    if (step > a->step) a->step = step;
}

void dl_ledger_hello(dl_ledger *l, int learner, uint64_t step, int new_process, uint64_t carried,
                     uint64_t step_tokens)
{
    account *a = acct(l, learner);
    uint64_t moved = 0, late = 0, late_in = 0;
    int ended = a->open && (new_process || step < a->step || (step == 0 && a->processed > 0));
    if (ended) {
        uint64_t lost0 = l->tot.state[DL_LEDGER_LOST];
        int was_midlife = a->midlife;
        uint64_t unreported = step > a->step ? step - a->step : 0;
        moved = end_account(l, learner, DL_LEDGER_LOST, carried); /* a new process under the same id */
        if (carried > moved) {
            /* trained by the old process and never reported: counted now (bounded by its steps since its
             * last report), or carried in when the old account did not see the process from its start */
            uint64_t rest = carried - moved;
            uint64_t cap = step_tokens && unreported > UINT64_MAX / step_tokens ? UINT64_MAX : unreported * step_tokens;
            if (was_midlife) late_in = rest;
            else late = rest < cap ? rest : cap;
        }
        if (carried)
            dl_event("ledger_carried", "learner=%d carried=%llu moved=%llu lost=%llu late=%llu carried_in=%llu",
                     learner, (unsigned long long)carried, (unsigned long long)moved,
                     (unsigned long long)(l->tot.state[DL_LEDGER_LOST] - lost0), (unsigned long long)late,
                     (unsigned long long)late_in);
    }
    if (!a->open) {
        open_account(a);
        /* met mid-life only when no account of the id was open (this synchronizer restarted under a live
         * learner); a new process of a known id reports its own tokens from its start */
        a->midlife = step > 0 && !ended;
        a->inherited = a->processed = moved + late + late_in;
        l->tot.processed += moved + late;
        l->tot.carried_in += late_in;
    }
    if (step > a->step) a->step = step;
}

void dl_ledger_progress(dl_ledger *l, int learner, uint64_t step, uint64_t tokens, uint64_t discarded)
{
    account *a = acct(l, learner);
    if (!a->open) open_account(a);
    report(l, a, step, tokens, discarded);
}

void dl_ledger_bye(dl_ledger *l, int learner, uint64_t step, uint64_t tokens, uint64_t discarded)
{
    dl_ledger_progress(l, learner, step, tokens, discarded);
    end_account(l, learner, DL_LEDGER_LOST, 0);
}

void dl_ledger_forget(dl_ledger *l, int learner)
{
    end_account(l, learner, DL_LEDGER_LOST, 0);
    account *a = acct(l, learner);
    assert(a->pooled == 0 && a->carried == 0);
    memset(a, 0, sizeof *a);
}

void dl_ledger_arrived(dl_ledger *l, int learner, int fragment, uint64_t base_version, uint64_t tokens)
{
    (void)base_version;
    (void)tokens;
    /* the learner kept the carried progress: this push reports it again
     * (cumulative counters, on whatever base it adopted since), or it threw
     * it away later and reports it discarded */
    uncarry(l, acct(l, learner), fa(l, learner, fragment));
}

void dl_ledger_pooled(dl_ledger *l, int learner, int fragment, uint64_t tokens, uint64_t replaced_tokens)
{
    (void)fragment;
    account *a = acct(l, learner);
    assert(replaced_tokens <= a->pooled);
    a->pooled -= replaced_tokens;
    l->tot.pooled -= replaced_tokens;
    a->pooled += tokens;
    l->tot.pooled += tokens;
}

void dl_ledger_dropped_stale(dl_ledger *l, int learner, int fragment, uint64_t tokens)
{
    (void)fragment;
    settle(l, acct(l, learner), DL_LEDGER_DROPPED_STALE, tokens);
}

static void carry(dl_ledger *l, int learner, int fragment, uint64_t tokens)
{
    account *a = acct(l, learner);
    if (!a->open) {
        settle(l, a, DL_LEDGER_LOST, tokens); /* nobody left to carry it on */
        return;
    }
    frag_acct *f = fa(l, learner, fragment);
    uncarry(l, a, f); /* an earlier carried push's tokens are in this one (cumulative) or discarded */
    a->carried += tokens;
    l->tot.carried += tokens;
    f->carried = tokens;
}

void dl_ledger_refused(dl_ledger *l, int learner, int fragment, uint64_t base_version, uint64_t tokens)
{
    (void)base_version;
    carry(l, learner, fragment, tokens);
}

void dl_ledger_refused_rebase(dl_ledger *l, int learner, int fragment, uint64_t tokens)
{
    (void)fragment;
    settle(l, acct(l, learner), DL_LEDGER_REJECTED, tokens);
}

/* Take a push out of the pool; returns how much of it belonged to an
 * earlier process of the id (those leave first: they are older). */
static uint64_t unpool(dl_ledger *l, account *a, uint64_t tokens)
{
    assert(tokens <= a->pooled && tokens <= l->tot.pooled);
    a->pooled -= tokens;
    l->tot.pooled -= tokens;
    uint64_t before = tokens < a->pooled_before ? tokens : a->pooled_before;
    a->pooled_before -= before;
    return before;
}

void dl_ledger_merged(dl_ledger *l, int learner, int fragment, uint64_t tokens)
{
    (void)fragment;
    account *a = acct(l, learner);
    uint64_t before = unpool(l, a, tokens);
    /* persisted by the merge commit itself, not handed out by take */
    l->tot.state[DL_LEDGER_APPLIED] += tokens;
    a->settled += tokens - before;
}

void dl_ledger_failed(dl_ledger *l, int learner, int fragment, uint64_t base_version, uint64_t tokens)
{
    account *a = acct(l, learner);
    uint64_t before = unpool(l, a, tokens);
    if (before) { /* its process is gone: nobody carries it on */
        l->pending.tokens[DL_LEDGER_LOST] += before;
        l->tot.state[DL_LEDGER_LOST] += before;
    }
    (void)base_version;
    if (tokens > before) carry(l, learner, fragment, tokens - before);
}

void dl_ledger_shutdown(dl_ledger *l, int (*live)(void *ctx, int learner), void *ctx)
{
    for (int i = 0; i < l->max; i++) {
        account *a = &l->acct[i];
        if (a->pooled) {
            /* all of it OUTSTANDING; an earlier process's part is not this account's */
            settle(l, a, DL_LEDGER_OUTSTANDING, a->pooled);
            a->settled -= a->pooled_before;
            l->tot.pooled -= a->pooled;
            a->pooled = a->pooled_before = 0;
        }
        if (a->open) end_account(l, i, live(ctx, i) ? DL_LEDGER_OUTSTANDING : DL_LEDGER_LOST, 0);
    }
}

int dl_ledger_take(dl_ledger *l, dl_store_ledger *delta)
{
    *delta = l->pending;
    memset(&l->pending, 0, sizeof l->pending);
    for (int i = 0; i < DL_LEDGER_NSTATES; i++)
        if (delta->tokens[i]) return 1;
    return 0;
}

void dl_ledger_untake(dl_ledger *l, const dl_store_ledger *delta)
{
    for (int i = 0; i < DL_LEDGER_NSTATES; i++) l->pending.tokens[i] += delta->tokens[i];
}

void dl_ledger_get_totals(const dl_ledger *l, dl_ledger_totals *out) { *out = l->tot; }
