#include "store/store.h"  // the store, beside it
