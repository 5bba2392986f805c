/* version.h — the eaglegen version: a release number and the git commit the binary was
 * built from ("0.1.0 (git e1a50b6-dirty)"; "(git unknown)" outside a checkout). Printed
 * by `eaglegen --version` and recorded in every job and manifest.
 * Thread safety: constant data. */
#ifndef EG_GEN_VERSION_H
#define EG_GEN_VERSION_H

#define EG_RELEASE "0.1.0"

const char *gen_version(void);

#endif
