/* Scenario files: "[run]", "[sync]", "[learners]" (defaults), "[dc NAME]",
 * "[learner NAME]" and "[fault NAME]" sections of typed, bounded keys. */
#include "chaos/scenario.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/defaults.h"
#include "core/err.h"

#define F(s, f) offsetof(s, f)

static const char *const kind_names[DL_FK_N] = {
    "learner_kill", "learner_hang", "learner_slow", "learner_leave", "learner_join", "churn",
    "sync_kill",    "sync_hang",    "partition",    "bandwidth",     "delay",        "loss",
    "duplicate",    "reorder",      "disk_eio",     "disk_enospc",   "rogue_garbage", "rogue_replay"};
static const char kind_targets[DL_FK_N] = {'l', 'l', 'l', 'l', 'l', 'l', 's', 's', 'd',
                                           'd', 'd', 'd', 'd', 'd', 's', 's', 's', 'd'};
static const char kind_lasts[DL_FK_N] = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};

const char *dl_fault_kind_name(dl_fault_kind k) { return (unsigned)k < DL_FK_N ? kind_names[k] : "?"; }
char dl_fault_kind_target(dl_fault_kind k) { return (unsigned)k < DL_FK_N ? kind_targets[k] : '?'; }
int dl_fault_kind_lasts(dl_fault_kind k) { return (unsigned)k < DL_FK_N ? kind_lasts[k] : 0; }

