/* kernels/mhc.c - placeholder until its owner lands it */
#include "kernels/real.h"
