/* Test helpers shared by test_comms and test_learner_trust: a short sleep,
 * a child process (a real dloco-learner) started with its output in files
 * and reaped with a bound, and the text corpus it trains on. Uses
 * tests/check.h's CHECK/REQUIRE, so include it after that header. */
#ifndef DL_TESTS_PROC_H
#define DL_TESTS_PROC_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* fork + execv(argv[0]) with stdout to `out` and stderr to `err`. */
static pid_t spawn(char **argv, const char *out, const char *err)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Bounded wait for the child; kills it after 30 s. Returns the exit status or -1. */
static int reap(pid_t pid)
{
    int st;
    for (int i = 0; i < 3000; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        nap_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    CHECK(0, "learner process did not exit");
    return -1;
}

/* The corpus a dloco-learner child trains on (--data): 400 short lines at `path`. */
static void write_corpus(const char *path)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f, "corpus %s", path);
    for (int i = 1; i <= 400; i++)
        fprintf(f, "line %d: the quick brown fox jumps over the lazy dog %d\n", i, i * 7919 % 1000);
    fclose(f);
}

#endif
