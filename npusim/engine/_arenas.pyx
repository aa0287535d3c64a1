# cython: language_level=3
"""CPython's object arenas carved from maps advised for transparent huge pages.

pymalloc takes its 1 MiB arenas from the arena allocator (PyObject_SetArenaAllocator);
this one hands out arenas from large reserved maps advised MADV_HUGEPAGE, so the kernel
backs them in 2 MiB pages, and passes every other request (the interpreter's frame stack
chunks) to the allocator it replaced. A freed arena gives its memory back (MADV_DONTNEED)
and its address range is handed out again first. Requests arrive with the GIL held, one
at a time. Where an object lives never changes what it computes.
"""

cdef extern from *:
    """
    #include <sys/mman.h>
    #ifndef MAP_NORESERVE
    #define MAP_NORESERVE 0
    #endif
    #ifndef MAP_ANONYMOUS
    #define MAP_ANONYMOUS MAP_ANON
    #endif
    #ifndef MADV_HUGEPAGE
    #define MADV_HUGEPAGE -1
    #endif
    """
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset) nogil
    int madvise(void* addr, size_t length, int advice) nogil
    int PROT_READ
    int PROT_WRITE
    int MAP_PRIVATE
    int MAP_ANONYMOUS
    int MAP_NORESERVE
    int MADV_HUGEPAGE
    int MADV_DONTNEED
    void* MAP_FAILED

cdef extern from "Python.h":
    ctypedef struct PyObjectArenaAllocator:
        void* ctx
        void* (*alloc)(void* ctx, size_t size) noexcept nogil
        void (*free)(void* ctx, void* ptr, size_t size) noexcept nogil
    void PyObject_GetArenaAllocator(PyObjectArenaAllocator* allocator)
    void PyObject_SetArenaAllocator(PyObjectArenaAllocator* allocator)

cdef enum:
    MAX_MAPS = 1024
    MAX_FREE = 65536
    HUGE = 2 * 1024 * 1024

cdef PyObjectArenaAllocator _replaced
cdef PyObjectArenaAllocator _mine
cdef bint _installed = False
cdef size_t _arena = 0  # the size of a pymalloc arena: the only request served here
cdef size_t _map_bytes = 0  # each reserved map, a multiple of 2 MiB
cdef char* _maps[MAX_MAPS]
cdef int _n_maps = 0
cdef size_t _top = 0  # bytes handed out of the newest map
cdef void* _free[MAX_FREE]
cdef int _n_free = 0
cdef long _arenas_live = 0
cdef long _arenas_most = 0


cdef char* _reserve() noexcept nogil:
    """A new map of _map_bytes at a 2 MiB boundary (NULL if none can be had)."""
    cdef void* p = mmap(NULL, _map_bytes + HUGE, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if p == MAP_FAILED:
        return NULL
    cdef size_t at = ((<size_t>p) + HUGE - 1) & ~(<size_t>(HUGE - 1))
    if MADV_HUGEPAGE >= 0:
        madvise(<void*>at, _map_bytes, MADV_HUGEPAGE)
    return <char*>at


cdef bint _ours(void* ptr) noexcept nogil:
    cdef char* c = <char*>ptr
    cdef int i
    for i in range(_n_maps):
        if c >= _maps[i] and c < _maps[i] + _map_bytes:
            return True
    return False


cdef void* _alloc(void* ctx, size_t size) noexcept nogil:
    global _n_free, _n_maps, _top, _arenas_live, _arenas_most
    cdef char* fresh
    cdef void* p = NULL
    if size == _arena:
        if _n_free:
            _n_free -= 1
            p = _free[_n_free]
        else:
            if _n_maps == 0 or _top + size > _map_bytes:
                fresh = _reserve() if _n_maps < MAX_MAPS else NULL
                if fresh != NULL:
                    _maps[_n_maps] = fresh
                    _n_maps += 1
                    _top = 0
            if _n_maps and _top + size <= _map_bytes:
                p = _maps[_n_maps - 1] + _top
                _top += size
        if p != NULL:
            _arenas_live += 1
            if _arenas_live > _arenas_most:
                _arenas_most = _arenas_live
            return p
    return _replaced.alloc(_replaced.ctx, size)


cdef void _release(void* ctx, void* ptr, size_t size) noexcept nogil:
    global _n_free, _arenas_live
    if size == _arena and _ours(ptr):
        madvise(ptr, size, MADV_DONTNEED)  # its memory back; the range is reused first
        _arenas_live -= 1
        if _n_free < MAX_FREE:
            _free[_n_free] = ptr
            _n_free += 1
        return
    _replaced.free(_replaced.ctx, ptr, size)


def install(size_t arena_bytes, size_t map_bytes) -> bool:
    """Serve pymalloc's arenas of `arena_bytes` from maps of `map_bytes` (rounded up to
    2 MiB); True once installed (again: nothing more), False if no map could be had."""
    global _installed, _arena, _map_bytes, _n_maps, _top
    if _installed:
        return True
    _arena = arena_bytes
    _map_bytes = (map_bytes + HUGE - 1) & ~(<size_t>(HUGE - 1))
    cdef char* first = _reserve()
    if first == NULL:
        return False
    _maps[0] = first
    _n_maps = 1
    _top = 0
    PyObject_GetArenaAllocator(&_replaced)
    _mine.ctx = NULL
    _mine.alloc = _alloc
    _mine.free = _release
    PyObject_SetArenaAllocator(&_mine)
    _installed = True
    return True


def counts() -> dict:
    """Arenas served here now and at most, maps reserved, their bytes, and the ranges
    reserved as (start, end) addresses."""
    return {"arenas": _arenas_live, "arenas_most": _arenas_most, "maps": _n_maps,
            "map_bytes": _map_bytes,
            "ranges": [(<size_t>_maps[i], <size_t>_maps[i] + _map_bytes)
                       for i in range(_n_maps)]}
