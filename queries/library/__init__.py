"""The shipped GSQL query files (package data)."""
