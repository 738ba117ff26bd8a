/* Chaos scenario files: every bad value, key, section and reference gets a
 * refusal that names file:line or the section; the shipped scenarios load;
 * the timeline is deterministic for a seed, random streams independent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chaos/scenario.h"
#include "core/err.h"
#include "tests/check.h"

static char path[256];

static const char *BASE = "[run]\nduration_s = 100\n[dc east]\nrtt_ms = 10\n[learner a]\ndc = east\ncount = 2\n";

/* Load BASE + extra; returns the code, the message in msg. */
static int load(const char *extra, dl_scenario *sc, char *msg, size_t cap)
{
    FILE *f = fopen(path, "w");
    fprintf(f, "%s%s", extra && !strncmp(extra, "!", 1) ? "" : BASE, extra ? extra + (extra[0] == '!') : "");
    fclose(f);
    int rc = dl_scenario_load(path, NULL, sc);
    snprintf(msg, cap, "%s", rc ? dl_errmsg() : "");
    return rc;
}

static void refused(const char *extra, const char *want)
{
    static dl_scenario sc;
    char msg[1024];
    int rc = load(extra, &sc, msg, sizeof msg);
    CHECK(rc != 0 && strstr(msg, want), "'%s' -> rc %d '%s' (want '%s')", extra, rc, msg, want);
}

static void test_refusals(void)
{
    refused("[run]\nduration_s = 5\n", "duration_s");                  /* below its bound */
    refused("[run]\nduration_s = abc\n", ":9:");                       /* file:line of the bad value */
    refused("[run]\npolicy = ddp\n", "policy");
    refused("[run]\nbogus = 1\n", "unknown key 'bogus'");
    refused("[weird]\n", "unknown section [weird]");
    refused("[sim]\nmode = spmd\n", "mode");                           /* dloco-sim's section: typed too */
    refused("[sim]\nstep_cv = 3\n", "step_cv");
    refused("[sim]\nlearners = 4\n", "[sim] learners 4 needs chips");
    refused("[sim]\nchips = 4\nlearners = 8\n", "[sim] learners 8 > chips 4");
    refused("[sim]\nchips = 4\nslice_chips = 8\n", "[sim] slice_chips 8 > chips 4");
    refused("[sim]\nbogus = 1\n", "unknown key 'bogus'");
    refused("[dc]\n", "NAME");                                         /* a named section without a name */
    refused("[dc bad/name]\n", "must be 1-");                           /* names go into ids and paths */
    refused("[run extra]\n", "takes no name");
    refused("[dc east]\n", "a second [dc east]");
    refused("[learner b]\ndc = nowhere\n", "is not a [dc NAME] section");
    refused("[learner b]\ndc = east\nspeed = 0\n", "speed");
    refused("[learner b]\ndc = east\njoin_s = 200\n", "join_s/leave_s must be inside");
    refused("[learner b]\ndc = east\njoin_s = 50\nleave_s = 40\n", "is not after join_s");
    refused("[learners]\nbatch = 4\n", "must come before every [learner NAME]");
    refused("[fault f]\nkind = meteor\ntarget = a0\nat_s = 10\n", "kind 'meteor' unknown");
    refused("[fault f]\nkind = learner_join\ntarget = a0\nat_s = 10\n", "joins are a learner's join_s");
    refused("[fault f]\nkind = learner_kill\nat_s = 10\nduration_s = 1\n", "needs a target");
    refused("[fault f]\nkind = sync_kill\ntarget = a0\nat_s = 10\nduration_s = 1\n", "target = sync");
    refused("[fault f]\nkind = partition\ntarget = west\nat_s = 10\nduration_s = 1\n", "is not a datacenter");
    refused("[fault f]\nkind = learner_kill\ntarget = a0\nduration_s = 1\n", "neither");
    refused("[fault f]\nkind = learner_kill\ntarget = a0\nat_s = 1\nmtbf_s = 5\nduration_s = 1\n", "both");
    refused("[fault f]\nkind = learner_kill\ntarget = a0\nat_s = 100\nduration_s = 1\n", "not inside duration_s");
    refused("[fault f]\nkind = learner_hang\ntarget = a0\nat_s = 10\n", "duration_s > 0");
    refused("[fault f]\nkind = learner_slow\ntarget = a0\nat_s = 10\nduration_s = 5\nvalue = 1.5\n", "fraction");
    refused("[fault f]\nkind = loss\ntarget = east\nat_s = 10\nduration_s = 5\nvalue = 2\n", "probability");
    refused("[fault f]\nkind = bandwidth\ntarget = east\nat_s = 10\nduration_s = 5\n", "Mbit/s >= 0.01");
    refused("[run]\nname = my test\n", "name 'my test' must be");
    refused("[dc west]\nbandwidth_mbit = 0.001\n", "0 (unshaped) or >= 0.01");
    {
        /* a --duration_s override is validated like the file's value, with every rule after it */
        static dl_scenario sc;
        FILE *f = fopen(path, "w");
        fprintf(f, "%s[learner j]\ndc = east\njoin_s = 80\n", BASE);
        fclose(f);
        dl_sc_overrides ov = {.duration_s = 60, .seed = -1};
        CHECK(dl_scenario_load(path, &ov, &sc) != 0 && strstr(dl_errmsg(), "join_s/leave_s must be inside"), "%s",
              dl_errmsg());
        ov.duration_s = 5;
        CHECK(dl_scenario_load(path, &ov, &sc) != 0 && strstr(dl_errmsg(), "--duration_s"), "%s", dl_errmsg());
        ov.duration_s = 200;
        ov.seed = 42;
        CHECK(dl_scenario_load(path, &ov, &sc) == 0 && sc.run.duration_s == 200 && sc.run.seed == 42, "%s",
              dl_errmsg());
    }
    refused("[fault f]\nkind = delay\ntarget = east\nat_s = 10\nduration_s = 5\nvalue = 20000\n", "extra RTT");
    refused("[fault f]\nkind = rogue_garbage\nat_s = 10\nvalue = 2.5\n", "message count");
    refused("[fault f]\nkind = learner_kill\ntarget = a0\nat_s = 10\nduration_s = 1\nvalue = 3\n", "takes no value");
    refused("[fault f]\nkind = learner_kill\ntarget = *\nmtbf_s = 10\nrepair_s = 0\n", "repair_s > 0");
    refused("[fault f]\nkind = learner_kill\ntarget = *\nmtbf_s = 10\nstart_s = 95\n", "window");
    refused("[fault f]\nkind = learner_kill\ntarget = *\nmtbf_s = 10\nrepair = uniform\nrepair_min_s = 5\nrepair_s = 2\n",
            "repair_min_s");
    refused("!", "no [learner NAME] section");
    refused("![learner a]\n", "no [dc NAME] section");
    char longline[1200];
    memset(longline, 'x', sizeof longline - 2);
    longline[sizeof longline - 2] = '\n';
    longline[sizeof longline - 1] = 0;
    refused(longline, "line longer than");
    /* a learner id a fault names must exist: checked when the timeline is built */
    static dl_scenario sc;
    static dl_timeline tl;
    char msg[512];
    REQUIRE(load("[fault f]\nkind = learner_kill\ntarget = zz\nat_s = 10\nduration_s = 1\n", &sc, msg, sizeof msg) == 0,
            "%s", msg);
    CHECK(dl_timeline_build(&sc, 1, &tl) != 0 && strstr(dl_errmsg(), "is not a learner id"), "%s", dl_errmsg());
}

