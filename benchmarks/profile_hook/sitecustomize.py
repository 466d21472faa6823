"""Profile a `gazette serve` process's event loop thread with cProfile (benchmarks only).

Put this directory first on a broker's PYTHONPATH and set GAZETTE_PROFILE_DIR: the process
profiles its main thread (the event loop: the broker's Python) from start-up. START_SIGNAL
(SIGRTMIN+3) clears what was collected so far (the start of a measured window); DUMP_SIGNAL
(SIGRTMIN+4) writes it to `<dir>/<pid>.prof` and starts collecting afresh (its end); with
GAZETTE_PROFILE_NOTIFY_PARENT set, the parent then gets WRITTEN_SIGNAL (SIGRTMIN+5). Real-time
signals, as SIGUSR1 is the broker's own (broker/task_dump.py). Without GAZETTE_PROFILE_DIR this
module does nothing. Used by benchmarks/profile_broker_append.py.
"""

import cProfile
import os
import signal

START_SIGNAL = signal.SIGRTMIN + 3
DUMP_SIGNAL = signal.SIGRTMIN + 4
# Sent to the parent process once a profile is written, if GAZETTE_PROFILE_NOTIFY_PARENT is set.
WRITTEN_SIGNAL = signal.SIGRTMIN + 5

_dir = os.environ.get("GAZETTE_PROFILE_DIR")
if _dir:
    _profile = [cProfile.Profile()]

    def _reset(signum: int, frame: object) -> None:
        _profile[0].disable()
        _profile[0] = cProfile.Profile()
        _profile[0].enable()

    def _dump(signum: int, frame: object) -> None:
        profile = _profile[0]
        profile.disable()
        path = os.path.join(_dir, f"{os.getpid()}.prof")
        profile.dump_stats(path + ".tmp")
        os.replace(path + ".tmp", path)  # Whole when it appears.
        if os.environ.get("GAZETTE_PROFILE_NOTIFY_PARENT"):
            os.kill(os.getppid(), WRITTEN_SIGNAL)  # The harness waits for it.
        _reset(signum, frame)

    signal.signal(START_SIGNAL, _reset)
    signal.signal(DUMP_SIGNAL, _dump)
    _profile[0].enable()
