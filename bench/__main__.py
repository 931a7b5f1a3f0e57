"""``python -m bench``: see :mod:`bench.cli`."""

import sys

if sys.argv[1:2] == ["soak"]:
    from bench.soak import main as soak

    raise SystemExit(soak(sys.argv[2:]))
if sys.argv[1:2] == ["chaos"]:
    from bench.chaos import main as chaos

    raise SystemExit(chaos(sys.argv[2:]))

from bench.cli import main

raise SystemExit(main())
