"""Where a command's outputs may go, and how they appear: whole or not at all.

Outputs go only to regular files or new paths. `output_file` and `output_folder` check a
command's output paths before anything runs (one InputError, exit 2); the writers check
again (`refuse_special`), so a device node, FIFO or socket is never replaced by a file.

A command stages its outputs in an OutputSet: each output folder is filled as a hidden
temporary folder beside it, each single file inside one; `commit()` then renames them
into place with Ctrl-C held off. An interrupted command therefore leaves every output of
the set or none of them, and `Interrupted` says which.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from npusim.errors import InputError

ALLOWED_FILE = "allowed: a regular file or a new path"
ALLOWED_FOLDER = "allowed: a folder or a new path"


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def _stat(p: Path, source: str, option: str | None) -> os.stat_result | None:
    """What p is (a symbolic link followed: what it names counts); None if nothing."""
    try:
        return os.stat(p)
    except FileNotFoundError:
        return None
    except OSError as exc:  # e.g. a file where a folder of the path should be
        raise InputError(source, option, f"{p}: {exc.strerror}; {ALLOWED_FILE}") from None


def _text(arg: str | Path, source: str, option: str | None, what: str) -> Path:
    text = str(arg)
    if not text or "\x00" in text:
        raise InputError(source, option, f"{text!r}: must be a {what} path")
    return Path(text)


def refuse_special(p: Path, source: str | None = None, option: str | None = None) -> None:
    """InputError unless p is a regular file (a symbolic link to one) or does not exist."""
    st = _stat(p, source or str(p), option)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InputError(source or str(p), option,
                         f"{p} is {_what(st.st_mode)}; {ALLOWED_FILE}")


def output_file(arg: str | Path, option: str, source: str = "command line") -> Path:
    """An output file path checked before a command runs: a regular file or a new path in
    a folder that exists or can be made."""
    p = _text(arg, source, option, "file")
    refuse_special(p, source, option)
    for parent in p.parents:
        st = _stat(parent, source, option)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                raise InputError(source, option, f"{parent} is {_what(st.st_mode)}, not a "
                                 f"directory; {ALLOWED_FILE}")
            break
    return p


def output_folder(arg: str | Path, option: str, files: tuple[str, ...] = (),
                  source: str = "command line") -> Path:
    """An output folder checked before a command runs: a folder or a new path, whose
    `files` (the outputs it will hold) are regular files or new paths."""
    p = _text(arg, source, option, "folder")
    st = _stat(p, source, option)
    if st is None:
        output_file(p, option, source)  # its parents
    elif not stat.S_ISDIR(st.st_mode):
        raise InputError(source, option, f"{p} is {_what(st.st_mode)}, not a directory; "
                         f"{ALLOWED_FOLDER}")
    for name in files:
        refuse_special(p / name, source, option)
    return p


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the command left (its text, one line)."""


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C off while the block runs (in the main thread); one that came in is
    raised as KeyboardInterrupt when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if came:
        raise KeyboardInterrupt


def _place(staged: Path, dest: Path) -> None:
    """Move a staged folder's contents to dest: one rename where dest is new, else file by
    file (os.replace), keeping what else dest holds."""
    if not dest.exists():
        os.rename(staged, dest)
        return
    for root, _dirs, files in os.walk(staged):
        rel = Path(root).relative_to(staged)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            target = dest / rel / name
            refuse_special(target)
            os.replace(Path(root) / name, target)
    shutil.rmtree(staged, ignore_errors=True)


class OutputSet:
    """A command's outputs, staged beside their destinations and renamed into place
    together by commit(). Used as a context manager: an exception (Ctrl-C included)
    before the commit removes what was staged; Ctrl-C comes out as Interrupted."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path, str | None]] = []  # (temp folder, dest, file)
        self.placed: list[Path] = []

    def folder(self, dest: Path) -> Path:
        """The temporary folder to fill for the output folder dest."""
        return self._stage(dest, None)

    def file(self, dest: Path) -> Path:
        """The temporary path to write for the output file dest."""
        return self._stage(dest.parent, dest.name) / dest.name

    def _stage(self, where: Path, name: str | None) -> Path:
        parent = where if name is not None else where.parent
        parent.mkdir(parents=True, exist_ok=True)
        label = name or where.name or "out"
        with interrupts_held():  # a Ctrl-C between the two would leave the folder behind
            tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{label}.", suffix=".tmp"))
            self._staged.append((tmp, where, name))
        return tmp

    def commit(self) -> list[Path]:
        """Rename every staged output into place, Ctrl-C held off until all are."""
        with interrupts_held():
            for tmp, dest, name in self._staged:
                if name is None:
                    _place(tmp, dest)
                else:
                    refuse_special(dest / name)
                    os.replace(tmp / name, dest / name)
                    os.rmdir(tmp)
                self.placed.append(dest if name is None else dest / name)
            self._staged.clear()
        return self.placed

    def discard(self) -> None:
        with interrupts_held():
            for tmp, _dest, _name in self._staged:
                shutil.rmtree(tmp, ignore_errors=True)
            self._staged.clear()

    def left(self) -> str:
        """What the command leaves, in words."""
        if self.placed:
            return "outputs complete: " + ", ".join(map(str, self.placed))
        return "nothing written"

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            return
        self.discard()
        if issubclass(kind, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            raise Interrupted(self.left()) from None
