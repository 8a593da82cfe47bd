/*
 * Two processes moving bytes through the transfer engine's C API, written
 * against the reference's transfer_engine_c.h (only calls and cases its
 * API defines).
 *
 *   te_demo server            prints "READY <segment> <addr> <len>", then
 *                             waits for the client's notify, checks the
 *                             bytes it wrote, answers with a notify.
 *   te_demo client <segment> <addr> <len>
 *                             errors on bad segments and unregistered
 *                             memory, a write with notify, a batch of
 *                             reads, batch status, freed batch ids.
 *
 * Exits 0 and prints "<role> OK" when every check passed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transfer_engine_c.h"

#define LEN (1u << 20)
#define CHUNK (64u << 10)
#define WAIT_SECONDS 120

static int failures = 0;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                      \
            failures++;                                                    \
        }                                                                  \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint8_t pattern(size_t i, int seed) {
    return (uint8_t)((i * 7 + seed) & 0xff);
}

/* Polls until the request settles; returns its final status. */
static int wait_task(transfer_engine_t e, batch_id_t b, size_t task,
                     struct transfer_status *st) {
    double deadline = now() + WAIT_SECONDS;
    for (;;) {
        int rc = getTransferStatus(e, b, task, st);
        if (rc != 0) return -1000 - rc;
        if (st->status != STATUS_WAITING && st->status != STATUS_PENDING)
            return st->status;
        if (now() > deadline) return -1;
        usleep(1000);
    }
}

/* Waits for a notify named `name`; copies its message into `msg_out`. */
static int wait_notify(transfer_engine_t e, const char *name, char *msg_out,
                       size_t msg_len) {
    double deadline = now() + WAIT_SECONDS;
    while (now() < deadline) {
        int n = 0;
        notify_msg_t *msgs = getNotifsFromEngine(e, &n);
        int found = 0;
        for (int i = 0; i < n; i++) {
            if (strcmp(msgs[i].name, name) == 0) {
                snprintf(msg_out, msg_len, "%s", msgs[i].msg);
                found = 1;
            }
        }
        if (msgs) CHECK(freeNotifsMsgBuf(msgs, n) == 0);
        if (found) return 0;
        usleep(2000);
    }
    return -1;
}

static transfer_engine_t start(void) {
    transfer_engine_t e =
        createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1);
    if (!e) {
        fprintf(stderr, "createTransferEngine failed\n");
        exit(2);
    }
    CHECK(installTransport(e, "tcp", NULL) != NULL);
    return e;
}

static int server(void) {
    transfer_engine_t e = start();
    char name[256];
    CHECK(getLocalIpAndPort(e, name, sizeof name) == 0);
    uint8_t *buf = malloc(LEN);
    for (size_t i = 0; i < LEN; i++) buf[i] = pattern(i, 1);
    CHECK(registerLocalMemory(e, buf, LEN, "cpu:0", 1) == 0);
    printf("READY %s %llu %u\n", name, (unsigned long long)(uintptr_t)buf,
           LEN);
    fflush(stdout);

    char client_name[256] = {0};
    CHECK(wait_notify(e, "writer", client_name, sizeof client_name) == 0);
    /* The notify comes after the write completed: the bytes are here. */
    for (size_t i = 0; i < CHUNK; i++) {
        if (buf[LEN / 2 + i] != pattern(i, 5)) {
            fprintf(stderr, "byte %zu differs\n", i);
            failures++;
            break;
        }
    }
    segment_id_t peer = openSegment(e, client_name);
    CHECK(peer >= 0);
    notify_msg_t ack = {"ack", "done"};
    CHECK(genNotifyInEngine(e, (uint64_t)peer, ack) == 0);
    /* The client reads our buffer until it saw the ack; wait for its bye. */
    char bye[16];
    CHECK(wait_notify(e, "bye", bye, sizeof bye) == 0);
    CHECK(unregisterLocalMemory(e, buf) == 0);
    destroyTransferEngine(e);
    free(buf);
    if (failures) return 1;
    printf("server OK\n");
    return 0;
}

