"""`python -m grammarmask`: the `grammarmask` command."""

from .tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
