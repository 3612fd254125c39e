"""The one exception type for mistakes a user can make (bad input, bad files, bad flags).

Apps catch it and print its message on one line with a non-zero exit; library users
catch it like any ``ValueError``.
"""

from __future__ import annotations


class DraftwiseError(ValueError):
    """A user-facing error whose message names the bad value."""
