"""`python -m luminamoon.demo`: the same as `luminamoon demo`."""
from .cli import main

raise SystemExit(main())
