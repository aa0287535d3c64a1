"""Where a command's outputs may go, and how they appear: whole or not at all.

Outputs go only to regular files or new paths. `output_file` and `output_folder` check a
command's output paths before anything runs (one InputError, exit 2); the writers check
again (`refuse_special`), so a device node, FIFO or socket is never replaced by a file.

A command stages its outputs in an OutputSet: each output folder is filled as a hidden
temporary folder beside it, each single file inside one; `commit()` then renames them
into place with Ctrl-C held off, and takes back what it placed if one cannot be placed.
An interrupted or failed command therefore leaves every output of the set or none of
them; `Interrupted` says which, an OSError names the destination, not a staging path.
`refuse_shared` keeps two outputs off one path; `check_writable` finds an unwritable
destination before the command's long work.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

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


def _stat(p: Path, source: str, option: str | None,
          allowed: str = ALLOWED_FILE) -> os.stat_result | None:
    """What p is (a symbolic link followed: what it names counts); None if nothing.
    `allowed` is what the option takes, a file's or a folder's, for the message."""
    try:
        return os.stat(p)
    except FileNotFoundError:
        return None
    except OSError as exc:  # e.g. a file where a folder of the path should be
        raise InputError(source, option, f"{p}: {exc.strerror}; {allowed}") from None


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
    _parents_ok(p, source, option, ALLOWED_FILE)
    return p


def _parents_ok(p: Path, source: str, option: str, allowed: str) -> None:
    """InputError unless the nearest existing parent of p is a folder."""
    for parent in p.parents:
        st = _stat(parent, source, option, allowed)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                raise InputError(source, option, f"{parent} is {_what(st.st_mode)}, not a "
                                 f"directory; {allowed}")
            return


def output_folder(arg: str | Path, option: str, files: tuple[str, ...] = (),
                  source: str = "command line") -> Path:
    """An output folder checked before a command runs: a folder or a new path, whose
    `files` (the outputs it will hold) are regular files or new paths."""
    p = _text(arg, source, option, "folder")
    st = _stat(p, source, option, ALLOWED_FOLDER)
    if st is None:
        _parents_ok(p, source, option, ALLOWED_FOLDER)
    elif not stat.S_ISDIR(st.st_mode):
        raise InputError(source, option, f"{p} is {_what(st.st_mode)}, not a directory; "
                         f"{ALLOWED_FOLDER}")
    for name in files:
        refuse_special(p / name, source, option)
    return p


def refuse_shared(claims: list[tuple[str, Path]], source: str = "command line") -> None:
    """InputError when two outputs claim one path, or one lies inside the other: each
    claim is (option, a file the command writes or a folder it fills). Symbolic links and
    `..` are resolved, so no spelling lets one output overwrite another."""
    seen: list[tuple[str, str, Path]] = []
    for option, p in claims:
        real = os.path.realpath(p)
        for other_real, other_option, other in seen:
            if real == other_real or _inside(real, other_real) or _inside(other_real, real):
                raise InputError(source, option, f"{p} is where {other} ({other_option}) "
                                 "goes; allowed: a path no other output of the command uses")
        seen.append((real, option, p))


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def new_mode(bits: int) -> int:
    """The mode open() (bits 0o666) or mkdir() (0o777) gives under the umask: tempfile
    makes its files 0600 and its folders 0700, which an output must not keep."""
    mask = os.umask(0)
    os.umask(mask)
    return bits & ~mask


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the command left (its text, one line)."""


LEDGER_SHOWN = 3  # outputs a command's "interrupted" line names; the rest are counted
_ledger: list[Path] = []  # the first outputs this command placed
_ledger_count = [0]
_staging: set[Path] = set()  # the temporary folders of the OutputSets being filled


def forget_placed() -> None:
    """A command starts: nothing of its own is placed yet."""
    _ledger.clear()
    _ledger_count[0] = 0


def note_placed(path: Path) -> None:
    """An output has appeared at path (a file in a staging folder has not)."""
    if _staging and any(parent in _staging for parent in path.parents):
        return
    _ledger_count[0] += 1
    if len(_ledger) < LEDGER_SHOWN:
        _ledger.append(path)


def placed_so_far() -> str:
    """What this command has placed, in words: what an interruption leaves."""
    if not _ledger_count[0]:
        return "nothing written"
    more = _ledger_count[0] - len(_ledger)
    return "outputs complete: " + ", ".join(map(str, _ledger)) + (
        f" and {more} more" if more else "")


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


def check_writable(dest: Path, folder: bool) -> None:
    """OSError naming dest unless its outputs can be staged and placed: a probe file is
    made and removed in the nearest folder above dest that exists and, for an output
    folder that exists, in dest. Run before a command's long work, so that an unwritable
    destination fails at once."""
    places = [next((p for p in dest.parents if p.is_dir()), Path("."))]
    if folder and dest.is_dir():
        places.append(dest)
    for where in places:
        try:
            with interrupts_held():  # the probe never stays
                fd, probe = tempfile.mkstemp(dir=where, prefix=".npusim-probe.", suffix=".tmp")
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(dest)) from None


KEPT = ".kept"  # in a staging folder: the files a commit replaced, until it has ended


class Staged(NamedTuple):
    """One staged output: its temporary folder, where it goes (an output folder, or the
    folder of an output file), the file's name (None: the folder's contents) and the
    files and folders of dest it replaces (OutputSet.folder)."""

    tmp: Path
    dest: Path
    name: str | None
    owns: tuple[str, ...]


Undo = list[Callable[[], object]]


