"""Writing files so that a reader never sees half of one.  Stdlib only."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def file_stem(nodeid: str) -> str:
    """A file name stem for a test, unique per node id: ``test_x.py__test_y``.

    ``::`` becomes ``__``; where the id holds anything else that a file name cannot keep as
    it is (a folder's ``/``, a parameter's brackets or spaces), the unsafe runs become ``_``
    and a hash of the id follows (``tests_test_x.py__test_y-1c2d3e4f``), so that ``a/b``,
    ``a b`` and ``a_b`` never share a file.  Long stems are cut before the hash.
    """
    readable = nodeid.replace("::", "__")
    stem = _UNSAFE.sub("_", readable).strip("_") or "test"
    if stem == readable and len(stem) <= 150:
        return stem
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    return f"{stem[:130]}-{digest}"


def write_atomically(path: Path, data: str | bytes, tmp_dir: Path | None = None) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through a temp file in the same
    folder (or in ``tmp_dir``, on the same file system), fsynced and renamed into place; the
    file keeps its mode (a new one gets the umask's, 0644 under the usual umask 022, as any
    file a program creates).  The temp file is removed if anything fails."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                               dir=tmp_dir or path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_text(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` (created if missing) in one ``write`` of an ``O_APPEND``
    descriptor: another process appending to the same file (a CI job summary) cannot land in
    the middle of it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        data = text.encode("utf-8")
        written = os.write(fd, data)
        while written < len(data):  # a short write: finish it (regular files rarely do this)
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def _mode_for(path: Path) -> int:
    """The mode of the file at ``path``, or what a new file gets under the current umask."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