static int client(const char *segment, uint64_t remote, uint64_t remote_len) {
    transfer_engine_t e = start();
    char name[256];
    CHECK(getLocalIpAndPort(e, name, sizeof name) == 0);

    /* A segment nobody serves. */
    CHECK(openSegment(e, "127.0.0.1:1") < 0);
    segment_id_t seg = openSegment(e, segment);
    CHECK(seg >= 0);
    CHECK(openSegmentNoCache(e, segment) >= 0);
    CHECK(syncSegmentCache(e) == 0);

    uint8_t *local = malloc(LEN);
    memset(local, 0, LEN);
    buffer_entry_t entry = {local, LEN};
    CHECK(registerLocalMemoryBatch(e, &entry, 1, "cpu:0") == 0);
    /* Registering it again overlaps. */
    CHECK(registerLocalMemory(e, local, LEN, "cpu:0", 1) != 0);

    struct transfer_status st;
    batch_id_t b = allocateBatchID(e, 8);
    CHECK(b != INVALID_BATCH);

    /* Unregistered local memory: refused at submit or failed at status. */
    uint8_t *unregistered = malloc(CHUNK);
    struct transfer_request bad = {OPCODE_READ, unregistered, seg, remote,
                                   CHUNK};
    int rc = submitTransfer(e, b, &bad, 1);
    if (rc == 0) CHECK(wait_task(e, b, 0, &st) == STATUS_FAILED);
    /* A segment id never opened. */
    struct transfer_request bad_seg = {OPCODE_READ, local, 4242, remote, 64};
    CHECK(submitTransfer(e, b, &bad_seg, 1) != 0);
    /* A length past the registered buffer. */
    struct transfer_request too_long = {OPCODE_READ, local, seg, remote,
                                        (uint64_t)LEN * 4};
    rc = submitTransfer(e, b, &too_long, 1);
    if (rc == 0) CHECK(wait_task(e, b, 1, &st) == STATUS_FAILED);
    CHECK(freeBatchID(e, b) == 0);

    /* A write with a notify. */
    for (size_t i = 0; i < CHUNK; i++) local[i] = pattern(i, 5);
    b = allocateBatchID(e, 1);
    struct transfer_request w = {OPCODE_WRITE, local, seg, remote + LEN / 2,
                                 CHUNK};
    notify_msg_t note = {"writer", name};
    CHECK(submitTransferWithNotify(e, b, &w, 1, note) == 0);
    CHECK(wait_task(e, b, 0, &st) == STATUS_COMPLETED);
    CHECK(st.transferred_bytes == CHUNK);
    CHECK(freeBatchID(e, b) == 0);
    /* A freed batch id. */
    CHECK(getTransferStatus(e, b, 0, &st) != 0);
    CHECK(freeBatchID(e, b) != 0);
    CHECK(submitTransfer(e, b, &w, 1) != 0);

    /* A batch of reads, each task's status. */
    enum { N = 4 };
    b = allocateBatchID(e, N);
    struct transfer_request reads[N];
    for (int i = 0; i < N; i++) {
        reads[i].opcode = OPCODE_READ;
        reads[i].source = local + CHUNK + (size_t)i * CHUNK;
        reads[i].target_id = seg;
        reads[i].target_offset = remote + (uint64_t)i * CHUNK;
        reads[i].length = CHUNK;
    }
    CHECK(submitTransfer(e, b, reads, N) == 0);
    for (int i = 0; i < N; i++) {
        CHECK(wait_task(e, b, i, &st) == STATUS_COMPLETED);
        CHECK(st.transferred_bytes == CHUNK);
    }
    CHECK(freeBatchID(e, b) == 0);
    for (size_t i = 0; i < (size_t)N * CHUNK; i++) {
        if (local[CHUNK + i] != pattern(i, 1)) {
            fprintf(stderr, "read byte %zu differs\n", i);
            failures++;
            break;
        }
    }
    /* A remote range outside the peer's buffer. */
    b = allocateBatchID(e, 1);
    struct transfer_request outside = {OPCODE_READ, local, seg,
                                       remote + remote_len, 64};
    rc = submitTransfer(e, b, &outside, 1);
    if (rc == 0) CHECK(wait_task(e, b, 0, &st) == STATUS_FAILED);
    CHECK(freeBatchID(e, b) == 0);

    char ack[16] = {0};
    CHECK(wait_notify(e, "ack", ack, sizeof ack) == 0);
    CHECK(strcmp(ack, "done") == 0);
    notify_msg_t bye = {"bye", "bye"};
    CHECK(genNotifyInEngine(e, (uint64_t)seg, bye) == 0);

    void *addrs[1] = {local};
    CHECK(unregisterLocalMemoryBatch(e, addrs, 1) == 0);
    CHECK(unregisterLocalMemory(e, local) != 0);
    CHECK(closeSegment(e, seg) == 0);
    destroyTransferEngine(e);
    free(local);
    free(unregistered);
    if (failures) return 1;
    printf("client OK\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "server") == 0) return server();
    if (argc == 5 && strcmp(argv[1], "client") == 0)
        return client(argv[2], strtoull(argv[3], NULL, 10),
                      strtoull(argv[4], NULL, 10));
    fprintf(stderr, "usage: te_demo server | client <segment> <addr> <len>\n");
    return 2;
}
