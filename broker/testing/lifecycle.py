"""``with`` / ``async with`` for test servers and clusters that have ``start()`` and ``close()``.

Entering starts; leaving closes. A start that fails closes too (a half-started server holds a
port, a process or a directory), then re-raises: a test never leaks what a failed start left.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Lifecycle:
    """Mixin for a synchronous ``start()`` / ``close()`` (see the module docstring)."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncLifecycle:
    """Mixin for an ``async`` ``start()`` / ``close()`` (see the module docstring)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
