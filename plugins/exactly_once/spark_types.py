"""Spark SQL data type strings of a pipeline's configuration, checked before they reach a
schema: `parse` accepts exactly one data type and nothing after it, so `"int, x string"`
(which Spark would read as a second field) is refused instead of adding a column.

Accepted, case-insensitive, with any whitespace between tokens:

- boolean, tinyint/byte, smallint/short, int/integer, bigint/long, float/real, double,
  date, timestamp, timestamp_ntz, timestamp_ltz, string, binary
- decimal/dec/numeric, optionally (p) or (p, s) with 1 <= p <= 38 and 0 <= s <= p
- array<T>, map<K, V>, struct<name: T, ...> (the colon optional, at least one field,
  names unique, `back-quoted` names allowed)

A subset of what Spark's parser takes: intervals, variant, void, collations and struct
fields' NOT NULL/COMMENT are refused, and so are char(n)/varchar(n): Spark parses them but
its readers refuse them (UNSUPPORTED_CHAR_OR_VARCHAR_AS_STRING), so a job would fail on
them after the configuration loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_DECIMAL_PRECISION = 38

# Spark's names (and synonyms) of the simple types -> the canonical name.
SIMPLE = {
    "boolean": "boolean",
    "tinyint": "tinyint", "byte": "tinyint",
    "smallint": "smallint", "short": "smallint",
    "int": "int", "integer": "int",
    "bigint": "bigint", "long": "bigint",
    "float": "float", "real": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp", "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "string": "string",
    "binary": "binary",
}
DECIMAL = ("decimal", "dec", "numeric")
LENGTHED = ("char", "varchar")  # parsed by Spark, refused by its readers
NESTED = ("array", "map", "struct")

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9]+)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<punct>[<>(),:])
""", re.VERBOSE)


@dataclass(frozen=True)
class SparkType:
    """A parsed data type; `str()` is its canonical DDL."""
    name: str                                           # canonical: 'int', 'decimal', 'array', ...
    parameters: tuple[int, ...] = ()                    # decimal: (precision, scale)
    elements: tuple[SparkType, ...] = ()                # array: (element,); map: (key, value)
    fields: tuple[tuple[str, SparkType], ...] = ()      # struct

    def __str__(self) -> str:
        if self.name == "struct":
            return "struct<" + ", ".join(f"`{n.replace('`', '``')}`: {t}" for n, t in self.fields) + ">"
        if self.elements:
            return f"{self.name}<{', '.join(map(str, self.elements))}>"
        if self.parameters:
            return f"{self.name}({','.join(map(str, self.parameters))})"
        return self.name


@dataclass(frozen=True)
class _Token:
    kind: str       # word | number | quoted | punct | end
    text: str
    position: int

    def shown(self) -> str:
        return "the end" if self.kind == "end" else repr(self.text)


def parse(text: str) -> SparkType:
    """The one data type `text` spells, or ValueError saying what is wrong at which
    position (0-based) of it."""
    if not isinstance(text, str):
        raise ValueError(f"a Spark SQL type must be a string, got {type(text).__name__}")
    parser = _Parser(text)
    parsed = parser.data_type()
    parser.expect_end()
    return parsed


def check(text: str) -> str:
    """`text` itself once it parses (for validators that keep the value as written)."""
    parse(text)
    return text


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.lexer = self._tokens(text)  # lazily: the first error in reading order is the one reported
        self.next: _Token | None = None

    def _tokens(self, text: str):
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                raise self.error(position, f"unexpected character {text[position]!r}")
            if match.lastgroup != "space":
                yield _Token(match.lastgroup, match.group(), position)
            position = match.end()
        yield _Token("end", "", len(text))

    def error(self, position: int, problem: str, hint: str = "") -> ValueError:
        return ValueError(f"{problem} at position {position} of {self.text!r}{hint}")

    def peek(self) -> _Token:
        if self.next is None:
            self.next = next(self.lexer)
        return self.next

    def take(self) -> _Token:
        token = self.peek()
        if token.kind != "end":
            self.next = None
        return token

    def punct(self, char: str) -> bool:
        """Takes the punctuation `char` if it is next."""
        token = self.peek()
        if token.kind == "punct" and token.text == char:
            self.take()
            return True
        return False

    def expect(self, char: str, after: str) -> None:
        if not self.punct(char):
            token = self.peek()
            raise self.error(token.position, f"expected {char!r} {after}, found {token.shown()}")

    def expect_end(self) -> None:
        token = self.peek()
        if token.kind != "end":
            hint = "; one data type only (a column per entry of the schema)" if token.text == "," else ""
            raise self.error(token.position, f"expected the end of the type, found {token.shown()}", hint)

    def number(self, what: str, low: int, high: int) -> int:
        token = self.take()
        if token.kind != "number":
            raise self.error(token.position, f"expected {what}, found {token.shown()}")
        value = int(token.text)
        if not low <= value <= high:
            raise self.error(token.position, f"{what} {value} is out of range {low}..{high}")
        return value

    def data_type(self) -> SparkType:
        token = self.take()
        if token.kind != "word":
            raise self.error(token.position, f"expected a data type, found {token.shown()}")
        word = token.text.lower()
        if word in SIMPLE:
            return SparkType(SIMPLE[word])
        if word in DECIMAL:
            return self.decimal()
        if word in LENGTHED:
            raise self.error(token.position, f"{word} cannot be read by Spark's readers; use string")
        if word in NESTED:
            self.expect("<", f"after {word}")
            nested = getattr(self, word)()
            self.expect(">", f"closing {word}<")
            return nested
        raise self.error(token.position, f"unknown data type {token.text!r}")

    def decimal(self) -> SparkType:
        precision, scale = 10, 0
        if self.punct("("):
            precision = self.number("decimal precision", 1, MAX_DECIMAL_PRECISION)
            if self.punct(","):
                scale = self.number("decimal scale", 0, precision)
            self.expect(")", "after the decimal's precision and scale")
        return SparkType("decimal", (precision, scale))

    def array(self) -> SparkType:
        return SparkType("array", elements=(self.data_type(),))

    def map(self) -> SparkType:
        key = self.data_type()
        self.expect(",", "between the map's key and value types")
        return SparkType("map", elements=(key, self.data_type()))

    def struct(self) -> SparkType:
        fields: list[tuple[str, SparkType]] = []
        seen: set[str] = set()
        while True:
            token = self.take()
            if token.kind == "word":
                name = token.text
            elif token.kind == "quoted" and len(token.text) > 2:
                name = token.text[1:-1].replace("``", "`")
            else:
                raise self.error(token.position, f"expected a struct field name, found {token.shown()}")
            if name.lower() in seen:
                raise self.error(token.position, f"struct field {name!r} repeated")
            seen.add(name.lower())
            self.punct(":")
            fields.append((name, self.data_type()))
            if not self.punct(","):
                return SparkType("struct", fields=tuple(fields))