static const dl_cfg_entry run_t[] = {
    {"name", DL_CFG_STR, F(dl_sc_run, name), 0, 0, "", NULL, 0, "scenario name (default: the file's)"},
    {"seed", DL_CFG_INT, F(dl_sc_run, seed), 0, 9.2e18, "1", NULL, 0, "seed of the fault timeline and the relays"},
    {"duration_s", DL_CFG_FLOAT, F(dl_sc_run, duration_s), 10, 86400, "120", NULL, 0, "run length, s"},
    {"policy", DL_CFG_ENUM, F(dl_sc_run, policy), 0, 0, "decoupled", "decoupled|sync-elastic|sync", 0,
     "merge policy when --compare is not given"},
    {"eval_every_s", DL_CFG_FLOAT, F(dl_sc_run, eval_every_s), 0, 86400, "15", NULL, 0,
     "global validation loss every this many s (0 = only at the end)"},
    {"eval_batches", DL_CFG_INT, F(dl_sc_run, eval_batches), 1, 10000, "8", NULL, 0, "validation batches"},
    {"corpus", DL_CFG_STR, F(dl_sc_run, corpus), 0, 0, "/usr/share/games/fortunes", NULL, 0, "training text"},
    {"n_layer", DL_CFG_INT, F(dl_sc_run, n_layer), 1, 256, "2", NULL, 0, "model: blocks"},
    {"n_head", DL_CFG_INT, F(dl_sc_run, n_head), 1, 256, "2", NULL, 0, "model: heads"},
    {"n_embd", DL_CFG_INT, F(dl_sc_run, n_embd), 8, 16384, "64", NULL, 0, "model: channels"},
    {"seq_len", DL_CFG_INT, F(dl_sc_run, seq_len), 2, 65536, "64", NULL, 0, "model: context"},
    {"vocab", DL_CFG_INT, F(dl_sc_run, vocab), 0, 16777216, "256", NULL, 0, "model: vocabulary"},
    {"fragments", DL_CFG_INT, F(dl_sc_run, fragments), 1, 4096, "4", NULL, 0, "P"},
    {"H", DL_CFG_INT, F(dl_sc_run, H), 1, 1000000, DL_DEF_STR(DL_DEF_H), NULL, 0,
     "inner steps between pushes of a fragment"},
    {"threads", DL_CFG_INT, F(dl_sc_run, threads), 1, 256, "1", NULL, 0, "OpenMP threads per learner"},
    {"log_every", DL_CFG_INT, F(dl_sc_run, log_every), 1, 1000000, "50", NULL, 0, "learner step events"},
};
static const dl_cfg_entry sync_t[] = {
    {"heartbeat_ms", DL_CFG_INT, F(dl_sc_sync, heartbeat_ms), 10, 60000, DL_DEF_STR(DL_DEF_HEARTBEAT_MS), NULL, 0,
     "heartbeat period"},
    {"liveness", DL_CFG_INT, F(dl_sc_sync, liveness), 2, 100, DL_DEF_STR(DL_DEF_LIVENESS), NULL, 0,
     "missed heartbeats before dead"},
    {"quorum", DL_CFG_INT, F(dl_sc_sync, quorum), 1, 65536, "1", NULL, 0, "K"},
    {"max_staleness", DL_CFG_INT, F(dl_sc_sync, max_staleness), 0, 1e9, DL_DEF_STR(DL_DEF_MAX_STALENESS), NULL, 0,
     "versions"},
    {"chunk_kb", DL_CFG_INT, F(dl_sc_sync, chunk_kb), 4, 65536, DL_DEF_STR(DL_DEF_CHUNK_KB), NULL, 0,
     "chunk size, KiB"},
    {"push_chunk_max_kb", DL_CFG_INT, F(dl_sc_sync, push_chunk_max_kb), 0, 65536,
     DL_DEF_STR(DL_DEF_PUSH_CHUNK_MAX_KB), NULL, 0, "a learner's push chunks grow up to this on a fast link, KiB"},
    {"durability", DL_CFG_ENUM, F(dl_sc_sync, durability), 0, 0, "sync", "sync|periodic", 0, "commit fsync"},
    {"outer_lr", DL_CFG_FLOAT, F(dl_sc_sync, outer_lr), 0, 10, "1.0", NULL, 0, "outer learning rate"},
    {"outer_momentum", DL_CFG_FLOAT, F(dl_sc_sync, outer_momentum), 0, 0.999, "0", NULL, 0, "outer momentum"},
    {"restart_delay_s", DL_CFG_FLOAT, F(dl_sc_sync, restart_delay_s), 0, 3600, "1", NULL, 0,
     "restart after an unplanned exit"},
    {"args", DL_CFG_STR, F(dl_sc_sync, args), 0, 0, "", NULL, 0, "more dloco-sync flags"},
};
static const dl_cfg_entry learner_t[] = {
    {"dc", DL_CFG_STR, F(dl_sc_learner, dc), 0, 0, "", NULL, 0, "datacenter (a [dc NAME] section)"},
    {"count", DL_CFG_INT, F(dl_sc_learner, count), 1, DL_SC_MAX_SLOTS, "1", NULL, 0, "learners of this section"},
    {"speed", DL_CFG_FLOAT, F(dl_sc_learner, speed), 0.01, 1, "1", NULL, 0, "fraction of full speed (--throttle)"},
    {"batch", DL_CFG_INT, F(dl_sc_learner, batch), 1, 65536, "8", NULL, 0, "sequences per step"},
    {"lr", DL_CFG_FLOAT, F(dl_sc_learner, lr), 1e-7, 1, "3e-3", NULL, 0, "inner learning rate"},
    {"device", DL_CFG_ENUM, F(dl_sc_learner, device), 0, 0, "cpu", "cpu|cuda|auto", 0, "device"},
    {"adopt", DL_CFG_ENUM, F(dl_sc_learner, adopt), 0, 0, DL_DEF_ADOPT, "overwrite|mix|keep", 0, "adopt mode"},
    {"join_s", DL_CFG_FLOAT, F(dl_sc_learner, join_s), 0, 86400, "0", NULL, 0, "joins then (0 = at the start)"},
    {"leave_s", DL_CFG_FLOAT, F(dl_sc_learner, leave_s), 0, 86400, "0", NULL, 0, "leaves then (0 = stays)"},
    {"args", DL_CFG_STR, F(dl_sc_learner, args), 0, 0, "", NULL, 0, "more dloco-learner flags"},
};
static const dl_cfg_entry dc_t[] = {
    {"bandwidth_mbit", DL_CFG_FLOAT, F(dl_sc_dc, bandwidth_mbit), 0, 100000, "0", NULL, 0, "0 = unshaped"},
    {"rtt_ms", DL_CFG_FLOAT, F(dl_sc_dc, rtt_ms), 0, 10000, "0", NULL, 0, "round trip to the synchronizer"},
    {"jitter_ms", DL_CFG_FLOAT, F(dl_sc_dc, jitter_ms), 0, 10000, "0", NULL, 0, "uniform extra one-way delay"},
    {"loss", DL_CFG_FLOAT, F(dl_sc_dc, loss), 0, 1, "0", NULL, 0, "message loss probability"},
    {"duplicate", DL_CFG_FLOAT, F(dl_sc_dc, duplicate), 0, 1, "0", NULL, 0, "duplication probability"},
    {"reorder", DL_CFG_FLOAT, F(dl_sc_dc, reorder), 0, 1, "0", NULL, 0, "reordering probability"},
};
static const dl_cfg_entry fault_t[] = {
    {"kind", DL_CFG_STR, F(dl_sc_fault, kind), 0, 0, "", NULL, 0, "fault kind"},
    {"target", DL_CFG_STR, F(dl_sc_fault, target), 0, 0, "", NULL, 0, "learner id, datacenter, sync, or *"},
    {"at_s", DL_CFG_FLOAT, F(dl_sc_fault, at_s), -1, 86400, "-1", NULL, 0, "scheduled time"},
    {"duration_s", DL_CFG_FLOAT, F(dl_sc_fault, duration_s), 0, 86400, "0", NULL, 0, "scheduled length"},
    {"mtbf_s", DL_CFG_FLOAT, F(dl_sc_fault, mtbf_s), 0, 1e9, "0", NULL, 0, "random: mean time between failures"},
    {"repair_s", DL_CFG_FLOAT, F(dl_sc_fault, repair_s), 0, 86400, "10", NULL, 0, "random: repair time"},
    {"repair_min_s", DL_CFG_FLOAT, F(dl_sc_fault, repair_min_s), 0, 86400, "0", NULL, 0, "uniform: lower bound"},
    {"repair", DL_CFG_ENUM, F(dl_sc_fault, repair), 0, 0, "exp", "exp|fixed|uniform", 0, "repair distribution"},
    {"start_s", DL_CFG_FLOAT, F(dl_sc_fault, start_s), 0, 86400, "10", NULL, 0, "random: window start"},
    {"end_s", DL_CFG_FLOAT, F(dl_sc_fault, end_s), 0, 86400, "0", NULL, 0, "random: window end (0 = duration-10)"},
    {"value", DL_CFG_FLOAT, F(dl_sc_fault, value), -1, 1e9, "-1", NULL, 0, "the kind's parameter"},
    {"max", DL_CFG_INT, F(dl_sc_fault, max), 1, DL_SC_MAX_FAULTS, "1000", NULL, 0, "random: per target"},
};
static const dl_cfg_entry sim_t[] = {
    {"mode", DL_CFG_ENUM, F(dl_sc_sim, mode), 0, 0, "decoupled", "decoupled|dp|elastic", 0,
     "dloco-sim: learners on the real policy, or the data-parallel / elastic data-parallel baseline"},
    {"chips", DL_CFG_INT, F(dl_sc_sim, chips), 0, 1e9, "0", NULL, 0, "dloco-sim: chips (0 = one per learner slot)"},
    {"learners", DL_CFG_INT, F(dl_sc_sim, learners), 0, 4096, "0", NULL, 0,
     "dloco-sim: M, learners of chips/M chips (0 = the learner slots; given: chips must be too)"},
    {"horizon_s", DL_CFG_FLOAT, F(dl_sc_sim, horizon_s), 0, 1e9, "0", NULL, 0,
     "dloco-sim: simulated time (0 = [run] duration_s)"},
    {"mtbi_s", DL_CFG_FLOAT, F(dl_sc_sim, mtbi_s), 0, 1e12, "0", NULL, 0,
     "dloco-sim: mean time between interruptions of one chip (0 = none)"},
    {"recovery_s", DL_CFG_FLOAT, F(dl_sc_sim, recovery_s), 0, 1e6, "60", NULL, 0,
     "dloco-sim: dp restart; a restarting learner's down time"},
    {"ckpt_s", DL_CFG_FLOAT, F(dl_sc_sim, ckpt_s), 0, 1e7, "0", NULL, 0,
     "dloco-sim: dp checkpoint interval (0 = nothing lost)"},
    {"slice_chips", DL_CFG_INT, F(dl_sc_sim, slice_chips), 1, 1e9, "1", NULL, 0,
     "dloco-sim: chips dropped / re-added together by a resize"},
    {"resize_s", DL_CFG_FLOAT, F(dl_sc_sim, resize_s), 0, 1e6, "10", NULL, 0,
     "dloco-sim: pause of a job per slice drop and per return"},
    {"repair_s", DL_CFG_FLOAT, F(dl_sc_sim, repair_s), 0, 1e8, "3600", NULL, 0, "dloco-sim: a dropped slice's repair"},
    {"learner_fail", DL_CFG_ENUM, F(dl_sc_sim, learner_fail), 0, 0, "resize", "resize|restart", 0,
     "dloco-sim: what an interruption does to a learner"},
    {"startup_s", DL_CFG_FLOAT, F(dl_sc_sim, startup_s), 0, 1e6, "0", NULL, 0, "dloco-sim: a learner's first start"},
    {"restart_s", DL_CFG_FLOAT, F(dl_sc_sim, restart_s), 0, 1e6, "0", NULL, 0,
     "dloco-sim: a restarted learner's start after its down time"},
    {"step_s", DL_CFG_FLOAT, F(dl_sc_sim, step_s), 1e-4, 1e4, "1", NULL, 0, "dloco-sim: inner step time at speed 1"},
    {"step_cv", DL_CFG_FLOAT, F(dl_sc_sim, step_cv), 0, 2, "0", NULL, 0,
     "dloco-sim: between-learner spread of the step time (log-normal sigma)"},
    {"params", DL_CFG_FLOAT, F(dl_sc_sim, params), 0, 1e14, "0", NULL, 0,
     "dloco-sim: model parameters (0 = the [run] model's, roughly)"},
    {"bytes_per_param", DL_CFG_FLOAT, F(dl_sc_sim, bytes_per_param), 0.01, 16, "4", NULL, 0,
     "dloco-sim: bytes per parameter on the wire"},
    {"grace_steps", DL_CFG_FLOAT, F(dl_sc_sim, grace_steps), 1e-6, 1e6, "4", NULL, 0,
     "dloco-sim: dloco-sync's --grace_steps (dloco-chaos: put it in [sync] args)"},
    {"grace_cap_s", DL_CFG_FLOAT, F(dl_sc_sim, grace_cap_s), 0.001, 86400, "5", NULL, 0,
     "dloco-sim: dloco-sync's --grace_cap_ms, in s"},
    {"merge_s", DL_CFG_FLOAT, F(dl_sc_sim, merge_s), 0, 1e4, "0", NULL, 0, "dloco-sim: a round's close to its commit"},
    {"update_s", DL_CFG_FLOAT, F(dl_sc_sim, update_s), 0, 1e4, "0", NULL, 0,
     "dloco-sim: an Update's apply time at the learner, after its transfer"},
    {"step_overhead_s", DL_CFG_FLOAT, F(dl_sc_sim, step_overhead_s), 0, 1e4, "0", NULL, 0,
     "dloco-sim: a learner's wall time per step outside the step's compute (pushes, adopts)"},
};
#define NT(t) (sizeof t / sizeof t[0])

