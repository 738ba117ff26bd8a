/* A real dloco-sync as a test's child process: started with its output in a log file, waited for until its
 * sync_start event says where it listens, stopped with SIGTERM and a bound (test_hostile, test_manifest_run). */
#ifndef DL_TESTS_SYNCPROC_H
#define DL_TESTS_SYNCPROC_H

#include <stdint.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;                 /* 0: not running */
    char endpoint[256];        /* sync_start's endpoint: where it listens (an ephemeral port resolved) */
    uint64_t epoch;            /* sync_start's epoch */
    uint64_t max_msg_bytes;    /* sync_start's message bound, bytes */
    uint64_t max_outbound_bytes; /* sync_start's outbound queue bound, bytes */
    int resumed;               /* sync_start's resumed: 1 when it went on from its store */
} dl_syncproc;

/* Start $DLOCO_BIN/synchronizer/dloco-sync (build/ without DLOCO_BIN) with args (NULL-ended, after the
 * program's name; they name `events` with --events), its stdout and stderr into `log` (appended when
 * append, else truncated); `events` is removed first. Returns 0 once `events` holds a sync_start event with
 * an endpoint (*s filled from it); -1 when the process exited first (*status, when not NULL, its exit status
 * or -1 for a signal) or wrote none within 15 s (it is killed then). */
int dl_syncproc_start(dl_syncproc *s, const char *const *args, const char *log, int append, const char *events,
                      int *status);
/* 1 while the process runs. */
int dl_syncproc_alive(dl_syncproc *s);
/* SIGTERM, a wait of up to 10 s, then SIGKILL. Returns the exit status; -1 when it was killed, or not
 * running. */
int dl_syncproc_stop(dl_syncproc *s);

#endif
