"""Errors of the GSQL front end: a message tied to a place in a query file, shown with its source line.

`QueryError` is what the lexer, the parser and the analyser raise for anything wrong in a query.
Its text is `path:line:col: message`, then the offending source line, then a `^` marker under
the offending token. When the parser recovers from an error (it skips to the next `;` and
carries on with the next query) several errors are reported together: one `QueryError` whose
`errors` lists them and whose text prints them one after the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from common.errors import OopscopeError

if TYPE_CHECKING:
    from queries.expressions import Node

#: shown in place of a path when the query text did not come from a file
NO_PATH = "<query>"
#: longest source line shown whole under a message; longer ones are cut around the column
SNIPPET_WIDTH = 100


class QueryError(OopscopeError):
    """A query is wrong at a known place (line and column are 1-based; None when unknown).

    Attributes: `message`, `path`, `line`, `column` (also `col`), `source` (the whole query
    text, used to show the line), `length` (width of the marker) and `errors` (the individual
    errors when several are reported together; empty for a single error).
    """

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 column: int | None = None, source: str | None = None, length: int = 1,
                 errors: Iterable[QueryError] = ()):
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        self.column = column
        self.source = source
        self.length = max(1, int(length))
        self.errors: list[QueryError] = list(errors)
        super().__init__(self._render())

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def at(cls, node: Node | None, message: str, source: str | None = None,
           path: str | None = None) -> QueryError:
        """An error located at a syntax-tree node's position (for the analyser's semantic errors)."""
        pos = getattr(node, "pos", None)
        if pos is None:
            return cls(message, path=path, source=source)
        return cls(message, path=path, line=pos.line, column=pos.col, source=source)

    @classmethod
    def collect(cls, errors: Iterable[QueryError]) -> QueryError:
        """One error standing for `errors` (itself when there is exactly one)."""
        flat: list[QueryError] = []
        for e in errors:
            flat.extend(e.errors or [e])
        if not flat:
            raise ValueError("QueryError.collect needs at least one error")
        if len(flat) == 1:
            return flat[0]
        first = flat[0]
        return cls(first.message, path=first.path, line=first.line, column=first.column,
                   source=first.source, length=first.length, errors=flat)

    # --- presentation ------------------------------------------------------------------------
    @property
    def col(self) -> int | None:
        return self.column

    @property
    def all(self) -> list[QueryError]:
        """The individual errors (just this one when it is not a collection)."""
        return self.errors or [self]

    def location(self) -> str:
        where = self.path or NO_PATH
        if self.line is None:
            return where
        if self.column is None:
            return f"{where}:{self.line}"
        return f"{where}:{self.line}:{self.column}"

    def _render(self) -> str:
        if self.errors:
            parts = [e._render() for e in self.errors]
            return f"{len(self.errors)} errors:\n" + "\n".join(parts)
        head = f"{self.location()}: {self.message}"
        snippet = self._snippet()
        return head if snippet is None else f"{head}\n{snippet}"

    def _snippet(self) -> str | None:
        if self.source is None or self.line is None:
            return None
        # split on "\n" only: the lexer counts lines the same way
        lines = self.source.split("\n")
        if not 1 <= self.line <= len(lines):
            return None
        text = lines[self.line - 1].rstrip("\r")
        if self.column is None:
            return f"  {text}"
        col = min(max(self.column, 1), len(text) + 1)
        if len(text) > SNIPPET_WIDTH:
            # a long line: show a window around the column, marked with ... where cut
            start = max(0, min(col - 1 - SNIPPET_WIDTH // 2, len(text) - SNIPPET_WIDTH))
            end = start + SNIPPET_WIDTH
            head, tail = ("..." if start > 0 else ""), ("..." if end < len(text) else "")
            text = head + text[start:end] + tail
            col = col - start + len(head)
        # keep tabs in the indentation so the marker lines up under the token
        indent = "".join("\t" if ch == "\t" else " " for ch in text[:col - 1])
        width = min(self.length, max(1, len(text) - col + 1))
        return f"  {text}\n  {indent}{'^' * width}"

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self):
        return (_rebuild, (self.message, self.path, self.line, self.column, self.source,
                           self.length, self.errors))


def _rebuild(message, path, line, column, source, length, errors) -> QueryError:
    return QueryError(message, path, line, column, source, length, errors)


class SchemaError(QueryError):
    """A schema file (GS-lite's `packet_schema.txt` format, `queries.schemafile`) is wrong at
    a known place: its text is `file:line:col: message`, then the line and a marker."""

    def __reduce__(self):
        # keep the subclass across processes (QueryError's own rebuilds a QueryError)
        return (SchemaError, (self.message, self.path, self.line, self.column, self.source,
                              self.length, self.errors))
