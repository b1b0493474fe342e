"""Terminal rendering shared by the CLI's surfaces: tables that fold text and never elide a number."""

from gpulens.render.tables import FittedTable, fit_table, print_table

__all__ = ["FittedTable", "fit_table", "print_table"]
