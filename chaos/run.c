/* One chaos run: start the synchronizer and learners as processes (learners
 * of a namespaced datacenter inside it), put each datacenter's connections
 * through its relay, apply the timeline, supervise, stop, evaluate, check. */
#include "chaos/run.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chaos/logfmt.h"
#include "chaos/net.h"
#include "chaos/relay.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"

volatile int dl_chaos_interrupted;

#define TICK_MS 5
#define DUTY_PERIOD_NS 100000000LL /* a slow learner's stop/run cycle: CFS's default quota period */
#define PROGRESS_NS 5000000000LL
#define MAX_UNPLANNED 5 /* restarts of one slot after exits nobody asked for */

/* A supervised process (a learner slot's or the synchronizer's) and the kill
 * and hang faults on it: one path for both (proc_spawned, kill_begin/end,
 * hang_begin/end). */
typedef struct {
    pid_t pid;          /* 0: not running */
    int expected;       /* the harness asked the running process to end */
    int hung;           /* hang faults in force (overlapping ones nest: SIGCONT when the last ends) */
    int kills;          /* kill faults in force: restarted when the last ends */
    int64_t restart_ns; /* > 0: start an incarnation then */
} proc_t;

typedef struct {
    char id[64];
    int section, dc, data_shard;
    int provisioned; /* slot_begin written, slot_end not yet */
    int left;
    proc_t p;
    int inc;      /* incarnations started */
    int slow_n;  /* slow-downs in force */
    double slow; /* fraction of time it may run (0 = not slowed): the latest slow-down's */
    int duty_off;
    int64_t duty_next_ns;
    int unplanned;
    char state[16];
    int replaced_by; /* churn: the slot that took its place, or -1 */
} slot_t;

typedef struct {
    int64_t at_ns;
    int ev; /* index into the timeline */
} pend_t;

typedef struct {
    const dl_chaos_run_cfg *c;
    const dl_scenario *sc;
    const dl_timeline *tl;
    int64_t t0;
    slot_t slot[DL_SC_MAX_SLOTS];
    int n_slot;
    proc_t sync; /* the synchronizer */
    int sinc, s_unplanned;
    int sync_port;
    int fiu;
    char fiu_prefix[300];
    /* disk faults: what the synchronizer should have armed (want_*) and what
     * it has (armed_pid: the process libfiu was armed in). fiu-ctrl talks to a
     * thread of the process, so nothing is sent while it is stopped; a
     * restarted synchronizer is armed again once its control fifo exists. */
    int disk_n;
    double disk_p;
    int disk_errno;
    pid_t armed_pid;
    int armed;
    dl_net_dc net[DL_SC_MAX_DCS];
    dl_relay *relay[DL_SC_MAX_DCS];
    dl_relay_impair base[DL_SC_MAX_DCS], cur[DL_SC_MAX_DCS];
    int partitioned[DL_SC_MAX_DCS];
    int imp_n[DL_SC_MAX_DCS][DL_FK_N]; /* link faults of each kind in force per datacenter */
    int next_ev;
    pend_t pend[DL_SC_MAX_FAULTS];
    int n_pend;
    int applied;
    pid_t epid;
    double last_loss;
    long sync_off;
    long merges;
    double merged_compute_s;
    int unplanned_exits;
    int churns;
    pid_t rogue[32]; /* rogue clients still running (0: a free entry) */
    char path[700];
} run_t;

// ----------------------------------------------------------------------------
// processes

static double now_s(const run_t *r) { return (double)(dl_clock_ns() - r->t0) * 1e-9; }

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct {
    char *v[160];
    int n;
} argv_t;