/* A section or learner/datacenter name: what ids, files and events can carry bare. */
static int valid_name(const char *s)
{
    if (!*s || strlen(s) >= DL_SC_NAME - 8) return 0;
    for (const char *c = s; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_' && *c != '-') return 0;
    return 1;
}

int dl_scenario_dc_index(const dl_scenario *sc, const char *name)
{
    for (int i = 0; i < sc->n_dc; i++)
        if (!strcmp(sc->dc[i].name, name)) return i;
    return -1;
}

static int set_key(const dl_cfg_entry *t, size_t n, void *obj, const char *path, int line, const char *sec,
                   const char *k, const char *v)
{
    if (!dl_cfg_find(t, n, k)) {
        char keys[1024] = "";
        for (size_t i = 0; i < n; i++) {
            strncat(keys, t[i].name, sizeof keys - strlen(keys) - 3);
            if (i + 1 < n) strncat(keys, ", ", sizeof keys - strlen(keys) - 1);
        }
        return dl_err(DL_EINVAL, "%s:%d: [%s]: unknown key '%s' (keys: %s)", path, line, sec, k, keys);
    }
    int rc = dl_cfg_set(t, n, obj, k, v);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        return dl_err(rc, "%s:%d: [%s] %s", path, line, sec, msg);
    }
    return 0;
}