static void test_timeline(void)
{
    static dl_scenario sc;
    static dl_timeline t1, t2, t3, twin;
    char msg[512];
    const char *faults = "[learner j]\ndc = east\njoin_s = 30\nleave_s = 60\n"
                         "[fault k]\nkind = learner_kill\ntarget = *\nmtbf_s = 20\nrepair_s = 3\n"
                         "[fault p]\nkind = partition\ntarget = east\nat_s = 50\nduration_s = 5\n";
    REQUIRE(load(faults, &sc, msg, sizeof msg) == 0, "%s", msg);
    REQUIRE(dl_timeline_build(&sc, 1, &t1) == 0, "%s", dl_errmsg());
    REQUIRE(dl_timeline_build(&sc, 1, &t2) == 0, "%s", dl_errmsg());
    CHECK_EQ(t1.n_slot, 3);
    CHECK(!strcmp(t1.slot[0].id, "a0") && !strcmp(t1.slot[1].id, "a1") && !strcmp(t1.slot[2].id, "j"), "ids");
    CHECK(t1.n_ev > 4 && t1.n_ev == t2.n_ev && !memcmp(t1.ev, t2.ev, sizeof t1.ev[0] * (size_t)t1.n_ev),
          "the same seed gives the same timeline (%d events)", t1.n_ev);
    int kills = 0, joins = 0, leaves = 0, parts = 0;
    for (int i = 0; i < t1.n_ev; i++) {
        const dl_sc_event *e = &t1.ev[i];
        CHECK_EQ(e->n, i);
        if (i) CHECK(e->at_s >= t1.ev[i - 1].at_s, "sorted by time");
        CHECK(e->at_s >= 0 && e->at_s < 100, "inside the run: %g", e->at_s);
        kills += e->kind == DL_FK_LEARNER_KILL;
        joins += e->kind == DL_FK_LEARNER_JOIN;
        leaves += e->kind == DL_FK_LEARNER_LEAVE;
        parts += e->kind == DL_FK_PARTITION;
        if (e->kind == DL_FK_LEARNER_KILL) CHECK(e->duration_s >= 0.5, "a repair time: %g", e->duration_s);
    }
    CHECK(kills > 0 && joins == 1 && leaves == 1 && parts == 1, "kills %d joins %d leaves %d partitions %d", kills,
          joins, leaves, parts);
    /* a random stream's failures of one target never overlap its repairs */
    for (int s = 0; s < t1.n_slot; s++) {
        double free_at = 0;
        for (int i = 0; i < t1.n_ev; i++) {
            const dl_sc_event *e = &t1.ev[i];
            if (e->kind != DL_FK_LEARNER_KILL || strcmp(e->target, t1.slot[s].id)) continue;
            CHECK(e->at_s >= free_at, "%s killed at %g before its repair ended at %g", e->target, e->at_s, free_at);
            free_at = e->at_s + e->duration_s;
        }
    }
    /* another seed, another timeline; the failure-free twin keeps only joins and leaves */
    sc.run.seed = 999;
    REQUIRE(dl_timeline_build(&sc, 1, &t3) == 0, "%s", dl_errmsg());
    CHECK(t3.n_ev != t1.n_ev || memcmp(t1.ev, t3.ev, sizeof t1.ev[0] * (size_t)t1.n_ev), "a new seed changes it");
    REQUIRE(dl_timeline_build(&sc, 0, &twin) == 0, "%s", dl_errmsg());
    CHECK_EQ(twin.n_ev, 2);
    /* adding a fault section leaves the other streams' draws unchanged */
    sc.run.seed = 1;
    REQUIRE(dl_timeline_build(&sc, 1, &t1) == 0, "%s", dl_errmsg());
    REQUIRE(load("[learner j]\ndc = east\njoin_s = 30\nleave_s = 60\n"
                 "[fault k]\nkind = learner_kill\ntarget = *\nmtbf_s = 20\nrepair_s = 3\n"
                 "[fault p]\nkind = partition\ntarget = east\nat_s = 50\nduration_s = 5\n"
                 "[fault h]\nkind = learner_hang\ntarget = a1\nmtbf_s = 30\nrepair_s = 2\n",
                 &sc, msg, sizeof msg) == 0,
            "%s", msg);
    REQUIRE(dl_timeline_build(&sc, 1, &t2) == 0, "%s", dl_errmsg());
    int same = 1, k1 = 0, k2 = 0;
    for (int i = 0, j = 0; i < t1.n_ev && j < t2.n_ev;) {
        while (i < t1.n_ev && t1.ev[i].kind != DL_FK_LEARNER_KILL) i++;
        while (j < t2.n_ev && t2.ev[j].kind != DL_FK_LEARNER_KILL) j++;
        if (i == t1.n_ev || j == t2.n_ev) break;
        same &= t1.ev[i].at_s == t2.ev[j].at_s && !strcmp(t1.ev[i].target, t2.ev[j].target);
        i++, j++, k1++, k2++;
    }
    CHECK(same && k1 > 0, "the kill stream did not move when a hang stream was added (%d kills)", k1);
    /* timeline.tsv */
    char tsv[300];
    snprintf(tsv, sizeof tsv, "%s.tsv", path);
    REQUIRE(dl_timeline_write(&t2, tsv) == 0, "%s", dl_errmsg());
    FILE *f = fopen(tsv, "r");
    char line[512];
    int rows = 0;
    while (fgets(line, sizeof line, f)) rows++;
    fclose(f);
    unlink(tsv);
    CHECK_EQ(rows, t2.n_ev + 1);
}

