"""Where query results go: format writers (`formats`, `csvwrite`) x commit models (`appended`, `parts`), and NetFlow (`netflow`).

`run`, `serve` and `collect` build their outputs here, so the same rows are the same bytes
whichever wrote them. Nothing heavy is imported at the package level.
"""