/* Cross-section rules: references resolve, kinds match targets, times fit. */
static int validate(dl_scenario *sc)
{
    const char *p = sc->path;
    if (!sc->n_learner) return dl_err(DL_EINVAL, "%s: no [learner NAME] section", p);
    if (sc->sim.learners > 0 && sc->sim.chips == 0)
        return dl_err(DL_EINVAL, "%s: [sim] learners %lld needs chips (the fleet they split)", p,
                      (long long)sc->sim.learners);
    if (sc->sim.chips > 0 && sc->sim.learners > sc->sim.chips)
        return dl_err(DL_EINVAL, "%s: [sim] learners %lld > chips %lld", p, (long long)sc->sim.learners,
                      (long long)sc->sim.chips);
    if (sc->sim.chips > 0 && sc->sim.slice_chips > sc->sim.chips)
        return dl_err(DL_EINVAL, "%s: [sim] slice_chips %lld > chips %lld", p, (long long)sc->sim.slice_chips,
                      (long long)sc->sim.chips);
    if (!sc->n_dc) return dl_err(DL_EINVAL, "%s: no [dc NAME] section (every learner sits in a datacenter)", p);
    for (int d = 0; d < sc->n_dc; d++)
        if (sc->dc[d].bandwidth_mbit > 0 && sc->dc[d].bandwidth_mbit < 0.01)
            return dl_err(DL_ERANGE, "%s: [dc %s] bandwidth_mbit %g: 0 (unshaped) or >= 0.01", p, sc->dc[d].name,
                          sc->dc[d].bandwidth_mbit);
    int slots = 0;
    for (int i = 0; i < sc->n_learner; i++) {
        dl_sc_learner *l = &sc->learner[i];
        if (!*l->dc && sc->n_dc == 1) snprintf(l->dc, sizeof l->dc, "%s", sc->dc[0].name);
        if (dl_scenario_dc_index(sc, l->dc) < 0)
            return dl_err(DL_EINVAL, "%s: [learner %s] dc '%s' is not a [dc NAME] section", p, l->name, l->dc);
        if (l->join_s >= sc->run.duration_s || l->leave_s >= sc->run.duration_s)
            return dl_err(DL_EINVAL, "%s: [learner %s] join_s/leave_s must be inside duration_s %.0f", p, l->name,
                          sc->run.duration_s);
        if (l->leave_s > 0 && l->leave_s <= l->join_s)
            return dl_err(DL_EINVAL, "%s: [learner %s] leave_s %.1f is not after join_s %.1f", p, l->name, l->leave_s,
                          l->join_s);
        slots += (int)l->count;
    }
    if (slots > DL_SC_MAX_SLOTS / 2)
        return dl_err(DL_ERANGE, "%s: %d learners, at most %d (half the slots, the rest for churn)", p, slots,
                      DL_SC_MAX_SLOTS / 2);
    for (int i = 0; i < sc->n_fault; i++) {
        dl_sc_fault *f = &sc->fault[i];
        int k = -1;
        for (int j = 0; j < DL_FK_N; j++)
            if (!strcmp(f->kind, kind_names[j])) k = j;
        if (k < 0 || k == DL_FK_LEARNER_JOIN)
            return dl_err(DL_EINVAL,
                          "%s: [fault %s] kind '%s' unknown (learner_kill, learner_hang, learner_slow, learner_leave, "
                          "churn, sync_kill, sync_hang, partition, bandwidth, delay, loss, duplicate, reorder, "
                          "disk_eio, disk_enospc, rogue_garbage, rogue_replay; joins are a learner's join_s)",
                          p, f->name, f->kind);
        f->k = (dl_fault_kind)k;
        char tk = kind_targets[k];
        if (tk == 's') {
            if (!*f->target) snprintf(f->target, sizeof f->target, "sync");
            if (strcmp(f->target, "sync"))
                return dl_err(DL_EINVAL, "%s: [fault %s] %s targets the synchronizer: target = sync", p, f->name,
                              f->kind);
        } else if (!*f->target) {
            return dl_err(DL_EINVAL, "%s: [fault %s] needs a target (a %s or *)", p, f->name,
                          tk == 'l' ? "learner id" : "datacenter");
        } else if (strcmp(f->target, "*") && tk == 'd' && dl_scenario_dc_index(sc, f->target) < 0) {
            return dl_err(DL_EINVAL, "%s: [fault %s] target '%s' is not a datacenter", p, f->name, f->target);
        }
        /* learner targets are resolved against the slots by dl_timeline_build */
        int sched = f->at_s >= 0, rnd = f->mtbf_s > 0;
        if (sched == rnd)
            return dl_err(DL_EINVAL, "%s: [fault %s] give either at_s (scheduled) or mtbf_s (random), not %s", p,
                          f->name, sched ? "both" : "neither");
        if (sched && f->at_s >= sc->run.duration_s)
            return dl_err(DL_EINVAL, "%s: [fault %s] at_s %.1f is not inside duration_s %.0f", p, f->name, f->at_s,
                          sc->run.duration_s);
        if (sched && kind_lasts[k] && f->duration_s <= 0)
            return dl_err(DL_EINVAL, "%s: [fault %s] %s lasts: give duration_s > 0", p, f->name, f->kind);
        if (rnd && !strcmp(f->repair, "uniform") && f->repair_min_s > f->repair_s)
            return dl_err(DL_EINVAL, "%s: [fault %s] repair_min_s %.1f > repair_s %.1f", p, f->name, f->repair_min_s,
                          f->repair_s);
        if (rnd && kind_lasts[k] && f->repair_s <= 0)
            return dl_err(DL_EINVAL, "%s: [fault %s] a random %s needs repair_s > 0", p, f->name, f->kind);
        double end = f->end_s > 0 ? f->end_s : sc->run.duration_s - 10;
        if (rnd && (end <= f->start_s || end > sc->run.duration_s))
            return dl_err(DL_EINVAL, "%s: [fault %s] random window [%.1f, %.1f] s is empty or past duration_s", p,
                          f->name, f->start_s, end);
        /* the value each kind takes, with its default */
        double v = f->value;
        switch (k) {
        case DL_FK_LEARNER_SLOW:
            if (v < 0) v = 0.5;
            /* the duty cycle's period is 100 ms and the harness ticks every 5 ms */
            if (v < 0.1 || v >= 1)
                return dl_err(DL_ERANGE, "%s: [fault %s] learner_slow value %g: the fraction of speed, in [0.1, 1)",
                              p, f->name, v);
            break;
        case DL_FK_BANDWIDTH:
            if (v < 0.01) return dl_err(DL_ERANGE, "%s: [fault %s] bandwidth value: Mbit/s >= 0.01", p, f->name);
            break;
        case DL_FK_DELAY:
            if (v <= 0 || v > 10000)
                return dl_err(DL_ERANGE, "%s: [fault %s] delay value: extra RTT ms in (0, 10000]", p, f->name);
            break;
        case DL_FK_LOSS:
        case DL_FK_DUPLICATE:
        case DL_FK_REORDER:
        case DL_FK_DISK_EIO:
        case DL_FK_DISK_ENOSPC:
            if (v < 0) v = (k == DL_FK_DISK_EIO || k == DL_FK_DISK_ENOSPC) ? 1.0 : 0.1;
            if (v <= 0 || v > 1)
                return dl_err(DL_ERANGE, "%s: [fault %s] %s value %g: a probability in (0, 1]", p, f->name, f->kind, v);
            break;
        case DL_FK_ROGUE_GARBAGE:
        case DL_FK_ROGUE_REPLAY:
            if (v < 0) v = k == DL_FK_ROGUE_GARBAGE ? 50 : 1;
            if (v < 1 || v > 100000 || v != (double)(int64_t)v)
                return dl_err(DL_ERANGE, "%s: [fault %s] %s value %g: a message count in [1, 100000]", p, f->name,
                              f->kind, v);
            break;
        default:
            if (v >= 0)
                return dl_err(DL_EINVAL, "%s: [fault %s] %s takes no value", p, f->name, f->kind);
            v = 0;
        }
        f->value = v;
    }
    return 0;
}

