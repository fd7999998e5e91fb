"""The one dispatch of every kernel op: its implementation table and the choice of an implementation.

An op's ``api.py`` (``kernels/sparse_decode``, ``kernels/kv_quant``) declares one :class:`Table`
of :class:`Implementation` entries and resolves each call's ``implementation=`` with
:func:`resolve`:

* ``None`` or ``"auto"``: the first name of the table's preference for the platform
  (:meth:`Table.auto_choice`) that serves the entry point; the platform is
  ``jax.default_backend()`` (``"cpu"``, ``"gpu"`` or ``"tpu"``);
* a name: kept when it is in the table, serves the entry point and runs on the call's platform
  (:meth:`Implementation.supported_on`; a Pallas kernel runs anywhere in interpret mode);
  otherwise refused with one ``ValueError`` of the same wording for every op, naming what was
  asked, where, and what is available there.

The platform of a call (:func:`call_platform`): ``jax.default_backend()`` when its arrays are
concrete. A traced call (inside ``jit``) may be lowered for another platform than this host's
(compile-only TPU or GPU devices, :mod:`core.aot`), which is not known while tracing; there only
the name and the entry point are checked, and Pallas refuses to lower a kernel for a platform it
does not serve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from kernels import checks

PLATFORMS = ("cpu", "gpu", "tpu")  # jax.default_backend() names


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One implementation of an op.

    Attributes:
      name: the ``implementation=`` value that selects it.
      platforms: the platforms (:data:`PLATFORMS`) it runs on compiled.
      interpretable: a Pallas kernel: it also runs on any platform with ``interpret=True``.
      serves: the op's entry points it implements (None: every one).
    """

    name: str
    platforms: tuple[str, ...] = PLATFORMS
    interpretable: bool = False
    serves: tuple[str, ...] | None = None

    def supported_on(self, platform: str, interpret: bool = False) -> bool:
        """True when it runs on ``platform`` (with ``interpret``: Pallas interpret mode)."""
        return platform in self.platforms or (interpret and self.interpretable)

    def serves_entry(self, entry: str | None) -> bool:
        """True when it implements ``entry`` (None: any entry point)."""
        return entry is None or self.serves is None or entry in self.serves

    def describe(self) -> str:
        """``name (platforms[; any platform with interpret=True][; entry points only])``."""
        parts = [", ".join(self.platforms)]
        if self.interpretable:
            parts.append("any platform with interpret=True")
        if self.serves is not None:
            parts.append(" and ".join(self.serves) + " only")
        return f"{self.name} ({'; '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class Table:
    """An op's implementations and what ``"auto"`` picks per platform.

    Attributes:
      op: the op's name (``kernels/<op>``), for messages.
      implementations: every implementation, in the order messages list them.
      auto: platform -> names in order of preference; ``"auto"`` takes the first that serves the
        entry point. A platform without an entry uses ``auto["*"]``.
    """

    op: str
    implementations: tuple[Implementation, ...]
    auto: Mapping[str, tuple[str, ...]]

    def __post_init__(self):
        names = self.names
        if len(set(names)) != len(names) or "auto" in names:
            raise ValueError(f"Table({self.op!r}): implementation names must be distinct and not "
                             f"'auto', got {names}")
        bad = [n for pref in self.auto.values() for n in pref if n not in names]
        if "*" not in self.auto or bad:
            raise ValueError(f"Table({self.op!r}): auto must map '*' and platforms to names of "
                             f"{names}, got {dict(self.auto)}")

    @property
    def names(self) -> tuple[str, ...]:
        """The implementation names, in table order."""
        return tuple(i.name for i in self.implementations)

    def get(self, name: str) -> Implementation | None:
        """The implementation called ``name``, or None."""
        return next((i for i in self.implementations if i.name == name), None)

    def auto_choice(self, platform: str, entry: str | None = None) -> str:
        """What ``"auto"`` picks on ``platform`` for ``entry``: the first name of the platform's
        preference that serves it.

        Raises:
          ValueError: no implementation of the preference serves ``entry``.
        """
        for name in self.auto.get(platform, self.auto["*"]):
            if self.get(name).serves_entry(entry):
                return name
        raise ValueError(f"{self.op}: no implementation of {entry!r} is picked by 'auto' on "
                         f"platform {platform!r}")

    def available(self, platform: str | None, entry: str | None = None,
                  interpret: bool = False) -> tuple[str, ...]:
        """Names that serve ``entry`` and run on ``platform`` (None: on some platform)."""
        return tuple(i.name for i in self.implementations if i.serves_entry(entry)
                     and (platform is None or i.supported_on(platform, interpret)))

    def describe(self) -> str:
        """Every implementation with its platforms, for messages."""
        return "; ".join(i.describe() for i in self.implementations)


def current_platform() -> str:
    """The platform this process runs jitted code on: ``jax.default_backend()``."""
    return jax.default_backend()


def call_platform(*args: Any) -> str | None:
    """The platform a call on ``args`` runs on: :func:`current_platform` when every array in
    ``args`` is concrete; None when one is traced (the program may be compiled for another
    platform, module docstring)."""
    return None if checks.is_traced(args) else current_platform()


def resolve(table: Table, implementation: str | None, where: str, *, entry: str | None = None,
            platform: str | None = None, interpret: bool = False) -> str:
    """The implementation name a call uses.

    Args:
      table: the op's :class:`Table`.
      implementation: None, ``"auto"`` or a name of ``table``.
      where: the public function or class asked, for the message.
      entry: the entry point called (an implementation may serve only some); None: any.
      platform: the call's platform (:func:`call_platform`); None: not known (only the name and
        the entry point are checked).
      interpret: the call runs Pallas kernels in interpret mode.

    Returns:
      a name of ``table``: for None / ``"auto"``, :meth:`Table.auto_choice` on
      :func:`current_platform`.

    Raises:
      ValueError: the name is not in the table, does not serve ``entry``, or does not run on
        ``platform``; one wording for every op: ``"<where>: implementation <asked> is not
        available [for <entry>] [on platform <platform>]; expected None, 'auto' or one of
        <available there> (<op> implementations: <name (platforms)>; ...)"``.
    """
    if implementation is None or implementation == "auto":
        return table.auto_choice(current_platform(), entry)
    impl = table.get(implementation) if isinstance(implementation, str) else None
    if (impl is not None and impl.serves_entry(entry)
            and (platform is None or impl.supported_on(platform, interpret))):
        return implementation
    on = ("" if entry is None else f" for {entry}") + (
        "" if platform is None else f" on platform {platform!r}") + (
        " in interpret mode" if interpret and platform is not None else "")
    raise ValueError(f"{where}: implementation {implementation!r} is not available{on}; expected "
                     f"None, 'auto' or one of {table.available(platform, entry, interpret)} "
                     f"({table.op} implementations: {table.describe()})")
