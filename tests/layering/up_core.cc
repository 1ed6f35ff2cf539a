#include "comm_impl.h"  // the core, above base: must not be reachable from base
