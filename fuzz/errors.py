"""The one root of the errors streamfuzz raises on purpose.

``FuzzError`` is what to catch around any streamfuzz call. ``BadInput`` is
the part a user can fix (a target, a corpus file, an option, an upstream
source, a device): its message is one line that says what to change, and the
command line prints it and exits 2 before any work is done. Every other
``FuzzError`` is a signal between streamfuzz's own parts (no gates here, a
zygote that cannot fork, a feature the simulation lacks) that its caller
handles. Only the ``KeyboardInterrupt`` subclasses that end a run early
(``streamfuzz.fuzz.driver``) stay outside it, so that Ctrl-C handling sees them as
what they are. Each subclass keeps the built-in base it had (``ValueError``,
``RuntimeError``), so code that caught those still does.
"""

from __future__ import annotations

EXIT_CRASH = 70
"""Exit status of a crash of streamfuzz itself (sysexits' EX_SOFTWARE): never 1,
which means "a failure was found"."""


class FuzzError(Exception):
    """The root: every error streamfuzz raises on purpose."""


class BadInput(FuzzError):
    """Input the user can fix; the message is one line naming the fix."""


class CheckArgumentError(BadInput, ValueError):
    """A bad argument of ``streamfuzz.checked()``, its pytest marker or fixture.
    Here, not beside ``checked``, so that the plugin raises it without torch."""


class NestedCheckError(BadInput, RuntimeError):
    """A ``streamfuzz.checked()`` block entered inside another."""
