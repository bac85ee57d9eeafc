"""The L3 file backend's directory as another local user, or a planted file, would meet it.

- The directory is this user's and private: created 0700; refused when another user owns it or
  others may write to it; group/world read bits are dropped. Every file is opened through a
  descriptor of it (a later swap of the path changes nothing), created 0600 whatever the umask.
- A file is read only when it is a regular file (O_NOFOLLOW: a symlink is refused; O_NONBLOCK and
  fstat: a FIFO or device neither blocks nor is read) no larger than a valid chunk can be.
- The storage secret (the MAC key, storage_codec.py): derived from --hicache-storage-key, else 32
  random bytes in `.key` beside the chunks, created 0600 on first use, and refused when it is not
  a private regular file of this user.
- Servers sharing the directory: each claims an owner id (a lock file it holds while it runs: a
  restarted server takes back its predecessor's id, and with it its files), and they keep one byte
  count in `.lock`, changed under flock (DirUsage).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import secrets
import stat
import threading

logger = logging.getLogger(__name__)

KEY_FILE = ".key"
LOCK_FILE = ".lock"
SUFFIX = ".kv"
SECRET_BYTES = 32
MAX_OWNERS = 1024
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFileError(OSError):
    """Not a regular file of a plausible size (a symlink, FIFO, device or an oversized file)."""


def open_private_dir(path: str) -> int:
    """A descriptor of `path`, created 0700 when missing; ValueError when it is not private to
    this user."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"hicache_storage_dir {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise ValueError(
                f"hicache_storage_dir {path} belongs to another user (uid {st.st_uid}); "
                "the stored KV would be theirs to read and forge"
            )
        if st.st_mode & 0o022:
            raise ValueError(
                f"hicache_storage_dir {path} is writable by other users (mode "
                f"{stat.S_IMODE(st.st_mode):o}): chmod 700 it or choose another directory"
            )
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
            logger.warning(
                "hicache: %s was readable by other users (mode %o); now 0700",
                path,
                stat.S_IMODE(st.st_mode),
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(dir_fd: int, name: str, max_bytes: int) -> tuple[int, os.stat_result]:
    """A read descriptor of regular file `name` of at most max_bytes (FileNotFoundError when
    absent, UnsafeFileError when it is anything else), and its stat."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFileError(errno.ELOOP, "a symbolic link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        os.close(fd)
        what = (
            "not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else f"{st.st_size} bytes, over {max_bytes}"
        )
        raise UnsafeFileError(errno.EINVAL, what)
    return fd, st


def read_all(fd: int, buf) -> None:
    """Fill buf (a writable buffer) from fd."""
    mv, got = memoryview(buf).cast("B"), 0
    while got < len(mv):
        n = os.readv(fd, [mv[got:]])
        if n == 0:
            raise OSError(errno.EIO, "short read (the file shrank)")
        got += n


def write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Create file `name` (0600, never through a symlink, never over an existing file) holding
    data."""
    fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
    try:
        mv = memoryview(data)
        while mv:
            mv = mv[os.write(fd, mv) :]
    finally:
        os.close(fd)


def storage_secret(dir_fd: int, given: str | None) -> bytes:
    """The MAC key: from --hicache-storage-key when given, else the directory's key file (made on
    first use; two servers starting at once agree on one: it appears whole, by link)."""
    if given:
        return hashlib.sha256(b"radixlm-hicache-storage-key\0" + given.encode()).digest()
    try:
        return _read_key(dir_fd)
    except FileNotFoundError:
        pass
    tmp = f"{KEY_FILE}.{secrets.token_hex(8)}.tmp"
    write_new(dir_fd, tmp, secrets.token_bytes(SECRET_BYTES))
    try:
        os.link(tmp, KEY_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileExistsError:
        pass  # another server made it first: theirs is the key
    finally:
        os.unlink(tmp, dir_fd=dir_fd)
    return _read_key(dir_fd)


def _read_key(dir_fd: int) -> bytes:
    try:
        fd, st = open_regular(dir_fd, KEY_FILE, SECRET_BYTES)
    except UnsafeFileError as e:
        raise ValueError(f"the hicache storage key file {KEY_FILE} is {e.strerror}") from None
    try:
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != SECRET_BYTES:
            raise ValueError(
                f"the hicache storage key file {KEY_FILE} must be a {SECRET_BYTES}-byte file of"
                f" this user with mode 0600 (mode {stat.S_IMODE(st.st_mode):o}, {st.st_size} bytes)"
            )
        buf = bytearray(SECRET_BYTES)
        read_all(fd, buf)
        return bytes(buf)
    finally:
        os.close(fd)


def claim_owner(dir_fd: int, tag: str) -> tuple[str, int]:
    """An owner id `<tag>-<n>` no running server holds, and the descriptor whose lock holds it (the
    lowest free n: a restarted server gets its predecessor's id back)."""
    for n in range(MAX_OWNERS):
        fd = os.open(
            f".owner-{tag}-{n}.lock",
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return f"{tag}-{n}", fd
    raise ValueError(f"more than {MAX_OWNERS} servers share this hicache storage directory")


class DirUsage:
    """The bytes of chunk files in the directory, one count for every server sharing it: kept in
    the lock file and changed while holding it (`with usage:`), recounted from the directory's
    contents at start and before any eviction (a server that died mid-update leaves it stale
    only until then)."""

    def __init__(self, dir_fd: int):
        self.dir_fd = dir_fd
        self.fd = os.open(
            LOCK_FILE,
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        self._thread_lock = (
            threading.Lock()
        )  # flock is per open file: threads of one process queue here
        self.cached = 0  # the last count seen (for /get_server_info, without the lock)
        # The owner of the descriptor (HiCacheFile) closes it.

    def __enter__(self) -> DirUsage:
        self._thread_lock.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self._thread_lock.release()

    def read(self) -> int:
        raw = os.pread(self.fd, 32, 0)
        try:
            self.cached = max(0, int(raw or b"0"))
        except ValueError:
            self.cached = self.recount()
        return self.cached

    def write(self, total: int) -> None:
        self.cached = max(0, total)
        data = str(self.cached).encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def files(self) -> list[tuple[float, int, str]]:
        """(modification time, size, name) of every regular chunk file."""
        out = []
        with os.scandir(self.dir_fd) as it:
            for entry in it:
                if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        out.append((st.st_mtime, st.st_size, entry.name))
        return out

    def recount(self) -> int:
        total = sum(size for _, size, _ in self.files())
        self.write(total)
        return total