static void arg(argv_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arg(argv_t *a, const char *fmt, ...)
{
    if (a->n >= (int)(sizeof a->v / sizeof a->v[0]) - 1) return;
    char buf[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    a->v[a->n++] = strdup(buf);
    a->v[a->n] = NULL;
}

/* Flags written in a scenario's `args`, split on blanks. */
static void args_split(argv_t *a, const char *s)
{
    char tmp[DL_CFG_STRLEN];
    snprintf(tmp, sizeof tmp, "%s", s);
    for (char *save = NULL, *t = strtok_r(tmp, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) arg(a, "%s", t);
}

static void argv_free(argv_t *a)
{
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    a->n = 0;
}

/* fork + exec with stdout/stderr appended to `log`. The harness has relay
 * threads, so the child does only async-signal-safe calls before exec: the
 * files are opened and the environment set before the fork. Returns the
 * pid, or -1 (fork failed: the reason in dl_errmsg()). */
static pid_t spawn(argv_t *a, const char *log, int threads)
{
    fflush(stdout);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int dn = open("/dev/null", O_RDONLY | O_CLOEXEC);
    char t[16];
    snprintf(t, sizeof t, "%d", threads > 0 ? threads : 1);
    if (threads > 0) setenv("OMP_NUM_THREADS", t, 1); /* every child of the harness is told; none reads it but OpenMP */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* nothing outlives a harness that died */
        if (getppid() != parent) _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        if (dn >= 0) dup2(dn, 0);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2); /* dup2 clears O_CLOEXEC on the copies */
        execvp(a->v[0], a->v);
        static const char msg[] = "dloco-chaos: exec failed\n";
        if (write(2, msg, sizeof msg - 1) < 0) {}
        _exit(127);
    }
    int err = errno;
    if (fd >= 0) close(fd);
    if (dn >= 0) close(dn);
    if (pid < 0) dl_err(DL_EIO, "fork %s: %s", a->v[0], strerror(err));
    argv_free(a);
    return pid < 0 ? -1 : pid;
}

static const char *runpath(run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *runpath(run_t *r, const char *fmt, ...)
{
    char name[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(r->path, sizeof r->path, "%s/%s", r->c->dir, name);
    return r->path;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* After spawn: a process that did not start is retried in 1 s; one started
 * while a hang is in force is hung too. 0 when it runs. */
static int proc_spawned(run_t *r, proc_t *p, pid_t pid)
{
    p->pid = pid;
    p->expected = 0;
    p->restart_ns = 0;
    if (pid < 0) {
        printf("[chaos %s] %s: retrying in 1 s\n", r->c->label, dl_errmsg());
        p->pid = 0;
        p->restart_ns = dl_clock_ns() + 1000000000LL;
        return -1;
    }
    if (p->hung) kill(p->pid, SIGSTOP);
    return 0;
}

/* A kill fault: SIGKILL now (an expected exit); no restart until the last
 * kill in force ends. */
static void kill_begin(proc_t *p)
{
    p->kills++;
    if (p->pid > 0) {
        p->expected = 1;
        kill(p->pid, SIGKILL);
    }
    p->restart_ns = 0;
}

/* Its end: the last one restarts the process (when restart allows it and
 * the run goes on); what happened, for the fault's end event. */
static const char *kill_end(proc_t *p, int restart, int at_end)
{
    if (p->kills > 0 && --p->kills == 0 && restart && !at_end) p->restart_ns = dl_clock_ns();
    return at_end ? "not restarted: the run ends" : p->kills ? "still killed by another fault" : "restarted";
}

/* A hang fault: SIGSTOP at the first in force, SIGCONT when the last ends
 * (unless resume is 0: something else keeps it stopped). */
static void hang_begin(proc_t *p)
{
    if (p->hung++ == 0 && p->pid > 0) kill(p->pid, SIGSTOP);
}

static void hang_end(proc_t *p, int resume)
{
    if (p->hung > 0 && --p->hung == 0 && p->pid > 0 && resume) kill(p->pid, SIGCONT);
}

/* The run's model, the same for the synchronizer and every learner. */
static void model_args(argv_t *a, const dl_scenario *sc)
{
    arg(a, "--n_layer"), arg(a, "%lld", (long long)sc->run.n_layer);
    arg(a, "--n_head"), arg(a, "%lld", (long long)sc->run.n_head);
    arg(a, "--n_embd"), arg(a, "%lld", (long long)sc->run.n_embd);
    arg(a, "--seq_len"), arg(a, "%lld", (long long)sc->run.seq_len);
    arg(a, "--vocab"), arg(a, "%lld", (long long)sc->run.vocab);
    arg(a, "--fragments"), arg(a, "%lld", (long long)sc->run.fragments);
}

static void start_sync(run_t *r)
{
    const dl_scenario *sc = r->sc;
    argv_t a = {0};
    if (r->fiu) {
        arg(&a, "fiu-run");
        arg(&a, "-x");
        arg(&a, "-f");
        arg(&a, "%s", r->fiu_prefix);
    }
    arg(&a, "%s/synchronizer/dloco-sync", r->c->bin);
    arg(&a, "--store"), arg(&a, "%s/store", r->c->dir);
    arg(&a, "--bind"), arg(&a, "tcp://127.0.0.1:%d", r->sync_port);
    model_args(&a, sc);
    arg(&a, "--H"), arg(&a, "%lld", (long long)sc->run.H);
    arg(&a, "--policy"), arg(&a, "%s", r->c->policy);
    arg(&a, "--heartbeat_ms"), arg(&a, "%lld", (long long)sc->sync.heartbeat_ms);
    arg(&a, "--liveness"), arg(&a, "%lld", (long long)sc->sync.liveness);
    arg(&a, "--quorum"), arg(&a, "%lld", (long long)sc->sync.quorum);
    arg(&a, "--max_staleness"), arg(&a, "%lld", (long long)sc->sync.max_staleness);
    arg(&a, "--chunk_kb"), arg(&a, "%lld", (long long)sc->sync.chunk_kb);
    arg(&a, "--push_chunk_max_kb"), arg(&a, "%lld", (long long)sc->sync.push_chunk_max_kb);
    arg(&a, "--durability"), arg(&a, "%s", sc->sync.durability);
    arg(&a, "--outer_lr"), arg(&a, "%g", sc->sync.outer_lr);
    arg(&a, "--outer_momentum"), arg(&a, "%g", sc->sync.outer_momentum);
    arg(&a, "--status_every_ms"), arg(&a, "5000");
    arg(&a, "--events"), arg(&a, "%s/events-sync.log", r->c->dir);
    /* the synchronizer's own evaluation, on the sequences the harness's dloco eval uses (report: sync_eval) */
    arg(&a, "--eval_every_s"), arg(&a, "%lld", sc->run.eval_every_s > 0 ? (long long)ceil(sc->run.eval_every_s) : 0LL);
    arg(&a, "--eval_data"), arg(&a, "%s", sc->run.corpus);
    arg(&a, "--eval_batch"), arg(&a, "8");
    arg(&a, "--eval_seqs"), arg(&a, "%lld", 8 * (long long)sc->run.eval_batches);
    arg(&a, "--metrics"), arg(&a, "127.0.0.1:0");
    args_split(&a, sc->sync.args);
    if (proc_spawned(r, &r->sync, spawn(&a, runpath(r, "sync.log"), 0))) return;
    dl_event("proc_start", "role=sync slot=-1 id=sync child_pid=%d incarnation=%d", (int)r->sync.pid, r->sinc);
    r->sinc++;
}

static void start_learner(run_t *r, int i)
{
    const dl_scenario *sc = r->sc;
    slot_t *s = &r->slot[i];
    const dl_sc_learner *l = &sc->learner[s->section];
    const char *host = r->c->netns ? r->net[s->dc].host_ip : "127.0.0.1";
    argv_t a = {0};
    if (r->c->netns) {
        arg(&a, "ip"), arg(&a, "netns"), arg(&a, "exec"), arg(&a, "%s", r->net[s->dc].ns);
    }
    arg(&a, "%s/learner/dloco-learner", r->c->bin);
    arg(&a, "--connect"), arg(&a, "tcp://%s:%d", host, dl_relay_port(r->relay[s->dc]));
    arg(&a, "--id"), arg(&a, "%s", s->id);
    arg(&a, "--device"), arg(&a, "%s", l->device);
    model_args(&a, sc);
    arg(&a, "--data"), arg(&a, "%s", sc->run.corpus);
    arg(&a, "--batch"), arg(&a, "%lld", (long long)l->batch);
    arg(&a, "--lr"), arg(&a, "%g", l->lr);
    arg(&a, "--threads"), arg(&a, "%lld", (long long)sc->run.threads);
    arg(&a, "--throttle"), arg(&a, "%g", l->speed);
    arg(&a, "--adopt"), arg(&a, "%s", l->adopt);
    arg(&a, "--steps"), arg(&a, "1000000000");
    arg(&a, "--log_every"), arg(&a, "%lld", (long long)sc->run.log_every);
    arg(&a, "--data_shard"), arg(&a, "%d", s->data_shard);
    arg(&a, "--data_shards"), arg(&a, "%d", r->tl->n_slot);
    arg(&a, "--flush_timeout_ms"), arg(&a, "5000");
    arg(&a, "--events"), arg(&a, "%s/events-%s.log", r->c->dir, s->id);
    arg(&a, "--state_dir"), arg(&a, "%s/state", r->c->dir); /* a restarted incarnation resumes its recovery file */
    args_split(&a, l->args);
    s->duty_off = 0;
    if (proc_spawned(r, &s->p, spawn(&a, runpath(r, "%s.log", s->id), (int)sc->run.threads))) return;
    dl_event("proc_start", "role=learner slot=%d id=%s child_pid=%d incarnation=%d", i, s->id, (int)s->p.pid, s->inc);
    s->inc++;
}

static void provision(run_t *r, int i)
{
    slot_t *s = &r->slot[i];
    const dl_sc_learner *l = &r->sc->learner[s->section];
    s->provisioned = 1;
    dl_event("slot_begin", "slot=%d id=%s dc=%s speed=%g batch=%lld", i, s->id, r->sc->dc[s->dc].name, l->speed,
             (long long)l->batch);
    start_learner(r, i);
}

static void unprovision(run_t *r, int i, const char *reason)
{
    slot_t *s = &r->slot[i];
    if (!s->provisioned) return;
    s->provisioned = 0;
    dl_event("slot_end", "slot=%d id=%s reason=%s", i, s->id, reason);
}

/* Ask a process to end: SIGCONT first (a stopped one cannot act on SIGTERM). */
static void end_proc(pid_t pid, int sig)
{
    if (pid <= 0) return;
    kill(pid, SIGCONT);
    kill(pid, sig);
}

static int slot_of(const run_t *r, const char *id)
{
    for (int i = 0; i < r->n_slot; i++)
        if (!strcmp(r->slot[i].id, id)) {
            /* a churned-out learner's faults fall on the one that replaced it */
            int j = i;
            while (!r->slot[j].provisioned && r->slot[j].replaced_by >= 0) j = r->slot[j].replaced_by;
            return j;
        }
    return -1;
}

// ----------------------------------------------------------------------------
// states, links, the synchronizer's events

static void update_states(run_t *r)
{
    for (int i = 0; i < r->n_slot; i++) {
        slot_t *s = &r->slot[i];
        if (!s->provisioned && !s->left) continue;
        const char *st = s->left ? "left"
                         : s->p.pid <= 0 ? "dead"
                         : s->p.hung ? "hung"
                         : r->partitioned[s->dc] ? "partitioned"
                         : s->slow > 0 ? "slow"
                         : "up";
        if (strcmp(st, s->state)) {
            snprintf(s->state, sizeof s->state, "%s", st);
            dl_event("state", "slot=%d id=%s state=%s", i, s->id, st);
        }
    }
}

/* New whole lines of events-sync.log: merges and their compute seconds, and
 * the synchronizer's start (returns 1 when a sync_start of pid was seen). */
static int scan_sync(run_t *r, pid_t pid)
{
    FILE *f = fopen(runpath(r, "events-sync.log"), "r");
    if (!f) return 0;
    int started = 0;
    char line[4200];
    dl_logfmt_line l;
    if (fseek(f, r->sync_off, SEEK_SET) == 0) {
        while (fgets(line, sizeof line, f)) {
            size_t n = strlen(line);
            if (!n || line[n - 1] != '\n') break; /* not whole yet (or over-long): read again next time */
            r->sync_off = ftell(f);
            if (dl_logfmt_parse(line, n - 1, &l)) continue;
            const char *ev = dl_logfmt_get(&l, "event");
            if (!ev) continue;
            if (!strcmp(ev, "merge")) {
                r->merges++;
                double c = dl_logfmt_f64_or(&l, "compute_s", 0);
                if (isfinite(c) && c > 0) r->merged_compute_s += c;
            } else if (!strcmp(ev, "sync_start") && dl_logfmt_i64_or(&l, "pid", -1) == pid) {
                started = 1;
            }
        }
    }
    fclose(f);
    return started;
}

static void link_sample(run_t *r)
{
    for (int d = 0; d < r->sc->n_dc; d++) {
        dl_relay_stats st;
        dl_relay_stats_get(r->relay[d], &st);
        dl_event("link", "dc=%s up_bytes=%llu down_bytes=%llu", r->sc->dc[d].name, (unsigned long long)st.up_bytes,
                 (unsigned long long)st.down_bytes);
    }
}

// ----------------------------------------------------------------------------
// evaluation

static void eval_start(run_t *r)
{
    argv_t a = {0};
    arg(&a, "%s/tools/dloco", r->c->bin);
    arg(&a, "eval"), arg(&a, "%s/store", r->c->dir);
    arg(&a, "--data"), arg(&a, "%s", r->sc->run.corpus);
    arg(&a, "--batch"), arg(&a, "8");
    arg(&a, "--val_batches"), arg(&a, "%lld", (long long)r->sc->run.eval_batches);
    const char *out = runpath(r, "eval.out");
    unlink(out);
    r->epid = spawn(&a, out, 1);
}

static void eval_done(run_t *r, int ok)
{
    r->epid = 0;
    FILE *f = fopen(runpath(r, "eval.out"), "r");
    char line[1024];
    double loss = NAN;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "val loss ");
        if (p) loss = atof(p + 9);
    }
    if (f) fclose(f);
    if (!ok || !isfinite(loss)) return; /* a store not yet readable (first seconds): no sample */
    r->last_loss = loss;
    dl_event("eval", "elapsed_s=%.3f merges=%ld val_loss=%.6f", now_s(r), r->merges, loss);
}

// ----------------------------------------------------------------------------
// faults

static void fault_event(run_t *r, const dl_sc_event *e, const char *phase, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fault_event(run_t *r, const dl_sc_event *e, const char *phase, const char *fmt, ...)
{
    char d[300], q[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d, sizeof d, fmt, ap);
    va_end(ap);
    dl_event("fault", "n=%d kind=%s target=%s phase=%s value=%g detail=%s", e->n, dl_fault_kind_name(e->kind),
             e->target, phase, e->value, dl_event_str(d, q, sizeof q));
    printf("[chaos %s] %6.1f s  fault %d %s %s %s%s%s\n", r->c->label, now_s(r), e->n, dl_fault_kind_name(e->kind),
           e->target, phase, *d ? ": " : "", d);
}

static void relay_apply(run_t *r, int d) { dl_relay_set(r->relay[d], &r->cur[d]); }

/* fiu-ctrl -f PREFIX -c CMD ... PID: each CMD one argument ("enable_random
 * name=...,probability=...,failinfo=..."). fiu-ctrl prints "Command ...
 * returned error" for a command libfiu refused: that is a failure too. */
static int fiu_ctrl(run_t *r, const char *const *cmds, int n)
{
    if (r->sync.pid <= 0) return DL_ENOTFOUND;
    argv_t a = {0};
    arg(&a, "fiu-ctrl"), arg(&a, "-f"), arg(&a, "%s", r->fiu_prefix);
    for (int i = 0; i < n; i++) arg(&a, "-c"), arg(&a, "%s", cmds[i]);
    arg(&a, "%d", (int)r->sync.pid);
    const char *log = runpath(r, "fiu.out");
    unlink(log);
    pid_t pid = spawn(&a, log, 0);
    if (pid < 0) return DL_EIO;
    int st = 0;
    int64_t deadline = dl_clock_ns() + 5000000000LL;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && dl_clock_ns() < deadline) nap_ms(10);
    if (w == 0) {
        kill(pid, SIGKILL);
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        return dl_err(DL_ETIMEDOUT, "fiu-ctrl got no answer from pid %d within 5 s", (int)r->sync.pid);
    }
    FILE *f = fopen(log, "r");
    char line[512], err[512] = "";
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "error") || strstr(line, "Error")) snprintf(err, sizeof err, "%.*s", (int)strcspn(line, "\n"), line);
    if (f) fclose(f);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || *err)
        return dl_err(DL_EIO, "fiu-ctrl: %s", *err ? err : "failed");
    return 0;
}

