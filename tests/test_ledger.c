/* The push ledger and round assembly (pure modules): every fate moves
 * tokens between states exactly once, the per-learner balance holds through
 * replacements, refusals, failed merges, deaths, byes and shutdown; a round's
 * record, weights and share. */
#include "synchronizer/ledger.h"
#include "synchronizer/round.h"

#include <string.h>

#include "tests/check.h"

enum { P = 3, A = 0, B = 1, C = 2 };

static uint64_t sum_states(const dl_ledger_totals *t)
{
    uint64_t s = 0;
    for (int i = 0; i < DL_LEDGER_NSTATES; i++) s += t->state[i];
    return s;
}

static int live_a_only(void *ctx, int learner)
{
    (void)ctx;
    return learner == A;
}

static void test_ledger(void)
{
    dl_ledger *l = NULL;
    dl_ledger_open(8, P, &l);
    dl_ledger_totals t;
    dl_store_ledger d;

    /* A: pooled, replaced in the open round by its cumulative newer push, merged */
    dl_ledger_hello(l, A, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, A, 10, 100, 0); /* 100 tokens -> 300 fragment-tokens */
    dl_ledger_arrived(l, A, 0, 0, 40);
    dl_ledger_pooled(l, A, 0, 40, 0);
    dl_ledger_arrived(l, A, 0, 0, 70);
    dl_ledger_pooled(l, A, 0, 70, 40); /* carries the 40 on */
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.pooled, 70);
    dl_ledger_merged(l, A, 0, 70);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.pooled, 0);
    CHECK_EQ(t.state[DL_LEDGER_APPLIED], 70);
    CHECK(!dl_ledger_take(l, &d), "applied tokens are persisted by the merge commit, not handed out by take");

    /* A, fragment 1: refused (carried), then carried on by its next push on the same base */
    dl_ledger_arrived(l, A, 1, 2, 30);
    dl_ledger_refused(l, A, 1, 2, 30);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.carried, 30);
    dl_ledger_arrived(l, A, 1, 2, 50);
    dl_ledger_pooled(l, A, 1, 50, 0);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.carried, 0);
    CHECK_EQ(t.state[DL_LEDGER_REJECTED], 0);
    /* ... its round fails: carried again; the learner keeps the progress
     * (keep mode, learner/node.h "Push fates"), so its next push, on the base
     * it adopted since, carries the 50 on: that push's 70 hold them */
    dl_ledger_failed(l, A, 1, 2, 50);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.pooled, 0);
    CHECK_EQ(t.carried, 50);
    dl_ledger_arrived(l, A, 1, 3, 70);
    dl_ledger_dropped_stale(l, A, 1, 70);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.carried, 0);
    CHECK_EQ(t.state[DL_LEDGER_REJECTED], 0);
    CHECK_EQ(t.state[DL_LEDGER_DROPPED_STALE], 70);
    /* refused with rebase: the learner throws it away, REJECTED at once */
    dl_ledger_arrived(l, A, 1, 4, 50);
    dl_ledger_refused_rebase(l, A, 1, 50);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.carried, 0);
    CHECK_EQ(t.state[DL_LEDGER_REJECTED], 50);
    CHECK(dl_ledger_take(l, &d), "pending changes are handed out");
    CHECK_EQ(d.tokens[DL_LEDGER_REJECTED], 50);
    CHECK_EQ(d.tokens[DL_LEDGER_DROPPED_STALE], 70);
    CHECK_EQ(d.tokens[DL_LEDGER_APPLIED], 0);
    CHECK(!dl_ledger_take(l, &d), "take zeroes the pending changes");
    dl_ledger_untake(l, &(dl_store_ledger){{[DL_LEDGER_REJECTED] = 50}});
    CHECK(dl_ledger_take(l, &d) && d.tokens[DL_LEDGER_REJECTED] == 50, "untake gives a failed write back");

    /* A reports discarded tokens (an adopt overwrite) */
    dl_ledger_progress(l, A, 12, 120, 25);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_DISCARDED], 25);
    CHECK_EQ(t.processed, 360);

    /* B: pushes, dies with a push pooled; a later Hello with step 0 is a new
     * process: unpushed tokens of the old one are LOST, its pooled push still merges */
    dl_ledger_hello(l, B, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, B, 5, 50, 0); /* 150 fragment-tokens */
    dl_ledger_arrived(l, B, 2, 0, 60);
    dl_ledger_pooled(l, B, 2, 60, 0);
    dl_ledger_hello(l, B, 0, 0, 0, 10 * P);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 90);
    dl_ledger_merged(l, B, 2, 60);
    dl_ledger_progress(l, B, 1, 10, 0); /* the new process: 30 fragment-tokens */
    /* C (adopt overwrite): a push refused without rebase comes back, an adopt
     * then throws its 20 away (reported discarded), bye with 10 unpushed: the
     * 20 are counted once, DISCARDED, never REJECTED as well */
    dl_ledger_hello(l, C, 0, 0, 0, 10 * P);
    dl_ledger_arrived(l, C, 0, 0, 20);
    dl_ledger_refused(l, C, 0, 0, 20);
    dl_ledger_bye(l, C, 3, 10, 20); /* 30 fragment-tokens */
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_REJECTED], 50);
    CHECK_EQ(t.state[DL_LEDGER_DISCARDED], 45);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 100);
    CHECK_EQ(t.overclaim, 0);
    /* a failed merge of a learner that has left: LOST, nobody carries it on */
    dl_ledger_arrived(l, C, 1, 0, 5);
    dl_ledger_pooled(l, C, 1, 5, 0);
    dl_ledger_failed(l, C, 1, 0, 5);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 105);

    /* D (learner 3) is met mid-life, as after a synchronizer restart: counted
     * from its first report on; progress it pushes from before is carried_in */
    dl_ledger_hello(l, 3, 50, 0, 0, 10 * P);
    dl_ledger_progress(l, 3, 50, 500, 7); /* the base: 500 tokens, 7 discarded before we met it */
    dl_ledger_arrived(l, 3, 0, 9, 80);
    dl_ledger_pooled(l, 3, 0, 80, 0);
    dl_ledger_merged(l, 3, 0, 80);
    dl_ledger_bye(l, 3, 70, 520, 7); /* 20 tokens since: 60 fragment-tokens */
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.carried_in, 20);
    CHECK_EQ(t.overclaim, 0);
    CHECK_EQ(t.state[DL_LEDGER_DISCARDED], 45);
    uint64_t lost_before = t.state[DL_LEDGER_LOST];
    /* E (learner 4): a new process while its predecessor's push is still
     * pooled; at shutdown that push is OUTSTANDING and not the new account's */
    dl_ledger_hello(l, 4, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, 4, 3, 10, 0);
    dl_ledger_arrived(l, 4, 1, 0, 30);
    dl_ledger_pooled(l, 4, 1, 30, 0);
    dl_ledger_hello(l, 4, 0, 0, 0, 10 * P); /* restarted: the 30 processed, all pooled: nothing lost */
    dl_ledger_progress(l, 4, 1, 4, 0); /* the new process: 12 fragment-tokens */
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_LOST], lost_before);

    /* shutdown: A is live (its unpushed tokens OUTSTANDING, with a pooled push),
     * B (new process) is dead: LOST */
    dl_ledger_arrived(l, A, 2, 0, 7);
    dl_ledger_pooled(l, A, 2, 7, 0);
    dl_ledger_shutdown(l, live_a_only, NULL);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.pooled, 0);
    CHECK_EQ(t.carried, 0);
    /* A: 360 processed = 70 applied + 50 rejected + 70 dropped + 25 discarded + 7 pooled + 138 unpushed;
     * E's predecessor's pooled 30 */
    CHECK_EQ(t.state[DL_LEDGER_OUTSTANDING], 7 + 138 + 30);
    /* B's new process (30) and E's new one (12, dead at shutdown) */
    CHECK_EQ(t.state[DL_LEDGER_LOST], lost_before + 30 + 12);
    CHECK_EQ(lost_before, 105);
    /* every processed fragment-token in exactly one state; C pushed 5 after
     * its bye, D 20 from before we met it */
    CHECK_EQ(t.overclaim, 0);
    CHECK_EQ(sum_states(&t), t.processed + 5 + 20);
    printf("ok: ledger: processed %llu fragment-tokens, states sum %llu (C pushed 5 after its bye, D 20 from before we met it)\n",
           (unsigned long long)t.processed, (unsigned long long)sum_states(&t));
    dl_ledger_close(&l);
    dl_ledger_close(&l);
    CHECK(l == NULL, "close is safe twice");
}

