"""`python -m service.cli`: the `memsweep` command."""

from service.cli.commands import main

raise SystemExit(main())
