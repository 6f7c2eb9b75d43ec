"""`oopscope decode`: print one row per captured packet (CSV or JSON lines), malformed ones with their reason.

Formatting is vectorised per batch: per field one numpy expression gives its values and a
presence mask (fields the packet's layers lack are empty / null), then one Numba pass
(`capture.addresses.format_rows`) writes the text of every row, and each batch is written
with one call. Text forms: IPv4 dotted, IPv6 RFC 5952 as tshark prints it, MACs
aa:bb:cc:dd:ee:ff, times as integers (`time` seconds, `timestamp` ns).
"""

from __future__ import annotations

import click

#: GSQL packet-schema names this command prints, in the default order
FIELDS = (
    "time", "timestamp", "len", "caplen", "eth_type", "vlan", "srcMAC", "destMAC",
    "ipversion", "srcIP", "destIP", "protocol", "ttl", "tos", "ip_len", "is_fragment",
    "frag_offset", "srcPort", "destPort", "flags", "seq", "ack", "win", "payload_len",
    "icmp_type", "icmp_code", "link", "reason",
)
#: fields printed as JSON strings (the rest are numbers)
_TEXT_FIELDS = frozenset({"srcMAC", "destMAC", "srcIP", "destIP", "link", "reason"})


def parse_fields(spec: str | None) -> list[str]:
    """The field list of --fields (all fields when None); usage error naming the valid ones."""
    if spec is None:
        return list(FIELDS)
    names = [f.strip() for f in spec.split(",") if f.strip()]
    unknown = [f for f in names if f not in FIELDS]
    if unknown or not names:
        what = f"unknown field(s) {', '.join(unknown)}" if unknown else "no fields given"
        raise click.BadParameter(f"{what}; valid fields: {', '.join(FIELDS)}", param_hint="--fields")
    return names


def _presence_bits() -> dict[str, int]:
    """Layer bits a field needs to be present (fields not listed: every row has them)."""
    from capture import schema

    ip, l4 = schema.L_IP, schema.L_TCP | schema.L_UDP
    bits = {name: ip for name in ("ipversion", "srcIP", "destIP", "protocol", "ttl", "tos", "ip_len",
                                  "is_fragment", "frag_offset")}
    bits.update({name: l4 for name in ("srcPort", "destPort", "payload_len")})
    bits.update({name: schema.L_TCP for name in ("flags", "seq", "ack", "win")})
    bits.update({name: schema.L_ICMP for name in ("icmp_type", "icmp_code")})
    bits["vlan"] = schema.L_VLAN
    return bits


def _csv_cell(text: str) -> str:
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def format_batch(batch, fields: list[str], fmt: str) -> bytes:
    """The lines of one batch (each ending in a newline) in `fmt` (csv or jsonl), as UTF-8.

    Per field one numpy expression gives the values and a presence mask; one Numba pass
    (`capture.addresses.format_rows`) writes the text of every row.
    """
    import json

    import numpy as np

    from capture import addresses as a
    from capture import schema

    n = batch.n
    if n == 0:
        return b""
    layers = batch["layers"]
    bits = _presence_bits()
    reason_names = [schema.REASONS.get(i, f"reason_{i}") for i in range(256)]
    link_text = _csv_cell(batch.link) if fmt == "csv" else json.dumps(batch.link)
    table = [t.encode() for t in reason_names] + [link_text.encode()]
    k_n = len(fields)
    kinds = np.zeros(k_n, np.int64)
    quote = np.zeros(k_n, np.uint8)
    vals = np.zeros((k_n, n), np.uint64)
    his = np.zeros((k_n, n), np.uint64)
    present = np.ones((k_n, n), np.uint8)
    prefixes, absents, widths = [], [], []
    for k, name in enumerate(fields):
        if name in ("srcIP", "destIP"):
            kinds[k] = a.KIND_IP
            vals[k] = batch[name + "_lo"]
            his[k] = batch[name + "_hi"]
        elif name in ("srcMAC", "destMAC"):
            kinds[k] = a.KIND_MAC
            vals[k] = batch[name]
            present[k] = ((layers & schema.L_ETH) != 0) | (batch[name] != 0)
        elif name == "reason":
            kinds[k] = a.KIND_TABLE
            vals[k] = batch["reason"]
        elif name == "link":
            kinds[k] = a.KIND_TABLE
            vals[k] = 256
        elif name == "timestamp":
            kinds[k] = a.KIND_INT
            vals[k] = batch["timestamp"].view(np.uint64)
        else:
            kinds[k] = a.KIND_UINT
            vals[k] = batch[name]
            if name == "eth_type":
                present[k] = batch["eth_type"] != 0
        if name in bits:
            present[k] = (layers & bits[name]) != 0
        quote[k] = fmt == "jsonl" and name in _TEXT_FIELDS and name != "link"
        if fmt == "csv":
            prefixes.append("" if k == 0 else ",")
            absents.append("")
        else:
            prefixes.append(("{" if k == 0 else ",") + json.dumps(name) + ":")
            absents.append("null")
        table_width = max(map(len, table)) if kinds[k] == a.KIND_TABLE else 0
        widths.append(len(prefixes[-1].encode()) + max(a.KIND_WIDTH[int(kinds[k])] + table_width + 2,
                                                       len(absents[-1])))
    line_end = b"\n" if fmt == "csv" else b"}\n"

    def packed(texts):
        raw = [t.encode() if isinstance(t, str) else t for t in texts]
        offsets = np.zeros(len(raw) + 1, np.int64)
        offsets[1:] = np.cumsum([len(r) for r in raw])
        return np.frombuffer(b"".join(raw) or b"\0", np.uint8), offsets

    prefix, prefix_off = packed(prefixes)
    absent, absent_off = packed(absents)
    tbl, tbl_off = packed(table)
    out = np.empty(n * (sum(widths) + len(line_end)), np.uint8)
    size = a.format_rows(kinds, vals, his, present, batch["ipversion"], quote, prefix, prefix_off, absent,
                         absent_off, tbl, tbl_off, np.frombuffer(line_end, np.uint8), out)
    return out[:size].tobytes()


