/* fw_rc: what the C core's functions return (for new and touched code).
 *
 *   0          done
 *   FW_AGAIN   not now: nothing happened, try again later (when is the
 *              caller's choice; the function's comment says what to wait for)
 *   -errno     failed, and why (-ENOMEM, -EPIPE, ...)
 *
 * Two kinds of function say otherwise in their comment: a question (returns
 * 1 for yes, 0 for no) and a protocol step that answers with an HTTP status
 * (the parser's 4xx/5xx; it asks for more bytes with fw_http.h's
 * FW_HTTP_INCOMPLETE). A constructor returns its object or NULL with errno
 * set. A function whose answer is one of several ways to go on (what the
 * caller does next, a body plan) returns an outcome: a named enum in its
 * header, not a return code. Older code still has its own conventions,
 * each documented at the function; it moves to this one as it is touched. */
#ifndef FW_RC_H
#define FW_RC_H

#define FW_AGAIN 1

#endif
