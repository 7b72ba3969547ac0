"""The `edgekit` command line (Typer): one module per command, heavy imports inside the commands."""
