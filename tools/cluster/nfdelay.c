/* nfdelay: a fixed delay for every packet of a netfilter queue, in user
 * space, for the cluster tier (tools/cluster-tier.sh) on kernels without the
 * netem qdisc (sch_netem).  An iptables rule sends packets to the queue
 * (-j NFQUEUE --queue-num N); the kernel holds each one until this program
 * gives its verdict, which it does DELAY_MS after the packet arrived, in
 * arrival order (a batch verdict: every packet id up to the last one due).
 *
 *   nfdelay QUEUE DELAY_MS
 *
 * Runs until SIGTERM or SIGINT, then accepts what it holds and prints on
 * stderr: packets delayed, the most held at once, the mean and largest delay
 * measured from arrival to verdict, and netlink overruns (packets the kernel
 * could not queue: dropped).  Prints "nfdelay: ready" on stdout once bound.
 * Exit 2: bad arguments; 1: netfilter refused (no NFQUEUE support, not root).
 * Build: cc -O2 -o nfdelay nfdelay.c -lnetfilter_queue (Debian:
 * libnetfilter-queue-dev). */
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define HELD_MAX (1u << 17) /* the queue's length in the kernel too */

typedef struct {
    uint32_t id;
    double due;
} held;

typedef struct {
    held *ring; /* [HELD_MAX] FIFO of packets not yet accepted */
    unsigned head, n, most;
    double delay, sum_late, max_late;
    unsigned long long packets, overruns;
} delayer;

static volatile sig_atomic_t g_stop;
static void on_stop(int sig) { (void)sig; g_stop = 1; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *ud)
{
    (void)msg;
    delayer *d = ud;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (d->n == HELD_MAX) /* never: the kernel queue is as long */
        return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
    d->ring[(d->head + d->n) % HELD_MAX] = (held){id, now_s() + d->delay};
    d->n++;
    d->packets++;
    if (d->n > d->most)
        d->most = d->n;
    return 0;
}

/* accepts every packet due by now (all, when flush); the ms until the next is due, or -1 */
static int release(struct nfq_q_handle *qh, delayer *d, int flush)
{
    double t = now_s();
    unsigned k = 0;
    while (k < d->n && (flush || d->ring[(d->head + k) % HELD_MAX].due <= t)) {
        double late = t - d->ring[(d->head + k) % HELD_MAX].due + d->delay;
        d->sum_late += late;
        if (late > d->max_late)
            d->max_late = late;
        k++;
    }
    if (k) {
        nfq_set_verdict_batch(qh, d->ring[(d->head + k - 1) % HELD_MAX].id, NF_ACCEPT);
        d->head = (d->head + k) % HELD_MAX;
        d->n -= k;
    }
    if (!d->n)
        return -1;
    double wait = d->ring[d->head].due - t;
    return wait <= 0 ? 0 : (int)(wait * 1000) + 1;
}

static int serve(struct nfq_handle *h, struct nfq_q_handle *qh, delayer *d)
{
    static char buf[1 << 16];
    int fd = nfq_fd(h);
    printf("nfdelay: ready\n");
    fflush(stdout);
    while (!g_stop) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = release(qh, d, 0);
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return perror("nfdelay: poll"), 1;
        for (;;) {
            ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (got >= 0) {
                nfq_handle_packet(h, buf, (int)got);
                continue;
            }
            if (errno == ENOBUFS) {
                d->overruns++;
                continue;
            }
            break;
        }
    }
    release(qh, d, 1);
    return 0;
}

int main(int argc, char **argv)
{
    char *e1 = NULL, *e2 = NULL;
    long q = argc == 3 ? strtol(argv[1], &e1, 10) : -1;
    double ms = argc == 3 ? strtod(argv[2], &e2) : -1;
    if (argc != 3 || *e1 || *e2 || q < 0 || q > 65535 || !(ms >= 0 && ms <= 10000)) {
        fprintf(stderr, "usage: nfdelay QUEUE(0..65535) DELAY_MS(0..10000)\n");
        return 2;
    }
    delayer d = {.delay = ms / 1000};
    d.ring = malloc(sizeof(held) * HELD_MAX);
    struct nfq_handle *h = nfq_open();
    struct nfq_q_handle *qh = h ? nfq_create_queue(h, (uint16_t)q, on_packet, &d) : NULL;
    int rc = 1;
    if (!d.ring || !qh || nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(qh, HELD_MAX) < 0) {
        fprintf(stderr, "nfdelay: cannot bind netfilter queue %ld: %s\n", q, strerror(errno));
        goto out;
    }
    nfnl_rcvbufsiz(nfq_nfnlh(h), 32u << 20);
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    rc = serve(h, qh, &d);
    fprintf(stderr, "nfdelay: queue %ld: %llu packets delayed, at most %u held, delay mean %.1f ms max %.1f ms, %llu overruns\n",
            q, d.packets, d.most, d.packets ? d.sum_late / (double)d.packets * 1000 : 0.0, d.max_late * 1000,
            d.overruns);
out:
    if (qh)
        nfq_destroy_queue(qh);
    if (h)
        nfq_close(h);
    free(d.ring);
    return rc;
}
