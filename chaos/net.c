/* Namespaces, veth pairs and tbf shaping through `ip` and `tc`: each command
 * is run with fork/exec (no shell), its stderr kept for the error message. */
#include "chaos/net.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/err.h"

/* Run argv (NULL-terminated); 0 when it exited 0, else DL_EIO with its stderr. */
static int run(char *const argv[])
{
    int pfd[2];
    if (pipe(pfd)) return dl_err(DL_EIO, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return dl_err(DL_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        int dn = open("/dev/null", O_RDWR);
        if (dn >= 0) dup2(dn, 0), dup2(dn, 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char err[512];
    size_t n = 0;
    ssize_t r;
    while ((r = read(pfd[0], err + n, sizeof err - 1 - n)) > 0 && (n += (size_t)r) < sizeof err - 1) {}
    close(pfd[0]);
    err[n] = 0;
    while (n && (err[n - 1] == '\n' || err[n - 1] == ' ')) err[--n] = 0;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    char cmd[256] = "";
    for (int i = 0; argv[i]; i++) {
        strncat(cmd, argv[i], sizeof cmd - strlen(cmd) - 2);
        strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
    }
    return dl_err(DL_EIO, "'%s' failed: %s", cmd, *err ? err : "(no message)");
}

#define RUN(...) run((char *const[]){__VA_ARGS__, NULL})

int dl_net_probe(char *why, unsigned cap)
{
    if (geteuid() != 0) {
        snprintf(why, cap, "not root: network namespaces need CAP_NET_ADMIN");
        return 0;
    }
    char ns[32];
    snprintf(ns, sizeof ns, "dlchaos-probe-%d", (int)getpid());
    if (RUN("ip", "netns", "add", ns)) {
        snprintf(why, cap, "%s", dl_errmsg());
        return 0;
    }
    int ok = RUN("ip", "netns", "exec", ns, "tc", "qdisc", "show") == 0;
    if (!ok) snprintf(why, cap, "%s", dl_errmsg());
    RUN("ip", "netns", "del", ns);
    return ok;
}

/* tbf wants a burst of at least rate / HZ and one MTU; a bigger one lets
 * small bursts (an Ack, a heartbeat) through without waiting for a 1 MiB
 * chunk ahead of them to drain. The queue limit holds 200 ms of traffic:
 * beyond it packets drop and TCP backs off, as on a real thin link. */
static int tbf(const char *ns, const char *dev, const char *verb, double mbit)
{
    char rate[32], burst[32], limit[32];
    double bytes_s = mbit * 1e6 / 8;
    long b = (long)(bytes_s / 100);
    if (b < 16384) b = 16384;
    long lim = (long)(bytes_s * 0.2);
    if (lim < 3 * b) lim = 3 * b;
    snprintf(rate, sizeof rate, "%.0fkbit", mbit * 1000);
    snprintf(burst, sizeof burst, "%ld", b);
    snprintf(limit, sizeof limit, "%ld", lim);
    if (ns) return RUN("ip", "netns", "exec", (char *)ns, "tc", "qdisc", (char *)verb, "dev", (char *)dev, "root", "tbf",
                       "rate", rate, "burst", burst, "limit", limit);
    return RUN("tc", "qdisc", (char *)verb, "dev", (char *)dev, "root", "tbf", "rate", rate, "burst", burst, "limit",
               limit);
}

int dl_net_dc_open(int tag, int index, double rate_mbit, dl_net_dc *d)
{
    memset(d, 0, sizeof *d);
    snprintf(d->ns, sizeof d->ns, "dlchaos-%d-%d", tag, index);
    snprintf(d->host_if, sizeof d->host_if, "dlc%dh%d", tag % 100000, index);
    snprintf(d->ns_if, sizeof d->ns_if, "dlc%dn%d", tag % 100000, index);
    /* 10.X.Y.0/30 per datacenter; X from the tag keeps concurrent runs apart */
    int x = 64 + tag % 128;
    snprintf(d->host_ip, sizeof d->host_ip, "10.%d.%d.1", x, index);
    snprintf(d->ns_ip, sizeof d->ns_ip, "10.%d.%d.2", x, index);
    char hcidr[24], ncidr[24];
    snprintf(hcidr, sizeof hcidr, "%s/30", d->host_ip);
    snprintf(ncidr, sizeof ncidr, "%s/30", d->ns_ip);
    int rc = RUN("ip", "netns", "add", d->ns);
    if (rc) return rc;
    d->up = 1;
    if ((rc = RUN("ip", "link", "add", d->host_if, "type", "veth", "peer", "name", d->ns_if)) ||
        (rc = RUN("ip", "link", "set", d->ns_if, "netns", d->ns)) ||
        (rc = RUN("ip", "addr", "add", hcidr, "dev", d->host_if)) ||
        (rc = RUN("ip", "link", "set", d->host_if, "up")) ||
        (rc = RUN("ip", "netns", "exec", d->ns, "ip", "addr", "add", ncidr, "dev", d->ns_if)) ||
        (rc = RUN("ip", "netns", "exec", d->ns, "ip", "link", "set", d->ns_if, "up")) ||
        (rc = RUN("ip", "netns", "exec", d->ns, "ip", "link", "set", "lo", "up"))) {
        dl_net_dc_close(d);
        return rc;
    }
    if (rate_mbit > 0 && (rc = dl_net_dc_rate(d, rate_mbit))) {
        dl_net_dc_close(d);
        return rc;
    }
    return 0;
}

int dl_net_dc_link(dl_net_dc *d, int up)
{
    const char *st = up ? "up" : "down";
    int rc = RUN("ip", "link", "set", d->host_if, (char *)st);
    int rc2 = RUN("ip", "netns", "exec", d->ns, "ip", "link", "set", d->ns_if, (char *)st);
    return rc ? rc : rc2;
}

int dl_net_dc_rate(dl_net_dc *d, double mbit)
{
    int rc = 0;
    if (mbit <= 0) {
        if (d->rate_mbit > 0) {
            rc = RUN("tc", "qdisc", "del", "dev", d->host_if, "root");
            int rc2 = RUN("ip", "netns", "exec", d->ns, "tc", "qdisc", "del", "dev", d->ns_if, "root");
            if (!rc) rc = rc2;
        }
        d->rate_mbit = 0;
        return rc;
    }
    const char *verb = d->rate_mbit > 0 ? "change" : "add";
    if ((rc = tbf(NULL, d->host_if, verb, mbit)) || (rc = tbf(d->ns, d->ns_if, verb, mbit))) return rc;
    d->rate_mbit = mbit;
    return 0;
}

void dl_net_dc_close(dl_net_dc *d)
{
    if (!d->up) return;
    RUN("ip", "netns", "del", d->ns); /* takes the pair with it */
    RUN("ip", "link", "del", d->host_if); /* in case the move into the namespace never happened */
    dl_err_clear();
    d->up = 0;
}

void dl_net_sweep(void)
{
    DIR *dir = opendir("/run/netns");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        int tag, idx;
        if (sscanf(e->d_name, "dlchaos-%d-%d", &tag, &idx) != 2) continue;
        if (kill(tag, 0) == 0 || errno == EPERM) continue; /* its harness lives */
        char ns[sizeof e->d_name];
        snprintf(ns, sizeof ns, "%s", e->d_name);
        RUN("ip", "netns", "del", ns);
    }
    closedir(dir);
    dl_err_clear();
}
