/* core/log.h - leveled logging to stderr (or a sink installed by a test). */
#ifndef PAR_CORE_LOG_H
#define PAR_CORE_LOG_H

#include <stdarg.h>

typedef enum {
    PAR_LOG_ERROR = 0,
    PAR_LOG_WARN = 1,
    PAR_LOG_INFO = 2,
    PAR_LOG_DEBUG = 3,
    PAR_LOG_TRACE = 4,
} par_log_level;

typedef void (*par_log_sink)(par_log_level level, const char *msg, void *ud);

/* Default level: PARITY_LOG (error|warn|info|debug|trace) or warn. */
void par_log_set_level(par_log_level level);
par_log_level par_log_get_level(void);
/* Parse "error".."trace" (or 0..4); returns 0 ok, -1 unknown. */
int par_log_parse_level(const char *s, par_log_level *out);
/* NULL restores stderr. */
void par_log_set_sink(par_log_sink sink, void *ud);
/* A per-thread tag printed before messages, e.g. "rank 3"; NULL clears. */
void par_log_set_thread_tag(const char *tag);
/* The calling thread's tag ("" when none). */
const char *par_log_thread_tag(void);

void par_log(par_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void par_vlog(par_log_level level, const char *fmt, va_list ap);

#define PAR_LOG_E(...) par_log(PAR_LOG_ERROR, __VA_ARGS__)
#define PAR_LOG_W(...) par_log(PAR_LOG_WARN, __VA_ARGS__)
#define PAR_LOG_I(...) par_log(PAR_LOG_INFO, __VA_ARGS__)
#define PAR_LOG_D(...) par_log(PAR_LOG_DEBUG, __VA_ARGS__)

#endif
