/* cli/sizearg.h - memory sizes on the command line: "80GB" (1e9), "80GiB"
 * (2^30), "512MB", "1.5TB", "1000000" (bytes); units B, KB, MB, GB, TB and
 * KiB, MiB, GiB, TiB, case-insensitive. */
#ifndef PAR_CLI_SIZEARG_H
#define PAR_CLI_SIZEARG_H

/* *bytes = the size; 0 on success, -1 (and *bytes untouched) for text that
 * is not a positive finite size. */
int par_size_parse(const char *s, double *bytes);

#endif
