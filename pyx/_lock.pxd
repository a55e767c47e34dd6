# cython: language_level=3
"""POSIX mutexes for the buffer and the sum tree: process-shared and robust where asked, taken without
holding the GIL (try first; when it is busy, wait with the GIL released, so that a holder that needs the
GIL cannot deadlock with us)."""

from posix.time cimport timespec

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_mutexattr_t:
        pass
    int pthread_mutexattr_init(pthread_mutexattr_t*)
    int pthread_mutexattr_destroy(pthread_mutexattr_t*)
    int pthread_mutexattr_setpshared(pthread_mutexattr_t*, int)
    int pthread_mutexattr_setrobust(pthread_mutexattr_t*, int)
    int pthread_mutexattr_settype(pthread_mutexattr_t*, int)
    int pthread_mutex_init(pthread_mutex_t*, const pthread_mutexattr_t*)
    int pthread_mutex_destroy(pthread_mutex_t*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_trylock(pthread_mutex_t*)
    int pthread_mutex_timedlock(pthread_mutex_t*, const timespec*)
    int pthread_mutex_unlock(pthread_mutex_t*)
    int pthread_mutex_consistent(pthread_mutex_t*)
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)
    enum:
        PTHREAD_PROCESS_SHARED
        PTHREAD_MUTEX_ROBUST
        PTHREAD_MUTEX_ERRORCHECK

cdef extern from "<errno.h>" nogil:
    enum:
        EOWNERDEAD
        EBUSY
        ETIMEDOUT
        EDEADLK


cdef inline int mutex_init(pthread_mutex_t* m, bint robust_shared) noexcept nogil:
    """Initialise ``m``; process-shared, robust and error-checking when ``robust_shared`` (a thread that locks
    it again gets EDEADLK instead of waiting on itself for ever). 0 on success."""
    cdef pthread_mutexattr_t attr
    cdef int rc = pthread_mutexattr_init(&attr)
    if rc:
        return rc
    if robust_shared:
        rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)
        if rc == 0:
            rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)
        if rc == 0:
            rc = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK)
    if rc == 0:
        rc = pthread_mutex_init(m, &attr)
    pthread_mutexattr_destroy(&attr)
    return rc


cdef inline int mutex_lock_gil(pthread_mutex_t* m):
    """Lock ``m`` while holding the GIL: try, and wait with the GIL released only if it is busy.
    Returns pthread_mutex_lock's result (0, or EOWNERDEAD for a robust mutex whose holder died)."""
    cdef int rc = pthread_mutex_trylock(m)
    if rc == EBUSY:
        with nogil:
            rc = pthread_mutex_lock(m)
    return rc
