#include "dsmla/dsmla.h"
extern "C" const char* dsmla_version(void) { return "0.1.0"; }
