"""The GSQL language: lexer, parser, packet schema resolution, planner, explain, shipped queries."""
