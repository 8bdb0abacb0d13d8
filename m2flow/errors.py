"""The one error type that means bad input a user can fix (a key, a file, a line, a placement, a plan).

Every such error subclasses ``UserInputError``: the command line prints it as one ``error:`` line and
exits with status 2, without a traceback. A leaf module: anything may import it.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input the user can fix; the message names the key, file or line."""
