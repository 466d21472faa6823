"""Example applications of gazette-py."""
