"""``python -m pgtasks`` is the ``pgtasks`` command."""

from pgtasks.cli import main

if __name__ == "__main__":
    main()
