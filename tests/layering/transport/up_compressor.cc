#include "compressors/codec.h"  // a compressor: the transports move bytes, never payload formats
