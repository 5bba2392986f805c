/* PLACEHOLDER: replaced by the module that implements 'eaglegen inspect'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_inspect(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen inspect: not built yet\n");
    return 2;
}
