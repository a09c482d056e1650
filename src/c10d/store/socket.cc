#include "c10d/store/socket.h"
