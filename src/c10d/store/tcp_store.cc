#include "c10d/store/tcp_store.h"
