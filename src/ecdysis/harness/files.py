"""A harness folder on disk, read and written without trusting what is in it.

Harness files are written by models (the implementer role, an external coding agent in its copy of the
harness) and harness folders are handed to `eval --harness` and `serve --harness`; so a folder may hold a
symbolic link to a host file (`/proc/self/environ`, a held-out answer file), a FIFO that blocks a reader,
a device, or a file far larger than any prompt. `read_tree` reads only regular files that lie inside the
root: it walks the tree with directory file descriptors, opens every entry relative to its parent with
`O_NOFOLLOW` (so nothing is followed, even if a link is swapped in during the walk), checks with `fstat`
after opening that it is a regular file, and bounds file sizes, the file count and the depth. The root
itself is the folder the caller named and is resolved once. Anything else raises `HarnessFileError`
naming the file. `write_tree` materialises a version the same way: no path leaves the folder, no
existing link or special file is written through.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FIX = "a harness holds only regular text files inside its folder (replace links with copies of the files)"


class HarnessError(ValueError):
    """The harness directory is unusable; the message names the file (and line) and the fix."""


class HarnessFileError(HarnessError):
    """A file of a harness folder is not a regular file inside it (a link, a device, a FIFO, too large, ...)
    or a harness path leaves the folder. `path` is the offending file, `problem` what is wrong with it."""

    def __init__(self, path: str, problem: str, fix: str = FIX) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}; {fix}")


@dataclass(frozen=True)
class TreeLimits:
    """Bounds on what one harness folder may hold (harness files are short text: prompts, tips, small code)."""

    max_file_bytes: int = 256_000
    max_total_bytes: int = 8_000_000
    max_files: int = 1_000
    max_depth: int = 16


def skipped(name: str) -> bool:
    """Entries never read (nor opened): hidden files and folders, Python caches."""
    return name.startswith(".") or name == "__pycache__"


def check_relative(rel: str, origin: str, what: str = "harness path") -> PurePosixPath:
    """`rel` as a path that stays inside a harness folder: relative, '/'-separated, no '..', no hidden or
    empty parts. Raises HarnessFileError naming it."""
    path = PurePosixPath(rel)
    if (not rel or "\\" in rel or "\0" in rel or path.is_absolute() or rel.endswith("/")
            or any(part in ("", ".", "..") or skipped(part) for part in rel.split("/"))):
        raise HarnessFileError(f"{origin}: {what} {rel!r}", "must be a relative path inside the harness folder "
                               "(no '..', no absolute path, no hidden parts)",
                               "name files relative to the folder, e.g. 'contract.md' or 'lib/util.py'")
    return path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


@dataclass
class _Reader:
    root: str
    limits: TreeLimits
    skip: frozenset[str]
    files: dict[str, str]
    total: int = 0

    def fail(self, rel: str, problem: str) -> HarnessFileError:
        return HarnessFileError(f"{self.root}/{rel}", problem)

    def walk(self, dir_fd: int, prefix: str, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise self.fail(prefix.rstrip("/"), f"nested deeper than {self.limits.max_depth} folders")
        for name in sorted(os.listdir(dir_fd)):
            rel = prefix + name
            if skipped(name) or (not prefix and name in self.skip):
                continue
            try:
                mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue  # removed while we read: not part of the harness
            if stat.S_ISDIR(mode):
                child = self.open(dir_fd, name, rel, DIR_FLAGS, stat.S_ISDIR)
                try:
                    self.walk(child, rel + "/", depth + 1)
                finally:
                    os.close(child)
            elif stat.S_ISREG(mode):
                self.read(dir_fd, name, rel)
            else:
                raise self.fail(rel, f"is {_kind(mode)}")

    def open(self, dir_fd: int, name: str, rel: str, flags: int, expect: object) -> int:
        """`name` opened relative to its folder without following a link; `expect(st_mode)` checked on the
        opened file itself (an entry swapped between listing and opening is caught here)."""
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            try:
                mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
                problem = f"is {_kind(mode)}" if stat.S_ISLNK(mode) else f"cannot be opened: {exc.strerror}"
            except OSError:
                problem = f"cannot be opened: {exc.strerror}"
            raise self.fail(rel, problem) from None
        mode = os.fstat(fd).st_mode
        if not expect(mode):  # type: ignore[operator]
            os.close(fd)
            raise self.fail(rel, f"is {_kind(mode)}")
        return fd

    def read(self, dir_fd: int, name: str, rel: str) -> None:
        if len(self.files) >= self.limits.max_files:
            raise self.fail(rel, f"one file more than the {self.limits.max_files} a harness may hold")
        fd = self.open(dir_fd, name, rel, READ_FLAGS, stat.S_ISREG)
        try:
            cap = self.limits.max_file_bytes
            if os.fstat(fd).st_size > cap:
                raise self.fail(rel, f"larger than {cap} bytes (harness files are short text)")
            chunks, size = [], 0
            while size <= cap and (chunk := os.read(fd, cap + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise self.fail(rel, f"cannot be read: {exc.strerror}") from None
        finally:
            os.close(fd)
        if size > cap:
            raise self.fail(rel, f"larger than {cap} bytes (harness files are short text)")
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise self.fail(rel, f"the harness's files add up to more than {self.limits.max_total_bytes} bytes")
        try:
            self.files[rel] = b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(rel, "not UTF-8 text") from None


def read_tree(directory: Path | str, skip: frozenset[str] = frozenset(),
              limits: TreeLimits = TreeLimits()) -> dict[str, str]:
    """Every regular file under `directory` as {relative POSIX path: text}, hidden files, `__pycache__` and the
    top-level names in `skip` left unread. Raises HarnessFileError (naming the file) for a symbolic link, a
    device, FIFO or socket, a file that is not UTF-8, or one over `limits`; HarnessError if there is no folder."""
    root = os.path.realpath(directory)
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        what = "is a file, not a harness directory" if os.path.exists(root) else "harness directory does not exist"
        raise HarnessError(f"{directory}: {what}; pass the folder holding harness.toml "
                           "(`ecdysis init DIR` writes one)") from None
    reader = _Reader(root, limits, skip, {})
    try:
        reader.walk(root_fd, "", 0)
    except OSError as exc:  # a folder that cannot be listed
        raise HarnessFileError(str(exc.filename or root), f"cannot be read: {exc.strerror}") from None
    finally:
        os.close(root_fd)
    return reader.files


def write_tree(files: dict[str, str], directory: Path) -> Path:
    """Write `files` ({relative path: text}) under `directory` (created if absent). Every path is checked
    (`check_relative`); folders and files are created relative to their parent's descriptor, and an existing
    link, folder or special file in the way raises HarnessFileError instead of being written through."""
    directory.mkdir(parents=True, exist_ok=True)
    root_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for rel, text in files.items():
            parts = check_relative(rel, str(directory)).parts
            fds = [root_fd]
            try:
                for part in parts[:-1]:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fds[-1])
                    except FileExistsError:
                        pass
                    try:
                        fds.append(os.open(part, DIR_FLAGS, dir_fd=fds[-1]))
                    except OSError as exc:
                        raise HarnessFileError(f"{directory}/{rel}", f"cannot create its folder {part!r}: "
                                               f"{exc.strerror}", "write a harness into a new, empty folder") from None
                _write_file(fds[-1], parts[-1], text.encode("utf-8"), f"{directory}/{rel}")
            finally:
                for fd in fds[1:]:
                    os.close(fd)
    finally:
        os.close(root_fd)
    return directory


def _write_file(dir_fd: int, name: str, data: bytes, shown: str) -> None:
    try:
        fd = os.open(name, WRITE_FLAGS, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        raise HarnessFileError(shown, f"cannot be written: {exc.strerror}", "write a harness into a new, empty "
                               "folder") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise HarnessFileError(shown, f"is {_kind(mode)}", "write a harness into a new, empty folder")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
