/* The demo NIC's I/O thread (vmprof_tui/demo/nic.py), in C so that it never takes Python's
 * interpreter lock: in Python it shared that lock with the vCPU thread, and how the two handed it
 * over differed from one VM to the next (a cpu + net-send mix: sd 0.082 cores over fresh VMs, 0.011
 * with the socket work done in the vCPU thread instead).
 *
 * The vCPU thread rings the doorbells (nic_tx, nic_rx: a copy between guest memory and two queues,
 * as a virtio device model does); the thread "nic" does the socket work over loopback UDP: each TX
 * packet is sent to a peer socket standing for the remote end, which is drained, and for each posted
 * RX buffer the peer sends one packet that the NIC receives.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#define PAGE 4096
#define MAX_PACKET (PAGE - 4)
#define RX_PACKET 1024
#define TX_QUEUE 1024  /* packets handed over and not yet sent; beyond it TX drops */
#define RX_QUEUE 4096  /* packets waiting for the guest; beyond it RX drops, as a full ring does */
#define BATCH 32  /* NET_SLOTS: the most one TX doorbell hands over */

struct nic_stats {  /* read by nic.py (ctypes): the same fields in the same order */
    uint64_t tx_packets, tx_bytes, rx_packets, rx_bytes, rx_dropped, tx_dropped;
    int64_t tid;
};

struct packet {
    uint32_t len;
    uint8_t data[MAX_PACKET];
};

struct nic {
    uint8_t *mem;
    uint64_t mem_size;
    int sock, peer;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;
    int stopping;
    struct packet *tx;  /* ring: tx_head .. tx_head + tx_count */
    unsigned tx_head, tx_count;
    uint64_t rx_wanted;  /* RX buffers posted and not yet served */
    struct packet *rx;  /* ring of received packets */
    unsigned rx_head, rx_count;
    struct nic_stats stats;
};

static int in_memory(struct nic *n, uint64_t gpa, uint64_t len)
{
    return gpa <= n->mem_size && len <= n->mem_size - gpa;
}

static void *run(void *arg)
{
    struct nic *n = arg;
    uint8_t payload[RX_PACKET], scratch[PAGE];
    struct packet *batch = malloc(BATCH * sizeof(*batch));
    for (unsigned i = 0; i < RX_PACKET; i++)
        payload[i] = i & 255;
    prctl(PR_SET_NAME, "nic", 0, 0, 0);
    pthread_mutex_lock(&n->lock);
    n->stats.tid = syscall(SYS_gettid);
    pthread_cond_broadcast(&n->work);
    while (!n->stopping && batch) {
        if (n->tx_count) {  /* send what was handed over (a doorbell's worth at most), then drain the peer */
            unsigned k = 0;
            for (; k < BATCH && n->tx_count; k++) {
                memcpy(&batch[k], &n->tx[n->tx_head], sizeof(*batch));
                n->tx_head = (n->tx_head + 1) % TX_QUEUE;
                n->tx_count--;
            }
            pthread_mutex_unlock(&n->lock);
            uint64_t packets = 0, bytes = 0;
            for (unsigned i = 0; i < k; i++)
                if (send(n->sock, batch[i].data, batch[i].len, 0) >= 0) {  /* a full buffer drops, as a wire */
                    packets++;
                    bytes += batch[i].len;
                }
            while (recv(n->peer, scratch, sizeof(scratch), MSG_DONTWAIT) > 0)
                ;
            pthread_mutex_lock(&n->lock);
            n->stats.tx_packets += packets;
            n->stats.tx_bytes += bytes;
        } else if (n->rx_wanted) {  /* the peer sends one packet per posted buffer, received here */
            n->rx_wanted--;
            pthread_mutex_unlock(&n->lock);
            ssize_t got = -1;
            if (send(n->peer, payload, sizeof(payload), 0) >= 0)
                got = recv(n->sock, scratch, MAX_PACKET, 0);  /* a lost packet: the 1 s timeout; longer ones cut */
            pthread_mutex_lock(&n->lock);
            if (got < 0)
                continue;
            if (n->rx_count < RX_QUEUE) {
                struct packet *p = &n->rx[(n->rx_head + n->rx_count) % RX_QUEUE];
                p->len = got;
                memcpy(p->data, scratch, got);
                n->rx_count++;
                n->stats.rx_packets++;
                n->stats.rx_bytes += got;
            } else {
                n->stats.rx_dropped++;
            }
        } else {
            pthread_cond_wait(&n->work, &n->lock);
        }
    }
    pthread_mutex_unlock(&n->lock);
    free(batch);
    return NULL;
}

