"""The tables people read (`toolbus audit`, `history`): columns two spaces apart, each as wide as
its widest cell and its header + 2, control characters shown, never acted on."""

from __future__ import annotations

from toolbus.adapters.report import table


def test_columns_are_as_wide_as_their_widest_cell_and_header_plus_two() -> None:
    text = table(["ID", "WHAT", "MS"], [["1", "a long cell", "3.5"], ["22", "b", "10.25"]], frozenset({2}))
    assert text.splitlines() == [
        "ID    WHAT            MS",
        "1     a long cell    3.5",
        "22    b            10.25",
    ]


def test_a_table_without_rows_is_its_header_and_a_cell_cannot_break_a_line() -> None:
    assert table(["ID", "WHAT"], []) == "ID    WHAT"
    assert table(["A"], [["line\nbreak\x1b[2J"]]).splitlines() == ["A", "line\\nbreak\\x1b[2J"]
