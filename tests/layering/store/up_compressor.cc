#include "compressors/codec.h"  // a compressor, beside the transports, above the store
