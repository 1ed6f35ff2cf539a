// The control: every base header compiles with base's include directories alone.
#include "cpu_features.h"
#include "env.h"
#include "half.h"
#include "half_bulk.h"
#include "logging.h"
#include "reduce.h"
