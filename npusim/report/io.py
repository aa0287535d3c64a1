"""Atomic file output: a reader (or a crash) never sees half a report.

Each writer fills a temporary file in the destination folder and renames it over the
target with os.replace, which is atomic on POSIX and Windows within one filesystem. It
writes only over a regular file (npusim.outputs.refuse_special): never over a device node,
FIFO or socket.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from npusim.errors import BlockedError
from npusim.outputs import OutputSet, new_mode, note_placed, refuse_special


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write data to path via a temp file in the same folder; returns the path. An
    OSError names path, not the temp file."""
    target = Path(path)
    refuse_special(target)
    try:
        _write_via_temp(target, data)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(target)) from exc
    note_placed(target)
    return target


def _write_via_temp(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, new_mode(0o666))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    return write_bytes_atomic(path, text.encode(encoding))


def dumps_json(obj: Any, *, sort_keys: bool = False, inline_leaves: bool = False) -> str:
    """Stable JSON text: indent 2, trailing newline, no NaN/Infinity (not JSON).

    Keys keep insertion order by default: report builders insert them in a fixed order
    (phases in kernel order, which sorting would scramble), so output is already stable.
    inline_leaves puts every object or array holding only scalars on one line (a report
    has thousands of small per-core records; one line each keeps it readable).
    """
    if inline_leaves:
        return _dump(obj, 0, sort_keys) + "\n"
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, ensure_ascii=False, allow_nan=False)
    return text + "\n"


def _scalar(v: Any) -> bool:
    return not isinstance(v, (dict, list, tuple))


def _dump(obj: Any, depth: int, sort_keys: bool) -> str:
    def one(v: Any) -> str:
        return json.dumps(v, sort_keys=sort_keys, ensure_ascii=False, allow_nan=False)

    if isinstance(obj, dict):
        items = sorted(obj.items()) if sort_keys else list(obj.items())
        if not items or all(_scalar(v) for _, v in items):
            return one(obj)
        pad = "  " * (depth + 1)
        body = ",\n".join(f"{pad}{one(str(k))}: {_dump(v, depth + 1, sort_keys)}"
                          for k, v in items)
        return "{\n" + body + "\n" + "  " * depth + "}"
    if isinstance(obj, (list, tuple)):
        if not obj or all(_scalar(v) for v in obj):
            return one(list(obj))
        pad = "  " * (depth + 1)
        body = ",\n".join(pad + _dump(v, depth + 1, sort_keys) for v in obj)
        return "[\n" + body + "\n" + "  " * depth + "]"
    return one(obj)


def write_json_atomic(path: str | Path, obj: Any, *, sort_keys: bool = False,
                      inline_leaves: bool = False) -> Path:
    return write_text_atomic(path, dumps_json(obj, sort_keys=sort_keys,
                                              inline_leaves=inline_leaves))


BLOCKED_FILE = "blocked.txt"
RUN_FILES = ("report.json", "report.md", "trace.json", BLOCKED_FILE)  # a run's, in DIR


@contextmanager
def blocked_list_in(folder: Path, owns: tuple[str, ...] = (BLOCKED_FILE,)) -> Iterator[None]:
    """A deadlock or time limit inside the block leaves its full list of unfinished cores
    in folder/blocked.txt, named by the error's message; it replaces the files of `owns`
    an earlier run left there (a commit of the folder's outputs removes an old list)."""
    try:
        yield
    except BlockedError as exc:
        with OutputSet() as outs:
            write_text_atomic(outs.folder(folder, owns) / BLOCKED_FILE, exc.listing())
            outs.commit()
        exc.written = str(folder / BLOCKED_FILE)
        raise


def run_claims(out: Path, tensors: Path | None, csv_files: list[Path], ops: tuple[str, ...],
               options: tuple[str, str, str]) -> list[tuple[str, Path]]:
    """The paths a run's outputs take (npusim.outputs.refuse_shared): its files in out,
    each op's folder of tensors and the harness CSV files; options names the three."""
    claims = [(options[0], out / name) for name in RUN_FILES]
    if tensors is not None:
        claims += [(options[1], tensors / op) for op in dict.fromkeys(ops)]
    return claims + [(options[2], p) for p in csv_files]
