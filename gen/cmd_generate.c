/* PLACEHOLDER: replaced by the module that implements 'eaglegen generate'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_generate(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen generate: not built yet\n");
    return 2;
}
