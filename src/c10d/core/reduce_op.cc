#include "c10d/core/reduce_op.h"
