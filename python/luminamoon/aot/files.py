"""Reading a bundle's files as the rule book allows: regular files inside the bundle folder,
read with a size limit, never blocking (docs/bundle-format.md, "Files").

The C++ loader reads them the same way (src/aot/bundle_file.cpp): a FIFO, a device, a
directory or a symbolic link that leaves the folder is refused before it is opened for data,
and the file is opened non-blocking and checked again on the open descriptor, so a file swapped
for a FIFO in between cannot make the reader wait.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Any, Mapping, Optional, Tuple

from .rules import CUBIN_MAX_BYTES, BundleError

_FIX = "rebuild the bundle (luminamoon aot build) or copy it again"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def read_bundle_file(bundle_dir: "os.PathLike[str] | str", name: str, limit: int,
                     field: str) -> Tuple[str, bytes]:
    """``(path, bytes)`` of ``<bundle_dir>/<name>``, or :class:`BundleError` with ``field``:

    ``missing_file`` (no such file, or a dangling link), ``not_regular_file`` (a FIFO, socket,
    device, directory, or a link that resolves outside the folder), ``too_large`` (more than
    ``limit`` bytes), ``unreadable`` (anything else the system refuses).
    """
    folder = os.fspath(bundle_dir)
    path = os.path.join(folder, name)
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        raise BundleError("missing_file", path, field, "a file", "no such file", _FIX) from None
    except (OSError, ValueError) as exc:  # ENOTDIR, ENAMETOOLONG, ELOOP, EACCES, NUL in name
        code = "missing_file" if getattr(exc, "errno", None) in (errno.ENOTDIR,) else "unreadable"
        raise BundleError(code, path, field, "a readable file", f"{type(exc).__name__}: {exc}",
                          _FIX) from None
    if stat.S_ISLNK(lst.st_mode):
        try:
            real = os.path.realpath(path, strict=True)
            real_folder = os.path.realpath(folder, strict=True)
        except FileNotFoundError:
            raise BundleError("missing_file", path, field, "a file",
                              "a symbolic link to nothing", _FIX) from None
        except OSError as exc:
            raise BundleError("unreadable", path, field, "a readable file",
                              f"a symbolic link that cannot be resolved ({exc})", _FIX) from None
        if not _inside(real, real_folder):
            raise BundleError("not_regular_file", path, field,
                              "a regular file inside the bundle folder",
                              f"a symbolic link to {real!r}, outside it", _FIX)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BundleError("missing_file", path, field, "a file", "no such file", _FIX) from None
    except OSError as exc:
        raise BundleError("unreadable", path, field, "a readable file", str(exc), _FIX) from None
    _check_mode(st, path, field, limit)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise BundleError("missing_file", path, field, "a file", "no such file", _FIX) from None
    except OSError as exc:
        raise BundleError("unreadable", path, field, "a readable file", str(exc), _FIX) from None
    try:
        _check_mode(os.fstat(fd), path, field, limit)  # the file opened is the file checked
        chunks, total = [], 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as exc:
                raise BundleError("unreadable", path, field, "a readable file", str(exc),
                                  _FIX) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise BundleError("too_large", path, field, f"at most {limit} bytes",
                                  f"more than {limit} bytes (the file grew while read)", _FIX)
        return path, b"".join(chunks)
    finally:
        os.close(fd)


def _check_mode(st: os.stat_result, path: str, field: str, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise BundleError("not_regular_file", path, field, "a regular file", kind, _FIX)
    if st.st_size > limit:
        raise BundleError("too_large", path, field, f"at most {limit} bytes",
                          f"{st.st_size} bytes", _FIX)


def read_code_object(bundle_dir: "os.PathLike[str] | str", entry: Mapping[str, Any], i: int,
                     field: str, what: str, data: Optional[bytes] = None) -> Tuple[str, bytes]:
    """The path and bytes of ``kernels[i]``'s code object (``field``: "cubin" or "hsaco"),
    read by the file rules unless ``data`` is given; an empty file is refused (``what`` names
    the kind the rule expected, e.g. "a cubin")."""
    p = f"kernels[{i}].{field}"
    if data is None:
        path, data = read_bundle_file(bundle_dir, entry[field], CUBIN_MAX_BYTES, p)
    else:
        path = os.path.join(os.fspath(bundle_dir), entry[field])
    if not data:
        raise BundleError("truncated", path, p, what, "an empty file",
                          "rebuild the bundle (luminamoon aot build)")
    return path, data