/* The store's writes and syncs: LMDB writes pages with pwrite/writev and
 * syncs with fdatasync (fsync on some systems); the event log and stdout use
 * write(2), which stays working so the failure can be observed. */
static const char *const disk_points[] = {"posix/io/rw/pwrite", "posix/io/rw/pwritev", "posix/io/rw/writev",
                                          "posix/io/sync/fdatasync", "posix/io/sync/fsync"};
#define N_DISK (int)(sizeof disk_points / sizeof disk_points[0])

static int disk_arm(run_t *r, int on, double p, int err)
{
    char buf[N_DISK][160];
    const char *cmds[N_DISK];
    for (int i = 0; i < N_DISK; i++) {
        if (on) snprintf(buf[i], sizeof buf[i], "enable_random name=%s,probability=%g,failinfo=%d", disk_points[i], p, err);
        else snprintf(buf[i], sizeof buf[i], "disable name=%s", disk_points[i]);
        cmds[i] = buf[i];
    }
    return fiu_ctrl(r, cmds, N_DISK);
}

static void schedule_end(run_t *r, int ev, double after_s)
{
    pend_t *p = &r->pend[r->n_pend++];
    p->at_ns = dl_clock_ns() + (int64_t)(after_s * 1e9);
    p->ev = ev;
}

