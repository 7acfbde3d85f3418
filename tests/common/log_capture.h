/* tests/common/log_capture.h - a test's log sink that keeps the lines
 * (core/log.h par_log_set_sink) in one buffer, for asserting what a run
 * reported: logcap_start() before, logcap_stop() after, then read logcap. */
#ifndef PAR_TEST_LOG_CAPTURE_H
#define PAR_TEST_LOG_CAPTURE_H

#include <string.h>

#include "core/log.h"

static char logcap[1 << 14];

static void logcap_sink(par_log_level l, const char *msg, void *ud)
{
    (void)l, (void)ud;
    size_t k = strlen(logcap), n = strlen(msg);
    if (k + n + 2 < sizeof logcap) {
        memcpy(logcap + k, msg, n);
        logcap[k + n] = '\n';
        logcap[k + n + 1] = '\0';
    }
}

static inline void logcap_start(void)
{
    logcap[0] = '\0';
    par_log_set_sink(logcap_sink, NULL);
}

static inline void logcap_stop(void) { par_log_set_sink(NULL, NULL); }

#endif
