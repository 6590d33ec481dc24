/* wsgi.file_wrapper: iterates a file-like object in blocks; the server
 * recognises it and uses sendfile() when it wraps a real regular file. */
#include "glue.h"

#include <structmember.h>

static int fwr_init(PyObject *self_, PyObject *args, PyObject *kwds)
{
    FileWrapperObject *self = (FileWrapperObject *)self_;
    static char *kwlist[] = { "filelike", "blksize", NULL };
    PyObject *f;
    Py_ssize_t blksize = 8192;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|n:FileWrapper", kwlist, &f, &blksize))
        return -1;
    if (blksize <= 0) {
        PyErr_SetString(PyExc_ValueError, "blksize must be positive");
        return -1;
    }
    Py_INCREF(f);
    Py_XSETREF(self->filelike, f);
    self->blksize = blksize;
    return 0;
}

static PyObject *fwr_iter(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

static PyObject *fwr_next(PyObject *self_)
{
    FileWrapperObject *self = (FileWrapperObject *)self_;
    if (!self->filelike)
        return NULL;
    PyObject *data = PyObject_CallMethod(self->filelike, "read", "n", self->blksize);
    if (!data)
        return NULL;
    if (PyObject_Length(data) == 0) {
        if (PyErr_Occurred())
            PyErr_Clear();
        Py_DECREF(data);
        return NULL;
    }
    return data;
}

static PyObject *fwr_close(PyObject *self_, PyObject *unused)
{
    (void)unused;
    FileWrapperObject *self = (FileWrapperObject *)self_;
    if (self->filelike && PyObject_HasAttrString(self->filelike, "close")) {
        PyObject *r = PyObject_CallMethod(self->filelike, "close", NULL);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static void fwr_dealloc(PyObject *self_)
{
    FileWrapperObject *self = (FileWrapperObject *)self_;
    Py_XDECREF(self->filelike);
    Py_TYPE(self_)->tp_free(self_);
}

static PyMethodDef fwr_methods[] = {
    { "close", fwr_close, METH_NOARGS, "close the wrapped file" },
    { NULL, NULL, 0, NULL },
};

static PyMemberDef fwr_members[] = {
    { "filelike", T_OBJECT, offsetof(FileWrapperObject, filelike), READONLY, NULL },
    { "blksize", T_PYSSIZET, offsetof(FileWrapperObject, blksize), READONLY, NULL },
    { NULL, 0, 0, 0, NULL },
};

PyTypeObject FileWrapper_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkwsgi._forkwsgi.FileWrapper",
    .tp_basicsize = sizeof(FileWrapperObject),
    .tp_dealloc = fwr_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_iter = fwr_iter,
    .tp_iternext = fwr_next,
    .tp_methods = fwr_methods,
    .tp_members = fwr_members,
    .tp_init = fwr_init,
    .tp_new = PyType_GenericNew,
    .tp_doc = "FileWrapper(filelike, blksize=8192): wsgi.file_wrapper",
};
