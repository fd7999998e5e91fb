"""The one dispatch of every kernel op: its implementation table and the choice of an implementation.

An op (``kernels/<op>/``: ``sparse_decode``, ``kv_quant``) declares in its ``api.py`` one
:class:`Table` of :class:`Implementation` entries, built from the modules of its folder. An entry
carries its name (the ``implementation=`` string that selects it), the function it calls (one
calling convention per entry point of the op, fixed by ``api.py``), the platforms it runs on, and
a :data:`Supports` hook that says which shapes it can tile. An entry point resolves its
``implementation=`` with :func:`resolve` and calls the chosen entry's ``fn``:

* ``"auto"`` (the default of every op; None means the same): the first name of the table's
  preference for the platform (:meth:`Table.auto_choice`) that implements the entry point; the
  platform is ``jax.default_backend()`` (``"cpu"``, ``"gpu"`` or ``"tpu"``);
* a name: kept when it is in the table, implements the entry point and runs on the call's platform
  (:meth:`Implementation.supported_on`; a Pallas kernel runs anywhere in interpret mode);
  otherwise refused with one ``ValueError`` of the same wording for every op, naming what was
  asked, where, and what is available there.

Shapes: given the call's shapes (a mapping of the op's shape names to ints, e.g. ``{"chunk":
128, "head_dim": 64}``), :func:`resolve` (or :func:`check_kernel_shape`, the same check with one
signature for every op) asks the chosen entry's ``supports(shapes, platform)``: None when it serves
them, else the reason, raised as ``ValueError("<where>: <reason>")`` before anything is traced.
``"auto"`` never swaps to another implementation in silence: when the platform's first choice
cannot tile the shapes the call is refused with that reason (which names the implementation that
serves them), so a program runs the same kernel for every shape it accepts on a platform.

The platform of a call (:func:`call_platform`): ``jax.default_backend()`` when its arrays are
concrete. A traced call (inside ``jit``) may be lowered for another platform than this host's
(compile-only TPU or GPU devices, :mod:`core.aot`), which is not known while tracing; there only
the name, the entry point and the shapes are checked, and Pallas refuses to lower a kernel for a
platform it does not serve.

Adding an op ``kernels/<op>/`` touches that folder and one line here:

1. the folder holds the modules every op has (``reference.py`` the jnp specification,
   ``xla.py``, ``pallas_tpu.py``, ``pallas_gpu.py``, ``cost.py``, ``cache.py``, ``sharded.py``,
   ``api.py``, ``__init__.py``; ``tests/test_module_structure.py`` checks the set);
2. its ``api.py`` builds ``TABLE = dispatch.Table(op, (Implementation(name, fn, platforms,
   interpretable=..., supports=..., entry=...), ...), auto={platform: names})`` from those
   modules, and its entry points call ``dispatch.resolve(TABLE, implementation, where, ...)``
   and then the returned entry's ``fn``;
3. its ``cache.py`` and ``sharded.py`` register their KV-cache backends with
   ``@kernels.cache_backend.register_backend(name)``;
4. the one registration: its name in :data:`OPS` below. ``models.kv_cache`` imports the backend
   modules of every op of :data:`OPS` (:func:`backend_modules`), so ``get_backend`` knows the
   new backends without an edit there, and the structure tests check every op of :data:`OPS`.

Its tests go in ``tests/kernels/<op>/``, and each backend it registers needs small options in
``tests/kernels/test_cache_contract.py`` (the contract test refuses a backend without them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from kernels import checks

PLATFORMS = ("cpu", "gpu", "tpu")  # jax.default_backend() names

# The registered ops, one folder kernels/<op>/ each: the one place a new op is registered.
OPS = ("sparse_decode", "kv_quant")
# The modules of an op folder that define (and register) KV-cache backends.
BACKEND_MODULES = ("cache", "sharded")

Shapes = Mapping[str, int]  # the op's shape names -> sizes, e.g. {"page_size": 16, "group": 4}
# ``supports(shapes, platform) -> None`` (serves them) or the reason it does not, a sentence that
# names the values refused and what serves them; ``platform`` is None when not known (traced).
Supports = Callable[[Shapes, str | None], str | None]


def backend_modules() -> tuple[str, ...]:
    """The module names ``kernels.<op>.<module>`` that define KV-cache backends, for every op of
    :data:`OPS` and module of :data:`BACKEND_MODULES`."""
    return tuple(f"kernels.{op}.{module}" for op in OPS for module in BACKEND_MODULES)


def supports_every_shape(shapes: Shapes, platform: str | None) -> None:
    """The default :data:`Supports` hook: every shape is served."""
    del shapes, platform


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One implementation of one entry point of an op.

    Attributes:
      name: the ``implementation=`` value that selects it.
      fn: the function the entry point calls, with the entry point's calling convention (set by
        the op's ``api.py``).
      platforms: the platforms (:data:`PLATFORMS`) it runs on compiled.
      interpretable: a Pallas kernel: it also runs on any platform with ``interpret=True``.
      supports: the :data:`Supports` hook: None for shapes it serves, else the reason.
      entry: the op's entry point it implements (None: the op has one entry point).

    Raises:
      ValueError: on construction, an empty name, a ``fn`` or ``supports`` that is not callable,
        or a platform not in :data:`PLATFORMS`.
    """

    name: str
    fn: Callable[..., Any]
    platforms: tuple[str, ...] = PLATFORMS
    interpretable: bool = False
    supports: Supports = supports_every_shape
    entry: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise checks.error("Implementation", "name", "a non-empty string", repr(self.name))
        for field in ("fn", "supports"):
            if not callable(getattr(self, field)):
                raise checks.error(f"Implementation({self.name!r})", field, "a callable",
                                   repr(getattr(self, field)))
        if not self.platforms or any(p not in PLATFORMS for p in self.platforms):
            raise checks.error(f"Implementation({self.name!r})", "platforms",
                               f"a non-empty tuple of {PLATFORMS}", repr(self.platforms))

    def supported_on(self, platform: str, interpret: bool = False) -> bool:
        """True when it runs on ``platform`` (with ``interpret``: Pallas interpret mode)."""
        return platform in self.platforms or (interpret and self.interpretable)

    def serves_entry(self, entry: str | None) -> bool:
        """True when it implements ``entry`` (None: any entry point)."""
        return entry is None or self.entry == entry