static void rogue_start(run_t *r, const dl_sc_event *e)
{
    argv_t a = {0};
    arg(&a, "%s", r->c->self), arg(&a, "rogue"), arg(&a, "127.0.0.1"), arg(&a, "%d", r->sync_port);
    arg(&a, "%d", (int)e->value), arg(&a, "%llu", (unsigned long long)r->sc->run.seed * 1000ULL + (unsigned)e->n);
    pid_t pid = spawn(&a, runpath(r, "rogue.log"), 0);
    for (int k = 0; pid > 0 && k < (int)(sizeof r->rogue / sizeof r->rogue[0]); k++)
        if (r->rogue[k] <= 0) {
            r->rogue[k] = pid;
            break;
        }
}

/* Bring the synchronizer's libfiu state to what the disk faults want, when
 * it can be told: running, not stopped, its control fifo there. */
static void disk_sync(run_t *r)
{
    int want = r->disk_n > 0;
    if (!r->fiu || r->sync.pid <= 0 || r->sync.hung) return;
    if (want == r->armed && (!want || r->armed_pid == r->sync.pid)) return;
    if (!want && r->armed_pid != r->sync.pid) {
        r->armed = 0; /* armed in a process that is gone */
        return;
    }
    char fifo[400];
    snprintf(fifo, sizeof fifo, "%s-%d.in", r->fiu_prefix, (int)r->sync.pid);
    if (access(fifo, F_OK)) return;
    if (disk_arm(r, want, r->disk_p, r->disk_errno)) {
        printf("[chaos %s] %6.1f s  %s the disk fault failed: %s\n", r->c->label, now_s(r), want ? "arming" : "disarming",
               dl_errmsg());
        return;
    }
    r->armed = want;
    r->armed_pid = r->sync.pid;
}

/* A link impairment of kind k on datacenter d begins (on=1) or ends: the
 * value of the latest one holds while any is in force, then the base. */
static int link_fault(run_t *r, int d, const dl_sc_event *e, int on)
{
    int k = (int)e->kind, rc = 0;
    int n = on ? ++r->imp_n[d][k] : --r->imp_n[d][k];
    double v = on ? e->value : -1;
    switch (e->kind) {
    case DL_FK_PARTITION:
        if (n == (on ? 1 : 0)) {
            if (r->c->netns) rc = dl_net_dc_link(&r->net[d], !on);
            else r->cur[d].partitioned = on;
        }
        r->partitioned[d] = n > 0;
        break;
    case DL_FK_BANDWIDTH:
        if (on || n == 0) {
            double mbit = on ? v : r->sc->dc[d].bandwidth_mbit;
            if (r->c->netns) rc = dl_net_dc_rate(&r->net[d], mbit);
            else r->cur[d].rate_mbit = mbit;
        }
        break;
    case DL_FK_DELAY:
        if (on) r->cur[d].delay_ms = r->base[d].delay_ms + v / 2;
        else if (n == 0) r->cur[d].delay_ms = r->base[d].delay_ms;
        break;
    case DL_FK_LOSS: if (on || n == 0) r->cur[d].loss = on ? v : r->base[d].loss; break;
    case DL_FK_DUPLICATE: if (on || n == 0) r->cur[d].duplicate = on ? v : r->base[d].duplicate; break;
    case DL_FK_REORDER: if (on || n == 0) r->cur[d].reorder = on ? v : r->base[d].reorder; break;
    default: break;
    }
    if (rc && on) {
        /* not applied: it has no end; nothing it set stays */
        r->imp_n[d][k]--;
        if (e->kind == DL_FK_PARTITION) r->partitioned[d] = r->imp_n[d][k] > 0;
    }
    relay_apply(r, d);
    return rc;
}

