"""A process that ends with its parent, however the parent ends (`kill -9` included).

On Linux the kernel signals the process the moment its parent exits (prctl PR_SET_PDEATHSIG); everywhere,
a watchdog thread notices that the process was reparented. Arming the signal races with the parent's
exit, so a caller arms first and only then checks that its parent is still the one it expects: a parent
that exits later is the kernel's to report.

Standard library only: a web process arms it first thing, before it imports the service (seconds of CPU
on a loaded machine, during which its supervisor may be killed).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

# How often a watchdog looks for its parent (a process outliving its parent by this much is fine).
WATCHDOG_INTERVAL_S = 0.5
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def signal_on_parent_death(signal_number: int) -> None:
    """Ask the kernel to send this process `signal_number` when its parent exits (Linux; elsewhere a
    no-op: the callers' watchdogs notice instead). Arm it from the main thread."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal_number, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


# (parent pid, signal) of this process's end_with_parent, which stop_in_order changes.
_armed: list[int] = []


def end_with_parent(parent_pid: int, *, signal_number: int) -> None:
    """Send this process `signal_number` once its parent, `parent_pid`, is gone: at once if it is gone
    already, else the moment it exits (the kernel's signal, and a watchdog thread where that is missing).

    With the signal's default action the process ends there; a process that handles it (uvicorn's
    SIGTERM handler) stops in order. Call it once, from the main thread."""
    _armed[:] = [parent_pid, signal_number]
    _arm()

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCHDOG_INTERVAL_S)
        os.kill(os.getpid(), _armed[1])

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def stop_in_order_with_parent() -> None:
    """From now on, send SIGTERM (not the signal end_with_parent armed) when the parent is gone: for a
    web process once it has something to stop in order (its search pool, the requests it answers).
    A no-op in a process that did not call end_with_parent."""
    if _armed:
        _armed[1] = signal.SIGTERM
        _arm()


def _arm() -> None:
    parent_pid, signal_number = _armed
    signal_on_parent_death(signal_number)
    if os.getppid() != parent_pid:  # it exited before the signal was armed: nobody else will report it
        os.kill(os.getpid(), signal_number)
