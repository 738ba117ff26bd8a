/* dloco-learner's private header: what its files share (the stop flag the signals set, the error line, the
 * data line) and the two runs main() hands the trainer to. The files: main.c (options, device, data, the
 * trainer; dispatch), run_local.c (--standalone), run_net.c (networked, over the learner library). */
#ifndef DL_GPT_MAIN_INT_H
#define DL_GPT_MAIN_INT_H

#include <signal.h>

#include "dloco/learner.h"
#include "gpt/data.h"
#include "gpt/options.h"
#include "gpt/train.h"

/* Set by SIGINT / SIGTERM once dl_main_catch_signals was called: the training loops end at the next step. */
extern volatile sig_atomic_t dl_main_stop;
/* From now on SIGINT and SIGTERM set dl_main_stop and stop `lib` too (its join and barrier waits); NULL:
 * only the flag (and a handle about to be closed is stopped no more). */
void dl_main_catch_signals(dloco_learner *lib);
/* "dloco-learner: WHAT: <error>: <message>" on stderr; returns the exit code 2. */
int dl_main_fail(const char *what, int rc);
/* The `data:` line and event, in both modes: which data, read how, and the vocab the model takes from it
 * (what a networked learner's Hello declares). */
void dl_main_print_data(const learner_cfg *cfg, const dl_data *data, int vocab);

/* --standalone: init_from or resume, the training loop with evaluation and checkpoints, save_model. The
 * trainer stays the caller's. Returns the exit code (0, 2 an error, 3 the loss diverged). */
int dl_run_local(const learner_cfg *cfg, dl_trainer *tr, const dl_train_cfg *tc, const dl_data *data,
                 const char *hello_device);
/* Networked: the recovery file (id_given: --id was set, so a restart finds it), the learner library's
 * handle, join, the training loop with its pushes and adopts, the final flush and the summary. The trainer
 * stays the caller's. Returns the exit code (0, 2 an error, 3 refused or diverged). */
int dl_run_net(const learner_cfg *cfg, int id_given, dl_trainer *tr, const dl_train_cfg *tc, const dl_data *data,
               const char *hello_device);

#endif
