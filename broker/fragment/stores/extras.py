"""Stores whose SDKs are optional extras of the package: loaded on first use of their scheme.

gs:// needs google-cloud-storage (`pip install 'gazette-py[gcs]'`), azure:// and azure-ad://
need azure-storage-blob and azure-identity (`[azure]`). A broker that never sees such a URL
never imports them; one that does, without the extra installed, gets a MissingStoreExtraError
naming the extra to install, where the store would be built (the journal's spec is then
reported as unusable like any other bad store URL), never an ImportError from deep inside.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from broker.fragment.stores.base import FragmentStore, StoreURL, StoreURLError

_OUR_PACKAGES = ("broker", "gazette_consumer")


class MissingStoreExtraError(StoreURLError):
    """The store of a URL needs an optional dependency that is not installed."""

    def __init__(self, url: str, extra: str, module: str) -> None:
        scheme = url.split(":", 1)[0]
        super().__init__(
            f"{scheme}:// fragment stores need the {extra!r} extra (missing module {module!r}):"
            f" pip install 'gazette-py[{extra}]' (got {url!r})"
        )
        self.extra = extra
        self.module = module


def lazy_constructor(
    module: str, factory: str, extra: str | None
) -> Callable[[StoreURL], FragmentStore]:
    """A registry constructor that imports `module` when first called and builds the store
    with its `factory`, raising MissingStoreExtraError if the SDK behind it is missing. With
    `extra` None the SDK is a dependency of the package itself (boto3 for s3://): only the
    import is deferred, and a missing SDK is a broken install, its ImportError raised as is."""

    def build(url: StoreURL) -> FragmentStore:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            missing = err.name or "?"
            if extra is None or missing.split(".")[0] in _OUR_PACKAGES:
                raise  # A bug of ours (or a broken install), not a missing extra.
            raise MissingStoreExtraError(url.url, extra, missing) from None
        store: FragmentStore = getattr(mod, factory)(url)
        return store

    return build
