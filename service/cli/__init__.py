"""The `memsweep` command: its subcommands, what it prints, the demo and the local servers it starts."""
