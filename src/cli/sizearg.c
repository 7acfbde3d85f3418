/* cli/sizearg.c - memory sizes on the command line (see cli/sizearg.h). */
#include "cli/sizearg.h"

#include <math.h>
#include <stdlib.h>
#include <strings.h>

int par_size_parse(const char *s, double *bytes)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1}, {"b", 1}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
                 {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
    if (!s || !*s)
        return -1;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(end, units[i].unit)) {
            double b = v * units[i].mult;
            if (!isfinite(b))
                return -1;
            *bytes = b;
            return 0;
        }
    return -1;
}
