"""One declaration per setting, and everything derived from it.

A settings class (``ThreadConfig``, ``IOConfig``... in :mod:`colibri.settings.config`)
subclasses :class:`Settings` and declares each field once, as a :class:`Setting`::

    workers: Setting[int | Literal["auto"], int | Literal["auto"]] = Setting(
        int_or_auto(0, MAX_IO_WORKERS, 'threads (or "auto")'), default=2,
        doc="threads reading experts from disk, ...",
        flag=Flag("--io-workers", metavar="N|auto", parse=count_or_auto),
        core="workers", to_core=_auto_as_minus_one)

The two type arguments are what the field accepts and what it holds (``"spin"`` in,
``WaitPolicy.SPIN`` out). From the declarations come: ``__init__`` (a frozen dataclass;
type checkers see the signature through ``dataclass_transform``, the accepted types through
the descriptor's ``__set__``), validation with the field's own message, ``to_dict``,
``from_dict``, ``replace`` and ``repr``, the command-line flags (cli/parser.py walks
:func:`flag_settings`), the docs/tuning.md rows a test checks, and the copy the core gets
(:func:`copy_to_core`, used by engine/core_spec.py and engine/streaming.py).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

from ..errors import ConfigError
from .names import check_names, checked_init, settings_repr

if TYPE_CHECKING:
    from typing import Self, dataclass_transform
else:  # Python 3.10: the decorator only informs type checkers

    def dataclass_transform(**_: object) -> Callable[[type], type]:
        return lambda cls: cls

__all__ = ["Check", "Flag", "Setting", "Settings", "copy_to_core", "flag_settings",
           "settings_of"]

In = TypeVar("In")
Out = TypeVar("Out")


class Check(Generic[Out]):
    """A field's validator: ``check("IOConfig.workers", value)`` returns the typed value or
    raises ConfigError naming the field. `choices`: the strings it accepts (a flag offers
    them); `config`: the settings class of a sub-config field; `size`: a byte count
    (``repr`` writes it as ``'6GiB'``)."""

    def __init__(self, fn: Callable[[str, object], Out], *, choices: tuple[str, ...] = (),
                 config: type[Settings] | None = None, size: bool = False) -> None:
        self.fn = fn
        self.choices = choices
        self.config = config
        self.size = size

    def __call__(self, field: str, value: object) -> Out:
        return self.fn(field, value)


class Flag:
    """The ``colibri run``/``chat``/``serve`` flag that sets a field (cli/parser.py). A
    bool field gets ``--x`` / ``--no-x``. Its help is the setting's `doc` unless `help` is
    given, followed by ``(default: ...)``: `default_text`, or the default itself (on/off
    for a bool). `parse`: argparse's ``type=`` (None: the text as given); `choices`: the
    allowed values in this order (none given: the validator's); `group`: the --help group
    (none given: the class's ``flag_group``)."""

    def __init__(self, *names: str, metavar: str | None = None,
                 parse: Callable[[str], object] | None = None, choices: tuple[str, ...] = (),
                 help: str = "", default_text: str = "", group: str = "") -> None:
        self.names = names  # e.g. ("-t", "--threads"): the long name last
        self.metavar = metavar
        self.parse = parse
        self.choices = choices
        self.help = help
        self.default_text = default_text
        self.group = group

    @property
    def long(self) -> str:
        return self.names[-1]


class Setting(Generic[In, Out]):
    """One field of a settings class: its validator, default, one-line `doc` (the flag's
    help and the docs row a missing one should get), the flag that sets it, and where the
    core's copy goes (`core`: the attribute of ``_core.StoreSettings`` /
    ``_core.ThreadSettings``; `to_core`: the value's conversion, when not the value itself
    or an enum member of the same name). `kw_only`: only by name (fields added later, so
    positional calls keep their meaning)."""

    name: str
    owner: str

    def __init__(self, check: Check[Out], *, default: In, doc: str, kw_only: bool = False,
                 flag: Flag | None = None, core: str | None = None,
                 to_core: Callable[[Out], object] | None = None) -> None:
        self.check = check
        self.default = default
        self.doc = doc
        self.kw_only = kw_only
        self.flag = flag
        self.core = core
        self.to_core = to_core

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner.__name__

    @property
    def qualname(self) -> str:
        """``Class.field``: how messages, flags and docs name it."""
        return f"{self.owner}.{self.name}"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[In, Out]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Out: ...
    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            return obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, obj: object, value: In) -> None:
        # Reached only from __init__ (object.__setattr__): the frozen dataclass's own
        # __setattr__ refuses every other assignment.
        obj.__dict__[self.name] = self.check(self.qualname, value)

    def validate(self, value: object) -> Out:
        return self.check(self.qualname, value)

    def default_value(self) -> Out:
        return self.validate(self.default)

    def shown_default(self) -> str:
        """The default as docs/tuning.md writes it: ``2``, ``True``, ``None``,
        ``"auto"``, ``ThreadConfig()``."""
        value = self.default_value()
        if isinstance(value, Settings):
            return f"{type(value).__name__}()"
        if isinstance(value, Enum):
            value = value.value
        return f'"{value}"' if isinstance(value, str) else repr(value)

    def flag_default(self) -> str:
        """The ``(default: ...)`` text of the flag's help."""
        if self.flag is not None and self.flag.default_text:
            return self.flag.default_text
        value = self.default_value()
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value.value if isinstance(value, Enum) else value)