static void fault_begin(run_t *r, int ei)
{
    const dl_sc_event *e = &r->tl->ev[ei];
    int d = dl_fault_kind_target(e->kind) == 'd' ? dl_scenario_dc_index(r->sc, e->target) : -1;
    int i = dl_fault_kind_target(e->kind) == 'l' ? slot_of(r, e->target) : -1;
    slot_t *s = i >= 0 ? &r->slot[i] : NULL;
    /* the process of a kill or hang fault: the synchronizer's or the learner slot's */
    proc_t *proc = dl_fault_kind_target(e->kind) == 'l' ? (s ? &s->p : NULL) : &r->sync;
    if (dl_fault_kind_target(e->kind) == 'l' && e->kind != DL_FK_LEARNER_JOIN && (!s || !s->provisioned)) {
        fault_event(r, e, "skipped", "%s is not provisioned", e->target);
        return;
    }
    r->applied++;
    switch (e->kind) {
    case DL_FK_LEARNER_KILL:
    case DL_FK_SYNC_KILL:
        kill_begin(proc);
        fault_event(r, e, "begin", "pid=%d", (int)proc->pid);
        schedule_end(r, ei, e->duration_s);
        break;
    case DL_FK_LEARNER_HANG:
    case DL_FK_SYNC_HANG:
        hang_begin(proc);
        fault_event(r, e, "begin", "pid=%d", (int)proc->pid);
        schedule_end(r, ei, e->duration_s);
        break;
    case DL_FK_LEARNER_SLOW:
        s->slow_n++;
        s->slow = e->value;
        s->duty_next_ns = dl_clock_ns();
        fault_event(r, e, "begin", "runs %.0f%% of the time", e->value * 100);
        schedule_end(r, ei, e->duration_s);
        break;
    case DL_FK_LEARNER_LEAVE:
    case DL_FK_CHURN:
        s->p.expected = 1;
        s->p.hung = s->slow_n = s->p.kills = 0;
        s->slow = 0;
        s->p.restart_ns = 0;
        end_proc(s->p.pid, SIGTERM);
        s->left = 1;
        unprovision(r, i, "leave");
        fault_event(r, e, e->kind == DL_FK_CHURN ? "begin" : "instant", "SIGTERM pid=%d", (int)s->p.pid);
        if (e->kind == DL_FK_CHURN) schedule_end(r, ei, e->duration_s);
        break;
    case DL_FK_LEARNER_JOIN: {
        int j = -1;
        for (int k = 0; k < r->n_slot; k++)
            if (!strcmp(r->slot[k].id, e->target)) j = k;
        if (j < 0 || r->slot[j].provisioned || r->slot[j].left) {
            fault_event(r, e, "skipped", "%s cannot join (already provisioned or gone)", e->target);
            r->applied--;
            return;
        }
        provision(r, j);
        fault_event(r, e, "instant", "pid=%d", (int)r->slot[j].p.pid);
        break;
    }
    case DL_FK_PARTITION:
    case DL_FK_BANDWIDTH:
    case DL_FK_DELAY:
    case DL_FK_LOSS:
    case DL_FK_DUPLICATE:
    case DL_FK_REORDER: {
        if (link_fault(r, d, e, 1)) {
            fault_event(r, e, "skipped", "%s", dl_errmsg());
            r->applied--;
            return;
        }
        char what[96];
        if (e->kind == DL_FK_PARTITION) snprintf(what, sizeof what, "%s", r->c->netns ? "veth down" : "the relay holds every byte");
        else if (e->kind == DL_FK_BANDWIDTH) snprintf(what, sizeof what, "%g Mbit/s (%s)", e->value, r->c->netns ? "tbf" : "relay");
        else if (e->kind == DL_FK_DELAY) snprintf(what, sizeof what, "+%g ms RTT", e->value);
        else snprintf(what, sizeof what, "p=%g", e->value);
        fault_event(r, e, "begin", "%s", what);
        schedule_end(r, ei, e->duration_s);
        break;
    }
    case DL_FK_DISK_EIO:
    case DL_FK_DISK_ENOSPC: {
        int err = e->kind == DL_FK_DISK_EIO ? EIO : ENOSPC;
        if (!r->fiu) {
            fault_event(r, e, "skipped", "the synchronizer is not under fiu-run");
            r->applied--;
            return;
        }
        r->disk_n++;
        r->disk_p = e->value;
        r->disk_errno = err;
        r->armed = 0; /* arm again with this fault's errno and probability */
        disk_sync(r);
        fault_event(r, e, "begin", "store pwrite/pwritev/writev/fdatasync/fsync fail with %s, p=%g%s", strerror(err),
                    e->value, r->armed ? "" : " (armed once the synchronizer runs: it is down or stopped now)");
        schedule_end(r, ei, e->duration_s);
        break;
    }
    case DL_FK_ROGUE_GARBAGE:
        rogue_start(r, e);
        fault_event(r, e, "instant", "%d garbage messages to 127.0.0.1:%d", (int)e->value, r->sync_port);
        break;
    case DL_FK_ROGUE_REPLAY: {
        int sent = 0;
        for (int k = 0; k < (int)e->value; k++) sent += dl_relay_replay(r->relay[d]) == 0;
        dl_err_clear();
        if (!sent) {
            fault_event(r, e, "skipped", "nothing captured or no live connection to replay on");
            r->applied--;
            return;
        }
        fault_event(r, e, "instant", "replayed %d of %d captured messages", sent, (int)e->value);
        break;
    }
    default: break;
    }
}

