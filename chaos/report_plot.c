/* The chaos report's plots: a .dat and a .gp file per plot under plots/, run
 * through gnuplot into SVGs where it is installed. */
#include "chaos/report_int.h"

#include "core/err.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- plots: .dat + .gp per plot, then gnuplot */

/* A gnuplot single-quoted string: no escapes inside but '' for a quote. */
static void gp_str(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputs("''", f);
        else if (*s == '\n' || *s == '\r') fputc(' ', f);
        else fputc(*s, f);
    }
    fputc('\'', f);
}

static void gp_head(FILE *f, const char *svg, const char *title)
{
    fputs("# written by dloco-chaos (chaos/report.c); run: gnuplot THIS_FILE in this directory\n"
          "set terminal svg size 900,500 dynamic\nset termoption noenhanced\nset output ",
          f);
    gp_str(f, svg);
    fputs("\nset title ", f);
    gp_str(f, title);
    fputs("\nset grid\nset key outside right top\n", f);
}

/* A plot with nothing to draw still gets an SVG that says so (gnuplot
 * fails on a plot without points). */
static void gp_nodata(FILE *f)
{
    fputs("unset key\nunset border\nunset tics\nunset grid\nset xrange [0:1]\nset yrange [0:1]\n"
          "set label 'no data' at 0.5,0.5 center\nplot 2 notitle\n",
          f);
}

static void gp_plot_sep(FILE *f, int *first) { fputs(*first ? "plot " : ", \\\n     ", f), *first = 0; }

static void plot_loss(rep *R)
{
    char path[4096], name[160];
    int any = 0;
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        int pts = 0;
        for (int k = 0; k < a->n_evals; k++) pts += isfinite(a->evals[k].val_loss);
        if (!pts) continue;
        snprintf(name, sizeof name, "loss-%s.dat", R->r[i].file);
        FILE *f = dl_rep_open(R, "plots", name, path, sizeof path);
        if (!f) return;
        fputs("# elapsed_s val_loss (harness eval events)\n", f);
        for (int k = 0; k < a->n_evals; k++)
            if (isfinite(a->evals[k].val_loss)) fprintf(f, "%.3f %.9g\n", a->evals[k].elapsed_s, a->evals[k].val_loss);
        dl_rep_close(R, f, path);
        any++;
    }
    /* the synchronizer's own evaluations (dloco-sync --eval_every_s), same sequences */
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        int pts = 0;
        for (int k = 0; k < a->n_sync_evals; k++) pts += isfinite(a->sync_evals[k].val_loss);
        if (!pts) continue;
        snprintf(name, sizeof name, "loss-sync-%s.dat", R->r[i].file);
        FILE *f = dl_rep_open(R, "plots", name, path, sizeof path);
        if (!f) return;
        fputs("# t_s val_loss (the synchronizer's eval events)\n", f);
        for (int k = 0; k < a->n_sync_evals; k++)
            if (isfinite(a->sync_evals[k].val_loss))
                fprintf(f, "%.3f %.9g\n", a->sync_evals[k].t_s, a->sync_evals[k].val_loss);
        dl_rep_close(R, f, path);
        any++;
    }
    FILE *f = dl_rep_open(R, "plots", "loss.gp", path, sizeof path);
    if (!f) return;
    gp_head(f, "loss.svg", "validation loss of the global model");
    if (!any) gp_nodata(f);
    else {
        fputs("set xlabel 'seconds since the run start'\nset xrange [0:*]\nset ylabel 'val loss'\n", f);
        int first = 1;
        for (int i = 0; i < R->n; i++) {
            const dl_account *a = R->r[i].a;
            int pts = 0;
            for (int k = 0; k < a->n_evals; k++) pts += isfinite(a->evals[k].val_loss);
            if (!pts) continue;
            gp_plot_sep(f, &first);
            snprintf(name, sizeof name, "loss-%s.dat", R->r[i].file);
            gp_str(f, name);
            fputs(" using 1:2 with linespoints title ", f);
            gp_str(f, R->r[i].label);
        }
        for (int i = 0; i < R->n; i++) {
            const dl_account *a = R->r[i].a;
            int pts = 0;
            for (int k = 0; k < a->n_sync_evals; k++) pts += isfinite(a->sync_evals[k].val_loss);
            if (!pts) continue;
            gp_plot_sep(f, &first);
            snprintf(name, sizeof name, "loss-sync-%s.dat", R->r[i].file);
            gp_str(f, name);
            fputs(" using 1:2 with points title ", f);
            char title[200];
            snprintf(title, sizeof title, "%s (synchronizer)", R->r[i].label);
            gp_str(f, title);
        }
        fputc('\n', f);
    }
    dl_rep_close(R, f, path);
}

