/* Binding of pair-list kernel maps and the gather-scatter and fetch-on-demand dataflows. */
#include "tl_py.h"

PyMethodDef tl_py_dataflow_methods[] = {
    {NULL, NULL, 0, NULL},
};
