/* cli/commands.h - the subcommands of `parity`.  Each takes (argc, argv)
 * with argv[0] the subcommand's name and returns the process exit status
 * (CLI.md: 0 success, 1 a check failed, 2 bad usage or unreadable input). */
#ifndef PAR_CLI_COMMANDS_H
#define PAR_CLI_COMMANDS_H

int par_cmd_compare(int argc, char **argv);
int par_cmd_bounds(int argc, char **argv);
int par_cmd_golden(int argc, char **argv);
int par_cmd_run(int argc, char **argv);
int par_cmd_matrix(int argc, char **argv);
int par_cmd_ckpt(int argc, char **argv);
int par_cmd_plan(int argc, char **argv);
int par_cmd_schedule(int argc, char **argv);
int par_cmd_topo(int argc, char **argv);
int par_cmd_export(int argc, char **argv);
int par_cmd_import(int argc, char **argv);

#endif
