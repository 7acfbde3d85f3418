/* core/datadir.h - where parity's data lives (fixtures/, golden/).
 *
 * The binary finds its packing fixtures and checked-in golden sets from any
 * working directory.  par_data_dir("fixtures", ...) tries, in order:
 *   1. $PARITY_SOURCE_ROOT/SUB (the test suite sets it);
 *   2. the source tree the build was configured from, when the running
 *      executable lies inside that build's directory (run from a build);
 *   3. the installed data directory next to the binary,
 *      <the binary's dir>/../<datadir>/parity/SUB (relocatable: a --destdir or
 *      moved install works), then <prefix>/<datadir>/parity/SUB
 *      (`meson install` puts fixtures/ and golden/ there);
 *   4. the source tree, if it still exists;
 *   5. ./SUB (the working directory).
 * The choice is logged at info level (`parity --log info ...`).
 * The first that is a directory wins.
 */
#ifndef PAR_CORE_DATADIR_H
#define PAR_CORE_DATADIR_H

#include <stddef.h>

#include "core/status.h"

/* *buf (n bytes) receives the directory; PAR_ENOTFOUND names every place
 * looked at when none exists. */
par_status par_data_dir(const char *sub, char *buf, size_t n);

#endif
