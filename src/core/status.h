/* core/status.h - the one status type of parity.
 *
 * Every fallible function returns a par_status: 0 on success, a negative
 * PAR_E* code on failure.  The message that explains a failure is produced
 * once, where the fault is first known, with par_err(); callers just pass the
 * code up.  The last message of the calling thread stays readable through
 * par_last_error() so a CLI or a test can show or check it.
 */
#ifndef PAR_CORE_STATUS_H
#define PAR_CORE_STATUS_H

#include <stdarg.h>

typedef int par_status;

enum {
    PAR_OK = 0,
    PAR_EINVAL = -1,       /* bad argument or configuration value            */
    PAR_ENOMEM = -2,       /* allocation failed                              */
    PAR_EIO = -3,          /* open/read/write/fsync/rename failed            */
    PAR_EFORMAT = -4,      /* a file is malformed, truncated or corrupt      */
    PAR_ERANGE = -5,       /* a size or index is out of its range            */
    PAR_EMISMATCH = -6,    /* two things that must agree do not              */
    PAR_ETIMEOUT = -7,     /* a wait ran past its limit                      */
    PAR_EUNSUPPORTED = -8, /* valid request this build or mode cannot do     */
    PAR_ENOTFOUND = -9,    /* a named thing (tensor, key, file) is missing   */
    PAR_ECOMM = -10,       /* communication failure or peer abort            */
    PAR_EINTERNAL = -11,   /* an invariant of parity itself broke            */
    PAR_ECHECK = -12,      /* a conformance check failed (values differ)     */
};

/* Short name of a status code ("ok", "invalid argument", ...). Never NULL. */
const char *par_status_str(par_status s);

/* Record a failure: formats the message, stores it as the thread's last
 * error, logs it at error level (unless quieted) and returns `code`.
 * Use as `return par_err(PAR_EFORMAT, "%s: ...", path);`. */
par_status par_err(par_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
par_status par_verr(par_status code, const char *fmt, va_list ap);

/* The calling thread's last message recorded by par_err ("" if none). */
const char *par_last_error(void);
void par_clear_error(void);
/* Sets the calling thread's last message without logging it (NULL clears):
 * a backend that runs several ranks on one thread (fiber) restores a rank's
 * message when the rank comes back onto the thread. */
void par_set_last_error(const char *msg);

/* When quiet, par_err records but does not log (tests of error paths). */
void par_err_set_quiet(int quiet);

#endif
