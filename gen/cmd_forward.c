/* PLACEHOLDER: replaced by the module that implements 'eaglegen forward'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_forward(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen forward: not built yet\n");
    return 2;
}
