/* floor: the least CPU any synchronizer of dloco's design spends per merged
 * byte, on the core it runs on, as memcpys per byte (bench/sync_load.sh's
 * unit). Every pushed byte is, at the least:
 *   received  the kernel copies it from a loopback TCP socket into user
 *             memory (a sender process on another core, 1 MiB messages,
 *             received into a ring of 32 buffers of 1 MiB: more than a
 *             core's L2, as libzmq's queued messages are);
 *   checked   read once to verify its checksum (XXH3, dl_checksum64) before
 *             any of it counts (the value guards' norms could share this read);
 *   merged    read once more by the round's weighted mean (dl_cpu_weighted_mean
 *             of M deltas): a round closes after its last push arrived, so the
 *             first pushes are long out of cache by then.
 * Nothing else: no protocol, no pool copy, no outer step, no store write, no
 * Update. The sum of the three is the floor the bar (3.3) is to be read
 * against. Each figure is bytes per second of this thread's CPU time (user +
 * system), best of 3 windows; memcpy's the same way.
 * Usage: floor [floats per fragment (5186496: GPT-2 124M / 24)] [M (16)] [seconds per window (0.5)]
 *              [sender core (-1: not pinned)]
 * Prints "name value" lines: memcpy_cpu_bytes_per_s, recv_cpu_bytes_per_s,
 * checksum_cpu_bytes_per_s, mean_cpu_bytes_per_s, the three as
 * *_memcpys_per_byte, and floor_memcpys_per_merged_byte (their sum). */
#define _GNU_SOURCE
#include "core/clock.h"
#include "core/hash.h"
#include "kernels/outer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG (1u << 20) /* a push chunk at its default maximum (push_chunk_max_kb 1024) */
#define RING 32

/* This thread's CPU seconds (user + system). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "floor: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    memset(p, 1, n); /* touched: no page faults in the windows */
    return p;
}

/* The sender: connects to port, sends MSG-byte messages until the receiver closes. */
static void sender(int port, int core)
{
    if (core >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(core, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) perror("floor: sender affinity (not pinned)");
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) _exit(3);
    char *buf = xmalloc(MSG);
    for (;;) {
        size_t off = 0;
        while (off < MSG) {
            ssize_t k = send(fd, buf + off, MSG - off, MSG_NOSIGNAL);
            if (k <= 0) _exit(0); /* the receiver closed */
            off += (size_t)k;
        }
    }
}

