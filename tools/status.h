/* `dloco status ADDR|STORE [--json] [--watch [SECONDS]]`: the live view of a
 * running synchronizer (its /status.json) or the offline view of a store,
 * as text or as one JSON document (docs/OPERATING.md "Status"). */
#ifndef DL_TOOLS_STATUS_H
#define DL_TOOLS_STATUS_H

/* argv[0] is the ADDR or STORE; returns the process exit code (0 ok, 1 the
 * target could not be read, 2 bad usage). */
int dl_status_main(int argc, char **argv);

#endif
