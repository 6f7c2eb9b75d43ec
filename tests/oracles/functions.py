"""The reference evaluator's own getlpmid and user-function calls: row by row, in plain Python.

`reference_functions` is an `Evaluator` function hook (`lowlevel.evaluate.FunctionHook`):
getlpmid reads the prefix file with its own parser and, per address, tries every prefix and
keeps the longest that holds it; a user function is called once per row (one-element arrays),
so neither shares the kernel, the interval table or the batch calling of the system under test.
"""

from __future__ import annotations

import ipaddress

import numpy as np

from queries import expressions as E

_MAPPED = 0xFFFF << 32


def read_prefixes(path: str) -> list[tuple[int, int, int]]:
    """(network as a 128-bit int, length in 128 bits, id) per prefix line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", "//")):
                continue
            prefix, ident = line.split("|")
            net = ipaddress.ip_network(prefix.strip(), strict=False)
            if net.version == 4:
                out.append((_MAPPED | int(net.network_address), 96 + net.prefixlen, int(ident)))
            else:
                out.append((int(net.network_address), net.prefixlen, int(ident)))
    return out


def longest_match(prefixes: list[tuple[int, int, int]], address: int) -> int:
    best_len, best_id = -1, -1
    for net, length, ident in prefixes:
        if length > best_len and (address >> (128 - length)) == (net >> (128 - length)):
            best_len, best_id = length, ident
    return best_id


def addresses(value) -> list[int]:
    """128-bit addresses of an evaluated ipv4 or ip column."""
    if isinstance(value, tuple):
        return [(int(h) << 64) | int(l) for h, l in zip(value[0], value[1])]
    return [_MAPPED | (int(v) & 0xFFFF_FFFF) for v in np.asarray(value)]


def reference_functions(node: E.Func, args: list, n: int):
    if node.name in ("getlpmid", "getv6lpmid") and node.external is None:
        prefixes = read_prefixes(args[1])
        return np.array([longest_match(prefixes, a) for a in addresses(args[0])], np.int64)
    if node.external is not None:
        from lowlevel.library import argument, result
        from queries.udf import implementation

        fn = node.external
        impl = implementation(fn.module, fn.name)
        rows = []
        for i in range(n):
            passed = []
            for value, gsql, handle in zip(args, fn.params, fn.handles):
                if handle:
                    passed.append(value)
                    continue
                full = argument(value, gsql, n)
                passed.append(tuple(h[i:i + 1] for h in full) if isinstance(full, tuple)
                              else full[i:i + 1])
            rows.append(result(impl(*passed), fn.returns, 1, fn.name))
        if fn.returns == "ip":
            return (np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.uint64),
                    np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, np.uint64))
        if not rows:
            return result(np.zeros(0), fn.returns, 0, fn.name)
        return np.concatenate(rows)
    return NotImplemented