/* Best CPU bytes/s of the kernel's receive copy over 3 windows of secs; 0 on failure. */
static double recv_rate(double secs, int sender_core)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0) {
        perror("floor: listen");
        return 0;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("floor: fork");
        return 0;
    }
    if (pid == 0) sender(ntohs(a.sin_port), sender_core);
    int fd = accept(ls, NULL, NULL);
    close(ls);
    double best = 0;
    if (fd >= 0) {
        char *ring[RING];
        for (int i = 0; i < RING; i++) ring[i] = xmalloc(MSG);
        for (int r = 0; r < 4; r++) { /* the first window warms the connection up and is not counted */
            uint64_t bytes = 0;
            double t0 = dl_clock_s(), c0 = cpu_s();
            for (unsigned i = 0; dl_clock_s() - t0 < secs; i++) {
                ssize_t k = recv(fd, ring[i % RING], MSG, MSG_WAITALL);
                if (k <= 0) goto out;
                bytes += (uint64_t)k;
            }
            double c = cpu_s() - c0;
            if (r > 0 && c > 0 && (double)bytes / c > best) best = (double)bytes / c;
        }
    out:
        for (int i = 0; i < RING; i++) free(ring[i]);
        close(fd);
    }
    int st;
    kill(pid, SIGTERM);
    waitpid(pid, &st, 0);
    return best;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 5186496;
    int M = argc > 2 ? atoi(argv[2]) : 16;
    double secs = argc > 3 ? atof(argv[3]) : 0.5;
    int sender_core = argc > 4 ? atoi(argv[4]) : -1;
    if (n < MSG / 4 || M < 1 || M > 256 || !(secs > 0)) {
        fprintf(stderr, "usage: floor [floats >= %u] [M 1..256] [seconds > 0] [sender core]\n", MSG / 4);
        return 2;
    }
    omp_set_num_threads(1); /* one thread: the figures are per core */
    size_t nb = n * sizeof(float);

    /* memcpy: two buffers of a fragment, as bench/memrate */
    float *a = xmalloc(nb), *b = xmalloc(nb);
    double copy = 0;
    for (int r = 0; r < 3; r++) {
        long it = 0;
        double t0 = dl_clock_s(), c0 = cpu_s();
        do memcpy(it & 1 ? a : b, it & 1 ? b : a, nb), it++;
        while (dl_clock_s() - t0 < secs);
        double c = cpu_s() - c0;
        if (c > 0 && (double)it * (double)nb / c > copy) copy = (double)it * (double)nb / c;
    }
    free(a);
    free(b);

    double recv = recv_rate(secs, sender_core);

    /* M deltas of a fragment: hashed chunk by chunk, then merged (both cold: M x nb is past the caches) */
    float **x = malloc((size_t)M * sizeof *x), *merged = xmalloc(nb);
    double *w = malloc((size_t)M * sizeof *w);
    if (!x || !w) return 2;
    for (int k = 0; k < M; k++) {
        x[k] = xmalloc(nb);
        for (size_t i = 0; i < n; i++) x[k][i] = 1e-4f * (float)((i + (size_t)k * 31) % 200) - 1e-2f;
        w[k] = 1.0 + 0.1 * k;
    }
    double hash = 0, mean = 0;
    uint64_t sink = 0;
    for (int r = 0; r < 3; r++) {
        uint64_t bytes = 0;
        double t0 = dl_clock_s(), c0 = cpu_s();
        do {
            for (int k = 0; k < M; k++)
                for (size_t o = 0; o < nb; o += MSG) {
                    size_t len = nb - o < MSG ? nb - o : MSG;
                    sink ^= dl_checksum64((const char *)x[k] + o, len);
                    bytes += len;
                }
        } while (dl_clock_s() - t0 < secs);
        double c = cpu_s() - c0;
        if (c > 0 && (double)bytes / c > hash) hash = (double)bytes / c;
    }
    for (int r = 0; r < 3; r++) {
        uint64_t bytes = 0;
        double t0 = dl_clock_s(), c0 = cpu_s();
        do {
            dl_cpu_weighted_mean(merged, (const float *const *)x, w, M, n);
            bytes += (uint64_t)M * nb;
        } while (dl_clock_s() - t0 < secs);
        double c = cpu_s() - c0;
        if (c > 0 && (double)bytes / c > mean) mean = (double)bytes / c;
    }
    volatile float keep = merged[n / 2] + (float)(sink & 1);
    (void)keep;

    printf("memcpy_cpu_bytes_per_s %.6g\nrecv_cpu_bytes_per_s %.6g\nchecksum_cpu_bytes_per_s %.6g\n"
           "mean_cpu_bytes_per_s %.6g\nfragment_floats %zu\nM %d\n",
           copy, recv, hash, mean, n, M);
    if (!(copy > 0 && recv > 0 && hash > 0 && mean > 0)) {
        fprintf(stderr, "floor: a figure is missing (the receive needs a loopback TCP socket)\n");
        return 1;
    }
    printf("recv_memcpys_per_byte %.2f\nchecksum_memcpys_per_byte %.2f\nmean_memcpys_per_byte %.2f\n"
           "floor_memcpys_per_merged_byte %.2f\n",
           copy / recv, copy / hash, copy / mean, copy / recv + copy / hash + copy / mean);
    for (int k = 0; k < M; k++) free(x[k]);
    free(x);
    free(w);
    free(merged);
    return 0;
}
