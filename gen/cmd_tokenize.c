/* PLACEHOLDER: replaced by the module that implements 'eaglegen tokenize'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_tokenize(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen tokenize: not built yet\n");
    return 2;
}
