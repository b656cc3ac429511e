"""prunereg's own stdout and stderr, which nothing else in the process can write to, close or redirect.

A command's output is the program's contract (``--json`` must parse), but
plugins and libraries share the process: they print to ``sys.__stdout__``,
print from ``atexit`` handlers, replace or close ``sys.stdout``. So for the
length of a command, :func:`own_streams` takes private duplicates of the file
descriptors of stdout and stderr before any plugin loads, makes
``sys.stdout``/``sys.stderr`` (which click and prunereg write to) file objects
on those duplicates, and points file descriptor 1 itself at stderr: whatever
anyone else writes to stdout, through any object or straight to the
descriptor, lands on stderr. When the program ends after the command (click's
standalone mode), descriptor 1 stays pointed at stderr, so ``atexit`` output
does too; otherwise it is restored.

A reader that goes away early (``prunereg list | head -1``) ends the command
quietly, as it ends a Unix tool: no traceback, exit status 141 (128 + SIGPIPE,
what a shell reports for a tool that SIGPIPE ended).

Where stdout and stderr are no real descriptors (a test runner's capture, a
notebook), the streams are left as they are: plugin code still prints to
stderr (:mod:`prunereg._plugins.isolation`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import TextIO

STDOUT, STDERR = 1, 2
#: The exit status of a command whose reader closed the pipe: what a shell shows for a tool that SIGPIPE ended.
CLOSED_PIPE_STATUS = 128 + int(getattr(signal, "SIGPIPE", 13))


@contextlib.contextmanager
def own_streams(*, until_exit: bool) -> Iterator[None]:
    """Run a command with prunereg's output on private duplicates of stdout and stderr (see the module).

    ``until_exit``: the process ends after the block, so descriptor 1 keeps
    pointing at stderr for whatever runs at exit.
    """
    if not _real_standard_streams():
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    own_out = _duplicate(sys.stdout, STDOUT)
    own_err = _duplicate(sys.stderr, STDERR)
    os.dup2(STDERR, STDOUT)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = own_out, own_err
    closed_pipe = False
    try:
        yield
    except BrokenPipeError:
        closed_pipe = True
    finally:
        for stream in (own_out, own_err):
            try:
                stream.flush()
            except BrokenPipeError:
                closed_pipe = True
            except Exception:  # a stream that cannot flush has nothing left to say
                pass
        sys.stdout, sys.stderr = saved
        if not until_exit:
            os.dup2(own_out.fileno(), STDOUT)
        for stream in (own_out, own_err):
            try:  # a closed pipe fails the flush inside close too; the descriptor is closed all the same
                stream.close()
            except BrokenPipeError:
                closed_pipe = True
    if closed_pipe:
        raise SystemExit(CLOSED_PIPE_STATUS)


def _real_standard_streams() -> bool:
    """Whether ``sys.stdout`` and ``sys.stderr`` are the process's own, on descriptors 1 and 2."""
    stdout: TextIO | None = sys.stdout
    stderr: TextIO | None = sys.stderr
    try:
        descriptors = (stdout.fileno(), stderr.fileno()) if stdout and stderr else None
    except (AttributeError, OSError, ValueError):
        return False
    return descriptors == (STDOUT, STDERR) and stdout is sys.__stdout__ and stderr is sys.__stderr__


def _duplicate(stream: TextIO, descriptor: int) -> TextIO:
    """A text file object like ``stream`` on a private duplicate of ``descriptor``."""
    return open(  # closed by own_streams
        os.dup(descriptor),
        "w",
        encoding=stream.encoding,
        errors=stream.errors,
        buffering=1 if stream.line_buffering else -1,
    )
