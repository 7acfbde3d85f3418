/* comm/trace.h - what the virtual clocks recorded, for people and tools.
 *
 * par_trace_write_chrome writes the Chrome trace event format
 * ({"traceEvents": [...]}, opens in Perfetto / chrome://tracing): one
 * process per rank, thread 0 "compute", thread 1 "comm" (collective steps
 * and the blocked part of waits, idle waits named "wait <op>"), thread 2
 * "p2p in flight" (point-to-point transfers, which may overlap compute).
 * Every span is a complete event ("ph": "X", microseconds of emulated time)
 * with args {bytes, tier, group, step} (compute: {flops, bytes}).
 *
 * par_trace_summary prints one line per rank: total emulated time, compute,
 * exposed communication, idle, and megabytes sent per tier; then min, mean
 * and max over ranks.  See docs/network.md.
 */
#ifndef PAR_COMM_TRACE_H
#define PAR_COMM_TRACE_H

#include <stdio.h>

#include "comm/clock.h"
#include "core/status.h"

/* Atomic write (core/fileio.h).  A collector made without record_spans
 * gives a trace with the rank names only. */
par_status par_trace_write_chrome(const par_netrun *r, const char *path);
/* max_rows > 0: with more ranks than that, only the first and last
 * max_rows/2 rank lines are printed (the aggregates always). */
void par_trace_summary(const par_netrun *r, FILE *f, int max_rows);

#endif
