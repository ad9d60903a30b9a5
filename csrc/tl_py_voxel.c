/* Binding of voxelize and devoxelize. */
#include "tl_py.h"

PyMethodDef tl_py_voxel_methods[] = {
    {NULL, NULL, 0, NULL},
};
