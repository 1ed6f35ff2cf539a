#include "compressors/codec.h"  // the compressors, above base
