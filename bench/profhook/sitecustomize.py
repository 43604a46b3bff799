"""Loaded by a daemon started with `PYTHONPATH=bench/profhook` and `MQS_PROFILE=<file>`
(`burst.py --profile FILE`): SIGUSR1 starts cProfile on the main thread (the event loop),
SIGUSR2 stops it and writes the stats to the file (read them with `python -m pstats FILE`)."""

import os

if os.environ.get("MQS_PROFILE"):
    import cProfile
    import signal

    _profile = cProfile.Profile()

    def _start(*_: object) -> None:
        _profile.enable()

    def _stop(*_: object) -> None:
        _profile.disable()
        _profile.dump_stats(os.environ["MQS_PROFILE"])

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