static void plot_goodput(rep *R)
{
    char path[4096], name[160];
    int any = 0;
    int *pts = dl_xcalloc((size_t)(R->n ? R->n : 1), sizeof *pts);
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        for (int k = 0; k < a->merges; k++) pts[i] += isfinite(a->merge[k].goodput);
        if (!pts[i]) continue;
        snprintf(name, sizeof name, "goodput-%s.dat", R->r[i].file);
        FILE *f = dl_rep_open(R, "plots", name, path, sizeof path);
        if (!f) goto out;
        fputs("# t_s goodput (at each merge: merged compute so far / P / provisioned learner-s so far)\n", f);
        for (int k = 0; k < a->merges; k++)
            if (isfinite(a->merge[k].goodput)) fprintf(f, "%.3f %.9g\n", a->merge[k].t_s, a->merge[k].goodput);
        dl_rep_close(R, f, path);
        any++;
    }
    FILE *f = dl_rep_open(R, "plots", "goodput.gp", path, sizeof path);
    if (!f) goto out;
    gp_head(f, "goodput.svg", "goodput over time");
    if (!any) gp_nodata(f);
    else {
        fputs("set xlabel 'seconds since the run start'\nset xrange [0:*]\nset ylabel 'goodput (fraction of provisioned)'\n"
              "set yrange [0:*]\n",
              f);
        int first = 1;
        for (int i = 0; i < R->n; i++) {
            if (!pts[i]) continue;
            gp_plot_sep(f, &first);
            snprintf(name, sizeof name, "goodput-%s.dat", R->r[i].file);
            gp_str(f, name);
            /* points only where they can be told apart */
            fprintf(f, " using 1:2 with %s lw 2 title ", pts[i] > 50 ? "lines" : "linespoints");
            gp_str(f, R->r[i].label);
        }
        fputc('\n', f);
    }
    dl_rep_close(R, f, path);
out:
    free(pts);
}

static void plot_staleness(rep *R)
{
    char path[4096];
    int hi = -1;
    for (int i = 0; i < R->n; i++)
        for (int k = 0; k < DL_ACCT_STALE_BINS; k++)
            if (R->r[i].a->staleness_hist[k] && k > hi) hi = k;
    if (hi >= 0) {
        FILE *f = dl_rep_open(R, "plots", "staleness.dat", path, sizeof path);
        if (!f) return;
        fputs("# staleness, then per run the share of its merged contributions (merge_contrib)\n", f);
        for (int k = 0; k <= hi; k++) {
            if (k == DL_ACCT_STALE_BINS - 1) fprintf(f, ">=%d", k);
            else fprintf(f, "%d", k);
            for (int i = 0; i < R->n; i++) {
                const dl_account *a = R->r[i].a;
                fprintf(f, " %.9g", a->contributions ? (double)a->staleness_hist[k] / (double)a->contributions : 0.0);
            }
            fputc('\n', f);
        }
        dl_rep_close(R, f, path);
    }
    FILE *f = dl_rep_open(R, "plots", "staleness.gp", path, sizeof path);
    if (!f) return;
    gp_head(f, "staleness.svg", "staleness of merged contributions");
    if (hi < 0) gp_nodata(f);
    else {
        fputs("set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
              "set xlabel 'staleness (versions)'\nset ylabel 'share of contributions'\nset yrange [0:*]\n",
              f);
        for (int i = 0; i < R->n; i++) {
            fputs(i ? ", \\\n     '' " : "plot 'staleness.dat' ", f);
            fprintf(f, "using %d%s title ", i + 2, i ? "" : ":xtic(1)");
            gp_str(f, R->r[i].label);
        }
        fputc('\n', f);
    }
    dl_rep_close(R, f, path);
}

