"""Process titles ("forkwsgi: master", "forkwsgi: worker 3") for ps and top."""
import ctypes

try:
    import setproctitle as _spt
except ImportError:  # pragma: no cover - it is a declared dependency
    _spt = None

_PR_SET_NAME = 15


def set(title):
    if _spt is not None:
        _spt.setproctitle(title)
        return
    try:   # at least the kernel's 15-byte comm
        libc = ctypes.CDLL(None)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
