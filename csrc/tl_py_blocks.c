/* Binding of the building blocks: voxelize, devoxelize, pooling. */
#include "tl_py.h"

PyMethodDef tl_py_blocks_methods[] = {
    {NULL, NULL, 0, NULL},
};