static void plot_timeline(rep *R, int i)
{
    const dl_account *a = R->r[i].a;
    char path[4096], dat[160], gp[160], svg[160], title[160];
    snprintf(dat, sizeof dat, "timeline-%s.dat", R->r[i].file);
    snprintf(gp, sizeof gp, "timeline-%s.gp", R->r[i].file);
    snprintf(svg, sizeof svg, "timeline-%s.svg", R->r[i].file);
    snprintf(title, sizeof title, "%s: learner states (dashed: a fault begins, dotted: it ends)", R->r[i].label);
    double xmax = a->end_s > 0 ? a->end_s : 1.0;
    int segs = 0;
    FILE *f = dl_rep_open(R, "plots", dat, path, sizeof path);
    if (!f) return;
    fputs("# t0 t1 row color(0xRRGGBB) state (one segment per state change)\n", f);
    for (int s = 0; s < a->n_slots; s++) {
        const dl_account_slot *sl = &a->slots[s];
        for (int k = 0; k < sl->n_states; k++) {
            int st = sl->states[k].state;
            double t0 = sl->states[k].t_s;
            double t1 = k + 1 < sl->n_states ? sl->states[k + 1].t_s : st == DL_ACCT_LEFT ? xmax : sl->end_s;
            if (t1 < t0) t1 = t0;
            fprintf(f, "%.3f %.3f %d %ld %s\n", t0, t1, s, strtol(dl_rep_state_colors[st] + 1, NULL, 16),
                    dl_account_state_name(st));
            segs++;
        }
    }
    dl_rep_close(R, f, path);
    f = dl_rep_open(R, "plots", gp, path, sizeof path);
    if (!f) return;
    gp_head(f, svg, title);
    if (!segs) gp_nodata(f);
    else {
        fprintf(f, "set xlabel 'seconds since the run start'\nset xrange [0:%.3f]\nset yrange [-0.6:%d.4]\n"
                   "unset grid\nset style fill solid 1.0 noborder\nset ytics (",
                xmax, a->n_slots - 1);
        for (int s = 0; s < a->n_slots; s++) {
            if (s) fputs(", ", f);
            gp_str(f, a->slots[s].id);
            fprintf(f, " %d", s);
        }
        fputs(")\n", f);
        for (int k = 0; k < a->n_fault_events; k++) {
            const dl_account_fault_event *e = &a->fault_events[k];
            int end = !strcmp(e->phase, "end");
            fprintf(f, "set arrow from %.3f, graph 0 to %.3f, graph 1 nohead lc rgb '%s' dt %d\n", e->t_s, e->t_s,
                    end ? "#999999" : "#000000", end ? 3 : 2);
            if (!end && a->n_fault_events <= 60) {
                char lab[96];
                snprintf(lab, sizeof lab, "%d %s", e->n, e->kind);
                fputs("set label ", f);
                gp_str(f, lab);
                fprintf(f, " at %.3f, graph 1.01 left rotate by 45 font ',7'\n", e->t_s);
            }
        }
        /* room above the plot for the rotated fault labels, the title above them */
        fputs("set tmargin 9\nset title offset 0,4\nplot ", f);
        gp_str(f, dat);
        fputs(" using (($1+$2)/2):3:1:2:($3-0.35):($3+0.35):4 with boxxy lc rgb variable notitle", f);
        for (int st = 0; st < DL_ACCT_NSTATES; st++)
            fprintf(f, ", \\\n     NaN with boxes lc rgb '%s' title '%s'", dl_rep_state_colors[st], dl_account_state_name(st));
        fputc('\n', f);
    }
    dl_rep_close(R, f, path);
}

static void plot_links(rep *R, int i)
{
    const dl_account *a = R->r[i].a;
    char path[4096], dat[160], gp[160], svg[160], title[160];
    snprintf(dat, sizeof dat, "links-%s.dat", R->r[i].file);
    snprintf(gp, sizeof gp, "links-%s.gp", R->r[i].file);
    snprintf(svg, sizeof svg, "links-%s.svg", R->r[i].file);
    snprintf(title, sizeof title, "%s: Mbit/s per datacenter link", R->r[i].label);
    FILE *f = dl_rep_open(R, "plots", dat, path, sizeof path);
    if (!f) return;
    /* one block per datacenter (gnuplot `index`), rates between samples */
    fputs("# t_s up_Mbit_s down_Mbit_s; one block per datacenter, in the order of the .gp's plot\n", f);
    int blocks = 0, *has = dl_xcalloc((size_t)(a->n_links ? a->n_links : 1), sizeof *has);
    for (int k = 0; k < a->n_links; k++) {
        const dl_account_link *l = &a->links[k];
        int rows = 0;
        for (int j = 1; j < l->n_samples; j++) {
            double dt = l->samples[j].t_s - l->samples[j - 1].t_s;
            if (dt <= 0) continue;
            if (!rows) fprintf(f, "%s# %s\n", blocks ? "\n\n" : "", l->name);
            fprintf(f, "%.3f %.9g %.9g\n", l->samples[j].t_s,
                    (l->samples[j].up_bytes - l->samples[j - 1].up_bytes) / dt * MBIT,
                    (l->samples[j].down_bytes - l->samples[j - 1].down_bytes) / dt * MBIT);
            rows++;
        }
        if (rows) has[k] = 1 + blocks++;
    }
    dl_rep_close(R, f, path);
    f = dl_rep_open(R, "plots", gp, path, sizeof path);
    if (!f) {
        free(has);
        return;
    }
    gp_head(f, svg, title);
    if (!blocks) gp_nodata(f);
    else {
        fputs("set xlabel 'seconds since the run start'\nset xrange [0:*]\nset ylabel 'Mbit/s'\nset yrange [0:*]\n", f);
        int first = 1;
        for (int k = 0; k < a->n_links; k++) {
            if (!has[k]) continue;
            for (int dir = 0; dir < 2; dir++) {
                char t[96];
                snprintf(t, sizeof t, "%s %s", a->links[k].name, dir ? "down" : "up");
                gp_plot_sep(f, &first);
                gp_str(f, dat);
                fprintf(f, " index %d using 1:%d with lines lw %d dt %d title ", has[k] - 1, 2 + dir, 2, dir ? 2 : 1);
                gp_str(f, t);
            }
            if (a->links[k].bandwidth_mbit > 0) { /* the shaped rate, for scale */
                char t[96];
                snprintf(t, sizeof t, "%s limit", a->links[k].name);
                gp_plot_sep(f, &first);
                fprintf(f, "%.9g with lines lw 1 dt 3 title ", a->links[k].bandwidth_mbit);
                gp_str(f, t);
            }
        }
        fputc('\n', f);
    }
    dl_rep_close(R, f, path);
    free(has);
}

