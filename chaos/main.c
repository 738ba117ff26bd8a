/* dloco-chaos: run a scenario's faults against real dloco processes, once
 * per policy and optionally without faults, and report goodput and badput. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chaos/account.h"
#include "chaos/net.h"
#include "chaos/report.h"
#include "chaos/rogue.h"
#include "chaos/run.h"
#include "chaos/scenario.h"
#include "core/err.h"
#include "core/log.h"

#define MAX_RUNS 8

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dloco-chaos run SCENARIO --out DIR [--compare P1,P2,...] [--baseline[=P1,...]]\n"
            "                       [--no-netns] [--bin BUILD_DIR] [--duration_s S] [--seed N]\n"
            "       dloco-chaos timeline SCENARIO [--seed N]   validate SCENARIO, print its fault timeline\n"
            "       dloco-chaos report DIR                     write DIR's report again from its run directories\n"
            "       dloco-chaos keys                           every scenario section and key: type, unit, default, range\n"
            "  run       start a synchronizer and the scenario's learners as processes, apply the fault\n"
            "            timeline, write DIR/<policy>/ (event logs, store, timeline.tsv) and DIR/report.md,\n"
            "            report.json, plots/*.svg (docs/CHAOS.md)\n"
            "  --compare the policies to run, one after the other, with the same seed and timeline\n"
            "            (decoupled, sync-elastic, sync; default: the scenario's [run] policy)\n"
            "  --baseline also a failure-free twin of each policy run (or of the listed ones): the\n"
            "            loss cost of the faults\n"
            "  --no-netns  loopback and the relay only, even as root (datacenters are network\n"
            "            namespaces with tc tbf links when root can make them)\n"
            "  --bin     the build directory holding synchronizer/dloco-sync, learner/dloco-learner,\n"
            "            tools/dloco (default: the one this program was built in)\n");
}

static void on_signal(int sig)
{
    (void)sig;
    dl_chaos_interrupted = 1;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "dloco-chaos: %s: %s\n", what, *dl_errmsg() ? dl_errmsg() : dl_strerror(rc));
    return 2;
}

/* Comma-separated policies, each one of the three, no repeats. */
static int policies(const char *list, char out[][32], int max, int *n)
{
    *n = 0;
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", list);
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "decoupled") && strcmp(t, "sync-elastic") && strcmp(t, "sync"))
            return dl_err(DL_EINVAL, "policy '%s': decoupled, sync-elastic or sync", t);
        for (int i = 0; i < *n; i++)
            if (!strcmp(out[i], t)) return dl_err(DL_EINVAL, "policy '%s' given twice", t);
        if (*n == max) return dl_err(DL_ERANGE, "at most %d policies", max);
        snprintf(out[(*n)++], 32, "%s", t);
    }
    if (!*n) return dl_err(DL_EINVAL, "no policy in '%s'", list);
    return 0;
}

static int write_report(const char *out, const char *name, char labels[][48], int n)
{
    dl_account *acc[MAX_RUNS * 2] = {0};
    const char *lab[MAX_RUNS * 2];
    int rc = 0, k = 0;
    for (int i = 0; i < n; i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", out, labels[i]);
        if ((rc = dl_account_run(dir, &acc[k]))) {
            fprintf(stderr, "dloco-chaos: %s: %s (left out of the report)\n", dir, dl_errmsg());
            rc = 0;
            continue;
        }
        lab[k++] = labels[i];
    }
    if (!k) rc = dl_err(DL_ENOTFOUND, "no run directory in %s could be read", out);
    else rc = dl_report_write(out, name, lab, acc, k);
    for (int i = 0; i < k; i++) dl_account_close(&acc[i]);
    return rc;
}