@click.command("decode")
@click.argument("pcap", type=click.Path(allow_dash=True))
@click.option("--fields", "fields_spec", metavar="F1,F2,...", default=None,
              help="Comma-separated packet-schema fields to print (default: all). "
                   f"Valid: {', '.join(FIELDS)}.")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv", show_default=True,
              help="CSV with a header line, or one JSON object per line.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Print at most N packets.")
@click.option("--link", default=None, help="Link name for the `link` field (default: the file stem).")
@click.option("--strict", is_flag=True,
              help="Exit with an error when the file ends inside its last record (default: warn).")
def decode(pcap: str, fields_spec: str | None, fmt: str, limit: int | None, link: str | None,
           strict: bool) -> None:
    """Decode PCAP (pcap or pcapng) and print one row per captured packet.

    PCAP may be a FIFO or `-` (standard input): a stream, read as it arrives
    (`tcpdump -w - | oopscope decode -`).

    Malformed packets are printed too, with the reason decoding stopped; fields that the
    packet's layers do not have are left empty (null in JSON lines). Tunnelled packets show
    their outer IP header and its next protocol (4 for IPv4-in-IP, 41 for IPv6-in-IP, 47 GRE).
    """
    import logging

    import numpy as np

    from capture.reader import open_capture
    from capture.schema import REASONS

    fields = parse_fields(fields_spec)
    log = logging.getLogger(__name__)
    out = click.get_binary_stream("stdout")
    printed = 0
    reasons = None
    with open_capture(pcap, link=link, strict=strict) as reader:
        if fmt == "csv":  # after the file header was checked: a bad file prints only its error
            out.write((",".join(fields) + "\n").encode())
        for batch in reader:
            if limit is not None and printed + batch.n > limit:
                batch = batch.slice(0, limit - printed)
            out.write(format_batch(batch, fields, fmt))
            if reader.stream:
                out.flush()   # a stream's rows as its packets arrive, not when a buffer fills
            printed += batch.n
            # the reasons of the packets printed (the reader read a whole batch ahead)
            if batch.n:
                counts = np.bincount(batch["reason"], minlength=256)
                reasons = counts if reasons is None else reasons + counts
            if limit is not None and printed >= limit:
                break
        stats = reader.stats
    out.flush()
    for problem in stats.problems:
        click.echo(f"oopscope: warning: {problem}", err=True)
    seen = {} if reasons is None else {REASONS.get(i, f"reason_{i}"): int(c)
                                       for i, c in enumerate(reasons) if c}
    log.info("%s: %d packet%s printed%s, reasons %s", pcap, printed, "" if printed == 1 else "s",
             f" (--limit {limit})" if limit is not None and printed >= limit else "", seen)