def _plain(value: object) -> object:
    """A field's value as ``to_dict`` gives it: enums as strings, sub-configs as mappings,
    tuples as lists (JSON has no tuples)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Settings):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    return value


@dataclass_transform(frozen_default=True, field_specifiers=(Setting,))
class Settings:
    """Base of the settings classes: a subclass's :class:`Setting` fields make it a frozen
    dataclass with a validating ``__init__`` (misspelled, repeated or surplus arguments
    raise ConfigError: names.checked_init) and the methods below."""

    __settings__: ClassVar[tuple[Setting[Any, Any], ...]] = ()
    flag_group: ClassVar[str] = "engine"  # the --help group of the class's flags

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table = tuple(v for v in vars(cls).values() if isinstance(v, Setting))
        cls.__settings__ = table
        dataclasses.dataclass(frozen=True, init=False, repr=False)(cls)
        cls.__init__ = _make_init(cls, table)  # type: ignore[method-assign]

    def __repr__(self) -> str:
        """Only what differs from the defaults; ``eval(repr(c)) == c``."""
        sizes = tuple(s.name for s in self.__settings__ if s.check.size)
        return settings_repr(self, sizes=sizes)

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` applied and validated (a sub-config given as a mapping
        replaces the whole sub-config, its missing fields at their defaults)."""
        check_names(type(self).__name__, changes, [s.name for s in self.__settings__])
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """Builds from a mapping of field names (e.g. parsed JSON/TOML; sub-configs as
        nested mappings); validates."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{cls.__name__}: expected a mapping, got {type(d).__name__}")
        check_names(cls.__name__, d, [s.name for s in cls.__settings__])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (enums as strings, sub-configs nested); ``from_dict(to_dict())``
        round-trips."""
        return {s.name: _plain(getattr(self, s.name)) for s in self.__settings__}


def _make_init(cls: type[Settings], table: tuple[Setting[Any, Any], ...]) -> Any:
    """``__init__`` of a settings class: every field validated, in declaration order."""
    positional = [s.name for s in table if not s.kw_only]

    def __init__(self: Settings, *args: Any, **kwargs: Any) -> None:
        given = dict(zip(positional, args, strict=False)) | kwargs
        for s in table:
            object.__setattr__(self, s.name, given.get(s.name, s.default))

    kind = inspect.Parameter
    params = [kind("self", kind.POSITIONAL_OR_KEYWORD)] + [
        kind(s.name, kind.KEYWORD_ONLY if s.kw_only else kind.POSITIONAL_OR_KEYWORD,
             default=s.default)
        for s in sorted(table, key=lambda s: s.kw_only)  # keyword-only ones last
    ]
    __init__.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__doc__ = f"Builds a validated {cls.__name__}; see the class's fields."
    return checked_init(__init__)


def settings_of(cls: type[Settings] | Settings) -> tuple[Setting[Any, Any], ...]:
    """The declared fields of a settings class (or of an instance's class), in order."""
    return cls.__settings__


def flag_settings(
    cls: type[Settings], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Setting[Any, Any], str]]:
    """(path, setting, --help group) for every field that has a flag, sub-configs walked
    in place (path: the sub-config fields leading to it, e.g. ``("io",)``)."""
    for s in cls.__settings__:
        if s.check.config is not None:
            yield from flag_settings(s.check.config, (*path, s.name))
        elif s.flag is not None:
            yield path, s, s.flag.group or cls.flag_group


def copy_to_core(cfg: Settings, target: object) -> None:
    """Sets each field that has a `core` attribute on `target` (a ``_core.StoreSettings``
    or ``_core.ThreadSettings``): the value through `to_core`, and into the core's enum
    member of the same name where the attribute holds one (``"lfru"`` ->
    ``_core.CachePolicy.lfru``, ``WaitPolicy.AUTO`` -> ``_core.WaitPolicy.AUTO``)."""
    for s in cfg.__settings__:
        if s.core is None:
            continue
        value = getattr(cfg, s.name)
        if s.to_core is not None:
            value = s.to_core(value)
        members = getattr(type(getattr(target, s.core)), "__members__", None)
        if members is not None:
            key = value.value if isinstance(value, Enum) else str(value)
            value = members[key] if key in members else members[key.upper()]
        setattr(target, s.core, value)
