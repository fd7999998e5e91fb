"""Test support shared by the bad-input batteries of every package (pytest is imported lazily, so
the library does not depend on it).

A battery collects cases with :meth:`BadInputs.add` and runs each through one parametrized test:

    CASES = BadInputs()
    CASES.add("pass_at_k-negative-n", rl_metrics.pass_at_k, jnp.array([-1]), jnp.array([0]), 1,
              match="num_samples")

    @pytest.mark.parametrize("case", CASES.params())
    def test_bad_input_is_one_clear_value_error(case):
        case.check()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class BadInput:
    """One call that must fail with a one-line ``ValueError`` whose message matches ``match``."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    match: str

    def check(self) -> None:
        """Calls ``fn(*args, **kwargs)``; asserts a ``ValueError`` matching ``match`` (a regular
        expression searched in the message) whose message is one line."""
        import pytest

        with pytest.raises(ValueError, match=self.match) as error:
            self.fn(*self.args, **self.kwargs)
        message = str(error.value)
        assert "\n" not in message.strip(), f"the error spans several lines: {message!r}"


class BadInputs:
    """An ordered collection of :class:`BadInput` cases with unique ids."""

    def __init__(self) -> None:
        self._cases: dict[str, BadInput] = {}

    def add(self, case_id: str, fn: Callable[..., Any], *args: Any, match: str,
            **kwargs: Any) -> None:
        """Adds the call ``fn(*args, **kwargs)``, expected to raise a ``ValueError`` matching
        ``match``.

        Raises:
          ValueError: ``case_id`` already used.
        """
        if case_id in self._cases:
            raise ValueError(f"BadInputs.add: case id {case_id!r} is already used")
        self._cases[case_id] = BadInput(fn, args, kwargs, match)

    def __len__(self) -> int:
        return len(self._cases)

    def params(self) -> list:
        """The cases as ``pytest.param(case, id=case_id)``."""
        import pytest

        return [pytest.param(case, id=case_id) for case_id, case in self._cases.items()]


class LoopbackFileServer:
    """An HTTP server on 127.0.0.1 (a free port) in a daemon thread that serves one body at any
    path, for tests of downloads that must not reach the network. Use it as a context manager;
    it stops on exit.

    ``mode``: ``"ok"`` (honours ``Range: bytes=N-`` with 206, or 416 past the end),
    ``"ignore_range"`` (always 200 and the whole body), ``"truncate"`` (announces the full length
    and closes after ``cut`` bytes, for the first ``cuts`` requests, then as ``"ok"``), ``"error"``
    (HTTP 500). ``requests`` records each request's ``Range`` header (``None`` without one).
    """

    def __init__(self, body: bytes, mode: str = "ok", cut: int = 0, cuts: int = 1):
        import http.server
        import threading

        self.body, self.mode, self.cut, self.cuts = body, mode, cut, cuts
        self.requests: list[str | None] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 10  # a stuck client cannot hold its thread

            def do_GET(self):  # noqa: N802 (the http.server hook's name)
                rng = self.headers.get("Range")
                server.requests.append(rng)
                body = server.body
                if server.mode == "error":
                    self.send_error(500, "test server error")
                    return
                start = 0
                if rng and server.mode != "ignore_range":
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                rest = body[start:]
                self.send_header("Content-Length", str(len(rest)))
                self.end_headers()
                if server.mode == "truncate" and server.cuts > 0:
                    server.cuts -= 1
                    self.wfile.write(rest[:server.cut])
                    return  # HTTP/1.0: the connection closes short of the announced length
                self.wfile.write(rest)

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, name: str) -> str:
        """``http://127.0.0.1:<port>/<name>``."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/{name}"

    def __enter__(self) -> LoopbackFileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def closed_port_url(name: str) -> str:
    """A loopback URL on a port nothing listens on (bound, then released): an offline source."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def assert_same_model(sharded, single, vocab_size: int, length: int = 24) -> None:
    """Assert that two loads of one checkpoint (``models.hf_checkpoint.Checkpoint``: one sharded
    over a mesh, one on a single device) hold bit-identical parameters and give the same logits
    on ``length`` token ids, to float32 rounding of the largest logit.

    Raises:
      AssertionError: a parameter differs, or a logit differs by more than 1e-5 of the largest.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    for a, b in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids = jnp.asarray(np.arange(length)[None] % vocab_size)
    got = jax.jit(lambda p: nnx.merge(sharded.graphdef, p)(ids))(sharded.params)
    want = nnx.merge(single.graphdef, single.params)(ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(jnp.abs(want).max()))
