"""What isolation reads of a Spark Connect failure: the COPY staging writer's refusal, in either
of its formats, gives the row's SQLSTATE and PostgreSQL's message; other text gives none."""

from __future__ import annotations

import pytest

from exactly_once.connect_errors import copy_refusal


@pytest.mark.parametrize("copy", ["COPY", "binary COPY"])
def test_a_copy_refusal_gives_its_sqlstate_and_message_in_either_format(copy):
    message = (f"Job aborted due to stage failure: ... java.io.IOException: PostgreSQL refused {copy} into "
               '"exactly_once"."stg1_orders" (SQLSTATE 23514): new row violates check constraint "n_check"\n\tat …')
    assert copy_refusal(message) == ("23514", 'new row violates check constraint "n_check"')


def test_other_failures_give_no_refusal():
    assert copy_refusal("PostgreSQL refused the connection (SQLSTATE 28P01)") is None
    assert copy_refusal("PostgreSQL refused text COPY into t (SQLSTATE 23514): no") is None
