// The control: the transports' headers compile with the transports' include
// directories alone (base, the public headers, transport/, store/ and cuda/).
#include "env.h"
#include "store/store.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_wire.h"
