// gradcomm: compressed and dense collectives for data-parallel training.
// The umbrella header: include this one.
#pragma once

#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "gradcomm/types.h"
#include "gradcomm/version.h"
