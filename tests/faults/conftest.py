"""Prints the fault matrix's table after the test session."""

from tests.faults.matrix import render
from tests.faults.test_fault_matrix import ROWS


def pytest_terminal_summary(terminalreporter):
    if ROWS:
        terminalreporter.write_sep("-", "fault matrix")
        terminalreporter.write_line(render(ROWS))
