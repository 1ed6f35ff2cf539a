#include "transport/ucx/ucx_transport.h"  // a transport, above base
