/* Round assembly: merge record (contributors, normalised weights, reasons,
 * dropped-stale asides) and share of a closed policy round. */
#include "synchronizer/round.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

void dl_round_assemble(const dl_policy_round *r, const dl_round_in *in, dl_round_out *out)
{
    memset(out, 0, sizeof *out);
    dl_merge_record *rec = &out->rec;
    rec->epoch = in->epoch;
    snprintf(rec->staleness_fn, sizeof rec->staleness_fn, "%s", in->staleness_fn);
    rec->n_contrib = (uint32_t)(r->n + in->n_asides);
    rec->contrib = dl_xcalloc(rec->n_contrib ? rec->n_contrib : 1, sizeof(dl_merge_contrib));
    for (int i = 0; i < r->n; i++) {
        const dl_policy_contrib *c = &r->contribs[i];
        dl_merge_contrib *mc = &rec->contrib[i];
        snprintf(mc->learner_id, sizeof mc->learner_id, "%s", in->learner_id(in->ctx, c->learner));
        mc->base_version = c->base_version;
        mc->staleness = (uint64_t)c->staleness;
        mc->steps = (uint64_t)c->steps;
        mc->tokens = (uint64_t)c->tokens;
        mc->weight = r->weight_sum > 0 ? c->weight / r->weight_sum : 0;
        mc->decision = DL_MERGE_MERGED;
        snprintf(mc->reason, sizeof mc->reason, "%s", c->learner_dead ? "merged (learner dead)" : "");
        out->applied_tokens += (uint64_t)c->tokens;
    }
    for (int i = 0; i < in->n_asides; i++) rec->contrib[r->n + i] = in->asides[i];
    out->share = r->share;
}

void dl_round_out_free(dl_round_out *o)
{
    free(o->rec.contrib);
    o->rec.contrib = NULL;
    o->rec.n_contrib = 0;
}
