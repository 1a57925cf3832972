import pytest

pytest.register_assert_rewrite("tests.publishing.outbox_pipeline")