static int cmd_run(int argc, char **argv, const char *self)
{
    const char *scen = NULL, *out = NULL, *compare = NULL, *base = NULL, *bin = NULL;
    int no_netns = 0;
    dl_sc_overrides ov = {.duration_s = -1, .seed = -1};
    char *end = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(a, "--compare") && i + 1 < argc) compare = argv[++i];
        else if (!strcmp(a, "--baseline")) base = "";
        else if (!strncmp(a, "--baseline=", 11)) base = a + 11;
        else if (!strcmp(a, "--no-netns")) no_netns = 1;
        else if (!strcmp(a, "--bin") && i + 1 < argc) bin = argv[++i];
        else if (!strcmp(a, "--duration_s") && i + 1 < argc) {
            ov.duration_s = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(ov.duration_s >= 0)) {
                fprintf(stderr, "dloco-chaos run: --duration_s '%s': seconds, a number >= 10\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            errno = 0;
            ov.seed = strtoll(argv[++i], &end, 10);
            if (end == argv[i] || *end || errno || ov.seed < 0) {
                fprintf(stderr, "dloco-chaos run: --seed '%s': an integer >= 0\n", argv[i]);
                return 2;
            }
        }
        else if (a[0] == '-') {
            fprintf(stderr, "dloco-chaos run: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!scen) scen = a;
        else {
            fprintf(stderr, "dloco-chaos run: one scenario, got '%s' too\n", a);
            return 2;
        }
    }
    if (!scen || !out) {
        usage(stderr);
        return 2;
    }
    static dl_scenario sc;
    static dl_timeline tl, twin;
    int rc = dl_scenario_load(scen, &ov, &sc);
    if (rc) return fail("scenario", rc);
    if ((rc = dl_timeline_build(&sc, 1, &tl)) || (rc = dl_timeline_build(&sc, 0, &twin))) return fail("timeline", rc);
    char pol[MAX_RUNS][32], bpol[MAX_RUNS][32];
    int np = 0, nb = 0;
    if ((rc = policies(compare ? compare : sc.run.policy, pol, MAX_RUNS, &np))) return fail("--compare", rc);
    if (base && *base && (rc = policies(base, bpol, MAX_RUNS, &nb))) return fail("--baseline", rc);
    if (base && !*base) {
        memcpy(bpol, pol, sizeof pol);
        nb = np;
    }
    for (int i = 0; i < nb; i++) {
        int in = 0;
        for (int j = 0; j < np; j++) in |= !strcmp(bpol[i], pol[j]);
        if (!in) return fail("--baseline", dl_err(DL_EINVAL, "'%s' is not one of the compared policies", bpol[i]));
    }
    char bindir[PATH_MAX];
    if (bin) snprintf(bindir, sizeof bindir, "%s", bin);
    else {
        /* <build>/chaos/dloco-chaos -> <build> */
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return fail("--bin", dl_err(DL_EIO, "cannot read /proc/self/exe; give --bin"));
        exe[n] = 0;
        char *s = strrchr(exe, '/');
        if (s) *s = 0;
        s = strrchr(exe, '/');
        if (s) *s = 0;
        snprintf(bindir, sizeof bindir, "%s", exe);
    }
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/synchronizer/dloco-sync", bindir);
    if (access(probe, X_OK)) return fail("--bin", dl_err(DL_ENOTFOUND, "%s is not an executable", probe));
    if (mkdir(out, 0755) && errno != EEXIST) return fail("--out", dl_err(DL_EIO, "mkdir %s: %s", out, strerror(errno)));
    char tpath[PATH_MAX];
    snprintf(tpath, sizeof tpath, "%s/timeline.tsv", out);
    if ((rc = dl_timeline_write(&tl, tpath))) return fail("timeline", rc);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int netns = 0;
    if (!no_netns) {
        dl_net_sweep();
        char why[512] = "";
        netns = dl_net_probe(why, sizeof why);
        if (!netns)
            printf("dloco-chaos: network namespaces are not available (%s): running on loopback, the relay alone "
                   "emulating bandwidth and partitions\n",
                   why);
    } else {
        printf("dloco-chaos: --no-netns: running on loopback, the relay alone emulating bandwidth and partitions\n");
    }
    char labels[MAX_RUNS * 2][48];
    int nl = 0;
    for (int i = 0; i < np && !dl_chaos_interrupted; i++) {
        for (int twin_run = 0; twin_run < 2 && !dl_chaos_interrupted; twin_run++) {
            int want = !twin_run;
            for (int j = 0; twin_run && j < nb; j++) want |= !strcmp(bpol[j], pol[i]);
            if (!want) continue;
            snprintf(labels[nl], sizeof labels[nl], "%s%s", pol[i], twin_run ? "-baseline" : "");
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s/%s", out, labels[nl]);
            dl_chaos_run_cfg c = {.sc = &sc,
                                  .tl = twin_run ? &twin : &tl,
                                  .policy = pol[i],
                                  .label = labels[nl],
                                  .baseline = twin_run,
                                  .dir = dir,
                                  .bin = bindir,
                                  .self = self,
                                  .netns = netns,
                                  .tag = (int)getpid()};
            rc = dl_chaos_run(&c);
            if (rc && !dl_chaos_interrupted) return fail(labels[nl], rc);
            nl++;
        }
    }
    if (dl_chaos_interrupted) {
        fprintf(stderr, "dloco-chaos: interrupted; everything it started was stopped\n");
        return 130;
    }
    if ((rc = write_report(out, sc.run.name, labels, nl))) return fail("report", rc);
    printf("dloco-chaos: report in %s/report.md (and report.json, plots/)\n", out);
    return 0;
}

static int cmd_report(const char *out)
{
    /* every sub-directory with an events-chaos.log, in the order runs are made */
    static const char *const order[] = {"decoupled", "decoupled-baseline", "sync-elastic", "sync-elastic-baseline",
                                        "sync", "sync-baseline"};
    char labels[MAX_RUNS * 2][48];
    int n = 0;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s/events-chaos.log", out, order[i]);
        if (access(p, R_OK) == 0) snprintf(labels[n++], sizeof labels[0], "%s", order[i]);
    }
    if (!n) return fail("report", dl_err(DL_ENOTFOUND, "no run directory (DIR/<policy>/events-chaos.log) in %s", out));
    /* the scenario's name from the first run's run_start */
    char name[128] = "scenario", p[PATH_MAX], line[4200];
    snprintf(p, sizeof p, "%s/%s/events-chaos.log", out, labels[0]);
    FILE *f = fopen(p, "r");
    if (f && fgets(line, sizeof line, f)) {
        const char *s = strstr(line, " scenario=");
        if (s) snprintf(name, sizeof name, "%.*s", (int)strcspn(s + 10, " \n"), s + 10);
    }
    if (f) fclose(f);
    int rc = write_report(out, name, labels, n);
    if (rc) return fail("report", rc);
    printf("dloco-chaos: report in %s/report.md\n", out);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    dl_log_set_name("chaos"); /* its events' echo on stderr (core/event.h) */
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) snprintf(self, sizeof self, "%s", argv[0]);
    else self[n] = 0;
    if (!strcmp(argv[1], "run")) return cmd_run(argc - 2, argv + 2, self);
    if (!strcmp(argv[1], "timeline") && argc >= 3) {
        static dl_scenario sc;
        static dl_timeline tl;
        dl_sc_overrides tov = {.duration_s = -1, .seed = -1};
        if (argc >= 5 && !strcmp(argv[3], "--seed")) {
            char *e = NULL;
            tov.seed = strtoll(argv[4], &e, 10);
            if (e == argv[4] || *e || tov.seed < 0) {
                fprintf(stderr, "dloco-chaos timeline: --seed '%s': an integer >= 0\n", argv[4]);
                return 2;
            }
        }
        int rc = dl_scenario_load(argv[2], &tov, &sc);
        if (rc) return fail("scenario", rc);
        if ((rc = dl_timeline_build(&sc, 1, &tl))) return fail("timeline", rc);
        printf("# %s: %d learners, %d datacenters, %.0f s, seed %lld, %d faults\n", sc.run.name, tl.n_slot, sc.n_dc,
               sc.run.duration_s, (long long)sc.run.seed, tl.n_ev);
        dl_timeline_print(&tl, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "report") && argc == 3) return cmd_report(argv[2]);
    if (!strcmp(argv[1], "keys") && argc == 2) {
        dl_scenario_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "rogue") && argc == 6) {
        /* the rogue client's own process (started by a run for rogue_garbage) */
        dl_rogue_stats st;
        int rc = dl_rogue_garbage(argv[2], atoi(argv[3]), atoi(argv[4]), strtoull(argv[5], NULL, 10), &st);
        printf("rogue: %d raw connections, %d ZeroMQ messages (%d protobuf-shaped) to %s:%s\n", st.raw_conns,
               st.zmq_msgs, st.envelopes, argv[2], argv[3]);
        return rc ? fail("rogue", rc) : 0;
    }
    usage(stderr);
    return 2;
}