static int udp_socket(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(s);
        return -1;
    }
    return s;
}

static int connect_to(int s, int other)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    return getsockname(other, (struct sockaddr *)&a, &len) == 0 && connect(s, (struct sockaddr *)&a, len) == 0;
}

struct nic *nic_start(uint8_t *mem, uint64_t mem_size)
{
    struct nic *n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    n->mem = mem;
    n->mem_size = mem_size;
    n->tx = calloc(TX_QUEUE, sizeof(struct packet));
    n->rx = calloc(RX_QUEUE, sizeof(struct packet));
    n->sock = udp_socket();
    n->peer = udp_socket();
    struct timeval timeout = {.tv_sec = 1};
    if (!n->tx || !n->rx || n->sock < 0 || n->peer < 0 || !connect_to(n->sock, n->peer) ||
        !connect_to(n->peer, n->sock) ||
        setsockopt(n->sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) != 0)
        goto fail;
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->work, NULL);
    if (pthread_create(&n->thread, NULL, run, n) != 0)
        goto fail;
    pthread_mutex_lock(&n->lock);
    while (!n->stats.tid)  /* the thread is named and its tid known before the VM is reported ready */
        pthread_cond_wait(&n->work, &n->lock);
    pthread_mutex_unlock(&n->lock);
    return n;
fail:
    if (n->sock >= 0)
        close(n->sock);
    if (n->peer >= 0)
        close(n->peer);
    free(n->tx);
    free(n->rx);
    free(n);
    return NULL;
}

/* TX doorbell: the packets in the slots at `gpas` (each page: a 4-byte length, then the bytes). */
int nic_tx(struct nic *n, const uint64_t *gpas, unsigned count)
{
    pthread_mutex_lock(&n->lock);
    for (unsigned i = 0; i < count; i++) {
        if (!in_memory(n, gpas[i], PAGE)) {
            pthread_mutex_unlock(&n->lock);
            return -1;
        }
        if (n->stopping)
            break;
        if (n->tx_count == TX_QUEUE) {
            n->stats.tx_dropped++;
            continue;
        }
        uint32_t len;
        memcpy(&len, n->mem + gpas[i], 4);
        struct packet *p = &n->tx[(n->tx_head + n->tx_count) % TX_QUEUE];
        p->len = len < MAX_PACKET ? len : MAX_PACKET;
        memcpy(p->data, n->mem + gpas[i] + 4, p->len);
        n->tx_count++;
    }
    pthread_cond_signal(&n->work);
    pthread_mutex_unlock(&n->lock);
    return 0;
}

/* RX doorbell: fill the slots at `gpas` with what arrived, write how many into the header page at
 * `header`, and post `count` more receive buffers. */
int nic_rx(struct nic *n, uint64_t header, const uint64_t *gpas, unsigned count)
{
    if (!in_memory(n, header, 4))
        return -1;
    for (unsigned i = 0; i < count; i++)
        if (!in_memory(n, gpas[i], PAGE))
            return -1;
    pthread_mutex_lock(&n->lock);
    uint32_t got = 0;
    while (got < count && n->rx_count && !n->stopping) {
        struct packet *p = &n->rx[n->rx_head];
        memcpy(n->mem + gpas[got], &p->len, 4);
        memcpy(n->mem + gpas[got] + 4, p->data, p->len);
        n->rx_head = (n->rx_head + 1) % RX_QUEUE;
        n->rx_count--;
        got++;
    }
    memcpy(n->mem + header, &got, 4);
    n->rx_wanted += count;
    pthread_cond_signal(&n->work);
    pthread_mutex_unlock(&n->lock);
    return 0;
}

void nic_stats(struct nic *n, struct nic_stats *out)
{
    pthread_mutex_lock(&n->lock);
    *out = n->stats;
    pthread_mutex_unlock(&n->lock);
}

void nic_stop(struct nic *n)
{
    pthread_mutex_lock(&n->lock);
    n->stopping = 1;
    pthread_cond_signal(&n->work);
    pthread_mutex_unlock(&n->lock);
    pthread_join(n->thread, NULL);
    close(n->sock);
    close(n->peer);
    /* the struct stays: a vCPU thread may still ring a doorbell (ignored now), and the stats stay readable */
    free(n->tx);
    free(n->rx);
    n->tx = n->rx = NULL;
}
