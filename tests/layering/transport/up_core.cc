#include "comm_impl.h"  // the core, above the transports
