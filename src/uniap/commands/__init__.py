"""Typer command functions the CLI registers (`uniap compare`, `uniap report`); each is thin: parse, call the
library, print. Bad input raises UniapError, which `uniap.cli.main` turns into one line on stderr."""
