"""Child-process helpers shared by the launcher (launch.py) and LocalCluster (testing.py)."""
import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """preexec_fn for subprocess.Popen: the child gets SIGKILL when the thread that forked it
    exits (PR_SET_PDEATHSIG), so nothing outlives a parent killed outright. Best effort."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
