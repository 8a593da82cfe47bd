/*
 * mooncake-rs: the transfer engine's C API (libmooncake_capi).
 *
 * Declares the same functions, types and constants as Mooncake's
 * transfer_engine_c.h, so programs written against it build unchanged.
 * Return conventions (docs/c-abi.md):
 *  - int functions: 0 on success, a negative ERR_* code on failure
 *    (-1 invalid argument or bad handle, -3 address not registered,
 *    -7 address overlapped, -200 metadata, ...);
 *  - submitTransfer, submitTransferWithNotify, getTransferStatus and
 *    freeBatchID: 0 or a positive status code (1 invalid argument,
 *    3 address not registered, 4 batch busy, ...);
 *  - openSegment: a segment id >= 0, or a negative ERR_* code;
 *  - allocateBatchID: a batch id, or INVALID_BATCH.
 * String arguments are copied before a function returns.
 */
#ifndef MOONCAKE_RS_TRANSFER_ENGINE_C_H
#define MOONCAKE_RS_TRANSFER_ENGINE_C_H
/* The reference header's guard too, so that only one of them is used. */
#ifndef TRANSFER_ENGINE_C
#define TRANSFER_ENGINE_C

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Macros, not typedefs, as in the reference (code may #undef them). */
#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t

/* The engine's own segment. */
#define LOCAL_SEGMENT (0)
/* allocateBatchID's failure value. */
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

/* The state of one request (transfer_status.status). */
#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

/* One transfer: `length` bytes between local `source` (inside registered
 * memory) and the address `target_offset` of segment `target_id`. */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    uint64_t target_offset;
    uint64_t length;
};
typedef struct transfer_request transfer_request_t;

/* A notification: sender-chosen name and message. */
struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};
typedef struct transfer_status transfer_status_t;

/* Declared for source compatibility; no function takes it. */
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};
typedef struct segment_desc segment_desc_t;

struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct nic_load_stat nic_load_stat_t;

typedef void *transfer_engine_t;
typedef void *transport_t;

/* Lifecycle. Returns NULL on failure. `rpc_port` 0 picks a free port. */
transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name,
                                       const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);
void destroyTransferEngine(transfer_engine_t engine);
/* destroyTransferEngine then waits for the batches not yet freed. */
void enableGracefulShutdown(transfer_engine_t engine);
int discoverTopology(transfer_engine_t engine);
/* "host:port" peers reach this engine at, NUL-terminated (truncated, and
 * -1, when buf_len is too small). */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

/* Transports: "tcp" and "shm" are built in and always on. */
transport_t installTransport(transfer_engine_t engine, const char *proto,
                             void **args);
int uninstallTransport(transfer_engine_t engine, const char *proto);

/* Segments. */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);
segment_id_t openSegmentNoCache(transfer_engine_t engine,
                                const char *segment_name);
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);
int syncSegmentCache(transfer_engine_t engine);

/* Memory. The range must be mapped writable in this process and stay so
 * until unregistered. `location` NULL or "" means "*". */
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
                        const char *location, int remote_accessible);
int unregisterLocalMemory(transfer_engine_t engine, void *addr);
int registerLocalMemoryBatch(transfer_engine_t engine,
                             buffer_entry_t *buffer_list, size_t buffer_len,
                             const char *location);
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list,
                               size_t addr_len);

/* Batches. */
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
                   struct transfer_request *entries, size_t count);
/* Once every request completed, `notify_msg` is delivered to the owner of
 * the first request's segment. */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg);
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id,
                      size_t task_id, struct transfer_status *status);
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* Notifications. getNotifsFromEngine returns the ones received so far as
 * an array of *size entries for freeNotifsMsgBuf (NULL when none; *size
 * is -1 for a bad handle). */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);
int freeNotifsMsgBuf(notify_msg_t *msg, int size);
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id,
                      notify_msg_t notify_msg);

/* Diagnostics. */
int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats,
                    size_t *count);
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len,
              int json);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFER_ENGINE_C */
#endif /* MOONCAKE_RS_TRANSFER_ENGINE_C_H */