static void fault_end(run_t *r, int ei, const char *why)
{
    const dl_sc_event *e = &r->tl->ev[ei];
    int d = dl_fault_kind_target(e->kind) == 'd' ? dl_scenario_dc_index(r->sc, e->target) : -1;
    int i = dl_fault_kind_target(e->kind) == 'l' ? slot_of(r, e->target) : -1;
    slot_t *s = i >= 0 ? &r->slot[i] : NULL;
    proc_t *proc = dl_fault_kind_target(e->kind) == 'l' ? (s ? &s->p : NULL) : &r->sync;
    int at_end = !strcmp(why, "run_end");
    switch (e->kind) {
    case DL_FK_LEARNER_KILL:
    case DL_FK_SYNC_KILL: /* a learner restarts only while provisioned */
        if (proc) fault_event(r, e, "end", "%s", kill_end(proc, !s || s->provisioned, at_end));
        return;
    case DL_FK_LEARNER_HANG: /* a slowed learner in the stopped part of its duty cycle stays stopped */
    case DL_FK_SYNC_HANG:
        if (proc) hang_end(proc, !s || !s->duty_off);
        break;
    case DL_FK_LEARNER_SLOW:
        if (s && s->slow_n > 0 && --s->slow_n == 0) {
            s->slow = 0;
            if (s->p.pid > 0 && s->duty_off && !s->p.hung) kill(s->p.pid, SIGCONT);
            s->duty_off = 0;
        }
        break;
    case DL_FK_CHURN: {
        if (at_end) break;
        /* the replacement: the left learner's section and datacenter, a new id */
        int old = -1;
        for (int k = 0; k < r->n_slot; k++)
            if (!strcmp(r->slot[k].id, e->target)) old = k;
        while (old >= 0 && r->slot[old].replaced_by >= 0) old = r->slot[old].replaced_by;
        char id[64];
        int unique = 0;
        for (int tries = 0; tries < 1000 && !unique; tries++) {
            snprintf(id, sizeof id, "%.40s-j%d", e->target, ++r->churns);
            unique = 1;
            for (int k = 0; k < r->n_slot; k++) unique &= strcmp(r->slot[k].id, id) != 0;
        }
        if (old < 0 || r->n_slot == DL_SC_MAX_SLOTS || !unique) {
            fault_event(r, e, "end", "no replacement: %s", old < 0 ? "the slot is gone" : "no free slot or id");
            return;
        }
        slot_t *n = &r->slot[r->n_slot];
        *n = r->slot[old];
        snprintf(n->id, sizeof n->id, "%s", id);
        n->provisioned = n->left = 0;
        n->p.pid = 0;
        n->inc = n->unplanned = n->p.hung = n->p.kills = n->slow_n = 0;
        n->slow = 0;
        n->replaced_by = -1;
        n->state[0] = 0;
        r->slot[old].replaced_by = r->n_slot;
        provision(r, r->n_slot++);
        fault_event(r, e, "end", "joined as %s", n->id);
        return;
    }
    case DL_FK_PARTITION:
    case DL_FK_BANDWIDTH:
    case DL_FK_DELAY:
    case DL_FK_LOSS:
    case DL_FK_DUPLICATE:
    case DL_FK_REORDER:
        if (link_fault(r, d, e, 0)) printf("[chaos %s] undoing fault %d: %s\n", r->c->label, e->n, dl_errmsg());
        break;
    case DL_FK_DISK_EIO:
    case DL_FK_DISK_ENOSPC:
        if (r->disk_n > 0) r->disk_n--;
        disk_sync(r);
        break;
    default: break;
    }
    fault_event(r, e, "end", "%s", at_end ? "undone: the run ends" : "");
}

// ----------------------------------------------------------------------------
// the loop

static void duty(run_t *r)
{
    int64_t now = dl_clock_ns();
    for (int i = 0; i < r->n_slot; i++) {
        slot_t *s = &r->slot[i];
        if (s->slow <= 0 || s->p.pid <= 0 || s->p.hung || now < s->duty_next_ns) continue;
        if (s->duty_off) {
            kill(s->p.pid, SIGCONT);
            s->duty_off = 0;
            s->duty_next_ns = now + (int64_t)(DUTY_PERIOD_NS * s->slow);
        } else {
            kill(s->p.pid, SIGSTOP);
            s->duty_off = 1;
            s->duty_next_ns = now + (int64_t)(DUTY_PERIOD_NS * (1 - s->slow));
        }
    }
}

static void reap(run_t *r)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1, sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        if (pid == r->epid) {
            eval_done(r, code == 0);
            continue;
        }
        if (pid == r->sync.pid) {
            int exp = r->sync.expected;
            dl_event("proc_exit", "role=sync slot=-1 id=sync child_pid=%d incarnation=%d code=%d signal=%d expected=%d",
                     (int)pid, r->sinc - 1, code, sig, exp);
            r->sync.pid = 0;
            if (!exp) {
                r->unplanned_exits++;
                printf("[chaos %s] %6.1f s  the synchronizer exited by itself (code %d, signal %d): restarting it in "
                       "%.1f s\n",
                       r->c->label, now_s(r), code, sig, r->sc->sync.restart_delay_s);
                if (++r->s_unplanned <= MAX_UNPLANNED)
                    r->sync.restart_ns = dl_clock_ns() + (int64_t)(r->sc->sync.restart_delay_s * 1e9);
            }
            continue;
        }
        int found = 0;
        for (size_t k = 0; k < sizeof r->rogue / sizeof r->rogue[0]; k++)
            if (r->rogue[k] == pid) r->rogue[k] = 0, found = 1;
        for (int i = 0; i < r->n_slot && !found; i++) {
            slot_t *s = &r->slot[i];
            if (s->p.pid != pid) continue;
            found = 1;
            dl_event("proc_exit", "role=learner slot=%d id=%s child_pid=%d incarnation=%d code=%d signal=%d expected=%d", i,
                     s->id, (int)pid, s->inc - 1, code, sig, s->p.expected);
            s->p.pid = 0;
            s->duty_off = 0;
            if (!s->p.expected && s->provisioned) {
                r->unplanned_exits++;
                printf("[chaos %s] %6.1f s  learner %s exited by itself (code %d, signal %d; see %s.log)%s\n",
                       r->c->label, now_s(r), s->id, code, sig, s->id,
                       s->unplanned < MAX_UNPLANNED ? ": restarting it" : ": not restarted again");
                if (++s->unplanned <= MAX_UNPLANNED && s->p.restart_ns == 0)
                    s->p.restart_ns = dl_clock_ns() + (int64_t)(r->sc->sync.restart_delay_s * 1e9);
            }
        }
        /* else: a rogue client or a helper command */
    }
}

static int rogues_running(const run_t *r)
{
    int n = 0;
    for (size_t k = 0; k < sizeof r->rogue / sizeof r->rogue[0]; k++) n += r->rogue[k] > 0;
    return n;
}

