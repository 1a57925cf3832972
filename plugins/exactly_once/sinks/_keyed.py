"""What the keyed modes (upsert, aggregate) share: one final row per key, merged from each
checkpoint's rows folded per key, and each checkpoint's folded rows kept as its
contribution (sql/merge/keyed.sql), so a reprocessing recomputes exactly the keys it
touches from every checkpoint's latest contribution. An upsert sink's tombstones are kept
among its contributions, marked (sinks/upsert.py)."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg2 import sql

from exactly_once.sinks import SinkTables, each, names
from exactly_once.sqlfiles import named

STAGED = sql.SQL("checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s")


class Keyed:
    """A mode supplies `folded` (its fold of some rows per key) and `merge` (how a fold
    merges into the final table); an upsert sink also `marks` its rows as tombstones or not,
    and says which folded rows a recompute puts in (`live`) and which keys it deletes for
    their tombstones (`tombstoned`)."""

    def folded(self, sink, source: sql.Identifier, where: sql.Composable, columns: Sequence[str]) -> sql.Composed:
        raise NotImplementedError

    def merge(self, sink, tables: SinkTables, folded: sql.Composed) -> sql.Composed:
        raise NotImplementedError

    def marks(self, sink) -> list[str]:
        """Columns of the staging and contributions tables, not the final table's, that the
        folds carry (after the final table's columns) and the contributions keep."""
        return []

    def live(self, sink, folded: sql.Composed, columns: Sequence[str]) -> sql.Composable:
        """What of a fold of contributions a recompute puts into the final table (`columns`)."""
        return folded

    def widened(self, sink, tables: SinkTables) -> sql.Composable:
        """A statement (with its `;`) of a recompute that adds keys to those it recomputes, or nothing."""
        return sql.SQL("")

    def tombstoned(self, sink, tables: SinkTables) -> sql.Composable:
        """A statement (with its `;`) of a recompute, before it deletes the keys that no
        contribution holds any more, or nothing."""
        return sql.SQL("")

    def unique_columns(self, sink) -> frozenset[str]:
        return frozenset(sink.keys)

    def promote(self, sink, tables: SinkTables) -> sql.Composed:
        staged = self.folded(sink, tables.staging, STAGED, [*tables.columns, *self.marks(sink)])
        return sql.SQL(";\n").join([self.merge(sink, tables, staged), self._statement("keep", sink, tables, staged)])

    def replace(self, sink, tables: SinkTables) -> tuple[sql.Composed, sql.Composed]:
        keys, folded_columns = names(sink.keys), [*tables.columns, *self.marks(sink)]
        touched = sql.SQL("({keys}) IN (SELECT {keys} FROM affected_keys)").format(keys=keys)
        put = sql.SQL(";\n").join([
            self._statement("keep", sink, tables, self.folded(sink, tables.staging, STAGED, folded_columns)),
            self._statement("recompute", sink, tables, self.folded(sink, tables.contributions, touched,
                                                                   folded_columns))])
        return self._statement("forget", sink, tables, sql.SQL("")), put

    def fold(self, sink, tables: SinkTables) -> sql.Composed:
        """Retention's fold of the contributions of checkpoints %(folded)s into the base
        checkpoint's (%(base)s): one per key, what a recompute would make of them."""
        missing = set(sink.keys) - set(tables.columns)
        if missing:  # a fold without them would match every key (sql/merge/keyed.sql)
            raise ValueError(f"sink {sink.name!r}: its final table {sink.table} lacks its key column(s) "
                             f"{sorted(missing)}")
        picked = self._statement("picked", sink, tables, sql.SQL(""))
        return self._statement("fold", sink, tables, self.folded(sink, picked, sql.SQL("true"),
                                                                 [*tables.columns, *self.marks(sink)]))

    def _statement(self, name: str, sink, tables: SinkTables, folded: sql.Composable) -> sql.Composed:
        columns = self.contribution_columns(sink, tables.columns)
        return sql.SQL(named("merge/keyed.sql")[name]).format(
            final=tables.final, contributions=tables.contributions, folded=folded, keys=names(sink.keys),
            columns=names(columns), kept=names([*columns, *self.marks(sink)]),
            live=self.live(sink, folded, columns), widened=self.widened(sink, tables),
            tombstoned=self.tombstoned(sink, tables), take_new=each("{c} = EXCLUDED.{c}", [c for c in columns
                                                                                           if c not in sink.keys]),
            same_keys=sql.SQL(" AND ").join(sql.SQL("c.{k} = f.{k}").format(k=sql.Identifier(k)) for k in sink.keys))
