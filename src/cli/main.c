#include <stdio.h>
#include "parity_config.h"
int main(void) { printf("parity %s\n", PARITY_VERSION); return 0; }