static const char *ids[] = {"alpha", "beta", "gamma"};
static const char *id_of(void *ctx, uint32_t i)
{
    (void)ctx;
    return ids[i];
}

static void test_round(void)
{
    dl_policy_contrib cs[2] = {
        {.learner = 0, .handle = 7, .base_version = 4, .steps = 4, .tokens = 64, .staleness = 0, .weight = 3},
        {.learner = 2, .handle = 9, .base_version = 3, .steps = 4, .tokens = 32, .staleness = 1, .weight = 1,
         .learner_dead = 1},
    };
    dl_policy_round r = {.fragment = 1, .version = 4, .n = 2, .contribs = cs, .weight_sum = 4, .share = 0.5};
    dl_merge_contrib aside = {.learner_id = "beta", .base_version = 0, .tokens = 16,
                              .decision = DL_MERGE_DROPPED_STALE};
    dl_round_in in = {.epoch = 5, .staleness_fn = "poly", .learner_id = id_of,
                      .asides = &aside, .n_asides = 1};
    dl_round_out o;
    dl_round_assemble(&r, &in, &o);
    CHECK_EQ(o.rec.n_contrib, 3);
    CHECK_STR(o.rec.contrib[0].learner_id, "alpha");
    CHECK_STR(o.rec.contrib[1].learner_id, "gamma");
    CHECK_STR(o.rec.contrib[1].reason, "merged (learner dead)");
    CHECK_NEAR(o.rec.contrib[0].weight, 0.75, 1e-15);
    CHECK_NEAR(o.rec.contrib[1].weight, 0.25, 1e-15);
    CHECK_EQ(o.rec.contrib[2].decision, DL_MERGE_DROPPED_STALE);
    CHECK_EQ(o.rec.epoch, 5);
    CHECK_STR(o.rec.staleness_fn, "poly");
    CHECK_NEAR(o.share, 0.5, 1e-15);
    CHECK_EQ(o.applied_tokens, 96);
    dl_round_out_free(&o);
    r.share = 1.0; /* the policy's share, as it is */
    dl_round_assemble(&r, &in, &o);
    CHECK_NEAR(o.share, 1.0, 0);
    dl_round_out_free(&o);
    dl_round_out_free(&o);
    printf("ok: round: record with normalised weights, dead-learner reason, asides after the merged; the policy's share\n");
}

