/* coverage.c: write gcov's counters on demand, for `make coverage`.
 *
 * libgcov writes its .gcda files from an exit handler, which _exit() skips;
 * forkwsgi's workers and the offload sibling end with os._exit(). The
 * coverage build (FORKWSGI_COVERAGE=1, setup.py) calls this first (a
 * sitecustomize in the coverage tree wraps os._exit). Elsewhere it does
 * nothing. */
#include "glue.h"

#ifdef FORKWSGI_COVERAGE
extern void __gcov_dump(void);

void fw_coverage_dump(void)
{
    __gcov_dump();
}
#else
void fw_coverage_dump(void)
{
}
#endif
