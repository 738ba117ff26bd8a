/* Garbage for the synchronizer: raw bytes on TCP, random ZeroMQ messages,
 * protobuf-shaped headers with random field values. */
#include "chaos/rogue.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "core/err.h"
#include "core/rng.h"

static void fill(dl_rng *r, unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)dl_rng_below(r, 256);
}

static int raw_garbage(const char *host, int port, dl_rng *r)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (ok) {
        unsigned char b[2048];
        size_t n = 16 + (size_t)dl_rng_below(r, sizeof b - 16);
        fill(r, b, n);
        if (dl_rng_below(r, 2)) b[0] = 0xff, b[9] = 0x7f; /* a greeting's signature, then junk */
        ok = send(fd, b, n, MSG_NOSIGNAL) > 0;
    }
    close(fd);
    return ok ? 0 : -1;
}

int dl_rogue_garbage(const char *host, int port, int n, uint64_t seed, dl_rogue_stats *out)
{
    memset(out, 0, sizeof *out);
    dl_rng r;
    dl_rng_seed(&r, seed);
    for (int i = 0; i < 3; i++)
        if (raw_garbage(host, port, &r) == 0) out->raw_conns++;
    void *ctx = zmq_ctx_new();
    if (!ctx) return dl_err(DL_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
    char ep[96];
    snprintf(ep, sizeof ep, "tcp://%s:%d", host, port);
    int socks = n < 4 ? 1 : 4;
    for (int s = 0; s < socks; s++) {
        void *d = zmq_socket(ctx, ZMQ_DEALER);
        if (!d) break;
        int zero = 0, hwm = 1000, sndtimeo = 200;
        zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(d, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
        zmq_setsockopt(d, ZMQ_SNDHWM, &hwm, sizeof hwm);
        char rid[24];
        snprintf(rid, sizeof rid, "rogue-%llx", (unsigned long long)dl_rng_u64(&r));
        zmq_setsockopt(d, ZMQ_ROUTING_ID, rid, strlen(rid));
        if (zmq_connect(d, ep) == 0) {
            for (int i = s; i < n; i += socks) {
                unsigned char b[4096];
                int frames = 1 + (int)dl_rng_below(&r, 3), sent = 0, shaped = 0;
                for (int f = 0; f < frames; f++) {
                    size_t len = (size_t)dl_rng_below(&r, f == 0 ? 256 : sizeof b);
                    fill(&r, b, len);
                    if (f == 0 && i % 3 == 0 && len > 4) {
                        /* protobuf-shaped: field 1 (varint) then a length-delimited field
                         * whose length runs past the end */
                        b[0] = 0x08, b[1] = (unsigned char)(1 + dl_rng_below(&r, 120)), b[2] = 0x12, b[3] = 0xff;
                        shaped = 1;
                    }
                    /* blocking sends with a timeout: a queue that is full (the
                     * synchronizer reads slowly) ends this socket's share */
                    if (zmq_send(d, b, len, f + 1 < frames ? ZMQ_SNDMORE : 0) < 0) break;
                    sent++;
                }
                if (sent < frames) break; /* a half-sent message: the socket closes with it */
                out->zmq_msgs++;
                out->envelopes += shaped;
            }
            /* let libzmq connect and hand the queue over before the close
             * (LINGER 0 would drop what is still queued) */
            int linger = 1500;
            zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
        }
        zmq_close(d);
    }
    zmq_ctx_term(ctx);
    if (!out->raw_conns && !out->zmq_msgs) return dl_err(DL_ENET, "rogue: nothing could be sent to %s", ep);
    return 0;
}
