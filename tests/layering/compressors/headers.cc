// The control: the compressors' CPU headers compile with the compressors' include
// directories alone (base, the public headers, compressors/ and cuda/).
#include "compressors/codec.h"
#include "compressors/payload.h"
#include "compressors/philox.h"
#include "compressors/lowrank/powersgd_logic.h"
#include "compressors/spec.h"
#include "compressors/sparse/topk_logic.h"
#include "half.h"
