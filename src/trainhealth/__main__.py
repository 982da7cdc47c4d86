"""``python -m trainhealth``: the ``trainhealth`` command."""

from trainhealth._internal.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
