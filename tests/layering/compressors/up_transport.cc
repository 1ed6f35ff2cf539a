#include "transport/transport.h"  // a transport: beside the compressors, never below them