/* A shard owning 2 of 5 fragments settles only their pushes: a learner's
 * 100 reported tokens are 200 processed fragment-tokens here, and they
 * balance with what it pushed and discarded of those two. */
static void test_shard(void)
{
    dl_ledger *l = NULL;
    dl_ledger_open(4, 5, &l);
    dl_ledger_set_fragments(l, 2);
    dl_ledger_hello(l, A, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, A, 10, 100, 0);
    dl_ledger_arrived(l, A, 1, 0, 60);
    dl_ledger_pooled(l, A, 1, 60, 0);
    dl_ledger_merged(l, A, 1, 60);
    dl_ledger_arrived(l, A, 3, 0, 90);
    dl_ledger_pooled(l, A, 3, 90, 0);
    dl_ledger_merged(l, A, 3, 90);
    dl_ledger_bye(l, A, 10, 100, 30); /* 30 of the 200 thrown away by adopts: 20 never pushed */
    dl_ledger_totals t;
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.processed, 200);
    CHECK_EQ(t.state[DL_LEDGER_APPLIED], 150);
    CHECK_EQ(t.state[DL_LEDGER_DISCARDED], 30);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 20);
    CHECK_EQ(sum_states(&t), t.processed);
    CHECK_EQ(t.overclaim, 0);
    dl_ledger_close(&l);
    printf("ok: ledger of a shard: processed = tokens x the fragments it owns, and it balances\n");
}

/* A learner killed and restarted from its saved state: the old process's
 * unpushed progress that the new one carries (Hello.carried_tokens) moves
 * to the new account instead of LOST, so its push of it is counted once
 * (no overclaim, no carried_in); the rest of the old unpushed is LOST. A
 * claim larger than the old account's unpushed moves only that much. */
