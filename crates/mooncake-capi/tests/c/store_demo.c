/*
 * The store's C API against a running master, written against the
 * reference's store_c.h: puts and gets (copying and zero-copy), the batch
 * calls, existence and sizes, removal, registered buffers, and the errors
 * for unregistered memory, short buffers and missing keys.
 *
 *   store_demo <master host:port>
 *
 * Exits 0 and prints "store OK" when every check passed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_c.h"

#define BUF (1u << 20)
#define OBJ 4096u

static int failures = 0;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                      \
            failures++;                                                    \
        }                                                                  \
    } while (0)

#define CHECK_EQ(a, b)                                                     \
    do {                                                                   \
        long long va_ = (long long)(a), vb_ = (long long)(b);              \
        if (va_ != vb_) {                                                  \
            fprintf(stderr, "%s:%d: %s == %lld, expected %lld\n",          \
                    __FILE__, __LINE__, #a, va_, vb_);                     \
            failures++;                                                    \
        }                                                                  \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: store_demo <master host:port>\n");
        return 2;
    }
    mooncake_store_t s = mooncake_store_create();
    CHECK(s != NULL);
    CHECK_EQ(mooncake_store_health_check(s), 1); /* not set up yet */
    int rc = mooncake_store_setup(s, "127.0.0.1", "P2PHANDSHAKE", 64u << 20,
                                  16u << 20, "tcp", "", argv[1]);
    if (rc != 0) {
        fprintf(stderr, "setup failed: %d\n", rc);
        return 1;
    }
    CHECK_EQ(mooncake_store_health_check(s), 0);
    /* A second setup of the same store is refused. */
    CHECK(mooncake_store_setup(s, "127.0.0.1", "P2PHANDSHAKE", 64u << 20,
                               16u << 20, "tcp", "", argv[1]) != 0);

    /* Copying put, size, existence. */
    CHECK_EQ(mooncake_store_put(s, "k1", "hello", 5, NULL), 0);
    CHECK_EQ(mooncake_store_get_size(s, "k1"), 5);
    CHECK_EQ(mooncake_store_is_exist(s, "k1"), 1);
    CHECK_EQ(mooncake_store_is_exist(s, "missing"), 0);
    CHECK_EQ(mooncake_store_get_size(s, "missing"), -704);
    mooncake_replicate_config_t cfg = {1, 0, 0, NULL, 0};
    CHECK_EQ(mooncake_store_put(s, "k-cfg", "abc", 3, &cfg), 0);

    /* Zero-copy through a registered buffer. */
    uint8_t *buf = malloc(BUF);
    for (size_t i = 0; i < BUF; i++) buf[i] = (uint8_t)(i * 13 + 7);
    CHECK_EQ(mooncake_store_register_buffer(s, buf, BUF), 0);
    CHECK_EQ(mooncake_store_put_from(s, "k2", buf, OBJ, NULL), 0);
    uint8_t *out = buf + BUF / 2;
    memset(out, 0, OBJ);
    CHECK_EQ(mooncake_store_get_into(s, "k2", out, OBJ), OBJ);
    CHECK(memcmp(out, buf, OBJ) == 0);
    CHECK_EQ(mooncake_store_get_into(s, "k1", out, 64), 5);
    CHECK(memcmp(out, "hello", 5) == 0);

    /* Errors: a short buffer, a missing key, unregistered memory. */
    CHECK(mooncake_store_get_into(s, "k2", out, OBJ / 2) < 0);
    CHECK_EQ(mooncake_store_get_into(s, "missing", out, OBJ), -704);
    uint8_t *unregistered = malloc(OBJ);
    CHECK(mooncake_store_get_into(s, "k2", unregistered, OBJ) < 0);
    CHECK(mooncake_store_put_from(s, "k3", unregistered, OBJ, NULL) < 0);
    CHECK_EQ(mooncake_store_is_exist(s, "k3"), 0);

    /* Batches. */
    const char *keys[3] = {"b1", "b2", "b3"};
    void *bufs[3] = {buf, buf + OBJ, buf + 2 * OBJ};
    size_t sizes[3] = {OBJ, OBJ, 100};
    int results[3] = {-9, -9, -9};
    CHECK_EQ(mooncake_store_batch_put_from(s, keys, bufs, sizes, 3, &cfg,
                                           results),
             0);
    for (int i = 0; i < 3; i++) CHECK_EQ(results[i], 0);
    void *outs[3] = {out, out + OBJ, out + 2 * OBJ};
    int64_t got[3] = {0, 0, 0};
    memset(out, 0, 3 * OBJ);
    CHECK_EQ(mooncake_store_batch_get_into(s, keys, outs, sizes, 3, got), 0);
    CHECK_EQ(got[0], OBJ);
    CHECK_EQ(got[1], OBJ);
    CHECK_EQ(got[2], 100);
    CHECK(memcmp(out, buf, 2 * OBJ + 100) == 0);
    const char *probe[4] = {"b1", "b2", "b3", "nope"};
    int exists[4] = {-9, -9, -9, -9};
    CHECK_EQ(mooncake_store_batch_is_exist(s, probe, 4, exists), 0);
    CHECK_EQ(exists[0], 1);
    CHECK_EQ(exists[1], 1);
    CHECK_EQ(exists[2], 1);
    CHECK_EQ(exists[3], 0);

    char host[256];
    CHECK_EQ(mooncake_store_get_hostname(s, host, sizeof host), 0);
    CHECK(strlen(host) > 0);
    CHECK_EQ(mooncake_store_get_hostname(s, host, 1), -1);

    /* Removal. k1 was just read: its read lease refuses a plain remove
     * (OBJECT_HAS_LEASE), a forced one goes through. */
    CHECK_EQ(mooncake_store_remove(s, "k1", 0), -706);
    CHECK_EQ(mooncake_store_remove(s, "k1", 1), 0);
    CHECK_EQ(mooncake_store_is_exist(s, "k1"), 0);
    CHECK_EQ(mooncake_store_remove(s, "k1", 1), -704);
    CHECK_EQ(mooncake_store_remove_by_regex(s, "^b", 1), 3);
    CHECK_EQ(mooncake_store_remove_all(s, 1), 2); /* k2, k-cfg */
    CHECK_EQ(mooncake_store_is_exist(s, "k2"), 0);

    CHECK_EQ(mooncake_store_unregister_buffer(s, buf), 0);
    CHECK(mooncake_store_unregister_buffer(s, buf) != 0);
    /* Unregistered now: zero-copy calls refuse it. */
    CHECK(mooncake_store_put_from(s, "k4", buf, OBJ, NULL) < 0);

    mooncake_store_destroy(s);
    free(buf);
    free(unregistered);
    if (failures) return 1;
    printf("store OK\n");
    return 0;
}
