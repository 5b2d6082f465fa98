#include <stdio.h>
#include "kvq/kvq.h"
int main(void) { printf("kvq %s\n", kvq_version()); return 0; }
