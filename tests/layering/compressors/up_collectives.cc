#include "collectives/collectives.h"  // the core's collectives, above the compressors
