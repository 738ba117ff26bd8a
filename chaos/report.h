/* The chaos report (docs/CHAOS.md "The report"): the accounted runs of one
 * scenario side by side in report.md, report.json and gnuplot SVGs. */
#ifndef DL_CHAOS_REPORT_H
#define DL_CHAOS_REPORT_H

#include "chaos/account.h"

/* Write out_dir/report.md, out_dir/report.json and out_dir/plots/ (each
 * plot's .dat and .gp, and the .svg that `gnuplot X.gp` makes of them in
 * plots/). out_dir and plots/ are created when missing. runs[i] is shown
 * under labels[i] (labels NULL: each run's own run_start label); a label
 * ending in "-baseline" is the failure-free twin of the run labelled
 * without the suffix (else of the run just before it), and that run's loss
 * cost is its final val loss / the twin's - 1. n may be 0 (a report that
 * says there are no runs).
 *
 * gnuplot is looked up in PATH and run as a child process (fork + exec, no
 * shell) in plots/, its output in X.gp.log (removed when it succeeds).
 * Without it the .dat and .gp files are still written, one warning goes to
 * stderr and the call succeeds. Returns 0; DL_EIO when a file could
 * not be written or a gnuplot run failed (everything else is still
 * written), with the reason in dl_errmsg(). */
int dl_report_write(const char *out_dir, const char *scenario_name, const char *const *labels,
                    dl_account *const *runs, int n);

#endif
