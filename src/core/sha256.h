/* core/sha256.h - SHA-256 digests (nettle) of memory and files.
 *
 * Digests are written as 64 lowercase hex characters plus a NUL, the form
 * manifest.json stores under "files".
 */
#ifndef PAR_CORE_SHA256_H
#define PAR_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define PAR_SHA256_BYTES 32
#define PAR_SHA256_HEX 65 /* 64 hex characters and the NUL */

/* Raw digest of n bytes. */
void par_sha256(const void *data, size_t n, uint8_t out[PAR_SHA256_BYTES]);
/* Lowercase hex digest of n bytes. */
void par_sha256_hex(const void *data, size_t n, char out[PAR_SHA256_HEX]);
/* Lowercase hex digest of a file's contents, read in chunks.
 * PAR_EIO (message names the file) when it cannot be opened or read. */
par_status par_sha256_file(const char *path, char out[PAR_SHA256_HEX]);
/* 1 if s is exactly 64 hex characters (either case), else 0. */
int par_sha256_hex_valid(const char *s);

#endif
