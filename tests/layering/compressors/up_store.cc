#include "store/store.h"  // the rendezvous store, part of the core
