"""Dotted keys over a tree of pydantic sections: how ``section.field=value`` overrides, YAML files
and ``--section.field value`` flags reach a config model, and how its errors become one line
naming the key. Every function takes the tree's root model, so this module knows no config.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from hgpo_env.textenv.arguments import read_value, read_yaml


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key, wrong type, or an impossible value."""


class Section(BaseModel):
    """A config section: unknown keys refused, each field's docstring its help line."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def _split_commas(value: Any) -> Any:
    """``a,b`` on the command line is the list ``[a, b]``."""
    return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value


CommaList = Annotated[list[str], BeforeValidator(_split_commas)]


def dotted_flags_as_overrides(argv: list[str], root: type[BaseModel]) -> list[str]:
    """``--section.field value`` and ``--section.field=value`` as ``section.field=value``, as
    OpenRLHF and SkyRL users type keys; a flag with no value after it is ``true``."""
    sections = frozenset(root.model_fields)
    out: list[str] = []
    tokens = iter(range(len(argv)))
    for i in tokens:
        token = argv[i]
        key, sep, value = token[2:].partition("=")
        if not (token.startswith("--") and key.split(".")[0] in sections and "." in key):
            out.append(token)
            continue
        if not sep:
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is None or (following.startswith("--") and not _is_number(following)):
                value = "true"
            else:
                value = following
                next(tokens)
        out.append(f"{key}={value}")
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_override(text: str, root: type[BaseModel]) -> tuple[str, Any]:
    """``section.field=value`` -> (key, value); the value is read by :func:`read_value`, except
    that a text field keeps the text as typed (``model.name_or_path=123``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    if field_at(root, key) is str:
        return key, raw
    try:
        return key, read_value(raw)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def field_at(root: type[BaseModel], key: str) -> Any:
    """The annotation at dotted ``key`` (a dict field takes any sub-key); unknown keys and
    sections set as values raise :class:`ConfigError`."""
    model: Any = root
    parts = key.split(".")
    for depth, part in enumerate(parts):
        fields = _fields(model)
        if part not in fields:
            raise _unknown(".".join(parts[: depth + 1]), sorted(fields))
        model = fields[part]
        if _is_section(model):
            continue
        if depth < len(parts) - 1 and getattr(model, "__origin__", None) is not dict:
            raise ConfigError(f"{'.'.join(parts[: depth + 1])} is a value, not a section")
        return model
    raise ConfigError(
        f"{key} is a section; set one of its fields, e.g. {key}.{next(iter(_fields(model)))}=..."
    )


def _fields(model: Any) -> dict[str, Any]:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return {name: info.annotation for name, info in model.model_fields.items()}
    return typing.get_type_hints(model)  # a dataclass's annotations may be strings


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or hasattr(annotation, "__dataclass_fields__")
    )


def _unknown(key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
    return ConfigError(f"unknown config key {key!r}{hint}")


def one_line(error: ValidationError, root: type[BaseModel]) -> ConfigError:
    """pydantic's first complaint as one line that names the key."""
    first = error.errors(include_url=False)[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        parent: Any = root
        for part in first["loc"][:-1]:
            parent = _fields(parent)[part]
        return _unknown(key, sorted(_fields(parent)))
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "value_error":  # a check of ours: its message names the keys
        return ConfigError(f"{key}: {message}" if key else message)
    return ConfigError(f"{key}: {message[0].lower()}{message[1:]} (got {first['input']!r})")


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict."""
    node = tree
    *sections, name = key.split(".")
    for part in sections:
        node = node.setdefault(part, {})
    node[name] = value


def flatten_dotted(tree: Mapping[str, Any], depth: int | None = None, prefix: str = "") -> dict[str, Any]:
    """The tree's values by dotted key (``advantage.crbc.depth``), as :func:`set_dotted` names
    them; ``depth`` levels of mappings are opened (None: all), deeper ones stay whole values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and (depth is None or depth > 0):
            flat.update(flatten_dotted(value, None if depth is None else depth - 1, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The nested sections of a YAML run config; errors are one line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = read_yaml(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return tree


def describe_options(root: type[BaseModel]) -> str:
    """Every config key with its type, default and help line (its docstring), for ``--help``."""
    schema, defaults = root.model_json_schema(), root()
    lines = []
    for section, reference in schema["properties"].items():
        definition = schema["$defs"][reference["$ref"].rsplit("/", 1)[-1]]
        lines.append(f"{section}:  {definition.get('description', '').strip().splitlines()[0]}")
        for name, field in definition["properties"].items():
            default = getattr(getattr(defaults, section), name)
            doc = " ".join(field.get("description", "").split())
            lines.append(
                f"  {section}.{name} ({_type_name(field)}, default {default!r})" + (f": {doc}" if doc else "")
            )
    return "\n".join(lines)


def _type_name(field: Mapping[str, Any]) -> str:
    """A field's JSON-schema type as a short word (``integer``, ``grpo|gigpo``, ``number|null``)."""
    if "enum" in field:
        return "|".join(map(str, field["enum"]))
    if "const" in field:
        return str(field["const"])
    if "anyOf" in field:
        return "|".join(_type_name(option) for option in field["anyOf"])
    if field.get("type") == "array":
        return f"list[{_type_name(field.get('items', {}))}]"
    return field.get("type", "any")