static int wait_all(run_t *r, double timeout_s)
{
    int64_t end = dl_clock_ns() + (int64_t)(timeout_s * 1e9);
    for (;;) {
        reap(r);
        int alive = 0;
        for (int i = 0; i < r->n_slot; i++) alive += r->slot[i].p.pid > 0;
        if (!alive || dl_clock_ns() > end) return alive;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void progress(run_t *r)
{
    int up = 0, dead = 0, hung = 0;
    double prov = 0;
    for (int i = 0; i < r->n_slot; i++) {
        const slot_t *s = &r->slot[i];
        if (!s->provisioned) continue;
        up += s->p.pid > 0 && !s->p.hung;
        dead += s->p.pid <= 0;
        hung += s->p.pid > 0 && s->p.hung;
        prov++;
    }
    double elapsed = now_s(r);
    /* goodput so far: merged learner-seconds over provisioned learner-seconds
     * (approximate: the report counts slots' real provisioned times) */
    double gp = prov > 0 && elapsed > 0 ? r->merged_compute_s / (double)r->sc->run.fragments / (prov * elapsed) : 0;
    char loss[32] = "-";
    if (isfinite(r->last_loss) && r->last_loss > 0) snprintf(loss, sizeof loss, "%.4f", r->last_loss);
    printf("[chaos %s] %6.1f/%.0f s | faults %d/%d | merges %ld | val loss %s | goodput so far %.2f | learners up %d "
           "dead %d hung %d%s\n",
           r->c->label, elapsed, r->sc->run.duration_s, r->applied, r->tl->n_ev, r->merges, loss, gp, up, dead, hung,
           r->sync.pid > 0 ? (r->sync.hung ? " | sync hung" : "") : " | sync down");
    fflush(stdout);
}

/* The run's end: undo what is still applied, stop the learners (they flush),
 * then the synchronizer; a final evaluation and `dloco check`. */
static void finish(run_t *r, int interrupted)
{
    if (r->sync.pid > 0 && r->sync.hung) kill(r->sync.pid, SIGCONT);
    r->sync.hung = 0;
    for (int k = 0; k < r->n_pend; k++)
        if (r->pend[k].ev >= 0) fault_end(r, r->pend[k].ev, "run_end"), r->pend[k].ev = -1;
    for (int i = 0; i < r->n_slot; i++) {
        slot_t *s = &r->slot[i];
        unprovision(r, i, "run_end");
        s->slow = 0;
        s->p.restart_ns = 0;
        if (s->p.pid > 0) {
            s->p.expected = 1;
            end_proc(s->p.pid, interrupted ? SIGKILL : SIGTERM);
        }
    }
    if (wait_all(r, interrupted ? 5 : 30)) {
        printf("[chaos %s] learners still running after the flush: SIGKILL\n", r->c->label);
        for (int i = 0; i < r->n_slot; i++)
            if (r->slot[i].p.pid > 0) kill(r->slot[i].p.pid, SIGKILL);
        wait_all(r, 10);
    }
    for (size_t k = 0; k < sizeof r->rogue / sizeof r->rogue[0]; k++)
        if (r->rogue[k] > 0) kill(r->rogue[k], SIGKILL);
    for (int k = 0; k < 100 && rogues_running(r); k++) reap(r), nap_ms(10);
    if (r->sync.pid > 0) {
        r->sync.expected = 1;
        end_proc(r->sync.pid, interrupted ? SIGKILL : SIGTERM);
        int64_t end = dl_clock_ns() + 60 * 1000000000LL;
        while (r->sync.pid > 0 && dl_clock_ns() < end) reap(r), nap_ms(20);
        if (r->sync.pid > 0) {
            /* a synchronizer that ignores SIGTERM is a bug to find: its threads' stacks first, where gdb exists */
            char stacks[sizeof r->path];
            snprintf(stacks, sizeof stacks, "%s", runpath(r, "sync-stacks.txt"));
            int have_gdb = access("/usr/bin/gdb", X_OK) == 0;
            printf("[chaos %s] the synchronizer did not stop within 60 s of SIGTERM: %s%s, then SIGKILL\n", r->c->label,
                   have_gdb ? "its threads' stacks in " : "no gdb for its stacks", have_gdb ? stacks : "");
            if (have_gdb) {
                argv_t g = {0};
                arg(&g, "/usr/bin/timeout"), arg(&g, "30"), arg(&g, "/usr/bin/gdb"), arg(&g, "-p"),
                    arg(&g, "%d", (int)r->sync.pid), arg(&g, "-batch"), arg(&g, "-ex"), arg(&g, "thread apply all bt");
                pid_t gp = spawn(&g, stacks, 0);
                int gst = 0;
                while (gp > 0 && waitpid(gp, &gst, 0) < 0 && errno == EINTR) {}
            }
            dl_event("sync_unstoppable", "stacks=%s", have_gdb ? stacks : "none");
            kill(r->sync.pid, SIGKILL);
            while (r->sync.pid > 0) reap(r), nap_ms(20);
        }
    }
    if (r->epid > 0) {
        kill(r->epid, SIGKILL);
        while (r->epid > 0) reap(r), nap_ms(10);
    }
    if (interrupted) return;
    scan_sync(r, 0);
    eval_start(r);
    while (r->epid > 0) reap(r), nap_ms(20);
    /* dloco check on the store: consistent after every kill and disk fault */
    argv_t a = {0};
    arg(&a, "%s/tools/dloco", r->c->bin), arg(&a, "check"), arg(&a, "%s/store", r->c->dir);
    const char *out = runpath(r, "check.out");
    unlink(out);
    pid_t pid = spawn(&a, out, 1);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    char last[400] = "", line[400], q[500];
    FILE *f = fopen(out, "r");
    while (f && fgets(line, sizeof line, f))
        if (*line != '\n') snprintf(last, sizeof last, "%.*s", (int)strcspn(line, "\n"), line);
    if (f) fclose(f);
    dl_event("check", "ok=%d detail=%s", ok, dl_event_str(last, q, sizeof q));
    printf("[chaos %s] dloco check: %s (%s)\n", r->c->label, ok ? "ok" : "FAILED", last);
}

int dl_chaos_run(const dl_chaos_run_cfg *c)
{
    run_t *r = calloc(1, sizeof *r);
    if (!r) return dl_err(DL_ENOMEM, "chaos run");
    r->c = c;
    r->sc = c->sc;
    r->tl = c->tl;
    r->last_loss = NAN;
    const dl_scenario *sc = c->sc;
    int rc = 0;
    /* a run directory of its own: a second run into the same one would train
     * on the first one's store and append to its logs */
    if (mkdir(c->dir, 0755)) {
        rc = errno == EEXIST ? dl_err(DL_EINVAL, "%s exists: remove it or give another --out", c->dir)
                             : dl_err(DL_EIO, "mkdir %s: %s", c->dir, strerror(errno));
        free(r);
        return rc;
    }
    if ((rc = dl_timeline_write(c->tl, runpath(r, "timeline.tsv"))) ||
        (rc = dl_event_open(runpath(r, "events-chaos.log"), "chaos"))) {
        free(r);
        return rc;
    }
    for (int i = 0; i < sc->n_fault; i++)
        if (sc->fault[i].k == DL_FK_DISK_EIO || sc->fault[i].k == DL_FK_DISK_ENOSPC) r->fiu = 1;
    snprintf(r->fiu_prefix, sizeof r->fiu_prefix, "%s/fiu-ctrl", c->dir);
    r->sync_port = free_port();
    r->t0 = dl_clock_ns();
    char qname[2 * DL_CFG_STRLEN + 8];
    dl_event("run_start",
             "label=%s policy=%s baseline=%d scenario=%s seed=%lld duration_s=%g fragments=%lld slots=%d dcs=%d "
             "netns=%d eval_every_s=%g",
             c->label, c->policy, c->baseline, dl_event_str(sc->run.name, qname, sizeof qname), (long long)sc->run.seed, sc->run.duration_s,
             (long long)sc->run.fragments, c->tl->n_slot, sc->n_dc, c->netns, sc->run.eval_every_s);
    printf("[chaos %s] %s: %d learners in %d datacenters (%s), %d faults, %.0f s, policy %s\n", c->label,
           sc->run.name, c->tl->n_slot, sc->n_dc, c->netns ? "network namespaces, tbf links" : "loopback, relay only",
           c->tl->n_ev, sc->run.duration_s, c->policy);
    /* datacenters: links, then relays */
    for (int d = 0; d < sc->n_dc && !rc; d++) {
        const dl_sc_dc *dc = &sc->dc[d];
        if (c->netns && (rc = dl_net_dc_open(c->tag, d, dc->bandwidth_mbit, &r->net[d]))) break;
        dl_relay_impair im = {.delay_ms = dc->rtt_ms / 2,
                              .jitter_ms = dc->jitter_ms,
                              .loss = dc->loss,
                              .duplicate = dc->duplicate,
                              .reorder = dc->reorder,
                              .rate_mbit = c->netns ? 0 : dc->bandwidth_mbit};
        r->base[d] = r->cur[d] = im;
        dl_relay_cfg rcfg = {.listen_host = c->netns ? r->net[d].host_ip : "127.0.0.1",
                             .listen_port = 0,
                             .upstream_host = "127.0.0.1",
                             .upstream_port = r->sync_port,
                             .seed = (uint64_t)sc->run.seed * 131 + (uint64_t)d,
                             /* the synchronizer's inbound bound is min(fragment, largest push
                              * chunk) + 64 KiB; Updates are chunks too: a message of twice the
                              * larger of the two chunk sizes + 1 MiB is no dloco message */
                             .max_msg_bytes = (size_t)(sc->sync.chunk_kb > sc->sync.push_chunk_max_kb
                                                           ? sc->sync.chunk_kb
                                                           : sc->sync.push_chunk_max_kb) * 2048 +
                                              ((size_t)1 << 20)};
        if ((rc = dl_relay_open(&rcfg, &r->relay[d]))) break;
        dl_relay_set(r->relay[d], &im);
        int nl = 0;
        for (int i = 0; i < c->tl->n_slot; i++) nl += c->tl->slot[i].dc == d;
        dl_event("dc", "name=%s mode=%s bandwidth_mbit=%g rtt_ms=%g learners=%d", dc->name, c->netns ? "netns" : "relay",
                 dc->bandwidth_mbit, dc->rtt_ms, nl);
    }
    if (!rc) {
        start_sync(r);
        int64_t deadline = dl_clock_ns() + 60 * 1000000000LL;
        int up = 0;
        while (!up && r->sync.pid > 0 && dl_clock_ns() < deadline && !dl_chaos_interrupted) {
            up = scan_sync(r, r->sync.pid);
            if (!up) reap(r), nap_ms(20);
        }
        if (!up) rc = dl_err(DL_EIO, "dloco-sync did not start (see %s)", runpath(r, "sync.log"));
    }
    if (!rc) {
        r->n_slot = c->tl->n_slot;
        for (int i = 0; i < r->n_slot; i++) {
            slot_t *s = &r->slot[i];
            snprintf(s->id, sizeof s->id, "%s", c->tl->slot[i].id);
            s->section = c->tl->slot[i].section;
            s->dc = c->tl->slot[i].dc;
            s->data_shard = c->tl->slot[i].data_shard;
            s->replaced_by = -1;
            if (c->tl->slot[i].join_s <= 0) provision(r, i);
        }
        update_states(r);
        int64_t next_progress = dl_clock_ns() + PROGRESS_NS, next_link = dl_clock_ns();
        int64_t next_eval = sc->run.eval_every_s > 0 ? dl_clock_ns() + (int64_t)(sc->run.eval_every_s * 1e9) : INT64_MAX;
        int64_t end = r->t0 + (int64_t)(sc->run.duration_s * 1e9);
        while (!dl_chaos_interrupted) {
            int64_t now = dl_clock_ns();
            if (now >= end) break;
            while (r->next_ev < c->tl->n_ev && r->t0 + (int64_t)(c->tl->ev[r->next_ev].at_s * 1e9) <= now)
                fault_begin(r, r->next_ev++);
            for (int k = 0; k < r->n_pend; k++)
                if (r->pend[k].ev >= 0 && r->pend[k].at_ns <= now) {
                    int ev = r->pend[k].ev;
                    r->pend[k].ev = -1;
                    fault_end(r, ev, "scheduled");
                }
            reap(r);
            now = dl_clock_ns();
            for (int i = 0; i < r->n_slot; i++)
                if (r->slot[i].p.restart_ns > 0 && r->slot[i].p.restart_ns <= now && r->slot[i].provisioned &&
                    r->slot[i].p.pid <= 0)
                    start_learner(r, i);
            if (r->sync.restart_ns > 0 && r->sync.restart_ns <= now && r->sync.pid <= 0) {
                r->sync.restart_ns = 0;
                start_sync(r);
            }
            disk_sync(r);
            duty(r);
            update_states(r);
            if (now >= next_link) link_sample(r), next_link = now + 1000000000LL;
            if (now >= next_eval && r->epid <= 0) eval_start(r), next_eval = now + (int64_t)(sc->run.eval_every_s * 1e9);
            if (now >= next_progress) scan_sync(r, 0), progress(r), next_progress = now + PROGRESS_NS;
            nap_ms(TICK_MS);
        }
        link_sample(r);
        finish(r, dl_chaos_interrupted);
        update_states(r);
        link_sample(r);
        dl_event("run_end", "wall_s=%.3f unplanned_exits=%d", now_s(r), r->unplanned_exits);
        if (dl_chaos_interrupted) rc = dl_err(DL_EAGAIN, "interrupted");
    } else {
        finish(r, 1);
    }
    for (int d = 0; d < sc->n_dc; d++) {
        dl_relay_close(&r->relay[d]);
        if (c->netns) dl_net_dc_close(&r->net[d]);
    }
    dl_event_close();
    free(r);
    return rc;
}
