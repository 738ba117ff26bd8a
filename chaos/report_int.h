/* The chaos report's private parts (chaos/report.h is the API): one run as
 * the report shows it, the report being written, and what the three writers
 * -- report_md.c, report_json.c, report_plot.c -- share from report.c. */
#ifndef DL_CHAOS_REPORT_INT_H
#define DL_CHAOS_REPORT_INT_H

#include "chaos/report.h"

#include <stdio.h>

#define JSON_SCHEMA "dloco-chaos-report/1"

/* One run as the report shows it. */
typedef struct {
    const dl_account *a;
    char label[64];
    char file[80];    /* label made safe for a file name, unique among the runs */
    int is_baseline;  /* the label ends in -baseline */
    int twin;         /* for a policy run: the index of its baseline twin; -1 none */
    double loss_cost; /* final val loss / the twin's - 1; NaN without a twin or a loss */
} run_info;

typedef struct {
    const char *dir;
    const char *scenario;
    run_info *r;
    int n;
    int rc;        /* the first failure */
    char msg[512]; /* its detail (later dl_err calls would overwrite it) */
} rep;

/* bytes/s -> Mbit/s (10^6 bits/s, the unit of a link's configured bandwidth) */
#define MBIT (8.0 / 1e6)

/* Colors of the account states (DL_ACCT_*), the same in every plot. */
extern const char *const dl_rep_state_colors[DL_ACCT_NSTATES];

/* Remember the first failure (rc != 0) and its message; the writers go on. */
void dl_rep_keep(rep *R, int rc);
/* Open DIR[/sub]/name for writing (path filled); NULL with the failure kept. */
FILE *dl_rep_open(rep *R, const char *sub, const char *name, char *path, size_t cap);
/* Close it; a write or close error is kept. */
void dl_rep_close(rep *R, FILE *f, const char *path);

void dl_rep_write_md(rep *R);    /* report.md */
void dl_rep_write_json(rep *R);  /* report.json */
void dl_rep_write_plots(rep *R); /* plots/: .dat + .gp per plot, SVGs where gnuplot runs */

#endif
