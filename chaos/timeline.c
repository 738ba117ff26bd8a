/* The fault timeline of a scenario: learner slots from the learner sections,
 * scheduled faults as written, random ones drawn from the seed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chaos/scenario.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/rng.h"

static int add(dl_timeline *t, double at, dl_fault_kind k, const char *target, double dur, double value,
               const char *src_kind, const char *src)
{
    if (t->n_ev == DL_SC_MAX_FAULTS)
        return dl_err(DL_ERANGE, "the timeline has more than %d faults (lower a fault's rate or max)", DL_SC_MAX_FAULTS);
    dl_sc_event *e = &t->ev[t->n_ev++];
    memset(e, 0, sizeof *e);
    e->at_s = at;
    e->kind = k;
    size_t n = strnlen(target, sizeof e->target - 1); /* target may point into t itself */
    memmove(e->target, target, n);
    e->target[n] = 0;
    e->duration_s = dur;
    e->value = value;
    snprintf(e->source, sizeof e->source, "%s:%s", src_kind, src);
    return 0;
}

static double draw_repair(dl_rng *r, const dl_sc_fault *f)
{
    double u = (double)dl_rng_uniform(r);
    if (!strcmp(f->repair, "fixed")) return f->repair_s;
    if (!strcmp(f->repair, "uniform")) return f->repair_min_s + u * (f->repair_s - f->repair_min_s);
    return -f->repair_s * log1p(-u * 0.999999); /* exp, mean repair_s */
}

static int by_time(const void *a, const void *b)
{
    const dl_sc_event *x = a, *y = b;
    if (x->at_s != y->at_s) return x->at_s < y->at_s ? -1 : 1;
    return x->n - y->n; /* n holds the order of generation here: stable */
}

int dl_timeline_build(const dl_scenario *sc, int faults, dl_timeline *t)
{
    memset(t, 0, sizeof *t);
    int initial = 0;
    for (int i = 0; i < sc->n_learner; i++) initial += (int)sc->learner[i].count;
    for (int i = 0; i < sc->n_learner; i++) {
        const dl_sc_learner *l = &sc->learner[i];
        for (int j = 0; j < l->count; j++) {
            dl_sc_slot *s = &t->slot[t->n_slot];
            if (l->count == 1) snprintf(s->id, sizeof s->id, "%s", l->name);
            else snprintf(s->id, sizeof s->id, "%s%d", l->name, j);
            for (int o = 0; o < t->n_slot; o++)
                if (!strcmp(t->slot[o].id, s->id))
                    return dl_err(DL_EINVAL, "%s: learner id '%s' comes from two learner sections", sc->path, s->id);
            s->section = i;
            s->dc = dl_scenario_dc_index(sc, l->dc);
            s->join_s = l->join_s;
            s->leave_s = l->leave_s;
            s->data_shard = t->n_slot % (initial > 0 ? initial : 1);
            if (l->join_s > 0) DL_TRY(add(t, l->join_s, DL_FK_LEARNER_JOIN, s->id, 0, 0, "scheduled", l->name));
            if (l->leave_s > 0) DL_TRY(add(t, l->leave_s, DL_FK_LEARNER_LEAVE, s->id, 0, 0, "scheduled", l->name));
            t->n_slot++;
        }
    }
    for (int i = 0; faults && i < sc->n_fault; i++) {
        const dl_sc_fault *f = &sc->fault[i];
        char tk = dl_fault_kind_target(f->k);
        /* the targets: one, or every one of the kind ("*") */
        const char *targets[DL_SC_MAX_SLOTS];
        int nt = 0;
        if (tk == 's') targets[nt++] = "sync";
        else if (!strcmp(f->target, "*") && tk == 'd')
            for (int d = 0; d < sc->n_dc; d++) targets[nt++] = sc->dc[d].name;
        else if (!strcmp(f->target, "*"))
            for (int s = 0; s < t->n_slot; s++) targets[nt++] = t->slot[s].id;
        else targets[nt++] = f->target;
        if (tk == 'l' && strcmp(f->target, "*")) {
            int found = 0;
            for (int s = 0; s < t->n_slot; s++) found |= !strcmp(t->slot[s].id, f->target);
            if (!found) return dl_err(DL_EINVAL, "%s: [fault %s] target '%s' is not a learner id", sc->path, f->name, f->target);
        }
        if (f->at_s >= 0) {
            for (int k = 0; k < nt; k++)
                DL_TRY(add(t, f->at_s, f->k, targets[k], dl_fault_kind_lasts(f->k) ? f->duration_s : 0, f->value,
                           "scheduled", f->name));
            continue;
        }
        double end = f->end_s > 0 ? f->end_s : sc->run.duration_s - 10;
        for (int k = 0; k < nt; k++) {
            /* one independent stream per (section, target): adding a fault
             * section or a learner leaves the other streams as they were */
            char key[160];
            snprintf(key, sizeof key, "%s/%s", f->name, targets[k]);
            dl_rng r;
            dl_rng_seed(&r, (uint64_t)sc->run.seed ^ dl_hash64(key, strlen(key), 0x63686173ULL));
            double at = f->start_s;
            for (int64_t c = 0; c < f->max; c++) {
                double u = (double)dl_rng_uniform(&r);
                at += -f->mtbf_s * log1p(-u * 0.999999);
                if (at >= end) break;
                double rep = dl_fault_kind_lasts(f->k) ? draw_repair(&r, f) : 0;
                if (rep > 0 && rep < 0.5) rep = 0.5; /* the harness's resolution */
                DL_TRY(add(t, at, f->k, targets[k], rep, f->value, "random", f->name));
                at += rep;
            }
        }
    }
    for (int i = 0; i < t->n_ev; i++) t->ev[i].n = i;
    qsort(t->ev, (size_t)t->n_ev, sizeof t->ev[0], by_time);
    for (int i = 0; i < t->n_ev; i++) t->ev[i].n = i;
    return 0;
}

void dl_timeline_print(const dl_timeline *t, FILE *f)
{
    fprintf(f, "n\tat_s\tkind\ttarget\tduration_s\tvalue\tsource\n");
    for (int i = 0; i < t->n_ev; i++) {
        const dl_sc_event *e = &t->ev[i];
        fprintf(f, "%d\t%.3f\t%s\t%s\t%.3f\t%g\t%s\n", e->n, e->at_s, dl_fault_kind_name(e->kind), e->target,
                e->duration_s, e->value, e->source);
    }
}

int dl_timeline_write(const dl_timeline *t, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return dl_err(DL_EIO, "cannot write %s", path);
    dl_timeline_print(t, f);
    if (fclose(f)) return dl_err(DL_EIO, "cannot write %s", path);
    return 0;
}