@dataclasses.dataclass(frozen=True)
class Table:
    """An op's implementations and what ``"auto"`` picks per platform.

    Attributes:
      op: the op's name (``kernels/<op>``), for messages.
      implementations: every implementation, in the order messages list them; an op with several
        entry points has one entry per (name, entry point) it implements, and the entries of one
        name share its platforms.
      auto: platform -> names in order of preference; ``"auto"`` takes the first that implements
        the entry point. A platform without an entry uses ``auto["*"]``.

    Raises:
      ValueError: on construction, a (name, entry point) listed twice, a name ``"auto"``, entries
        of one name with different platforms, entry points given for some entries only, or an
        ``auto`` without ``"*"`` or naming an implementation the table lacks.
    """

    op: str
    implementations: tuple[Implementation, ...]
    auto: Mapping[str, tuple[str, ...]]

    def __post_init__(self):
        keys = [(i.name, i.entry) for i in self.implementations]
        if len(set(keys)) != len(keys) or "auto" in self.names:
            raise ValueError(f"Table({self.op!r}): implementation names must be distinct per entry "
                             f"point and not 'auto', got {keys}")
        for name in self.names:
            first = self._rows(name)[0]
            if any((i.platforms, i.interpretable) != (first.platforms, first.interpretable)
                   for i in self._rows(name)):
                raise ValueError(f"Table({self.op!r}): the entries of {name!r} must share their "
                                 f"platforms, got {[i.platforms for i in self._rows(name)]}")
        if len({i.entry is None for i in self.implementations}) > 1:
            raise ValueError(f"Table({self.op!r}): give every implementation its entry point or "
                             f"none, got {keys}")
        bad = [n for pref in self.auto.values() for n in pref if n not in self.names]
        if "*" not in self.auto or bad:
            raise ValueError(f"Table({self.op!r}): auto must map '*' and platforms to names of "
                             f"{self.names}, got {dict(self.auto)}")

    def _rows(self, name: str) -> tuple[Implementation, ...]:
        return tuple(i for i in self.implementations if i.name == name)

    @property
    def names(self) -> tuple[str, ...]:
        """The implementation names, in table order, each once."""
        return tuple(dict.fromkeys(i.name for i in self.implementations))

    @property
    def entries(self) -> tuple[str | None, ...]:
        """The op's entry points, in table order (``(None,)`` for an op with one)."""
        return tuple(dict.fromkeys(i.entry for i in self.implementations))

    def get(self, name: str, entry: str | None = None) -> Implementation | None:
        """The implementation called ``name`` of ``entry`` (None: its first entry), or None."""
        return next((i for i in self.implementations
                     if i.name == name and i.serves_entry(entry)), None)

    def auto_choice(self, platform: str, entry: str | None = None) -> Implementation:
        """What ``"auto"`` picks on ``platform`` for ``entry``: the first name of the platform's
        preference that implements it.

        Raises:
          ValueError: no implementation of the preference implements ``entry``.
        """
        for name in self.auto.get(platform, self.auto["*"]):
            impl = self.get(name, entry)
            if impl is not None:
                return impl
        raise ValueError(f"{self.op}: no implementation of {entry!r} is picked by 'auto' on "
                         f"platform {platform!r}")

    def available(self, platform: str | None, entry: str | None = None,
                  interpret: bool = False) -> tuple[str, ...]:
        """Names that implement ``entry`` and run on ``platform`` (None: on some platform)."""
        return tuple(n for n in self.names if (impl := self.get(n, entry)) is not None
                     and (platform is None or impl.supported_on(platform, interpret)))

    def describe(self) -> str:
        """Every implementation with its platforms (and its entry points, where it lacks some),
        for messages: ``name (platforms[; any platform with interpret=True][; E only])``."""
        out = []
        for name in self.names:
            rows = self._rows(name)
            parts = [", ".join(rows[0].platforms)]
            if rows[0].interpretable:
                parts.append("any platform with interpret=True")
            if len(rows) < len(self.entries):
                parts.append(" and ".join(i.entry for i in rows) + " only")
            out.append(f"{name} ({'; '.join(parts)})")
        return "; ".join(out)


