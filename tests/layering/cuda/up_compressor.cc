#include "compressors/codec.h"  // a compressor, above the GPU plumbing
