/* PLACEHOLDER: replaced by the module that implements 'eaglegen bench'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_bench(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen bench: not built yet\n");
    return 2;
}
