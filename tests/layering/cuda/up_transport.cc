#include "transport/transport.h"  // a transport, above the GPU plumbing
