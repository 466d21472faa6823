"""A package's public names imported on first use (PEP 562), one way for every package.

A package whose `__init__` imported every module it exports would make importing any one of
its modules import them all (a Spark worker reading a partition would import the write side,
a sans-IO Sequencer grpc and asyncio). Such a package lists where each name is defined and
sets `__getattr__ = lazy_getattr(__name__, _EXPORTS)`; it imports the names under
`if TYPE_CHECKING:` too, for type checkers and readers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` resolving each name of `exports` (name: the
    module defining it) by importing that module when the name is first asked for; any other
    name is an AttributeError, as for a module without one."""
    where = dict(exports)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        # Kept as the package's own attribute: later uses (`client.append(...)` per append)
        # find it without this function and its import_module call.
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
