"""Ctrl-C before a runner or launcher takes over the signals: one KeyboardInterrupt, never a
traceback, never lost; and a stop held back while a checkpoint is written.

While an entry point imports TensorFlow, Reverb and JAX (seconds), SIGINT raises
KeyboardInterrupt, which the CLI turns into one line. Three ways that goes wrong:

- The same stop arrives twice: `kill -INT -PGID` reaches the program directly and again
  through the isolation parent, which forwards what it cannot tell from a terminal's Ctrl-C.
  A second KeyboardInterrupt can land while the first is being handled.
- A KeyboardInterrupt raised while a garbage-collection callback runs (JAX registers one,
  `_xla_gc_callback`, called at every collection) or a `__del__`: Python cannot raise it
  there, prints it as "Exception ignored in ... Traceback ... KeyboardInterrupt" and drops
  it. The traceback reaches the user, and a Ctrl-C that was not an echo is lost: the run
  goes on.
- A KeyboardInterrupt caught by code that meant to catch something else (a broad `except`
  in a library, say): the run goes on as if no Ctrl-C came. `raise_if_swallowed`, called by
  the entry points before anything is launched or written, raises it again.

The first two were seen together in a fresh-clone suite run (2026-11-27,
test_launcher_e2e's Ctrl-C while importing, a `killpg`): one copy was dropped in
`_xla_gc_callback` with its traceback printed, the other gave the one line.

`one_interrupt()` handles those two while it is active: a repeat of SIGINT within `ECHO_SECS` of
the KeyboardInterrupt it raised is the same stop (dropped), a later one raises again (the user
insisting); and a KeyboardInterrupt that Python drops that way is not printed, and SIGINT is
sent again a moment later (`RESEND_SECS`), to be raised in the main flow. The launcher's own
handler (`supervisor.StopSignals`) replaces it while a launch runs and puts it back after; it
uses the same `ECHO_SECS`.

`stop_deferred()` holds SIGINT and SIGTERM while work that a stop must not cut runs (a
checkpoint save) and acts on them after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

_RECEIVED: list[float] = []
"""When `one_interrupt`'s handler got a SIGINT, in its block only: see `raise_if_swallowed`."""


def raise_if_swallowed() -> None:
    """At the last point before a run launches or writes anything (inside `one_interrupt`):
    raises KeyboardInterrupt if a SIGINT came and the process is still here, so the Ctrl-C is
    not lost.

    A KeyboardInterrupt that propagates ends the entry point, so one noted and still here was
    caught by code that meant to catch something else (and the echo of the same stop, within
    `ECHO_SECS`, is dropped by design). Seen once in a fresh-clone suite under memory
    pressure (2026-11-29, test_launcher_e2e's Ctrl-C while importing): a `killpg` SIGINT
    during the launcher's planning was lost and the run went on; which code caught it was not
    found."""
    if _RECEIVED:
        raise KeyboardInterrupt


ECHO_SECS = 0.2
"""A repeat of the same signal within this time is an echo of one stop, not a second request
(what `kill -INT -PGID` gives a process under the isolation parent: two copies within
milliseconds)."""


RESEND_SECS = 0.01
"""How often, after Python dropped a KeyboardInterrupt, the SIGINT is sent again until it is
raised: enough for the collection (or `__del__`) that dropped it to end."""


class _OneInterrupt:
    """The SIGINT handler: KeyboardInterrupt, except for an echo of the last one raised, and
    never while the unraisable hook runs (where Python would drop it too)."""

    def __init__(self) -> None:
        self._raised_at: float | None = None
        self._owed = False
        self.in_hook = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        _RECEIVED.append(time.monotonic())
        if self.in_hook:
            return  # dropped there too; the resending thread sends it again
        now = time.monotonic()
        echo = self._raised_at is not None and now - self._raised_at < ECHO_SECS
        if echo and not self._owed:
            return
        self._owed = False
        self._raised_at = now
        raise KeyboardInterrupt

    @property
    def raised(self) -> bool:
        """Whether it has raised a KeyboardInterrupt."""
        return self._raised_at is not None

    def lost(self) -> None:
        """The KeyboardInterrupt raised last was dropped by Python (a gc callback's or a
        `__del__`'s): SIGINT again, echo or not, every `RESEND_SECS` from a thread until the
        handler has raised it. Not at once from here: a signal raised here is handled at once,
        inside the unraisable hook, where it would be dropped again. A busy machine can run the
        thread's first send before this hook returns (starting a thread waits for it to run):
        the handler ignores it there and the next send comes."""
        self._owed = True
        threading.Thread(target=self._resend, name="resend-sigint", daemon=True).start()

    def _resend(self) -> None:
        while self._owed:
            time.sleep(RESEND_SECS)
            if self._owed:
                os.kill(os.getpid(), signal.SIGINT)