static void test_shipped(void)
{
    const char *src = getenv("DLOCO_SRC");
    static const char *const files[] = {"ci.ini", "goodput.ini", "hetero.ini", "crosscheck.ini"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/chaos/scenarios/%s", src ? src : ".", files[i]);
        static dl_scenario sc;
        static dl_timeline t;
        int rc = dl_scenario_load(p, NULL, &sc);
        CHECK(rc == 0, "%s: %s", p, dl_errmsg());
        if (rc) continue;
        rc = dl_timeline_build(&sc, 1, &t);
        CHECK(rc == 0, "%s: timeline: %s", p, dl_errmsg());
        /* hetero.ini is failure-free on purpose (it compares schedules, not faults) */
        if (strcmp(files[i], "hetero.ini")) CHECK(t.n_ev > 0, "%s: no fault in the timeline", p);
        if (!strcmp(files[i], "ci.ini")) {
            /* the CI scenario has every fault kind */
            int seen[DL_FK_N] = {0}, kinds = 0;
            for (int e = 0; e < t.n_ev; e++) seen[t.ev[e].kind] = 1;
            for (int k = 0; k < DL_FK_N; k++) {
                kinds += seen[k];
                CHECK(seen[k], "ci.ini has no %s", dl_fault_kind_name((dl_fault_kind)k));
            }
            CHECK_EQ(kinds, DL_FK_N);
        }
    }
}

int main(void)
{
    snprintf(path, sizeof path, "/tmp/dloco_test_scenario_%d.ini", (int)getpid());
    test_refusals();
    test_timeline();
    test_shipped();
    unlink(path);
    printf("test_scenario: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
