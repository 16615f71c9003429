"""Paths in one-line reports: shown as `ls` quotes them for a shell, and why a path cannot be
reached, in words (permission denied with the user, owner and mode; a link loop; a file on the
way). Torch-free."""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat

from resnet50_trainer.errors import UserError, escaped

# A path made only of these shows as it is, as ls leaves such a name unquoted; any other
# printable character has it quoted.
_PLAIN_PATH = re.compile(r"[\w@%+=:,./-]+")


def shown(path: str | bytes) -> str:
    """`path` as a one-line message shows it, quoted as ls quotes a name for a shell: plain where
    nothing in it needs quotes, else in '...', with a control character or a byte that is not
    UTF-8 (surrogateescape, as Python gives a path the OS returns) as $'\\n', $'\\033', $'\\377'.
    A path holding a newline or a terminal escape can then neither split a report nor drive the
    terminal, and what is shown pastes back into a shell as the same path."""
    text = os.fsdecode(path)
    if _PLAIN_PATH.fullmatch(text):
        return text
    quoted = [
        "'" + "".join(run).replace("'", "'\\''") + "'"
        if printable
        else "$'" + "".join(map(escaped, run)) + "'"
        for printable, run in itertools.groupby(text, str.isprintable)
    ]
    return "".join(quoted) or "''"


def unreachable(path: str) -> str | None:
    """Why `path` cannot be looked up, where the system refuses it rather than finding nothing:
    the folder on its way this user may not enter, a link that leads back to itself, a file
    where a folder should be; in words and with the fix. None where it is there or simply
    missing."""
    try:
        os.stat(path)
        return None
    except FileNotFoundError:
        return None
    except OSError as error:
        failure, reason = error.errno, error.strerror
    failing = _first_failing_prefix(path, failure)
    if failure == errno.EACCES:
        return denied("enter", os.path.dirname(failing))
    if failure == errno.ELOOP:
        return (
            f"{shown(failing)} is a symbolic link that leads back to itself: point it at a "
            "real file or folder"
        )
    if failure == errno.ENOTDIR:
        on_the_way = _file_on_the_way(failing)
        what = "a file, not a folder" if os.path.isfile(on_the_way) else "not a folder"
        return f"{shown(on_the_way)} is {what}: correct the path"
    return f"{reason}: check the path"


def check_reachable(what: str, path: str) -> None:
    """UserError naming `what` (a flag, "database") and why, where `path` is unreachable."""
    reason = unreachable(path)
    if reason:
        raise UserError(f"{what} {shown(path)} cannot be reached: {reason}")


def _first_failing_prefix(path: str, failure: int | None) -> str:
    """The shortest leading part of `path` whose lookup fails as the whole path's did."""
    parts = os.path.normpath(path).split(os.sep)
    for end in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:end]) or os.sep
        try:
            os.stat(prefix)
        except OSError as error:
            if error.errno == failure:
                return prefix
    return path


def _file_on_the_way(prefix: str) -> str:
    """The part of `prefix` (whose lookup says "not a directory") that is no folder: a file, a
    device, a FIFO."""
    while prefix and not (os.path.exists(prefix) and not os.path.isdir(prefix)):
        parent = os.path.dirname(prefix)
        if parent == prefix:  # the root: nothing on the way
            break
        prefix = parent
    return prefix or "."


ACCESS_FIX = "ask its owner for access, or run as a user who has it"


def denied(verb: str, path: str, fix: bool = True) -> str:
    """Permission denied, in words: this user may not `verb` (enter, read, write) `path`, whose
    owner and mode say why; and the fix (ACCESS_FIX) unless the caller says it."""
    try:
        info = os.stat(path)
        whose = f" (owner {_user_name(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):o})"
    except OSError:
        whose = ""
    return (
        f"permission denied: user {_user_name(os.geteuid())} may not {verb} {shown(path)}"
        f"{whose}{f': {ACCESS_FIX}' if fix else ''}"
    )


def _user_name(uid: int) -> str:
    import pwd  # only for this report

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
