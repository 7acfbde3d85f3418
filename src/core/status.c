#include "core/status.h"

#include <stdio.h>
#include <string.h>

#include "core/log.h"

static _Thread_local char last_msg[1024];
static int quiet;

const char *par_status_str(par_status s)
{
    switch (s) {
    case PAR_OK: return "ok";
    case PAR_EINVAL: return "invalid argument";
    case PAR_ENOMEM: return "out of memory";
    case PAR_EIO: return "i/o error";
    case PAR_EFORMAT: return "malformed input";
    case PAR_ERANGE: return "out of range";
    case PAR_EMISMATCH: return "mismatch";
    case PAR_ETIMEOUT: return "timed out";
    case PAR_EUNSUPPORTED: return "unsupported";
    case PAR_ENOTFOUND: return "not found";
    case PAR_ECOMM: return "communication error";
    case PAR_EINTERNAL: return "internal error";
    case PAR_ECHECK: return "check failed";
    default: return "unknown status";
    }
}

par_status par_verr(par_status code, const char *fmt, va_list ap)
{
    /* through a copy: the arguments may include par_last_error() itself
     * (re-coding or prefixing a lower layer's message) */
    char msg[sizeof last_msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_msg, msg, sizeof last_msg);
    if (!quiet)
        par_log(PAR_LOG_ERROR, "%s", last_msg);
    return code;
}

par_status par_err(par_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    par_verr(code, fmt, ap);
    va_end(ap);
    return code;
}

const char *par_last_error(void) { return last_msg; }
void par_clear_error(void) { last_msg[0] = '\0'; }

void par_set_last_error(const char *msg)
{
    snprintf(last_msg, sizeof last_msg, "%s", msg ? msg : "");
}
void par_err_set_quiet(int q) { quiet = q; }
