"""Child processes that never outlive the job that started them.

A job's command may start processes of its own (Nsight Compute, compile workers), and a job may be
stopped from outside (a scheduler's SIGTERM, Snakemake killed, Ctrl-C). Two rules keep a stopped
job from leaving anything running beside the next run's job:

* :func:`run` starts a child in a process group of its own and, when it is asked to stop (a signal
  to this process, or the child's time limit), stops the whole group: SIGTERM, :data:`TERM_GRACE_S`
  seconds to write what it finished, then SIGKILL.
* The child also gets the parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``), and every
  ``attnbench`` command sets it on itself (:func:`die_with_parent`, called by ``attnbench.cli.main``):
  a parent killed with SIGKILL, which can forward nothing, still stops its children. The workflow's
  rules ``exec`` their command, so that the parent of a job's first ``attnbench`` process is Snakemake
  itself: when Snakemake is killed, its jobs stop instead of running on as orphans.

Elsewhere than Linux the parent-death signal is not available; a child of a killed parent runs on there.
"""
from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

TERM_GRACE_S = 30  # after SIGTERM, time for a job to write its finished rows before SIGKILL
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


class Stopped(Exception):
    """This process was asked to stop (SIGTERM, SIGINT, SIGHUP) while its child ran; the child is stopped."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class Finished:
    code: int | None  # the exit status (negative: killed by that signal); None when stopped at the time limit
    last_line: str  # the child's last non-empty stderr line ("" when stderr was not relayed)


def _arm_parent_death(sig: int = signal.SIGTERM) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Receive ``sig`` when the parent process (the thread that started this one) ends."""
    parent = os.getppid()
    if _arm_parent_death(sig) and os.getppid() != parent:  # it ended before the signal was armed
        os.kill(os.getpid(), sig)


def exit_text(code: int) -> str:
    """'killed by SIGSEGV' or 'exited with code 3'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def stop_group(proc: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> int:
    """SIGTERM to the child's process group, SIGKILL after ``grace_s``; returns the child's exit status."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone already
            pass
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def run(cmd: list[str], *, env: dict | None = None, timeout_s: float | None = None, relay_stderr: bool = False,
        grace_s: float = TERM_GRACE_S) -> Finished:
    """Run ``cmd`` in its own process group, stopping the group at ``timeout_s`` or when this process is
    signalled (then :class:`Stopped` is raised, after the group is stopped). With ``relay_stderr`` the
    child's stderr is copied to ours and its last line is kept for the caller's error message."""
    tail: collections.deque[str] = collections.deque(maxlen=1)
    proc = subprocess.Popen(cmd, env=env, process_group=0, preexec_fn=_arm_parent_death,
                            stderr=subprocess.PIPE if relay_stderr else None, text=True, errors="replace")
    reader = None
    if relay_stderr:
        def relay():
            for line in proc.stderr:
                sys.stderr.write(line)
                if line.strip():
                    tail.append(line.strip())

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()

    def on_signal(signum, frame):
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s)
            code = None
    except Stopped:
        for sig in STOP_SIGNALS:  # a second signal must not interrupt the stopping
            signal.signal(sig, signal.SIG_IGN)
        stop_group(proc, grace_s)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if reader is not None:
            reader.join(timeout=5)
        sys.stderr.flush()
    return Finished(code, tail[0] if tail else "")
