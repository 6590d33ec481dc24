/* fw_rdkafka: the part of librdkafka's C ABI that fw_kafka.c calls, declared
 * here under our own names so that forkwsgi builds without librdkafka's
 * headers and loads the library at run time (dlopen; see fw_kafka.h).
 *
 * Everything here is librdkafka's stable public ABI (rdkafka.h, unchanged
 * since 1.0): the layout of rd_kafka_message_t, the va-arg tags of
 * rd_kafka_producev(), a few flags and error codes, and the signatures of
 * the functions fw_rdk_load (fw_rdkafka.c) looks up. tests/c/test_rdkafka_abi.c compiles it
 * next to the real rdkafka.h (Debian's librdkafka-dev) and checks every
 * layout and value against it. */
#ifndef FW_RDKAFKA_H
#define FW_RDKAFKA_H

#include <stddef.h>
#include <stdint.h>

typedef struct fw_rdk fw_rdk;             /* rd_kafka_t, opaque */
typedef struct fw_rdk_conf fw_rdk_conf;   /* rd_kafka_conf_t, opaque */
typedef struct fw_rdk_queue fw_rdk_queue; /* rd_kafka_queue_t, opaque */
typedef int fw_rdk_err;                   /* rd_kafka_resp_err_t (an enum) */

/* rd_kafka_message_t: what a delivery report carries. */
typedef struct fw_rdk_message {
    fw_rdk_err err;
    void *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;                       /* the producer's per-message opaque */
} fw_rdk_message;

/* rd_kafka_vtype_t: the tags of rd_kafka_producev()'s arguments. */
enum {
    FW_RDK_VTYPE_END = 0,
    FW_RDK_VTYPE_TOPIC = 1,               /* const char * */
    FW_RDK_VTYPE_VALUE = 4,               /* void *, size_t */
    FW_RDK_VTYPE_KEY = 5,                 /* const void *, size_t */
    FW_RDK_VTYPE_OPAQUE = 6,              /* void * */
    FW_RDK_VTYPE_MSGFLAGS = 7,            /* int */
    FW_RDK_VTYPE_TIMESTAMP = 8,           /* int64_t, ms since the epoch */
};

#define FW_RDK_PRODUCER 0u                /* rd_kafka_type_t RD_KAFKA_PRODUCER */
#define FW_RDK_CONF_OK 0                  /* rd_kafka_conf_res_t RD_KAFKA_CONF_OK */
#define FW_RDK_MSG_F_COPY 0x2             /* librdkafka copies the payload */
#define FW_RDK_PURGE_F_QUEUE 0x1
#define FW_RDK_PURGE_F_INFLIGHT 0x2

#define FW_RDK_ERR_NO_ERROR 0
#define FW_RDK_ERR_QUEUE_FULL (-184)      /* RD_KAFKA_RESP_ERR__QUEUE_FULL */
#define FW_RDK_ERR_FATAL (-150)           /* RD_KAFKA_RESP_ERR__FATAL */

/* The oldest librdkafka with everything used here (purge, fatal errors). */
#define FW_RDK_MIN_VERSION 0x010000ff

typedef void fw_rdk_dr_cb(fw_rdk *rk, const fw_rdk_message *m, void *opaque);
typedef void fw_rdk_error_cb(fw_rdk *rk, int err, const char *reason, void *opaque);
typedef void fw_rdk_log_cb(const fw_rdk *rk, int level, const char *fac, const char *buf);

/* The functions, as pointers filled by dlsym (fw_rdk_load). */
typedef struct fw_rdk_api {
    int (*version)(void);
    const char *(*version_str)(void);
    fw_rdk_conf *(*conf_new)(void);
    int (*conf_set)(fw_rdk_conf *conf, const char *name, const char *value, char *errstr, size_t errlen);
    void (*conf_set_opaque)(fw_rdk_conf *conf, void *opaque);
    void (*conf_set_dr_msg_cb)(fw_rdk_conf *conf, fw_rdk_dr_cb *cb);
    void (*conf_set_error_cb)(fw_rdk_conf *conf, fw_rdk_error_cb *cb);
    void (*conf_set_log_cb)(fw_rdk_conf *conf, fw_rdk_log_cb *cb);
    void (*conf_destroy)(fw_rdk_conf *conf);
    /* rd_kafka_new; type is rd_kafka_type_t, an enum of 0 and 1 (an
     * unsigned int, as the C compilers of this platform lay it out). */
    fw_rdk *(*create)(unsigned type, fw_rdk_conf *conf, char *errstr, size_t errlen);
    fw_rdk_err (*set_log_queue)(fw_rdk *rk, fw_rdk_queue *q);
    fw_rdk_err (*producev)(fw_rdk *rk, ...);
    int (*poll)(fw_rdk *rk, int timeout_ms);
    fw_rdk_err (*flush)(fw_rdk *rk, int timeout_ms);
    fw_rdk_err (*purge)(fw_rdk *rk, int flags);
    fw_rdk_err (*fatal_error)(fw_rdk *rk, char *errstr, size_t errlen);
    void (*destroy)(fw_rdk *rk);
    const char *(*err2name)(fw_rdk_err err);
    const char *(*err2str)(fw_rdk_err err);
} fw_rdk_api;

/* dlopen the librdkafka at path and fill api with its functions. Returns
 * the dlopen handle (for dlclose), or NULL with a one-line reason in err:
 * not loadable, a function missing, a version older than 1.0. */
void *fw_rdk_load(fw_rdk_api *api, const char *path, char *err, size_t errlen);

#endif