static void test_carried(void)
{
    dl_ledger *l = NULL;
    dl_ledger_open(4, P, &l);
    dl_ledger_hello(l, A, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, A, 10, 100, 0); /* 300 fragment-tokens */
    dl_ledger_arrived(l, A, 0, 0, 100);
    dl_ledger_pooled(l, A, 0, 100, 0);
    dl_ledger_merged(l, A, 0, 100); /* 200 unpushed at the kill */
    /* restarted at its saved step 6 (another process, an earlier step), carrying 120 of them */
    dl_ledger_hello(l, A, 6, 1, 120, 10 * P);
    dl_ledger_totals t;
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 80);
    CHECK_EQ(t.processed, 300);
    dl_ledger_progress(l, A, 8, 20, 0); /* its own tokens since its start: 2 steps, 60 fragment-tokens */
    dl_ledger_arrived(l, A, 1, 0, 140); /* the carried 120 of fragments 1 and 2, and 20 new */
    dl_ledger_pooled(l, A, 1, 140, 0);
    dl_ledger_merged(l, A, 1, 140);
    dl_ledger_bye(l, A, 8, 20, 0);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.overclaim, 0);
    CHECK_EQ(t.carried_in, 0);
    CHECK_EQ(t.processed, 300 + 60);
    CHECK_EQ(t.state[DL_LEDGER_APPLIED], 240);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 80 + 40);
    CHECK_EQ(sum_states(&t), t.processed);
    /* B claims more than its predecessor left unpushed: only that moves */
    dl_ledger_hello(l, B, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, B, 4, 40, 0);
    dl_ledger_hello(l, B, 4, 1, 1000, 10 * P);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 120);
    CHECK_EQ(t.processed, 360 + 120);
    /* without a new process (a reconnect of the same one) nothing moves */
    dl_ledger_progress(l, B, 5, 10, 0);
    dl_ledger_hello(l, B, 5, 0, 1000, 10 * P);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 120);
    CHECK_EQ(t.processed, 480 + 30);
    dl_ledger_close(&l);
    printf("ok: ledger: a restarted learner's carried progress moves to its new account (LOST only the rest)\n");
}

/* Carried progress the old process never reported (goodput.sh's far
 * learners: trained through a partition, killed, restarted; their Hellos'
 * claims were 1.27 M fragment-tokens where 0.15 M had been reported, and the
 * pushes of the rest overclaimed): counted processed at the Hello, bounded by
 * the steps since the last report x step_tokens; from an account met
 * mid-life (a synchronizer restarted under the old process), carried in. */
static void test_carried_unreported(void)
{
    dl_ledger *l = NULL;
    dl_ledger_totals t;
    dl_ledger_open(4, P, &l);
    /* A reported step 4 (120 fragment-tokens), trained on to its save at step 10, was killed */
    dl_ledger_hello(l, A, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, A, 4, 40, 0);
    dl_ledger_hello(l, A, 10, 1, 300, 10 * P); /* 6 unreported steps hold up to 180 */
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.processed, 300);
    CHECK_EQ(t.state[DL_LEDGER_LOST], 0);
    dl_ledger_progress(l, A, 11, 10, 0); /* 1 step of its own: 30 */
    dl_ledger_arrived(l, A, 0, 0, 330);
    dl_ledger_pooled(l, A, 0, 330, 0);
    dl_ledger_merged(l, A, 0, 330);
    dl_ledger_bye(l, A, 11, 10, 0);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.overclaim, 0);
    CHECK_EQ(t.carried_in, 0);
    CHECK_EQ(t.processed, 330);
    CHECK_EQ(sum_states(&t), t.processed);
    /* B claims more than 2 unreported steps can hold: 120 moved, 60 counted, the rest overclaims when pushed */
    dl_ledger_hello(l, B, 0, 0, 0, 10 * P);
    dl_ledger_progress(l, B, 4, 40, 0);
    dl_ledger_hello(l, B, 6, 1, 1000, 10 * P);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.processed, 330 + 180);
    /* a step far in the future does not overflow the bound */
    dl_ledger_hello(l, B, UINT64_MAX, 1, 500, UINT64_MAX / 2); /* the 180 move, 320 more count */
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.processed, 330 + 180 + 320);
    /* C met mid-life (this synchronizer restarted under it): its claim beyond what it reported here is carried in */
    dl_ledger_hello(l, C, 50, 0, 0, 10 * P);
    dl_ledger_progress(l, C, 52, 500, 0); /* the base */
    dl_ledger_progress(l, C, 53, 510, 0); /* 30 processed here */
    uint64_t p0 = t.processed;
    dl_ledger_hello(l, C, 51, 1, 90, 10 * P);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.processed, p0 + 30);
    CHECK_EQ(t.carried_in, 60);
    dl_ledger_arrived(l, C, 0, 0, 90);
    dl_ledger_pooled(l, C, 0, 90, 0);
    dl_ledger_merged(l, C, 0, 90);
    dl_ledger_bye(l, C, 51, 0, 0);
    dl_ledger_get_totals(l, &t);
    CHECK_EQ(t.overclaim, 0);
    CHECK_EQ(t.carried_in, 60);
    dl_ledger_close(&l);
    printf("ok: ledger: carried progress never reported counts once (processed, or carried in mid-life)\n");
}

int main(void)
{
    test_ledger();
    test_shard();
    test_carried();
    test_carried_unreported();
    test_round();
    return CHECK_DONE("test_ledger");
}
