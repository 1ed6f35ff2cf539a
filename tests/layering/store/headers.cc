// The control: the store's headers compile with the store's include directories
// alone (base, the public headers and store/).
#include "env.h"
#include "store/auth.h"
#include "store/rendezvous.h"
#include "store/socket_util.h"
#include "store/store.h"
#include "store/store_backends.h"
#include "store/tcp_store_protocol.h"
