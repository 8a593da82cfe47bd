/*
 * mooncake-rs: the store's C API (libmooncake_capi).
 *
 * Declares the same functions and types as Mooncake's store_c.h, so
 * programs written against it build unchanged. Functions return 0 (or a
 * size or count) on success and a negative store error code on failure
 * (-600 invalid params, -704 object not found, -800 transfer failed, ...);
 * -1 for a bad handle, a NULL argument, or a store not set up
 * (docs/c-abi.md). String arguments are copied before a function returns.
 */
#ifndef MOONCAKE_RS_STORE_C_H
#define MOONCAKE_RS_STORE_C_H
#ifndef MOONCAKE_STORE_C_H
#define MOONCAKE_STORE_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *mooncake_store_t;

/* Replication of a put; NULL means one replica, no pins. */
struct mooncake_replicate_config {
    size_t replica_num;
    int with_soft_pin;
    int with_hard_pin;
    const char **preferred_segments;
    size_t preferred_segments_count;
};
typedef struct mooncake_replicate_config mooncake_replicate_config_t;

/* Lifecycle. */
mooncake_store_t mooncake_store_create();
void mooncake_store_destroy(mooncake_store_t store);
int mooncake_store_setup(mooncake_store_t store, const char *local_hostname,
                         const char *metadata_server,
                         uint64_t global_segment_size,
                         uint64_t local_buffer_size, const char *protocol,
                         const char *device_name,
                         const char *master_server_addr);
/* Set up from the environment (MOONCAKE_MASTER, MOONCAKE_TE_META_DATA_SERVER,
 * MOONCAKE_LOCAL_HOSTNAME, ...). */
int mooncake_store_init_all(mooncake_store_t store, const char *protocol,
                            const char *device_name,
                            uint64_t mount_segment_size);
/* 0 healthy, 1 not set up, 2 master unreachable. */
int mooncake_store_health_check(mooncake_store_t store);

/* Puts. put copies `value`; put_from and batch_put_from read registered
 * buffers (mooncake_store_register_buffer). A key that exists keeps its
 * value and the put returns 0. */
int mooncake_store_put(mooncake_store_t store, const char *key,
                       const void *value, size_t size,
                       const mooncake_replicate_config_t *config);
int mooncake_store_put_from(mooncake_store_t store, const char *key,
                            void *buffer, size_t size,
                            const mooncake_replicate_config_t *config);
int mooncake_store_batch_put_from(mooncake_store_t store, const char **keys,
                                  void **buffers, const size_t *sizes,
                                  size_t count,
                                  const mooncake_replicate_config_t *config,
                                  int *results_out);

/* Gets into registered buffers: the object's size, or a negative code. */
int64_t mooncake_store_get_into(mooncake_store_t store, const char *key,
                                void *buffer, size_t size);
int mooncake_store_batch_get_into(mooncake_store_t store, const char **keys,
                                  void **buffers, const size_t *sizes,
                                  size_t count, int64_t *results_out);

/* 1 exists, 0 does not, -1 the cluster could not answer. */
int mooncake_store_is_exist(mooncake_store_t store, const char *key);
int mooncake_store_batch_is_exist(mooncake_store_t store, const char **keys,
                                  size_t count, int *results_out);
int64_t mooncake_store_get_size(mooncake_store_t store, const char *key);
int mooncake_store_get_hostname(mooncake_store_t store, char *buf_out,
                                size_t buf_len);

/* Removal; the regex and all forms return how many objects went. */
int mooncake_store_remove(mooncake_store_t store, const char *key, int force);
int64_t mooncake_store_remove_by_regex(mooncake_store_t store,
                                       const char *pattern, int force);
int64_t mooncake_store_remove_all(mooncake_store_t store, int force);

/* Memory for the zero-copy calls; it must be mapped writable. */
int mooncake_store_register_buffer(mooncake_store_t store, void *buffer,
                                   size_t size);
int mooncake_store_unregister_buffer(mooncake_store_t store, void *buffer);

#ifdef __cplusplus
}
#endif

#endif /* MOONCAKE_STORE_C_H */
#endif /* MOONCAKE_RS_STORE_C_H */
