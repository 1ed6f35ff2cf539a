// The control: cuda/'s host headers compile with its include directories alone (base,
// the public headers, cuda/ and the CUDA toolkit's).
#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cublas_loader.h"
#include "cuda/device.h"
#include "cuda/device_status.h"
#include "half.h"