@contextlib.contextmanager
def one_interrupt() -> Iterator[None]:
    """SIGINT as `_OneInterrupt` and a KeyboardInterrupt dropped by Python raised again,
    inside the block (main thread only); the previous handler and unraisable hook after it,
    unless a Ctrl-C came (then the caller ends the process, as the CLI does). A SIGINT this
    process inherited as ignored stays ignored."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Inherited as ignored (`cmd &` from a script): it stays so, for the launcher too.
        yield
        return
    handler = _OneInterrupt()
    previous_hook = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        ours = signal.getsignal(signal.SIGINT) is handler
        dropped = unraisable.exc_type is not None and issubclass(
            unraisable.exc_type, KeyboardInterrupt
        )
        if ours and dropped:
            handler.in_hook = True
            try:
                handler.lost()
            finally:
                handler.in_hook = False
            return
        previous_hook(unraisable)

    # The hook before the handler, and after it on the way out: a KeyboardInterrupt the
    # handler raises in a collection that starts in between would otherwise reach the
    # previous hook, be printed and be lost (seen in a fresh-clone suite, 2026-11-28: a
    # collection that started while this set up, before the hook was in place).
    sys.unraisablehook = hook
    _RECEIVED.clear()
    previous_handler = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        _RECEIVED.clear()  # what the block's `raise_if_swallowed` was to see, and no later one
        # After a Ctrl-C both stay: the process is stopping, and an echo that arrives while
        # the KeyboardInterrupt unwinds, before the caller ignores SIGINT, is still dropped.
        if not handler.raised:
            if signal.getsignal(signal.SIGINT) is handler:
                signal.signal(signal.SIGINT, previous_handler)
            if sys.unraisablehook is hook:
                sys.unraisablehook = previous_hook


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals a run stops on: Ctrl-C, and what `kill`, a scheduler or a benchmark sends."""


@contextlib.contextmanager
def stop_deferred(what: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Holds SIGINT and SIGTERM back while the block runs (main thread only), then acts on
    the first that came as the handler in place before would have.

    For work a stop must not cut: a checkpoint save. Python runs signal handlers in the main
    thread, between bytecodes: a KeyboardInterrupt raised inside a save returns from it while
    the library's writer threads go on filling its temporary folder, and the save at stop
    then races them for that folder (seen 2026-11-28: orbax's "Directory not empty:
    'state.orbax-checkpoint-tmp'", the final checkpoint lost). `say`, if given, tells the
    user once that the stop waits until `what` (a clause: "checkpoint 7 is written").
    Elsewhere than the main thread this does nothing: no signal handler runs there. A signal
    set to be ignored stays ignored; the first held signal with SIG_DFL ends the process.
    When the block raises, its error goes on and the held signals are dropped: the process
    is ending on that error."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        del frame
        if not held and say is not None:
            say(f"{signal.Signals(signum).name}: stopping once {what}")
        held.append(signum)

    previous: dict[int, Any] = {}
    failed = False
    try:
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) not in (signal.SIG_IGN, None):
                previous[signum] = signal.signal(signum, hold)
        yield
    except BaseException:
        # The block's error goes on as it is: acting on a held stop here would raise a
        # KeyboardInterrupt in its place, and a failed save would read as a user's stop.
        failed = True
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(held if not failed else ()):  # each once, in their order
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)  # e.g. raises KeyboardInterrupt: the stop goes on
            else:
                signal.raise_signal(signum)  # SIG_DFL: the default action, now
