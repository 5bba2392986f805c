/* PLACEHOLDER: replaced by the module that implements 'eaglegen merge'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_merge(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen merge: not built yet\n");
    return 2;
}
