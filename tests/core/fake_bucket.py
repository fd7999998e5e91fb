"""A stand-in for a Google Cloud Storage bucket in tests: ``gs://<bucket>/<key>`` is served from
``<root>/<bucket>/<key>`` on the local disk, both for ``etils.epath`` (through
``epath.testing.mock_epath``) and for orbax's TensorStore array files (its GCS kvstore spec is
replaced by a file kvstore at the same place), with no network. Orbax still takes every path for a
GCS one (``gs://`` prefix): it commits a step with a commit file, not a rename, as on a bucket.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from unittest import mock

from etils.epath import testing as epath_testing
from orbax.checkpoint._src.path import gcs_utils

PREFIX = "gs://"


@contextlib.contextmanager
def fake_gcs(root: str | os.PathLike) -> Iterator[None]:
    """Serves ``gs://`` paths from the folder ``root`` for the duration of the block."""
    root = os.fspath(root)

    def local(path) -> str:
        text = os.fspath(path)
        return os.path.join(root, text[len(PREFIX):]) if text.startswith(PREFIX) else text

    def remote(path: str) -> str:
        return PREFIX + os.path.relpath(path, root).replace(os.sep, "/")

    def one(original, path, *args, **kwargs):
        return original(local(path), *args, **kwargs)

    def two(original, path, dst, *args, **kwargs):
        return original(local(path), local(dst), *args, **kwargs)

    def glob(original, pattern):
        found = original(local(pattern))
        return [remote(p) for p in found] if os.fspath(pattern).startswith(PREFIX) else found

    def walk(original, top, **kwargs):
        on_gs = os.fspath(top).startswith(PREFIX)
        for here, dirs, names in original(local(top), **kwargs):
            yield (remote(here) if on_gs else here), dirs, names

    no_hierarchical_namespace = types.SimpleNamespace(hierarchical_namespace_enabled=False)
    with (epath_testing.mock_epath(open=one, exists=one, isdir=one, listdir=one, makedirs=one,
                                   mkdir=one, remove=one, rmtree=one, stat=one, rename=two,
                                   replace=two, copy=two, glob=glob, walk=walk),
          mock.patch.object(gcs_utils, "get_kvstore_for_gcs",
                            lambda path: {"driver": "file", "path": local(path)}),
          mock.patch.object(gcs_utils, "get_bucket", lambda name: no_hierarchical_namespace)):
        yield
