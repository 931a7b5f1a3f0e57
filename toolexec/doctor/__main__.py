"""``python -m toolexec.doctor``: the same as ``toolexec doctor``."""

from toolexec.doctor.runner import main

raise SystemExit(main())
