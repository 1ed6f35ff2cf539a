// The control of layering.trainer_uses_public_api: an internal header, which the
// trainer's include rule must refuse.
#include "gradcomm/communicator.h"
#include "introspect.h"
