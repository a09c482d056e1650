#include "c10d/store/tcp_server.h"
