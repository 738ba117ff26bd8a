/* Test helpers shared by test_node and test_cuda_learner: two mailboxes
 * fed the same updates, and the pushes taken out of them compared bit for bit. */
#ifndef DL_TESTS_PUSH_PAIR_H
#define DL_TESTS_PUSH_PAIR_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/plan.h"
#include "learner/mailbox.h"

typedef struct {
    int got;         /* a push of this fragment was waiting */
    dl_mailbox_push h; /* its header */
    float *d;        /* its payload (mailbox buffer, swapped in) */
} taken;

/* Take every fragment's waiting push (if any) out of mailbox c into t[0..P). */
static inline void take_all(dl_mailbox *c, taken *t, int P)
{
    for (int p = 0; p < P; p++) t[p].got = dl_mailbox_take_push(c, p, &t[p].h, &t[p].d);
}

/* Both absent, or the same header and the same payload bits. */
static inline int same_push(const taken *a, const taken *b, const dl_plan *plan, int p)
{
    if (a->got != b->got) return 0;
    if (!a->got) return 1;
    return a->h.fragment == b->h.fragment && a->h.base_version == b->h.base_version && a->h.steps == b->h.steps &&
           a->h.tokens == b->h.tokens && memcmp(&a->h.loss, &b->h.loss, sizeof(double)) == 0 &&
           a->h.final == b->h.final && !memcmp(a->d, b->d, dl_plan_fragment_numel(plan, p) * sizeof(float));
}

/* Hand both mailboxes the global fragment p at version v, as global_of makes it. */
static inline void put_both(dl_mailbox *a, dl_mailbox *b, const dl_plan *plan, void (*global_of)(int, uint64_t, float *),
                            int p, uint64_t v, int forced)
{
    size_t k = dl_plan_fragment_numel(plan, p);
    float *g = calloc(k, sizeof(float));
    global_of(p, v, g);
    dl_mailbox_put_update(a, p, v, forced, g, k);
    dl_mailbox_put_update(b, p, v, forced, g, k);
    free(g);
}

#endif
