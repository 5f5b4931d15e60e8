"""Frozen records: the classes `@dataclasses.dataclass(frozen=True)` makes, without compiling code at import.

A dataclass compiles its generated methods when its class is made (half a millisecond a class; `check` made thirty
before reading a file). `@record` makes the same class from methods shared by every record, which read the fields
from the class: nothing is compiled, and `dataclasses` is imported only when something asks for it.

Kept as with a dataclass: typed fields in order, defaults, `field(default=..., default_factory=..., compare=False,
repr=False)`, frozen instances, equality and hash, `order=True`, `__post_init__`, and `dataclasses.fields`,
`replace`, `asdict` and `is_dataclass`; type checkers see a frozen dataclass (`dataclass_transform`).
`@record(kw_only=True)` makes every field keyword-only. Not supported: `init=False`, `InitVar`, per-field `kw_only`,
`slots`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing import dataclass_transform
else:

    def dataclass_transform(**_: Any):
        return lambda function: function


T = TypeVar("T", bound=type)


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Field:
    """A field's options, as `field()` gives them in a class body."""

    __slots__ = ("default", "default_factory", "repr", "compare")

    def __init__(self, default: Any, default_factory: Any, repr: bool, compare: bool):
        self.default, self.default_factory, self.repr, self.compare = default, default_factory, repr, compare


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    repr: bool = True,
    compare: bool = True,
) -> Any:
    """A field's default (or the callable that makes it), and whether `repr` shows it and `==` and hash use it."""
    return Field(default, default_factory, repr, compare)


@overload
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: T, /) -> T: ...


@overload
def record(*, order: bool = False, kw_only: bool = False) -> Callable[[T], T]: ...


def record(cls: Any = None, /, *, order: bool = False, kw_only: bool = False) -> Any:
    """`@record`, `@record(order=True)` or `@record(kw_only=True)` on a class whose annotations are its fields."""
    if cls is None:
        return lambda made: _make(made, order, kw_only)
    return _make(cls, order, kw_only)


class _Spec:
    """What the shared methods read from a record's class: its fields in order and their options."""

    __slots__ = ("fields", "names", "defaults", "factories", "compared", "shown", "post_init", "kw_only")

    def __init__(self, fields: dict[str, tuple[Any, Field]], post_init: bool, kw_only: bool = False):
        self.fields = fields  # name: (annotation, options)
        self.names = tuple(fields)
        self.defaults = {n: f.default for n, (_, f) in fields.items() if f.default is not MISSING}
        self.factories = {n: f.default_factory for n, (_, f) in fields.items() if f.default_factory is not MISSING}
        self.compared = tuple(n for n, (_, f) in fields.items() if f.compare)
        self.shown = tuple(n for n, (_, f) in fields.items() if f.repr)
        self.post_init = post_init
        self.kw_only = kw_only


def _make(cls: Any, order: bool, kw_only: bool = False) -> Any:
    fields: dict[str, tuple[Any, Field]] = {}
    for base in reversed(cls.__mro__[1:]):
        if "_record" in base.__dict__:
            fields.update(base._record.fields)
    for name, kind in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(kind):
            continue
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            options = value
            if options.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, options.default)
        else:
            options = Field(value, MISSING, True, True)
        fields[name] = (kind, options)
    defaulted = False
    for name, (_, options) in fields.items():
        required = options.default is MISSING and options.default_factory is MISSING
        if required and defaulted and not kw_only:
            raise TypeError(f"{cls.__qualname__}: non-default field {name!r} follows a field with a default")
        defaulted = defaulted or not required
    cls._record = _Spec(fields, hasattr(cls, "__post_init__"), kw_only)
    cls.__dataclass_fields__ = _DataclassFields()
    setattr(cls, "__match_args__", tuple(fields))  # noqa: B010 (mypy: a class's own attribute)
    cls.__init__ = _init
    cls.__repr__ = _repr
    cls.__eq__ = _eq
    cls.__hash__ = _hash
    cls.__setattr__ = _setattr
    cls.__delattr__ = _delattr
    if order:
        cls.__lt__, cls.__le__, cls.__gt__, cls.__ge__ = _lt, _le, _gt, _ge
    return cls


def _is_classvar(kind: Any) -> bool:
    return (kind if isinstance(kind, str) else repr(kind)).startswith(("ClassVar", "typing.ClassVar"))


class _DataclassFields:
    """`__dataclass_fields__`, made from the record's fields when first read (dataclasses.fields, replace, asdict)."""

    def __get__(self, instance: Any, owner: Any) -> dict:
        import dataclasses

        made: dict[str, Any] = {}
        for name, (kind, options) in owner._record.fields.items():
            made[name] = dataclasses.field(
                default=options.default if options.default is not MISSING else dataclasses.MISSING,
                default_factory=(
                    options.default_factory if options.default_factory is not MISSING else dataclasses.MISSING
                ),
                repr=options.repr,
                compare=options.compare,
                kw_only=owner._record.kw_only,
            )
            made[name].name, made[name].type = name, kind
            made[name]._field_type = vars(dataclasses)["_FIELD"]
        type.__setattr__(owner, "__dataclass_fields__", made)
        return made


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = type(self)._record
    names = spec.names
    if spec.kw_only and args:
        raise TypeError(f"{type(self).__qualname__}() takes keyword arguments only ({len(args)} positional given)")
    if len(args) > len(names):
        raise TypeError(f"{type(self).__qualname__}() takes {len(names)} arguments but {len(args)} were given")
    values = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in spec.fields:
            raise TypeError(f"{type(self).__qualname__}() got an unexpected keyword argument {name!r}")
        if name in values:
            raise TypeError(f"{type(self).__qualname__}() got multiple values for argument {name!r}")
        values[name] = value
    own = self.__dict__
    for name in names:
        if name in values:
            own[name] = values[name]
        elif name in spec.defaults:
            own[name] = spec.defaults[name]
        elif name in spec.factories:
            own[name] = spec.factories[name]()
        else:
            raise TypeError(f"{type(self).__qualname__}() missing required argument {name!r}")
    if spec.post_init:
        self.__post_init__()


def _key(self: Any) -> tuple:
    own = self.__dict__
    return tuple(own[name] for name in type(self)._record.compared)


def _repr(self: Any) -> str:
    own = self.__dict__
    shown = ", ".join(f"{name}={own[name]!r}" for name in type(self)._record.shown)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _key(self) == _key(other)


def _hash(self: Any) -> int:
    return hash(_key(self))


def _setattr(self: Any, name: str, value: Any) -> None:
    import dataclasses

    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    import dataclasses

    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _ordering(compare: Callable[[tuple, tuple], bool]) -> Callable[[Any, Any], Any]:
    """One of `order=True`'s methods: `compare` over the compared fields of two records of one class."""
    return lambda self, other: compare(_key(self), _key(other)) if other.__class__ is self.__class__ else NotImplemented


_lt, _le, _gt, _ge = (_ordering(compare) for compare in (operator.lt, operator.le, operator.gt, operator.ge))