def current_platform() -> str:
    """The platform this process runs jitted code on: ``jax.default_backend()``."""
    return jax.default_backend()


def call_platform(*args: Any) -> str | None:
    """The platform a call on ``args`` runs on: :func:`current_platform` when every array in
    ``args`` is concrete; None when one is traced (the program may be compiled for another
    platform, module docstring)."""
    return None if checks.is_traced(args) else current_platform()


def check_kernel_shape(table: Table, implementation: str, shapes: Shapes, where: str, *,
                       entry: str | None = None, platform: str | None = None) -> None:
    """Raises ValueError, before anything is traced, when the implementation ``implementation``
    (a name of ``table``, or ``"auto"`` / None: what :func:`resolve` picks) cannot tile
    ``shapes``: its ``supports(shapes, platform)`` hook gave a reason. No other implementation is
    substituted.

    Raises:
      ValueError: ``"<where>: <reason>"``; or ``implementation`` is not a name of ``table`` for
        ``entry`` (the message of :func:`resolve`).
    """
    impl = table.get(implementation, entry) if isinstance(implementation, str) else None
    if impl is None:
        impl = resolve(table, implementation, where, entry=entry)  # raises the refusal
    reason = impl.supports(shapes, platform)
    if reason is not None:
        raise ValueError(f"{where}: {reason}")


def resolve(table: Table, implementation: str | None, where: str, *, entry: str | None = None,
            platform: str | None = None, interpret: bool = False,
            shapes: Shapes | None = None) -> Implementation:
    """The implementation a call uses.

    Args:
      table: the op's :class:`Table`.
      implementation: ``"auto"`` (or None, the same) or a name of ``table``.
      where: the public function or class asked, for the message.
      entry: the entry point called (an implementation may serve only some); None: any.
      platform: the call's platform (:func:`call_platform`); None: not known (only the name, the
        entry point and the shapes are checked).
      interpret: the call runs Pallas kernels in interpret mode.
      shapes: the call's shapes, for the chosen implementation's ``supports`` hook
        (:func:`check_kernel_shape`); None: not checked.

    Returns:
      the :class:`Implementation` of ``table`` (its ``fn`` is what the entry point calls): for
      ``"auto"`` / None, :meth:`Table.auto_choice` on :func:`current_platform`.

    Raises:
      ValueError: the name is not in the table, does not serve ``entry``, or does not run on
        ``platform``; one wording for every op: ``"<where>: implementation <asked> is not
        available [for <entry>] [on platform <platform>]; expected None, 'auto' or one of
        <available there> (<op> implementations: <name (platforms)>; ...)"``. The chosen
        implementation cannot tile ``shapes``: ``"<where>: <reason>"``.
    """
    if implementation is None or implementation == "auto":
        impl = table.auto_choice(current_platform(), entry)
    else:
        impl = table.get(implementation, entry) if isinstance(implementation, str) else None
        if impl is None or (platform is not None and not impl.supported_on(platform, interpret)):
            on = ("" if entry is None else f" for {entry}") + (
                "" if platform is None else f" on platform {platform!r}") + (
                " in interpret mode" if interpret and platform is not None else "")
            raise ValueError(f"{where}: implementation {implementation!r} is not available{on}; "
                             f"expected None, 'auto' or one of "
                             f"{table.available(platform, entry, interpret)} "
                             f"({table.op} implementations: {table.describe()})")
    if shapes is not None:
        check_kernel_shape(table, impl.name, shapes, where, entry=impl.entry, platform=platform)
    return impl
