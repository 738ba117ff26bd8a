/* The shard layout rule (core/shard.h): p % S, counts and lists that cover
 * every fragment exactly once, the validity of a layout, and the byte
 * balance the rule gives on the plans of a small model and of GPT-2 124M. */
#include "core/err.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/shard.h"

#include "tests/check.h"

/* max shard bytes / mean shard bytes of the plan of `m` with P fragments over S shards */
static double shard_imbalance(const dl_model_config *m, int P, int S)
{
    dl_plan *plan = NULL;
    if (dl_model_plan_open(m, P, &plan)) return -1;
    double bytes[64] = {0}, total = 0, hi = 0;
    for (int p = 0; p < P; p++) {
        double b = (double)dl_plan_fragment_numel(plan, p) * 4;
        bytes[dl_shard_of(p, S)] += b;
        total += b;
    }
    for (int k = 0; k < S; k++) hi = bytes[k] > hi ? bytes[k] : hi;
    dl_plan_close(&plan);
    return hi / (total / S);
}

int main(void)
{
    /* the rule */
    CHECK_EQ(dl_shard_of(0, 1), 0);
    CHECK_EQ(dl_shard_of(7, 0), 0);
    CHECK_EQ(dl_shard_of(7, 1), 0);
    CHECK_EQ(dl_shard_of(7, 3), 1);
    CHECK_EQ(dl_shard_of(6, 3), 0);
    CHECK(dl_shard_owns(5, 0, 1) && dl_shard_owns(5, 0, 0), "unsharded: shard 0 owns everything");
    CHECK(dl_shard_owns(5, 1, 2) && !dl_shard_owns(5, 0, 2), "5 %% 2 = 1");
    /* counts and lists partition the fragments */
    for (int P = 1; P <= 12; P++)
        for (int S = 1; S <= P; S++) {
            int seen[12] = {0}, sum = 0;
            for (int k = 0; k < S; k++) {
                int list[12], n = dl_shard_fragments(P, k, S, list);
                CHECK(n == dl_shard_count(P, k, S) && n >= 1, "P=%d S=%d shard %d owns %d", P, S, k, n);
                CHECK(n == P / S || n == P / S + 1, "P=%d S=%d shard %d owns %d: not balanced in count", P, S, k, n);
                for (int i = 0; i < n; i++) {
                    seen[list[i]]++;
                    CHECK(i == 0 || list[i] > list[i - 1], "ascending");
                    CHECK(dl_shard_of(list[i], S) == k, "listed fragment is owned");
                }
                sum += n;
            }
            CHECK_EQ(sum, P);
            for (int p = 0; p < P; p++) CHECK(seen[p] == 1, "P=%d S=%d: fragment %d owned %d times", P, S, p, seen[p]);
        }
    /* valid layouts */
    CHECK(dl_shard_check(4, 0, 0) == 0 && dl_shard_check(4, 0, 1) == 0, "unsharded");
    CHECK(dl_shard_check(4, 1, 1) == DL_EINVAL && strstr(dl_errmsg(), "without shards"), "shard 1 of 1: %s", dl_errmsg());
    CHECK(dl_shard_check(4, 3, 4) == 0 && dl_shard_check(4, 1, 2) == 0, "sharded");
    CHECK(dl_shard_check(4, 2, 2) == DL_EINVAL && strstr(dl_errmsg(), "not in [0, shards 2)"), "k = S: %s", dl_errmsg());
    CHECK(dl_shard_check(4, -1, 2) == DL_EINVAL, "k < 0");
    CHECK(dl_shard_check(4, 0, 5) == DL_EINVAL && strstr(dl_errmsg(), "shards 5 > fragments 4"), "S > P: %s",
          dl_errmsg());
    /* bytes: the plans' fragments are near-equal, so round-robin shards are too */
    dl_model_config small = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 32, .vocab = 256};
    dl_model_config gpt2 = {.n_layer = 12, .n_head = 12, .n_embd = 768, .seq_len = 1024, .vocab = 50257};
    REQUIRE(dl_model_config_check(&small) == 0 && dl_model_config_check(&gpt2) == 0, "models");
    struct { const dl_model_config *m; int P, S; double max; } cases[] = {
        {&small, 4, 2, 1.05}, {&small, 8, 2, 1.01}, {&small, 8, 4, 1.01},
        {&gpt2, 8, 2, 1.01},  {&gpt2, 16, 4, 1.01}, {&gpt2, 32, 8, 1.01},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double im = shard_imbalance(cases[i].m, cases[i].P, cases[i].S);
        printf("L=%d P=%d S=%d: shard bytes max/mean %.5f\n", cases[i].m->n_layer, cases[i].P, cases[i].S, im);
        CHECK(im >= 1.0 && im <= cases[i].max, "shard imbalance %.5f above %.3f", im, cases[i].max);
    }
    printf("test_shard: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
