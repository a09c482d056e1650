#include "c10d/core/reduce.h"
