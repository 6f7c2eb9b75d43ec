"""Packet sources: pcap/pcapng readers, frame decoding into columnar batches, packet ring, punctuation clock."""
