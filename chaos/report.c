/* The chaos report (chaos/report.h): the runs paired with their baseline
 * twins, then the three writers (report_md.c report.md for people,
 * report_json.c report.json for tools, report_plot.c gnuplot scripts + data
 * run into SVGs) and the output helpers they share. */
#include "chaos/report_int.h"

#include "core/err.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void dl_rep_keep(rep *R, int rc)
{
    if (!rc || R->rc) return;
    R->rc = rc;
    snprintf(R->msg, sizeof R->msg, "%s", dl_errmsg());
}

const char *const dl_rep_state_colors[DL_ACCT_NSTATES] = {"#2ca02c", "#bcbd22", "#ff7f0e", "#9467bd",
                                                          "#d62728", "#7f7f7f", "#c7c7c7"};

static int fail_io(rep *R, const char *what)
{
    int rc = dl_err(DL_EIO, "%s: %s", what, strerror(errno));
    dl_rep_keep(R, rc);
    return rc;
}

FILE *dl_rep_open(rep *R, const char *sub, const char *name, char *path, size_t cap)
{
    if (sub) snprintf(path, cap, "%s/%s/%s", R->dir, sub, name);
    else snprintf(path, cap, "%s/%s", R->dir, name);
    FILE *f = fopen(path, "w");
    if (!f) fail_io(R, path);
    return f;
}

void dl_rep_close(rep *R, FILE *f, const char *path)
{
    int bad = ferror(f);
    if (fclose(f) || bad) fail_io(R, path);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* ---- the runs side by side */

static void safe_name(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 1 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                 c == '-';
        char ch = ok && !(n == 0 && c == '.') ? (char)c : '_'; /* no hidden file */
        out[n++] = ch;
    }
    if (!n) out[n++] = '_';
    out[n] = 0;
}

static void pair_twins(rep *R)
{
    static const char suffix[] = "-baseline";
    for (int i = 0; i < R->n; i++) {
        R->r[i].twin = -1;
        R->r[i].loss_cost = NAN;
        R->r[i].is_baseline = ends_with(R->r[i].label, suffix);
    }
    for (int j = 0; j < R->n; j++) {
        if (!R->r[j].is_baseline) continue;
        size_t plen = strlen(R->r[j].label) - (sizeof suffix - 1);
        int p = -1;
        for (int i = 0; i < R->n && p < 0; i++)
            if (!R->r[i].is_baseline && strlen(R->r[i].label) == plen && !strncmp(R->r[i].label, R->r[j].label, plen))
                p = i;
        /* "the policy before it" when the names do not pair */
        if (p < 0 && j > 0 && !R->r[j - 1].is_baseline && R->r[j - 1].twin < 0) p = j - 1;
        if (p < 0 || R->r[p].twin >= 0) continue;
        R->r[p].twin = j;
        double mine = R->r[p].a->final_val_loss, base = R->r[j].a->final_val_loss;
        if (isfinite(mine) && isfinite(base) && base > 0) R->r[p].loss_cost = mine / base - 1.0;
    }
}

int dl_report_write(const char *out_dir, const char *scenario_name, const char *const *labels,
                    dl_account *const *runs, int n)
{
    assert(out_dir && n >= 0 && (n == 0 || runs));
    char plots[4096];
    snprintf(plots, sizeof plots, "%s/plots", out_dir);
    if (mkdir(out_dir, 0755) && errno != EEXIST) return dl_err(DL_EIO, "mkdir %s: %s", out_dir, strerror(errno));
    if (mkdir(plots, 0755) && errno != EEXIST) return dl_err(DL_EIO, "mkdir %s: %s", plots, strerror(errno));
    rep R = {.dir = out_dir, .scenario = scenario_name && scenario_name[0] ? scenario_name : "(unnamed)", .n = n};
    R.r = dl_xcalloc((size_t)(n ? n : 1), sizeof *R.r);
    for (int i = 0; i < n; i++) {
        assert(runs[i]);
        run_info *ri = &R.r[i];
        ri->a = runs[i];
        const char *l = labels && labels[i] && labels[i][0] ? labels[i] : runs[i]->label;
        if (l[0]) snprintf(ri->label, sizeof ri->label, "%s", l);
        else snprintf(ri->label, sizeof ri->label, "run%d", i);
        char base[64];
        safe_name(base, sizeof base, ri->label);
        snprintf(ri->file, sizeof ri->file, "%s", base);
        for (int j = 0; j < i; j++)
            if (!strcmp(R.r[j].file, ri->file)) snprintf(ri->file, sizeof ri->file, "%s-%d", base, i);
    }
    pair_twins(&R);
    dl_rep_write_md(&R);
    dl_rep_write_json(&R);
    dl_rep_write_plots(&R);
    free(R.r);
    return R.rc ? dl_err(R.rc, "%s", R.msg) : 0;
}
