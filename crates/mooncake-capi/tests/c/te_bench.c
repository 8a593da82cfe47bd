/*
 * Throughput through the transfer engine's C API: one process serves a
 * registered buffer, another writes to it and reads from it in batches.
 *
 *   te_bench server                      prints "READY <segment> <addr> <len>",
 *                                        serves until a "bye" notify
 *   te_bench client <segment> <addr> <len> <seconds> [<op> <block bytes>]
 *                                        prints one line per (op, block size):
 *                                        "<op> <block bytes> <GB/s>"; every
 *                                        op and 64 KiB, 1 MiB and 8 MiB
 *                                        blocks unless one cell is named
 */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transfer_engine_c.h"

#define LEN (64u << 20)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static transfer_engine_t start(void) {
    transfer_engine_t e =
        createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
    if (!e) {
        fprintf(stderr, "createTransferEngine failed\n");
        exit(2);
    }
    return e;
}

static int server(void) {
    transfer_engine_t e = start();
    char name[256];
    if (getLocalIpAndPort(e, name, sizeof name) != 0) return 1;
    uint8_t *buf = calloc(1, LEN);
    if (registerLocalMemory(e, buf, LEN, "cpu:0", 1) != 0) return 1;
    printf("READY %s %llu %u\n", name, (unsigned long long)(uintptr_t)buf,
           LEN);
    fflush(stdout);
    for (;;) {
        int n = 0;
        notify_msg_t *msgs = getNotifsFromEngine(e, &n);
        int done = 0;
        for (int i = 0; i < n; i++) done |= strcmp(msgs[i].name, "bye") == 0;
        if (msgs) freeNotifsMsgBuf(msgs, n);
        if (done) break;
        usleep(10000);
    }
    unregisterLocalMemory(e, buf);
    destroyTransferEngine(e);
    free(buf);
    return 0;
}

/* Moves the whole buffer in `block`-sized requests, one batch per pass,
 * for `seconds`; GB/s, or a negative number on failure. */
static double run(transfer_engine_t e, segment_id_t seg, uint8_t *local,
                  uint64_t remote, int opcode, size_t block, double seconds) {
    size_t n = LEN / block;
    struct transfer_request *reqs = calloc(n, sizeof *reqs);
    for (size_t i = 0; i < n; i++) {
        reqs[i].opcode = opcode;
        reqs[i].source = local + i * block;
        reqs[i].target_id = seg;
        reqs[i].target_offset = remote + i * block;
        reqs[i].length = block;
    }
    double t0 = now(), elapsed = 0;
    uint64_t bytes = 0;
    while (elapsed < seconds) {
        batch_id_t b = allocateBatchID(e, n);
        if (b == INVALID_BATCH || submitTransfer(e, b, reqs, n) != 0) {
            free(reqs);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            struct transfer_status st;
            do {
                if (getTransferStatus(e, b, i, &st) != 0) {
                    free(reqs);
                    return -1;
                }
                /* Few cores: leave them to the engine's threads. */
                if (st.status == STATUS_WAITING || st.status == STATUS_PENDING)
                    sched_yield();
            } while (st.status == STATUS_WAITING || st.status == STATUS_PENDING);
            if (st.status != STATUS_COMPLETED) {
                free(reqs);
                return -1;
            }
        }
        freeBatchID(e, b);
        bytes += LEN;
        elapsed = now() - t0;
    }
    free(reqs);
    return bytes / elapsed / 1e9;
}

/* `only_op` NULL: every op and block; else that op at `only_block`. */
static int client(const char *segment, uint64_t remote, double seconds,
                  const char *only_op, size_t only_block) {
    transfer_engine_t e = start();
    segment_id_t seg = openSegment(e, segment);
    if (seg < 0) return 1;
    uint8_t *local = calloc(1, LEN);
    if (registerLocalMemory(e, local, LEN, "cpu:0", 1) != 0) return 1;
    static const size_t blocks[] = {64u << 10, 1u << 20, 8u << 20};
    int rc = 0;
    for (int op = 0; op < 2; op++) {
        for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
            const char *name = op == 0 ? "write" : "read";
            size_t block = only_op ? only_block : blocks[i];
            if (only_op && (strcmp(only_op, name) != 0 || i > 0)) continue;
            int opcode = op == 0 ? OPCODE_WRITE : OPCODE_READ;
            double gbs = run(e, seg, local, remote, opcode, block, seconds);
            if (gbs < 0) rc = 1;
            printf("%s %zu %.2f\n", name, block, gbs);
            fflush(stdout);
        }
    }
    notify_msg_t bye = {"bye", "bye"};
    genNotifyInEngine(e, (uint64_t)seg, bye);
    unregisterLocalMemory(e, local);
    destroyTransferEngine(e);
    free(local);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "server") == 0) return server();
    if (argc == 6 && strcmp(argv[1], "client") == 0)
        return client(argv[2], strtoull(argv[3], NULL, 10), atof(argv[5]),
                      NULL, 0);
    if (argc == 8 && strcmp(argv[1], "client") == 0) {
        size_t block = strtoull(argv[7], NULL, 10);
        if ((strcmp(argv[6], "read") != 0 && strcmp(argv[6], "write") != 0) ||
            block == 0 || block > LEN || LEN % block != 0) {
            fprintf(stderr, "op is read or write; block divides %u\n", LEN);
            return 2;
        }
        return client(argv[2], strtoull(argv[3], NULL, 10), atof(argv[5]),
                      argv[6], block);
    }
    fprintf(stderr,
            "usage: te_bench server | client <segment> <addr> <len> <seconds> "
            "[read|write <block bytes>]\n");
    return 2;
}