void dl_scenario_usage(FILE *f)
{
    static const struct {
        const char *sec, *what;
        const dl_cfg_entry *t;
        size_t n;
    } secs[] = {{"[run]", "the run and its model", run_t, NT(run_t)},
                {"[sync]", "the synchronizer", sync_t, NT(sync_t)},
                {"[learners]", "defaults of every [learner NAME] below it", learner_t, NT(learner_t)},
                {"[learner NAME]", "a group of learners", learner_t, NT(learner_t)},
                {"[dc NAME]", "a datacenter: its link to the synchronizer", dc_t, NT(dc_t)},
                {"[fault NAME]", "a scheduled or random fault (docs/CHAOS.md lists the kinds)", fault_t, NT(fault_t)},
                {"[sim]", "dloco-sim only (docs/SIM.md); dloco-chaos ignores it", sim_t, NT(sim_t)}};
    fprintf(f, "scenario file keys ('key = value' under each section; '#' or ';' starts a comment):\n");
    for (size_t i = 0; i < sizeof secs / sizeof secs[0]; i++) {
        if (i == 3) { /* [learner NAME] takes [learners]' keys */
            fprintf(f, "\n%s: %s; the keys of [learners]\n", secs[i].sec, secs[i].what);
            continue;
        }
        fprintf(f, "\n%s: %s\n", secs[i].sec, secs[i].what);
        dl_cfg_usage_keys(secs[i].t, secs[i].n, f);
    }
}

