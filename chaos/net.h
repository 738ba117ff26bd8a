/* Datacenters as network namespaces: a veth pair to the synchronizer's
 * namespace, shaped with tc tbf on both ends; link down/up for partitions.
 * Everything goes through the `ip` and `tc` programs (iproute2). */
#ifndef DL_CHAOS_NET_H
#define DL_CHAOS_NET_H

typedef struct {
    char ns[32];         /* namespace name */
    char host_if[16];    /* veth end in the harness's (the synchronizer's) namespace */
    char ns_if[16];      /* veth end inside the namespace */
    char host_ip[20];    /* the relay listens here */
    char ns_ip[20];
    double rate_mbit;    /* tbf in place on both ends (0 = none) */
    int up;              /* set up and not yet torn down */
} dl_net_dc;

/* 1 when namespaces can be made here (root, `ip netns` works), else 0 with
 * the reason in why. */
int dl_net_probe(char *why, unsigned cap);
/* Make datacenter `index` of run `tag` (tags keep concurrent runs apart). */
int dl_net_dc_open(int tag, int index, double rate_mbit, dl_net_dc *out);
/* Link state of the pair (both ends): a partition and its heal. */
int dl_net_dc_link(dl_net_dc *d, int up);
/* tbf rate on both ends; 0 removes the shaping. */
int dl_net_dc_rate(dl_net_dc *d, double rate_mbit);
/* Deletes the namespace (and with it the pair). Safe twice. */
void dl_net_dc_close(dl_net_dc *d);
/* Remove namespaces named like ours of runs that are gone (a harness that was
 * SIGKILLed leaves them): those whose tag's process no longer exists. */
void dl_net_sweep(void);

#endif
