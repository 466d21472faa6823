"""BLOB stores of fragment files. The interface is in `base`; backends in `file_store`,
`s3_store`, `gcs_store`, `azure_store` and `memory_store` (the cloud SDKs of `gcs_store` and
`azure_store` are optional extras, loaded on first use through `extras`); URL-to-store
construction in `registry`; and the behaviour every backend must have, runnable against any of
them, in `conformance`."""

from broker.fragment.stores.base import (
    FragmentNotFoundError,
    FragmentReader,
    FragmentStore,
    StoreError,
    StoreURL,
    StoreURLError,
)

__all__ = [
    "FragmentNotFoundError",
    "FragmentReader",
    "FragmentStore",
    "StoreError",
    "StoreURL",
    "StoreURLError",
]
