/* cli/fingerprint.h - the whole configuration of a `parity run`, as
 * "key=value" lines, which the MPI backend compares over processes
 * (comm.h par_world_opts.fingerprint): the model and training keys, the
 * layout, the data source and its sha256, the seed, the precision, the
 * steps and checkpoint settings, the network flags and the build. */
#ifndef PAR_CLI_FINGERPRINT_H
#define PAR_CLI_FINGERPRINT_H

#include "cli/netargs.h"
#include "parallel/train/run.h"

/* A malloc'd text (free it), or NULL on a failure (message set). */
char *par_run_fingerprint(const par_run_opts *o, const char *moe_dispatch, const par_net_args *na);

#endif
