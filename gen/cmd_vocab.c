/* PLACEHOLDER: replaced by the module that implements 'eaglegen vocab'. */
#include <stdio.h>
#include "gen/commands.h"
int cmd_vocab(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "eaglegen vocab: not built yet\n");
    return 2;
}
