"""Errors of gazctl commands that are neither bad input nor a refused request: something the
command set out to do did not happen (nothing to act on, an editor that failed, a recovery
that could not complete). gazctl prints them as one line, exit status 1."""

from __future__ import annotations


class CommandError(Exception):
    """A gazctl command could not do what was asked; the message says what and why."""
