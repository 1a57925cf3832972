"""Spark SQL type strings: exactly one data type, or a ValueError saying what and where."""

import pytest

from exactly_once.spark_types import parse

# type as written -> canonical DDL
ACCEPTED = {
    "int": "int",
    "INT": "int",
    "  bigint\t": "bigint",
    "Integer": "int",
    "long": "bigint",
    "byte": "tinyint",
    "tinyint": "tinyint",
    "short": "smallint",
    "smallint": "smallint",
    "real": "float",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "TIMESTAMP_NTZ": "timestamp_ntz",
    "string": "string",
    "binary": "binary",
    "decimal": "decimal(10,0)",
    "decimal(12,2)": "decimal(12,2)",
    "DECIMAL ( 38 , 38 )": "decimal(38,38)",
    "dec(5)": "decimal(5,0)",
    "numeric(1, 0)": "decimal(1,0)",
    "array<int>": "array<int>",
    "array<array<string>>": "array<array<string>>",
    "Array < Array < Long > >": "array<array<bigint>>",
    "map<string,int>": "map<string, int>",
    "map<string, array<struct<a: int>>>": "map<string, array<struct<`a`: int>>>",
    "struct<a: int, b string>": "struct<`a`: int, `b`: string>",
    "struct<a:int,b:map<string,decimal(10,2)>>": "struct<`a`: int, `b`: map<string, decimal(10,2)>>",
    "STRUCT<A INT>": "struct<`A`: int>",
    "struct<`a b`: int, `x``y`: string>": "struct<`a b`: int, `x``y`: string>",
    "struct<int: int, map map<int,int>>": "struct<`int`: int, `map`: map<int, int>>",
}

# type as written -> (what the error says, at which position). Spark refuses each of
# them too, or reads it as more than one field (test_spark_agrees below).
REJECTED = {
    "int, x string": ("expected the end of the type, found ','", 3),
    "string,qty int": ("expected the end of the type, found ','", 6),
    "int x": ("expected the end of the type, found 'x'", 4),
    "decimal(40,2)": ("decimal precision 40 is out of range 1..38", 8),
    "decimal(10,11)": ("decimal scale 11 is out of range 0..10", 11),
    "decimal(10,-2)": ("unexpected character '-'", 11),
    "decimal(10,2,1)": ("expected ')' after the decimal's precision and scale, found ','", 12),
    "decimal(10": ("expected ')' after the decimal's precision and scale, found the end", 10),
    "array<int": ("expected '>' closing array<, found the end", 9),
    "array<int>>": ("expected the end of the type, found '>'", 10),
    "array<>": ("expected a data type, found '>'", 6),
    "array": ("expected '<' after array, found the end", 5),
    "struct<a int,>": ("expected a struct field name, found '>'", 13),
    "struct<a int b string>": ("expected '>' closing struct<, found 'b'", 13),
    "struct<a>": ("expected a data type, found '>'", 8),
    "map<string>": ("expected ',' between the map's key and value types, found '>'", 10),
    "map<string,int,int>": ("expected '>' closing map<, found ','", 14),
    "varchar": ("varchar cannot be read by Spark's readers; use string", 0),
    "integer(5)": ("expected the end of the type, found '('", 7),
    "text": ("unknown data type 'text'", 0),
    "`int`": ("expected a data type, found '`int`'", 0),
    "int;": ("unexpected character ';'", 3),
    "": ("expected a data type, found the end", 0),
    "   ": ("expected a data type, found the end", 3),
}

# Spark takes these; the library does not, on purpose (not types a record value needs,
# or struct field details a JSON schema has no use for).
STRICTER = {
    "interval day": ("unknown data type 'interval'", 0),
    "varchar(10)": ("varchar cannot be read by Spark's readers; use string", 0),
    "char(3)": ("char cannot be read by Spark's readers; use string", 0),
    "void": ("unknown data type 'void'", 0),
    "variant": ("unknown data type 'variant'", 0),
    "struct<>": ("expected a struct field name, found '>'", 7),
    "struct<a: int NOT NULL>": ("expected '>' closing struct<, found 'NOT'", 14),
    "struct<a: int COMMENT 'x'>": ("expected '>' closing struct<, found 'COMMENT'", 14),
    "struct<a: int, A: string>": ("struct field 'A' repeated", 15),
    "string collate utf8_lcase": ("expected the end of the type, found 'collate'", 7),
    "decimal(0)": ("decimal precision 0 is out of range 1..38", 8),
    "int -- a comment": ("unexpected character '-'", 4),
}


@pytest.mark.parametrize(("text", "canonical"), ACCEPTED.items())
def test_accepted(text, canonical):
    assert str(parse(text)) == canonical


@pytest.mark.parametrize(("text", "error"), [*REJECTED.items(), *STRICTER.items()])
def test_rejected_saying_what_and_where(text, error):
    problem, position = error
    with pytest.raises(ValueError) as refused:
        parse(text)
    assert str(refused.value).startswith(f"{problem} at position {position} of {text!r}")


def test_not_a_string():
    with pytest.raises(ValueError, match="must be a string, got int"):
        parse(3)


def test_spark_agrees(spark):
    """Spark's own DDL parser (the one behind createDataFrame's and from_json's schema
    strings) reads every accepted type as one field, of the same type as its canonical DDL;
    every rejected one it refuses, or reads as more than one field. The STRICTER ones it
    takes: the library refuses them on purpose."""
    from pyspark.sql.types import DataType

    def spark_reads(text):
        try:
            fields = DataType.fromDDL(f"c {text}").fields
        except Exception as error:  # a parse error from the JVM
            return f"refused: {str(error).splitlines()[0]}"
        return fields[0].dataType if len(fields) == 1 else f"{len(fields)} fields"

    wrong = {}
    for text, canonical in ACCEPTED.items():
        read, canonical_read = spark_reads(text), spark_reads(canonical)
        if not isinstance(read, DataType) or read != canonical_read:
            wrong[text] = (read, canonical_read)
    for text in REJECTED:
        if isinstance(spark_reads(text), DataType):
            wrong[text] = spark_reads(text)
    for text in STRICTER:
        if not isinstance(spark_reads(text), DataType):
            wrong[text] = spark_reads(text)
    assert not wrong
