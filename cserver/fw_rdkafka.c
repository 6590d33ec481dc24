/* fw_rdkafka: load librdkafka and fill the function table (fw_rdkafka.h). */
#include "fw_rdkafka.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    size_t off;
} rdk_syms[] = {
    { "rd_kafka_version", offsetof(fw_rdk_api, version) },
    { "rd_kafka_version_str", offsetof(fw_rdk_api, version_str) },
    { "rd_kafka_conf_new", offsetof(fw_rdk_api, conf_new) },
    { "rd_kafka_conf_set", offsetof(fw_rdk_api, conf_set) },
    { "rd_kafka_conf_set_opaque", offsetof(fw_rdk_api, conf_set_opaque) },
    { "rd_kafka_conf_set_dr_msg_cb", offsetof(fw_rdk_api, conf_set_dr_msg_cb) },
    { "rd_kafka_conf_set_error_cb", offsetof(fw_rdk_api, conf_set_error_cb) },
    { "rd_kafka_conf_set_log_cb", offsetof(fw_rdk_api, conf_set_log_cb) },
    { "rd_kafka_conf_destroy", offsetof(fw_rdk_api, conf_destroy) },
    { "rd_kafka_new", offsetof(fw_rdk_api, create) },
    { "rd_kafka_set_log_queue", offsetof(fw_rdk_api, set_log_queue) },
    { "rd_kafka_producev", offsetof(fw_rdk_api, producev) },
    { "rd_kafka_poll", offsetof(fw_rdk_api, poll) },
    { "rd_kafka_flush", offsetof(fw_rdk_api, flush) },
    { "rd_kafka_purge", offsetof(fw_rdk_api, purge) },
    { "rd_kafka_fatal_error", offsetof(fw_rdk_api, fatal_error) },
    { "rd_kafka_destroy", offsetof(fw_rdk_api, destroy) },
    { "rd_kafka_err2name", offsetof(fw_rdk_api, err2name) },
    { "rd_kafka_err2str", offsetof(fw_rdk_api, err2str) },
};

void *fw_rdk_load(fw_rdk_api *api, const char *path, char *err, size_t errlen)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(err, errlen, "cannot load %s: %s", path, why ? why : "dlopen failed");
        return NULL;
    }
    for (size_t i = 0; i < sizeof rdk_syms / sizeof rdk_syms[0]; i++) {
        void *f = dlsym(lib, rdk_syms[i].name);
        if (!f) {
            snprintf(err, errlen, "%s has no %s", path, rdk_syms[i].name);
            goto fail;
        }
        /* POSIX: a data pointer from dlsym converts to a function pointer
         * by copying its bytes. */
        memcpy((char *)api + rdk_syms[i].off, &f, sizeof f);
    }
    if (api->version() < FW_RDK_MIN_VERSION) {
        snprintf(err, errlen, "%s is librdkafka %s: 1.0 or newer is needed", path, api->version_str());
        goto fail;
    }
    return lib;
fail:
    (void)dlclose(lib);                   /* a failure here leaves nothing of ours to undo */
    return NULL;
}
