"""file:// — fragment files in a local directory (or a mounted network file system).

As in Gazette, a store URL `file:///some/path/` is rooted at a configured file-system root
(Gazette's `--broker.file-root`; "/" by default here), so the same journal specs can point at
a mount that sits at different places on different hosts. A file's path is
`<root>/<url path>/<journal>/<postfix>/<content name>`.

Writes are atomic and durable: content goes to a `.partial-*` temporary file in the target
directory, is fsync'ed, and is then hard-linked into place (link, unlike rename, never replaces
an existing file: the first complete copy of a content-addressed name wins, and a concurrent
duplicate put is harmless), and the directory is fsync'ed so that the new name survives a crash.

Like Gazette, `put` refuses to write unless `<root>/<url path>` already exists: a missing base
directory usually means a volume that failed to mount, and writing into the bare mount point
would silently lose the files from every other host's view. For the same reason a listing of a
store whose base directory is missing fails (StoreError) rather than answering "no fragments",
which readers would take for an empty journal or for lost content.

Signed URLs are plain `file://` URLs of the file's absolute path; they carry no authority and
do not expire. (Gazette's omit the root; they agree when the root is "/".)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

from broker.fragment.stores.base import (
    BlockingReader,
    Content,
    FragmentNotFoundError,
    FragmentReader,
    FragmentStore,
    ListedObject,
    StoreError,
    StoreURL,
    StoreURLError,
    as_bytes_io,
    run_blocking_put,
    run_to_completion,
)

SCHEME = "file"
# Temporary files of in-progress puts start with this; listings never report them.
PARTIAL_PREFIX = ".partial-"
# Copy buffer of puts from file objects.
copy_chunk_bytes = 1 << 20
_DIR_MODE = 0o750


class FileStore(FragmentStore):
    def __init__(self, url: StoreURL, root: Path | str = "/") -> None:
        if url.scheme != SCHEME:
            raise StoreURLError(f"scheme must be {SCHEME!r} (got {url.url!r})")
        if url.host:
            raise StoreURLError(f"must not have a host with the file scheme (got {url.url!r})")
        args = url.take_args(("find", "replace"))
        super().__init__(url, find=args.get("find", ""), replace=args.get("replace", ""))
        self._root = Path(os.path.abspath(root))
        self._base = self._path(url.prefix)

    def _path(self, key: str) -> Path:
        # Journal names may legally begin with "../"; never let one climb out of the root.
        path = Path(os.path.normpath(self._root / key))  # Keys include the URL path.
        if path != self._root and self._root not in path.parents:
            raise StoreError(f"fragment store {self.url}: key {key!r} escapes root {self._root}")
        return path

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        # Content-Encoding has no meaning for files; readers decompress per the name's codec.
        path = self._path(key)
        await run_blocking_put(lambda: self._put_blocking(path, content))

    def _put_blocking(self, path: Path, content: Content) -> None:
        if not self._base.is_dir():
            raise StoreError(
                f"fragment store {self.url}: invalid file store directory {self._base}"
                " (does not exist: is its volume mounted?)"
            )
        try:
            path.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=PARTIAL_PREFIX + path.name)
        except OSError as err:
            raise StoreError(f"fragment store {self.url}: preparing {path}: {err}") from err
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(as_bytes_io(content), out, copy_chunk_bytes)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # Same content address: an equivalent file is already in place.
            _fsync_dir(path.parent)
        except OSError as err:
            raise StoreError(f"fragment store {self.url}: writing {path}: {err}") from err
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    async def _open(self, key: str) -> FragmentReader:
        path = self._path(key)
        try:
            # Cancelled meanwhile, the thread's file is closed, not left to the collector.
            raw = await run_to_completion(lambda: open(path, "rb"), discard=lambda f: f.close())
        except FileNotFoundError:
            if not await asyncio.to_thread(self._base.is_dir):
                # The whole store is missing (an unmounted volume): unavailable, not a lost
                # fragment (readers would give up on DATA_LOSS instead of waiting for it).
                raise StoreError(
                    f"fragment store {self.url}: invalid file store directory {self._base}"
                    " (does not exist: is its volume mounted?)"
                ) from None
            raise FragmentNotFoundError(self.url, key) from None
        except OSError as err:
            raise StoreError(f"fragment store {self.url}: opening {path}: {err}") from err
        return BlockingReader(raw)

    async def _exists(self, key: str) -> bool:
        return await asyncio.to_thread(self._path(key).is_file)

    async def _delete(self, key: str) -> None:
        path = self._path(key)
        try:
            await asyncio.to_thread(path.unlink)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise StoreError(f"fragment store {self.url}: removing {path}: {err}") from err

    async def _sign(self, key: str, ttl_s: float) -> str:
        return "file://" + quote(str(self._path(key)))

    async def _list(self, prefix: str) -> list[ListedObject]:
        return await asyncio.to_thread(self._list_blocking, self._path(prefix))

    def _list_blocking(self, directory: Path) -> list[ListedObject]:
        out: list[ListedObject] = []

        def on_error(err: OSError) -> None:
            # A directory removed while we walk held no fragments we could still serve.
            if not isinstance(err, FileNotFoundError):
                raise err

        if not directory.is_dir():
            if not self._base.is_dir():
                # Not "no fragments": the store itself is missing (an unmounted volume, a root
                # moved away). Answering an empty listing would make the journal look empty
                # (or its content lost) to every reader until it is back.
                raise StoreError(
                    f"fragment store {self.url}: invalid file store directory {self._base}"
                    " (does not exist: is its volume mounted?)"
                )
            return out  # No fragments of this journal yet.
        try:
            for dirpath, dirnames, filenames in os.walk(directory, onerror=on_error):
                dirnames.sort()
                for name in sorted(filenames):
                    if name.startswith(PARTIAL_PREFIX):
                        continue
                    path = Path(dirpath) / name
                    try:
                        st = path.stat()
                    except FileNotFoundError:
                        continue  # Deleted since the directory was read.
                    rel = path.relative_to(directory).as_posix()
                    out.append(ListedObject(rel, int(st.st_mtime), st.st_size))
        except OSError as err:
            raise StoreError(f"fragment store {self.url}: listing {directory}: {err}") from err
        return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
