/* commands.h — the eaglegen subcommands. Each cmd_* parses its own arguments, prints
 * its own --help, reports errors on stderr and returns the process exit code
 * (0 ok, 1 runtime failure, 2 usage error, 130 interrupted). Only gen/ exits. */
#ifndef EG_COMMANDS_H
#define EG_COMMANDS_H

int cmd_forward(int argc, char **argv);   /* engine: teacher-forced tensors to safetensors */
int cmd_mkmodel(int argc, char **argv);   /* engine: random-weights model in HF layout */
int cmd_bench(int argc, char **argv);     /* engine: prefill/decode tokens/s */
int cmd_fidelity(int argc, char **argv);  /* engine: precision vs reference; dataset audit */
int cmd_plan(int argc, char **argv);      /* engine: pipeline split and memory plan */
int cmd_tokenize(int argc, char **argv);  /* prompts: JSONL in, ids out */
int cmd_inspect(int argc, char **argv);   /* dataset: summary, --verify, --json */
int cmd_vocab(int argc, char **argv);     /* dataset: draft vocabulary d2t/t2d */
int cmd_export(int argc, char **argv);    /* dataset: a trainer's own layout */
int cmd_generate(int argc, char **argv);  /* gen: the pipeline over a corpus */
int cmd_merge(int argc, char **argv);     /* gen: merge worker datasets */
int cmd_repair(int argc, char **argv);    /* gen: set damaged shards aside for regeneration */

#endif
