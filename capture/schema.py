"""The packet schema: protocols, typed fields and the physical columns of a packet batch, in one place.

`queries/` resolves GSQL names against this module and `capture/` decodes into exactly these
columns. IP addresses are 128-bit, stored as two uint64 halves (`<field>_hi`, `<field>_lo`);
an IPv4 address is stored IPv4-mapped (hi = 0, lo = 0x0000_FFFF_0000_0000 | addr), so the low
half alone identifies an IPv4 address and the pair is unambiguous across versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# --- layer bits: which headers were decoded successfully (the `layers` column) -------------
L_ETH = 1 << 0      # an Ethernet-like header with MAC addresses was present
L_VLAN = 1 << 1     # at least one 802.1Q / 802.1ad tag
L_IPV4 = 1 << 2
L_IPV6 = 1 << 3
L_TCP = 1 << 4
L_UDP = 1 << 5
L_ICMP = 1 << 6     # ICMP (IPv4) or ICMPv6
L_FRAG = 1 << 7     # IP fragment (first or later); later fragments carry no transport header
L_IP = L_IPV4 | L_IPV6

IPV4_MAPPED_PREFIX = np.uint64(0x0000_FFFF_0000_0000)

# --- malformation / non-decoding reasons (the `reason` column; 0 = decoded fully) ----------
REASONS: dict[int, str] = {
    0: "ok",
    1: "truncated_link_header",
    2: "truncated_vlan_tag",
    3: "non_ip_ethertype",        # informational: the frame is fine, just not IP (ARP, LLDP ...)
    4: "truncated_ip_header",
    5: "bad_ip_version",
    6: "bad_ihl",                  # IPv4 IHL < 5
    7: "bad_ip_length",            # total length < header length, or beyond the wire length
    8: "truncated_ipv6_ext_header",
    9: "truncated_transport_header",
    10: "bad_tcp_offset",          # TCP data offset < 5
    11: "unsupported_link_type",   # pcapng interface with a link type we do not decode
    12: "bad_record_length",       # caplen > wire length (longer than the snap length is fine)
}
REASON_CODES: dict[str, int] = {name: code for code, name in REASONS.items()}
#: reasons that are not errors (the packet is complete at the layers it has)
BENIGN_REASONS = frozenset({0, 3})


@dataclass(frozen=True)
class Column:
    """One physical column of a packet batch."""

    name: str
    dtype: np.dtype
    doc: str


def _c(name: str, dtype, doc: str) -> Column:
    return Column(name, np.dtype(dtype), doc)


#: Physical columns decoded by capture/, in order. Derived fields (`time`, `timestamp_ms`,
#: `link`) are computed from these on access (see capture.batch.PacketBatch).
COLUMNS: tuple[Column, ...] = (
    _c("timestamp", np.int64, "capture time, ns since the epoch (UTC)"),
    _c("len", np.uint32, "wire length of the frame"),
    _c("caplen", np.uint32, "captured length"),
    _c("layers", np.uint16, "bit set of decoded layers (L_* constants)"),
    _c("reason", np.uint8, "0, or why decoding stopped early (REASONS)"),
    _c("eth_type", np.uint16, "ethertype after VLAN tags (0 for raw IP links)"),
    _c("vlan", np.uint16, "outermost VLAN id (0 if untagged)"),
    _c("srcMAC", np.uint64, "source MAC as a 48-bit integer"),
    _c("destMAC", np.uint64, "destination MAC as a 48-bit integer"),
    _c("ipversion", np.uint8, "4, 6 or 0"),
    _c("srcIP_hi", np.uint64, "source address, high 64 bits (0 for IPv4)"),
    _c("srcIP_lo", np.uint64, "source address, low 64 bits (IPv4-mapped for IPv4)"),
    _c("destIP_hi", np.uint64, "destination address, high 64 bits"),
    _c("destIP_lo", np.uint64, "destination address, low 64 bits"),
    _c("protocol", np.uint8, "IP protocol / IPv6 next header of the transport"),
    _c("ttl", np.uint8, "TTL / hop limit"),
    _c("tos", np.uint8, "TOS / traffic class"),
    _c("ip_len", np.uint32, "IP total length (IPv6: payload length + 40)"),
    _c("is_fragment", np.uint8, "1 if the packet is an IP fragment"),
    _c("frag_offset", np.uint32, "fragment offset in bytes"),
    _c("srcPort", np.uint16, "TCP/UDP source port"),
    _c("destPort", np.uint16, "TCP/UDP destination port"),
    _c("flags", np.uint8, "TCP flag bits (CWR ECE URG ACK PSH RST SYN FIN)"),
    _c("seq", np.uint32, "TCP sequence number"),
    _c("ack", np.uint32, "TCP acknowledgement number"),
    _c("win", np.uint16, "TCP window"),
    _c("payload_len", np.uint32, "transport payload length from the IP length"),
    _c("icmp_type", np.uint8, "ICMP / ICMPv6 type"),
    _c("icmp_code", np.uint8, "ICMP / ICMPv6 code"),
)
COLUMN_BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}


@dataclass(frozen=True)
class Field:
    """A GSQL-visible field: its type and where its value comes from.

    Packet fields read decoded packet columns. A record protocol's field (declared in a
    schema file, `queries.schemafile`) reads one column of a record batch, named
    `record_column(name)`; `accessor` is its GS-lite access function (`get_csv_uint_pos3`,
    `get_system_time`) and `properties` its attributes (`increasing`, `required`, ...)."""

    name: str
    type: str          # uint | ullong | int | llong | float | bool | ipv4 | ip | mac | string (ip: 128-bit, 2 columns)
    columns: tuple[str, ...]   # physical columns (two for ip), empty for `link`
    doc: str
    accessor: str | None = None
    properties: frozenset[str] = frozenset()
    #: Gigascope's name for one of our fields (`GIGASCOPE_ALIASES`): the field it stands for,
    #: which queries resolve it to (the plans are those of our name)
    alias_of: str | None = None


def _f(name: str, type_: str, columns: tuple[str, ...] | None = None, doc: str = "") -> Field:
    return Field(name, type_, (name,) if columns is None else columns, doc)


@dataclass(frozen=True)
class Protocol:
    """A GSQL protocol: rows it sees (layer mask) and the fields it adds to its parents'.

    `record` is None for the built-in packet protocols and `csv` or `gdat` for a record
    protocol of a schema file, whose rows are records of that format; `where` says where it
    was declared (`file:line`) for messages."""

    name: str
    parent: str | None
    require_any: int          # a row belongs to the protocol iff layers & require_any != 0 (0 = all rows)
    fields: tuple[Field, ...]
    parents: tuple[str, ...] = ()     # more parents (schema files allow several), after `parent`
    record: str | None = None
    where: str | None = None
    #: False for a schema-file protocol that reads nothing from the records itself or through
    #: its ancestors (GS-lite's `base`: only `get_system_time` / `get_schemaId`): a parent
    #: of record protocols, which no query can read directly (`record` is then None)
    queryable: bool = True
    #: why oopscope cannot read this schema-file protocol (an access function or a type it
    #: does not know), or None: an error for a query that reads it, not for the schema file
    unreadable: str | None = None

    @property
    def all_parents(self) -> tuple[str, ...]:
        return ((self.parent,) if self.parent is not None else ()) + self.parents


_PACKET_FIELDS = (
    _f("time", "uint", ("timestamp",), "capture time in whole seconds (increasing)"),
    _f("timestamp", "llong", None, "capture time in ns (increasing)"),
    _f("timestamp_ms", "llong", ("timestamp",), "capture time in ms (increasing)"),
    _f("link", "string", (), "the link (capture or interface) name"),
    _f("len", "uint", None, "wire length"),
    _f("caplen", "uint", None, "captured length"),
    _f("eth_type", "uint", None, "ethertype"),
    _f("vlan", "uint", None, "VLAN id, 0 if untagged"),
    _f("srcMAC", "mac", None, "source MAC"),
    _f("destMAC", "mac", None, "destination MAC"),
)
_IP_FIELDS = (
    _f("ipversion", "uint", None, "4 or 6"),
    _f("srcIP", "ip", ("srcIP_hi", "srcIP_lo"), "source address"),
    _f("destIP", "ip", ("destIP_hi", "destIP_lo"), "destination address"),
    _f("protocol", "uint", None, "transport protocol number"),
    _f("ttl", "uint", None, "TTL / hop limit"),
    _f("tos", "uint", None, "TOS / traffic class"),
    _f("ip_len", "uint", None, "IP length"),
    _f("is_fragment", "bool", None, "fragment flag"),
    _f("frag_offset", "uint", None, "fragment offset in bytes"),
)
_PORT_FIELDS = (
    _f("srcPort", "uint", None, "source port"),
    _f("destPort", "uint", None, "destination port"),
)

#: Gigascope's / Tigon SQL's names of packet fields (as its manual's example queries write
#: them) -> (our field, how the meaning compares). Each is a field of every built-in protocol
#: that declares ours, with its type there (`sourceIP` is an ipv4 in IPV4 queries). Names the
#: manual uses with the same spelling as ours (time, len, protocol, ipversion, ttl, tos,
#: srcIP, destIP, srcPort, destPort, flags) need no alias; docs/gsql.md lists what differs.
GIGASCOPE_ALIASES: dict[str, tuple[str, str]] = {
    "sourceIP": ("srcIP", "same"),
    "source_port": ("srcPort", "same"),
    "dest_port": ("destPort", "same"),
    "total_length": ("ip_len", "same (IPv6: the payload length + 40, the whole packet)"),
    "offset": ("frag_offset", "in bytes here; `offset = 0` (not a later fragment) means "
                              "the same"),
    "sequence_number": ("seq", "same"),
    "ack_number": ("ack", "same"),
    "data_length": ("payload_len", "same: the transport payload's length"),
}

#: fields of Gigascope's packet schema that oopscope has no data for yet (the queries that
#: name them get a located "not supported yet" error rather than "unknown column")
UNSUPPORTED_FIELDS: dict[str, str] = {
    "hdr_length": "the IP header length is not decoded",
    "id": "the IPv4 identification field is not decoded",
    "timewarp": "Gigascope's clock-adjustment field has no counterpart here",
    "raw_packet_data": "the frame's bytes are not kept (TCP_data and UDP_data give the "
                       "transport payload)",
}


def _with_aliases(p: Protocol) -> Protocol:
    own = {f.name: f for f in p.fields}
    extra = tuple(Field(alias, own[ours].type, own[ours].columns,
                        f"Gigascope's name for {ours}", alias_of=ours)
                  for alias, (ours, _) in GIGASCOPE_ALIASES.items() if ours in own)
    return Protocol(p.name, p.parent, p.require_any, p.fields + extra, p.parents)


PROTOCOLS: dict[str, Protocol] = {
    p.name: _with_aliases(p)
    for p in (
        Protocol("PACKET", None, 0, _PACKET_FIELDS),
        # ports, TCP flags and ICMP type/code are 0 in the rows without them (a flow query
        # over IP keys every packet on the same 5-tuple columns)
        Protocol("IP", "PACKET", L_IP, _IP_FIELDS + _PORT_FIELDS + (
            _f("flags", "uint", None, "TCP flags (0 unless TCP)"),
            _f("icmp_type", "uint", None, "ICMP / ICMPv6 type (0 unless ICMP)"),
            _f("icmp_code", "uint", None, "ICMP / ICMPv6 code (0 unless ICMP)"),
        )),
        # in IPV4 queries addresses are 32-bit values (the low 32 bits of the `_lo` column)
        Protocol("IPV4", "IP", L_IPV4, (
            _f("srcIP", "ipv4", ("srcIP_lo",), "source IPv4 address (32-bit)"),
            _f("destIP", "ipv4", ("destIP_lo",), "destination IPv4 address (32-bit)"),
        )),
        Protocol("IPV6", "IP", L_IPV6, ()),
        Protocol("TCP", "IP", L_TCP, _PORT_FIELDS + (
            _f("flags", "uint", None, "TCP flags"),
            _f("seq", "uint", None, "sequence number"),
            _f("ack", "uint", None, "acknowledgement number"),
            _f("win", "uint", None, "window"),
            _f("payload_len", "uint", None, "payload length"),
            # the bytes only for queries that name the field (capture.payload)
            _f("TCP_data", "string", ("payload",), "TCP payload bytes (as captured)"),
        )),
        Protocol("UDP", "IP", L_UDP, _PORT_FIELDS + (
            _f("payload_len", "uint", None, "payload length"),
            _f("UDP_data", "string", ("payload",), "UDP payload bytes (as captured)"),
        )),
        Protocol("ICMP", "IP", L_ICMP, (
            _f("icmp_type", "uint", None, "ICMP type"),
            _f("icmp_code", "uint", None, "ICMP code"),
        )),
    )
}


def _nf(name: str, type_: str, doc: str, columns: tuple[str, ...] | None = None,
        increasing: bool = False) -> Field:
    return Field(name, type_, (name,) if columns is None else columns, doc,
                 properties=frozenset({"increasing"}) if increasing else frozenset())


#: The flow records routers export (NetFlow v5/v9, IPFIX), decoded by `capture.flowdecode`: a
#: record protocol built in, read from a `--netflow-in` link. Its clock is `first` (flow start,
#: ns, and `time`, its seconds) or `last` (flow end), as the query's windows say
#: (`NETFLOW_CLOCKS`); the link punctuates that clock (`capture.flowreader`).
NETFLOW = Protocol("NETFLOW", None, 0, (
    _nf("first", "llong", "flow start, ns since the epoch (the clock: windows)", increasing=True),
    _nf("last", "llong", "flow end, ns since the epoch"),
    _nf("time", "uint", "flow start in whole seconds", ("time_s",)),
    _nf("export", "llong", "export time of the record's datagram, ns"),
    _nf("exporter", "ip", "the exporter's address", ("exporter_hi", "exporter_lo")),
    _nf("domain", "uint", "observation domain (IPFIX), source id (v9), engine (v5)"),
    _nf("version", "uint", "NetFlow version of the datagram: 5, 9 or 10 (IPFIX)"),
    _nf("ipversion", "uint", "4 or 6"),
    _nf("srcIP", "ip", "source address", ("srcIP_hi", "srcIP_lo")),
    _nf("destIP", "ip", "destination address", ("destIP_hi", "destIP_lo")),
    _nf("srcPort", "uint", "source port"),
    _nf("destPort", "uint", "destination port (ICMP: type * 256 + code)"),
    _nf("protocol", "uint", "transport protocol number"),
    _nf("tcp_flags", "uint", "TCP flags seen over the flow (OR)"),
    _nf("tos", "uint", "TOS / traffic class"),
    _nf("packets", "ullong", "packets of the flow"),
    _nf("bytes", "ullong", "bytes of the flow (IP lengths)"),
    _nf("input", "uint", "input interface index"),
    _nf("output", "uint", "output interface index"),
    _nf("src_as", "uint", "source AS"),
    _nf("dst_as", "uint", "destination AS"),
    _nf("next_hop", "ip", "next-hop address", ("next_hop_hi", "next_hop_lo")),
    _nf("sampling", "uint", "the exporter's sampling interval (0 when it sends none)"),
), record="netflow")


#: NETFLOW's window attributes: (field, clock, unit ns)
NETFLOW_CLOCKS = (("first", "first", 1), ("time", "first", 10**9), ("last", "last", 1))


def record_column(field: str) -> str:
    """The record-batch column of a record protocol's field (prefixed, so that no field name
    can collide with the columns every batch has: `timestamp`, `layers`, `reason`)."""
    return "r." + field


#: GS-lite's access function that samples the wall clock when a record is read
SYSTEM_TIME = "get_system_time"
#: GS-lite's access function of the record's schema id (a constant per interface for us)
SCHEMA_ID = "get_schemaId"
#: access functions every record protocol may use, whatever its format
SYSTEM_ACCESSORS = frozenset({SYSTEM_TIME, SCHEMA_ID})
#: the data types of GS-lite's built-in record access functions and our type of each
#: (GS-lite's runtime has no ushort accessor, but its schema grammar has the type and Tigon's
#: own schema files read `get_csv_ushort_posN`: a 16-bit unsigned value, held as a uint)
RECORD_ACCESSOR_TYPES = {"uint": "uint", "ushort": "uint", "ullong": "ullong", "ip": "ipv4",
                         "ipv6": "ip", "string": "string", "bool": "bool", "int": "int",
                         "llong": "llong", "float": "float"}
_RECORD_ACCESSOR = re.compile(r"get_(csv|gdat)_([a-z0-9]+)_pos([0-9]+)")


@dataclass(frozen=True)
class RecordAccessor:
    """A GS-lite built-in record access function `get_<format>_<type>_pos<N>`: the record
    format (csv | gdat), the GS-lite data type it parses (`ipv6`), that type as ours (`ip`)
    and the 1-based field position."""

    kind: str
    gs_type: str
    type: str
    position: int


def record_accessor(accessor: str | None) -> RecordAccessor | None:
    """The record access function `accessor` names, or None when it is not one of the
    `get_csv_*_posN` / `get_gdat_*_posN` functions (type unknown to GS-lite included)."""
    m = _RECORD_ACCESSOR.fullmatch(accessor or "")
    if m is None or m.group(2) not in RECORD_ACCESSOR_TYPES:
        return None
    return RecordAccessor(m.group(1), m.group(2), RECORD_ACCESSOR_TYPES[m.group(2)],
                          int(m.group(3)))


@dataclass(frozen=True)
class RecordFormat:
    """How the records of a record protocol are read and timed (what a record source and
    the low level need of a schema-file protocol; `Schema.record_format`).

    `fields` are every field, inherited ones first. Each record batch has a `timestamp`
    column (int64 ns) like a packet batch: the value of the `clock` field times
    `clock_unit_ns`, or, when the clock is GS-lite's `get_system_time` (or there is no
    increasing field), the wall clock when the record was read. The clock field's windows
    are then those of `time` (unit 10**9: a uint of seconds) or of `timestamp` (unit 1: a
    64-bit value taken as is)."""

    protocol: str
    kind: str                           # "csv" | "gdat"
    fields: tuple[Field, ...]
    clock: str | None                   # the field that is the record's time, if any
    clock_unit_ns: int = 10**9
    #: a protocol with more than one clock (NETFLOW: flow start or end): (field, the clock
    #: it windows on, its unit) for each field a query may window on; the query's temporal
    #: group item chooses the clock (`queries.analysis`), and `clock` is then that one
    clocks: tuple[tuple[str, str, int], ...] = ()

    @property
    def system_clock(self) -> bool:
        """Whether records are timed by the wall clock when read (timer punctuation then
        applies, as for a live interface)."""
        if self.clock is None:
            return True
        return next(f for f in self.fields if f.name == self.clock).accessor == SYSTEM_TIME


def clock_of(fields: tuple[Field, ...]) -> tuple[str | None, int]:
    """The clock field of a record protocol and its unit (see `RecordFormat`): the first
    increasing field read from the record, else the first increasing `get_system_time` field;
    32-bit and smaller integers count seconds, 64-bit ones are taken as nanoseconds."""
    increasing = [f for f in fields if "increasing" in f.properties
                  and f.type in ("uint", "int", "ullong", "llong")]
    read = [f for f in increasing if f.accessor != SYSTEM_TIME]
    if not (read or increasing):
        return None, 10**9
    chosen = (read or increasing)[0]
    return chosen.name, (1 if chosen.type in ("ullong", "llong") else 10**9)


class Schema:
    """The protocols queries can read: the built-in packet protocols, plus the protocols of
    schema files (`queries.schemafile.load_schema`). Names are case-insensitive."""

    def __init__(self, protocols: dict[str, Protocol], files: tuple[str, ...] = ()):
        self._protocols = {name.upper(): p for name, p in protocols.items()}
        #: the schema files read, in order (for messages and `explain`)
        self.files = files

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.upper() in self._protocols

    def __iter__(self):
        return iter(p.name for p in self._protocols.values())

    def names(self) -> list[str]:
        return [p.name for p in self._protocols.values()]

    def protocol(self, name: str) -> Protocol:
        """The protocol named `name` (KeyError if unknown)."""
        return self._protocols[name.upper()]

    def canonical(self, name: str) -> str:
        """`name` as the protocol spells it (`ipv4` -> `IPV4`)."""
        return self.protocol(name).name

    def fields(self, protocol: str) -> dict[str, Field]:
        """All fields visible in `protocol`, its ancestors' included, ancestors first
        (KeyError if unknown)."""
        fields: dict[str, Field] = {}
        seen: set[str] = set()

        def add(name: str) -> None:
            p = self.protocol(name)
            if p.name in seen:
                return
            seen.add(p.name)
            for parent in p.all_parents:
                add(parent)
            for f in p.fields:
                fields[f.name] = f

        add(protocol)
        return fields

    def mask(self, protocol: str) -> int:
        """Layer bits a row needs to belong to `protocol` (0: every row)."""
        return self.protocol(protocol).require_any

    def is_record(self, protocol: str) -> bool:
        return self.protocol(protocol).record is not None

    def record_format(self, protocol: str) -> RecordFormat | None:
        """How records of `protocol` are read (None for a packet protocol)."""
        p = self.protocol(protocol)
        if p.record is None:
            return None
        fields = tuple(self.fields(protocol).values())
        clock, unit = clock_of(fields)
        clocks = NETFLOW_CLOCKS if p.record == "netflow" else ()
        return RecordFormat(p.name, p.record, fields, clock, unit, clocks)

    def with_protocols(self, protocols: list[Protocol], files: tuple[str, ...] = ()) -> Schema:
        """This schema with `protocols` added (a name already present is replaced)."""
        merged = dict(self._protocols)
        for p in protocols:
            merged[p.name.upper()] = p
        return Schema(merged, self.files + files)


#: the built-in protocols: the packet protocols and NETFLOW
BUILTIN = Schema({**PROTOCOLS, NETFLOW.name: NETFLOW})


def protocol_fields(protocol: str, schema: Schema = BUILTIN) -> dict[str, Field]:
    """All fields visible in `protocol`, its ancestors' included (KeyError if unknown)."""
    return schema.fields(protocol)


def protocol_mask(protocol: str, schema: Schema = BUILTIN) -> int:
    """Layer bits a row needs to belong to `protocol` (0: every row)."""
    return schema.mask(protocol)
