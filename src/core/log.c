#include "core/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static par_log_level cur_level = PAR_LOG_WARN;
static int level_from_env_done;
static par_log_sink sink;
static void *sink_ud;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local char thread_tag[48];

static const char *level_names[] = {"error", "warn", "info", "debug", "trace"};

int par_log_parse_level(const char *s, par_log_level *out)
{
    for (int i = 0; i <= PAR_LOG_TRACE; i++) {
        if (!strcmp(s, level_names[i]) || (s[0] == '0' + i && !s[1])) {
            *out = (par_log_level)i;
            return 0;
        }
    }
    return -1;
}

static void init_from_env(void)
{
    if (level_from_env_done)
        return;
    level_from_env_done = 1;
    const char *e = getenv("PARITY_LOG");
    par_log_level l;
    if (e && par_log_parse_level(e, &l) == 0)
        cur_level = l;
}

void par_log_set_level(par_log_level level)
{
    level_from_env_done = 1;
    cur_level = level;
}

par_log_level par_log_get_level(void)
{
    init_from_env();
    return cur_level;
}

void par_log_set_sink(par_log_sink s, void *ud)
{
    pthread_mutex_lock(&log_mu);
    sink = s;
    sink_ud = ud;
    pthread_mutex_unlock(&log_mu);
}

void par_log_set_thread_tag(const char *tag)
{
    if (!tag)
        thread_tag[0] = '\0';
    else
        snprintf(thread_tag, sizeof thread_tag, "%s", tag);
}

const char *par_log_thread_tag(void) { return thread_tag; }

void par_vlog(par_log_level level, const char *fmt, va_list ap)
{
    init_from_env();
    if (level > cur_level)
        return;
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    pthread_mutex_lock(&log_mu);
    if (sink) {
        sink(level, msg, sink_ud);
    } else {
        if (thread_tag[0])
            fprintf(stderr, "parity: %s: [%s] %s\n", level_names[level], thread_tag, msg);
        else
            fprintf(stderr, "parity: %s: %s\n", level_names[level], msg);
    }
    pthread_mutex_unlock(&log_mu);
}

void par_log(par_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    par_vlog(level, fmt, ap);
    va_end(ap);
}
