#include "tl_status.h"

const char *tl_status_str(tl_status s) {
    switch (s) {
    case TL_OK: return "ok";
    case TL_ERR_INVALID: return "invalid argument";
    case TL_ERR_NOMEM: return "out of memory";
    case TL_ERR_OVERFLOW: return "size or coordinate overflows its type";
    case TL_ERR_DUPLICATE: return "duplicate coordinate row";
    case TL_ERR_CAPACITY: return "output buffer too small";
    case TL_ERR_UNSUPPORTED: return "not supported by this build";
    case TL_ERR_CUDA: return "CUDA runtime error";
    }
    return "unknown status";
}
