"""The GSQL compiler: tokens, parser, expressions, analysis and types, planner, explain, printer, and the shipped queries."""
