/* PLACEHOLDER: replaced by the module that implements 'eaglegen mkmodel'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_mkmodel(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen mkmodel: not built yet\n");
    return 2;
}
