/* Binding of the CUDA entry points (csrc/cuda/).  Compiled in every build;
 * without TL_WITH_CUDA the queries report that CUDA is absent. */
#include "tl_py.h"

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda_device.h"
#endif

PyDoc_STRVAR(cuda_compiled_doc, "cuda_compiled() -> bool\n\nWhether CUDA kernels are built in.");
static PyObject *py_cuda_compiled(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#ifdef TL_WITH_CUDA
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

PyDoc_STRVAR(cuda_device_count_doc,
             "cuda_device_count() -> int\n\n"
             "Usable CUDA devices; 0 without a GPU, a driver or a CUDA build.");
static PyObject *py_cuda_device_count(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    int count = 0;
#ifdef TL_WITH_CUDA
    tl_status st = tl_cuda_device_count(&count);
    if (st != TL_OK) return tl_raise("cuda_device_count", st);
#endif
    return PyLong_FromLong(count);
}

PyMethodDef tl_py_cuda_methods[] = {
    {"cuda_compiled", py_cuda_compiled, METH_NOARGS, cuda_compiled_doc},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS, cuda_device_count_doc},
    {NULL, NULL, 0, NULL},
};
