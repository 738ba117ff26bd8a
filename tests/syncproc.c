/* A real dloco-sync as a test's child process: started with its output in a log file, waited for until its
 * sync_start event says where it listens, stopped with SIGTERM and a bound (test_hostile, test_manifest_run). */
#include "tests/syncproc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The last line of `path` that holds "event=sync_start ", malloced; NULL when there is none (yet). */
static char *last_sync_start(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *line = NULL, *last = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        if (!strstr(line, "event=sync_start ")) continue;
        free(last);
        last = strdup(line);
    }
    free(line);
    fclose(f);
    return last;
}

/* The value of key in a logfmt line (up to the next space or newline) into out; 1 when found. */
static int field(const char *line, const char *key, char *out, size_t cap)
{
    char kp[64];
    snprintf(kp, sizeof kp, " %s=", key);
    const char *v = strstr(line, kp);
    if (!v) return 0;
    v += strlen(kp);
    snprintf(out, cap, "%.*s", (int)strcspn(v, " \n"), v);
    return 1;
}

int dl_syncproc_start(dl_syncproc *s, const char *const *args, const char *log, int append, const char *events,
                      int *status)
{
    memset(s, 0, sizeof *s);
    if (status) *status = -1;
    unlink(events);
    const char *bin = getenv("DLOCO_BIN");
    char exe[512];
    snprintf(exe, sizeof exe, "%s/synchronizer/dloco-sync", bin ? bin : "build");
    const char *argv[128] = {exe};
    int argc = 1;
    for (int i = 0; args && args[i] && argc < 127; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    int fd = open(log, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    fflush(stdout);
    s->pid = fork();
    if (s->pid == 0) {
        /* only async-signal-safe calls between fork and exec (the test has zmq threads) */
        dup2(fd, 1);
        dup2(fd, 2);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(fd);
    if (s->pid < 0) {
        s->pid = 0;
        return -1;
    }
    int64_t deadline = dl_clock_ns() + 15000000000LL;
    while (dl_clock_ns() < deadline) {
        char *ev = last_sync_start(events), v[64];
        if (ev && field(ev, "endpoint", s->endpoint, sizeof s->endpoint) && s->endpoint[0]) {
            if (field(ev, "epoch", v, sizeof v)) s->epoch = strtoull(v, NULL, 10);
            if (field(ev, "max_msg_bytes", v, sizeof v)) s->max_msg_bytes = strtoull(v, NULL, 10);
            if (field(ev, "max_outbound_bytes", v, sizeof v)) s->max_outbound_bytes = strtoull(v, NULL, 10);
            if (field(ev, "resumed", v, sizeof v)) s->resumed = atoi(v);
            free(ev);
            return 0;
        }
        free(ev);
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            return -1;
        }
        nap_ms(20);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

int dl_syncproc_alive(dl_syncproc *s)
{
    if (!s->pid) return 0;
    int st;
    return waitpid(s->pid, &st, WNOHANG) == 0;
}

int dl_syncproc_stop(dl_syncproc *s)
{
    if (s->pid <= 0) return -1;
    int code = -1, st = 0, done = 0;
    kill(s->pid, SIGTERM);
    int64_t deadline = dl_clock_ns() + 10000000000LL;
    while (dl_clock_ns() < deadline) {
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid || (r < 0 && errno == ECHILD)) {
            done = r == s->pid;
            break;
        }
        nap_ms(20);
    }
    if (done && WIFEXITED(st)) code = WEXITSTATUS(st);
    if (!done) {
        printf("note: dloco-sync (pid %d) did not stop within 10 s of SIGTERM: SIGKILL\n", (int)s->pid);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
    return code;
}
