/* The version string; see version.h. The Makefile writes gen_version.h (the git commit)
 * into the build directory, rewriting it only when the commit changes. */
#include "gen/version.h"

#include "gen_version.h"

const char *gen_version(void) { return EG_RELEASE " (git " EG_GIT_DESCRIBE ")"; }
