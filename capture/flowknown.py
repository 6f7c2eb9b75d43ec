"""The sets an exporter sends again unchanged, that reading again would not change anything.

Exporters resend their template sets, options template sets and options data every few
datagrams (oopscope's exporter and softflowd: 1 in 2 to 64; a router: every few seconds).
The decoder reads such a set in Python the first time; once it has been read whole, its bytes
are kept here with what it defined: the templates (or withdrawals) of a template set, the
options template and the option values of an options data set. While the template cache
still holds all of that, a byte-equal copy from the same (exporter, observation domain, set
id) would change nothing when read: the decoder's Python path skips a known template set,
and the datagram walk (`capture.flowkernels.walk_datagrams`) steps over any known set, so a
datagram carrying a refresh stays on the kernel's path rather than stopping it. A set whose
definitions the cache no longer holds (a template redefined, an option changed by another
set) is read again, and known again as it is then.

The sets kept are bounded (`LIMIT`, all forgotten past it) against an exporter spoofing
addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capture.flowtemplates import Template, TemplateCache

#: sets kept at most (past it every one is forgotten, to be read again)
LIMIT = 4096


@dataclass(frozen=True)
class _Known:
    exporter: str
    body: bytes
    #: a template set's ((template id, Template, or None: withdrawn), ...); an options data
    #: set's ((option name, value), ...), the values it leaves
    defines: tuple
    #: an options data set's options template
    template: Template | None = None
    #: an options data set's records (an IPFIX message's sequence counts them)
    records: int = 0


class KnownSets:
    """(exporter code, domain, set id) -> the set read whole last, and what it defined."""

    def __init__(self, cache: TemplateCache) -> None:
        self.cache = cache
        self._sets: dict[tuple[int, int, int], _Known] = {}
        self._arrays: tuple | None = None
        self._arrays_revision = -1

    def __len__(self) -> int:
        return len(self._sets)

    def known(self, code: int, domain: int, set_id: int, body: bytes) -> bool:
        """Whether reading this set would change nothing (module docstring)."""
        k = self._sets.get((code, domain, set_id))
        return k is not None and k.body == body and self._holds(domain, set_id, k)

    def note_templates(self, code: int, exporter: str, domain: int, set_id: int,
                       body: bytes, defines: list) -> None:
        """A (options) template set was read whole: `defines`, ((id, Template or None), ...)."""
        self._note(code, domain, set_id, _Known(exporter, bytes(body), tuple(defines)))

    def note_options(self, code: int, exporter: str, domain: int, set_id: int, body: bytes,
                     template: Template, options: dict[str, int], records: int) -> None:
        """An options data set was read whole, by `template`, leaving `options`."""
        self._note(code, domain, set_id, _Known(exporter, bytes(body),
                                                tuple(sorted(options.items())), template,
                                                records))

    def _note(self, code: int, domain: int, set_id: int, k: _Known) -> None:
        if len(self._sets) >= LIMIT:
            self._sets.clear()
        self._sets[(code, domain, set_id)] = k
        self._arrays = None

    def _holds(self, domain: int, set_id: int, k: _Known) -> bool:
        """Whether the cache holds what `k` defined (so reading it again is a no-op)."""
        cache = self.cache
        if set_id < 256:
            for tid, t in k.defines:
                found = cache.find(k.exporter, domain, tid)
                if (found[0] if found is not None else None) != t:
                    return False
            return True
        found = cache.find(k.exporter, domain, set_id)
        return found is not None and found[0] == k.template and all(
            cache.option(k.exporter, domain, name) == v for name, v in k.defines)

    def arrays(self) -> tuple:
        """The sets that are known now, as the walk's arrays: exporter code, domain, set id,
        offset and length in a blob of their bodies, records; then the blob."""
        revision = self.cache.revision
        if self._arrays is not None and self._arrays_revision == revision:
            return self._arrays
        rows = [(key, k) for key, k in self._sets.items() if self._holds(key[1], key[2], k)]
        lens = np.array([len(k.body) for _, k in rows], np.int64)
        off = np.zeros(len(rows), np.int64)
        if len(rows) > 1:
            np.cumsum(lens[:-1], out=off[1:])
        blob = np.frombuffer(b"".join(k.body for _, k in rows) or b"\0", np.uint8).copy()
        self._arrays = (np.array([key[0] for key, _ in rows], np.int32),
                        np.array([key[1] for key, _ in rows], np.int64),
                        np.array([key[2] for key, _ in rows], np.int64),
                        off, lens, np.array([k.records for _, k in rows], np.int64), blob)
        self._arrays_revision = revision
        return self._arrays
