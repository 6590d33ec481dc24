/* cserver/fw_rdkafka.h against librdkafka's own rdkafka.h (Debian's
 * librdkafka-dev): every layout, tag, flag and error code fw_kafka.c relies
 * on must be librdkafka's. All checks are at compile time; the program
 * only says so. */
#include <librdkafka/rdkafka.h>
#include <stdio.h>

/* Our opaque handles as librdkafka's structs, for the signature checks. */
#define fw_rdk rd_kafka_s
#define fw_rdk_conf rd_kafka_conf_s
#define fw_rdk_queue rd_kafka_queue_s
#include "fw_rdkafka.h"
#include "fw_kafka.h"

#define SAME_FIELD(f)                                                                     \
    _Static_assert(offsetof(fw_rdk_message, f) == offsetof(rd_kafka_message_t, f),        \
                   "rd_kafka_message_t." #f " offset");                                   \
    _Static_assert(sizeof(((fw_rdk_message *)0)->f) == sizeof(((rd_kafka_message_t *)0)->f), \
                   "rd_kafka_message_t." #f " size")

SAME_FIELD(err);
SAME_FIELD(rkt);
SAME_FIELD(partition);
SAME_FIELD(payload);
SAME_FIELD(len);
SAME_FIELD(key);
SAME_FIELD(key_len);
SAME_FIELD(offset);
SAME_FIELD(_private);
_Static_assert(sizeof(fw_rdk_message) == sizeof(rd_kafka_message_t), "rd_kafka_message_t size");
_Static_assert(sizeof(fw_rdk_err) == sizeof(rd_kafka_resp_err_t), "rd_kafka_resp_err_t size");

_Static_assert((int)FW_RDK_VTYPE_END == (int)RD_KAFKA_VTYPE_END, "vtype END");
_Static_assert((int)FW_RDK_VTYPE_TOPIC == (int)RD_KAFKA_VTYPE_TOPIC, "vtype TOPIC");
_Static_assert((int)FW_RDK_VTYPE_VALUE == (int)RD_KAFKA_VTYPE_VALUE, "vtype VALUE");
_Static_assert((int)FW_RDK_VTYPE_KEY == (int)RD_KAFKA_VTYPE_KEY, "vtype KEY");
_Static_assert((int)FW_RDK_VTYPE_OPAQUE == (int)RD_KAFKA_VTYPE_OPAQUE, "vtype OPAQUE");
_Static_assert((int)FW_RDK_VTYPE_MSGFLAGS == (int)RD_KAFKA_VTYPE_MSGFLAGS, "vtype MSGFLAGS");
_Static_assert((int)FW_RDK_VTYPE_TIMESTAMP == (int)RD_KAFKA_VTYPE_TIMESTAMP, "vtype TIMESTAMP");

_Static_assert(FW_RDK_PRODUCER == RD_KAFKA_PRODUCER, "RD_KAFKA_PRODUCER");
_Static_assert(FW_RDK_CONF_OK == RD_KAFKA_CONF_OK, "RD_KAFKA_CONF_OK");
_Static_assert(FW_RDK_MSG_F_COPY == RD_KAFKA_MSG_F_COPY, "RD_KAFKA_MSG_F_COPY");
_Static_assert(FW_RDK_PURGE_F_QUEUE == RD_KAFKA_PURGE_F_QUEUE, "RD_KAFKA_PURGE_F_QUEUE");
_Static_assert(FW_RDK_PURGE_F_INFLIGHT == RD_KAFKA_PURGE_F_INFLIGHT, "RD_KAFKA_PURGE_F_INFLIGHT");
_Static_assert(FW_RDK_ERR_QUEUE_FULL == RD_KAFKA_RESP_ERR__QUEUE_FULL, "RD_KAFKA_RESP_ERR__QUEUE_FULL");
_Static_assert(FW_RDK_ERR_FATAL == RD_KAFKA_RESP_ERR__FATAL, "RD_KAFKA_RESP_ERR__FATAL");

/* fw_kafka.h names one error code of its own. */
_Static_assert(FW_KAFKA_ERR_INVALID_ARG == RD_KAFKA_RESP_ERR__INVALID_ARG, "RD_KAFKA_RESP_ERR__INVALID_ARG");

/* The functions' types. fw_rdkafka.h was included with its opaque handles
 * renamed to librdkafka's own structs (above), so each pointer of the
 * fw_rdk_api table must have the very type of librdkafka's function. */
#define SAME_TYPE(field, fn)                                                                         \
    _Static_assert(__builtin_types_compatible_p(__typeof__(((fw_rdk_api *)0)->field), __typeof__(&fn)), \
                   #fn " signature")

SAME_TYPE(version, rd_kafka_version);
SAME_TYPE(version_str, rd_kafka_version_str);
SAME_TYPE(conf_new, rd_kafka_conf_new);
SAME_TYPE(conf_set, rd_kafka_conf_set);
SAME_TYPE(conf_set_opaque, rd_kafka_conf_set_opaque);
SAME_TYPE(conf_set_error_cb, rd_kafka_conf_set_error_cb);
SAME_TYPE(conf_set_log_cb, rd_kafka_conf_set_log_cb);
SAME_TYPE(conf_destroy, rd_kafka_conf_destroy);
SAME_TYPE(create, rd_kafka_new);
SAME_TYPE(set_log_queue, rd_kafka_set_log_queue);
SAME_TYPE(producev, rd_kafka_producev);
SAME_TYPE(poll, rd_kafka_poll);
SAME_TYPE(flush, rd_kafka_flush);
SAME_TYPE(purge, rd_kafka_purge);
SAME_TYPE(fatal_error, rd_kafka_fatal_error);
SAME_TYPE(destroy, rd_kafka_destroy);
SAME_TYPE(err2name, rd_kafka_err2name);
SAME_TYPE(err2str, rd_kafka_err2str);

/* The delivery report callback's setter differs only in the message struct
 * its callback gets, whose layout is checked field by field above. */
typedef void rdk_dr_cb(rd_kafka_t *, const rd_kafka_message_t *, void *);
typedef void ours_dr_cb(rd_kafka_t *, const fw_rdk_message *, void *);
_Static_assert(__builtin_types_compatible_p(__typeof__(&rd_kafka_conf_set_dr_msg_cb),
                                            void (*)(rd_kafka_conf_t *, rdk_dr_cb *)), "dr_msg_cb");
_Static_assert(__builtin_types_compatible_p(__typeof__(((fw_rdk_api *)0)->conf_set_dr_msg_cb),
                                            void (*)(rd_kafka_conf_t *, ours_dr_cb *)), "our dr_msg_cb");

int main(void)
{
    printf("cserver/fw_rdkafka.h matches rdkafka.h of librdkafka %s\n", rd_kafka_version_str());
    return 0;
}
