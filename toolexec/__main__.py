"""``python -m toolexec``: the ``toolexec`` command."""

from toolexec.cli import main

raise SystemExit(main())
