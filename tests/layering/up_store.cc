#include "store/store.h"  // the store (core), above base