int dl_scenario_load(const char *path, const dl_sc_overrides *ov, dl_scenario *sc)
{
    memset(sc, 0, sizeof *sc);
    snprintf(sc->path, sizeof sc->path, "%s", path);
    DL_TRY(dl_cfg_defaults(run_t, NT(run_t), &sc->run));
    DL_TRY(dl_cfg_defaults(sync_t, NT(sync_t), &sc->sync));
    DL_TRY(dl_cfg_defaults(learner_t, NT(learner_t), &sc->learner_defaults));
    DL_TRY(dl_cfg_defaults(sim_t, NT(sim_t), &sc->sim));
    dl_ini r;
    if (dl_ini_open(&r, path)) return dl_err(DL_EIO, "scenario %s: cannot open", path);
    char sec[DL_CFG_STRLEN] = "", *ka, *kb;
    void *obj = NULL;
    const dl_cfg_entry *t = NULL;
    size_t tn = 0;
    int rc = 0, kind, lineno = 0;
    while (!rc && (kind = dl_ini_next(&r, &ka, &kb)) != DL_INI_END) {
        lineno = r.line;
        if (kind < 0) {
            rc = kind;
            break;
        }
        if (kind == DL_INI_SECTION) {
            snprintf(sec, sizeof sec, "%s", ka);
            char type[32] = "", name[DL_CFG_STRLEN] = "";
            if (sscanf(sec, "%31s %255s", type, name) < 1) {
                rc = dl_err(DL_EINVAL, "%s:%d: empty section header", path, lineno);
                break;
            }
            int named = !strcmp(type, "dc") || !strcmp(type, "learner") || !strcmp(type, "fault");
            if (named && !valid_name(name)) {
                rc = dl_err(DL_EINVAL, "%s:%d: [%s NAME]: NAME '%s' must be 1-%d of [A-Za-z0-9_-]", path, lineno, type,
                            name, DL_SC_NAME - 9);
                break;
            }
            if (!named && *name) {
                rc = dl_err(DL_EINVAL, "%s:%d: [%s] takes no name", path, lineno, type);
                break;
            }
            if (!strcmp(type, "run")) obj = &sc->run, t = run_t, tn = NT(run_t);
            else if (!strcmp(type, "sync")) obj = &sc->sync, t = sync_t, tn = NT(sync_t);
            else if (!strcmp(type, "learners")) obj = &sc->learner_defaults, t = learner_t, tn = NT(learner_t);
            else if (!strcmp(type, "sim")) obj = &sc->sim, t = sim_t, tn = NT(sim_t);
            else if (!strcmp(type, "dc") || !strcmp(type, "learner") || !strcmp(type, "fault")) {
                /* a name is unique within its kind of section */
                int dup = 0;
                if (type[0] == 'd') {
                    dup = dl_scenario_dc_index(sc, name) >= 0;
                    if (!dup && sc->n_dc == DL_SC_MAX_DCS) rc = dl_err(DL_ERANGE, "%s:%d: more than %d [dc] sections", path, lineno, DL_SC_MAX_DCS);
                    if (!dup && !rc) {
                        dl_sc_dc *d = &sc->dc[sc->n_dc++];
                        dl_cfg_defaults(dc_t, NT(dc_t), d);
                        snprintf(d->name, sizeof d->name, "%s", name);
                        obj = d, t = dc_t, tn = NT(dc_t);
                    }
                } else if (type[0] == 'l') {
                    for (int i = 0; i < sc->n_learner; i++) dup |= !strcmp(sc->learner[i].name, name);
                    if (!dup && sc->n_learner == DL_SC_MAX_LEARNER_SECTIONS)
                        rc = dl_err(DL_ERANGE, "%s:%d: more than %d [learner] sections", path, lineno,
                                    DL_SC_MAX_LEARNER_SECTIONS);
                    if (!dup && !rc) {
                        dl_sc_learner *l = &sc->learner[sc->n_learner++];
                        *l = sc->learner_defaults; /* [learners] must come first to apply */
                        snprintf(l->name, sizeof l->name, "%s", name);
                        obj = l, t = learner_t, tn = NT(learner_t);
                    }
                } else {
                    for (int i = 0; i < sc->n_fault; i++) dup |= !strcmp(sc->fault[i].name, name);
                    if (!dup && sc->n_fault == DL_SC_MAX_FAULT_SECTIONS)
                        rc = dl_err(DL_ERANGE, "%s:%d: more than %d [fault] sections", path, lineno,
                                    DL_SC_MAX_FAULT_SECTIONS);
                    if (!dup && !rc) {
                        dl_sc_fault *fs = &sc->fault[sc->n_fault++];
                        dl_cfg_defaults(fault_t, NT(fault_t), fs);
                        snprintf(fs->name, sizeof fs->name, "%s", name);
                        obj = fs, t = fault_t, tn = NT(fault_t);
                    }
                }
                if (dup) rc = dl_err(DL_EINVAL, "%s:%d: a second [%s %s]", path, lineno, type, name);
            } else {
                rc = dl_err(DL_EINVAL, "%s:%d: unknown section [%s] (run, sync, learners, dc NAME, learner NAME, fault NAME, sim)",
                            path, lineno, type);
            }
            if (!rc && !strcmp(type, "learners") && sc->n_learner)
                rc = dl_err(DL_EINVAL, "%s:%d: [learners] (the defaults) must come before every [learner NAME]", path,
                            lineno);
            continue;
        }
        if (!obj) {
            rc = dl_err(DL_EINVAL, "%s:%d: key outside a section", path, lineno);
            break;
        }
        rc = set_key(t, tn, obj, path, lineno, sec, ka, kb);
    }
    dl_ini_close(&r);
    if (rc) return rc;
    if (!*sc->run.name) {
        const char *b = strrchr(path, '/');
        b = b ? b + 1 : path;
        snprintf(sc->run.name, sizeof sc->run.name, "%.*s", (int)strcspn(b, "."), b);
    }
    if (!valid_name(sc->run.name))
        return dl_err(DL_EINVAL, "%s: [run] name '%s' must be 1-%d of [A-Za-z0-9_-] (it names the report; the default is "
                      "the file's name)", path, sc->run.name, DL_SC_NAME - 9);
    if (ov && ov->duration_s >= 0) {
        char v[64];
        snprintf(v, sizeof v, "%.17g", ov->duration_s);
        DL_TRY(set_key(run_t, NT(run_t), &sc->run, path, 0, "run (--duration_s)", "duration_s", v));
    }
    if (ov && ov->seed >= 0) sc->run.seed = ov->seed;
    return validate(sc);
}
