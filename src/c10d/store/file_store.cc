#include "c10d/store/file_store.h"
