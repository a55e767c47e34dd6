# cython: language_level=3
"""ndarray checks and allocation at the C level (no argument parsing), shared by the Cython modules."""

cimport numpy as cnp
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF

cdef extern from "numpy/arrayobject.h":
    PyTypeObject PyArray_Type
    # steals a reference to ``descr``
    object _new_from_descr "PyArray_NewFromDescr" (PyTypeObject* subtype, PyObject* descr, int nd,
                                                   cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                                   int flags, PyObject* obj)
    int NPY_ITEM_REFCOUNT  # dtype flag: items hold object references


cdef inline object new_array(object descr, int nd, cnp.npy_intp* dims):
    """An uninitialised C-contiguous array of dtype ``descr`` and shape ``dims[:nd]``."""
    Py_INCREF(descr)
    return _new_from_descr(&PyArray_Type, <PyObject*>descr, nd, dims, NULL, NULL, 0, NULL)


cdef inline bint plain_array(object a, int typenum, int ndim):
    """``a`` is an exact ndarray, C-contiguous and aligned (its data can be read in place), of ``typenum`` (-1: any
    dtype without object references) and ``ndim`` dimensions (-1: at least one)."""
    if not cnp.PyArray_CheckExact(a):
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if not (cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)):
        return False
    if ndim < 0:
        if cnp.PyArray_NDIM(arr) < 1:
            return False
    elif cnp.PyArray_NDIM(arr) != ndim:
        return False
    if typenum < 0:
        return not (cnp.PyDataType_FLAGS(<cnp.dtype><PyObject*>cnp.PyArray_DESCR(arr)) & NPY_ITEM_REFCOUNT)
    return cnp.PyArray_TYPE(arr) == typenum


cdef inline cnp.npy_intp row_bytes(cnp.ndarray arr):
    """Bytes of one row (``arr[i]``) of a C-contiguous array with at least one dimension."""
    cdef cnp.npy_intp d, size = cnp.PyArray_ITEMSIZE(arr)
    for d in range(1, cnp.PyArray_NDIM(arr)):
        size *= cnp.PyArray_DIMS(arr)[d]
    return size
