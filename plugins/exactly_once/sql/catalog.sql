-- Statements of plugins/exactly_once/catalog.py, by name.

-- name: column_types
-- Each column of a table with what its type lets in. A domain is followed down to its base
-- type, keeping the first type modifier found on the way (a domain's column has none: the
-- modifier is the domain's) and its NOT NULL; a domain's CHECK constraints are not seen.
-- atttypmod holds varchar(n)/char(n) as n + 4 and numeric(p, s) as ((p << 16) | s) + 4, where
-- PostgreSQL 15's scale is 11 bits, signed (-1000..1000); -1 means no modifier.
WITH RECURSIVE typed AS (
    SELECT a.attnum, a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS shown,
           a.atttypid AS type_id, a.atttypmod AS typmod, a.attnotnull AS not_null
    FROM pg_attribute a
    WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
    SELECT c.attnum, c.name, c.shown, t.typbasetype,
           CASE WHEN c.typmod = -1 THEN t.typtypmod ELSE c.typmod END, c.not_null OR t.typnotnull
    FROM typed c
    JOIN pg_type t ON t.oid = c.type_id AND t.typtype = 'd'
)
SELECT c.name, c.shown, t.typname::text,
       CASE WHEN t.typname IN ('varchar', 'bpchar') AND c.typmod >= 4 THEN c.typmod - 4 END,
       CASE WHEN t.typname = 'numeric' AND c.typmod >= 4 THEN ((c.typmod - 4) >> 16) & 65535 END,
       CASE WHEN t.typname = 'numeric' AND c.typmod >= 4 THEN (((c.typmod - 4) & 2047) # 1024) - 1024 END,
       c.not_null
FROM typed c
JOIN pg_type t ON t.oid = c.type_id AND t.typtype <> 'd'
ORDER BY c.attnum;
