"""The traffic generator: traffic, flows, frames, per-link packets, pcap writing, veth pairs."""
