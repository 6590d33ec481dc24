/* fw_internal: functions shared between the cserver/ files that are not
 * part of the interface the app layer uses. */
#ifndef FW_INTERNAL_H
#define FW_INTERNAL_H

#include "fw_conn.h"

/* fw_body.c: set up body handling for a parsed head (moves the connection to
 * READ_BODY or APP); pre-read step (0 done, FW_HTTP_INCOMPLETE, or a status);
 * release body resources. */
int fw_body_setup(fw_conn *c);
int fw_body_preread(fw_conn *c);
void fw_body_release(fw_conn *c);

/* fw_conn.c */
int fw_conn_read(fw_conn *c, size_t want);
void fw_conn_body_ready(fw_conn *c);
void fw_conn_body_wait(fw_conn *c);

/* fw_resp.c: queue a complete server-generated error response. */
void fw_resp_error_head(fw_conn *c, int status);

#endif
