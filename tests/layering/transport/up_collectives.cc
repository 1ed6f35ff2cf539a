#include "collectives/collectives.h"  // the collectives (core), above the transports