def _place(s: Staged, undo: Undo) -> None:
    """Move one staged output into place, noting in undo how to take each step back: a
    new folder in one rename, else file by file, the files it replaces kept."""
    if s.name is None and not os.path.lexists(s.dest):
        os.rename(s.tmp, s.dest)
        undo.append(partial(os.rename, s.dest, s.tmp))
        return
    if s.name is not None:
        moves = [(s.tmp / s.name, s.dest / s.name)]
    else:
        moves = [(Path(root) / n, s.dest / Path(root).relative_to(s.tmp) / n)
                 for root, _dirs, names in os.walk(s.tmp) for n in names]
        staged = {target for _new, target in moves}
        for n in s.owns:
            _retire(s.dest / n, s.tmp / KEPT / n, staged, undo)
    for new, target in moves:
        _make_folders(target.parent, undo)
        _swap(new, target, s.tmp / KEPT / target.relative_to(s.dest), undo)


def _retire(old: Path, keep: Path, staged: set[Path], undo: Undo) -> None:
    """Take away an earlier command's output that this one replaces (kept at keep until
    the commit ends): a folder wholly, a file unless this output has it too."""
    if os.path.isdir(old) and not os.path.islink(old):
        keep.parent.mkdir(parents=True, exist_ok=True)
        os.rename(old, keep)
        undo.append(partial(os.rename, keep, old))
    elif os.path.lexists(old) and old not in staged:
        _swap(None, old, keep, undo)


def _make_folders(folder: Path, undo: Undo) -> None:
    missing = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    if missing:
        folder.mkdir(parents=True)
        undo.append(partial(shutil.rmtree, missing[-1], ignore_errors=True))


def _swap(new: Path | None, target: Path, keep: Path, undo: Undo) -> None:
    """Put new at target (None: remove target) in one rename; what target was stays at
    keep until the commit ends, and undo puts it back."""
    if os.path.lexists(target):
        refuse_special(target)
        keep.parent.mkdir(parents=True, exist_ok=True)
        if new is None:
            os.replace(target, keep)
        else:
            try:  # a second name for the old file: target is replaced in one rename
                os.link(target, keep, follow_symlinks=False)
            except OSError:
                shutil.copy2(target, keep, follow_symlinks=False)
        undo.append(partial(os.replace, keep, target))
    elif new is not None:
        undo.append(partial(Path.unlink, target, missing_ok=True))
    if new is not None:
        os.replace(new, target)


def _roll_back(undo: Undo) -> None:
    """Take back a failed commit's steps, last first (what cannot be undone stays: the
    error that stopped the commit is the one told)."""
    for step in reversed(undo):
        try:
            step()
        except OSError:
            pass


class OutputSet:
    """A command's outputs, staged beside their destinations and renamed into place
    together by commit(). Used as a context manager: an exception (Ctrl-C included)
    before the commit removes what was staged; Ctrl-C comes out as Interrupted. A commit
    that fails part way (a folder that refuses a file) takes back what it placed. An
    OSError names the destination, never a staging path."""

    def __init__(self) -> None:
        self._staged: list[Staged] = []
        self.placed: list[Path] = []

    def folder(self, dest: Path, owns: tuple[str, ...] = ()) -> Path:
        """The temporary folder to fill for the output folder dest. The names in owns
        are this output's: the commit replaces such a folder of dest wholly, and removes
        such a file that an earlier command left and this one does not write."""
        return self._stage(dest, None, owns)

    def file(self, dest: Path) -> Path:
        """The temporary path to write for the output file dest."""
        return self._stage(dest.parent, dest.name, ()) / dest.name

    def _stage(self, where: Path, name: str | None, owns: tuple[str, ...]) -> Path:
        parent = where if name is not None else where.parent
        parent.mkdir(parents=True, exist_ok=True)
        label = name or where.name or "out"
        with interrupts_held():  # a Ctrl-C between the two would leave the folder behind
            try:
                tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{label}.", suffix=".tmp"))
                os.chmod(tmp, new_mode(0o777))  # the mode a new output folder has
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(where / (name or ""))) from None
            self._staged.append(Staged(tmp, where, name, owns))
            _staging.add(tmp)
        return tmp

    def commit(self) -> list[Path]:
        """Rename every staged output into place, Ctrl-C held off until all are; if one
        cannot be placed, none stays placed."""
        with interrupts_held():
            undo: Undo = []
            try:
                for s in self._staged:
                    _place(s, undo)
            except Exception as exc:
                _roll_back(undo)
                named = self._named(exc)
                if named is exc:
                    raise
                raise named from exc
            for s in self._staged:
                path = s.dest if s.name is None else s.dest / s.name
                self.placed.append(path)
                note_placed(path)
            self._drop()  # the staging folders, with the files the outputs replaced
        return self.placed

    def discard(self) -> None:
        with interrupts_held():
            self._drop()

    def _drop(self) -> None:
        for s in self._staged:
            shutil.rmtree(s.tmp, ignore_errors=True)
            _staging.discard(s.tmp)
        self._staged.clear()

    def _named(self, exc: BaseException) -> BaseException:
        """exc, or for an OSError naming a staging path, one naming its destination."""
        if not isinstance(exc, OSError):
            return exc
        for where in (exc.filename2, exc.filename):
            if where is None:
                continue
            path = Path(os.fsdecode(where))
            for s in self._staged:
                if path == s.tmp or s.tmp in path.parents:
                    rel = path.relative_to(s.tmp).parts
                    dest = s.dest.joinpath(*rel[1:] if rel[:1] == (KEPT,) else rel)
                    return OSError(exc.errno, exc.strerror, str(dest))
        return exc

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
        named = self._named(exc) if exc is not None else None
        self.discard()
        if issubclass(kind, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            raise Interrupted(self.left()) from None
        if named is not exc:
            raise named from exc
