#include "c10d/store/wire.h"