/* gnuplot in PATH, into buf; NULL when there is none. */
static const char *find_gnuplot(char *buf, size_t cap)
{
    const char *p = getenv("PATH");
    if (!p) p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        size_t n = strcspn(p, ":");
        snprintf(buf, cap, "%.*s/gnuplot", (int)(n ? n : 1), n ? p : ".");
        if (access(buf, X_OK) == 0) return buf;
        p += n;
        if (*p == ':') p++;
    }
    return NULL;
}

/* `gnuplot script` in dir, as a child (no shell), its stdout and stderr
 * into script.log there: kept when it fails (the error names it), removed
 * when it succeeds, so gnuplot's warnings (a flat line's "empty y range")
 * do not clutter the harness's output. */
static int run_gnuplot(const char *exe, const char *dir, const char *script)
{
    char arg0[] = "gnuplot", arg1[256], log[300], logpath[4400];
    snprintf(arg1, sizeof arg1, "%s", script);
    snprintf(log, sizeof log, "%s.log", script);
    snprintf(logpath, sizeof logpath, "%s/%s", dir, log);
    char *const argv[] = {arg0, arg1, NULL};
    pid_t pid = fork();
    if (pid < 0) return dl_err(DL_EIO, "fork for gnuplot: %s", strerror(errno));
    if (pid == 0) {
        /* only async-signal-safe calls between fork and exec */
        if (chdir(dir) != 0) _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execv(exe, argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return dl_err(DL_EIO, "waiting for gnuplot %s: %s", script, strerror(errno));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        unlink(logpath);
        return 0;
    }
    if (WIFEXITED(st))
        return dl_err(DL_EIO, "gnuplot %s: exit status %d (see %s)", script, WEXITSTATUS(st), logpath);
    return dl_err(DL_EIO, "gnuplot %s: signal %d (see %s)", script, WIFSIGNALED(st) ? WTERMSIG(st) : 0, logpath);
}

void dl_rep_write_plots(rep *R)
{
    plot_loss(R);
    plot_goodput(R);
    plot_staleness(R);
    for (int i = 0; i < R->n; i++) {
        plot_timeline(R, i);
        plot_links(R, i);
    }
    if (R->rc) return; /* a script may be half-written */
    char exe[4096];
    if (!find_gnuplot(exe, sizeof exe)) {
        fprintf(stderr, "dloco-chaos: warning: gnuplot not found in PATH: wrote %s/plots/*.gp and *.dat but no SVGs "
                        "(install gnuplot-nox, then run `gnuplot X.gp` in plots/)\n",
                R->dir);
        return;
    }
    char plots[4096];
    snprintf(plots, sizeof plots, "%s/plots", R->dir);
    const char *fixed[] = {"loss.gp", "goodput.gp", "staleness.gp"};
    for (int k = 0; k < 3; k++) {
        dl_rep_keep(R, run_gnuplot(exe, plots, fixed[k]));
    }
    for (int i = 0; i < R->n; i++)
        for (int k = 0; k < 2; k++) {
            char gp[160];
            snprintf(gp, sizeof gp, "%s-%s.gp", k ? "links" : "timeline", R->r[i].file);
            dl_rep_keep(R, run_gnuplot(exe, plots, gp));
        }
}
