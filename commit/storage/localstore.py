"""An :class:`~lancetx.commit.storage.objectstore.ObjectStore` on the local filesystem.

Writes are crash-safe: an object is written to a temporary file in the same
directory, fsynced, then moved into place (``os.replace``, or ``os.link`` for
create-if-absent), so a reader sees the old object, the new one, or none, and
never a half-written one. A crash can leave a temporary file behind; its name
(``.{name}.lancetx-tmp-{uuid}``) is unmistakable and :meth:`list` skips it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from stat import S_ISREG
from typing import Final

from lancetx.commit.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    UnsupportedOperationError,
)
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore, StoreCapabilities

TEMP_MARKER: Final = ".lancetx-tmp-"

_NOT_FOUND: Final = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
# os.link fails with these where the filesystem has no hard links (FAT, some FUSE/SMB mounts).
_NO_HARD_LINKS: Final = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})


def temp_name(name: str) -> str:
    """The temporary file name used while writing object ``name`` (a base name)."""
    return f".{name}{TEMP_MARKER}{uuid.uuid4().hex}"


def is_temp_name(name: str) -> bool:
    """Whether a base name is one of our temporary files."""
    return name.startswith(".") and TEMP_MARKER in name


def _etag(stat: os.stat_result) -> str:
    # Same recipe as Rust object_store's LocalFileSystem: changes whenever the
    # file is replaced (inode), rewritten (mtime) or resized.
    return f"{stat.st_ino:x}-{stat.st_mtime_ns // 1000:x}-{stat.st_size:x}"


def _meta(key: str, stat: os.stat_result) -> ObjectMeta:
    return ObjectMeta(
        key=key,
        size=stat.st_size,
        etag=_etag(stat),
        last_modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC),
    )


def _fsync_dir(path: str) -> None:
    # Makes a rename/link durable; some filesystems refuse to open or fsync a directory.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LocalObjectStore(ObjectStore):
    """Files under ``root``; key ``a/b`` is the file ``{root}/a/b``.

    Capabilities: ``put_if_not_exists`` is atomic (hard link of a finished
    temporary file, which fails if the target exists), renames are atomic,
    listings are not ordered. ETags are ``{inode}-{mtime µs}-{size}`` in hex,
    as Rust ``object_store`` computes them: equal ETags mean the same file
    content as far as the filesystem can tell without hashing.
    """

    def __init__(self, root: str = "/") -> None:
        self.root = os.path.abspath(root)
        self.capabilities = StoreCapabilities(
            conditional_put=True,
            atomic_rename=True,
            lexically_ordered_list=False,
            consistent_list=True,
        )

    def __repr__(self) -> str:
        return f"LocalObjectStore({self.root!r})"

    # ------------------------------------------------------------------ paths

    def _path(self, key: str) -> str:
        if key.startswith("/"):
            raise ValueError(f"object key {key!r} must not start with '/' (keys are root-relative)")
        if not key:
            raise ValueError("object key must not be empty")
        if any(part in ("..", ".") for part in key.split("/")):
            raise ValueError(f"object key {key!r} must not contain '.' or '..' segments")
        return os.path.join(self.root, key)

    def _key_of(self, path: str) -> str:
        rel = os.path.relpath(path, self.root)
        return rel.replace(os.sep, "/")

    def uri(self, key: str) -> str:
        path = os.path.join(self.root, key)
        return "file://" + path if path.startswith("/") else "file:///" + path

    def _fail(
        self, operation: str, key: str, exc: OSError, *, reading: bool = True
    ) -> ObjectStoreError:
        if reading and isinstance(exc, _NOT_FOUND):
            return ObjectNotFoundError(operation, self.uri(key))
        if isinstance(exc, PermissionError):
            return ObjectStoreError(
                operation,
                self.uri(key),
                f"permission denied ({exc.strerror}); give this process access to the path",
            )
        return ObjectStoreError(operation, self.uri(key), f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ reads

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise self._fail("get", key, exc) from exc

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; fewer if the file ends first."""
        if start < 0 or end < start:
            raise ValueError(f"invalid byte range [{start}, {end}): need 0 <= start <= end")
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(end - start)
        except OSError as exc:
            raise self._fail("get_range", key, exc) from exc

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        if length < 0:
            raise ValueError(f"tail length must not be negative, got {length}")
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - length))
                return f.read(length) if length else b"", size
        except OSError as exc:
            raise self._fail("get_tail", key, exc) from exc

    def head(self, key: str) -> ObjectMeta:
        path = self._path(key)
        try:
            stat = os.stat(path)
        except OSError as exc:
            raise self._fail("head", key, exc) from exc
        if not S_ISREG(stat.st_mode):
            raise ObjectNotFoundError("head", self.uri(key), "not a regular file")
        return _meta(key, stat)

    # ------------------------------------------------------------------ writes

    def _write_temp(self, path: str, data: bytes) -> tuple[str, os.stat_result]:
        """Write ``data`` durably to a new temporary file next to ``path``."""
        directory, name = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, temp_name(name))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
                stat = os.fstat(fd)
            finally:
                os.close(fd)
        except BaseException:
            _remove_quietly(tmp)
            raise
        return tmp, stat

    def put(self, key: str, data: bytes) -> ObjectMeta:
        """Atomic write: temporary file, fsync, ``os.replace``."""
        path = self._path(key)
        try:
            tmp, stat = self._write_temp(path, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                _remove_quietly(tmp)
                raise
        except OSError as exc:
            raise self._fail("put", key, exc, reading=False) from exc
        _fsync_dir(os.path.dirname(path))
        return _meta(key, stat)

    def put_if_not_exists(self, key: str, data: bytes) -> ObjectMeta:
        """Atomic create-if-absent: a finished temporary file is hard-linked to
        the target, which fails if the target exists."""
        path = self._path(key)
        try:
            tmp, stat = self._write_temp(path, data)
        except OSError as exc:
            raise self._fail("put_if_not_exists", key, exc, reading=False) from exc
        try:
            os.link(tmp, path)
        except FileExistsError as exc:
            raise ObjectExistsError("put_if_not_exists", self.uri(key)) from exc
        except OSError as exc:
            if exc.errno in _NO_HARD_LINKS:
                raise UnsupportedOperationError(
                    "put_if_not_exists",
                    self.uri(key),
                    f"the filesystem does not support hard links ({exc.strerror}), so an atomic "
                    "create-if-absent is impossible here; put the table on a local filesystem "
                    "such as ext4/xfs/apfs, or commit through DynamoDB",
                ) from exc
            raise self._fail("put_if_not_exists", key, exc, reading=False) from exc
        finally:
            _remove_quietly(tmp)
        _fsync_dir(os.path.dirname(path))
        return _meta(key, stat)

    def copy(self, src: str, dst: str) -> ObjectMeta:
        """Copy into a temporary file next to ``dst``, then ``os.replace`` it (atomic)."""
        src_path = self._path(src)
        dst_path = self._path(dst)
        try:
            source = open(src_path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise self._fail("copy", src, exc) from exc
        try:
            directory, name = os.path.split(dst_path)
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, temp_name(name))
            try:
                with open(tmp, "xb") as target:
                    shutil.copyfileobj(source, target)
                    target.flush()
                    os.fsync(target.fileno())
                    stat = os.fstat(target.fileno())
                os.replace(tmp, dst_path)
            except BaseException:
                _remove_quietly(tmp)
                raise
        except OSError as exc:
            raise self._fail("copy", dst, exc, reading=False) from exc
        finally:
            source.close()
        _fsync_dir(directory)
        return _meta(dst, stat)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._fail("delete", key, exc) from exc

    # ------------------------------------------------------------------ listing

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        """Every file whose key starts with ``prefix``, recursively, in no
        particular order; temporary files are skipped."""
        if prefix.startswith("/"):
            raise ValueError(f"prefix {prefix!r} must not start with '/' (keys are root-relative)")
        # Start at the deepest directory the prefix names in full.
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        yield from self._walk(os.path.join(self.root, directory), prefix)

    def _walk(self, directory: str, prefix: str) -> Iterator[ObjectMeta]:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise self._fail("list", prefix, exc) from exc
        for entry in entries:
            if is_temp_name(entry.name):
                continue
            key = self._key_of(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):  # no symlink loops
                    # Only descend where keys below could still match the prefix.
                    if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                        yield from self._walk(entry.path, prefix)
                    continue
                if not key.startswith(prefix) or not entry.is_file():
                    continue
                stat = entry.stat()
            except FileNotFoundError:
                continue  # deleted while we listed
            yield _meta(key, stat)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = ["TEMP_MARKER", "LocalObjectStore", "is_temp_name", "temp_name"]
