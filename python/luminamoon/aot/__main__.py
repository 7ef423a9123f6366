"""``python -m luminamoon.aot build|inspect|verify ...``"""
from .cli import main

raise SystemExit(main())
