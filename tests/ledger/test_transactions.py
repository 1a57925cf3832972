"""The ledger's transactions (exactly_once.ledger.transactions) on the real pipeline database:
while kept, a transaction takes the connection an earlier one left idle; one inside another
gets its own; one that raises is rolled back and its connection closed; an idle one the
server closed is replaced; every connection is closed once no longer kept."""

from __future__ import annotations

from contextlib import closing

import psycopg2
import pytest

from exactly_once.ledger.transactions import Transactions


@pytest.fixture
def opened(ledger_db):
    connections = []

    def connect():
        connections.append(psycopg2.connect(ledger_db))
        return connections[-1]

    return connections, Transactions(connect)


def _pid(cur) -> int:
    cur.execute("SELECT pg_backend_pid()")
    return cur.fetchone()[0]


def test_kept_transactions_share_a_connection_and_close_it_after(opened):
    connections, transactions = opened
    with transactions.kept():
        with transactions.transaction() as cur:
            first = _pid(cur)
            cur.execute("CREATE TEMP TABLE kept_probe (n int) ON COMMIT DROP")
        with transactions.transaction() as cur:
            assert _pid(cur) == first
            cur.execute("SELECT pg_catalog.to_regclass('pg_temp.kept_probe')")
            assert cur.fetchone()[0] is None  # a transaction of its own: the first one committed
            assert cur.connection.status == psycopg2.extensions.STATUS_IN_TRANSACTION
        with transactions.kept():  # nested: the outer block keeps them
            with transactions.transaction() as cur:
                assert _pid(cur) == first
        assert len(connections) == 1 and not connections[0].closed
    assert connections[0].closed


def test_a_transaction_inside_another_has_a_connection_of_its_own(opened, ledger_db):
    connections, transactions = opened
    with transactions.kept():
        with transactions.transaction() as outer:
            outer.execute("CREATE TABLE public.transactions_probe (n int)")
            with transactions.transaction() as inner:
                assert _pid(inner) != _pid(outer)
                inner.execute("SELECT pg_catalog.to_regclass('public.transactions_probe')")
                assert inner.fetchone()[0] is None  # the outer transaction has not committed
            outer.execute("DROP TABLE public.transactions_probe")
        assert len(connections) == 2
        with transactions.transaction() as cur, transactions.transaction() as other:
            assert {_pid(cur), _pid(other)} == {c.get_backend_pid() for c in connections}  # both reused
    assert all(c.closed for c in connections)


def test_a_transaction_that_raises_is_rolled_back_and_its_connection_not_reused(opened, ledger_db):
    connections, transactions = opened
    with transactions.kept():
        with pytest.raises(psycopg2.errors.UndefinedTable):
            with transactions.transaction() as cur:
                cur.execute("CREATE TABLE public.transactions_raised (n int)")
                cur.execute("SELECT * FROM public.no_such_table_here")
        assert connections[0].closed
        with transactions.transaction() as cur:
            cur.execute("SELECT pg_catalog.to_regclass('public.transactions_raised')")
            assert cur.fetchone()[0] is None
        assert len(connections) == 2


def test_an_idle_connection_the_server_closed_is_replaced_by_a_new_one(opened, ledger_db):
    connections, transactions = opened
    with transactions.kept():
        with transactions.transaction() as cur:
            first = _pid(cur)
        with closing(psycopg2.connect(ledger_db)) as other, other, other.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s, 10000)", (first,))  # waits until it is gone
            assert cur.fetchone()[0] is True
        with transactions.transaction() as cur:
            assert _pid(cur) != first
        assert connections[0].closed and len(connections) == 2


def test_without_keeping_each_transaction_has_a_connection_closed_after_it(opened):
    connections, transactions = opened
    for _ in range(2):
        with transactions.transaction() as cur:
            _pid(cur)
    assert len(connections) == 2 and all(c.closed for c in connections)
