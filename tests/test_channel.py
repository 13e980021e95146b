"""The trainer's end of the helper's channel: how a death is told, waits Ctrl-C can break, slots, a cut start."""

from __future__ import annotations

import signal
import sys

import pytest

from audiobuffer._channel import death_message

pytestmark = pytest.mark.timeout(120)


class Ended:
    """What death_message reads of a subprocess.Popen: a process that ended with ``code``."""

    pid = 42

    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_a_posix_death_is_told_by_its_exit_code_or_signal(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert death_message(Ended(1)) == ("the helper process (pid 42) exited with code 1: it failed, and its "
                                       "traceback is on stderr, above")
    assert "exited with code 3; a crash in native decoder code" in death_message(Ended(3))
    assert "was killed by SIGTERM" in death_message(Ended(-int(signal.SIGTERM)))
    assert "closed its channel" in death_message(Ended(None))


def test_a_windows_crash_is_told_by_its_status_in_hex_with_its_name(monkeypatch):
    # Windows has no signals: a crash ends the process with an NTSTATUS code, which reads as a name.
    monkeypatch.setattr(sys, "platform", "win32")
    message = death_message(Ended(3221225477))
    assert message.startswith("the helper process (pid 42) ended with status 0xC0000005 (access violation); "
                              "a crash in native decoder code")
    assert "3221225477" not in message and "killed" not in message
    assert "0xC00000FD (stack overflow)" in death_message(Ended(0xC00000FD))
    assert "ended with status 0xC0001234;" in death_message(Ended(0xC0001234))  # a status with no name here
    assert "exited with code 3;" in death_message(Ended(3))


def test_exit_code_1_on_windows_is_a_failure_or_an_end_from_outside_never_a_signal(monkeypatch):
    # TerminateProcess (Popen.kill, the Task Manager, taskkill /F) ends a process with code 1, the same
    # code as the helper's own failure: the message gives both and calls it neither killed nor signalled.
    monkeypatch.setattr(sys, "platform", "win32")
    message = death_message(Ended(1))
    assert message.startswith("the helper process (pid 42) exited with code 1: it failed")
    assert "TerminateProcess" in message
    assert "killed" not in message and "signal" not in message
